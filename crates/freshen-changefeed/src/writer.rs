//! The single writer thread: group commit of appends, consumer-group state and
//! retention deletes, with dedupe of replayed events.
//!
//! Requests queue on a channel. The writer takes everything queued (up to a limit),
//! applies it in one redb transaction, commits (fsync unless configured otherwise), and
//! only then answers each request and publishes the new last sequence to readers —
//! an event is never visible, nor its batch acknowledged, before it is durable.

use std::sync::Arc;
use std::time::{Duration, Instant};

use freshen::RowEvent;
use freshen::plug::ChunkView;
use redb::{Database, ReadableTable, WriteTransaction};
use tokio::sync::{mpsc, oneshot};

use crate::record::{self, Encoder, Extra, RecordRef};
use crate::store::SnapshotRecord;
use crate::store::{self, DEAD, EVENTS, GROUPS, LATEST, LEASES, LogState, META, SNAPSHOTS};
use crate::{Durability, Error};
use freshen_codec::SnapshotProgress;

/// What an append did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AppendOutcome {
    /// Events appended.
    pub appended: u64,
    /// Events skipped because the log already holds their source position (a replay).
    pub duplicates: u64,
    /// The sequence of the first event appended, if any was.
    pub first_sequence: Option<u64>,
    /// The log's last sequence once the append was durable.
    pub last_sequence: u64,
    /// Events whose unchanged values were filled in from the row's last image.
    pub filled: u64,
    /// Events appended with values still unknown (`"partial":true`).
    pub partial: u64,
}

/// One source event to append, as one record or (a primary-key change) two, and its
/// source position when it has one. Its records are appended together or, as a replay,
/// not at all.
#[derive(Debug)]
pub(crate) struct Item {
    pub(crate) position: Option<(u64, u32)>,
    pub(crate) parts: Vec<Part>,
}

/// One record of an item.
#[derive(Debug)]
pub(crate) enum Part {
    /// Encoded by the appender.
    Ready(Vec<u8>),
    /// An event with values the source left out as unchanged: the writer encodes it
    /// once it looked up the row's last image, under index key `from` (the old key of
    /// a key change). `partial` says whether a value is still unknown.
    Fill {
        event: Box<RowEvent>,
        from: String,
        old_key: Option<String>,
        appended_ms: u64,
    },
}

/// A change to consumer-group state.
#[derive(Debug)]
pub(crate) enum WriteOp {
    PutGroup {
        group: String,
        value: Vec<u8>,
    },
    /// Deletes the group with its leases and dead letters.
    DeleteGroup {
        group: String,
    },
    PutLease {
        group: String,
        seq: u64,
        value: Vec<u8>,
    },
    DeleteLease {
        group: String,
        seq: u64,
    },
    PutDead {
        group: String,
        seq: u64,
        value: Vec<u8>,
    },
    DeleteDead {
        group: String,
        seq: u64,
    },
    DeleteAllDead {
        group: String,
    },
    /// Records a table's snapshot progress.
    PutSnapshot {
        key: String,
        value: Vec<u8>,
    },
}

pub(crate) enum Request {
    Append {
        items: Vec<Item>,
        /// The source's word that every transaction through this commit position is
        /// complete ([`freshen::Batch::committed_through`]), recorded with the items.
        complete: Option<u64>,
        reply: oneshot::Sender<Result<AppendOutcome, Error>>,
    },
    Write {
        ops: Vec<WriteOp>,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    /// Deletes events before `before` (at most `TRUNCATE_CHUNK` per commit); answers
    /// how many were deleted.
    Truncate {
        before: u64,
        reply: oneshot::Sender<Result<u64, Error>>,
    },
    /// Compaction: deletes these events (superseded by a later event of their row, or
    /// expired tombstones); answers how many were deleted.
    Compact {
        seqs: Vec<u64>,
        reply: oneshot::Sender<Result<u64, Error>>,
    },
    /// A snapshot chunk at its high watermark: appends the rows whose latest event the
    /// chunk's snapshot saw (as `read` events), drops the others, and records the
    /// table's progress in the same commit.
    Chunk {
        rows: Vec<RowEvent>,
        check: Arc<dyn ChunkView>,
        progress: Box<SnapshotProgress>,
        reply: oneshot::Sender<Result<SnapshotProgress, Error>>,
    },
}

/// Deletes per commit, so that a large retention pass never stalls appends for long.
pub(crate) const TRUNCATE_CHUNK: u64 = 50_000;

/// With `durability = "none"`, how often a commit is fsynced anyway: redb frees pages
/// only at durable commits, so a file written without them only grows.
const NONE_SYNC_EVERY: Duration = Duration::from_secs(1);

/// What the writer thread is built with.
pub(crate) struct WriterConfig {
    pub(crate) durability: Durability,
    pub(crate) commit_delay: Duration,
    pub(crate) max_commit_events: usize,
    /// Keep the latest-per-key index.
    pub(crate) key_index: bool,
}

/// What one commit did, for the metrics.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    pub(crate) appended: u64,
    pub(crate) duplicates: u64,
    pub(crate) filled: u64,
    pub(crate) partial: u64,
    pub(crate) compacted: u64,
    pub(crate) snapshot_rows: u64,
    pub(crate) snapshot_dropped: u64,
}

