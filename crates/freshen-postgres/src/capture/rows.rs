//! From pgoutput tuples to freshen rows: the relation cache and the type mapping.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use freshen::{Columns, Row, Value};

use crate::TableName;
use crate::capture::pgoutput::{Datum, Relation, Tuple};

/// Built-in type OIDs that map to something other than text.
mod oid {
    pub(super) const BOOL: u32 = 16;
    pub(super) const BYTEA: u32 = 17;
    pub(super) const INT8: u32 = 20;
    pub(super) const INT2: u32 = 21;
    pub(super) const INT4: u32 = 23;
    pub(super) const JSON: u32 = 114;
    pub(super) const FLOAT4: u32 = 700;
    pub(super) const FLOAT8: u32 = 701;
    pub(super) const JSONB: u32 = 3802;
}

/// One table as the stream describes it, with everything an event needs shared.
#[derive(Debug)]
pub(crate) struct Table {
    pub(crate) schema: Arc<str>,
    pub(crate) name: Arc<str>,
    pub(crate) columns: Columns,
    /// Replica identity key columns, in table order: what a key-only former image holds.
    pub(crate) key_columns: Columns,
    /// `pk_names` of every event: the identity key, except under REPLICA IDENTITY FULL,
    /// where pgoutput flags every column as key and the table's primary key is used.
    pub(crate) pk_names: Columns,
    key_positions: Vec<usize>,
    types: Vec<u32>,
    /// Whether the source delivers this table's changes.
    pub(crate) watched: bool,
}

/// Relations by OID, replaced when the server resends one (after `ALTER TABLE`).
#[derive(Debug, Default)]
pub(crate) struct Relations {
    by_oid: HashMap<u32, Table>,
    /// `None`: every table is watched.
    watched: Option<HashSet<TableName>>,
    /// Tables watched by pattern (whole schemas, names, all), those created later too.
    patterns: Vec<crate::TablePattern>,
    /// Primary keys of tables whose identity is FULL.
    primary_keys: HashMap<TableName, Vec<String>>,
}

impl Relations {
    pub(crate) fn new(watched: Option<HashSet<TableName>>) -> Relations {
        Relations {
            by_oid: HashMap::new(),
            watched,
            patterns: Vec::new(),
            primary_keys: HashMap::new(),
        }
    }

    /// Watches every table `patterns` select too, those created later included.
    pub(crate) fn with_patterns(mut self, patterns: Vec<crate::TablePattern>) -> Relations {
        self.patterns = patterns;
        self
    }

    /// Whether `table` is watched through a pattern only (not listed by name): a table
    /// first seen in the stream is then one the source discovered.
    pub(crate) fn by_pattern(&self, table: &TableName) -> bool {
        crate::select::any_matches(&self.patterns, table)
            && !self.watched.as_ref().is_some_and(|w| w.contains(table))
    }

    /// The primary keys to name as `pk_names` for tables with REPLICA IDENTITY FULL.
    pub(crate) fn with_primary_keys(mut self, keys: HashMap<TableName, Vec<String>>) -> Relations {
        self.primary_keys = keys;
        self
    }

    pub(crate) fn upsert(&mut self, r: Relation) {
        let table_name = TableName {
            schema: r.namespace.clone(),
            name: r.name.clone(),
        };
        let watched = self.is_watched(&table_name);
        let columns: Columns = r
            .columns
            .iter()
            .map(|c| Box::from(c.name.as_str()))
            .collect();
        let key_positions: Vec<usize> = r
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.key)
            .map(|(i, _)| i)
            .collect();
        let key_columns: Columns = key_positions.iter().map(|&i| columns[i].clone()).collect();
        let pk_names = match self.primary_keys.get(&table_name) {
            Some(pk) if r.replica_identity == b'f' && !pk.is_empty() => {
                pk.iter().map(|c| Box::from(c.as_str())).collect()
            }
            _ => key_columns.clone(),
        };
        let table = Table {
            schema: Arc::from(r.namespace.as_str()),
            name: Arc::from(r.name.as_str()),
            types: r.columns.iter().map(|c| c.type_oid).collect(),
            columns,
            key_columns,
            pk_names,
            key_positions,
            watched,
        };
        self.by_oid.insert(r.oid, table);
    }

    /// Whether the source delivers `table`'s changes.
    pub(crate) fn is_watched(&self, table: &TableName) -> bool {
        crate::select::any_matches(&self.patterns, table)
            || self.watched.as_ref().is_none_or(|w| w.contains(table))
    }

    pub(crate) fn get(&self, oid: u32) -> Option<&Table> {
        self.by_oid.get(&oid)
    }

    pub(crate) fn clear(&mut self) {
        self.by_oid.clear();
    }
}

