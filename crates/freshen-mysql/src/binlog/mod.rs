//! Binlog event bodies, decoded by this crate: pure functions from bytes, bounds-checked
//! everywhere (a truncated event is a [`DecodeError`], never a panic), fuzzed
//! (`fuzz/`), and fast (rows go straight from the row image to [`freshen::Value`]s).

mod charset;
mod cursor;
mod json;
mod query;
mod rows;
pub(crate) mod table_map; // its test encoders serve the reader's tests too
mod value;

use std::fmt;

pub use charset::{Charset, Charsets};
pub use query::{DdlKind, QueryEvent, Statement, TableRef, classify};
pub use rows::{RowsKind, decode_rows, rows_table_id};
pub use table_map::TableMap;

use cursor::Cursor;

/// An event body that could not be decoded: what was being read and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    message: String,
}

impl DecodeError {
    pub(crate) fn new(message: String) -> DecodeError {
        DecodeError { message }
    }

    pub(crate) fn truncated(what: &str, need: usize, have: usize) -> DecodeError {
        DecodeError::new(format!(
            "{what}: truncated (needs {need} bytes, {have} left)"
        ))
    }

    pub(crate) fn context(self, where_: String) -> DecodeError {
        DecodeError::new(format!("{where_}: {}", self.message))
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DecodeError {}

/// Event type codes this crate acts on (MySQL's and MariaDB's).
pub mod event_type {
    /// QUERY_EVENT: a statement (BEGIN, COMMIT, DDL).
    pub const QUERY: u8 = 2;
    /// STOP_EVENT.
    pub const STOP: u8 = 3;
    /// ROTATE_EVENT: the next binlog file.
    pub const ROTATE: u8 = 4;
    /// FORMAT_DESCRIPTION_EVENT.
    pub const FORMAT_DESCRIPTION: u8 = 15;
    /// XID_EVENT: a transaction's commit.
    pub const XID: u8 = 16;
    /// TABLE_MAP_EVENT.
    pub const TABLE_MAP: u8 = 19;
    /// WRITE_ROWS_EVENT v1.
    pub const WRITE_ROWS_V1: u8 = 23;
    /// UPDATE_ROWS_EVENT v1.
    pub const UPDATE_ROWS_V1: u8 = 24;
    /// DELETE_ROWS_EVENT v1.
    pub const DELETE_ROWS_V1: u8 = 25;
    /// HEARTBEAT_LOG_EVENT.
    pub const HEARTBEAT: u8 = 27;
    /// WRITE_ROWS_EVENT v2.
    pub const WRITE_ROWS: u8 = 30;
    /// UPDATE_ROWS_EVENT v2.
    pub const UPDATE_ROWS: u8 = 31;
    /// DELETE_ROWS_EVENT v2.
    pub const DELETE_ROWS: u8 = 32;
    /// GTID_LOG_EVENT (MySQL).
    pub const MYSQL_GTID: u8 = 33;
    /// ANONYMOUS_GTID_LOG_EVENT (MySQL).
    pub const MYSQL_ANONYMOUS_GTID: u8 = 34;
    /// PARTIAL_UPDATE_ROWS_EVENT (MySQL, `binlog_row_value_options=PARTIAL_JSON`).
    pub const PARTIAL_UPDATE_ROWS: u8 = 39;
    /// TRANSACTION_PAYLOAD_EVENT (MySQL, `binlog_transaction_compression=ON`).
    pub const TRANSACTION_PAYLOAD: u8 = 40;
    /// HEARTBEAT_LOG_EVENT_V2 (MySQL 8.0.26+).
    pub const HEARTBEAT_V2: u8 = 41;
    /// GTID_EVENT (MariaDB).
    pub const MARIADB_GTID: u8 = 162;
    /// GTID_LIST_EVENT (MariaDB).
    pub const MARIADB_GTID_LIST: u8 = 163;
    /// QUERY_COMPRESSED_EVENT (MariaDB, `log_bin_compress=ON`).
    pub const MARIADB_QUERY_COMPRESSED: u8 = 165;
    /// First of MariaDB's compressed rows events (166–171).
    pub const MARIADB_ROWS_COMPRESSED_FIRST: u8 = 166;
    /// Last of MariaDB's compressed rows events.
    pub const MARIADB_ROWS_COMPRESSED_LAST: u8 = 171;
}

/// The rows event kind of an event type, and whether it is version 2.
pub fn rows_kind(event_type: u8) -> Option<(RowsKind, bool)> {
    use event_type::*;
    Some(match event_type {
        WRITE_ROWS_V1 => (RowsKind::Write, false),
        UPDATE_ROWS_V1 => (RowsKind::Update, false),
        DELETE_ROWS_V1 => (RowsKind::Delete, false),
        WRITE_ROWS => (RowsKind::Write, true),
        UPDATE_ROWS => (RowsKind::Update, true),
        DELETE_ROWS => (RowsKind::Delete, true),
        _ => return None,
    })
}

/// Why an event type cannot be read, when it is one this crate refuses: compressed
/// binlogs (a compressed transaction must be inflated whole, so memory would follow the
/// transaction's size) and partial JSON updates (the row image is incomplete).
pub fn refused(event_type: u8) -> Option<&'static str> {
    use event_type::*;
    match event_type {
        TRANSACTION_PAYLOAD => Some(
            "the binlog holds a compressed transaction (MySQL binlog_transaction_compression=ON); \
             freshen reads uncompressed binlogs only: SET GLOBAL binlog_transaction_compression = OFF",
        ),
        MARIADB_QUERY_COMPRESSED | MARIADB_ROWS_COMPRESSED_FIRST..=MARIADB_ROWS_COMPRESSED_LAST => {
            Some(
                "the binlog holds compressed events (MariaDB log_bin_compress=ON); freshen reads \
             uncompressed binlogs only: SET GLOBAL log_bin_compress = OFF",
            )
        }
        PARTIAL_UPDATE_ROWS => Some(
            "the binlog holds partial JSON updates (binlog_row_value_options=PARTIAL_JSON); \
             set binlog_row_value_options to '' so updates carry whole rows",
        ),
        _ => None,
    }
}

/// A MariaDB GTID event: the transaction's `domain-server-sequence`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MariaGtid {
    /// Replication domain.
    pub domain: u32,
    /// Originating server id (from the event header).
    pub server: u32,
    /// Sequence number within the domain.
    pub seq: u64,
    /// FL_STANDALONE: the transaction is one statement (DDL) with no COMMIT after it.
    pub standalone: bool,
}

