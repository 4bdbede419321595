//! `Filter`: which events a reader wants (key prefix, tables, operations).

use freshen::Op;

use crate::record::{self, RecordRef};

/// What a reader reads: the events it follows, which of them it still wants at a
/// position, and how a stream names its position after an event. A [`Filter`] wants every
/// event it matches; per-table cursors ([`crate::cursors::Cursors`]) want a table's events
/// only past that table's cursor.
pub(crate) trait Selection {
    /// The reader follows this event's table, key and operation (transaction markers
    /// count these, wherever the reader's position is).
    fn keeps(&self, r: &RecordRef<'_>) -> bool;

    /// The event at `seq` is delivered to this reader.
    fn delivers(&self, seq: u64, r: &RecordRef<'_>) -> bool {
        let _ = seq;
        self.keeps(r)
    }

    /// Writes a stream's event `id` after the event at `seq`: what `Last-Event-ID`
    /// resumes from.
    fn write_id(&self, seq: u64, out: &mut Vec<u8>) {
        record::push_u64(out, seq);
    }
}

impl Selection for Filter {
    fn keeps(&self, r: &RecordRef<'_>) -> bool {
        self.matches(r)
    }
}

/// Which events a reader wants. The default matches every event.
///
/// ```
/// use freshen::Op;
/// use freshen_changefeed::Filter;
/// let f = Filter::default().key_prefix("orders:").ops([Op::Insert, Op::Update]);
/// assert!(!f.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    key_prefix: Option<String>,
    tables: Vec<String>,
    /// Bit `op_bit(op)` set for each wanted operation; 0 means all.
    ops: u8,
}

fn op_bit(op: Op) -> u8 {
    match op {
        Op::Insert => 1,
        Op::Update => 2,
        Op::Delete => 4,
        Op::Truncate => 8,
    }
}

impl Filter {
    /// Only events whose key (`table:pk`) starts with `prefix`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Filter {
        let p = prefix.into();
        self.key_prefix = (!p.is_empty()).then_some(p);
        self
    }

    /// Only events of `table` (a table name, or `schema.table`); call again to add more.
    pub fn table(mut self, table: impl Into<String>) -> Filter {
        self.tables.push(table.into());
        self
    }

    /// Only these operations.
    pub fn ops(mut self, ops: impl IntoIterator<Item = Op>) -> Filter {
        for op in ops {
            self.ops |= op_bit(op);
        }
        self
    }

    /// Whether the filter lets every event through.
    pub fn is_empty(&self) -> bool {
        self.key_prefix.is_none() && self.tables.is_empty() && self.ops == 0
    }

    pub(crate) fn matches(&self, r: &RecordRef<'_>) -> bool {
        if self.ops != 0 && self.ops & op_bit(r.op) == 0 {
            return false;
        }
        if let Some(p) = &self.key_prefix
            && !r.key.starts_with(p.as_str())
        {
            return false;
        }
        self.tables.is_empty()
            || self.tables.iter().any(|t| {
                t == r.table
                    || t.strip_prefix(r.schema)
                        .and_then(|rest| rest.strip_prefix('.'))
                        .is_some_and(|table| table == r.table)
            })
    }

    /// Adds operations from a comma-separated list: `insert`, `update`, `delete`,
    /// `truncate`, or ThemisDB's `PUT` (insert, update) and `DELETE` (delete, truncate).
    pub(crate) fn parse_ops(mut self, list: &str) -> Result<Filter, String> {
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            // Upper case is ThemisDB's event type (a TRUNCATE is a DELETE of every row);
            // lower case is our `op`.
            let ops: &[Op] = match word {
                "PUT" => &[Op::Insert, Op::Update],
                "DELETE" => &[Op::Delete, Op::Truncate],
                "insert" => &[Op::Insert],
                "update" => &[Op::Update],
                "delete" => &[Op::Delete],
                "truncate" => &[Op::Truncate],
                _ => {
                    return Err(format!(
                        "unknown operation {word:?}: expected insert, update, delete, truncate, PUT or DELETE"
                    ));
                }
            };
            self = self.ops(ops.iter().copied());
        }
        Ok(self)
    }

    /// Adds tables from a comma-separated list.
    pub(crate) fn parse_tables(mut self, list: &str) -> Filter {
        for t in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            self = self.table(t);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Encoder;
    use freshen::{Row, RowEvent, Value};

    fn rec(schema: &str, table: &str, op: Op) -> Vec<u8> {
        let mut e = RowEvent::new(schema, table, op).with_pk(["id"]);
        let row = Row::from_pairs([("id", Value::Int(1))]);
        e = if op == Op::Delete {
            e.with_old(row)
        } else {
            e.with_new(row)
        };
        Encoder::default().encode(&e, 1)
    }

    #[test]
    fn filters_by_key_table_and_op() {
        let ins = rec("public", "orders", Op::Insert);
        let del = rec("sales", "orders", Op::Delete);
        let r_ins = RecordRef::parse(&ins).unwrap();
        let r_del = RecordRef::parse(&del).unwrap();
        assert!(Filter::default().matches(&r_ins));
        assert!(Filter::default().key_prefix("orders:1").matches(&r_ins));
        assert!(!Filter::default().key_prefix("order:").matches(&r_ins));
        assert!(Filter::default().table("orders").matches(&r_del));
        assert!(Filter::default().table("sales.orders").matches(&r_del));
        assert!(!Filter::default().table("public.orders").matches(&r_del));
        assert!(!Filter::default().table("items").matches(&r_del));
        let puts = Filter::default().parse_ops("PUT").unwrap();
        assert!(puts.matches(&r_ins) && !puts.matches(&r_del));
        let dels = Filter::default().parse_ops("DELETE").unwrap();
        assert!(!dels.matches(&r_ins) && dels.matches(&r_del));
        let lower = Filter::default().parse_ops("update, delete").unwrap();
        assert!(!lower.matches(&r_ins) && lower.matches(&r_del));
        assert!(
            Filter::default()
                .parse_ops("upsert")
                .unwrap_err()
                .contains("upsert")
        );
        assert!(Filter::default().parse_tables(" , ").is_empty());
    }
}