impl Table {
    fn check_width(&self, t: &Tuple<'_>) -> Result<(), String> {
        if t.len() == self.columns.len() {
            Ok(())
        } else {
            Err(format!(
                "{}.{}: tuple has {} columns, relation has {}",
                self.schema,
                self.name,
                t.len(),
                self.columns.len()
            ))
        }
    }

    /// A whole row image.
    pub(crate) fn row(&self, t: &Tuple<'_>) -> Result<Row, String> {
        self.check_width(t)?;
        let values = t
            .iter()
            .zip(&self.types)
            .map(|(d, &ty)| value(ty, d))
            .collect();
        Ok(Row::new(self.columns.clone(), values))
    }

    /// A key-only former image: just the replica identity columns (the others are
    /// unknown, not NULL, so they are left out).
    pub(crate) fn key_row(&self, t: &Tuple<'_>) -> Result<Row, String> {
        self.check_width(t)?;
        let values = self
            .key_positions
            .iter()
            .map(|&i| value(self.types[i], &t[i]))
            .collect();
        Ok(Row::new(self.key_columns.clone(), values))
    }
}

/// One column value, mapped by type: booleans, integers, floats, JSON and bytea get
/// their own variants; everything else (numeric included) stays text, exactly as
/// PostgreSQL printed it.
pub(crate) fn value(type_oid: u32, d: &Datum<'_>) -> Value {
    let raw = match d {
        Datum::Null => return Value::Null,
        Datum::Unchanged => return Value::Unchanged,
        Datum::Binary(b) => return Value::Bytes(Box::from(*b)),
        Datum::Text(b) => *b,
    };
    let text = match std::str::from_utf8(raw) {
        Ok(s) => s,
        // The session asks for UTF-8; keep the bytes rather than guess.
        Err(_) => return Value::Bytes(Box::from(raw)),
    };
    match type_oid {
        oid::BOOL => match text {
            "t" => Value::Bool(true),
            "f" => Value::Bool(false),
            _ => Value::Text(text.into()),
        },
        oid::INT2 | oid::INT4 | oid::INT8 => match text.parse::<i64>() {
            Ok(i) => Value::Int(i),
            Err(_) => Value::Text(text.into()),
        },
        oid::FLOAT4 | oid::FLOAT8 => match text.parse::<f64>() {
            Ok(x) => Value::Float(x),
            Err(_) => Value::Text(text.into()),
        },
        oid::JSON | oid::JSONB => Value::Json(text.into()),
        oid::BYTEA => match decode_bytea(text) {
            Some(b) => Value::Bytes(b.into()),
            None => Value::Text(text.into()),
        },
        _ => Value::Text(text.into()),
    }
}

