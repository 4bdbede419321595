//! The row-change contract every source produces: `RowEvent`, `Row`, `Value`, `Op`.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::Key;

/// What happened to a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// A new row (`new` holds it).
    Insert,
    /// A changed row (`new` holds it; `old` holds what the source knows of the former row).
    Update,
    /// A removed row (`old` holds what the source knows of it).
    Delete,
    /// The whole table was emptied; no row images. Triggers a reconcile sweep.
    Truncate,
}

impl Op {
    /// Lower-case name: `insert`, `update`, `delete`, `truncate`.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Update => "update",
            Op::Delete => "delete",
            Op::Truncate => "truncate",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One column value of a row image.
///
/// `Unchanged` is not NULL: it is a value the source did not send because it did not
/// change (PostgreSQL's unchanged TOAST columns). Treating it as NULL would corrupt a
/// derived table, so it is its own variant.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// SQL NULL.
    Null,
    /// Not sent by the source because it did not change; the value itself is unknown here.
    Unchanged,
    /// A boolean.
    Bool(bool),
    /// An integer that fits in 64 bits.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// Text, and every type the source renders as text (numeric, dates, uuid, …).
    Text(Box<str>),
    /// A JSON document, as JSON text.
    Json(Box<str>),
    /// Raw bytes.
    Bytes(Box<[u8]>),
}

impl Value {
    /// Text value from anything string-like.
    pub fn text(s: impl Into<Box<str>>) -> Value {
        Value::Text(s.into())
    }

    /// Whether this is SQL NULL.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// Whether the source left this value out because it did not change.
    pub fn is_unchanged(&self) -> bool {
        matches!(self, Value::Unchanged)
    }

    /// The value as text, the form key parts take; `None` for NULL and unchanged values.
    ///
    /// Bytes render as PostgreSQL's hex form (`\x0a0b`).
    pub fn to_text(&self) -> Option<Cow<'_, str>> {
        match self {
            Value::Null | Value::Unchanged => None,
            Value::Bool(b) => Some(Cow::Borrowed(if *b { "true" } else { "false" })),
            Value::Int(i) => Some(Cow::Owned(i.to_string())),
            Value::Float(x) => Some(Cow::Owned(x.to_string())),
            Value::Text(s) | Value::Json(s) => Some(Cow::Borrowed(s)),
            Value::Bytes(b) => {
                let mut s = String::with_capacity(2 + 2 * b.len());
                s.push_str("\\x");
                for byte in b.iter() {
                    s.push_str(&format!("{byte:02x}"));
                }
                Some(Cow::Owned(s))
            }
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Text(s.into())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Text(s.into())
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Value {
        Value::Int(i)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}

impl From<f64> for Value {
    fn from(x: f64) -> Value {
        Value::Float(x)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::Null, Into::into)
    }
}

/// Column names shared by every row of one table version (cloning is a reference count).
pub type Columns = Arc<[Box<str>]>;

/// One row image: column names and their values, in table order.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    columns: Columns,
    values: Vec<Value>,
}

impl Row {
    /// A row from shared column names and one value per column.
    ///
    /// Surplus values (or columns) are ignored so that a malformed image can never
    /// index out of bounds; sources always pass equal lengths.
    pub fn new(columns: Columns, mut values: Vec<Value>) -> Row {
        debug_assert_eq!(columns.len(), values.len(), "one value per column");
        values.truncate(columns.len());
        Row { columns, values }
    }

    /// A row from `(column, value)` pairs.
    pub fn from_pairs<I, C, V>(pairs: I) -> Row
    where
        I: IntoIterator<Item = (C, V)>,
        C: Into<Box<str>>,
        V: Into<Value>,
    {
        let (columns, values): (Vec<Box<str>>, Vec<Value>) =
            pairs.into_iter().map(|(c, v)| (c.into(), v.into())).unzip();
        Row {
            columns: columns.into(),
            values,
        }
    }

    /// The value of `column`, if the image has that column.
    pub fn get(&self, column: &str) -> Option<&Value> {
        let i = self.columns.iter().position(|c| &**c == column)?;
        self.values.get(i)
    }

    /// Replaces the value of `column`; returns false when the image has no such column.
    pub fn set(&mut self, column: &str, value: Value) -> bool {
        match self.columns.iter().position(|c| &**c == column) {
            Some(i) if i < self.values.len() => {
                self.values[i] = value;
                true
            }
            _ => false,
        }
    }

