//! Consumer groups: competing consumers share one cursor through the log. A received
//! event is *leased* to its consumer for a visibility timeout; acknowledged, it is done;
//! not acknowledged in time (or negatively acknowledged), it is delivered again; after
//! `max_deliveries` it moves to the group's dead-letter queue. Cursors, committed
//! offsets, leases and dead letters are all stored in the log's file and survive a
//! restart; every change is durable before the request that made it is answered.
//!
//! The committed offset is the sequence up to which everything is done (acknowledged,
//! filtered out or dead-lettered). Retention keeps everything after the lowest committed
//! offset unless configured to drop it; when events a group had not received were
//! deleted all the same (that policy, or an explicit delete), the group's next receive
//! reports the gap ([`Gap`]) and [`GroupInfo`] counts it — never silence. Deadlines are wall-clock milliseconds so that leases
//! keep their meaning across a restart.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use redb::{ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};

use crate::metrics::{self, GroupGauges};
use crate::record::{self, RecordRef};
use crate::shared::Core;
use crate::store::{self, DEAD, GROUPS, LEASES};
use crate::writer::WriteOp;
use crate::{Error, Filter, GroupDefaults};

/// How many log events one receive examines at most (filtered groups skip the rest
/// on the next receive).
const MAX_SCAN: usize = 10_000;

/// How often expired leases that used up their deliveries are dead-lettered even when
/// nobody receives.
const SWEEP_EVERY: Duration = Duration::from_millis(500);

fn now_ms() -> u64 {
    record::unix_ms(SystemTime::now())
}

/// Where a new group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The oldest stored event.
    Earliest,
    /// After the latest event: only what is appended from now on.
    Latest,
    /// After this sequence.
    After(u64),
}

/// A consumer group's definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSpec {
    /// Only events of these tables (names or `schema.table`); empty for all.
    #[serde(default)]
    pub tables: Vec<String>,
    /// Only events whose key starts with this.
    #[serde(default)]
    pub key_prefix: Option<String>,
    /// Only these operations (comma-separated: `insert`, `update`, `delete`,
    /// `truncate`, `PUT`, `DELETE`).
    #[serde(default)]
    pub ops: Option<String>,
    /// Lease length, in milliseconds.
    pub visibility_timeout_ms: u64,
    /// Deliveries before an unacknowledged event is dead-lettered.
    pub max_deliveries: u32,
}

impl GroupSpec {
    /// A definition with the configured defaults and no filter.
    pub fn new(defaults: &GroupDefaults) -> GroupSpec {
        GroupSpec {
            tables: Vec::new(),
            key_prefix: None,
            ops: None,
            visibility_timeout_ms: defaults.visibility_timeout_ms,
            max_deliveries: defaults.max_deliveries,
        }
    }

    fn filter(&self) -> Result<Filter, Error> {
        let mut f = Filter::default();
        for t in &self.tables {
            f = f.table(t.clone());
        }
        if let Some(p) = &self.key_prefix {
            f = f.key_prefix(p.clone());
        }
        if let Some(ops) = &self.ops {
            f = f.parse_ops(ops).map_err(Error::Invalid)?;
        }
        Ok(f)
    }
}

/// Sequences a consumer group had not received when they were deleted: every
/// sequence after `after` and before `before` (some may not have matched its filter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    /// The group's position when it found the gap.
    pub after: u64,
    /// The first sequence it can still read.
    pub before: u64,
}

impl Gap {
    /// How many sequences the gap spans.
    pub fn len(&self) -> u64 {
        self.before.saturating_sub(self.after + 1)
    }

    /// Whether the gap spans no sequence.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The stored form of a group.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GroupRecord {
    spec: GroupSpec,
    created_ms: u64,
    cursor: u64,
    offset: u64,
    /// Sequences deleted before the group received them, in all.
    #[serde(default)]
    dropped: u64,
    /// The last such gap.
    #[serde(default)]
    last_gap: Option<Gap>,
}

/// An event in flight in a group: leased to a consumer, or waiting to be delivered
/// again (`consumer` is `None`, or the deadline has passed).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Lease {
    consumer: Option<String>,
    deadline_ms: u64,
    deliveries: u32,
    /// Replayed from the dead-letter queue: below the committed offset, so it does not
    /// hold the offset back, and it carries its record in case retention removed it.
    #[serde(default)]
    replayed: bool,
    /// The last reason a consumer gave when it nacked.
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeadHeader {
    reason: String,
    attempts: u32,
    dead_at_ms: u64,
}

