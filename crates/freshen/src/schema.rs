//! What a source says about a table besides its row changes: a [`Gap`] (rows changed in
//! a way the stream does not carry) and a [`SchemaChange`] (the table's shape moved),
//! and which of them break a view, by the tables and key columns it declared
//! ([`Builder::watches`](crate::Builder::watches)).

use std::fmt;

/// Rows of a table changed in a way the stream does not carry: a key-only message, a
/// statement instead of rows, a partition truncated or dropped. The views over the table
/// cannot tell which keys it dirtied, so each one that watches the table runs a reconcile
/// sweep (as after a TRUNCATE), and reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// Schema (PostgreSQL) or database (MySQL) of the table.
    pub schema: Box<str>,
    /// The table; empty when the source cannot tell which (then every view sweeps).
    pub table: Box<str>,
    /// What the stream left out, and the producer setting that would avoid it.
    pub reason: Box<str>,
}

impl Gap {
    /// A gap in `schema.table`, for `reason`.
    pub fn new(
        schema: impl Into<Box<str>>,
        table: impl Into<Box<str>>,
        reason: impl Into<Box<str>>,
    ) -> Gap {
        Gap {
            schema: schema.into(),
            table: table.into(),
            reason: reason.into(),
        }
    }
}

/// `schema.table: reason`, or `an unknown table: reason` (how an unhealed gap reads in
/// [`Stats::unhealed_gaps`](crate::Stats::unhealed_gaps)).
impl fmt::Display for Gap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.table.is_empty() {
            write!(f, "an unknown table: {}", self.reason)
        } else {
            write!(f, "{}.{}: {}", self.schema, self.table, self.reason)
        }
    }
}

/// A watched table's shape changed, as its source saw it (a PostgreSQL Relation
/// message that differs from the last one, a DDL statement in a MySQL binlog).
///
/// It carries every difference between the table now and the table as the source first
/// saw it in this process, so a change that undoes an earlier one (a dropped column
/// added back) is a `SchemaChange` with no breaking difference: the views it paused
/// resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaChange {
    /// Schema of the table, as first seen.
    pub schema: Box<str>,
    /// The table, as first seen.
    pub table: Box<str>,
    /// Every difference from the table as first seen; empty when it is back as it was.
    pub differences: Vec<Difference>,
}

/// One way a table differs from how its source first saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Difference {
    /// A column is gone.
    ColumnDropped {
        /// Its name.
        column: Box<str>,
    },
    /// A column has another type.
    ColumnRetyped {
        /// Its name.
        column: Box<str>,
        /// The type it had (the source's own spelling: a PostgreSQL type OID, a MySQL
        /// type name).
        was: Box<str>,
        /// The type it has now.
        now: Box<str>,
    },
    /// A column was added (it passes through: rows carry it from now on).
    ColumnAdded {
        /// Its name.
        column: Box<str>,
    },
    /// The table has another name now.
    Renamed {
        /// Its schema now.
        schema: Box<str>,
        /// Its name now.
        table: Box<str>,
    },
    /// The table was dropped.
    Dropped,
    /// A change the source cannot break down into columns (a MySQL `ALTER TABLE`
    /// statement without a table map yet): reported, it breaks nothing by itself.
    Altered {
        /// The statement, clipped.
        statement: Box<str>,
    },
}

impl Difference {
    /// Whether a view whose key is read from `key` (column names) cannot be rebuilt
    /// correctly after this difference.
    pub fn breaks(&self, key: &[Box<str>]) -> bool {
        match self {
            Difference::ColumnDropped { column } | Difference::ColumnRetyped { column, .. } => {
                key.contains(column)
            }
            Difference::Renamed { .. } | Difference::Dropped => true,
            Difference::ColumnAdded { .. } | Difference::Altered { .. } => false,
        }
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::ColumnDropped { column } => write!(f, "column {column} dropped"),
            Difference::ColumnRetyped { column, was, now } => {
                write!(f, "column {column} retyped from {was} to {now}")
            }
            Difference::ColumnAdded { column } => write!(f, "column {column} added"),
            Difference::Renamed { schema, table } => write!(f, "renamed to {schema}.{table}"),
            Difference::Dropped => f.write_str("dropped"),
            Difference::Altered { statement } => write!(f, "altered ({statement})"),
        }
    }
}

