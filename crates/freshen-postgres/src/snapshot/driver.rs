//! The DBLog chunk loop, once, for whatever consumes the chunks (the changefeed's log,
//! a sink): per chunk of a table, in primary-key order,
//!
//! 1. a *low watermark* is written into the WAL (non-transactional: its position is
//!    the chunk's `low`);
//! 2. the chunk is read ([`TableReader::read_chunk`]) in a REPEATABLE READ transaction
//!    whose snapshot is kept with the rows;
//! 3. the chunk is handed to the consumer ([`ChunkConsumer::hold`]), which holds it
//!    until its high watermark comes through the consumer's own stream, and a *high
//!    watermark* ([`high_mark`]) is written (transactional: streamed in commit order);
//! 4. the consumer checks the rows against the changes streamed meanwhile
//!    ([`ChunkCheck`]), puts the rest in at the high watermark's place, and answers the
//!    table's progress after the chunk; [`ChunkConsumer::committed`] records it.
//!
//! At most one chunk is in flight. A chunk whose high watermark does not come back
//! within [`WATERMARK_WAIT`] is released and the table is read again from its last
//! committed chunk by the caller (at least once).
//!
//! The progress records the driver hands out hold the resume position sealed where a
//! redaction rule hides a primary-key column ([`ChunkConsumer::redact`], the `resume`
//! module); the clear key lives only in this loop's memory.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::Pool;
use freshen::plug::Redact;
use freshen::{Jitter, RowEvent};

use crate::snapshot::resume::Resume;
use crate::{
    ChunkCheck, PgError, SnapshotProgress, SnapshotState, TableName, TableReader, write_watermark,
};

/// How long a chunk waits for its high watermark to come back through the consumer's
/// stream before it is released and read again (the stream may be reconnecting).
pub(crate) const WATERMARK_WAIT: Duration = Duration::from_secs(300);

/// The high watermark's content for chunk `id` (the low one says `low`: only its
/// position matters, and it must not end the chunk).
pub(crate) fn high_mark(id: &str) -> String {
    format!("{id} high")
}

/// Chunk ids: a prefix, a per-process nonce (which tells this process's watermarks from
/// older runs' and other consumers') and a counter.
#[derive(Debug)]
pub(crate) struct ChunkIds {
    prefix: &'static str,
    nonce: u64,
    counter: AtomicU64,
}

impl ChunkIds {
    /// Ids `"{prefix}{nonce:016x}:{n}"`, the nonce drawn from the clock.
    pub(crate) fn new(prefix: &'static str) -> ChunkIds {
        ChunkIds {
            prefix,
            nonce: Jitter::from_clock().next_u64(),
            counter: AtomicU64::new(0),
        }
    }