/// A JSON header followed by raw bytes (a record): `len: u32 LE`, header, tail.
fn pack(header: &impl Serialize, tail: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(header).unwrap_or_default();
    let mut out = Vec::with_capacity(4 + json.len() + tail.len());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(tail);
    out
}

fn unpack<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Option<(T, &'a [u8])> {
    let (len, rest) = bytes.split_at_checked(4)?;
    let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
    let (json, tail) = rest.split_at_checked(len)?;
    Some((serde_json::from_slice(json).ok()?, tail))
}

struct Group {
    record: GroupRecord,
    filter: Filter,
    inflight: BTreeMap<u64, Lease>,
    /// Replayed dead letters carry their record (the log may have dropped it).
    carried: BTreeMap<u64, Vec<u8>>,
    by_deadline: BTreeSet<(u64, u64)>,
    dead: BTreeSet<u64>,
}

impl Group {
    fn set_lease(&mut self, seq: u64, lease: Lease, ops: &mut Vec<WriteOp>, name: &str) {
        if let Some(old) = self.inflight.get(&seq) {
            self.by_deadline.remove(&(old.deadline_ms, seq));
        }
        self.by_deadline.insert((lease.deadline_ms, seq));
        let tail = self.carried.get(&seq).map_or(&[][..], Vec::as_slice);
        ops.push(WriteOp::PutLease {
            group: name.to_owned(),
            seq,
            value: pack(&lease, tail),
        });
        self.inflight.insert(seq, lease);
    }

    fn remove_lease(&mut self, seq: u64, ops: &mut Vec<WriteOp>, name: &str) -> Option<Lease> {
        let lease = self.inflight.remove(&seq)?;
        self.by_deadline.remove(&(lease.deadline_ms, seq));
        self.carried.remove(&seq);
        ops.push(WriteOp::DeleteLease {
            group: name.to_owned(),
            seq,
        });
        Some(lease)
    }

    /// Recomputes the committed offset; queues the group record when it or the cursor
    /// changed.
    fn settle(&mut self, before: (u64, u64), ops: &mut Vec<WriteOp>, name: &str) {
        let floor = self
            .inflight
            .iter()
            .find(|(_, l)| !l.replayed)
            .map_or(self.record.cursor, |(seq, _)| seq - 1);
        self.record.offset = self.record.offset.max(floor);
        if (self.record.cursor, self.record.offset) != before {
            ops.push(WriteOp::PutGroup {
                group: name.to_owned(),
                value: serde_json::to_vec(&self.record).unwrap_or_default(),
            });
        }
    }

    fn counts(&self, now: u64) -> (u64, u64) {
        let leased = self
            .inflight
            .values()
            .filter(|l| l.consumer.is_some() && l.deadline_ms > now)
            .count() as u64;
        (leased, self.inflight.len() as u64 - leased)
    }
}

/// A group as `GET /changefeed/groups/{name}` shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupInfo {
    /// The group's name.
    pub name: String,
    /// Every sequence up to this one is done (acknowledged, filtered out or
    /// dead-lettered).
    pub committed_offset: u64,
    /// The last sequence the group has read from the log.
    pub cursor: u64,
    /// The log's latest sequence.
    pub latest_sequence: u64,
    /// Sequences appended after the committed offset.
    pub lag: u64,
    /// Events leased to a consumer now.
    pub in_flight: u64,
    /// Events waiting to be delivered again (lease expired, nacked, replayed).
    pub pending_redelivery: u64,
    /// Events in the dead-letter queue.
    pub dead_letters: u64,
    /// Sequences deleted (by retention dropping unacknowledged events, or an explicit
    /// delete) before the group received them, in all; 0 when it missed nothing.
    pub dropped_sequences: u64,
    /// The last gap found, if any.
    pub last_gap: Option<Gap>,
    /// The definition.
    #[serde(flatten)]
    pub spec: GroupSpec,
    /// When the group was created (ms since the epoch).
    pub created_ms: u64,
}

