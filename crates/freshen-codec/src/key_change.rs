//! Primary-key changes: an UPDATE that moves a row to another key is, for anyone who
//! keeps state by key, the end of the old key and the start of the new one.
//!
//! Both encoders that key their output (the changefeed's `table:pk`, Debezium's key
//! object) split such an UPDATE the same way, with [`split_key_change`]: a DELETE of
//! the old key followed by an INSERT of the new one, both carrying the original event's
//! transaction position, so that a consumer replaying by key ends with the new key only.

use freshen::{Op, RowEvent, Value};

/// The two halves of a primary-key change, in the order they are published.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyChange {
    /// A DELETE of the old key: `old` is the event's old image (the key columns under
    /// PostgreSQL's default replica identity, the whole row under FULL), no new image.
    pub delete: RowEvent,
    /// An INSERT of the new key: the event's new image, no old image.
    pub insert: RowEvent,
}

/// `column`'s value in the event's new image, falling back to the old image where the
/// new one left it unchanged or lacks it.
fn new_value<'e>(e: &'e RowEvent, column: &str) -> Option<&'e Value> {
    e.new
        .as_ref()
        .and_then(|r| r.get(column))
        .filter(|v| !v.is_unchanged())
        .or_else(|| e.old.as_ref().and_then(|r| r.get(column)))
}

/// Whether `event` is an UPDATE whose primary key differs between its old and new
/// images. Needs both images with every key column known; an UPDATE without an old
/// image (PostgreSQL sends none when the key did not change) is not a key change.
///
/// ```
/// use freshen::{Op, Row, RowEvent, Value};
/// use freshen_codec::changes_key;
/// let renamed = RowEvent::new("public", "users", Op::Update)
///     .with_pk(["id"])
///     .with_old(Row::from_pairs([("id", Value::text("alice"))]))
///     .with_new(Row::from_pairs([("id", Value::text("alice-renamed")), ("n", Value::Int(1))]));
/// assert!(changes_key(&renamed));
/// ```
pub fn changes_key(event: &RowEvent) -> bool {
    if event.op != Op::Update || event.pk_names.is_empty() {
        return false;
    }
    let Some(old) = event.old.as_ref() else {
        return false;
    };
    let mut differs = false;
    for column in event.pk_names.iter() {
        let (Some(before), Some(after)) = (
            old.get(column).filter(|v| !v.is_unchanged()),
            new_value(event, column),
        ) else {
            // An unknown key part: nothing says the key moved.
            return false;
        };
        differs |= before != after;
    }
    differs
}

/// Splits a primary-key change into a DELETE of the old key and an INSERT of the new
/// one; `None` for every other event. The INSERT's new image takes key columns the
/// source left unchanged from the old image.
pub fn split_key_change(event: &RowEvent) -> Option<KeyChange> {
    if !changes_key(event) {
        return None;
    }
    let mut delete = event.clone();
    delete.op = Op::Delete;
    delete.new = None;
    let mut insert = event.clone();
    insert.op = Op::Insert;
    insert.old = None;
    if let (Some(new), Some(old)) = (insert.new.as_mut(), event.old.as_ref()) {
        for column in event.pk_names.iter() {
            if new.get(column).is_some_and(Value::is_unchanged)
                && let Some(v) = old.get(column)
            {
                new.set(column, v.clone());
            }
        }
    }
    Some(KeyChange { delete, insert })
}

#[cfg(test)]
mod tests {
    use super::*;
    use freshen::{Row, Tx};

    fn update(old: &[(&str, Value)], new: &[(&str, Value)]) -> RowEvent {
        RowEvent::new("s", "t", Op::Update)
            .with_pk(["a", "b"])
            .with_old(Row::from_pairs(old.iter().cloned()))
            .with_new(Row::from_pairs(new.iter().cloned()))
            .with_tx(Tx {
                id: 9,
                commit: 100,
                index: 3,
            })
    }

    #[test]
    fn a_moved_key_splits_into_delete_then_insert() {
        let e = update(
            &[("a", Value::Int(1)), ("b", Value::text("x"))],
            &[
                ("a", Value::Int(2)),
                ("b", Value::Unchanged),
                ("body", Value::Unchanged),
            ],
        );
        let KeyChange { delete, insert } = split_key_change(&e).expect("a key change");
        assert_eq!(delete.op, Op::Delete);
        assert!(delete.new.is_none());
        assert_eq!(delete.old, e.old);
        assert_eq!(insert.op, Op::Insert);
        assert!(insert.old.is_none());
        let new = insert.new.as_ref().unwrap();
        assert_eq!(new.get("a"), Some(&Value::Int(2)));
        assert_eq!(
            new.get("b"),
            Some(&Value::text("x")),
            "unchanged key part filled"
        );
        assert_eq!(
            new.get("body"),
            Some(&Value::Unchanged),
            "other columns kept"
        );
        assert_eq!((delete.tx, insert.tx), (e.tx, e.tx));
    }

    #[test]
    fn same_key_or_unknown_key_is_no_key_change() {
        let same = update(
            &[("a", Value::Int(1)), ("b", Value::text("x"))],
            &[("a", Value::Int(1)), ("b", Value::Unchanged)],
        );
        assert!(!changes_key(&same));
        let unknown = update(&[("a", Value::Int(1))], &[("a", Value::Int(2))]);
        assert!(!changes_key(&unknown), "b is unknown in both images");
        let mut no_old = same.clone();
        no_old.old = None;
        assert!(split_key_change(&no_old).is_none());
        let mut insert = same;
        insert.op = Op::Insert;
        assert!(!changes_key(&insert));
    }
}