    /// Column names, in order.
    pub fn columns(&self) -> &Columns {
        &self.columns
    }

    /// Values, in column order.
    pub fn values(&self) -> &[Value] {
        &self.values
    }

    /// Mutable values, in column order (sources fill unchanged values from the old image).
    pub fn values_mut(&mut self) -> &mut [Value] {
        &mut self.values
    }

    /// `(column, value)` pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.columns.iter().map(|c| &**c).zip(self.values.iter())
    }

    /// Number of columns in the image.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the image has no columns.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The key formed by `columns` of this image: `None` when a column is missing from
    /// the image or its value is unchanged (unknown). NULL values become NULL parts.
    pub fn key<S: AsRef<str>>(&self, columns: &[S]) -> Option<Key> {
        if let [only] = columns {
            let v = self.get(only.as_ref())?;
            return match v {
                Value::Unchanged => None,
                Value::Null => Some(Key::from_parts([None::<&str>])),
                v => Some(Key::new(v.to_text()?)),
            };
        }
        let mut parts: Vec<Option<Cow<'_, str>>> = Vec::with_capacity(columns.len());
        for c in columns {
            match self.get(c.as_ref())? {
                Value::Unchanged => return None,
                v => parts.push(v.to_text()),
            }
        }
        Some(Key::from_parts(parts))
    }
}

/// Where a row change sits in its source's transaction history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tx {
    /// The source's transaction id (PostgreSQL: the 64-bit `xid8`).
    pub id: u64,
    /// The commit's position in the source's log (PostgreSQL: the commit record's LSN).
    pub commit: u64,
    /// The change's index within its transaction, from 0.
    pub index: u32,
}

/// One row change, as every source reports it.
///
/// An event is a doorbell, not data: scope functions read it to find the keys it
/// dirties, and the rebuild recomputes those keys from the source tables.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RowEvent {
    /// Schema (PostgreSQL) or database (MySQL) of the table.
    pub schema: Arc<str>,
    /// Table name.
    pub table: Arc<str>,
    /// What happened.
    pub op: Op,
    /// Primary-key (or replica-identity) column names, in key order.
    pub pk_names: Columns,
    /// The row after the change (insert, update).
    pub new: Option<Row>,
    /// What the source knows of the row before the change (update, delete): the whole
    /// row, only its key columns, or nothing, depending on the source's configuration.
    pub old: Option<Row>,
    /// When the change committed at the source, if it says.
    pub commit_ts: Option<SystemTime>,
    /// Transaction metadata, when the source has it.
    pub tx: Option<Tx>,
}

impl RowEvent {
    /// An event with no row images; add them with the `with_*` methods.
    pub fn new(schema: impl Into<Arc<str>>, table: impl Into<Arc<str>>, op: Op) -> RowEvent {
        RowEvent {
            schema: schema.into(),
            table: table.into(),
            op,
            pk_names: Arc::from(Vec::new()),
            new: None,
            old: None,
            commit_ts: None,
            tx: None,
        }
    }

    /// Sets the new row image.
    pub fn with_new(mut self, row: Row) -> RowEvent {
        self.new = Some(row);
        self
    }

    /// Sets the old row image.
    pub fn with_old(mut self, row: Row) -> RowEvent {
        self.old = Some(row);
        self
    }

