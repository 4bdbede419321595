//! `Decoded`: what one message turned into — row events, or a message without rows.

use freshen::{Gap, RowEvent};

/// The result of decoding one message.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Decoded {
    /// Row changes, in message order (canal-json messages may carry many rows).
    Rows(Vec<RowEvent>),
    /// A message that carries no row changes and is no error: skip it quietly.
    Control(Control),
    /// A message that says rows of a table changed without carrying them whole (a
    /// TiCDC key-only message, a Canal MINIMAL row image, a statement instead of rows, a
    /// partition truncated or dropped). It decodes to no row events: a source hands the
    /// [`Gap`] on ([`Batch::with_gaps`](freshen::Batch::with_gaps)) and each view over
    /// the table sweeps. [`Gap::reason`] names the producer setting that avoids it.
    Gap(Gap),
}

impl Decoded {
    /// The row events (none for a control message).
    pub fn events(&self) -> &[RowEvent] {
        match self {
            Decoded::Rows(rows) => rows,
            Decoded::Control(_) | Decoded::Gap(_) => &[],
        }
    }

    /// The gap this message declares, if any.
    pub fn gap(&self) -> Option<&Gap> {
        match self {
            Decoded::Gap(g) => Some(g),
            _ => None,
        }
    }

    /// The row events, owned (none for a control message).
    pub fn into_events(self) -> Vec<RowEvent> {
        match self {
            Decoded::Rows(rows) => rows,
            Decoded::Control(_) | Decoded::Gap(_) => Vec::new(),
        }
    }
}

/// A message without row changes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Control {
    /// A schema change (canal-json `isDdl`, Debezium's schema-change topic). TRUNCATE is
    /// not here: it decodes to an [`Op::Truncate`](freshen::Op::Truncate) row event.
    Ddl {
        /// The database (canal-json) or schema the statement ran in; may be empty.
        schema: String,
        /// The table it changed; empty for database-level statements.
        table: String,
        /// The producer's kind of statement (canal-json `CREATE`, `ALTER`, `QUERY`, …).
        kind: String,
        /// The statement text.
        sql: String,
    },
    /// TiCDC's `TIDB_WATERMARK`: every event before this TiDB timestamp (TSO) has been
    /// delivered on this partition.
    Watermark {
        /// The watermark TSO; 0 when the message did not carry one.
        ts: u64,
    },
    /// A Kafka tombstone (null value) that follows a Debezium delete for log compaction.
    Tombstone,
    /// Any other producer bookkeeping without rows (Canal heartbeats and GTID markers,
    /// Debezium logical-decoding messages), named by its type.
    Other {
        /// The message's type (`MHEARTBEAT`, `GTID`, `m`, …).
        kind: String,
    },
}
