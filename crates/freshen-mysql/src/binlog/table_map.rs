//! TABLE_MAP events: which table a rows event is about, its columns' types, and (with
//! `binlog_row_metadata=FULL`) their names, signedness, character sets, ENUM/SET
//! members and the primary key.

use std::sync::Arc;

use freshen::Columns;

use super::DecodeError;
use super::charset::{Charset, Charsets};
use super::cursor::Cursor;

/// Column type codes as the binlog writes them.
pub(crate) mod ty {
    pub(crate) const DECIMAL: u8 = 0;
    pub(crate) const TINY: u8 = 1;
    pub(crate) const SHORT: u8 = 2;
    pub(crate) const LONG: u8 = 3;
    pub(crate) const FLOAT: u8 = 4;
    pub(crate) const DOUBLE: u8 = 5;
    pub(crate) const NULL: u8 = 6;
    pub(crate) const TIMESTAMP: u8 = 7;
    pub(crate) const LONGLONG: u8 = 8;
    pub(crate) const INT24: u8 = 9;
    pub(crate) const DATE: u8 = 10;
    pub(crate) const TIME: u8 = 11;
    pub(crate) const DATETIME: u8 = 12;
    pub(crate) const YEAR: u8 = 13;
    pub(crate) const NEWDATE: u8 = 14;
    pub(crate) const VARCHAR: u8 = 15;
    pub(crate) const BIT: u8 = 16;
    pub(crate) const TIMESTAMP2: u8 = 17;
    pub(crate) const DATETIME2: u8 = 18;
    pub(crate) const TIME2: u8 = 19;
    pub(crate) const VECTOR: u8 = 242;
    pub(crate) const JSON: u8 = 245;
    pub(crate) const NEWDECIMAL: u8 = 246;
    pub(crate) const ENUM: u8 = 247;
    pub(crate) const SET: u8 = 248;
    pub(crate) const TINY_BLOB: u8 = 249;
    pub(crate) const MEDIUM_BLOB: u8 = 250;
    pub(crate) const LONG_BLOB: u8 = 251;
    pub(crate) const BLOB: u8 = 252;
    pub(crate) const VAR_STRING: u8 = 253;
    pub(crate) const STRING: u8 = 254;
    pub(crate) const GEOMETRY: u8 = 255;
}

/// Optional metadata field codes (MySQL WL#4618, MariaDB MDEV-20477).
mod meta {
    pub(super) const SIGNEDNESS: u8 = 1;
    pub(super) const DEFAULT_CHARSET: u8 = 2;
    pub(super) const COLUMN_CHARSET: u8 = 3;
    pub(super) const COLUMN_NAME: u8 = 4;
    pub(super) const SET_STR_VALUE: u8 = 5;
    pub(super) const ENUM_STR_VALUE: u8 = 6;
    pub(super) const SIMPLE_PRIMARY_KEY: u8 = 8;
    pub(super) const PRIMARY_KEY_WITH_PREFIX: u8 = 9;
    pub(super) const ENUM_AND_SET_DEFAULT_CHARSET: u8 = 10;
    pub(super) const ENUM_AND_SET_COLUMN_CHARSET: u8 = 11;
}

/// How one column's value is laid out in a row image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Integer of 1, 2, 3, 4 or 8 bytes.
    Int(u8),
    Float,
    Double,
    Decimal {
        precision: u8,
        scale: u8,
    },
    Year,
    Date,
    /// Pre-5.6 TIME (3 bytes, HHMMSS).
    Time,
    /// Pre-5.6 DATETIME (8 bytes, YYYYMMDDhhmmss).
    DateTime,
    /// Pre-5.6 TIMESTAMP (4 bytes of seconds).
    Timestamp,
    Time2 {
        fsp: u8,
    },
    DateTime2 {
        fsp: u8,
    },
    Timestamp2 {
        fsp: u8,
    },
    /// CHAR, VARCHAR: a 1- or 2-byte length, then the bytes.
    Str {
        len_bytes: u8,
    },
    /// BLOB, TEXT, GEOMETRY, VECTOR: a 1–4-byte length, then the bytes.
    Blob {
        len_bytes: u8,
    },
    /// MySQL's binary JSON, behind a 1–4-byte length.
    Json {
        len_bytes: u8,
    },
    /// BIT(n): `len` big-endian bytes.
    Bit {
        len: u8,
    },
    /// ENUM: a 1- or 2-byte member number (1-based; 0 is the empty error value).
    Enum {
        pack: u8,
    },
    /// SET: a little-endian bitmask of `pack` bytes.
    Set {
        pack: u8,
    },
    /// The NULL type: no bytes.
    Null,
}