/// One event handed to a consumer.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) sequence: u64,
    pub(crate) json: Vec<u8>,
}

/// What a receive handed out.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) deliveries: Vec<Delivery>,
    pub(crate) lease_expires_ms: u64,
    /// Events deleted before this group received them, found by this receive.
    pub(crate) gap: Option<Gap>,
}

/// What an ack or nack did.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub(crate) struct Settled {
    pub(crate) acked: u64,
    pub(crate) requeued: u64,
    pub(crate) dead_lettered: u64,
    pub(crate) unknown: u64,
    pub(crate) committed_offset: u64,
}

/// A dead letter as listed.
#[derive(Debug, Clone)]
pub(crate) struct DeadLetter {
    pub(crate) sequence: u64,
    pub(crate) reason: String,
    pub(crate) attempts: u32,
    pub(crate) dead_at_ms: u64,
    pub(crate) json: String,
}

pub(crate) struct Groups {
    core: Arc<Core>,
    defaults: GroupDefaults,
    state: Mutex<BTreeMap<String, Group>>,
}

/// Group names appear in URLs and metric labels: keep them short and plain.
fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "invalid group name {name:?}: 1 to 128 characters of A-Z, a-z, 0-9, '.', '_', '-'"
        )))
    }
}

impl Groups {
    /// Loads every group's state from the store.
    pub(crate) fn load(core: Arc<Core>, defaults: GroupDefaults) -> Result<Groups, Error> {
        let mut groups = BTreeMap::new();
        {
            let tx = core.db.begin_read()?;
            for item in tx.open_table(GROUPS)?.iter()? {
                let (k, v) = item?;
                let record: GroupRecord = serde_json::from_slice(v.value())
                    .map_err(|e| Error::Format(format!("group {:?}: {e}", k.value())))?;
                let filter = record.spec.filter()?;
                groups.insert(
                    k.value().to_owned(),
                    Group {
                        record,
                        filter,
                        inflight: BTreeMap::new(),
                        carried: BTreeMap::new(),
                        by_deadline: BTreeSet::new(),
                        dead: BTreeSet::new(),
                    },
                );
            }
            for item in tx.open_table(LEASES)?.iter()? {
                let (k, v) = item?;
                let (name, seq) = k.value();
                let Some(g) = groups.get_mut(name) else {
                    continue;
                };
                let Some((lease, tail)) = unpack::<Lease>(v.value()) else {
                    return Err(Error::Format(format!(
                        "lease {seq} of group {name:?} is unreadable"
                    )));
                };
                if !tail.is_empty() {
                    g.carried.insert(seq, tail.to_vec());
                }
                g.by_deadline.insert((lease.deadline_ms, seq));
                g.inflight.insert(seq, lease);
            }
            for item in tx.open_table(DEAD)?.iter()? {
                let (k, _) = item?;
                let (name, seq) = k.value();
                if let Some(g) = groups.get_mut(name) {
                    g.dead.insert(seq);
                }
            }
        }
        Ok(Groups {
            core,
            defaults,
            state: Mutex::new(groups),
        })
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Group>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn defaults(&self) -> &GroupDefaults {
        &self.defaults
    }

    fn info_of(&self, name: &str, g: &Group, now: u64) -> GroupInfo {
        let latest = self.core.latest();
        let (in_flight, pending) = g.counts(now);
        GroupInfo {
            name: name.to_owned(),
            committed_offset: g.record.offset,
            cursor: g.record.cursor,
            latest_sequence: latest,
            lag: latest.saturating_sub(g.record.offset),
            in_flight,
            pending_redelivery: pending,
            dead_letters: g.dead.len() as u64,
            dropped_sequences: g.record.dropped,
            last_gap: g.record.last_gap,
            spec: g.record.spec.clone(),
            created_ms: g.record.created_ms,
        }
    }

    /// Creates a group; an existing group with the same definition is returned as is
    /// (`false`: not created now).
    pub(crate) async fn create(
        &self,
        name: &str,
        spec: GroupSpec,
        start: Start,
    ) -> Result<(GroupInfo, bool), Error> {
        check_name(name)?;
        let max_visibility = crate::config::limits::MAX_VISIBILITY_MS;
        if spec.max_deliveries == 0 || !(1..=max_visibility).contains(&spec.visibility_timeout_ms) {
            return Err(Error::Invalid(format!(
                "max_deliveries must be at least 1, visibility_timeout_ms between 1 and {max_visibility}"
            )));
        }
        let filter = spec.filter()?;
        let rx = {
            let mut groups = self.lock();
            if let Some(g) = groups.get(name) {
                if g.record.spec == spec {
                    return Ok((self.info_of(name, g, now_ms()), false));
                }
                return Err(Error::GroupExists(name.to_owned()));
            }
            let stats = self.core.stats();
            let cursor = match start {
                Start::Earliest => stats.oldest_sequence.saturating_sub(1),
                Start::Latest => stats.latest_sequence,
                Start::After(s) => s.min(stats.latest_sequence),
            };
            let record = GroupRecord {
                spec,
                created_ms: now_ms(),
                cursor,
                offset: cursor,
                dropped: 0,
                last_gap: None,
            };
            let ops = vec![WriteOp::PutGroup {
                group: name.to_owned(),
                value: serde_json::to_vec(&record).unwrap_or_default(),
            }];
            groups.insert(
                name.to_owned(),
                Group {
                    record,
                    filter,
                    inflight: BTreeMap::new(),
                    carried: BTreeMap::new(),
                    by_deadline: BTreeSet::new(),
                    dead: BTreeSet::new(),
                },
            );
            self.core.write_submit(ops)?
        };
        self.core.wait(rx).await?;
        Ok((self.info(name)?, true))
    }

    pub(crate) async fn delete(&self, name: &str) -> Result<(), Error> {
        let rx = {
            let mut groups = self.lock();
            if groups.remove(name).is_none() {
                return Err(Error::UnknownGroup(name.to_owned()));
            }
            self.core.write_submit(vec![WriteOp::DeleteGroup {
                group: name.to_owned(),
            }])?
        };
        self.core.wait(rx).await
    }

    pub(crate) fn info(&self, name: &str) -> Result<GroupInfo, Error> {
        let groups = self.lock();
        let g = groups
            .get(name)
            .ok_or_else(|| Error::UnknownGroup(name.to_owned()))?;
        Ok(self.info_of(name, g, now_ms()))
    }

    pub(crate) fn list(&self) -> Vec<GroupInfo> {
        let now = now_ms();
        self.lock()
            .iter()
            .map(|(n, g)| self.info_of(n, g, now))
            .collect()
    }

    /// The lowest committed offset of any group; `None` without groups.
    pub(crate) fn min_offset(&self) -> Option<u64> {
        self.lock().values().map(|g| g.record.offset).min()
    }

    pub(crate) fn gauges(&self) -> Vec<GroupGauges> {
        let now = now_ms();
        let latest = self.core.latest();
        self.lock()
            .iter()
            .map(|(n, g)| GroupGauges {
                name: n.clone(),
                committed_offset: g.record.offset,
                lag: latest.saturating_sub(g.record.offset),
                in_flight: g.counts(now).0,
                dead_letters: g.dead.len() as u64,
            })
            .collect()
    }

    /// The record of `seq` for a delivery: carried (replayed) or from the log.
    fn record_of(&self, g: &Group, seq: u64) -> Result<Option<Vec<u8>>, Error> {
        match g.carried.get(&seq) {
            Some(r) => Ok(Some(r.clone())),
            None => store::get(&self.core.db, seq),
        }
    }

    /// Moves an expired lease that used up its deliveries to the dead-letter queue.
    fn dead_letter(
        &self,
        g: &mut Group,
        name: &str,
        seq: u64,
        ops: &mut Vec<WriteOp>,
        now: u64,
    ) -> Result<(), Error> {
        let record = self.record_of(g, seq)?;
        let Some(lease) = g.remove_lease(seq, ops, name) else {
            return Ok(());
        };
        match record {
            Some(record) => {
                let reason = lease.reason.clone().unwrap_or_else(|| {
                    format!(
                        "not acknowledged within the visibility timeout after {} deliveries",
                        lease.deliveries
                    )
                });
                let header = DeadHeader {
                    reason,
                    attempts: lease.deliveries,
                    dead_at_ms: now,
                };
                ops.push(WriteOp::PutDead {
                    group: name.to_owned(),
                    seq,
                    value: pack(&header, &record),
                });
                g.dead.insert(seq);
                metrics::inc(&self.core.metrics().group_dead_lettered);
            }
            None => metrics::inc(&self.core.metrics().group_lost_to_retention),
        }
        Ok(())
    }

    /// Applies `change` to group `name` under the lock, queues the group record when its
    /// cursor or offset moved, submits the writes in lock order, and returns once they
    /// are durable, with the committed offset after the change.
    async fn mutate<T>(
        &self,
        name: &str,
        change: impl FnOnce(&mut Group, &mut Vec<WriteOp>) -> Result<T, Error>,
    ) -> Result<(T, u64), Error> {
        let (out, offset, rx) = {
            let mut groups = self.lock();
            let g = groups
                .get_mut(name)
                .ok_or_else(|| Error::UnknownGroup(name.to_owned()))?;
            let before = (g.record.cursor, g.record.offset);
            let mut ops = Vec::new();
            let out = change(g, &mut ops)?;
            g.settle(before, &mut ops, name);
            let rx = (!ops.is_empty())
                .then(|| self.core.write_submit(ops))
                .transpose()?;
            (out, g.record.offset, rx)
        };
        if let Some(rx) = rx {
            self.core.wait(rx).await?;
        }
        Ok((out, offset))
    }

    /// Leases up to `max` events to `consumer`: first those due for redelivery, then new
    /// ones from the log. Returns once the leases are durable.
    pub(crate) async fn receive(
        &self,
        name: &str,
        consumer: &str,
        max: usize,
        visibility_ms: Option<u64>,
    ) -> Result<Received, Error> {
        let metrics = self.core.metrics();
        let (received, _) = self
            .mutate(name, |g, ops| {
                let now = now_ms();
                let visibility = visibility_ms
                    .unwrap_or(g.record.spec.visibility_timeout_ms)
                    .max(1);
                let deadline = now.saturating_add(visibility);
                let lease = |deliveries| Lease {
                    consumer: Some(consumer.to_owned()),
                    deadline_ms: deadline,
                    deliveries,
                    replayed: false,
                    reason: None,
                };
                let mut out = Vec::new();
                let due: Vec<u64> = g
                    .by_deadline
                    .range(..=(now, u64::MAX))
                    .map(|&(_, s)| s)
                    .collect();
                for seq in due {
                    if out.len() >= max {
                        break;
                    }
                    let Some(old) = g.inflight.get(&seq).cloned() else {
                        continue;
                    };
                    if old.deliveries >= g.record.spec.max_deliveries {
                        self.dead_letter(g, name, seq, ops, now)?;
                        continue;
                    }
                    let Some(record) = self.record_of(g, seq)? else {
                        g.remove_lease(seq, ops, name);
                        metrics::inc(&metrics.group_lost_to_retention);
                        continue;
                    };
                    let new = Lease {
                        replayed: old.replayed,
                        reason: old.reason,
                        ..lease(old.deliveries + 1)
                    };
                    metrics::inc(if new.deliveries > 1 {
                        &metrics.group_redelivered
                    } else {
                        &metrics.group_received
                    });
                    out.push(delivery(seq, new.deliveries, &record));
                    g.set_lease(seq, new, ops, name);
                }
                // Events deleted before this group read them: skip to what is left and
                // say so.
                let mut gap = None;
                let front = self.core.truncated();
                if g.record.cursor + 1 < front {
                    let found = Gap {
                        after: g.record.cursor,
                        before: front,
                    };
                    g.record.cursor = front - 1;
                    g.record.dropped += found.len();
                    g.record.last_gap = Some(found);
                    metrics::add(&metrics.group_gap_sequences, found.len());
                    tracing::warn!(
                        group = name,
                        after = found.after,
                        before = found.before,
                        "consumer group missed events deleted before it received them"
                    );
                    gap = Some(found);
                }
                if out.len() < max {
                    let mut fresh = Vec::new();
                    let filter = g.filter.clone();
                    g.record.cursor = self.core.read_json(
                        g.record.cursor,
                        max - out.len(),
                        MAX_SCAN,
                        &filter,
                        |seq, r| fresh.push(delivery_ref(seq, 1, r)),
                    )?;
                    metrics::add(&metrics.group_received, fresh.len() as u64);
                    for d in fresh {
                        g.set_lease(d.sequence, lease(1), ops, name);
                        out.push(d);
                    }
                }
                Ok(Received {
                    deliveries: out,
                    lease_expires_ms: deadline,
                    gap,
                })
            })
            .await?;
        Ok(received)
    }

    /// When the group's next lease comes due (ms since the epoch), if any is in flight.
    pub(crate) fn next_due_ms(&self, name: &str) -> Option<u64> {
        self.lock().get(name)?.by_deadline.first().map(|&(d, _)| d)
    }

    /// Acknowledges `seqs` (or, with `up_to`, every lease of `consumer` up to it).
    pub(crate) async fn ack(
        &self,
        name: &str,
        seqs: &[u64],
        up_to: Option<(&str, u64)>,
    ) -> Result<Settled, Error> {
        let (mut s, offset) = self
            .mutate(name, |g, ops| {
                let mut s = Settled::default();
                let mut targets = seqs.to_vec();
                if let Some((consumer, last)) = up_to {
                    targets.extend(
                        g.inflight
                            .range(..=last)
                            .filter(|(_, l)| l.consumer.as_deref() == Some(consumer))
                            .map(|(s, _)| *s),
                    );
                }
                for seq in targets {
                    if g.remove_lease(seq, ops, name).is_some() {
                        s.acked += 1;
                    } else {
                        s.unknown += 1;
                    }
                }
                Ok(s)
            })
            .await?;
        metrics::add(&self.core.metrics().group_acked, s.acked);
        s.committed_offset = offset;
        Ok(s)
    }

    /// Negatively acknowledges `seqs`: each is delivered again after `delay_ms`, or
    /// dead-lettered with `reason` when it used up its deliveries.
    pub(crate) async fn nack(
        &self,
        name: &str,
        seqs: &[u64],
        reason: Option<String>,
        delay_ms: u64,
    ) -> Result<Settled, Error> {
        let reason = reason.unwrap_or_else(|| "negatively acknowledged".to_owned());
        let (mut s, offset) = self
            .mutate(name, |g, ops| {
                let now = now_ms();
                let mut s = Settled::default();
                for &seq in seqs {
                    let Some(lease) = g.inflight.get(&seq).cloned() else {
                        s.unknown += 1;
                        continue;
                    };
                    let lease = Lease {
                        consumer: None,
                        deadline_ms: now.saturating_add(delay_ms),
                        reason: Some(reason.clone()),
                        ..lease
                    };
                    if lease.deliveries >= g.record.spec.max_deliveries {
                        g.set_lease(seq, lease, ops, name);
                        self.dead_letter(g, name, seq, ops, now)?;
                        s.dead_lettered += 1;
                    } else {
                        g.set_lease(seq, lease, ops, name);
                        s.requeued += 1;
                    }
                }
                Ok(s)
            })
            .await?;
        metrics::add(
            &self.core.metrics().group_nacked,
            s.requeued + s.dead_lettered,
        );
        s.committed_offset = offset;
        Ok(s)
    }

    /// Dead-letters expired leases that used up their deliveries, in every group.
    pub(crate) async fn sweep(&self) -> Result<(), Error> {
        let rx = {
            let mut groups = self.lock();
            let now = now_ms();
            let mut ops = Vec::new();
            for (name, g) in groups.iter_mut() {
                let before = (g.record.cursor, g.record.offset);
                let max = g.record.spec.max_deliveries;
                let due: Vec<u64> = g
                    .by_deadline
                    .range(..=(now, u64::MAX))
                    .map(|&(_, s)| s)
                    .filter(|s| g.inflight.get(s).is_some_and(|l| l.deliveries >= max))
                    .collect();
                for seq in due {
                    self.dead_letter(g, name, seq, &mut ops, now)?;
                }
                g.settle(before, &mut ops, name);
            }
            (!ops.is_empty())
                .then(|| self.core.write_submit(ops))
                .transpose()?
        };
        if let Some(rx) = rx {
            self.core.wait(rx).await?;
        }
        Ok(())
    }

    /// Dead letters after sequence `after`, oldest first.
    pub(crate) fn dead_letters(
        &self,
        name: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, Error> {
        if !self.lock().contains_key(name) {
            return Err(Error::UnknownGroup(name.to_owned()));
        }
        let tx = self.core.db.begin_read()?;
        let table = tx.open_table(DEAD)?;
        let mut out = Vec::new();
        if after == u64::MAX {
            return Ok(out);
        }
        for item in table
            .range((name, after + 1)..=(name, u64::MAX))?
            .take(limit)
        {
            let (k, v) = item?;
            let seq = k.value().1;
            let Some((h, tail)) = unpack::<DeadHeader>(v.value()) else {
                metrics::inc(&self.core.metrics().corrupt_records);
                continue;
            };
            let json = RecordRef::parse(tail)
                .map(|r| record::event_json(seq, &r))
                .unwrap_or_default();
            out.push(DeadLetter {
                sequence: seq,
                reason: h.reason,
                attempts: h.attempts,
                dead_at_ms: h.dead_at_ms,
                json,
            });
        }
        Ok(out)
    }

    /// Moves a dead letter back into the group: it is delivered again (with a fresh
    /// delivery count) on the next receive.
    pub(crate) async fn replay(&self, name: &str, seq: u64) -> Result<(), Error> {
        let unknown = || Error::UnknownDeadLetter {
            group: name.to_owned(),
            sequence: seq,
        };
        self.mutate(name, |g, ops| {
            if !g.dead.contains(&seq) {
                return Err(unknown());
            }
            let record = {
                let tx = self.core.db.begin_read()?;
                let table = tx.open_table(DEAD)?;
                let v = table.get((name, seq))?.ok_or_else(unknown)?;
                unpack::<DeadHeader>(v.value())
                    .map(|(_, tail)| tail.to_vec())
                    .ok_or_else(|| {
                        Error::Format(format!("dead letter {seq} of group {name:?} is unreadable"))
                    })?
            };
            ops.push(WriteOp::DeleteDead {
                group: name.to_owned(),
                seq,
            });
            g.dead.remove(&seq);
            g.carried.insert(seq, record);
            let lease = Lease {
                consumer: None,
                deadline_ms: now_ms(),
                deliveries: 0,
                replayed: true,
                reason: None,
            };
            g.set_lease(seq, lease, ops, name);
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// Deletes one dead letter.
    pub(crate) async fn delete_dead(&self, name: &str, seq: u64) -> Result<(), Error> {
        self.mutate(name, |g, ops| {
            if !g.dead.remove(&seq) {
                return Err(Error::UnknownDeadLetter {
                    group: name.to_owned(),
                    sequence: seq,
                });
            }
            ops.push(WriteOp::DeleteDead {
                group: name.to_owned(),
                seq,
            });
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// Deletes every dead letter of the group; returns how many there were.
    pub(crate) async fn drain(&self, name: &str) -> Result<u64, Error> {
        let (n, _) = self
            .mutate(name, |g, ops| {
                ops.push(WriteOp::DeleteAllDead {
                    group: name.to_owned(),
                });
                Ok(std::mem::take(&mut g.dead).len() as u64)
            })
            .await?;
        Ok(n)
    }
}

fn delivery(seq: u64, deliveries: u32, record: &[u8]) -> Delivery {
    let mut json = Vec::with_capacity(record.len() + 32);
    if let Some(r) = RecordRef::parse(record) {
        r.write_json_delivery(seq, deliveries, &mut json);
    }
    Delivery {
        sequence: seq,
        json,
    }
}

fn delivery_ref(seq: u64, deliveries: u32, r: &RecordRef<'_>) -> Delivery {
    let mut json = Vec::with_capacity(r.body.len() + 32);
    r.write_json_delivery(seq, deliveries, &mut json);
    Delivery {
        sequence: seq,
        json,
    }
}

/// Runs the lease sweeper until the changefeed closes.
pub(crate) fn spawn_sweeper(core: &Core, groups: &Arc<Groups>) {
    let groups = Arc::downgrade(groups);
    let mut stop = core.stopping();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(SWEEP_EVERY) => {}
            }
            let Some(groups) = groups.upgrade() else {
                return;
            };
            if groups.sweep().await.is_err() {
                // The writer stopped: nothing more can be dead-lettered.
                return;
            }
        }
    });
}
