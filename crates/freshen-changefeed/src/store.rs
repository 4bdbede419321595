//! The redb file: tables, opening, and the read path.
//!
//! | table          | key             | value                                  |
//! |----------------|-----------------|----------------------------------------|
//! | `events`       | sequence        | a record (`record.rs`)                 |
//! | `meta`         | name            | `format`, `last_sequence`, `high_water`, `size_bytes`, `truncated_before`, `key_index_upto` |
//! | `latest`       | `schema\0table\0pk` | the sequence of the row's latest event (the latest-per-key index) |
//! | `groups`       | group           | the group's definition and cursor (JSON) |
//! | `leases`       | (group, seq)    | an event in flight in the group (JSON)  |
//! | `dead_letters` | (group, seq)    | a dead letter: JSON header + the record |
//! | `snapshots`    | `schema\0table` | a table's snapshot progress (JSON)      |
//!
//! All writes go through the single writer thread (`writer.rs`); reads run anywhere.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::Error;
use crate::record::RecordRef;
use freshen_codec::SnapshotProgress;

pub(crate) const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub(crate) const GROUPS: TableDefinition<&str, &[u8]> = TableDefinition::new("groups");
pub(crate) const LEASES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("leases");
pub(crate) const DEAD: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("dead_letters");
pub(crate) const LATEST: TableDefinition<&str, u64> = TableDefinition::new("latest");
pub(crate) const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");

const FORMAT: &[u8] = &[1];
pub(crate) const META_FORMAT: &str = "format";
pub(crate) const META_LAST: &str = "last_sequence";
pub(crate) const META_HIGH_WATER: &str = "high_water";
pub(crate) const META_SIZE: &str = "size_bytes";
pub(crate) const META_TRUNCATED: &str = "truncated_before";
pub(crate) const META_INDEXED: &str = "key_index_upto";
pub(crate) const META_TX_COMPLETE: &str = "tx_complete_through";

/// Bytes an event occupies in the size accounting: its key and its record.
pub(crate) fn stored_size(record_len: usize) -> u64 {
    8 + record_len as u64
}

/// The log's counters, as the writer keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LogState {
    /// The last sequence ever assigned (0: none yet). Kept even when retention deleted it.
    pub(crate) last: u64,
    /// The oldest sequence still stored; `last + 1` when the log is empty.
    pub(crate) oldest: u64,
    /// The position of the last appended event that had one: (commit, index in txn).
    pub(crate) high_water: Option<(u64, u32)>,
    /// Bytes of stored events.
    pub(crate) size: u64,
    /// Events stored (compaction leaves holes: not `last + 1 - oldest`).
    pub(crate) count: u64,
    /// Every sequence below this one was deleted from the front of the log (retention
    /// by age, count or size, or an explicit delete): a reader whose position is below
    /// it missed events. Compaction's holes do not count.
    pub(crate) truncated: u64,
    /// The source's commit position through which every transaction is wholly in the
    /// log ([`freshen::Batch::committed_through`]; 0: none known): the last
    /// transaction's marker need not wait for the next one.
    pub(crate) tx_complete: u64,
}

