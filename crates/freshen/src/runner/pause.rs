//! `Pauses`: what the view knows of its tables' shapes — the tables (and key columns)
//! it watches, the schema changes that broke its key and pause it, the batches that
//! arrived meanwhile, and the gaps (rows changed that the stream did not carry).
//!
//! While any table is paused no rebuild and no sweep starts. Batches received
//! meanwhile stay held: their changes may have lost their key with the column, so they
//! wait for the sweep that follows the resume (see the run loop's `resume`).

use std::collections::BTreeMap;

use super::Reporter;
use crate::ack::BatchId;
use crate::schema::{Watched, breaking, concerns};
use crate::stats::Recorder;
use crate::{Gap, Report, SchemaChange};

/// A table: its schema and its name.
type Table = (Box<str>, Box<str>);

pub(super) struct Pauses {
    /// Tables (with the columns) the view declared; empty: every table concerns it.
    watched: Vec<Watched>,
    /// Tables whose schema change broke the view's key, and what broke: while any is
    /// here no rebuild starts.
    paused: BTreeMap<Table, Vec<String>>,
    /// Batches received while paused: their changes may have lost their key with the
    /// column, so they wait for the sweep that follows the resume.
    paused_holds: Vec<BatchId>,
    /// Tables whose gap was reported since the last sweep ended (one report per table).
    gaps_reported: Vec<Table>,
    /// Gaps no sweep heals (the view has none), by table, with what the stream left
    /// out: reported as trouble until a person acknowledges them.
    unhealed: BTreeMap<Table, Box<str>>,
}

impl Pauses {
    pub(super) fn new(watched: Vec<Watched>) -> Pauses {
        Pauses {
            watched,
            paused: BTreeMap::new(),
            paused_holds: Vec::new(),
            gaps_reported: Vec::new(),
            unhealed: BTreeMap::new(),
        }
    }

    /// Whether `schema.table` concerns the view.
    pub(super) fn concerns(&self, schema: &str, table: &str) -> bool {
        concerns(&self.watched, schema, table)
    }

    /// Whether a schema change broke the view's key (no rebuild or sweep starts).
    pub(super) fn is_paused(&self) -> bool {
        !self.paused.is_empty()
    }

    /// Holds `batch`, received while paused, until the sweep after the resume.
    pub(super) fn hold(&mut self, batch: BatchId) {
        self.paused_holds.push(batch);
    }

    /// The batches received while paused (the last pause ended).
    pub(super) fn take_holds(&mut self) -> Vec<BatchId> {
        std::mem::take(&mut self.paused_holds)
    }

    /// A table's shape changed: pause the view when the change breaks its key, resume it
    /// when a later change undoes that. True when the last pause ended: the caller
    /// resumes.
    pub(super) fn on_schema_change(
        &mut self,
        change: &SchemaChange,
        st: &Recorder,
        reporter: &Reporter,
    ) -> bool {
        if !concerns(&self.watched, &change.schema, &change.table) {
            return false;
        }
        Recorder::add(&st.schema_changes, 1);
        let table = (change.schema.clone(), change.table.clone());
        let broken = breaking(&self.watched, change);
        if !broken.is_empty() {
            reporter.report(Report::Paused {
                change,
                breaking: &broken,
            });
            self.paused.insert(table, broken);
            self.publish_paused(st);
        } else if self.paused.remove(&table).is_some() {
            let still_paused = !self.paused.is_empty();
            reporter.report(Report::Resumed {
                change,
                still_paused,
            });
            self.publish_paused(st);
            if !still_paused {
                return true;
            }
        } else {
            reporter.report(Report::SchemaChanged { change });
        }
        false
    }

    /// A gap no sweep will heal: nothing will find the keys it dirtied, so the view says
    /// so until a person acts, and never looks healthy meanwhile.
    pub(super) fn unhealed(&mut self, gap: &Gap, st: &Recorder) {
        self.unhealed
            .insert((gap.schema.clone(), gap.table.clone()), gap.reason.clone());
        self.publish_unhealed(st);
    }

    /// Whether `gap` is its table's first since the last sweep ended (it is reported;
    /// later ones are not).
    pub(super) fn first_gap(&mut self, gap: &Gap) -> bool {
        let table = (gap.schema.clone(), gap.table.clone());
        if !self.gaps_reported.contains(&table) {
            self.gaps_reported.push(table);
            return true;
        }
        false
    }

    /// A sweep ended: the next gap of each table is reported again.
    pub(super) fn swept(&mut self) {
        self.gaps_reported.clear();
    }

    /// A person saw these lines of the unhealed gaps: they are dropped.
    pub(super) fn acknowledge_gaps(&mut self, seen: &[String], st: &Recorder) {
        self.unhealed
            .retain(|t, why| !seen.contains(&unhealed_line(t, why)));
        self.publish_unhealed(st);
    }