/// Where the writer publishes what it committed.
pub(crate) trait Publish: Send + 'static {
    fn committed(&self, state: &LogState, commit: Duration, tally: &Tally);
    fn failed(&self, reason: String);
}

pub(crate) fn spawn(
    db: Arc<Database>,
    state: LogState,
    settings: WriterConfig,
    publish: impl Publish,
) -> std::io::Result<(mpsc::UnboundedSender<Request>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let handle = std::thread::Builder::new()
        .name("changefeed-writer".into())
        .spawn(move || run(&db, state, &settings, rx, &publish))?;
    Ok((tx, handle))
}

enum Reply {
    Append(oneshot::Sender<Result<AppendOutcome, Error>>, AppendOutcome),
    Write(oneshot::Sender<Result<(), Error>>),
    Truncate(oneshot::Sender<Result<u64, Error>>, u64),
    Chunk(
        oneshot::Sender<Result<SnapshotProgress, Error>>,
        SnapshotProgress,
    ),
}

/// The writer's working state for one commit.
struct Work<'s> {
    settings: &'s WriterConfig,
    encoder: Encoder,
    tally: Tally,
}

impl Reply {
    fn send_ok(self) {
        // A requester that stopped waiting is not an error.
        let _ = match self {
            Reply::Append(tx, outcome) => tx.send(Ok(outcome)).map_err(drop),
            Reply::Write(tx) => tx.send(Ok(())).map_err(drop),
            Reply::Truncate(tx, n) => tx.send(Ok(n)).map_err(drop),
            Reply::Chunk(tx, p) => tx.send(Ok(p)).map_err(drop),
        };
    }

    fn send_err(self, reason: &str) {
        let err = || Error::Closed {
            reason: Some(reason.to_owned()),
        };
        let _ = match self {
            Reply::Append(tx, _) => tx.send(Err(err())).map_err(drop),
            Reply::Write(tx) => tx.send(Err(err())).map_err(drop),
            Reply::Truncate(tx, _) => tx.send(Err(err())).map_err(drop),
            Reply::Chunk(tx, _) => tx.send(Err(err())).map_err(drop),
        };
    }
}

fn run(
    db: &Database,
    mut state: LogState,
    settings: &WriterConfig,
    mut rx: mpsc::UnboundedReceiver<Request>,
    publish: &impl Publish,
) {
    let mut last_sync = Instant::now();
    let mut work = Work {
        settings,
        encoder: Encoder::default(),
        tally: Tally::default(),
    };
    while let Some(first) = rx.blocking_recv() {
        if !settings.commit_delay.is_zero() {
            std::thread::sleep(settings.commit_delay);
        }
        let mut batch = vec![first];
        let mut events = batch_events(&batch[0]);
        while events < settings.max_commit_events {
            match rx.try_recv() {
                Ok(r) => {
                    events += batch_events(&r);
                    batch.push(r);
                }
                Err(_) => break,
            }
        }
        let sync = match settings.durability {
            Durability::Fsync => true,
            Durability::None => last_sync.elapsed() >= NONE_SYNC_EVERY,
        };
        let started = Instant::now();
        let mut next = state;
        let mut replies = Vec::with_capacity(batch.len());
        work.tally = Tally::default();
        let result = db.begin_write().map_err(Error::from).and_then(|mut tx| {
            if !sync {
                tx.set_durability(redb::Durability::None)?;
            }
            for request in batch {
                replies.push(apply(&tx, &mut next, request, &mut work)?);
            }
            tx.commit()?;
            Ok(())
        });
        match result {
            Ok(()) => {
                if sync {
                    last_sync = Instant::now();
                }
                state = next;
                publish.committed(&state, started.elapsed(), &work.tally);
                for r in replies {
                    r.send_ok();
                }
            }
            Err(e) => {
                // A failed commit (an fsync error above all) cannot be retried safely:
                // stop, and fail everything queued and to come.
                let reason = e.to_string();
                publish.failed(reason.clone());
                for r in replies {
                    r.send_err(&reason);
                }
                rx.close();
                while let Ok(r) = rx.try_recv() {
                    fail(r, &reason);
                }
                return;
            }
        }
    }
}

