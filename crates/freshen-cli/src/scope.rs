//! A view's scope: which tables it watches and which columns of each form its key.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use freshen::{Key, Op, RowEvent};
use freshen_codec::Redactor;

use crate::config::View;
use crate::shown_key::KeyDisplay;

/// Maps a row event to the keys it dirties in one view.
///
/// A key is taken from the new image and, where it differs, the old one (a row that
/// moves between scopes dirties both). An event that yields no key although it changed
/// a watched table is *unscoped*: typically a DELETE whose old image carries only the
/// primary key (PostgreSQL's default replica identity). It is counted and reported once
/// per table, because its scope will only be healed by a reconcile sweep.
#[derive(Debug)]
pub struct ViewScope {
    view: String,
    /// (schema, table, key columns) of the tables that carry the view's key; views
    /// watch a handful of tables, so a scan is fastest.
    tables: Vec<(String, String, Vec<String>)>,
    /// Events of the tables this view watches (the source delivers every view's).
    watched: AtomicU64,
    /// The same for fan-out entries (their columns give a parent key), in config order.
    parents: Vec<(String, String, Vec<String>)>,
    unscoped: AtomicU64,
    warned: Mutex<Vec<(String, String)>>,
    /// How its keys are shown outside the process (`[[redact]]`).
    shown: KeyDisplay,
}

impl ViewScope {
    /// The scope of `view`, its keys shown as they are.
    pub fn new(view: &View) -> Arc<ViewScope> {
        ViewScope::redacted(view, &Redactor::default())
    }

    /// The scope of `view`, its keys shown as `redact` hides their columns.
    pub fn redacted(view: &View, redact: &Redactor) -> Arc<ViewScope> {
        Arc::new(ViewScope {
            shown: KeyDisplay::new(view, redact),
            view: view.name.clone(),
            tables: view
                .direct()
                .map(|w| (w.schema.clone(), w.table.clone(), w.key.clone()))
                .collect(),
            parents: view
                .fanouts()
                .map(|w| (w.schema.clone(), w.table.clone(), w.key.clone()))
                .collect(),
            watched: AtomicU64::new(0),
            unscoped: AtomicU64::new(0),
            warned: Mutex::new(Vec::new()),
        })
    }

    /// `key` as `/status`, `/healthz`, the admin API and the logs may show it.
    pub fn show(&self, key: &Key) -> Key {
        self.shown.show(key)
    }

    /// Whether the view watches `schema.table`.
    pub fn watches(&self, schema: &str, table: &str) -> bool {
        self.tables
            .iter()
            .chain(&self.parents)
            .any(|(s, t, _)| s == schema && t == table)
    }

    /// Events of the tables this view watches.
    pub fn events(&self) -> u64 {
        self.watched.load(Relaxed)
    }

    /// Events of watched tables that gave no key.
    pub fn unscoped(&self) -> u64 {
        self.unscoped.load(Relaxed)
    }

    /// The keys `event` dirties.
    /// Runs inline on the receive path: no allocation beyond the keys themselves.
    pub fn keys(&self, event: &RowEvent) -> impl Iterator<Item = Key> + use<> {
        self.scoped(&self.tables, event)
    }

    /// The parent keys `event` dirties for fan-out entry `entry` (in the order of
    /// [`View::fanouts`]): old and new, like [`keys`](Self::keys).
    pub fn parent_keys(&self, entry: usize, event: &RowEvent) -> impl Iterator<Item = Key> + use<> {
        self.scoped(&self.parents[entry..=entry], event)
    }

    fn scoped(
        &self,
        tables: &[(String, String, Vec<String>)],
        event: &RowEvent,
    ) -> impl Iterator<Item = Key> + use<> {
        let columns = tables
            .iter()
            .find(|(s, t, _)| **s == *event.schema && **t == *event.table)
            .map(|(_, _, columns)| columns);
        if columns.is_some() {
            self.watched.fetch_add(1, Relaxed);
        }
        let mut keys = columns
            .map(|c| event.scope_keys(c))
            .into_iter()
            .flatten()
            .peekable();
        if let Some(columns) = columns
            && keys.peek().is_none()
            && event.op != Op::Truncate
        {
            self.unscoped.fetch_add(1, Relaxed);
            let table = (event.schema.to_string(), event.table.to_string());
            let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
            if !warned.contains(&table) {
                // A column missing from the new row was dropped (a schema change, reported
                // on its own); a missing former value is the replica identity's doing.
                let gone = event
                    .new
                    .as_ref()
                    .is_some_and(|row| columns.iter().any(|c| row.get(c).is_none()));
                if gone {
                    tracing::warn!(
                        view = %self.view,
                        table = %format_args!("{}.{}", table.0, table.1),
                        op = %event.op,
                        columns = %columns.join(", "),
                        "a change's row has no column the view keys on (was it dropped or renamed?), so its scope cannot be rebuilt until the column is back and a reconcile sweep runs"
                    );
                } else {
                    tracing::warn!(
                        view = %self.view,
                        table = %format_args!("{}.{}", table.0, table.1),
                        op = %event.op,
                        columns = %columns.join(", "),
                        "a change carried no value for the view's key columns, so its scope cannot be rebuilt until a reconcile sweep; \
                         set REPLICA IDENTITY FULL on the table (see `freshen check`)"
                    );
                }
                warned.push(table);
            }
        }
        keys
    }
}

