//! Where a table's snapshot resumes, and how that position is kept.
//!
//! The position is the primary key of the last row read. Kept in the progress record
//! (the changefeed's store, `freshen_sink_snapshots`, `/changefeed/snapshot`,
//! `/status`), it would put a clear key wherever the record goes; so where a redaction
//! rule hides a primary-key column, the record holds it sealed
//! ([`freshen::plug::Redact::seal_position`]) and the clear key lives only in the
//! running driver's memory. Pure: no I/O.

use freshen::plug::Redact;

use crate::{SnapshotProgress, TableName};

/// A sealed position the rules cannot open (sealed by another process's key, or under
/// a hash key or rule that changed): the table is read again from its first row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unopened;

/// How one table's resume positions are kept: the redaction rules, the table and its
/// primary-key columns.
pub(crate) struct Resume<'a> {
    redact: Option<&'a dyn Redact>,
    table: &'a TableName,
    columns: Vec<&'a str>,
}

impl<'a> Resume<'a> {
    /// Positions of `table`, over its primary-key `columns` (in key order).
    pub(crate) fn new(
        redact: Option<&'a dyn Redact>,
        table: &'a TableName,
        columns: impl IntoIterator<Item = &'a str>,
    ) -> Resume<'a> {
        Resume {
            redact,
            table,
            columns: columns.into_iter().collect(),
        }
    }

    /// Records `key` in `p` as where its next chunk starts: sealed when a rule hides a
    /// key column, else in clear.
    pub(crate) fn keep(&self, p: &mut SnapshotProgress, key: Vec<String>) {
        let sealed = self.redact.and_then(|r| {
            r.seal_position(&self.table.schema, &self.table.name, &self.columns, &key)
        });
        match sealed {
            Some(token) => {
                p.after = None;
                p.after_sealed = Some(token);
            }
            None => {
                p.after = Some(key);
                p.after_sealed = None;
            }
        }
    }

    /// The key `p`'s next chunk starts after (`None`: its first row).
    pub(crate) fn of(&self, p: &SnapshotProgress) -> Result<Option<Vec<String>>, Unopened> {
        let Some(token) = &p.after_sealed else {
            return Ok(p.after.clone());
        };
        self.redact
            .and_then(|r| {
                r.open_position(&self.table.schema, &self.table.name, &self.columns, token)
            })
            .map(Some)
            .ok_or(Unopened)
    }

    /// Whether `p` holds in clear a position these rules keep sealed (a record stored
    /// before the rule, or by an earlier version).
    pub(crate) fn exposed(&self, p: &SnapshotProgress) -> bool {
        let Some(after) = &p.after else {
            return false;
        };
        let mut probe = p.clone();
        self.keep(&mut probe, after.clone());
        probe.after.is_none()
    }
}

#[cfg(test)]
mod tests {
    use freshen::RowEvent;

    use super::*;

    /// Seals positions of `people` by reversing them behind a prefix (the codec's
    /// sealing is tested there): enough to tell sealed from clear here.
    #[derive(Debug)]
    struct Reverse;

    impl Redact for Reverse {
        fn apply(&self, _: &RowEvent) -> Option<RowEvent> {
            None
        }

        fn seal_position(
            &self,
            _: &str,
            table: &str,
            _: &[&str],
            position: &[String],
        ) -> Option<String> {
            (table == "people").then(|| format!("sealed:{}", position.join(",")))
        }

        fn open_position(&self, _: &str, table: &str, _: &[&str], t: &str) -> Option<Vec<String>> {
            let rest = t.strip_prefix("sealed:")?;
            (table == "people").then(|| rest.split(',').map(str::to_owned).collect())
        }
    }

    fn key(k: &str) -> Vec<String> {
        vec![k.to_owned()]
    }

    #[test]
    fn a_covered_key_is_kept_sealed_and_read_back() {
        let t = TableName::new("public", "people");
        let r = Resume::new(Some(&Reverse), &t, ["id"]);
        let mut p = SnapshotProgress::new(&t.schema, &t.name, 0);
        r.keep(&mut p, key("SSN-1"));
        assert_eq!(p.after, None);
        assert_eq!(p.after_sealed.as_deref(), Some("sealed:SSN-1"));
        assert_eq!(r.of(&p), Ok(Some(key("SSN-1"))));
        assert!(!r.exposed(&p));
        p.after_sealed = Some("another process's".to_owned());
        assert_eq!(r.of(&p), Err(Unopened));
    }

    #[test]
    fn an_uncovered_key_stays_clear() {
        let t = TableName::new("public", "orders");
        for redact in [None, Some(&Reverse as &dyn Redact)] {
            let r = Resume::new(redact, &t, ["id"]);
            let mut p = SnapshotProgress::new(&t.schema, &t.name, 0);
            assert_eq!(r.of(&p), Ok(None));
            r.keep(&mut p, key("7"));
            assert_eq!(
                (p.after.clone(), p.after_sealed.clone()),
                (Some(key("7")), None)
            );
            assert_eq!(r.of(&p), Ok(Some(key("7"))));
            assert!(!r.exposed(&p));
        }
    }

    #[test]
    fn a_clear_record_of_a_covered_table_is_exposed_until_sealed() {
        let t = TableName::new("public", "people");
        let r = Resume::new(Some(&Reverse), &t, ["id"]);
        let mut p = SnapshotProgress::new(&t.schema, &t.name, 0);
        p.after = Some(key("SSN-1"));
        assert!(r.exposed(&p));
        assert_eq!(
            r.of(&p),
            Ok(Some(key("SSN-1"))),
            "an old record still resumes"
        );
        r.keep(&mut p, key("SSN-1"));
        assert!(!r.exposed(&p));
    }

    #[test]
    fn a_finished_snapshot_keeps_no_position() {
        let t = TableName::new("public", "people");
        let mut p = SnapshotProgress::new(&t.schema, &t.name, 0);
        p.after = Some(key("SSN-1"));
        assert!(!p.scrub_finished(), "a running snapshot keeps its position");
        p.state = crate::SnapshotState::Done;
        assert!(p.scrub_finished());
        assert_eq!((p.after.clone(), p.after_sealed.clone()), (None, None));
        assert!(!p.scrub_finished());
        let mut q = SnapshotProgress::new(&t.schema, &t.name, 0);
        q.after_sealed = Some("x".to_owned());
        q.finish(5);
        assert_eq!(
            (q.state, q.finished_ms, q.after_sealed),
            (crate::SnapshotState::Done, Some(5), None)
        );
    }
}