/// One column of a table map.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Column {
    pub(crate) kind: Kind,
    /// The type code as written (`ty::*`), for messages.
    pub(crate) code: u8,
    pub(crate) unsigned: bool,
    pub(crate) charset: Charset,
    /// ENUM or SET members, in definition order.
    pub(crate) members: Option<Arc<[Box<str>]>>,
}

/// A decoded TABLE_MAP event.
#[derive(Debug, Clone, PartialEq)]
pub struct TableMap {
    /// The id rows events refer to (valid until the next table map for the same table).
    pub table_id: u64,
    /// Database (schema).
    pub schema: Arc<str>,
    /// Table.
    pub table: Arc<str>,
    /// Column names, in table order (`@1`, `@2`, … without `binlog_row_metadata=FULL`).
    pub columns: Columns,
    /// Primary-key column names, when the table map carries them.
    pub primary_key: Columns,
    /// Whether the server sent column names (`binlog_row_metadata=FULL`).
    pub has_names: bool,
    /// Whether the server sent signedness (`binlog_row_metadata=FULL`): without it
    /// unsigned integers above the signed range decode wrongly.
    pub has_signedness: bool,
    pub(crate) cols: Vec<Column>,
}

impl TableMap {
    /// Decodes a TABLE_MAP event body (after the 19-byte header, without checksum).
    pub fn decode(body: &[u8], charsets: &Charsets) -> Result<TableMap, DecodeError> {
        let mut c = Cursor::new(body);
        let table_id = c.uint(6, "table map: table id")?;
        c.u16("table map: flags")?;
        let schema = name(&mut c, "table map: schema")?;
        let table = name(&mut c, "table map: table")?;
        let n = c.count(1, "table map: column count")?;
        let types = c.take(n, "table map: column types")?;
        let meta_len = c.count(1, "table map: metadata length")?;
        let mut m = Cursor::new(c.take(meta_len, "table map: metadata")?);
        let mut raw = Vec::with_capacity(n);
        for &t in types {
            raw.push(column_meta(t, &mut m)?);
        }
        c.take(n.div_ceil(8), "table map: null bitmap")?;

        let mut names: Option<Vec<Box<str>>> = None;
        let mut signed_bits: Option<&[u8]> = None;
        let mut char_default: Option<(u16, Vec<(usize, u16)>)> = None;
        let mut char_list: Option<Vec<u16>> = None;
        let mut es_default: Option<(u16, Vec<(usize, u16)>)> = None;
        let mut es_list: Option<Vec<u16>> = None;
        let mut enum_values: Vec<Vec<&[u8]>> = Vec::new();
        let mut set_values: Vec<Vec<&[u8]>> = Vec::new();
        let mut pk: Vec<usize> = Vec::new();
        while !c.is_empty() {
            let t = c.u8("table map: metadata field type")?;
            let v = c.lenenc_bytes("table map: metadata field")?;
            let mut f = Cursor::new(v);
            match t {
                meta::SIGNEDNESS => signed_bits = Some(v),
                meta::DEFAULT_CHARSET => char_default = Some(default_charset(&mut f)?),
                meta::COLUMN_CHARSET => char_list = Some(collations(&mut f)?),
                meta::ENUM_AND_SET_DEFAULT_CHARSET => es_default = Some(default_charset(&mut f)?),
                meta::ENUM_AND_SET_COLUMN_CHARSET => es_list = Some(collations(&mut f)?),
                meta::COLUMN_NAME => {
                    let mut list = Vec::with_capacity(n);
                    while !f.is_empty() {
                        let s = f.lenenc_bytes("table map: column name")?;
                        list.push(Box::from(String::from_utf8_lossy(s).as_ref()));
                    }
                    names = Some(list);
                }
                meta::ENUM_STR_VALUE => enum_values = str_values(&mut f)?,
                meta::SET_STR_VALUE => set_values = str_values(&mut f)?,
                meta::SIMPLE_PRIMARY_KEY => {
                    while !f.is_empty() {
                        pk.push(f.lenenc("table map: primary key")? as usize);
                    }
                }
                meta::PRIMARY_KEY_WITH_PREFIX => {
                    while !f.is_empty() {
                        pk.push(f.lenenc("table map: primary key")? as usize);
                        f.lenenc("table map: primary key prefix")?;
                    }
                }
                _ => {} // geometry types, visibility, future fields
            }
        }

        let has_names = names.as_ref().is_some_and(|l| l.len() == n);
        let columns: Columns = match names {
            Some(list) if list.len() == n => list.into(),
            _ => (1..=n).map(|i| Box::from(format!("@{i}"))).collect(),
        };
        let mut cols = Vec::with_capacity(n);
        let (mut numeric, mut character, mut enum_set, mut enums, mut sets) = (0, 0, 0, 0, 0);
        for &(code, kind) in &raw {
            let mut col = Column {
                kind,
                code,
                unsigned: false,
                charset: Charset::Binary,
                members: None,
            };
            if is_numeric(kind) {
                col.unsigned = signed_bits.is_some_and(|b| bit_msb(b, numeric));
                numeric += 1;
            }
            match kind {
                Kind::Str { .. } | Kind::Blob { .. } if is_character(code) => {
                    let id = collation(character, &char_default, &char_list);
                    col.charset = id.map_or(Charset::Utf8, |id| charsets.of(id));
                    character += 1;
                }
                Kind::Enum { .. } | Kind::Set { .. } => {
                    let id = collation(enum_set, &es_default, &es_list);
                    let cs = id.map_or(Charset::Utf8, |id| charsets.of(id));
                    col.charset = cs;
                    enum_set += 1;
                    let list = if matches!(kind, Kind::Enum { .. }) {
                        enums += 1;
                        enum_values.get(enums - 1)
                    } else {
                        sets += 1;
                        set_values.get(sets - 1)
                    };
                    col.members = list.map(|l| {
                        l.iter()
                            .map(|s| Box::from(super::charset::text(s, cs).as_ref()))
                            .collect()
                    });
                }
                _ => {}
            }
            cols.push(col);
        }
        let primary_key: Columns = pk.iter().filter_map(|&i| columns.get(i).cloned()).collect();
        Ok(TableMap {
            table_id,
            schema,
            table,
            columns,
            primary_key,
            has_names,
            has_signedness: signed_bits.is_some() || numeric == 0,
            cols,
        })
    }