/// Declares `view`'s tables and key columns (fan-out tables with the columns of their
/// parent key) to its refresher: a TRUNCATE or a gap sweeps the view only when it hits
/// one of them, and a schema change that drops or retypes one of those columns, or
/// renames the table, pauses the view until undone.
pub(crate) fn declare(view: &View, mut builder: freshen::Builder) -> freshen::Builder {
    for w in view.direct().chain(view.fanouts()) {
        let key: Vec<&str> = w.key.iter().map(String::as_str).collect();
        builder = builder.watches(&w.schema, &w.table, &key);
    }
    builder
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::{Timing, Watch};
    use freshen::{Row, Value};

    /// A view `v` watching `watch`, the rest defaulted (for tests of what reads views).
    pub(crate) fn view_with(watch: Vec<Watch>) -> View {
        View {
            name: "v".into(),
            watch,
            rebuild: vec!["SELECT $1".into()],
            query: None,
            rebuild_batch: None,
            keys_per_transaction: 16,
            rebuild_set: Vec::new(),
            reconcile: None,
            timing: Timing::default(),
            line: None,
            rebuild_line: None,
            static_tables: Vec::new(),
            key_names: Vec::new(),
        }
    }

    fn view() -> View {
        view_with(vec![
            Watch {
                schema: "public".into(),
                table: "readings".into(),
                key: vec!["device".into()],
                keys: None,
                fixed_key: false,
                line: None,
            },
            Watch {
                schema: "public".into(),
                table: "devices".into(),
                key: vec!["id".into()],
                keys: None,
                fixed_key: false,
                line: None,
            },
            Watch {
                schema: "public".into(),
                table: "plans".into(),
                key: vec!["id".into()],
                keys: Some("SELECT device FROM readings WHERE plan = $1".into()),
                fixed_key: false,
                line: None,
            },
        ])
    }

    #[test]
    fn a_fan_out_entry_gives_parent_keys_not_view_keys() {
        let s = ViewScope::new(&view());
        let p = RowEvent::new("public", "plans", Op::Update)
            .with_new(Row::from_pairs([("id", Value::Int(2))]))
            .with_old(Row::from_pairs([("id", Value::Int(1))]));
        assert_eq!(s.keys(&p).count(), 0, "a plan's id is not a device");
        assert_eq!(
            s.parent_keys(0, &p).collect::<Vec<_>>(),
            vec![Key::from("2"), Key::from("1")]
        );
        let r = RowEvent::new("public", "readings", Op::Insert)
            .with_new(Row::from_pairs([("device", Value::from("d1"))]));
        assert_eq!(s.parent_keys(0, &r).count(), 0);
        assert!(s.watches("public", "plans"));
    }

    #[test]
    fn each_table_uses_its_own_key_columns() {
        let s = ViewScope::new(&view());
        let r = RowEvent::new("public", "readings", Op::Insert).with_new(Row::from_pairs([
            ("device", Value::from("d1")),
            ("id", Value::Int(9)),
        ]));
        assert_eq!(s.keys(&r).collect::<Vec<_>>(), vec![Key::from("d1")]);
        let d = RowEvent::new("public", "devices", Op::Update)
            .with_new(Row::from_pairs([("id", Value::from("d2"))]))
            .with_old(Row::from_pairs([("id", Value::from("d3"))]));
        assert_eq!(
            s.keys(&d).collect::<Vec<_>>(),
            vec![Key::from("d2"), Key::from("d3")]
        );
        let other = RowEvent::new("public", "other", Op::Insert)
            .with_new(Row::from_pairs([("device", Value::from("d1"))]));
        for _ in 0..24 {
            assert_eq!(s.keys(&other).count(), 0);
        }
        assert_eq!(s.unscoped(), 0, "unwatched tables are not unscoped");
        assert_eq!(s.events(), 2, "only the watched tables' events count");
    }

    #[test]
    fn a_delete_without_the_key_column_is_counted() {
        let s = ViewScope::new(&view());
        let del = RowEvent::new("public", "readings", Op::Delete)
            .with_old(Row::from_pairs([("id", Value::Int(1))]));
        assert_eq!(s.keys(&del).count(), 0);
        assert_eq!(s.keys(&del).count(), 0);
        assert_eq!(s.unscoped(), 2);
    }
}
