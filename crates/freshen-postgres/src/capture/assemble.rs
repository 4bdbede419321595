//! Turns the replication stream into batches of row events: pure, no I/O.
//!
//! Rows are handed over as they arrive, never a whole transaction: a batch closes when
//! it is full (before the event that would overflow it) or when the stream goes quiet.
//! A batch that holds a commit carries that commit's `end_lsn` for its acknowledgement;
//! the others carry none.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use freshen::{BoxError, Op, RowEvent, SchemaChange, StreamMark, Tx};

use crate::capture::drift::Shapes;
use crate::capture::pgoutput::{self, Message, OldImage};
use crate::capture::rows::{Relations, Table};
use crate::capture::xid::{XidClock, pg_time};

/// A closed batch, ready to hand over.
#[derive(Debug)]
pub(crate) struct Output {
    pub(crate) events: Vec<RowEvent>,
    pub(crate) skipped: Vec<BoxError>,
    /// Logical decoding messages among the events, in stream order.
    pub(crate) marks: Vec<StreamMark>,
    /// Watched tables whose Relation message differs from what was last reported.
    pub(crate) schema_changes: Vec<SchemaChange>,
    /// The `end_lsn` of the last commit in the batch: acknowledging the batch confirms
    /// this position.
    pub(crate) commit_end: Option<u64>,
    /// Commit time of the first transaction this batch completes (with `commit_end`).
    pub(crate) first_commit: Option<SystemTime>,
    /// The commit LSN of the last transaction whose commit was read: every transaction
    /// up to it is wholly in this batch or an earlier one.
    pub(crate) committed_through: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
struct OpenTx {
    id: u64,
    final_lsn: u64,
    commit_ts: SystemTime,
    index: u32,
}

/// What a commit meant for the batch under construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Committed {
    /// The batch holds events; it now carries this commit's position.
    InBatch,
    /// Nothing of this transaction (nor of any earlier unsent one) is waiting: its
    /// position may be confirmed as soon as nothing else is pending.
    Empty(u64),
}

#[derive(Debug)]
pub(crate) struct Assembler {
    relations: Relations,
    xids: XidClock,
    batch_size: usize,
    tx: Option<OpenTx>,
    events: Vec<RowEvent>,
    skipped: Vec<BoxError>,
    marks: Vec<StreamMark>,
    /// First shapes of the watched tables: kept across reconnects, so a resent
    /// relation is not a change.
    shapes: Shapes,
    schema_changes: Vec<SchemaChange>,
    /// Tables discovered since the last [`Assembler::take_discovered`].
    discovered: Vec<crate::TableName>,
    commit_end: Option<u64>,
    first_commit: Option<SystemTime>,
    /// When the batch under construction got its first item, by the reader's clock
    /// ([`Assembler::stamp`]). It belongs to that batch: closing or dropping the batch
    /// forgets it, so an age is never read off a batch that is gone.
    opened: Option<Instant>,
    /// The commit LSN of the last transaction whose commit was read.
    committed_through: Option<u64>,
    /// A batch was handed over while the open transaction had rows in it: its commit,
    /// should nothing else follow, still has to be told (see [`Assembler::tx_end`]).
    handed_open: bool,
}

/// The most bytes of a logical decoding message's content handed over: markers are
/// small, and a huge message written by someone else must not grow a batch unboundedly.
pub(crate) const MAX_MARK_BYTES: usize = 64 * 1024;

impl Assembler {
    pub(crate) fn new(relations: Relations, xids: XidClock, batch_size: usize) -> Assembler {
        Assembler {
            relations,
            xids,
            batch_size: batch_size.max(1),
            tx: None,
            events: Vec::with_capacity(batch_size.clamp(1, 4096)),
            skipped: Vec::new(),
            marks: Vec::new(),
            shapes: Shapes::default(),
            schema_changes: Vec::new(),
            discovered: Vec::new(),
            commit_end: None,
            first_commit: None,
            opened: None,
            committed_through: None,
            handed_open: false,
        }
    }

    /// Records how a watched table looks now (from the catalog at start): the first
    /// Relation message for it is compared with this.
    pub(crate) fn known_shape(
        &mut self,
        oid: u32,
        table: &crate::TableName,
        columns: Vec<(String, u32)>,
    ) {
        self.shapes.seed(oid, &table.schema, &table.name, columns);
    }