    /// Number of columns.
    pub fn len(&self) -> usize {
        self.cols.len()
    }

    /// Whether the table has no columns (never, for a real table).
    pub fn is_empty(&self) -> bool {
        self.cols.is_empty()
    }
}

/// A table map's 1-byte-length, NUL-terminated name.
fn name(c: &mut Cursor<'_>, what: &'static str) -> Result<Arc<str>, DecodeError> {
    let len = usize::from(c.u8(what)?);
    let s = c.take(len, what)?;
    c.u8(what)?; // the terminating NUL
    Ok(Arc::from(String::from_utf8_lossy(s).as_ref()))
}

/// The layout of a column from its type code and metadata bytes.
fn column_meta(code: u8, m: &mut Cursor<'_>) -> Result<(u8, Kind), DecodeError> {
    let one = |m: &mut Cursor<'_>| m.u8("table map: column metadata");
    let kind = match code {
        ty::TINY => Kind::Int(1),
        ty::SHORT => Kind::Int(2),
        ty::INT24 => Kind::Int(3),
        ty::LONG => Kind::Int(4),
        ty::LONGLONG => Kind::Int(8),
        ty::FLOAT => {
            one(m)?;
            Kind::Float
        }
        ty::DOUBLE => {
            one(m)?;
            Kind::Double
        }
        ty::NEWDECIMAL => {
            let precision = one(m)?;
            let scale = one(m)?;
            if precision == 0 || precision > 65 || scale > 30 || scale > precision {
                return Err(DecodeError::new(format!(
                    "table map: DECIMAL({precision},{scale}) is not a valid decimal"
                )));
            }
            Kind::Decimal { precision, scale }
        }
        ty::YEAR => Kind::Year,
        ty::DATE | ty::NEWDATE => Kind::Date,
        ty::TIME => Kind::Time,
        ty::DATETIME => Kind::DateTime,
        ty::TIMESTAMP => Kind::Timestamp,
        ty::TIME2 => Kind::Time2 { fsp: fsp(one(m)?)? },
        ty::DATETIME2 => Kind::DateTime2 { fsp: fsp(one(m)?)? },
        ty::TIMESTAMP2 => Kind::Timestamp2 { fsp: fsp(one(m)?)? },
        ty::VARCHAR | ty::VAR_STRING => {
            let max = m.u16("table map: column metadata")?;
            Kind::Str {
                len_bytes: if max < 256 { 1 } else { 2 },
            }
        }
        ty::BIT => {
            let bits = one(m)?;
            let bytes = one(m)?;
            Kind::Bit {
                len: bytes.saturating_add(u8::from(bits > 0)),
            }
        }
        ty::BLOB | ty::TINY_BLOB | ty::MEDIUM_BLOB | ty::LONG_BLOB | ty::GEOMETRY | ty::VECTOR => {
            Kind::Blob {
                len_bytes: len_bytes(one(m)?)?,
            }
        }
        ty::JSON => Kind::Json {
            len_bytes: len_bytes(one(m)?)?,
        },
        ty::STRING | ty::ENUM | ty::SET => {
            let b0 = one(m)?;
            let b1 = one(m)?;
            let (real, max) = if b0 & 0x30 != 0x30 {
                (
                    b0 | 0x30,
                    u16::from(b1) | (u16::from((b0 & 0x30) ^ 0x30) << 4),
                )
            } else {
                (b0, u16::from(b1))
            };
            match real {
                ty::ENUM if matches!(b1, 1 | 2) => Kind::Enum { pack: b1 },
                ty::SET if matches!(b1, 1..=4 | 8) => Kind::Set { pack: b1 },
                ty::STRING => Kind::Str {
                    len_bytes: if max < 256 { 1 } else { 2 },
                },
                _ => {
                    return Err(DecodeError::new(format!(
                        "table map: string column with real type {real} and length {b1}"
                    )));
                }
            }
        }
        ty::NULL => Kind::Null,
        other => {
            return Err(DecodeError::new(format!(
                "table map: column type {other} is not supported{}",
                if other == ty::DECIMAL {
                    " (pre-5.0 DECIMAL: ALTER the column to rebuild it)"
                } else {
                    ""
                }
            )));
        }
    };
    // ENUM/SET are always written as STRING with the real type in the metadata.
    let code = match kind {
        Kind::Enum { .. } => ty::ENUM,
        Kind::Set { .. } => ty::SET,
        _ => code,
    };
    Ok((code, kind))
}