/// bytea's text output: hex (`\x0aff`) or the legacy escape format.
fn decode_bytea(text: &str) -> Option<Vec<u8>> {
    if let Some(hex) = text.strip_prefix("\\x") {
        if hex.len() % 2 != 0 {
            return None;
        }
        return (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect();
    }
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
        } else if b.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else {
            let oct = std::str::from_utf8(b.get(i + 1..i + 4)?).ok()?;
            out.push(u8::from_str_radix(oct, 8).ok()?);
            i += 4;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::pgoutput::RelationColumn;

    fn rel() -> Relation {
        let col = |key, name: &str, ty| RelationColumn {
            key,
            name: name.into(),
            type_oid: ty,
            type_modifier: -1,
        };
        Relation {
            oid: 1,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: b'd',
            columns: vec![col(true, "id", 23), col(false, "v", 25), col(true, "k", 25)],
        }
    }

    #[test]
    fn maps_types() {
        let t = |s: &'static str| Datum::Text(s.as_bytes());
        assert_eq!(value(16, &t("t")), Value::Bool(true));
        assert_eq!(value(20, &t("-9000000000")), Value::Int(-9_000_000_000));
        assert_eq!(value(21, &t("7")), Value::Int(7));
        assert_eq!(value(701, &t("1.5")), Value::Float(1.5));
        assert!(matches!(value(701, &t("NaN")), Value::Float(x) if x.is_nan()));
        assert_eq!(value(700, &t("-Infinity")), Value::Float(f64::NEG_INFINITY));
        assert_eq!(
            value(3802, &t("{\"a\": 1}")),
            Value::Json("{\"a\": 1}".into())
        );
        assert_eq!(value(17, &t("\\x00ff")), Value::Bytes(vec![0, 255].into()));
        assert_eq!(
            value(17, &t("a\\\\\\001")),
            Value::Bytes(vec![b'a', b'\\', 1].into())
        );
        assert_eq!(value(1700, &t("1.50")), Value::Text("1.50".into()));
        assert_eq!(
            value(2950, &t("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"))
                .to_text()
                .unwrap(),
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
        );
        assert_eq!(value(23, &Datum::Null), Value::Null);
        assert_eq!(value(25, &Datum::Unchanged), Value::Unchanged);
    }

    #[test]
    fn full_identity_names_the_primary_key_not_every_column() {
        let mut full = rel();
        full.replica_identity = b'f';
        for c in &mut full.columns {
            c.key = true; // pgoutput flags every column under FULL
        }
        let pks = HashMap::from([(TableName::new("public", "t"), vec!["id".to_string()])]);
        let mut rels = Relations::new(None).with_primary_keys(pks);
        rels.upsert(full.clone());
        assert_eq!(&*rels.get(1).unwrap().pk_names, &[Box::from("id")]);
        // Without a known primary key, every flagged column stays the key.
        let mut bare = Relations::new(None);
        bare.upsert(full);
        assert_eq!(bare.get(1).unwrap().pk_names.len(), 3);
        // DEFAULT identity: the flags are the primary key already.
        let mut d = Relations::new(None);
        d.upsert(rel());
        assert_eq!(
            &*d.get(1).unwrap().pk_names,
            &[Box::from("id"), Box::from("k")]
        );
    }

    #[test]
    fn rows_share_column_names_and_key_rows_hold_only_keys() {
        let mut rels = Relations::new(None);
        rels.upsert(rel());
        let t = rels.get(1).unwrap();
        assert_eq!(&*t.key_columns, &[Box::from("id"), Box::from("k")]);
        let tuple = vec![Datum::Text(b"1"), Datum::Text(b"x"), Datum::Text(b"a")];
        let a = t.row(&tuple).unwrap();
        let b = t.row(&tuple).unwrap();
        assert!(Arc::ptr_eq(a.columns(), b.columns()));
        assert_eq!(a.get("id"), Some(&Value::Int(1)));
        let k = t
            .key_row(&vec![Datum::Text(b"1"), Datum::Null, Datum::Text(b"a")])
            .unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k.get("v"), None, "non-key columns are unknown, not NULL");
        assert!(t.row(&vec![Datum::Null]).is_err());
    }

    #[test]
    fn resent_relations_replace_and_watching_filters() {
        let mut w = HashSet::new();
        w.insert(TableName::new("public", "t"));
        let mut rels = Relations::new(Some(w));
        rels.upsert(rel());
        assert!(rels.get(1).unwrap().watched);
        let mut other = rel();
        other.name = "u".into();
        other.columns.truncate(1);
        rels.upsert(other);
        let t = rels.get(1).unwrap();
        assert!(!t.watched);
        assert_eq!(t.columns.len(), 1);
    }
}
