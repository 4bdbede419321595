//! The retention policy: delete events beyond an age, a count or a size, in the
//! background, oldest first; compact to the latest event of each row; and, unless told
//! to drop them, keep whatever a consumer group has not acknowledged.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::groups::Groups;
use crate::metrics;
use crate::record;
use crate::shared::Core;
use crate::store;
use crate::{Error, Keep, RetentionConfig, Unacknowledged};

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

/// The first sequence retention may not touch: after the lowest committed offset of
/// any consumer group (unless the policy drops unacknowledged events).
fn floor(groups: &Groups, policy: &RetentionConfig) -> u64 {
    match policy.unacknowledged {
        Unacknowledged::Keep => groups.min_offset().map_or(u64::MAX, |o| o + 1),
        Unacknowledged::Drop => u64::MAX,
    }
}

/// Applies `policy` once; returns how many events were deleted (truncated or compacted).
pub(crate) async fn enforce(
    core: &Core,
    groups: &Groups,
    policy: &RetentionConfig,
) -> Result<u64, Error> {
    let floor = floor(groups, policy);
    let before = cut(core, policy).await?.min(floor);
    metrics::inc(&core.metrics().retention_runs);
    let mut n = 0;
    if before > core.stats().oldest_sequence {
        n = core.truncate(before).await?;
        metrics::add(&core.metrics().retention_deleted, n);
    }
    if policy.keep == Keep::LatestPerKey {
        n += compact(core, policy, floor).await?;
    }
    Ok(n)
}

/// Deletes every event below `floor` that is not its row's latest, and tombstones
/// older than `tombstone_secs`; returns how many.
async fn compact(core: &Core, policy: &RetentionConfig, floor: u64) -> Result<u64, Error> {
    let cutoff = record::unix_ms(SystemTime::now())
        .saturating_sub(policy.tombstone_secs.saturating_mul(1000));
    let upto = core.latest().min(floor.saturating_sub(1));
    let mut at = core.stats().oldest_sequence.saturating_sub(1);
    let mut deleted = 0;
    while at < upto {
        let (seqs, last) = store::compaction_candidates(&core.db, at, upto, STEP, cutoff)?;
        if !seqs.is_empty() {
            deleted += core.compact(seqs).await?;
        }
        if last == at {
            break;
        }
        at = last;
        // A long pass: let other tasks run between steps.
        tokio::task::yield_now().await;
    }
    Ok(deleted)
}

/// Runs the configured policy every `interval_secs` until the changefeed closes.
pub(crate) fn spawn(core: &Arc<Core>, groups: &Arc<Groups>, policy: RetentionConfig) {
    if !policy.is_enabled() {
        return;
    }
    let mut stop = core.stopping();
    let core: std::sync::Weak<Core> = Arc::downgrade(core);
    let groups: std::sync::Weak<Groups> = Arc::downgrade(groups);
    let every = Duration::from_secs(policy.interval_secs.max(1));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(every) => {}
            }
            let (Some(core), Some(groups)) = (core.upgrade(), groups.upgrade()) else {
                return;
            };
            match enforce(&core, &groups, &policy).await {
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