    fn publish_paused(&self, st: &Recorder) {
        let lines: Vec<String> = self
            .paused
            .iter()
            .map(|((schema, table), why)| format!("{schema}.{table}: {}", why.join(", ")))
            .collect();
        st.trouble(|t| t.paused = lines);
    }

    fn publish_unhealed(&self, st: &Recorder) {
        let lines = self
            .unhealed
            .iter()
            .map(|(t, why)| unhealed_line(t, why))
            .collect();
        st.trouble(|t| t.unhealed_gaps = lines);
    }
}

/// How an unhealed gap reads in [`Stats::unhealed_gaps`](crate::Stats::unhealed_gaps):
/// the gap's own text.
fn unhealed_line((schema, table): &(Box<str>, Box<str>), why: &str) -> String {
    Gap::new(schema.clone(), table.clone(), why).to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::Difference;
    use crate::ack::AckTracker;

    /// A reporter that keeps every line.
    fn reporter() -> (Reporter, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        let f: crate::parts::ReportFn =
            Arc::new(move |r: &Report<'_>| l.lock().unwrap().push(r.to_string()));
        (Reporter(Some(f)), lines)
    }

    fn orders() -> Pauses {
        Pauses::new(vec![Watched {
            schema: "public".into(),
            table: "orders".into(),
            key: vec!["customer_id".into()],
        }])
    }

    fn change(table: &str, differences: Vec<Difference>) -> SchemaChange {
        SchemaChange {
            schema: "public".into(),
            table: table.into(),
            differences,
        }
    }

    fn dropped(column: &str) -> Difference {
        Difference::ColumnDropped {
            column: column.into(),
        }
    }

    #[test]
    fn a_view_that_declared_nothing_is_concerned_by_every_table() {
        let p = Pauses::new(Vec::new());
        assert!(p.concerns("public", "anything"));
        let p = orders();
        assert!(p.concerns("public", "orders"));
        assert!(!p.concerns("public", "other"));
        assert!(
            p.concerns("public", ""),
            "an unknown table concerns every view"
        );
    }

    #[test]
    fn a_broken_key_pauses_until_undone_and_only_then_resumes() {
        let (r, lines) = reporter();
        let st = Recorder::new();
        let mut p = orders();
        let broken = change("orders", vec![dropped("customer_id")]);
        assert!(!p.on_schema_change(&broken, &st, &r));
        assert!(p.is_paused());
        assert_eq!(
            st.snapshot().paused,
            vec!["public.orders: column customer_id dropped"]
        );
        let mut tracker = AckTracker::new();
        let held = tracker.receive(());
        p.hold(held);
        assert!(!p.on_schema_change(&change("other", vec![dropped("x")]), &st, &r));
        let added = change(
            "orders",
            vec![Difference::ColumnAdded {
                column: "note".into(),
            }],
        );
        assert!(p.on_schema_change(&added, &st, &r), "the last pause ended");
        assert!(!p.is_paused());
        assert!(st.snapshot().paused.is_empty());
        assert_eq!(p.take_holds(), vec![held]);
        assert!(p.take_holds().is_empty());
        assert!(!p.on_schema_change(&added, &st, &r), "nothing to resume");
        assert_eq!(
            st.snapshot().schema_changes,
            3,
            "the other table is not counted"
        );
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].contains("paused"), "{}", lines[0]);
        assert!(lines[1].contains("resumed"), "{}", lines[1]);
    }

    #[test]
    fn a_gap_is_reported_once_per_table_until_a_sweep_ends() {
        let mut p = orders();
        let gap = Gap::new("public", "orders", "binlog_row_image=MINIMAL");
        assert!(p.first_gap(&gap));
        assert!(!p.first_gap(&gap));
        assert!(p.first_gap(&Gap::new("public", "other", "x")));
        p.swept();
        assert!(p.first_gap(&gap));
    }

    #[test]
    fn unhealed_gaps_stay_until_a_person_acknowledges_the_lines_seen() {
        let st = Recorder::new();
        let mut p = orders();
        p.unhealed(&Gap::new("public", "orders", "minimal image"), &st);
        p.unhealed(&Gap::new("", "", "a truncated stream"), &st);
        let seen = st.snapshot().unhealed_gaps;
        assert_eq!(
            seen,
            vec![
                "an unknown table: a truncated stream",
                "public.orders: minimal image"
            ]
        );
        p.unhealed(&Gap::new("public", "orders", "another reason"), &st);
        p.acknowledge_gaps(&seen, &st);
        assert_eq!(
            st.snapshot().unhealed_gaps,
            vec!["public.orders: another reason"],
            "a gap that arrived later is reported anew"
        );
    }
}
