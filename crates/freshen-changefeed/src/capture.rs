//! The capture loop: read batches from a source, append them durably, acknowledge them
//! in order once durable.

use std::future::Future;

use freshen::{Ack, Source, SourceError};
use tokio::sync::{mpsc, oneshot};

use crate::metrics;
use crate::writer::AppendOutcome;
use crate::{Changefeed, Error};

/// Batches appended but not yet durable at once. Appends queue while the writer
/// commits, so the next group commit is ready when the previous one ends.
const IN_FLIGHT: usize = 32;

/// What a capture run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CaptureReport {
    /// Batches appended and acknowledged.
    pub batches: u64,
    /// Events appended.
    pub appended: u64,
    /// Events skipped as already in the log (replayed by the source).
    pub duplicates: u64,
    /// Messages the source could not decode (skipped, acknowledged with their batch).
    pub skipped: u64,
    /// The last such message's error.
    pub last_skip: Option<String>,
}

/// Why a capture run stopped early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The source failed for good.
    #[error("the source failed: {0}")]
    Source(#[source] SourceError),
    /// The log could not append (it stops accepting writes after a failed commit).
    #[error(transparent)]
    Log(#[from] Error),
}

/// A batch's appends (more than one when snapshot watermarks split it) and its ack.
type Pending = (Vec<oneshot::Receiver<Result<AppendOutcome, Error>>>, Ack);

impl Changefeed {
    /// Appends every batch of `source` to the log, acknowledging each batch only once
    /// its events are durable, in source order, until the source ends, fails, or
    /// `shutdown` completes. Batches already appended when it stops are still
    /// acknowledged; the source is closed at the end.
    ///
    /// With a source that replays unacknowledged batches (PostgreSQL), a crash at any
    /// point loses nothing and duplicates nothing: see [`Changefeed::append`].
    pub async fn capture<S: Source>(
        &self,
        mut source: S,
        shutdown: impl Future<Output = ()>,
    ) -> Result<CaptureReport, CaptureError> {
        let (tx, rx) = mpsc::channel::<Pending>(IN_FLIGHT);
        let mut acker = tokio::spawn(acknowledge(self.clone(), rx));
        let mut report = CaptureReport::default();
        let mut failed = None;
        let mut acked = None;
        tokio::pin!(shutdown);
        loop {
            let batch = tokio::select! {
                () = &mut shutdown => break,
                // The acker only ends early when an append failed.
                r = &mut acker => {
                    acked = Some(r);
                    break;
                }
                b = source.next_batch() => b,
            };
            let batch = match batch {
                None => break,
                Some(Err(e)) if !e.is_final() => {
                    // An outage the source retries by itself: said, and read on.
                    tracing::warn!(error = %e, "changefeed capture: the source cannot reach its data and keeps retrying");
                    continue;
                }
                Some(Err(e)) => {
                    failed = Some(CaptureError::Source(e));
                    break;
                }
                Some(Ok(b)) => b,
            };
            let marks: Vec<freshen::StreamMark> = batch
                .marks()
                .iter()
                .filter(|m| crate::snapshot::Snapshots::is_watermark(m))
                .cloned()
                .collect();
            let complete = batch.committed_through();
            let (events, skipped, ack) = batch.into_parts();
            for e in &skipped {
                tracing::warn!(error = %e, "changefeed capture skipped a message the source could not decode");
            }
            if let Some(last) = skipped.last() {
                report.skipped += skipped.len() as u64;
                report.last_skip = Some(last.to_string());
                metrics::add(&self.core.metrics().source_skipped, skipped.len() as u64);
            }
            let receipts = match self.submit_split(&events, &marks, complete) {
                Ok(r) => r,
                Err(e) => {
                    failed = Some(e.into());
                    break;
                }
            };
            if tx.send((receipts, ack)).await.is_err() {
                break;
            }
        }
        drop(tx);
        let acked = match acked {
            Some(r) => r,
            None => acker.await,
        };
        source.close().await;
        let acked = acked.map_err(|e| Error::Invalid(format!("the acknowledger panicked: {e}")))?;
        let (batches, appended, duplicates) = match acked {
            Ok(counts) => counts,
            Err(e) => return Err(e.into()),
        };
        report.batches = batches;
        report.appended = appended;
        report.duplicates = duplicates;
        match failed {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
}

impl Changefeed {
    /// Queues a batch's events for the writer; a snapshot chunk whose high watermark is
    /// among `marks` goes right behind the events before it. `complete` goes with the
    /// last append (the batch's end).
    fn submit_split(
        &self,
        events: &[freshen::RowEvent],
        marks: &[freshen::StreamMark],
        complete: Option<u64>,
    ) -> Result<Vec<oneshot::Receiver<Result<AppendOutcome, Error>>>, Error> {
        self.snapshots.note_truncates(events);
        if marks.is_empty() {
            return Ok(vec![self.submit_append(events, complete)?]);
        }
        let mut receipts = Vec::with_capacity(marks.len() + 1);
        let mut from = 0;
        for m in marks {
            let at = m.at.clamp(from, events.len());
            if at > from {
                receipts.push(self.submit_append(&events[from..at], None)?);
                from = at;
            }
            self.submit_chunk_at(m)?;
        }
        if from < events.len() || receipts.is_empty() {
            receipts.push(self.submit_append(&events[from..], complete)?);
        } else if complete.is_some() {
            // The batch ended with a chunk: the end still has to be recorded.
            receipts.push(self.submit_append(&[], complete)?);
        }
        Ok(receipts)
    }
}

/// Acknowledges batches in order as their appends become durable.
async fn acknowledge(
    cf: Changefeed,
    mut rx: mpsc::Receiver<Pending>,
) -> Result<(u64, u64, u64), Error> {
    let (mut batches, mut appended, mut duplicates) = (0, 0, 0);
    while let Some((receipts, ack)) = rx.recv().await {
        for receipt in receipts {
            let outcome = cf.core.wait(receipt).await?;
            appended += outcome.appended;
            duplicates += outcome.duplicates;
        }
        ack.ack();
        batches += 1;
    }
    Ok((batches, appended, duplicates))
}