fn u64_of(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

pub(crate) fn encode_high_water((commit, index): (u64, u32)) -> [u8; 12] {
    let mut b = [0; 12];
    b[..8].copy_from_slice(&commit.to_le_bytes());
    b[8..].copy_from_slice(&index.to_le_bytes());
    b
}

fn decode_high_water(b: &[u8]) -> Option<(u64, u32)> {
    Some((
        u64_of(b.get(..8)?)?,
        u32::from_le_bytes(b.get(8..12)?.try_into().ok()?),
    ))
}

/// Opens (creating when missing) the store at `path` and reads the log's counters.
/// With `key_index`, brings the latest-per-key index up to date with events appended
/// while it was off (or before it existed).
pub(crate) fn open(
    path: &Path,
    key_index: bool,
    cache_bytes: usize,
) -> Result<(Database, LogState), Error> {
    let io = |e: std::io::Error| Error::Open {
        path: path.to_owned(),
        source: redb::DatabaseError::Storage(redb::StorageError::Io(e)),
    };
    // Owner-only when freshen makes them: the log holds every captured row (redacted
    // columns aside), which no other local user should read. Existing ones keep theirs.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
    }
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            // An empty file: redb makes a new database in it.
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)),
        }
    }
    let db = Database::builder()
        .set_cache_size(cache_bytes)
        .create(path)
        .map_err(|source| Error::Open {
            path: path.to_owned(),
            source,
        })?;
    let tx = db.begin_write()?;
    let state = {
        let mut meta = tx.open_table(META)?;
        let format = meta.get(META_FORMAT)?.map(|f| f.value().to_vec());
        match format {
            Some(f) if f == FORMAT => {}
            Some(f) => {
                return Err(Error::Format(format!(
                    "{} holds format {f:?}; this version reads {FORMAT:?}",
                    path.display()
                )));
            }
            None => {
                meta.insert(META_FORMAT, FORMAT)?;
            }
        }
        let last = meta
            .get(META_LAST)?
            .and_then(|v| u64_of(v.value()))
            .unwrap_or(0);
        let high_water = meta
            .get(META_HIGH_WATER)?
            .and_then(|v| decode_high_water(v.value()));
        let size = meta
            .get(META_SIZE)?
            .and_then(|v| u64_of(v.value()))
            .unwrap_or(0);
        let events = tx.open_table(EVENTS)?;
        let oldest = match events.first()? {
            Some((k, _)) => k.value(),
            None => last + 1,
        };
        // Stores from before the mark: whatever precedes the oldest event was deleted.
        let truncated = meta
            .get(META_TRUNCATED)?
            .and_then(|v| u64_of(v.value()))
            .unwrap_or(oldest);
        let count = events.len()?;
        let tx_complete = meta
            .get(META_TX_COMPLETE)?
            .and_then(|v| u64_of(v.value()))
            .unwrap_or(0);
        tx.open_table(GROUPS)?;
        tx.open_table(LEASES)?;
        tx.open_table(DEAD)?;
        tx.open_table(SNAPSHOTS)?;
        let mut latest = tx.open_table(LATEST)?;
        if key_index {
            let upto = meta
                .get(META_INDEXED)?
                .and_then(|v| u64_of(v.value()))
                .unwrap_or(0);
            if upto < last {
                for item in events.range(upto + 1..=last)? {
                    let (k, v) = item?;
                    if let Some(r) = RecordRef::parse(v.value()) {
                        index(&mut latest, k.value(), &r)?;
                    }
                }
            }
            meta.insert(META_INDEXED, last.to_le_bytes().as_slice())?;
        }
        LogState {
            last,
            oldest,
            high_water,
            size,
            count,
            truncated,
            tx_complete,
        }
    };
    tx.commit()?;
    Ok((db, state))
}

/// Records event `seq` in the latest-per-key index: a keyed event becomes its row's
/// latest; a TRUNCATE ends every row of its table.
pub(crate) fn index(
    latest: &mut redb::Table<'_, &'static str, u64>,
    seq: u64,
    r: &RecordRef<'_>,
) -> Result<(), Error> {
    if let Some(k) = r.index_key() {
        latest.insert(k.as_str(), seq)?;
    } else if r.op == freshen::Op::Truncate {
        let (start, end) = crate::record::table_range(r.schema, r.table);
        latest.retain_in(start.as_str()..end.as_str(), |_, _| false)?;
    }
    Ok(())
}