fn fsp(v: u8) -> Result<u8, DecodeError> {
    if v > 6 {
        return Err(DecodeError::new(format!(
            "table map: fractional seconds precision {v} is above 6"
        )));
    }
    Ok(v)
}

fn len_bytes(v: u8) -> Result<u8, DecodeError> {
    if !(1..=4).contains(&v) {
        return Err(DecodeError::new(format!(
            "table map: a length of {v} bytes is not a valid blob length"
        )));
    }
    Ok(v)
}

/// Numeric columns in the SIGNEDNESS bitmap's sense (YEAR included, as the server does).
fn is_numeric(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Int(_) | Kind::Float | Kind::Double | Kind::Decimal { .. } | Kind::Year
    )
}

/// Character columns in the charset fields' sense (ENUM/SET have their own field).
fn is_character(code: u8) -> bool {
    matches!(
        code,
        ty::STRING
            | ty::VAR_STRING
            | ty::VARCHAR
            | ty::BLOB
            | ty::TINY_BLOB
            | ty::MEDIUM_BLOB
            | ty::LONG_BLOB
    )
}

/// Bit `i` of a most-significant-bit-first bitmap.
fn bit_msb(bits: &[u8], i: usize) -> bool {
    bits.get(i / 8).is_some_and(|b| b & (0x80 >> (i % 8)) != 0)
}

