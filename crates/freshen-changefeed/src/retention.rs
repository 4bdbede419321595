//! The retention policy: delete events beyond an age, a count or a size, in the
//! background, oldest first.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::log::Core;
use crate::metrics;
use crate::record;
use crate::store;
use crate::{Changefeed, Error, RetentionConfig};

/// Events examined per scan step while looking for the cut.
const STEP: usize = 10_000;

/// The first sequence to keep under `policy` (everything before it goes).
async fn cut(core: &Core, policy: &RetentionConfig) -> Result<u64, Error> {
    let s = core.stats();
    let mut before = s.oldest_sequence;
    if let Some(max) = policy.max_events
        && s.total_events > max
    {
        before = before.max(s.latest_sequence + 1 - max);
    }
    if let Some(max_age) = policy.max_age_secs {
        let cutoff =
            record::unix_ms(SystemTime::now()).saturating_sub(max_age.saturating_mul(1000));
        // Append times only grow, so the old events are a prefix.
        let mut at = before.saturating_sub(1);
        loop {
            let mut found = None;
            let last = core.scan(at, STEP, |seq, r| {
                if r.appended_ms >= cutoff {
                    found = Some(seq);
                    false
                } else {
                    true
                }
            })?;
            match found {
                Some(seq) => {
                    before = before.max(seq);
                    break;
                }
                None if last == at => {
                    before = before.max(last + 1);
                    break;
                }
                None => {
                    at = last;
                    // A long scan: let other tasks run between steps.
                    tokio::task::yield_now().await;
                }
            }
        }
    }
    if let Some(max_bytes) = policy.max_bytes {
        let mut excess = s.total_size_bytes.saturating_sub(max_bytes);
        let mut at = s.oldest_sequence.saturating_sub(1);
        while excess > 0 {
            let last = core.scan(at, STEP, |_, r| {
                let size = store::stored_size(r.len);
                excess = excess.saturating_sub(size);
                excess > 0
            })?;
            if last == at {
                break;
            }
            at = last;
            tokio::task::yield_now().await;
        }
        before = before.max(at + 1);
    }
    Ok(before)
}

/// Applies `policy` once; returns how many events were deleted.
pub(crate) async fn enforce(core: &Core, policy: &RetentionConfig) -> Result<u64, Error> {
    let before = cut(core, policy).await?;
    metrics::inc(&core.metrics().retention_runs);
    if before <= core.stats().oldest_sequence {
        return Ok(0);
    }
    let n = core.truncate(before).await?;
    metrics::add(&core.metrics().retention_deleted, n);
    Ok(n)
}

impl Changefeed {
    /// Applies a retention policy now (the configured one runs on its own every
    /// `interval_secs`); returns how many events were deleted.
    pub async fn enforce_retention(&self, policy: &RetentionConfig) -> Result<u64, Error> {
        enforce(&self.core, policy).await
    }
}

/// Runs the configured policy every `interval_secs` until the changefeed closes.
pub(crate) fn spawn(cf: &Changefeed, policy: RetentionConfig) {
    if !policy.is_enabled() {
        return;
    }
    let core: std::sync::Weak<Core> = Arc::downgrade(&cf.core);
    let mut stop = cf.core.stopping();
    let every = Duration::from_secs(policy.interval_secs.max(1));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(every) => {}
            }
            let Some(core) = core.upgrade() else { return };
            match enforce(&core, &policy).await {
                Ok(_) => {}
                Err(Error::Closed { .. }) => return,
                // Counted; the next pass tries again.
                Err(e) => {
                    tracing::warn!(error = %e, "changefeed retention pass failed");
                    metrics::inc(&core.metrics().retention_errors);
                }
            }
        }
    });
}
