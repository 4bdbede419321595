//! `Shapes`: how each watched table looked when the stream first described it, and what
//! a later Relation message changed about it. Pure, no I/O.
//!
//! pgoutput sends a Relation message before the first change to a table in a session
//! and again before the first change after its definition changed: a dropped column is
//! seen only when a row of that table next changes, never at the `ALTER TABLE` itself.
//! Each Relation is compared with the table's first shape in this process — read from
//! the catalog at start, else the first Relation — (not with the previous message), so a change that undoes an earlier one (the column added back
//! with its type) reports no difference, and a reconnect that resends an unchanged
//! relation reports nothing.

use std::collections::HashMap;

use freshen::{Difference, SchemaChange};

use crate::capture::pgoutput::Relation;

/// A watched table as the catalog describes it at start: its OID, its name, and its
/// columns (name, type OID) in table order.
pub(crate) type StartShape = (u32, crate::TableName, Vec<(String, u32)>);

/// A table's name and columns (name, type OID), in table order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shape {
    schema: String,
    name: String,
    columns: Vec<(String, u32)>,
}

impl Shape {
    fn of(r: &Relation) -> Shape {
        Shape {
            schema: r.namespace.clone(),
            name: r.name.clone(),
            columns: r
                .columns
                .iter()
                .map(|c| (c.name.clone(), c.type_oid))
                .collect(),
        }
    }
}

#[derive(Debug)]
struct Known {
    first: Shape,
    /// The differences last reported (none at first sight).
    reported: Vec<Difference>,
}

/// The first shape of every watched relation, by OID, and what was last reported.
#[derive(Debug, Default)]
pub(crate) struct Shapes {
    by_oid: HashMap<u32, Known>,
}

impl Shapes {
    /// Records how a watched table looked at start (from the catalog): pgoutput
    /// describes a table only before its first change, which may already follow a
    /// change made while freshen was running.
    pub(crate) fn seed(&mut self, oid: u32, schema: &str, name: &str, columns: Vec<(String, u32)>) {
        self.by_oid.insert(
            oid,
            Known {
                first: Shape {
                    schema: schema.to_string(),
                    name: name.to_string(),
                    columns,
                },
                reported: Vec::new(),
            },
        );
    }

    /// Whether the relation with `oid` was seen (or seeded) before.
    pub(crate) fn knows(&self, oid: u32) -> bool {
        self.by_oid.contains_key(&oid)
    }

    /// Records `r`; returns the change to report when its differences from the
    /// table's first shape are not the ones last reported. `watched` says whether the
    /// table, under its first name, is one the source delivers (others are not tracked).
    pub(crate) fn observe(
        &mut self,
        r: &Relation,
        watched: impl FnOnce(&str, &str) -> bool,
    ) -> Option<SchemaChange> {
        let now = Shape::of(r);
        let known = match self.by_oid.get_mut(&r.oid) {
            Some(k) => k,
            None => {
                if watched(&now.schema, &now.name) {
                    self.by_oid.insert(
                        r.oid,
                        Known {
                            first: now,
                            reported: Vec::new(),
                        },
                    );
                }
                return None;
            }
        };
        let differences = differences(&known.first, &now);
        if differences == known.reported {
            return None;
        }
        known.reported = differences.clone();
        Some(SchemaChange {
            schema: known.first.schema.as_str().into(),
            table: known.first.name.as_str().into(),
            differences,
        })
    }
}

/// Every way `now` differs from `first`: renamed, columns dropped, retyped, added.
fn differences(first: &Shape, now: &Shape) -> Vec<Difference> {
    let mut out = Vec::new();
    if (&first.schema, &first.name) != (&now.schema, &now.name) {
        out.push(Difference::Renamed {
            schema: now.schema.as_str().into(),
            table: now.name.as_str().into(),
        });
    }
    for (name, was) in &first.columns {
        match now.columns.iter().find(|(n, _)| n == name) {
            None => out.push(Difference::ColumnDropped {
                column: name.as_str().into(),
            }),
            Some((_, ty)) if ty != was => out.push(Difference::ColumnRetyped {
                column: name.as_str().into(),
                was: type_name(*was).into(),
                now: type_name(*ty).into(),
            }),
            Some(_) => {}
        }
    }
    for (name, _) in &now.columns {
        if !first.columns.iter().any(|(n, _)| n == name) {
            out.push(Difference::ColumnAdded {
                column: name.as_str().into(),
            });
        }
    }
    out
}