fn fail(r: Request, reason: &str) {
    match r {
        Request::Append { reply, .. } => {
            Reply::Append(reply, AppendOutcome::default()).send_err(reason)
        }
        Request::Write { reply, .. } => Reply::Write(reply).send_err(reason),
        Request::Truncate { reply, .. } | Request::Compact { reply, .. } => {
            Reply::Truncate(reply, 0).send_err(reason)
        }
        Request::Chunk {
            reply, progress, ..
        } => Reply::Chunk(reply, *progress).send_err(reason),
    }
}

fn batch_events(r: &Request) -> usize {
    match r {
        Request::Append { items, .. } => items.len().max(1),
        Request::Write { ops, .. } => ops.len().max(1),
        Request::Truncate { .. } => 1,
        Request::Compact { seqs, .. } => seqs.len().max(1),
        Request::Chunk { rows, .. } => rows.len().max(1),
    }
}

fn apply(
    tx: &WriteTransaction,
    next: &mut LogState,
    request: Request,
    work: &mut Work<'_>,
) -> Result<Reply, Error> {
    Ok(match request {
        Request::Append {
            items,
            complete,
            reply,
        } => {
            let mut outcome = AppendOutcome::default();
            let completes = complete.is_some_and(|c| c > next.tx_complete);
            if let Some(c) = complete.filter(|_| completes) {
                next.tx_complete = c;
            }
            if !items.is_empty() {
                let mut events = tx.open_table(EVENTS)?;
                let mut latest = tx.open_table(LATEST)?;
                for item in items {
                    if let Some(pos) = item.position {
                        // PostgreSQL replays whole transactions in commit order after a
                        // restart: anything at or below the durable high-water mark is
                        // already in the log (both records of a key change included).
                        if next.high_water.is_some_and(|hw| pos <= hw) {
                            outcome.duplicates += 1;
                            continue;
                        }
                        next.high_water = Some(pos);
                    }
                    // Every record of the item is encoded before any is appended: the PUT
                    // of a key change fills from the row's image under its old key,
                    // which its own DELETE is about to end.
                    let mut records = Vec::with_capacity(item.parts.len());
                    for part in item.parts {
                        records.push(match part {
                            Part::Ready(r) => r,
                            Part::Fill {
                                event,
                                from,
                                old_key,
                                appended_ms,
                            } => {
                                let image = last_image(&events, &latest, &from)?;
                                let r = work.encoder.encode_with(
                                    &event,
                                    appended_ms,
                                    Extra {
                                        old_key: old_key.as_deref(),
                                        fill: image.as_ref(),
                                        ..Extra::default()
                                    },
                                );
                                if work.encoder.partial {
                                    outcome.partial += 1;
                                } else {
                                    outcome.filled += 1;
                                }
                                r
                            }
                        });
                    }
                    for record in records {
                        next.last += 1;
                        if next.oldest > next.last {
                            next.oldest = next.last;
                        }
                        events.insert(next.last, record.as_slice())?;
                        if work.settings.key_index
                            && let Some(r) = RecordRef::parse(&record)
                        {
                            store::index(&mut latest, next.last, &r)?;
                        }
                        next.size += store::stored_size(record.len());
                        next.count += 1;
                        outcome.appended += 1;
                        outcome.first_sequence.get_or_insert(next.last);
                    }
                }
                write_meta(tx, next, work.settings.key_index)?;
            } else if completes {
                write_meta(tx, next, work.settings.key_index)?;
            }
            outcome.last_sequence = next.last;
            work.tally.appended += outcome.appended;
            work.tally.duplicates += outcome.duplicates;
            work.tally.filled += outcome.filled;
            work.tally.partial += outcome.partial;
            Reply::Append(reply, outcome)
        }
        Request::Write { ops, reply } => {
            for op in ops {
                write_op(tx, op)?;
            }
            Reply::Write(reply)
        }
        Request::Truncate { before, reply } => {
            let before = before.min(next.last + 1);
            let mut deleted = 0;
            if before > next.oldest {
                let mut events = tx.open_table(EVENTS)?;
                let mut latest = tx.open_table(LATEST)?;
                let mut last_deleted = None;
                {
                    let removed = events.extract_from_if(..before, |_, _| true)?;
                    for item in removed.take(TRUNCATE_CHUNK as usize) {
                        let (k, v) = item?;
                        let seq = k.value();
                        let v = v.value();
                        next.size = next.size.saturating_sub(store::stored_size(v.len()));
                        if work.settings.key_index {
                            forget(&mut latest, seq, v)?;
                        }
                        last_deleted = Some(seq);
                        deleted += 1;
                    }
                }
                next.count = next.count.saturating_sub(deleted);
                if let Some(seq) = last_deleted {
                    next.truncated = next.truncated.max(seq + 1);
                }
                next.oldest = match events.first()? {
                    Some((k, _)) => k.value(),
                    None => next.last + 1,
                };
                // Nothing left below `before` (the last chunk): the front is `before`.
                if next.oldest >= before {
                    next.truncated = next.truncated.max(before);
                }
                write_meta(tx, next, work.settings.key_index)?;
            }
            Reply::Truncate(reply, deleted)
        }
        Request::Compact { seqs, reply } => {
            let mut deleted = 0;
            if !seqs.is_empty() {
                let mut events = tx.open_table(EVENTS)?;
                let mut latest = tx.open_table(LATEST)?;
                for seq in seqs {
                    let Some(v) = events.remove(seq)? else {
                        continue;
                    };
                    let v = v.value();
                    next.size = next.size.saturating_sub(store::stored_size(v.len()));
                    forget(&mut latest, seq, v)?;
                    deleted += 1;
                }
                next.count = next.count.saturating_sub(deleted);
                next.oldest = match events.first()? {
                    Some((k, _)) => k.value(),
                    None => next.last + 1,
                };
                write_meta(tx, next, work.settings.key_index)?;
            }
            work.tally.compacted += deleted;
            Reply::Truncate(reply, deleted)
        }
        Request::Chunk {
            rows,
            check,
            mut progress,
            reply,
        } => {
            let mut appended = 0;
            let mut dropped = 0;
            if !rows.is_empty() {
                let mut events = tx.open_table(EVENTS)?;
                let mut latest = tx.open_table(LATEST)?;
                let now = record::unix_ms(std::time::SystemTime::now());
                for row in rows {
                    let key = record::index_key_of(&row);
                    if changed_since(&events, &latest, &key, &*check)? {
                        dropped += 1;
                        continue;
                    }
                    let r = work.encoder.encode_with(
                        &row,
                        now,
                        Extra {
                            read: true,
                            ..Extra::default()
                        },
                    );
                    next.last += 1;
                    if next.oldest > next.last {
                        next.oldest = next.last;
                    }
                    events.insert(next.last, r.as_slice())?;
                    if work.settings.key_index
                        && let Some(rec) = RecordRef::parse(&r)
                    {
                        store::index(&mut latest, next.last, &rec)?;
                    }
                    next.size += store::stored_size(r.len());
                    next.count += 1;
                    appended += 1;
                }
                write_meta(tx, next, work.settings.key_index)?;
            }
            progress.rows += appended;
            progress.dropped += dropped;
            progress.chunks += 1;
            tx.open_table(SNAPSHOTS)?
                .insert(progress.store_key().as_str(), progress.to_json().as_slice())?;
            work.tally.appended += appended;
            work.tally.snapshot_rows += appended;
            work.tally.snapshot_dropped += dropped;
            Reply::Chunk(reply, *progress)
        }
    })
}

