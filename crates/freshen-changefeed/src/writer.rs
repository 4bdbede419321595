//! The single writer thread: group commit of appends, consumer-group state and
//! retention deletes, with dedupe of replayed events.
//!
//! Requests queue on a channel. The writer takes everything queued (up to a limit),
//! applies it in one redb transaction, commits (fsync unless configured otherwise), and
//! only then answers each request and publishes the new last sequence to readers —
//! an event is never visible, nor its batch acknowledged, before it is durable.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::{Database, ReadableTable, WriteTransaction};
use tokio::sync::{mpsc, oneshot};

use crate::store::{self, DEAD, EVENTS, GROUPS, LEASES, LogState, META};
use crate::{Durability, Error};

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
}

/// One event to append: its record and, when the source gave one, its position.
#[derive(Debug)]
pub(crate) struct Item {
    pub(crate) position: Option<(u64, u32)>,
    pub(crate) record: Vec<u8>,
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
}

pub(crate) enum Request {
    Append {
        items: Vec<Item>,
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
}

/// Deletes per commit, so that a large retention pass never stalls appends for long.
pub(crate) const TRUNCATE_CHUNK: u64 = 50_000;

/// With `durability = "none"`, how often a commit is fsynced anyway: redb frees pages
/// only at durable commits, so a file written without them only grows.
const NONE_SYNC_EVERY: Duration = Duration::from_secs(1);

pub(crate) struct Settings {
    pub(crate) durability: Durability,
    pub(crate) commit_delay: Duration,
    pub(crate) max_commit_events: usize,
}

/// Where the writer publishes what it committed.
pub(crate) trait Publish: Send + 'static {
    fn committed(&self, state: &LogState, commit: Duration, appended: u64, duplicates: u64);
    fn failed(&self, reason: String);
}

pub(crate) fn spawn(
    db: Arc<Database>,
    state: LogState,
    settings: Settings,
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
}

impl Reply {
    fn send_ok(self) {
        // A requester that stopped waiting is not an error.
        let _ = match self {
            Reply::Append(tx, outcome) => tx.send(Ok(outcome)).map_err(drop),
            Reply::Write(tx) => tx.send(Ok(())).map_err(drop),
            Reply::Truncate(tx, n) => tx.send(Ok(n)).map_err(drop),
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
        };
    }
}

fn run(
    db: &Database,
    mut state: LogState,
    settings: &Settings,
    mut rx: mpsc::UnboundedReceiver<Request>,
    publish: &impl Publish,
) {
    let mut last_sync = Instant::now();
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
        let (mut appended, mut duplicates) = (0, 0);
        let result = db.begin_write().map_err(Error::from).and_then(|mut tx| {
            if !sync {
                tx.set_durability(redb::Durability::None)?;
            }
            for request in batch {
                replies.push(apply(
                    &tx,
                    &mut next,
                    request,
                    &mut appended,
                    &mut duplicates,
                )?);
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
                publish.committed(&state, started.elapsed(), appended, duplicates);
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
        Request::Truncate { reply, .. } => Reply::Truncate(reply, 0).send_err(reason),
    }
}

fn batch_events(r: &Request) -> usize {
    match r {
        Request::Append { items, .. } => items.len().max(1),
        Request::Write { ops, .. } => ops.len().max(1),
        Request::Truncate { .. } => 1,
    }
}

fn apply(
    tx: &WriteTransaction,
    next: &mut LogState,
    request: Request,
    appended: &mut u64,
    duplicates: &mut u64,
) -> Result<Reply, Error> {
    Ok(match request {
        Request::Append { items, reply } => {
            let mut outcome = AppendOutcome::default();
            if !items.is_empty() {
                let mut events = tx.open_table(EVENTS)?;
                for item in items {
                    if let Some(pos) = item.position {
                        // PostgreSQL replays whole transactions in commit order after a
                        // restart: anything at or below the durable high-water mark is
                        // already in the log.
                        if next.high_water.is_some_and(|hw| pos <= hw) {
                            outcome.duplicates += 1;
                            continue;
                        }
                        next.high_water = Some(pos);
                    }
                    next.last += 1;
                    if next.oldest > next.last {
                        next.oldest = next.last;
                    }
                    events.insert(next.last, item.record.as_slice())?;
                    next.size += store::stored_size(item.record.len());
                    outcome.appended += 1;
                    outcome.first_sequence.get_or_insert(next.last);
                }
                write_meta(tx, next)?;
            }
            outcome.last_sequence = next.last;
            *appended += outcome.appended;
            *duplicates += outcome.duplicates;
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
                {
                    let removed = events.extract_from_if(..before, |_, _| true)?;
                    for item in removed.take(TRUNCATE_CHUNK as usize) {
                        let (_, v) = item?;
                        next.size = next
                            .size
                            .saturating_sub(store::stored_size(v.value().len()));
                        deleted += 1;
                    }
                }
                next.oldest = match events.first()? {
                    Some((k, _)) => k.value(),
                    None => next.last + 1,
                };
                write_meta(tx, next)?;
            }
            Reply::Truncate(reply, deleted)
        }
    })
}

fn write_meta(tx: &WriteTransaction, s: &LogState) -> Result<(), Error> {
    let mut meta = tx.open_table(META)?;
    meta.insert(store::META_LAST, s.last.to_le_bytes().as_slice())?;
    meta.insert(store::META_SIZE, s.size.to_le_bytes().as_slice())?;
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
    }
    Ok(())
}
