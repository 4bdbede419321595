//! Which watched tables a publication covers, and by which catalog entry: a table that
//! left the publication and came back (dropped and re-added, by a person or by freshen's
//! own re-extension at start) had its changes of that window filtered out of the stream
//! for good. Decoding applies the publication as it was when each change was written, so
//! nothing replays them: the window is a [`Gap`](freshen::Gap).
//!
//! A table's *entry* tells a stay from a return, even when both samples see it covered:
//!
//! ```text
//!   sample n-1                 sample n                   gap?
//!   ─────────────────────────  ─────────────────────────  ──────────────────────────────
//!   covered by entry e         covered by entry e         no  (it stayed)
//!   covered by entry e         covered by entry f ≠ e     yes (it left and came back
//!                                                              between the samples)
//!   not covered                covered                    yes (it came back)
//!   covered                    not covered                no  (reported as missing
//!                                                              while it lasts)
//!   (first sample)             anything                   no  (the start decides that)
//! ```
//!
//! The entry of a table listed by name is its `pg_publication_rel` row (a new row each
//! time it is added); one covered through `FOR ALL TABLES` or `TABLES IN SCHEMA` has the
//! publication's own oid (a publication dropped and created again is a new one).

use std::collections::BTreeMap;

use crate::TableName;

/// What identifies the catalog entry that puts a table into the publication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// `pg_publication.oid`.
    pub(crate) publication: u32,
    /// `pg_publication_rel.oid` when the table is listed by name; 0 otherwise.
    pub(crate) rel: u32,
}

/// Each watched table's entry; `None` when the publication does not cover it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Membership(pub(crate) BTreeMap<TableName, Option<Entry>>);

impl Membership {
    /// The tables covered in `now` that were not covered by the same entry here: those
    /// whose changes of some window never reached the stream.
    pub(crate) fn regained(&self, now: &Membership) -> Vec<TableName> {
        now.0
            .iter()
            .filter_map(|(t, entry)| {
                let entry = (*entry)?;
                let before = self.0.get(t).copied().flatten();
                (before != Some(entry)).then(|| t.clone())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> TableName {
        TableName::new("public", name)
    }

    fn of(entries: &[(&str, Option<(u32, u32)>)]) -> Membership {
        Membership(
            entries
                .iter()
                .map(|(n, e)| (t(n), e.map(|(publication, rel)| Entry { publication, rel })))
                .collect(),
        )
    }

    #[test]
    fn a_table_that_stayed_is_no_gap() {
        let m = of(&[("a", Some((1, 10))), ("b", Some((1, 0)))]);
        assert!(m.regained(&m.clone()).is_empty());
    }

    #[test]
    fn a_table_back_after_a_sample_without_it_is_a_gap() {
        let before = of(&[("a", None), ("b", Some((1, 11)))]);
        let now = of(&[("a", Some((1, 12))), ("b", Some((1, 11)))]);
        assert_eq!(before.regained(&now), [t("a")]);
    }

    #[test]
    fn a_table_dropped_and_added_between_two_samples_is_a_gap() {
        let before = of(&[("a", Some((1, 10)))]);
        let now = of(&[("a", Some((1, 13)))]);
        assert_eq!(before.regained(&now), [t("a")]);
    }

    #[test]
    fn a_publication_created_again_is_a_gap_for_every_table_it_covers() {
        let before = of(&[("a", Some((1, 0))), ("b", Some((1, 0)))]);
        let now = of(&[("a", Some((2, 0))), ("b", None)]);
        assert_eq!(before.regained(&now), [t("a")]);
    }

    #[test]
    fn a_table_leaving_is_no_gap_yet() {
        let before = of(&[("a", Some((1, 10)))]);
        let now = of(&[("a", None)]);
        assert!(
            before.regained(&now).is_empty(),
            "it is reported as missing"
        );
        assert!(
            now.regained(&now.clone()).is_empty(),
            "and stays so while it is out"
        );
    }
}