/// Visits stored events with sequence in `(after, upto]`, in order, at most `max_scan`
/// of them, until `visit` returns false. Returns the last sequence visited (`after` when
/// none). Records that do not parse are skipped and counted in `corrupt`.
pub(crate) fn scan(
    db: &Database,
    after: u64,
    upto: u64,
    max_scan: usize,
    corrupt: &mut u64,
    mut visit: impl FnMut(u64, &RecordRef<'_>) -> bool,
) -> Result<u64, Error> {
    if after >= upto || max_scan == 0 {
        return Ok(after);
    }
    let tx = db.begin_read()?;
    let table = tx.open_table(EVENTS)?;
    let mut last = after;
    for item in table.range(after + 1..=upto)?.take(max_scan) {
        let (k, v) = item?;
        last = k.value();
        match RecordRef::parse(v.value()) {
            Some(r) => {
                if !visit(last, &r) {
                    break;
                }
            }
            None => *corrupt += 1,
        }
    }
    Ok(last)
}

/// Visits stored events with sequence at or below `at`, newest first, at most
/// `max_scan` of them, until `visit` returns false. Records that do not parse end it.
pub(crate) fn scan_back(
    db: &Database,
    at: u64,
    max_scan: usize,
    mut visit: impl FnMut(u64, &RecordRef<'_>) -> bool,
) -> Result<(), Error> {
    let tx = db.begin_read()?;
    let table = tx.open_table(EVENTS)?;
    for item in table.range(..=at)?.rev().take(max_scan) {
        let (k, v) = item?;
        match RecordRef::parse(v.value()) {
            Some(r) if visit(k.value(), &r) => {}
            _ => break,
        }
    }
    Ok(())
}

/// The stored record of `sequence`, if it is still stored.
pub(crate) fn get(db: &Database, sequence: u64) -> Result<Option<Vec<u8>>, Error> {
    let tx = db.begin_read()?;
    let table = tx.open_table(EVENTS)?;
    Ok(table.get(sequence)?.map(|v| v.value().to_vec()))
}

/// Compaction candidates among events with sequence in `(after, upto]` (at most
/// `max_scan` examined): keyed events that are no longer their row's latest, and
/// tombstones (DELETEs still latest, TRUNCATEs) appended before `tombstone_cutoff_ms`.
/// Returns them and the last sequence examined.
pub(crate) fn compaction_candidates(
    db: &Database,
    after: u64,
    upto: u64,
    max_scan: usize,
    tombstone_cutoff_ms: u64,
) -> Result<(Vec<u64>, u64), Error> {
    let mut out = Vec::new();
    if after >= upto {
        return Ok((out, after));
    }
    let tx = db.begin_read()?;
    let events = tx.open_table(EVENTS)?;
    let latest = tx.open_table(LATEST)?;
    let mut last = after;
    for item in events.range(after + 1..=upto)?.take(max_scan) {
        let (k, v) = item?;
        let seq = k.value();
        last = seq;
        let Some(r) = RecordRef::parse(v.value()) else {
            continue;
        };
        let expired = r.appended_ms < tombstone_cutoff_ms;
        match r.index_key() {
            Some(key) => {
                let is_latest = latest.get(key.as_str())?.is_some_and(|s| s.value() == seq);
                if !is_latest || (expired && r.op == freshen::Op::Delete) {
                    out.push(seq);
                }
            }
            None if r.op == freshen::Op::Truncate && expired => out.push(seq),
            // Tables without a key: every event is kept.
            None => {}
        }
    }
    Ok((out, last))
}

/// Every table's stored snapshot progress: (`schema\0table`, JSON).
pub(crate) fn snapshots(db: &Database) -> Result<Vec<(String, Vec<u8>)>, Error> {
    let tx = db.begin_read()?;
    let table = tx.open_table(SNAPSHOTS)?;
    let mut out = Vec::new();
    for item in table.iter()? {
        let (k, v) = item?;
        out.push((k.value().to_owned(), v.value().to_vec()));
    }
    Ok(out)
}

impl SnapshotRecord for SnapshotProgress {
    fn store_key(&self) -> String {
        store_key(&self.schema, &self.table)
    }

    fn to_json(&self) -> Vec<u8> {
        let mut p = self.clone();
        // Failures are for the status, not for the next run.
        p.last_error = None;
        serde_json::to_vec(&p).unwrap_or_default()
    }
}

/// How the changefeed stores a table's progress with its log.
pub(crate) trait SnapshotRecord {
    /// The key in the log's snapshot table.
    fn store_key(&self) -> String;
    /// The stored value.
    fn to_json(&self) -> Vec<u8>;
}

/// A table's key in the snapshot table.
pub(crate) fn store_key(schema: &str, table: &str) -> String {
    format!("{schema}\0{table}")
}