/// Whether the row under index key `key` changed in a way the chunk's rows may not
/// show: its latest event (every event before the high watermark is in the log by now)
/// committed after the low watermark (DBLog's window), or in a transaction the chunk's
/// snapshot did not see (committed before the low watermark in the WAL but not yet
/// visible when the chunk was read: WAL order is not visibility order). Either way the
/// live event already in the log is the row's state, and the chunk's row is dropped.
fn changed_since(
    events: &redb::Table<'_, u64, &'static [u8]>,
    latest: &redb::Table<'_, &'static str, u64>,
    key: &str,
    check: &dyn ChunkView,
) -> Result<bool, Error> {
    let Some(seq) = latest.get(key)?.map(|s| s.value()) else {
        return Ok(false);
    };
    let Some(v) = events.get(seq)? else {
        return Ok(false);
    };
    Ok(RecordRef::parse(v.value())
        .and_then(|r| record::position_of(&r))
        .is_some_and(|(lsn, xid)| check.misses(xid, lsn)))
}

/// Removes the index entry of a deleted record when it still names it.
fn forget(
    latest: &mut redb::Table<'_, &'static str, u64>,
    seq: u64,
    record: &[u8],
) -> Result<(), Error> {
    if let Some(k) = RecordRef::parse(record).and_then(|r| r.index_key())
        && latest.get(k.as_str())?.is_some_and(|s| s.value() == seq)
    {
        latest.remove(k.as_str())?;
    }
    Ok(())
}

