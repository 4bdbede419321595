//! Turns binlog events into what the reader hands over: no I/O (it counts into the
//! shared health counters and tells schema changes to their subscribers).
//!
//! It keeps the tables by id (from TABLE_MAP events; a watched table's rows are decoded
//! straight into the batch being gathered), the transaction being read (GTID, BEGIN,
//! rows, XID or COMMIT, or a statement of its own), TRUNCATE and DDL on watched tables,
//! and after each transaction the position to resume from (a [`Mark`]). A transaction
//! whose rows were gathered leaves its mark as the gathered batch's commit; one that
//! delivered nothing only moves the resume point.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, UNIX_EPOCH};

use freshen::{BoxError, Op, RowEvent, Tx};
use tokio::sync::broadcast;

use super::shared::{Mark, Shared, lock};
use crate::binlog::{
    self, Charsets, DdlKind, MariaGtid, MySqlGtid, QueryEvent, Statement, TableMap, event_type,
};
use crate::config::TablePattern;
use crate::error::ErrorKind;
use crate::schema::{Broken, SchemaChange};
use crate::{Checkpoint, FilePos, Gtids, MySqlError};

/// An event's header, as far as the assembler reads it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Head {
    /// The event type.
    pub(super) kind: u8,
    /// Server time of the event, in seconds.
    pub(super) timestamp: u32,
    /// The position after the event in its file (0 for artificial events).
    pub(super) end: u64,
    /// The event's size, header included.
    pub(super) size: u64,
    /// The server that wrote it.
    pub(super) server_id: u32,
}

/// What one event asks of the reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Nothing beyond reading on.
    Continue,
    /// Hand the gathered batch over now: the commit of a transaction whose earlier rows
    /// already went out in full batches.
    Flush,
    /// A transaction that delivered nothing ended: the safe position may move.
    Advance,
}

/// A table id's map, as far as this reader cares.
struct TableEntry {
    raw: Vec<u8>,
    /// `None`: not watched.
    map: Option<Arc<TableMap>>,
    /// The position table.
    is_self: bool,
}

/// The transaction being read.
#[derive(Debug, Default)]
struct Open {
    active: bool,
    /// Opened by BEGIN (a SAVEPOINT inside it is no boundary).
    in_begin: bool,
    index: u32,
    /// Wrote the position table.
    own: bool,
    /// Wrote anything else.
    other: bool,
    /// Gathered a row event.
    delivered: bool,
    pending_maria: Option<MariaGtid>,
    pending_mysql: Option<MySqlGtid>,
}

/// What is gathered for the next batch.
#[derive(Debug, Default)]
pub(super) struct Output {
    pub(super) events: Vec<RowEvent>,
    pub(super) skipped: Vec<BoxError>,
    /// What DDL did to watched tables, for the refresher (see [`Broken`]).
    pub(super) changes: Vec<freshen::SchemaChange>,
    /// The newest commit among the gathered: the batch's acknowledgement confirms it.
    pub(super) commit: Option<Arc<Mark>>,
}

impl Output {
    fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.skipped.is_empty()
            && self.changes.is_empty()
            && self.commit.is_none()
    }
}

/// Binlog events in, batches' contents and resume points out.
pub(super) struct Assembler {
    patterns: Vec<TablePattern>,
    /// `(database, table)` of the position table.
    self_table: Option<(String, String)>,
    shared: Arc<Shared>,
    schema_tx: broadcast::Sender<SchemaChange>,
    charsets: Charsets,
    /// Whether the server checksums events with CRC32.
    crc32: bool,
    // Position.
    resume: Arc<Mark>,
    serial: u64,
    foreign: u64,
    file: String,
    gtids: Option<Gtids>,
    // Session.
    tables: HashMap<u64, TableEntry>,
    fde_seen: bool,
    // Transaction.
    open: Open,
    /// The transaction's id: its start position as a token.
    tx_token: u64,
    broken: Broken,
    // Output.
    out: Output,
}

