//! MySQL's binary JSON (the `JSON` type's storage and binlog form) to JSON text.
//!
//! MariaDB stores JSON as text (a LONGTEXT), so this is MySQL's only. Every offset is
//! checked against the value's bytes and nesting is bounded, so a corrupt document is
//! an error (the column then arrives as bytes), never a panic.

use std::fmt::Write;

use super::DecodeError;
use super::cursor::le;

const MAX_DEPTH: usize = 100;

/// The JSON text of a binary JSON document.
pub(crate) fn to_text(doc: &[u8]) -> Result<String, DecodeError> {
    let mut out = String::with_capacity(doc.len() + 8);
    if doc.is_empty() {
        out.push_str("null");
        return Ok(out);
    }
    value(doc[0], &doc[1..], &mut out, 0)?;
    Ok(out)
}

fn bad(what: &str) -> DecodeError {
    DecodeError::new(format!("binary JSON: {what}"))
}

fn slice(b: &[u8], from: usize, len: usize) -> Result<&[u8], DecodeError> {
    from.checked_add(len)
        .and_then(|end| b.get(from..end))
        .ok_or_else(|| bad("offset past the end"))
}

fn value(t: u8, b: &[u8], out: &mut String, depth: usize) -> Result<(), DecodeError> {
    if depth > MAX_DEPTH {
        return Err(bad("nested too deeply"));
    }
    match t {
        0x00 => container(b, false, true, out, depth),
        0x01 => container(b, true, true, out, depth),
        0x02 => container(b, false, false, out, depth),
        0x03 => container(b, true, false, out, depth),
        0x04 => literal(*b.first().ok_or_else(|| bad("empty literal"))?, out),
        0x05 => num(le(slice(b, 0, 2)?) as u16 as i16 as i64, out),
        0x06 => num(le(slice(b, 0, 2)?) as i64, out),
        0x07 => num(le(slice(b, 0, 4)?) as u32 as i32 as i64, out),
        0x08 => num(le(slice(b, 0, 4)?) as i64, out),
        0x09 => num(le(slice(b, 0, 8)?) as i64, out),
        0x0a => {
            let _ = write!(out, "{}", le(slice(b, 0, 8)?));
            Ok(())
        }
        0x0b => {
            let x = f64::from_bits(le(slice(b, 0, 8)?));
            if !x.is_finite() {
                return Err(bad("non-finite double"));
            }
            let _ = write!(out, "{x:?}");
            Ok(())
        }
        0x0c => {
            let (len, n) = varlen(b)?;
            let s =
                std::str::from_utf8(slice(b, n, len)?).map_err(|_| bad("string is not UTF-8"))?;
            string(s, out);
            Ok(())
        }
        _ => Err(bad("opaque or unknown value type")),
    }
}

fn num(v: i64, out: &mut String) -> Result<(), DecodeError> {
    let _ = write!(out, "{v}");
    Ok(())
}

fn literal(v: u8, out: &mut String) -> Result<(), DecodeError> {
    out.push_str(match v {
        0 => "null",
        1 => "true",
        2 => "false",
        _ => return Err(bad("unknown literal")),
    });
    Ok(())
}

/// A length of 7 bits per byte, low bits first, at most 5 bytes.
fn varlen(b: &[u8]) -> Result<(usize, usize), DecodeError> {
    let mut len = 0usize;
    for i in 0..5 {
        let byte = *b.get(i).ok_or_else(|| bad("truncated length"))?;
        len |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((len, i + 1));
        }
    }
    Err(bad("length too long"))
}

fn container(
    b: &[u8],
    large: bool,
    object: bool,
    out: &mut String,
    depth: usize,
) -> Result<(), DecodeError> {
    let w = if large { 4 } else { 2 };
    let count = le(slice(b, 0, w)?) as usize;
    let size = le(slice(b, w, w)?) as usize;
    let b = b
        .get(..size)
        .ok_or_else(|| bad("container larger than its value"))?;
    let key_entry = if object { w + 2 } else { 0 };
    let value_entry = 1 + w;
    let header = 2 * w;
    let entries = count
        .checked_mul(key_entry + value_entry)
        .and_then(|n| n.checked_add(header))
        .ok_or_else(|| bad("count overflows"))?;
    if entries > b.len() {
        return Err(bad("more entries than bytes"));
    }
    out.push(if object { '{' } else { '[' });
    for i in 0..count {
        if i > 0 {
            out.push_str(", ");
        }
        if object {
            let k = header + i * key_entry;
            let off = le(slice(b, k, w)?) as usize;
            let len = le(slice(b, k + w, 2)?) as usize;
            let key =
                std::str::from_utf8(slice(b, off, len)?).map_err(|_| bad("key is not UTF-8"))?;
            string(key, out);
            out.push_str(": ");
        }
        let v = header + count * key_entry + i * value_entry;
        let t = *b.get(v).ok_or_else(|| bad("truncated value entry"))?;
        let inline = matches!(t, 0x04..=0x06) || (large && matches!(t, 0x07 | 0x08));
        if inline {
            value(t, slice(b, v + 1, w)?, out, depth + 1)?;
        } else {
            let off = le(slice(b, v + 1, w)?) as usize;
            let rest = b
                .get(off..)
                .ok_or_else(|| bad("value offset past the end"))?;
            value(t, rest, out, depth + 1)?;
        }
    }
    out.push(if object { '}' } else { ']' });
    Ok(())
}

fn string(s: &str, out: &mut String) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars() {
        assert_eq!(to_text(&[0x04, 1]).unwrap(), "true");
        assert_eq!(to_text(&[0x05, 0xff, 0xff]).unwrap(), "-1");
        assert_eq!(to_text(&[0x0c, 2, b'h', b'i']).unwrap(), "\"hi\"");
        assert_eq!(to_text(&[]).unwrap(), "null");
    }

    #[test]
    fn small_object_with_inline_and_offset_values() {
        // {"a": 1, "b": "x"}: count 2, size, keys at 16/17, "b"'s value at 18.
        let mut d = vec![0x00];
        let body: Vec<u8> = vec![
            2, 0, 22, 0, // count, size
            18, 0, 1, 0, // key "a": offset 18, length 1
            19, 0, 1, 0, // key "b"
            0x05, 1, 0, // value a: int16 1 inline
            0x0c, 20, 0, // value b: string at 20
            b'a', b'b', 1, b'x',
        ];
        d.extend_from_slice(&body);
        assert_eq!(to_text(&d).unwrap(), r#"{"a": 1, "b": "x"}"#);
    }

    #[test]
    fn corrupt_documents_are_errors() {
        assert!(to_text(&[0x00, 200, 0, 4, 0]).is_err());
        assert!(to_text(&[0x0c, 0x80, 0x80, 0x80, 0x80, 0x80]).is_err());
        assert!(to_text(&[0x0f, 246, 1, 0]).is_err());
        // Deep nesting: arrays of one element each pointing at the next.
        let mut deep = vec![0x02];
        for _ in 0..200 {
            deep.extend_from_slice(&[1, 0, 7, 0, 0x02, 7, 0]);
        }
        assert!(to_text(&deep).is_err());
    }
}
