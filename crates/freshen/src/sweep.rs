//! `Sweeper`: when reconcile sweeps run, the keys a running one streams in, and the
//! TRUNCATE batches each must cover before they may be acknowledged.
//!
//! ```text
//!            due (start, every, TRUNCATE, Handle)      listing ends Ok
//!   waiting ─────────────────────────────► listing ───────────────────► waiting (next = now + every)
//!      ▲                                      │  listing fails
//!      └────────── next = now + backoff ◄─────┘  (its pins carry over to the retry)
//! ```
//!
//! A request while a sweep lists keys does not interrupt it: it runs again right after.
//! Where the view can recompute its whole table, a due sweep is taken without listing
//! a key ([`Sweeper::take_due`]): one whole-table run covers it.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::ack::BatchId;
use crate::backoff::Backoff;
use crate::parts::Reconcile;
use crate::rebuild::KeySink;
use crate::{BoxError, Key};

/// A sweep that is listing keys.
struct Listing {
    rx: mpsc::Receiver<Key>,
    task: JoinHandle<Result<(), BoxError>>,
    /// TRUNCATE batches this sweep must cover before they may be acknowledged.
    pins: Vec<BatchId>,
}

impl Drop for Listing {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How a sweep's listing ended.
pub(crate) enum Finished {
    /// Every key was listed; these TRUNCATE batches are covered.
    Listed { unpin: Vec<BatchId> },
    /// The listing failed; it is retried after `retry_in`.
    Failed { error: BoxError, retry_in: Duration },
}

pub(crate) struct Sweeper {
    reconcile: Option<Reconcile>,
    /// Spaces the retries of a failed listing.
    backoff: Backoff,
    listing: Option<Listing>,
    again: bool,
    /// TRUNCATE batches waiting for the next sweep to start.
    pins: Vec<BatchId>,
    failures: u32,
    next: Option<Instant>,
}

impl Sweeper {
    /// A sweeper whose first sweep is due at `now` (when a reconcile is configured and
    /// sweeps at start; else one interval later).
    pub(crate) fn new(reconcile: Option<Reconcile>, backoff: Backoff, now: Instant) -> Sweeper {
        Sweeper {
            backoff,
            next: reconcile
                .as_ref()
                .map(|r| if r.at_start { now } else { now + r.every }),
            reconcile,
            listing: None,
            again: false,
            pins: Vec::new(),
            failures: 0,
        }
    }

    pub(crate) fn is_configured(&self) -> bool {
        self.reconcile.is_some()
    }

    pub(crate) fn is_listing(&self) -> bool {
        self.listing.is_some()
    }

    /// Nothing running, nothing requested, nothing pinned.
    pub(crate) fn is_idle(&self) -> bool {
        self.listing.is_none() && self.pins.is_empty() && !self.again
    }

    /// Asks for a sweep as soon as possible.
    pub(crate) fn request(&mut self, now: Instant) {
        if self.reconcile.is_none() {
            return;
        }
        if self.listing.is_some() {
            self.again = true;
        } else {
            self.next = Some(now);
        }
    }

    /// Pins a TRUNCATE batch to the next sweep.
    pub(crate) fn pin(&mut self, batch: BatchId) {
        self.pins.push(batch);
    }

    /// The oldest TRUNCATE batch the running sweep covers: keys it lists hold it.
    pub(crate) fn covering(&self) -> Option<BatchId> {
        self.listing
            .as_ref()
            .and_then(|l| l.pins.iter().min().copied())
    }

    /// When the next sweep is due (none while one is listing).
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        if self.listing.is_some() {
            None
        } else {
            self.next
        }
    }

    /// The source ended: periodic sweeps stop; requested ones still run.
    pub(crate) fn source_ended(&mut self) {
        if self.pins.is_empty() && !self.again {
            self.next = None;
        }
    }

    /// Starts the due sweep, if any.
    pub(crate) fn maybe_start(&mut self, now: Instant) {
        let (Some(rec), None, Some(at)) = (&self.reconcile, &self.listing, self.next) else {
            return;
        };
        if at > now {
            return;
        }
        let (tx, rx) = mpsc::channel(1024);
        let enumerate = rec.enumerate.clone();
        let task = tokio::spawn(async move { enumerate.enumerate(KeySink::new(tx)).await });
        self.listing = Some(Listing {
            rx,
            task,
            pins: std::mem::take(&mut self.pins),
        });
        self.next = None;
    }