impl Assembler {
    /// Starts at `start`: resuming by GTID keeps its GTID set up to date.
    pub(super) fn new(
        start: Checkpoint,
        by_gtid: bool,
        patterns: Vec<TablePattern>,
        self_table: Option<(String, String)>,
        shared: Arc<Shared>,
        schema_tx: broadcast::Sender<SchemaChange>,
    ) -> Assembler {
        let file = start.file_pos.file.clone();
        let gtids = if by_gtid { start.gtids.clone() } else { None };
        Assembler {
            patterns,
            self_table,
            shared,
            schema_tx,
            charsets: Charsets::builtin(),
            crc32: false,
            resume: Arc::new(Mark {
                cp: start,
                serial: 0,
                foreign: 0,
            }),
            serial: 0,
            foreign: 0,
            file,
            gtids,
            tables: HashMap::new(),
            fde_seen: false,
            open: Open::default(),
            tx_token: 0,
            broken: Broken::default(),
            out: Output::default(),
        }
    }

    /// The position after the last transaction seen.
    pub(super) fn resume(&self) -> &Arc<Mark> {
        &self.resume
    }

    /// A transaction is open or output is gathered: the safe position must wait.
    pub(super) fn busy(&self) -> bool {
        self.open.active || self.has_output()
    }

    pub(super) fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Rows gathered so far.
    pub(super) fn gathered(&self) -> usize {
        self.out.events.len()
    }

    /// The gathered output, leaving room for `capacity` events of the next batch.
    pub(super) fn take_output(&mut self, capacity: usize) -> Output {
        let events = std::mem::replace(&mut self.out.events, Vec::with_capacity(capacity));
        Output {
            events,
            skipped: std::mem::take(&mut self.out.skipped),
            changes: std::mem::take(&mut self.out.changes),
            commit: self.out.commit.take(),
        }
    }

    /// A new session from the resume point, on a server with these character sets and
    /// checksums: table ids and the open transaction are forgotten.
    pub(super) fn start_session(&mut self, charsets: Charsets, crc32: bool) {
        self.charsets = charsets;
        self.crc32 = crc32;
        self.tables.clear();
        self.fde_seen = false;
        self.end_tx();
        self.file = self.resume.cp.file_pos.file.clone();
    }

    fn end_tx(&mut self) {
        self.open = Open::default();
    }

    fn watched(&self, db: &str, table: &str) -> bool {
        if self.is_self(db, table) {
            return false;
        }
        if self.patterns.is_empty() {
            return !matches!(
                db,
                "mysql" | "sys" | "performance_schema" | "information_schema"
            );
        }
        self.patterns.iter().any(|p| p.matches(db, table))
    }

    fn is_self(&self, db: &str, table: &str) -> bool {
        self.self_table
            .as_ref()
            .is_some_and(|(d, t)| d == db && t == table)
    }

    fn begin_tx(&mut self, start: u64) {
        if !self.open.active {
            self.open.active = true;
            self.tx_token = crate::FilePos::new(self.file.clone(), start)
                .token()
                .unwrap_or(start);
        }
    }