    /// The next chunk's id.
    pub(crate) fn next_id(&self) -> String {
        format!(
            "{}{:016x}:{}",
            self.prefix,
            self.nonce,
            self.counter.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// A chunk read between its watermarks, for the consumer to hold until its high
/// watermark ([`high_mark`] of `id`) comes by.
#[derive(Debug)]
#[non_exhaustive]
pub(crate) struct HeldChunk {
    /// The chunk's id.
    pub(crate) id: String,
    /// Its rows, as inserts.
    pub(crate) rows: Vec<RowEvent>,
    /// What decides which rows are stale: the chunk's snapshot and low watermark.
    pub(crate) check: ChunkCheck,
    /// The table's progress before the chunk (what a re-read starts from).
    pub(crate) prev: SnapshotProgress,
    /// The table's progress after the chunk; the consumer adds the counts.
    pub(crate) next: SnapshotProgress,
}

/// What happened to a table's snapshot, for the consumer to log (and act on).
#[derive(Debug, Clone, Copy)]
pub(crate) enum TableEvent<'a> {
    /// The table's reading starts (from its first row, or after `progress.after`).
    Started(&'a SnapshotProgress),
    /// A chunk is committed; the table's progress after it.
    Chunk(&'a SnapshotProgress),
    /// The table is read to its end.
    Done(&'a SnapshotProgress),
}

/// Why a table's snapshot stopped before its end.
#[derive(Debug)]
pub(crate) enum DriverError<E> {
    /// The consumer stopped, or dropped the chunk unanswered.
    Stopped,
    /// Reading the source failed (a watermark, the chunk, or what `committed` stores).
    Source(PgError),
    /// The high watermark did not come back within [`WATERMARK_WAIT`].
    Unseen,
    /// The consumer failed to put the chunk in.
    Consumer(E),
}

impl<E> From<PgError> for DriverError<E> {
    fn from(e: PgError) -> DriverError<E> {
        DriverError::Source(e)
    }
}

/// What consumes a snapshot's chunks: it holds each until its high watermark comes
/// through its stream, checks and puts the rows in there, and answers the progress.
pub(crate) trait ChunkConsumer: Sync {
    /// How putting a chunk in can fail.
    type Error: Send;

    /// The ids of this consumer's chunks.
    fn chunk_ids(&self) -> &ChunkIds;

    /// The redaction rules of what the consumer publishes: where one hides a
    /// primary-key column, the progress records hold the resume position sealed.
    fn redact(&self) -> Option<&dyn Redact>;

    /// Holds `chunk` until its high watermark comes by; the answer is the table's
    /// progress once the chunk is in — its `next` with the counts added, or its `prev`
    /// to read the chunk again (`None`, the chunk dropped unanswered, stops the table).
    fn hold(
        &self,
        chunk: HeldChunk,
    ) -> impl Future<Output = Option<Result<SnapshotProgress, Self::Error>>> + Send + 'static;

    /// Forgets the held chunk `id`, if it is still held (its watermark failed, or
    /// never came back).
    fn release(&self, id: &str);

    /// Completes when the consumer stops; a chunk held then is released.
    fn stopping(&self) -> impl Future<Output = ()> + Send;

    /// Records the progress after a chunk once it is in.
    fn committed(
        &self,
        progress: &SnapshotProgress,
    ) -> impl Future<Output = Result<(), PgError>> + Send;

    /// Says what happened to the table's snapshot (logs it).
    fn on(&self, event: TableEvent<'_>);
}

/// Reads one table to its end from `pool` (the database whose WAL the consumer's
/// stream carries), chunk by chunk of `chunk_rows`, `pause` apart, from `progress`.
pub(crate) async fn snapshot_table<C: ChunkConsumer>(
    consumer: &C,
    pool: &Pool,
    mut progress: SnapshotProgress,
    chunk_rows: usize,
    pause: Duration,
) -> Result<(), DriverError<C::Error>> {
    let table: TableName = TableName::of(&progress);
    let reader = TableReader::new(pool.clone(), table).await?;
    let resume = Resume::new(
        consumer.redact(),
        reader.table(),
        reader.pk_names().iter().map(|c| &**c),
    );
    let mut position = match resume.of(&progress) {
        Ok(p) => p,
        Err(_) => {
            tracing::warn!(
                table = %reader.table(),
                "snapshot: its sealed resume position cannot be opened (sealed by an earlier process: no hash rule covers the primary key; or the rule or its key changed); reading the table again from its first row"
            );
            progress.after_sealed = None;
            None
        }
    };
    if let Some(key) = position.clone().filter(|_| resume.exposed(&progress)) {
        // Stored in clear before a rule hid the key (or by an earlier version): sealed
        // and stored again before anything else.
        resume.keep(&mut progress, key);
        consumer.committed(&progress).await?;
    }
    consumer.on(TableEvent::Started(&progress));
    loop {
        (progress, position) = chunk(
            consumer,
            pool,
            &reader,
            &resume,
            (progress, position),
            chunk_rows,
        )
        .await?;
        consumer.on(TableEvent::Chunk(&progress));
        if progress.state == SnapshotState::Done {
            consumer.on(TableEvent::Done(&progress));
            return Ok(());
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

/// The table's progress as recorded, and the clear key its next chunk starts after.
type Position = (SnapshotProgress, Option<Vec<String>>);

/// One chunk: low watermark, SELECT, held, high watermark, the consumer's answer, and
/// its record. Returns the table's progress after it, with its clear position.
async fn chunk<C: ChunkConsumer>(
    consumer: &C,
    pool: &Pool,
    reader: &TableReader,
    resume: &Resume<'_>,
    (progress, position): Position,
    chunk_rows: usize,
) -> Result<Position, DriverError<C::Error>> {
    let id = consumer.chunk_ids().next_id();
    let low = write_watermark(pool, &format!("{id} low"), false).await?;
    let chunk = reader.read_chunk(position.as_deref(), chunk_rows).await?;
    let prev = progress.clone();
    let mut next = progress;
    next.last_error = None;
    let next_position = chunk.last_key.clone().or_else(|| position.clone());
    if let Some(key) = chunk.last_key {
        resume.keep(&mut next, key);
    }
    if chunk.rows.len() < chunk_rows {
        next.finish(now_ms());
    } else {
        next.state = SnapshotState::Running;
    }
    // The consumer answers `next` (counts added) or `prev` (read the chunk again): told
    // apart by their positions (a sealed one is a fresh token each time, so `prev`'s
    // and `next`'s never match by chance).
    let prev_at = (prev.after.clone(), prev.after_sealed.clone());
    let next_at = (next.after.clone(), next.after_sealed.clone());
    let rx = consumer.hold(HeldChunk {
        id: id.clone(),
        rows: chunk.rows,
        check: ChunkCheck {
            snapshot: chunk.snapshot,
            low: low.0,
        },
        prev,
        next,
    });
    if let Err(e) = write_watermark(pool, &high_mark(&id), true).await {
        consumer.release(&id);
        return Err(e.into());
    }
    let answer = tokio::select! {
        r = rx => r.ok_or(DriverError::Stopped)?,
        () = tokio::time::sleep(WATERMARK_WAIT) => {
            consumer.release(&id);
            return Err(DriverError::Unseen);
        }
        () = consumer.stopping() => {
            consumer.release(&id);
            return Err(DriverError::Stopped);
        }
    };
    let p = answer.map_err(DriverError::Consumer)?;
    consumer.committed(&p).await?;
    let at = (p.after.clone(), p.after_sealed.clone());
    let position = if at == next_at || at != prev_at {
        next_position
    } else {
        position
    };
    Ok((p, position))
}

/// Makes a stored progress record fit to keep: a finished snapshot's position dropped;
/// an unfinished one's clear key sealed where `redact` hides a primary-key column (the
/// table's key described from `pool`; a table that cannot be described any more loses
/// its clear key). For records written before the rule, or by an earlier version.
/// Whether `p` changed: the caller stores it again.
pub(crate) async fn seal_stored(
    pool: &Pool,
    redact: Option<&dyn Redact>,
    p: &mut SnapshotProgress,
) -> Result<bool, PgError> {
    if p.scrub_finished() {
        return Ok(true);
    }
    let (Some(redact), Some(after)) = (redact, p.after.clone()) else {
        return Ok(false);
    };
    let table = TableName::of(p);
    let reader = match TableReader::new(pool.clone(), table.clone()).await {
        Ok(r) => r,
        // A table gone, or not readable: its snapshot cannot resume anyway. Its clear
        // key is dropped rather than kept (read again from the first row, if ever).
        Err(e) if e.retry() == freshen::Retry::Fix => {
            p.after = None;
            return Ok(true);
        }
        Err(e) => return Err(e),
    };
    let resume = Resume::new(Some(redact), &table, reader.pk_names().iter().map(|c| &**c));
    if !resume.exposed(p) {
        return Ok(false);
    }
    resume.keep(p, after);
    Ok(true)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