fn default_charset(f: &mut Cursor<'_>) -> Result<(u16, Vec<(usize, u16)>), DecodeError> {
    let default = f.lenenc("table map: default charset")? as u16;
    let mut non_default = Vec::new();
    while !f.is_empty() {
        let i = f.lenenc("table map: charset column")? as usize;
        let id = f.lenenc("table map: charset")? as u16;
        non_default.push((i, id));
    }
    Ok((default, non_default))
}

fn collations(f: &mut Cursor<'_>) -> Result<Vec<u16>, DecodeError> {
    let mut list = Vec::new();
    while !f.is_empty() {
        list.push(f.lenenc("table map: column charset")? as u16);
    }
    Ok(list)
}

fn str_values<'a>(f: &mut Cursor<'a>) -> Result<Vec<Vec<&'a [u8]>>, DecodeError> {
    let mut columns = Vec::new();
    while !f.is_empty() {
        let n = f.count(1, "table map: member count")?;
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            members.push(f.lenenc_bytes("table map: member")?);
        }
        columns.push(members);
    }
    Ok(columns)
}

/// The collation of the `i`-th character (or ENUM/SET) column.
fn collation(
    i: usize,
    default: &Option<(u16, Vec<(usize, u16)>)>,
    list: &Option<Vec<u16>>,
) -> Option<u16> {
    if let Some(list) = list {
        return list.get(i).copied();
    }
    let (d, non_default) = default.as_ref()?;
    Some(
        non_default
            .iter()
            .find(|(c, _)| *c == i)
            .map_or(*d, |(_, id)| *id),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a TABLE_MAP body: `(type, metadata bytes)` per column, then optional
    /// metadata fields.
    pub(crate) fn body(
        table_id: u64,
        schema: &str,
        table: &str,
        cols: &[(u8, &[u8])],
        optional: &[(u8, Vec<u8>)],
    ) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&table_id.to_le_bytes()[..6]);
        b.extend_from_slice(&[1, 0]);
        b.push(schema.len() as u8);
        b.extend_from_slice(schema.as_bytes());
        b.push(0);
        b.push(table.len() as u8);
        b.extend_from_slice(table.as_bytes());
        b.push(0);
        b.push(cols.len() as u8);
        for (t, _) in cols {
            b.push(*t);
        }
        let meta: Vec<u8> = cols.iter().flat_map(|(_, m)| m.iter().copied()).collect();
        b.push(meta.len() as u8);
        b.extend_from_slice(&meta);
        b.extend(std::iter::repeat_n(0xff, cols.len().div_ceil(8)));
        for (t, v) in optional {
            b.push(*t);
            b.push(v.len() as u8);
            b.extend_from_slice(v);
        }
        b
    }

    pub(crate) fn names(list: &[&str]) -> (u8, Vec<u8>) {
        let mut v = Vec::new();
        for n in list {
            v.push(n.len() as u8);
            v.extend_from_slice(n.as_bytes());
        }
        (meta::COLUMN_NAME, v)
    }

    #[test]
    fn decodes_names_signedness_charsets_members_and_key() {
        let b = body(
            42,
            "app",
            "t",
            &[
                (ty::LONG, &[]),
                (ty::LONGLONG, &[]),
                (ty::VARCHAR, &[0x40, 0x01]),
                (ty::STRING, &[0xf7, 1]),
                (ty::VARCHAR, &[10, 0]),
                (ty::STRING, &[0xf8, 1]),
            ],
            &[
                names(&["id", "big", "name", "color", "legacy", "tags"]),
                (meta::SIGNEDNESS, vec![0b0100_0000]),
                // default utf8mb4 (45); character column 1 ("legacy") is latin1 (8).
                (meta::DEFAULT_CHARSET, vec![45, 1, 8]),
                (meta::ENUM_AND_SET_DEFAULT_CHARSET, vec![45]),
                (
                    meta::ENUM_STR_VALUE,
                    vec![2, 3, b'r', b'e', b'd', 4, b'b', b'l', b'u', b'e'],
                ),
                (meta::SET_STR_VALUE, vec![2, 1, b'a', 1, b'b']),
                (meta::SIMPLE_PRIMARY_KEY, vec![0]),
            ],
        );
        let tm = TableMap::decode(&b, &Charsets::builtin()).unwrap();
        assert_eq!(tm.table_id, 42);
        assert_eq!((&*tm.schema, &*tm.table), ("app", "t"));
        assert_eq!(tm.columns.len(), 6);
        assert_eq!(&*tm.columns[3], "color");
        assert_eq!(
            tm.primary_key.iter().map(|s| &**s).collect::<Vec<_>>(),
            ["id"]
        );
        assert!(!tm.cols[0].unsigned);
        assert!(tm.cols[1].unsigned);
        assert_eq!(tm.cols[2].kind, Kind::Str { len_bytes: 2 });
        assert_eq!(tm.cols[2].charset, Charset::Utf8);
        assert_eq!(tm.cols[4].charset, Charset::Latin1);
        assert_eq!(tm.cols[3].kind, Kind::Enum { pack: 1 });
        let members: Vec<&str> = tm.cols[3]
            .members
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| &**s)
            .collect();
        assert_eq!(members, ["red", "blue"]);
        assert_eq!(tm.cols[5].kind, Kind::Set { pack: 1 });
        assert!(tm.has_names && tm.has_signedness);
    }

    #[test]
    fn minimal_metadata_names_columns_by_number() {
        let b = body(1, "d", "t", &[(ty::LONG, &[]), (ty::TINY, &[])], &[]);
        let tm = TableMap::decode(&b, &Charsets::builtin()).unwrap();
        assert!(!tm.has_names);
        assert!(!tm.has_signedness);
        assert_eq!(&*tm.columns[1], "@2");
    }

    #[test]
    fn truncated_table_maps_are_errors() {
        let b = body(
            7,
            "app",
            "t",
            &[(ty::NEWDECIMAL, &[10, 2]), (ty::VARCHAR, &[20, 0])],
            &[names(&["a", "b"])],
        );
        for cut in 0..b.len() - 1 {
            // Every strict prefix either fails or (when cut inside optional metadata at
            // a field boundary) decodes with less metadata; none panics.
            let _ = TableMap::decode(&b[..cut], &Charsets::builtin());
        }
        assert!(TableMap::decode(&b[..10], &Charsets::builtin()).is_err());
    }

    #[test]
    fn rejects_impossible_metadata() {
        let b = body(1, "d", "t", &[(ty::NEWDECIMAL, &[10, 20])], &[]);
        assert!(TableMap::decode(&b, &Charsets::builtin()).is_err());
        let b = body(1, "d", "t", &[(ty::DATETIME2, &[9])], &[]);
        assert!(TableMap::decode(&b, &Charsets::builtin()).is_err());
        let b = body(1, "d", "t", &[(ty::DECIMAL, &[])], &[]);
        assert!(
            TableMap::decode(&b, &Charsets::builtin())
                .unwrap_err()
                .to_string()
                .contains("pre-5.0")
        );
    }
}