    /// A new session begins (after a reconnect): what was not handed over is replayed
    /// by the server, so it is dropped here, relations are resent, and the epoch is
    /// learnt again.
    pub(crate) fn reset(&mut self, xids: XidClock) {
        self.relations.clear();
        self.xids = xids;
        self.tx = None;
        self.events.clear();
        self.skipped.clear();
        self.marks.clear();
        self.schema_changes.clear();
        self.commit_end = None;
        self.first_commit = None;
        self.opened = None;
        self.handed_open = false;
    }

    /// Whether a transaction is open (its rows may be partly handed over).
    pub(crate) fn in_transaction(&self) -> bool {
        self.tx.is_some()
    }

    /// Whether anything is waiting in the batch under construction.
    pub(crate) fn has_output(&self) -> bool {
        !self.events.is_empty()
            || !self.skipped.is_empty()
            || !self.marks.is_empty()
            || !self.schema_changes.is_empty()
    }

    /// Notes the time a batch under construction was first seen holding something
    /// (`now` is read only then): the start of its [`age`](Assembler::age).
    pub(crate) fn stamp(&mut self, now: impl FnOnce() -> Instant) {
        if self.opened.is_none() && self.has_output() {
            self.opened = Some(now());
        }
    }

    /// How long the batch under construction has been gathering, if it holds anything
    /// and was stamped.
    pub(crate) fn age(&self, now: Instant) -> Option<Duration> {
        self.opened
            .filter(|_| self.has_output())
            .map(|t| now.saturating_duration_since(t))
    }

    /// Closes the batch under construction, if it holds anything.
    pub(crate) fn take(&mut self) -> Option<Output> {
        self.opened = None;
        if !self.has_output() {
            return None;
        }
        let events = std::mem::replace(
            &mut self.events,
            Vec::with_capacity(self.batch_size.clamp(1, 4096)),
        );
        self.handed_open = self.tx.is_some_and(|t| t.index > 0);
        Some(Output {
            events,
            skipped: std::mem::take(&mut self.skipped),
            marks: std::mem::take(&mut self.marks),
            schema_changes: std::mem::take(&mut self.schema_changes),
            commit_end: self.commit_end.take(),
            first_commit: self.first_commit.take(),
            committed_through: self.committed_through,
        })
    }

    /// After a commit that left nothing to hand over ([`Committed::Empty`]): a batch
    /// without rows that only says the transaction ended, when rows of it were handed
    /// over before its commit was read (a batch closed mid-transaction). Otherwise the
    /// changefeed would learn of the end only with the next transaction.
    pub(crate) fn tx_end(&mut self) -> Option<Output> {
        if !std::mem::take(&mut self.handed_open) {
            return None;
        }
        Some(Output {
            events: Vec::new(),
            skipped: Vec::new(),
            marks: Vec::new(),
            schema_changes: Vec::new(),
            commit_end: None,
            first_commit: None,
            committed_through: self.committed_through,
        })
    }

    pub(crate) fn begin(&mut self, final_lsn: u64, xid: u32, commit_ts_micros: i64) {
        self.tx = Some(OpenTx {
            id: self.xids.extend(xid),
            final_lsn,
            commit_ts: pg_time(commit_ts_micros),
            index: 0,
        });
    }

    pub(crate) fn commit(&mut self, end_lsn: u64) -> Committed {
        let tx = self.tx.take();
        if let Some(t) = tx {
            self.committed_through = Some(t.final_lsn);
        }
        if self.has_output() {
            // This batch carries the end; no separate one is needed.
            self.handed_open = false;
            self.commit_end = Some(end_lsn);
            if self.first_commit.is_none() {
                self.first_commit = tx.map(|t| t.commit_ts);
            }
            Committed::InBatch
        } else {
            Committed::Empty(end_lsn)
        }
    }

    /// A logical decoding message (`pg_logical_emit_message`), kept in stream order
    /// among the events. Its content is cut at [`MAX_MARK_BYTES`].
    pub(crate) fn mark(&mut self, prefix: &str, content: &[u8], lsn: u64) {
        self.marks.push(StreamMark {
            at: self.events.len(),
            prefix: prefix.into(),
            content: content[..content.len().min(MAX_MARK_BYTES)].into(),
            position: lsn,
        });
    }