    /// Sets the primary-key column names.
    pub fn with_pk<I, S>(mut self, names: I) -> RowEvent
    where
        I: IntoIterator<Item = S>,
        S: Into<Box<str>>,
    {
        self.pk_names = names.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the commit time.
    pub fn with_commit_ts(mut self, ts: SystemTime) -> RowEvent {
        self.commit_ts = Some(ts);
        self
    }

    /// Sets the transaction metadata.
    pub fn with_tx(mut self, tx: Tx) -> RowEvent {
        self.tx = Some(tx);
        self
    }

    /// The scope keys this change dirties when the scope is `columns`: the key of the new
    /// image and, when it differs, the key of the old one — a row that moves between
    /// scopes dirties both. An unchanged value in the new image is taken from the old.
    ///
    /// Yields nothing for an image that lacks a column (for example a DELETE whose old
    /// image carries only the primary key): the source cannot say which scope it left.
    ///
    /// ```
    /// use freshen::{Op, Row, RowEvent};
    /// let moved = RowEvent::new("public", "readings", Op::Update)
    ///     .with_new(Row::from_pairs([("device", "b"), ("value", "1")]))
    ///     .with_old(Row::from_pairs([("device", "a"), ("value", "1")]));
    /// let keys: Vec<_> = moved.scope_keys(&["device"]).map(|k| k.to_string()).collect();
    /// assert_eq!(keys, ["b", "a"]);
    /// ```
    pub fn scope_keys<S: AsRef<str>>(&self, columns: &[S]) -> impl Iterator<Item = Key> + use<S> {
        let old = self.old.as_ref().and_then(|r| r.key(columns));
        let new = self.new.as_ref().and_then(|r| {
            r.key(columns).or_else(|| {
                // An unchanged key column keeps the old image's value.
                let old_row = self.old.as_ref()?;
                let mut filled = r.clone();
                for c in columns {
                    let c = c.as_ref();
                    if filled.get(c)?.is_unchanged() {
                        filled.set(c, old_row.get(c)?.clone());
                    }
                }
                filled.key(columns)
            })
        });
        let old = match (&new, old) {
            (Some(n), Some(o)) if *n == o => None,
            (_, o) => o,
        };
        new.into_iter().chain(old)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pairs: &[(&str, Value)]) -> Row {
        Row::from_pairs(pairs.iter().cloned())
    }

    #[test]
    fn unchanged_is_not_null() {
        assert_ne!(Value::Unchanged, Value::Null);
        assert!(Value::Unchanged.to_text().is_none());
        assert!(!Value::Unchanged.is_null());
    }

    #[test]
    fn text_forms() {
        assert_eq!(Value::Int(-3).to_text().unwrap(), "-3");
        assert_eq!(Value::Bool(true).to_text().unwrap(), "true");
        assert_eq!(
            Value::Bytes(vec![0, 171].into()).to_text().unwrap(),
            "\\x00ab"
        );
        assert_eq!(Value::from(None::<i64>), Value::Null);
    }

    #[test]
    fn row_key_single_and_composite() {
        let r = row(&[("a", Value::Int(1)), ("b", Value::Null), ("c", "x".into())]);
        assert_eq!(r.key(&["a"]), Some(Key::from("1")));
        assert_eq!(r.key(&["c", "b"]), Some(Key::from_parts([Some("x"), None])));
        assert_eq!(r.key(&["missing"]), None);
        assert_eq!(r.key(&["b"]), Some(Key::from_parts([None::<&str>])));
    }

    #[test]
    fn scope_keys_of_a_move_are_new_then_old() {
        let e = RowEvent::new("s", "t", Op::Update)
            .with_new(row(&[("d", "b".into())]))
            .with_old(row(&[("d", "a".into())]));
        let keys: Vec<Key> = e.scope_keys(&["d"]).collect();
        assert_eq!(keys, vec![Key::from("b"), Key::from("a")]);
    }

    #[test]
    fn scope_keys_same_scope_once() {
        let e = RowEvent::new("s", "t", Op::Update)
            .with_new(row(&[("d", "a".into()), ("v", Value::Int(2))]))
            .with_old(row(&[("d", "a".into()), ("v", Value::Int(1))]));
        assert_eq!(e.scope_keys(&["d"]).count(), 1);
    }

    #[test]
    fn scope_keys_fill_unchanged_from_old() {
        let e = RowEvent::new("s", "t", Op::Update)
            .with_new(row(&[("d", Value::Unchanged), ("v", Value::Int(2))]))
            .with_old(row(&[("d", "a".into()), ("v", Value::Int(1))]));
        assert_eq!(
            e.scope_keys(&["d"]).collect::<Vec<_>>(),
            vec![Key::from("a")]
        );
        let no_old = RowEvent::new("s", "t", Op::Update).with_new(row(&[("d", Value::Unchanged)]));
        assert_eq!(no_old.scope_keys(&["d"]).count(), 0);
    }

    #[test]
    fn delete_with_key_only_old_image_yields_nothing_for_other_columns() {
        let e = RowEvent::new("s", "t", Op::Delete).with_old(row(&[("id", Value::Int(7))]));
        assert_eq!(e.scope_keys(&["device"]).count(), 0);
        assert_eq!(
            e.scope_keys(&["id"]).collect::<Vec<_>>(),
            vec![Key::from("7")]
        );
    }
}
