//! Which rows of a snapshot chunk may be stale: DBLog's check, shared by every consumer
//! that interleaves chunks with the stream.
//!
//! A chunk's row is stale when its row changed in a way the chunk's SELECT may not show:
//! the change committed after the low watermark (DBLog's window), or in a transaction
//! the chunk's snapshot did not see (WAL order is not visibility order: a transaction
//! can be in the WAL before the low watermark and still invisible to a snapshot taken
//! after it). The stream carried that change before the chunk's high watermark, so it
//! was published first; the chunk's row must then be dropped, never published after it.
//!
//! The changefeed asks [`ChunkCheck::misses`] of each row's latest event in its log.
//! A sink has no such index: [`StreamedKeys`] remembers, for the table being read, the
//! keys the stream carried and the transactions that carried them, and forgets what
//! every later snapshot will see anyway — so it holds about one chunk's worth of
//! streamed changes, not the table's history.

use std::collections::HashMap;

use freshen::{Key, Op, RowEvent};

use crate::XidSnapshot;

/// What a chunk's rows are checked against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkCheck {
    /// What the chunk's SELECT saw.
    pub snapshot: XidSnapshot,
    /// The low watermark's WAL position (the end of its record, as
    /// `pg_logical_emit_message` returns it: a transaction whose commit record starts
    /// there or later committed after it).
    pub low: u64,
}

impl ChunkCheck {
    /// Whether a change committed by transaction `xid` at WAL position `commit` may be
    /// missing from the chunk's rows.
    pub fn misses(&self, xid: u64, commit: u64) -> bool {
        commit >= self.low || !self.snapshot.sees(xid)
    }
}

/// The primary key of a row in a chunk or an event (`None` without one).
pub fn row_key(event: &RowEvent) -> Option<Key> {
    if event.pk_names.is_empty() {
        return None;
    }
    event.scope_keys(&event.pk_names).next()
}

/// The keys the stream carried for one table, with the transactions that carried them,
/// while that table is being read in chunks.
#[derive(Debug, Default)]
pub struct StreamedKeys {
    /// Per key, `(xid, commit)` of each change not yet known to be seen by every later
    /// snapshot.
    keys: HashMap<Key, Vec<(u64, u64)>>,
    /// `(xid, commit)` of each TRUNCATE of the table, kept the same way: it changes
    /// every key.
    truncates: Vec<(u64, u64)>,
    /// The newest transactions the stream carried (any table, at most
    /// [`RECENT_XIDS`]).
    recent: std::collections::VecDeque<u64>,
    /// Those of them carried before remembering began that no chunk's snapshot has
    /// seen yet: their keys are unknown, so a chunk that misses one of them cannot be
    /// trusted at all (it is read again). This closes the window in which a transaction
    /// is in the stream already — published — and not yet visible to new snapshots
    /// (a commit waiting for a synchronous standby).
    unknown: Vec<u64>,
}

/// How many of the stream's newest transactions are kept while nothing is remembered.
pub const RECENT_XIDS: usize = 1024;

impl StreamedKeys {
    /// An empty record.
    pub fn new() -> StreamedKeys {
        StreamedKeys::default()
    }

    /// Records a streamed event of the table: every key it touches (both keys of a
    /// primary-key change). An event without a transaction position is taken as
    /// unseen by any snapshot (it drops its rows: safe, the live event is published).
    pub fn record(&mut self, event: &RowEvent) {
        let at = event.tx.map_or((u64::MAX, u64::MAX), |t| (t.id, t.commit));
        if event.op == Op::Truncate {
            self.truncates.push(at);
            return;
        }
        if event.pk_names.is_empty() {
            return;
        }
        for key in event.scope_keys(&event.pk_names) {
            let seen = self.keys.entry(key).or_default();
            if !seen.contains(&at) {
                seen.push(at);
            }
        }
    }