impl MariaGtid {
    /// Decodes a MariaDB GTID event body; `server` is the header's server id.
    pub fn decode(body: &[u8], server: u32) -> Result<MariaGtid, DecodeError> {
        let mut c = Cursor::new(body);
        let seq = c.u64("mariadb gtid: sequence")?;
        let domain = c.u32("mariadb gtid: domain")?;
        let flags = c.u8("mariadb gtid: flags")?;
        Ok(MariaGtid {
            domain,
            server,
            seq,
            standalone: flags & 1 != 0,
        })
    }
}

/// A MySQL GTID event: the transaction's `source_uuid:gno`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MySqlGtid {
    /// The originating server's UUID.
    pub sid: [u8; 16],
    /// Transaction number.
    pub gno: u64,
}

impl MySqlGtid {
    /// Decodes a MySQL GTID event body.
    pub fn decode(body: &[u8]) -> Result<MySqlGtid, DecodeError> {
        let mut c = Cursor::new(body);
        c.u8("mysql gtid: flags")?;
        let mut sid = [0; 16];
        sid.copy_from_slice(c.take(16, "mysql gtid: source id")?);
        let gno = c.u64("mysql gtid: number")?;
        Ok(MySqlGtid { sid, gno })
    }
}

/// A ROTATE event: the next file and the position in it.
pub fn decode_rotate(body: &[u8]) -> Result<(u64, String), DecodeError> {
    let mut c = Cursor::new(body);
    let pos = c.u64("rotate: position")?;
    let name = String::from_utf8_lossy(c.rest()).into_owned();
    if name.is_empty() {
        return Err(DecodeError::new("rotate: empty file name".into()));
    }
    Ok((pos, name))
}

/// The checksum algorithm a FORMAT_DESCRIPTION event announces (0 none, 1 CRC32), read
/// from its tail: `… | alg (1) | checksum (4)` — `body` includes the checksum.
pub fn format_description_checksum(body_with_checksum: &[u8]) -> Option<u8> {
    let n = body_with_checksum.len();
    (n >= 5).then(|| body_with_checksum[n - 5])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gtid_events() {
        let mut b = 9u64.to_le_bytes().to_vec();
        b.extend_from_slice(&2u32.to_le_bytes());
        b.push(1);
        let g = MariaGtid::decode(&b, 7).unwrap();
        assert_eq!((g.domain, g.server, g.seq, g.standalone), (2, 7, 9, true));
        assert!(MariaGtid::decode(&b[..11], 7).is_err());
        let mut m = vec![1];
        m.extend_from_slice(&[0xab; 16]);
        m.extend_from_slice(&42u64.to_le_bytes());
        let g = MySqlGtid::decode(&m).unwrap();
        assert_eq!((g.sid[0], g.gno), (0xab, 42));
        assert!(MySqlGtid::decode(&m[..20]).is_err());
    }

    #[test]
    fn rotates() {
        let mut b = 4u64.to_le_bytes().to_vec();
        b.extend_from_slice(b"binlog.000002");
        assert_eq!(decode_rotate(&b).unwrap(), (4, "binlog.000002".into()));
        assert!(decode_rotate(&b[..8]).is_err());
        assert!(decode_rotate(&b[..3]).is_err());
    }

    #[test]
    fn refuses_compression() {
        assert!(
            refused(event_type::TRANSACTION_PAYLOAD)
                .unwrap()
                .contains("binlog_transaction_compression")
        );
        assert!(refused(169).unwrap().contains("log_bin_compress"));
        assert!(refused(event_type::WRITE_ROWS).is_none());
    }
}
