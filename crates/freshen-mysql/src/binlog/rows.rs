//! Rows events (WRITE/UPDATE/DELETE_ROWS, versions 1 and 2): row images to
//! [`RowEvent`]s, decoded straight from the event's bytes.

use freshen::{Op, Row, RowEvent, Value};

use super::DecodeError;
use super::cursor::Cursor;
use super::table_map::TableMap;
use super::value;

/// Which rows event, and so which images each row has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowsKind {
    /// WRITE_ROWS: after images.
    Write,
    /// UPDATE_ROWS: before and after images.
    Update,
    /// DELETE_ROWS: before images.
    Delete,
}

impl RowsKind {
    fn op(self) -> Op {
        match self {
            RowsKind::Write => Op::Insert,
            RowsKind::Update => Op::Update,
            RowsKind::Delete => Op::Delete,
        }
    }
}

/// The table id a rows event body refers to (its first 6 bytes).
pub fn rows_table_id(body: &[u8]) -> Result<u64, DecodeError> {
    Cursor::new(body).uint(6, "rows event: table id")
}

/// Decodes a rows event body (after the 19-byte header, without checksum) whose table
/// map is `table`, appending one event per row to `out`, each a clone of `template`
/// (schema, table, primary key, commit time, transaction) with its op and images set.
/// `v2` is true for the version-2 events (MySQL 5.6+), which carry extra data.
///
/// On error nothing of this event is appended.
pub fn decode_rows(
    kind: RowsKind,
    v2: bool,
    body: &[u8],
    table: &TableMap,
    template: &RowEvent,
    out: &mut Vec<RowEvent>,
) -> Result<usize, DecodeError> {
    let start = out.len();
    let result = decode_into(kind, v2, body, table, template, out);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn decode_into(
    kind: RowsKind,
    v2: bool,
    body: &[u8],
    table: &TableMap,
    template: &RowEvent,
    out: &mut Vec<RowEvent>,
) -> Result<usize, DecodeError> {
    let mut c = Cursor::new(body);
    let id = c.uint(6, "rows event: table id")?;
    if id != table.table_id {
        return Err(DecodeError::new(format!(
            "rows event for table id {id} decoded with the map of table id {}",
            table.table_id
        )));
    }
    c.u16("rows event: flags")?;
    if v2 {
        let extra = usize::from(c.u16("rows event: extra data length")?);
        c.take(extra.saturating_sub(2), "rows event: extra data")?;
    }
    let n = c.lenenc("rows event: column count")?;
    if n != table.len() as u64 {
        return Err(DecodeError::new(format!(
            "rows event for {}.{} has {n} columns but its table map has {}",
            table.schema,
            table.table,
            table.len()
        )));
    }
    let n = table.len();
    let before_present = c.take(n.div_ceil(8), "rows event: columns bitmap")?;
    let after_present = if kind == RowsKind::Update {
        c.take(n.div_ceil(8), "rows event: after-image columns bitmap")?
    } else {
        before_present
    };
    let before_count = (0..n).filter(|&i| bit(before_present, i)).count();
    let after_count = (0..n).filter(|&i| bit(after_present, i)).count();
    let mut base = template.clone();
    base.op = kind.op();
    if base.pk_names.is_empty() {
        base.pk_names = table.primary_key.clone();
    }
    let mut rows = 0;
    if before_count == 0 || after_count == 0 {
        // An image of no columns takes no bytes: the rows would never end.
        return Err(DecodeError::new(format!(
            "rows event for {}.{} names no columns",
            table.schema, table.table
        )));
    }
    while !c.is_empty() {
        let first = image(&mut c, table, before_present, before_count)?;
        let mut e = base.clone();
        match kind {
            RowsKind::Write => e.new = Some(first),
            RowsKind::Delete => e.old = Some(first),
            RowsKind::Update => {
                e.old = Some(first);
                e.new = Some(image(&mut c, table, after_present, after_count)?);
            }
        }
        if let Some(tx) = &mut e.tx {
            tx.index = tx.index.saturating_add(rows as u32);
        }
        out.push(e);
        rows += 1;
    }
    Ok(rows)
}

/// Bit `i` of a least-significant-bit-first bitmap.
fn bit(bits: &[u8], i: usize) -> bool {
    bits.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

/// One row image: the NULL bitmap over the present columns, then their values.
/// Columns the image leaves out (`binlog_row_image` MINIMAL/NOBLOB) are
/// [`Value::Unchanged`].
fn image(
    c: &mut Cursor<'_>,
    table: &TableMap,
    present: &[u8],
    present_count: usize,
) -> Result<Row, DecodeError> {
    let n = table.len();
    let nulls = c.take(present_count.div_ceil(8), "row image: NULL bitmap")?;
    let mut values = Vec::with_capacity(n);
    let mut p = 0;
    for (i, col) in table.cols.iter().enumerate() {
        if !bit(present, i) {
            values.push(Value::Unchanged);
            continue;
        }
        let is_null = bit(nulls, p);
        p += 1;
        if is_null {
            values.push(Value::Null);
        } else {
            values.push(value::decode(c, col).map_err(|e| {
                e.context(format!(
                    "{}.{} column {}",
                    table.schema, table.table, table.columns[i]
                ))
            })?);
        }
    }
    Ok(Row::new(table.columns.clone(), values))
}

#[cfg(test)]
mod tests {
    use super::super::charset::Charsets;
    use super::super::table_map::tests::{body, names};
    use super::super::table_map::ty;
    use super::*;

    fn table() -> TableMap {
        let b = body(
            9,
            "app",
            "readings",
            &[
                (ty::LONG, &[]),
                (ty::VARCHAR, &[40, 0]),
                (ty::LONGLONG, &[]),
            ],
            &[names(&["id", "device", "value"]), (8, vec![0])],
        );
        TableMap::decode(&b, &Charsets::builtin()).unwrap()
    }

    fn row(id: i32, device: Option<&str>, value: i64) -> Vec<u8> {
        let mut r = vec![if device.is_none() { 0b010 } else { 0 }];
        r.extend_from_slice(&id.to_le_bytes());
        if let Some(d) = device {
            r.push(d.len() as u8);
            r.extend_from_slice(d.as_bytes());
        }
        r.extend_from_slice(&value.to_le_bytes());
        r
    }

    fn event(v2: bool, update: bool, rows: &[Vec<u8>]) -> Vec<u8> {
        let mut b = 9u64.to_le_bytes()[..6].to_vec();
        b.extend_from_slice(&[1, 0]);
        if v2 {
            b.extend_from_slice(&[2, 0]);
        }
        b.push(3);
        b.push(0b111);
        if update {
            b.push(0b111);
        }
        for r in rows {
            b.extend_from_slice(r);
        }
        b
    }

    fn template() -> RowEvent {
        RowEvent::new("app", "readings", Op::Insert)
    }

    #[test]
    fn write_rows_v1_and_v2() {
        let t = table();
        for v2 in [false, true] {
            let mut out = Vec::new();
            let b = event(v2, false, &[row(1, Some("d1"), 10), row(2, None, -5)]);
            let n = decode_rows(RowsKind::Write, v2, &b, &t, &template(), &mut out).unwrap();
            assert_eq!(n, 2);
            let r = out[1].new.as_ref().unwrap();
            assert_eq!(r.get("id"), Some(&Value::Int(2)));
            assert_eq!(r.get("device"), Some(&Value::Null));
            assert_eq!(r.get("value"), Some(&Value::Int(-5)));
            assert_eq!(out[0].op, Op::Insert);
            assert_eq!(&*out[0].pk_names, &[Box::from("id")][..]);
        }
    }

    #[test]
    fn update_rows_have_both_images() {
        let t = table();
        let mut out = Vec::new();
        let b = event(true, true, &[row(1, Some("a"), 1), row(1, Some("b"), 1)]);
        decode_rows(RowsKind::Update, true, &b, &t, &template(), &mut out).unwrap();
        assert_eq!(out.len(), 1);
        let keys: Vec<String> = out[0]
            .scope_keys(&["device"])
            .map(|k| k.to_string())
            .collect();
        assert_eq!(keys, ["b", "a"]);
    }

    #[test]
    fn minimal_images_leave_columns_unchanged() {
        let t = table();
        let mut b = 9u64.to_le_bytes()[..6].to_vec();
        b.extend_from_slice(&[1, 0, 3, 0b001]);
        b.push(0);
        b.extend_from_slice(&7i32.to_le_bytes());
        let mut out = Vec::new();
        decode_rows(RowsKind::Delete, false, &b, &t, &template(), &mut out).unwrap();
        let old = out[0].old.as_ref().unwrap();
        assert_eq!(old.get("id"), Some(&Value::Int(7)));
        assert_eq!(old.get("device"), Some(&Value::Unchanged));
        assert_eq!(out[0].scope_keys(&["device"]).count(), 0);
    }

    #[test]
    fn truncated_events_append_nothing() {
        let t = table();
        let b = event(
            false,
            false,
            &[row(1, Some("dev"), 10), row(2, Some("x"), 3)],
        );
        for cut in 0..b.len() {
            let mut out = Vec::new();
            let r = decode_rows(RowsKind::Write, false, &b[..cut], &t, &template(), &mut out);
            if r.is_err() {
                assert!(out.is_empty());
            }
        }
        let mut out = Vec::new();
        assert!(
            decode_rows(
                RowsKind::Write,
                false,
                &b[..b.len() - 3],
                &t,
                &template(),
                &mut out
            )
            .is_err()
        );
        assert!(out.is_empty());
    }

    #[test]
    fn images_of_no_columns_are_errors_not_endless_loops() {
        // Found by the fuzzer: an empty columns bitmap made every row zero bytes long.
        let t = table();
        let mut b = 9u64.to_le_bytes()[..6].to_vec();
        b.extend_from_slice(&[1, 0, 3, 0b000, 0]);
        let mut out = Vec::new();
        assert!(decode_rows(RowsKind::Write, false, &b, &t, &template(), &mut out).is_err());
        assert!(out.is_empty());
    }

    #[test]
    fn mismatched_tables_are_errors() {
        let t = table();
        let mut b = event(false, false, &[row(1, Some("d"), 1)]);
        b[0] = 8;
        let mut out = Vec::new();
        assert!(decode_rows(RowsKind::Write, false, &b, &t, &template(), &mut out).is_err());
        let mut b = event(false, false, &[row(1, Some("d"), 1)]);
        b[8] = 2;
        assert!(decode_rows(RowsKind::Write, false, &b, &t, &template(), &mut out).is_err());
    }
}