    /// Notes a streamed event's transaction (every event, of any table).
    pub fn note(&mut self, event: &RowEvent) {
        let Some(t) = event.tx else {
            return;
        };
        if self.recent.back() != Some(&t.id) {
            if self.recent.len() == RECENT_XIDS {
                self.recent.pop_front();
            }
            self.recent.push_back(t.id);
        }
    }

    /// Starts remembering a table's keys: the transactions noted before — whose keys
    /// of this table nobody remembered — become the unknown ones a chunk must see.
    pub fn begin(&mut self) {
        self.clear();
        self.unknown = self.recent.drain(..).collect();
    }

    /// Whether `check`'s snapshot sees every transaction carried before remembering
    /// began (else the chunk may be stale for keys nobody remembered).
    pub fn trusts(&self, check: &ChunkCheck) -> bool {
        self.unknown.iter().all(|&x| check.snapshot.sees(x))
    }

    /// Whether the chunk's row under `key` may be stale: a change of that key the
    /// chunk's check [misses](ChunkCheck::misses).
    pub fn stale(&self, key: &Key, check: &ChunkCheck) -> bool {
        let misses = |&(xid, commit): &(u64, u64)| check.misses(xid, commit);
        self.truncates.iter().any(misses)
            || self.keys.get(key).is_some_and(|v| v.iter().any(misses))
    }

    /// Forgets the changes `check`'s snapshot saw: every later chunk's snapshot sees
    /// them too (visibility only grows) and its low watermark is past their commits.
    pub fn forget_seen(&mut self, check: &ChunkCheck) {
        self.keys.retain(|_, v| {
            v.retain(|&(xid, _)| !check.snapshot.sees(xid));
            !v.is_empty()
        });
        self.truncates.retain(|&(xid, _)| !check.snapshot.sees(xid));
        self.unknown.retain(|&xid| !check.snapshot.sees(xid));
    }

    /// How many keys are remembered.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.truncates.is_empty()
    }

    /// Forgets everything (the table's snapshot ended).
    pub fn clear(&mut self) {
        self.keys.clear();
        self.truncates.clear();
        self.unknown.clear();
    }
}

#[cfg(test)]
mod tests {
    use freshen::{Row, Tx, Value};

    use super::*;

    fn ev(op: Op, id: i64, xid: u64, commit: u64) -> RowEvent {
        let row = Row::from_pairs([("id", Value::Int(id)), ("v", Value::text("x"))]);
        let e = RowEvent::new("public", "t", op)
            .with_pk(["id"])
            .with_tx(Tx {
                id: xid,
                commit,
                index: 0,
            });
        match op {
            Op::Delete => e.with_old(row),
            _ => e.with_new(row),
        }
    }

    fn key(id: i64) -> Key {
        Key::new(id.to_string())
    }

    fn check() -> ChunkCheck {
        ChunkCheck {
            snapshot: XidSnapshot {
                xmin: 11,
                xmax: 20,
                xip: vec![12],
            },
            low: 1000,
        }
    }