impl fmt::Display for SchemaChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}: ", self.schema, self.table)?;
        if self.differences.is_empty() {
            return f.write_str("back as it was");
        }
        for (i, d) in self.differences.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// A table a view reads, and the columns its scope takes keys from there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Watched {
    pub(crate) schema: Box<str>,
    pub(crate) table: Box<str>,
    pub(crate) key: Vec<Box<str>>,
}

/// Whether a view that declared `watched` tables is concerned by `schema.table` (an
/// empty `table` concerns every view). A view that declared nothing is concerned by
/// every table.
pub(crate) fn concerns(watched: &[Watched], schema: &str, table: &str) -> bool {
    table.is_empty()
        || watched.is_empty()
        || watched
            .iter()
            .any(|w| &*w.schema == schema && &*w.table == table)
}

/// What of `change` breaks a view that declared `watched`: the differences that touch a
/// declared table's key columns (or the table itself), as text; empty when the view can
/// go on. A view that declared nothing is never paused (nothing says what it relies on).
pub(crate) fn breaking(watched: &[Watched], change: &SchemaChange) -> Vec<String> {
    let mut out = Vec::new();
    for w in watched
        .iter()
        .filter(|w| w.schema == change.schema && w.table == change.table)
    {
        for d in &change.differences {
            let text = d.to_string();
            if d.breaks(&w.key) && !out.contains(&text) {
                out.push(text);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched() -> Vec<Watched> {
        vec![
            Watched {
                schema: "public".into(),
                table: "readings".into(),
                key: vec!["device".into()],
            },
            Watched {
                schema: "public".into(),
                table: "devices".into(),
                key: vec!["id".into()],
            },
        ]
    }

    fn change(table: &str, differences: Vec<Difference>) -> SchemaChange {
        SchemaChange {
            schema: "public".into(),
            table: table.into(),
            differences,
        }
    }

    #[test]
    fn a_dropped_key_column_breaks_only_the_view_keyed_on_it() {
        let c = change(
            "readings",
            vec![Difference::ColumnDropped {
                column: "device".into(),
            }],
        );
        assert_eq!(
            breaking(&watched(), &c),
            ["column device dropped".to_string()]
        );
        let other = vec![Watched {
            schema: "public".into(),
            table: "readings".into(),
            key: vec!["site".into()],
        }];
        assert!(breaking(&other, &c).is_empty(), "not its key column");
        assert!(breaking(&[], &c).is_empty(), "nothing declared: no pause");
    }

    #[test]
    fn retyped_keys_and_renamed_tables_break_added_columns_do_not() {
        let retyped = change(
            "devices",
            vec![
                Difference::ColumnRetyped {
                    column: "id".into(),
                    was: "int4".into(),
                    now: "text".into(),
                },
                Difference::ColumnAdded {
                    column: "note".into(),
                },
            ],
        );
        assert_eq!(
            breaking(&watched(), &retyped),
            ["column id retyped from int4 to text".to_string()]
        );
        let renamed = change(
            "devices",
            vec![Difference::Renamed {
                schema: "public".into(),
                table: "gadgets".into(),
            }],
        );
        assert_eq!(breaking(&watched(), &renamed).len(), 1);
        let added = change(
            "readings",
            vec![
                Difference::ColumnAdded {
                    column: "unit".into(),
                },
                Difference::Altered {
                    statement: "ALTER TABLE readings ENGINE=InnoDB".into(),
                },
            ],
        );
        assert!(breaking(&watched(), &added).is_empty());
        assert!(breaking(&watched(), &change("readings", Vec::new())).is_empty());
    }

    #[test]
    fn gaps_concern_the_views_over_their_table() {
        let w = watched();
        assert!(concerns(&w, "public", "readings"));
        assert!(!concerns(&w, "public", "other"));
        assert!(concerns(&w, "public", ""), "unknown table: every view");
        assert!(
            concerns(&[], "public", "other"),
            "nothing declared: every table"
        );
    }

    #[test]
    fn a_change_reads_as_its_differences() {
        let c = change(
            "readings",
            vec![
                Difference::ColumnDropped {
                    column: "device".into(),
                },
                Difference::ColumnAdded {
                    column: "unit".into(),
                },
            ],
        );
        assert_eq!(
            c.to_string(),
            "public.readings: column device dropped, column unit added"
        );
        assert_eq!(
            change("readings", Vec::new()).to_string(),
            "public.readings: back as it was"
        );
    }
}