    /// Takes the due sweep, if any, without listing its keys — a whole-table run covers
    /// it — and schedules the next one interval later. Returns the TRUNCATE batches it
    /// must cover.
    pub(crate) fn take_due(&mut self, now: Instant) -> Option<Vec<BatchId>> {
        let (Some(rec), None, Some(at)) = (&self.reconcile, &self.listing, self.next) else {
            return None;
        };
        if at > now {
            return None;
        }
        self.next = Some(later(now, rec.every));
        self.again = false;
        Some(std::mem::take(&mut self.pins))
    }

    /// A whole-table run that covered a taken sweep failed: its TRUNCATE batches wait for
    /// the next sweep, which is due now.
    pub(crate) fn uncovered(&mut self, pins: Vec<BatchId>, now: Instant) {
        self.pins.extend(pins);
        self.request(now);
    }

    /// Waits for listed keys; 0 means the listing ended ([`finish`](Self::finish) it).
    pub(crate) async fn recv(&mut self, buf: &mut Vec<Key>) -> usize {
        match &mut self.listing {
            Some(l) => l.rx.recv_many(buf, 1024).await,
            None => std::future::pending().await,
        }
    }

    /// Collects the ended listing and schedules the next sweep.
    pub(crate) async fn finish(&mut self, source_done: bool) -> Finished {
        let Some(mut listing) = self.listing.take() else {
            return Finished::Listed { unpin: Vec::new() };
        };
        let result = match (&mut listing.task).await {
            Ok(r) => r,
            Err(e) => Err(format!("reconcile task failed: {e}").into()),
        };
        let now = Instant::now();
        let every = self.reconcile.as_ref().map_or(Duration::MAX, |r| r.every);
        let pins = std::mem::take(&mut listing.pins);
        let finished = match result {
            Ok(()) => {
                self.failures = 0;
                self.next = (!source_done).then(|| later(now, every));
                Finished::Listed { unpin: pins }
            }
            Err(error) => {
                self.failures += 1;
                let retry_in = self.backoff.ceiling(self.failures).min(every);
                // Still pinned: the retry must cover these TRUNCATEs.
                self.pins.extend(pins);
                self.next = Some(later(now, retry_in));
                Finished::Failed { error, retry_in }
            }
        };
        if std::mem::take(&mut self.again) {
            self.next = Some(now);
        }
        finished
    }

    /// Stops a running listing (shutdown).
    pub(crate) fn stop(&mut self) {
        self.listing = None;
    }
}

/// `now + d`, saturating far in the future instead of overflowing the clock.
pub(crate) fn later(now: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(d.min(FAR))
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn a_due_sweep_is_taken_whole_with_its_pins_and_given_back_on_failure() {
        let now = Instant::now();
        let enumerate: std::sync::Arc<dyn crate::rebuild::Enumerate> =
            std::sync::Arc::new(crate::rebuild::ListAll::new(|| async {
                Ok::<_, std::io::Error>(Vec::new())
            }));
        let rec = Reconcile {
            every: HOUR,
            enumerate,
            at_start: true,
        };
        let mut s = Sweeper::new(Some(rec), Backoff::default(), now);
        s.pin(7);
        assert_eq!(s.take_due(now), Some(vec![7]));
        assert!(!s.is_listing());
        assert_eq!(
            s.next_wake(),
            Some(now + HOUR),
            "the next one interval later"
        );
        assert_eq!(s.take_due(now), None, "not due again yet");
        s.uncovered(vec![7], now);
        assert_eq!(s.next_wake(), Some(now), "due again at once");
        assert_eq!(s.take_due(now), Some(vec![7]), "with its pins");
        let mut none = Sweeper::new(None, Backoff::default(), now);
        assert_eq!(none.take_due(now), None);
    }

    #[test]
    fn later_adds_what_it_can_and_saturates_far_ahead() {
        let now = Instant::now();
        assert_eq!(later(now, HOUR), now + HOUR);
        let decade = 10 * 365 * 24 * HOUR;
        assert_eq!(later(now, decade), now + decade);
        // `every = "100y"` or a Duration::MAX retry: far ahead, never an overflow.
        assert!(later(now, Duration::MAX) >= now + decade);
    }
}