    /// A transaction published before a table's keys were remembered, still invisible
    /// to a chunk (its commit waits for a synchronous standby): nobody knows its keys,
    /// so the chunk is not trusted until a snapshot sees it.
    #[test]
    fn a_chunk_that_misses_a_transaction_published_before_remembering_is_not_trusted() {
        let mut k = StreamedKeys::new();
        k.note(&ev(Op::Update, 7, 10, 400)); // seen by check()'s snapshot (below xmin)
        k.note(&ev(Op::Update, 8, 12, 450)); // running for it (in xip)
        k.begin();
        assert!(!k.trusts(&check()), "xid 12 is invisible to the chunk");
        k.forget_seen(&check());
        assert!(!k.trusts(&check()));
        // A later snapshot that sees 12 is trusted, and so is every one after it.
        let later = ChunkCheck {
            snapshot: XidSnapshot {
                xmin: 13,
                xmax: 20,
                xip: vec![],
            },
            low: 1100,
        };
        assert!(k.trusts(&later));
        k.forget_seen(&later);
        assert!(k.trusts(&check()), "forgotten once seen");
        // What streams while a table is read is noted too: the next table starts with it.
        k.note(&ev(Op::Update, 9, 25, 1200));
        k.clear();
        k.begin();
        assert!(
            !k.trusts(&later),
            "xid 25 is beyond the later snapshot's xmax"
        );
        // The ring keeps the newest RECENT_XIDS transactions, one entry per transaction.
        let mut r = StreamedKeys::new();
        for x in 0..(RECENT_XIDS as u64 + 10) {
            r.note(&ev(Op::Insert, 1, 100 + x, 1));
            r.note(&ev(Op::Insert, 2, 100 + x, 1));
        }
        r.begin();
        assert_eq!(r.unknown.len(), RECENT_XIDS);
        assert_eq!(r.unknown[0], 110);
    }

    /// One row per case, as the changefeed's writer decides from its log.
    #[test]
    fn a_row_is_stale_when_a_change_of_its_key_was_not_in_the_chunks_view() {
        let mut k = StreamedKeys::new();
        // Seen by the snapshot, before the low watermark: the chunk has it.
        k.record(&ev(Op::Update, 1, 10, 500));
        // Before the low watermark in the WAL, still running for the snapshot.
        k.record(&ev(Op::Update, 2, 12, 600));
        // After the low watermark (DBLog's window); a delete counts by its old key.
        k.record(&ev(Op::Delete, 3, 11, 1000));
        let c = check();
        assert!(!k.stale(&key(1), &c));
        assert!(k.stale(&key(2), &c));
        assert!(k.stale(&key(3), &c));
        assert!(!k.stale(&key(4), &c));
    }

    #[test]
    fn both_keys_of_a_key_change_are_remembered() {
        let mut k = StreamedKeys::new();
        let moved = RowEvent::new("public", "t", Op::Update)
            .with_pk(["id"])
            .with_old(Row::from_pairs([("id", Value::Int(5))]))
            .with_new(Row::from_pairs([
                ("id", Value::Int(6)),
                ("v", Value::text("y")),
            ]))
            .with_tx(Tx {
                id: 15,
                commit: 2000,
                index: 0,
            });
        k.record(&moved);
        assert!(k.stale(&key(5), &check()));
        assert!(k.stale(&key(6), &check()));
    }

    #[test]
    fn what_a_snapshot_saw_is_forgotten_and_the_rest_kept() {
        let mut k = StreamedKeys::new();
        k.record(&ev(Op::Update, 1, 10, 500));
        k.record(&ev(Op::Update, 2, 12, 600));
        k.record(&ev(Op::Update, 2, 10, 500));
        k.forget_seen(&check());
        assert_eq!(k.len(), 1);
        // A later chunk whose snapshot saw xid 12 too: nothing left to drop for.
        let later = ChunkCheck {
            snapshot: XidSnapshot {
                xmin: 30,
                xmax: 30,
                xip: vec![],
            },
            low: 5000,
        };
        assert!(!k.stale(&key(2), &later));
        k.forget_seen(&later);
        assert!(k.is_empty());
    }

    #[test]
    fn a_truncate_the_chunk_did_not_see_drops_every_row() {
        let mut k = StreamedKeys::new();
        k.record(&RowEvent::new("public", "t", Op::Truncate).with_tx(Tx {
            id: 16,
            commit: 3000,
            index: 0,
        }));
        assert!(k.stale(&key(1), &check()));
        assert!(k.stale(&key(77), &check()));
    }

    #[test]
    fn an_event_without_a_position_drops_its_row() {
        let mut k = StreamedKeys::new();
        let mut e = ev(Op::Insert, 9, 0, 0);
        e.tx = None;
        k.record(&e);
        assert!(k.stale(&key(9), &check()));
    }
}