/// The last image of the row whose index key is `key`, when the log still holds it and
/// it was not deleted.
fn last_image(
    events: &redb::Table<'_, u64, &'static [u8]>,
    latest: &redb::Table<'_, &'static str, u64>,
    key: &str,
) -> Result<Option<record::Fill>, Error> {
    let Some(seq) = latest.get(key)?.map(|s| s.value()) else {
        return Ok(None);
    };
    let Some(v) = events.get(seq)? else {
        return Ok(None);
    };
    Ok(RecordRef::parse(v.value()).and_then(|r| record::image_of(&r)))
}

fn write_meta(tx: &WriteTransaction, s: &LogState, key_index: bool) -> Result<(), Error> {
    let mut meta = tx.open_table(META)?;
    meta.insert(store::META_LAST, s.last.to_le_bytes().as_slice())?;
    meta.insert(store::META_SIZE, s.size.to_le_bytes().as_slice())?;
    meta.insert(store::META_TRUNCATED, s.truncated.to_le_bytes().as_slice())?;
    if key_index {
        meta.insert(store::META_INDEXED, s.last.to_le_bytes().as_slice())?;
    }
    if s.tx_complete > 0 {
        meta.insert(
            store::META_TX_COMPLETE,
            s.tx_complete.to_le_bytes().as_slice(),
        )?;
    }
    if let Some(hw) = s.high_water {
        meta.insert(
            store::META_HIGH_WATER,
            store::encode_high_water(hw).as_slice(),
        )?;
    }
    Ok(())
}

fn write_op(tx: &WriteTransaction, op: WriteOp) -> Result<(), Error> {
    match op {
        WriteOp::PutGroup { group, value } => {
            tx.open_table(GROUPS)?
                .insert(group.as_str(), value.as_slice())?;
        }
        WriteOp::DeleteGroup { group } => {
            tx.open_table(GROUPS)?.remove(group.as_str())?;
            let g = group.as_str();
            tx.open_table(LEASES)?
                .retain_in((g, 0)..=(g, u64::MAX), |_, _| false)?;
            tx.open_table(DEAD)?
                .retain_in((g, 0)..=(g, u64::MAX), |_, _| false)?;
        }
        WriteOp::PutLease { group, seq, value } => {
            tx.open_table(LEASES)?
                .insert((group.as_str(), seq), value.as_slice())?;
        }
        WriteOp::DeleteLease { group, seq } => {
            tx.open_table(LEASES)?.remove((group.as_str(), seq))?;
        }
        WriteOp::PutDead { group, seq, value } => {
            tx.open_table(DEAD)?
                .insert((group.as_str(), seq), value.as_slice())?;
        }
        WriteOp::DeleteDead { group, seq } => {
            tx.open_table(DEAD)?.remove((group.as_str(), seq))?;
        }
        WriteOp::DeleteAllDead { group } => {
            let g = group.as_str();
            tx.open_table(DEAD)?
                .retain_in((g, 0)..=(g, u64::MAX), |_, _| false)?;
        }
        WriteOp::PutSnapshot { key, value } => {
            tx.open_table(SNAPSHOTS)?
                .insert(key.as_str(), value.as_slice())?;
        }
    }
    Ok(())
}
