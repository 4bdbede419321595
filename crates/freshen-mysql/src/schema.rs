//! `SchemaChange`: a DDL statement on a watched table, as the binlog reported it.

use crate::FilePos;
use crate::binlog::DdlKind;

/// A schema change on a watched table, seen in the binlog (a QUERY event). Reported
/// once: logged, counted in [`Health::schema_changes`](crate::Health), and sent to every
/// [`MySqlHandle::schema_changes`](crate::MySqlHandle::schema_changes) subscriber.
///
/// A `DROP TABLE` (or the old name of a `RENAME TABLE`, or a `DROP DATABASE` naming a
/// watched table) also reaches the refresher as a truncate event, so the views over it
/// are swept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaChange {
    /// Database of the table.
    pub schema: String,
    /// The table (empty for `DROP DATABASE`).
    pub table: String,
    /// What the statement does.
    pub kind: DdlKind,
    /// The statement as logged (at most 500 bytes).
    pub statement: String,
    /// Where the statement starts in the binlog.
    pub position: FilePos,
}