    /// A table first seen in the stream that is watched through its schema only: it was
    /// created after the start, and is captured from now on. Logged once; a table whose
    /// UPDATE and DELETE cannot replicate is an error the application meets first.
    fn discover(&mut self, r: &crate::capture::pgoutput::Relation) {
        let table = crate::TableName::new(&r.namespace, &r.name);
        if self.shapes.knows(r.oid) || !self.relations.by_pattern(&table) {
            return;
        }
        let keyless = match r.replica_identity {
            b'f' => false,
            b'n' => true,
            _ => !r.columns.iter().any(|c| c.key),
        };
        if keyless {
            tracing::error!(
                table = %table,
                "freshen-postgres: discovered a table (by a [source] tables pattern) whose UPDATE and DELETE cannot replicate (no primary key, or REPLICA IDENTITY NOTHING): the application's UPDATE and DELETE on it fail while it is published; add a primary key or run ALTER TABLE {} REPLICA IDENTITY FULL",
                table.quoted()
            );
        } else {
            tracing::info!(table = %table, "freshen-postgres: discovered a table (by a [source] tables pattern); its changes are captured from now on");
        }
        self.discovered.push(table);
    }

    /// The tables discovered since the last call.
    pub(crate) fn take_discovered(&mut self) -> Vec<crate::TableName> {
        std::mem::take(&mut self.discovered)
    }

    /// Decodes one change message. Returns a full batch to hand over first when the
    /// next event would overflow the one under construction.
    pub(crate) fn change(&mut self, data: &[u8]) -> Vec<Output> {
        let mut out = Vec::new();
        let msg = match pgoutput::decode(data) {
            Ok(m) => m,
            Err(e) => {
                self.skip(e.into(), &mut out);
                return out;
            }
        };
        match msg {
            Message::Relation(r) => {
                self.discover(&r);
                let relations = &self.relations;
                if let Some(change) = self.shapes.observe(&r, |schema, name| {
                    relations.is_watched(&crate::TableName::new(schema, name))
                }) {
                    tracing::warn!(
                        table = %format_args!("{}.{}", change.schema, change.table),
                        change = %change,
                        "freshen-postgres: schema change on a watched table (seen with the first change to it since)"
                    );
                    self.schema_changes.push(change);
                }
                self.relations.upsert(r);
            }
            Message::Insert { relation, new } => {
                let ev =
                    self.with_table(
                        relation,
                        |t| Ok(event(t, Op::Insert).with_new(t.row(&new)?)),
                    );
                self.emit(ev, &mut out);
            }
            Message::Update { relation, old, new } => {
                let ev = self.with_table(relation, |t| {
                    let mut new_row = t.row(&new)?;
                    let old_row = match &old {
                        None => None,
                        Some(OldImage::Key(k)) => Some(t.key_row(k)?),
                        Some(OldImage::Full(o)) => Some(t.row(o)?),
                    };
                    // Unchanged TOAST values: known from a full former image.
                    if let Some(OldImage::Full(_)) = &old
                        && let Some(o) = &old_row
                    {
                        for (v, ov) in new_row.values_mut().iter_mut().zip(o.values()) {
                            if v.is_unchanged() && !ov.is_unchanged() {
                                *v = ov.clone();
                            }
                        }
                    }
                    let mut e = event(t, Op::Update).with_new(new_row);
                    e.old = old_row;
                    Ok(e)
                });
                self.emit(ev, &mut out);
            }
            Message::Delete { relation, old } => {
                let ev = self.with_table(relation, |t| {
                    let row = match &old {
                        OldImage::Key(k) => t.key_row(k)?,
                        OldImage::Full(o) => t.row(o)?,
                    };
                    Ok(event(t, Op::Delete).with_old(row))
                });
                self.emit(ev, &mut out);
            }
            Message::Truncate { relations, .. } => {
                for oid in relations {
                    let ev = self.with_table(oid, |t| Ok(event(t, Op::Truncate)));
                    self.emit(ev, &mut out);
                }
            }
            // The replication client hands logical messages over parsed, outside stream
            // blocks; one held in a streamed transaction comes back here at its replay.
            Message::Logical {
                prefix,
                content,
                lsn,
                ..
            } => self.mark(prefix, content, lsn),
            // Handled by the replication client, or carry nothing a scope can use.
            Message::Begin { .. }
            | Message::Commit { .. }
            | Message::Origin { .. }
            | Message::Type { .. } => {}
        }
        out
    }

    /// `Ok(None)`: the table is not watched.
    fn with_table(
        &self,
        oid: u32,
        f: impl FnOnce(&Table) -> Result<RowEvent, String>,
    ) -> Result<Option<RowEvent>, BoxError> {
        let t = self.relations.get(oid).ok_or_else(|| {
            format!("change for relation {oid}, which the server never described")
        })?;
        if !t.watched {
            return Ok(None);
        }
        f(t).map(Some).map_err(Into::into)
    }