    fn skip(&mut self, what: String) {
        self.shared.skipped.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %what, "freshen-mysql: skipped a binlog event");
        self.out.skipped.push(what.into());
    }

    /// Handles one event (`data`: its body, without the checksum).
    pub(super) fn handle(&mut self, h: Head, data: &[u8]) -> Result<Step, MySqlError> {
        let t = h.kind;
        let end = h.end;
        let start = end.saturating_sub(h.size);
        if end > 0 {
            *lock(&self.shared.received) = Some(FilePos::new(self.file.clone(), end));
        }
        if t != event_type::HEARTBEAT && t != event_type::HEARTBEAT_V2 && h.timestamp > 0 {
            self.shared
                .last_event_ts
                .store(u64::from(h.timestamp), Ordering::Relaxed);
            self.shared.caught_up.store(false, Ordering::Relaxed);
        }
        if let Some(why) = binlog::refused(t) {
            return Err(MySqlError::new(ErrorKind::Refused, why));
        }
        if let Some((kind, v2)) = binlog::rows_kind(t) {
            self.rows(kind, v2, data, h.timestamp);
            return Ok(Step::Continue);
        }
        match t {
            event_type::ROTATE => {
                // The first rotate of a session comes before the format description, so
                // the client has not yet stripped its checksum from the name.
                let body = if !self.fde_seen && self.crc32 {
                    &data[..data.len().saturating_sub(4)]
                } else {
                    data
                };
                match binlog::decode_rotate(body) {
                    Ok((_, name)) => self.file = name,
                    Err(e) => return Err(MySqlError::new(ErrorKind::Decode, e.to_string())),
                }
            }
            event_type::FORMAT_DESCRIPTION => {
                self.fde_seen = true;
                // A new file: table ids restart.
                self.tables.clear();
            }
            event_type::MARIADB_GTID => match MariaGtid::decode(data, h.server_id) {
                Ok(g) => {
                    self.begin_tx(start);
                    self.open.pending_maria = Some(g);
                }
                Err(e) => return Err(MySqlError::new(ErrorKind::Decode, e.to_string())),
            },
            event_type::MYSQL_GTID => match MySqlGtid::decode(data) {
                Ok(g) => {
                    self.begin_tx(start);
                    self.open.pending_mysql = Some(g);
                }
                Err(e) => return Err(MySqlError::new(ErrorKind::Decode, e.to_string())),
            },
            event_type::MYSQL_ANONYMOUS_GTID => self.begin_tx(start),
            event_type::TABLE_MAP => self.table_map(data),
            event_type::XID => return Ok(self.commit(end)),
            event_type::QUERY => return self.query(data, start, end, h.timestamp),
            event_type::HEARTBEAT | event_type::HEARTBEAT_V2 => {
                *lock(&self.shared.server_end) = Some(FilePos::new(self.file.clone(), end));
                if !self.open.active && !self.has_output() {
                    self.shared.caught_up.store(true, Ordering::Relaxed);
                }
            }
            _ => {}
        }
        Ok(Step::Continue)
    }

    fn table_map(&mut self, data: &[u8]) {
        let id = match binlog::rows_table_id(data) {
            Ok(id) => id,
            Err(e) => return self.skip(format!("table map: {e}")),
        };
        if let Some(entry) = self.tables.get(&id)
            && entry.raw == data
        {
            return;
        }
        match TableMap::decode(data, &self.charsets) {
            Ok(map) => {
                let is_self = self.is_self(&map.schema, &map.table);
                let watched = self.watched(&map.schema, &map.table);
                if watched && !map.has_names {
                    self.skip(format!(
                        "table map of {}.{} has no column names: set binlog_row_metadata=FULL",
                        map.schema, map.table
                    ));
                }
                self.tables.insert(
                    id,
                    TableEntry {
                        raw: data.to_vec(),
                        map: watched.then(|| Arc::new(map)),
                        is_self,
                    },
                );
            }
            Err(e) => {
                self.tables.remove(&id);
                self.skip(format!("table map: {e}"));
            }
        }
    }

    fn template(&self, map: &TableMap, ts: u32) -> RowEvent {
        let mut e = RowEvent::new(Arc::clone(&map.schema), Arc::clone(&map.table), Op::Insert)
            .with_tx(Tx {
                id: self.tx_token,
                commit: self.tx_token,
                index: self.open.index,
            });
        if ts > 0 {
            e = e.with_commit_ts(UNIX_EPOCH + Duration::from_secs(u64::from(ts)));
        }
        e.pk_names = map.primary_key.clone();
        e
    }

    fn rows(&mut self, kind: binlog::RowsKind, v2: bool, data: &[u8], ts: u32) {
        let id = match binlog::rows_table_id(data) {
            Ok(id) => id,
            Err(e) => return self.skip(format!("rows event: {e}")),
        };
        let (map, is_self) = match self.tables.get(&id) {
            Some(e) => (e.map.clone(), e.is_self),
            None => return self.skip(format!("rows event for table id {id} without a table map")),
        };
        if is_self {
            self.open.own = true;
            return;
        }
        self.open.other = true;
        let Some(map) = map else { return };
        let template = self.template(&map, ts);
        match binlog::decode_rows(kind, v2, data, &map, &template, &mut self.out.events) {
            Ok(n) => {
                self.open.index = self.open.index.saturating_add(n as u32);
                self.open.delivered = true;
            }
            Err(e) => self.skip(format!("rows event of {}.{}: {e}", map.schema, map.table)),
        }
    }

    /// A QUERY event: transaction control, TRUNCATE, DDL.
    fn query(&mut self, data: &[u8], start: u64, end: u64, ts: u32) -> Result<Step, MySqlError> {
        let q = match QueryEvent::decode(data) {
            Ok(q) => q,
            Err(e) => return Err(MySqlError::new(ErrorKind::Decode, e.to_string())),
        };
        let statement = binlog::classify(q.statement, q.database);
        match statement {
            Statement::Begin => {
                self.begin_tx(start);
                self.open.in_begin = true;
                Ok(Step::Continue)
            }
            Statement::Commit | Statement::Rollback => Ok(self.commit(end)),
            Statement::Other if self.open.in_begin => Ok(Step::Continue), // SAVEPOINT inside a transaction
            Statement::Other => {
                // A statement of its own (grants, FLUSH, …): a transaction boundary.
                self.begin_tx(start);
                Ok(self.commit(end))
            }
            Statement::Truncate((db, table)) => {
                self.begin_tx(start);
                self.open.other = true;
                if self.watched(&db, &table) {
                    self.truncate(&db, &table, ts);
                }
                Ok(self.commit(end))
            }
            Statement::Ddl(kind, tables) => {
                self.begin_tx(start);
                self.open.other = true;
                let position = FilePos::new(self.file.clone(), start);
                for (db, table) in &tables {
                    let watched = if table.is_empty() {
                        self.patterns.iter().any(|p| &p.database == db)
                            || (self.patterns.is_empty() && self.watched(db, "*"))
                    } else {
                        self.watched(db, table)
                    };
                    if !watched {
                        continue;
                    }
                    self.report(SchemaChange {
                        schema: db.clone(),
                        table: table.clone(),
                        kind,
                        statement: freshen::clip(q.statement, 500).to_string(),
                        position: position.clone(),
                    });
                    // Rows that vanished with the table (or under its old name) are
                    // healed by a sweep, which a truncate event triggers.
                    let vanished = matches!(kind, DdlKind::DropTable | DdlKind::DropDatabase)
                        || (kind == DdlKind::RenameTable
                            && tables
                                .iter()
                                .step_by(2)
                                .any(|t| t == &(db.clone(), table.clone())));
                    if vanished && !table.is_empty() {
                        self.truncate(db, table, ts);
                    }
                }
                let mut broken = std::mem::take(&mut self.broken);
                let changes = broken.apply(kind, &tables, q.statement, |d, t| self.watched(d, t));
                self.broken = broken;
                self.out.changes.extend(changes);
                // Table ids of a changed table are re-mapped by the next table map.
                Ok(self.commit(end))
            }
        }
    }

    fn truncate(&mut self, db: &str, table: &str, ts: u32) {
        let mut e = RowEvent::new(db, table, Op::Truncate).with_tx(Tx {
            id: self.tx_token,
            commit: self.tx_token,
            index: self.open.index,
        });
        if ts > 0 {
            e = e.with_commit_ts(UNIX_EPOCH + Duration::from_secs(u64::from(ts)));
        }
        self.out.events.push(e);
        self.open.delivered = true;
        self.open.index += 1;
        self.shared.truncates.fetch_add(1, Ordering::Relaxed);
    }

    fn report(&mut self, change: SchemaChange) {
        self.shared.schema_changes.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            schema = %change.schema,
            table = %change.table,
            kind = change.kind.as_str(),
            statement = %change.statement,
            "freshen-mysql: schema change on a watched table"
        );
        let _ = self.schema_tx.send(change);
    }

    /// The end of a transaction at `end`.
    fn commit(&mut self, end: u64) -> Step {
        if let (Some(g), Some(Gtids::MariaDb(list))) =
            (self.open.pending_maria.take(), &mut self.gtids)
        {
            list.advance(g.domain, g.server, g.seq);
        }
        if let (Some(g), Some(Gtids::MySql(set))) =
            (self.open.pending_mysql.take(), &mut self.gtids)
        {
            set.add(g.sid, g.gno);
        }
        // Only the position table's own writes: not progress worth storing.
        if !self.open.own || self.open.other {
            self.foreign += 1;
        }
        self.serial += 1;
        let mark = Arc::new(Mark {
            cp: Checkpoint {
                file_pos: FilePos::new(self.file.clone(), end),
                gtids: self.gtids.clone(),
            },
            serial: self.serial,
            foreign: self.foreign,
        });
        self.resume = Arc::clone(&mark);
        let delivered = self.open.delivered;
        let had_output = self.has_output();
        self.end_tx();
        if delivered || had_output {
            self.out.commit = Some(mark);
            // Rows of this transaction went out in earlier (full) batches: the commit
            // must follow them even though nothing is gathered now.
            if delivered && self.out.events.is_empty() {
                Step::Flush
            } else {
                Step::Continue
            }
        } else {
            Step::Advance
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binlog::table_map::tests::{body, names};
    use crate::binlog::table_map::ty;

    const FILE: &str = "binlog.000007";

    struct Feed {
        asm: Assembler,
        shared: Arc<Shared>,
        changes: broadcast::Receiver<SchemaChange>,
        at: u64,
    }

    /// An assembler watching `app.*`, its position table `meta.positions`.
    fn feed() -> Feed {
        let shared = Arc::new(Shared::default());
        let (schema_tx, changes) = broadcast::channel(16);
        let start = Checkpoint {
            file_pos: FilePos::new(FILE, 4),
            gtids: None,
        };
        let mut asm = Assembler::new(
            start,
            false,
            vec![TablePattern::parse("app.*").unwrap()],
            Some(("meta".into(), "positions".into())),
            Arc::clone(&shared),
            schema_tx,
        );
        asm.start_session(Charsets::builtin(), false);
        Feed {
            asm,
            shared,
            changes,
            at: 4,
        }
    }

    impl Feed {
        /// Feeds one event of `size` bytes at the current position.
        fn event(&mut self, kind: u8, data: &[u8]) -> Result<Step, MySqlError> {
            let size = 19 + data.len() as u64;
            self.at += size;
            let head = Head {
                kind,
                timestamp: 1_700_000_000,
                end: self.at,
                size,
                server_id: 1,
            };
            self.asm.handle(head, data)
        }

        fn query(&mut self, db: &str, sql: &str) -> Step {
            let mut b = vec![0; 8];
            b.push(db.len() as u8);
            b.extend_from_slice(&[0, 0, 0, 0]); // error code, no status vars
            b.extend_from_slice(db.as_bytes());
            b.push(0);
            b.extend_from_slice(sql.as_bytes());
            self.event(event_type::QUERY, &b).unwrap()
        }

        fn map(&mut self, id: u64, db: &str, table: &str) {
            let b = body(
                id,
                db,
                table,
                &[(ty::LONG, &[]), (ty::LONGLONG, &[])],
                &[names(&["id", "value"]), (8, vec![0])],
            );
            assert_eq!(
                self.event(event_type::TABLE_MAP, &b).unwrap(),
                Step::Continue
            );
        }

        /// A WRITE_ROWS (v2) event of `rows` `(id, value)` rows for table `id`.
        fn insert(&mut self, id: u64, rows: &[(i32, i64)]) -> Step {
            let mut b = id.to_le_bytes()[..6].to_vec();
            b.extend_from_slice(&[1, 0, 2, 0]);
            b.push(2);
            b.push(0b11);
            for (k, v) in rows {
                b.push(0);
                b.extend_from_slice(&k.to_le_bytes());
                b.extend_from_slice(&v.to_le_bytes());
            }
            self.event(event_type::WRITE_ROWS, &b).unwrap()
        }

        fn xid(&mut self) -> Step {
            self.event(event_type::XID, &7u64.to_le_bytes()).unwrap()
        }
    }

    #[test]
    fn rows_of_a_watched_table_are_gathered_and_their_commit_marked() {
        let mut f = feed();
        assert_eq!(f.query("app", "BEGIN"), Step::Continue);
        f.map(5, "app", "readings");
        assert_eq!(f.insert(5, &[(1, 10), (2, 20)]), Step::Continue);
        assert!(f.asm.busy());
        assert_eq!(
            f.xid(),
            Step::Continue,
            "the rows are gathered with their commit"
        );
        assert!(!f.asm.open.active);
        let out = f.asm.take_output(16);
        assert_eq!(out.events.len(), 2);
        let (e0, e1) = (&out.events[0], &out.events[1]);
        assert_eq!(
            (&*e0.schema, &*e0.table, e0.op),
            ("app", "readings", Op::Insert)
        );
        let (t0, t1) = (e0.tx.unwrap(), e1.tx.unwrap());
        assert_eq!((t0.id, t0.index, t1.id, t1.index), (t0.id, 0, t0.id, 1));
        let mark = out.commit.expect("the batch confirms its commit");
        assert_eq!(mark.cp.file_pos, FilePos::new(FILE, f.at));
        assert_eq!((mark.serial, mark.foreign), (1, 1));
        assert_eq!(f.asm.resume(), &mark);
        assert!(!f.asm.has_output());
    }

    #[test]
    fn a_commit_after_full_batches_went_out_is_handed_over_at_once() {
        let mut f = feed();
        f.query("app", "BEGIN");
        f.map(5, "app", "readings");
        f.insert(5, &[(1, 10)]);
        let first = f.asm.take_output(16);
        assert_eq!((first.events.len(), first.commit.is_none()), (1, true));
        assert_eq!(f.xid(), Step::Flush);
        let out = f.asm.take_output(16);
        assert!(out.events.is_empty());
        assert!(out.commit.is_some());
    }

    #[test]
    fn unwatched_and_own_writes_deliver_nothing_and_only_move_the_resume_point() {
        let mut f = feed();
        f.query("other", "BEGIN");
        f.map(6, "other", "t");
        f.insert(6, &[(1, 1)]);
        assert_eq!(f.xid(), Step::Advance);
        assert!(!f.asm.has_output());
        assert_eq!((f.asm.resume().serial, f.asm.resume().foreign), (1, 1));
        // The position table's own writes: a transaction, but not one worth storing.
        f.query("meta", "BEGIN");
        f.map(7, "meta", "positions");
        f.insert(7, &[(1, 1)]);
        assert_eq!(f.xid(), Step::Advance);
        assert_eq!((f.asm.resume().serial, f.asm.resume().foreign), (2, 1));
    }

    #[test]
    fn truncate_and_drop_of_a_watched_table_are_truncate_events() {
        let mut f = feed();
        assert_eq!(f.query("other", "DROP TABLE t"), Step::Advance);
        assert_eq!(f.query("app", "TRUNCATE readings"), Step::Continue);
        assert_eq!(f.query("app", "DROP TABLE sites"), Step::Continue);
        let out = f.asm.take_output(16);
        let truncated: Vec<(&str, Op)> = out.events.iter().map(|e| (&*e.table, e.op)).collect();
        assert_eq!(
            truncated,
            [("readings", Op::Truncate), ("sites", Op::Truncate)]
        );
        assert_eq!(f.shared.truncates.load(Ordering::Relaxed), 2);
        // The drop is reported to subscribers and, for the refresher, in the batch.
        let change = f.changes.try_recv().unwrap();
        assert_eq!(
            (change.table.as_str(), change.kind),
            ("sites", DdlKind::DropTable)
        );
        assert!(
            f.changes.try_recv().is_err(),
            "an unwatched table is not reported"
        );
        assert_eq!(out.changes.len(), 1);
        assert_eq!(&*out.changes[0].table, "sites");
    }

    #[test]
    fn what_cannot_be_read_is_skipped_and_counted() {
        let mut f = feed();
        f.query("app", "BEGIN");
        assert_eq!(f.insert(9, &[(1, 1)]), Step::Continue);
        let nameless = body(3, "app", "bare", &[(ty::LONG, &[])], &[]);
        f.event(event_type::TABLE_MAP, &nameless).unwrap();
        f.xid();
        let out = f.asm.take_output(16);
        assert_eq!(f.shared.skipped.load(Ordering::Relaxed), 2);
        let said: Vec<String> = out.skipped.iter().map(ToString::to_string).collect();
        assert!(said[0].contains("without a table map"), "{said:?}");
        assert!(said[1].contains("binlog_row_metadata=FULL"), "{said:?}");
    }

    #[test]
    fn rotate_heartbeat_and_refused_events() {
        let mut f = feed();
        let mut rotate = 4u64.to_le_bytes().to_vec();
        rotate.extend_from_slice(b"binlog.000008");
        f.event(event_type::ROTATE, &rotate).unwrap();
        f.query("app", "TRUNCATE readings");
        let out = f.asm.take_output(16);
        assert_eq!(out.commit.unwrap().cp.file_pos.file, "binlog.000008");
        f.event(event_type::HEARTBEAT, &[]).unwrap();
        assert!(f.shared.caught_up.load(Ordering::Relaxed));
        assert_eq!(
            lock(&f.shared.server_end).clone(),
            Some(FilePos::new("binlog.000008", f.at))
        );
        let e = f
            .event(event_type::TRANSACTION_PAYLOAD, &[])
            .expect_err("compressed transactions are refused");
        assert_eq!(e.kind(), ErrorKind::Refused);
    }

    #[test]
    fn a_new_session_forgets_table_ids_and_the_open_transaction() {
        let mut f = feed();
        f.query("app", "BEGIN");
        f.map(5, "app", "readings");
        f.asm.start_session(Charsets::builtin(), false);
        assert!(!f.asm.busy());
        f.query("app", "BEGIN");
        f.insert(5, &[(1, 1)]);
        let out = f.asm.take_output(16);
        assert!(out.events.is_empty(), "rows need their table map again");
        assert_eq!(out.skipped.len(), 1);
    }

    #[test]
    fn mariadb_gtids_advance_at_commit() {
        let shared = Arc::new(Shared::default());
        let (schema_tx, _) = broadcast::channel(1);
        let start = Checkpoint {
            file_pos: FilePos::new(FILE, 4),
            gtids: Some(Gtids::MariaDb("0-1-41".parse().unwrap())),
        };
        let mut asm = Assembler::new(start, true, Vec::new(), None, shared, schema_tx);
        let mut gtid = 42u64.to_le_bytes().to_vec();
        gtid.extend_from_slice(&0u32.to_le_bytes());
        gtid.push(0);
        let head = |kind, end| Head {
            kind,
            timestamp: 0,
            end,
            size: 20,
            server_id: 1,
        };
        asm.handle(head(event_type::MARIADB_GTID, 100), &gtid)
            .unwrap();
        assert_eq!(
            asm.handle(head(event_type::XID, 140), &1u64.to_le_bytes())
                .unwrap(),
            Step::Advance
        );
        let cp = &asm.resume().cp;
        assert_eq!(cp.gtids.as_ref().unwrap().to_string(), "0-1-42");
        assert_eq!(cp.file_pos, FilePos::new(FILE, 140));
    }
}