/// A built-in type's name, else its OID (a Relation message carries only OIDs).
fn type_name(oid: u32) -> String {
    let name = match oid {
        16 => "boolean",
        17 => "bytea",
        20 => "bigint",
        21 => "smallint",
        23 => "integer",
        25 => "text",
        700 => "real",
        701 => "double precision",
        1043 => "varchar",
        1082 => "date",
        1114 => "timestamp",
        1184 => "timestamptz",
        1700 => "numeric",
        2950 => "uuid",
        3802 => "jsonb",
        114 => "json",
        _ => return format!("type {oid}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::pgoutput::RelationColumn;

    fn rel(oid: u32, name: &str, columns: &[(&str, u32)]) -> Relation {
        Relation {
            oid,
            namespace: "public".into(),
            name: name.into(),
            replica_identity: b'd',
            columns: columns
                .iter()
                .map(|(n, t)| RelationColumn {
                    key: *n == "id",
                    name: (*n).into(),
                    type_oid: *t,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    fn all(_: &str, _: &str) -> bool {
        true
    }

    #[test]
    fn a_drop_is_reported_once_and_its_undoing_once() {
        let mut s = Shapes::default();
        let first = [("id", 23), ("device", 25), ("value", 23)];
        assert_eq!(s.observe(&rel(7, "readings", &first), all), None);
        assert_eq!(s.observe(&rel(7, "readings", &first), all), None, "resent");
        let dropped = [("id", 23), ("value", 23)];
        let c = s.observe(&rel(7, "readings", &dropped), all).unwrap();
        assert_eq!((&*c.schema, &*c.table), ("public", "readings"));
        assert_eq!(
            c.differences,
            [Difference::ColumnDropped {
                column: "device".into()
            }]
        );
        assert_eq!(s.observe(&rel(7, "readings", &dropped), all), None, "once");
        // Added back (at the end, as ADD COLUMN does) with the same type: no difference.
        let back = [("id", 23), ("value", 23), ("device", 25)];
        let c = s.observe(&rel(7, "readings", &back), all).unwrap();
        assert!(c.differences.is_empty(), "{c}");
        assert_eq!(s.observe(&rel(7, "readings", &back), all), None);
    }

    #[test]
    fn retyped_renamed_and_added_columns() {
        let mut s = Shapes::default();
        s.observe(&rel(7, "readings", &[("id", 23), ("device", 25)]), all);
        let c = s
            .observe(
                &rel(7, "gauges", &[("id", 20), ("device", 25), ("unit", 25)]),
                all,
            )
            .unwrap();
        assert_eq!(
            c.to_string(),
            "public.readings: renamed to public.gauges, column id retyped from integer to bigint, column unit added"
        );
    }

    #[test]
    fn a_seeded_shape_catches_a_drop_before_the_first_relation() {
        let mut s = Shapes::default();
        s.seed(
            7,
            "public",
            "readings",
            vec![("id".into(), 23), ("device".into(), 25)],
        );
        let c = s.observe(&rel(7, "readings", &[("id", 23)]), all).unwrap();
        assert_eq!(c.to_string(), "public.readings: column device dropped");
    }

    #[test]
    fn unwatched_tables_are_not_tracked() {
        let mut s = Shapes::default();
        let none = |_: &str, _: &str| false;
        s.observe(&rel(8, "other", &[("id", 23)]), none);
        assert_eq!(s.observe(&rel(8, "other", &[]), none), None);
        assert_eq!(
            s.observe(&rel(8, "other", &[]), all),
            None,
            "first sight now"
        );
    }
}