    fn emit(&mut self, ev: Result<Option<RowEvent>, BoxError>, out: &mut Vec<Output>) {
        match ev {
            Ok(Some(mut e)) => {
                if self.events.len() >= self.batch_size {
                    out.extend(self.take());
                }
                if let Some(tx) = &mut self.tx {
                    e.commit_ts = Some(tx.commit_ts);
                    e.tx = Some(Tx {
                        id: tx.id,
                        commit: tx.final_lsn,
                        index: tx.index,
                    });
                    tx.index = tx.index.saturating_add(1);
                }
                self.events.push(e);
            }
            Ok(None) => {}
            Err(error) => self.skip(error, out),
        }
    }

    fn skip(&mut self, error: BoxError, out: &mut Vec<Output>) {
        if self.skipped.len() >= self.batch_size {
            out.extend(self.take());
        }
        self.skipped.push(error);
    }
}

fn event(t: &Table, op: Op) -> RowEvent {
    let mut e = RowEvent::new(Arc::clone(&t.schema), Arc::clone(&t.name), op);
    e.pk_names = t.pk_names.clone();
    e
}

/// Whether a row image leaves a value out because it did not change (for tests).
#[cfg(test)]
fn has_unchanged(v: &[freshen::Value]) -> bool {
    v.iter().any(freshen::Value::is_unchanged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::pgoutput::fixtures::*;
    use freshen::{Key, Value};

    fn asm(batch: usize) -> Assembler {
        let mut a = Assembler::new(Relations::new(None), XidClock::new((3 << 32) + 100), batch);
        assert!(
            a.change(&relation(
                1,
                "public",
                "t",
                b'd',
                &[(true, "id", 23), (false, "dev", 25), (false, "doc", 25)]
            ))
            .is_empty()
        );
        a
    }

    #[test]
    fn marks_keep_their_place_among_the_rows_and_hold_the_commit() {
        let mut a = asm(10);
        a.begin(500, 90, 0);
        a.change(&insert(1, &[Some(Some("1")), Some(Some("a")), None]));
        a.mark("freshen.watermark", b"w1", 505);
        a.change(&insert(1, &[Some(Some("2")), Some(Some("b")), None]));
        assert_eq!(a.commit(520), Committed::InBatch);
        let out = a.take().unwrap();
        assert_eq!(out.commit_end, Some(520));
        assert_eq!(out.marks.len(), 1);
        let m = &out.marks[0];
        assert_eq!(
            (m.at, &*m.prefix, &*m.content, m.position),
            (1, "freshen.watermark", &b"w1"[..], 505)
        );
        // A transaction holding only a mark is not empty: its batch carries the commit.
        a.begin(600, 91, 0);
        a.mark("freshen.watermark", &vec![b'x'; MAX_MARK_BYTES + 10], 605);
        assert_eq!(a.commit(620), Committed::InBatch);
        let out = a.take().unwrap();
        assert!(out.events.is_empty());
        assert_eq!(
            out.marks[0].content.len(),
            MAX_MARK_BYTES,
            "cut, not unbounded"
        );
    }

    #[test]
    fn events_carry_transaction_metadata() {
        let mut a = asm(10);
        a.begin(500, 90, 0);
        a.change(&insert(1, &[Some(Some("1")), Some(Some("a")), None]));
        a.change(&insert(1, &[Some(Some("2")), Some(Some("b")), None]));
        assert_eq!(a.commit(520), Committed::InBatch);
        let out = a.take().unwrap();
        assert_eq!(out.commit_end, Some(520));
        let tx: Vec<Tx> = out.events.iter().map(|e| e.tx.unwrap()).collect();
        assert_eq!(
            tx[0],
            Tx {
                id: (3 << 32) + 90,
                commit: 500,
                index: 0
            }
        );
        assert_eq!(tx[1].index, 1);
        assert_eq!(&*out.events[0].schema, "public");
        assert_eq!(&*out.events[0].pk_names, &[Box::from("id")]);
        assert!(out.events[0].commit_ts.is_some());
        assert!(a.take().is_none());
    }

    #[test]
    fn a_big_transaction_is_many_batches_and_only_the_last_holds_the_commit() {
        let mut a = asm(3);
        a.begin(1000, 7, 0);
        let mut batches = Vec::new();
        for i in 0..10 {
            batches.extend(a.change(&insert(1, &[Some(Some(&i.to_string())), None, None])));
        }
        assert_eq!(a.commit(1100), Committed::InBatch);
        batches.extend(a.take());
        assert_eq!(
            batches.iter().map(|b| b.events.len()).collect::<Vec<_>>(),
            [3, 3, 3, 1]
        );
        assert!(batches[..3].iter().all(|b| b.commit_end.is_none()));
        assert_eq!(batches[3].commit_end, Some(1100));
        // Only the batch after the commit says the transaction (commit LSN 1000) ended.
        assert!(batches[..3].iter().all(|b| b.committed_through.is_none()));
        assert_eq!(batches[3].committed_through, Some(1000));
        assert!(a.tx_end().is_none(), "the last batch said it already");
    }

    #[test]
    fn a_commit_after_a_batch_closed_mid_transaction_is_told_on_its_own() {
        let mut a = asm(10);
        a.begin(2000, 8, 0);
        a.change(&insert(1, &[Some(Some("1")), None, None]));
        // The stream went quiet mid-transaction: the batch is handed over open.
        let open = a.take().unwrap();
        assert_eq!(open.committed_through, None);
        assert_eq!(a.commit(2100), Committed::Empty(2100));
        let end = a.tx_end().expect("an end-only batch");
        assert!(end.events.is_empty() && end.commit_end.is_none());
        assert_eq!(end.committed_through, Some(2000));
        assert!(a.tx_end().is_none(), "told once");
        // A transaction with no watched rows needs no such batch.
        a.begin(2200, 9, 0);
        assert_eq!(a.commit(2300), Committed::Empty(2300));
        assert!(a.tx_end().is_none());
    }

    #[test]
    fn empty_and_filtered_transactions_are_reported_as_empty() {
        let mut w = std::collections::HashSet::new();
        w.insert(crate::TableName::new("public", "watched"));
        let mut a = Assembler::new(Relations::new(Some(w)), XidClock::new(100), 10);
        a.change(&relation(2, "public", "other", b'd', &[(true, "id", 23)]));
        a.begin(10, 1, 0);
        a.change(&insert(2, &[Some(Some("1"))]));
        assert!(!a.has_output(), "unwatched tables are dropped");
        assert!(a.in_transaction());
        assert_eq!(a.commit(20), Committed::Empty(20));
        assert!(!a.in_transaction());
    }

    #[test]
    fn update_images_and_toast() {
        let mut a = Assembler::new(Relations::new(None), XidClock::new(100), 10);
        a.change(&relation(
            1,
            "public",
            "t",
            b'f',
            &[(true, "id", 23), (false, "dev", 25), (false, "doc", 25)],
        ));
        a.begin(10, 1, 0);
        // FULL identity: the old image fills the unchanged TOAST value.
        a.change(&update(
            1,
            Some((b'O', &[Some(Some("1")), Some(Some("a")), Some(Some("big"))])),
            &[Some(Some("1")), Some(Some("b")), Some(None)],
        ));
        // Without an old image, unchanged stays unchanged (not NULL).
        a.change(&update(
            1,
            None,
            &[Some(Some("1")), Some(Some("c")), Some(None)],
        ));
        // Key-only old image: only the key column.
        a.change(&update(
            1,
            Some((b'K', &[Some(Some("1")), None, None])),
            &[Some(Some("2")), Some(Some("c")), None],
        ));
        a.commit(20);
        let out = a.take().unwrap();
        let full = &out.events[0];
        assert_eq!(
            full.new.as_ref().unwrap().get("doc"),
            Some(&Value::text("big"))
        );
        assert_eq!(
            full.scope_keys(&["dev"]).collect::<Vec<_>>(),
            [Key::from("b"), Key::from("a")]
        );
        let plain = &out.events[1];
        assert!(plain.old.is_none());
        assert_eq!(
            plain.new.as_ref().unwrap().get("doc"),
            Some(&Value::Unchanged)
        );
        assert!(has_unchanged(plain.new.as_ref().unwrap().values()));
        let keyed = &out.events[2];
        assert_eq!(keyed.old.as_ref().unwrap().len(), 1);
        assert_eq!(keyed.new.as_ref().unwrap().get("doc"), Some(&Value::Null));
        assert_eq!(
            keyed.scope_keys(&["id"]).collect::<Vec<_>>(),
            [Key::from("2"), Key::from("1")]
        );
    }

    #[test]
    fn truncate_is_one_event_per_table_and_garbage_is_skipped() {
        let mut a = asm(10);
        a.change(&relation(2, "s", "u", b'd', &[(true, "id", 23)]));
        a.begin(10, 1, 0);
        a.change(&truncate(0, &[1, 2]));
        a.change(b"\xff\x00");
        a.change(&insert(99, &[None]));
        a.change(&insert(1, &[None]));
        a.commit(20);
        let out = a.take().unwrap();
        let ops: Vec<(String, Op)> = out
            .events
            .iter()
            .map(|e| (e.table.to_string(), e.op))
            .collect();
        assert_eq!(
            ops,
            [
                ("t".to_string(), Op::Truncate),
                ("u".to_string(), Op::Truncate)
            ]
        );
        assert_eq!(
            out.skipped.len(),
            3,
            "undecodable, unknown relation, wrong width"
        );
        assert!(out.skipped[1].to_string().contains("never described"));
    }

    #[test]
    fn a_changed_relation_travels_with_the_rows_after_it() {
        let mut a = asm(10);
        a.begin(10, 1, 0);
        a.change(&insert(1, &[Some(Some("1")), Some(Some("a")), None]));
        a.commit(20);
        assert!(a.take().unwrap().schema_changes.is_empty(), "first sight");
        // `dev` dropped, `unit` added: seen with the next change to the table.
        a.begin(30, 2, 0);
        a.change(&relation(
            1,
            "public",
            "t",
            b'd',
            &[(true, "id", 23), (false, "doc", 25), (false, "unit", 25)],
        ));
        a.change(&insert(1, &[Some(Some("2")), None, Some(Some("kg"))]));
        a.commit(40);
        let out = a.take().unwrap();
        assert_eq!(out.schema_changes.len(), 1);
        assert_eq!(
            out.schema_changes[0].to_string(),
            "public.t: column dev dropped, column unit added"
        );
        // The added column passes through: the row carries it.
        let new = out.events[0].new.as_ref().unwrap();
        assert_eq!(new.get("unit"), Some(&Value::text("kg")));
        assert_eq!(new.get("dev"), None);
        // A reconnect resends the relation: not a change.
        a.reset(XidClock::new(100));
        a.change(&relation(
            1,
            "public",
            "t",
            b'd',
            &[(true, "id", 23), (false, "doc", 25), (false, "unit", 25)],
        ));
        assert!(!a.has_output());
    }

    /// The age of a batch is the batch's own: a closed or dropped batch has none, and the
    /// next one starts from its own first item. (The reader once kept this beside the
    /// assembler, and a reconnect that dropped the batch left an age with nothing to
    /// hand over: the stream loop then spun without ever reading again.)
    #[test]
    fn the_age_of_a_batch_goes_with_it() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(7);
        let mut a = asm(10);
        a.stamp(|| unreachable!("nothing to stamp: the clock is not read"));
        assert_eq!(a.age(later), None);
        a.begin(10, 1, 0);
        a.change(&insert(1, &[Some(Some("1")), None, None]));
        a.stamp(|| t0);
        a.stamp(|| unreachable!("stamped once per batch"));
        assert_eq!(a.age(later), Some(Duration::from_millis(7)));
        assert!(a.take().is_some());
        assert_eq!(a.age(later), None, "a closed batch has no age");

        a.change(&insert(1, &[Some(Some("2")), None, None]));
        a.stamp(|| t0);
        a.reset(XidClock::new(100));
        assert_eq!(a.age(later), None, "a dropped batch has no age");
        a.change(&relation(
            1,
            "public",
            "t",
            b'd',
            &[(true, "id", 23), (false, "dev", 25), (false, "doc", 25)],
        ));
        a.begin(20, 2, 0);
        a.change(&insert(1, &[Some(Some("3")), None, None]));
        assert_eq!(a.age(later), None, "the next batch is not stamped yet");
        a.stamp(|| later);
        assert_eq!(a.age(later), Some(Duration::ZERO));
    }

    #[test]
    fn reset_forgets_unsent_work() {
        let mut a = asm(10);
        a.begin(10, 1, 0);
        a.change(&insert(1, &[Some(Some("1")), None, None]));
        a.reset(XidClock::new(100));
        assert!(!a.in_transaction() && !a.has_output());
        assert_eq!(a.change(&insert(1, &[None, None, None])).len(), 0);
        assert_eq!(
            a.take().unwrap().skipped.len(),
            1,
            "relations are forgotten too"
        );
    }
}
