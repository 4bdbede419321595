//! One column value of a row image, from its bytes to a [`freshen::Value`].
//!
//! The text forms are the ones the server's text protocol prints, so that keys read from
//! the binlog equal keys an enumerate query lists: DECIMAL with exactly its scale's
//! digits, dates `YYYY-MM-DD`, times `[-]HH:MM:SS[.f…]` with the column's fractional
//! digits, TIMESTAMP in UTC (rebuild and enumerate sessions set `time_zone = '+00:00'`),
//! ENUM as its member, SET as its members joined by commas.

use std::fmt::Write;

use freshen::Value;

use super::DecodeError;
use super::charset::{Charset, latin1};
use super::cursor::{Cursor, be};
use super::table_map::{Column, Kind};

/// Decodes the value of `col` at the cursor.
pub(crate) fn decode(c: &mut Cursor<'_>, col: &Column) -> Result<Value, DecodeError> {
    Ok(match col.kind {
        Kind::Int(n) => {
            let raw = c.uint(usize::from(n), "integer")?;
            int(raw, n, col.unsigned)
        }
        Kind::Float => {
            let raw = c.u32("float")?;
            Value::Float(f64::from(f32::from_bits(raw)))
        }
        Kind::Double => Value::Float(f64::from_bits(c.u64("double")?)),
        Kind::Decimal { precision, scale } => Value::Text(decimal(c, precision, scale)?.into()),
        Kind::Year => {
            let y = c.u8("year")?;
            Value::Int(if y == 0 { 0 } else { 1900 + i64::from(y) })
        }
        Kind::Date => Value::Text(date(c.uint(3, "date")? as u32).into()),
        Kind::Time => {
            let raw = c.uint(3, "time")? as u32;
            // A 24-bit signed HHMMSS.
            let v = ((raw << 8) as i32) >> 8;
            let neg = v < 0;
            let v = v.unsigned_abs();
            let s = format!(
                "{}{:02}:{:02}:{:02}",
                if neg { "-" } else { "" },
                v / 10000,
                v / 100 % 100,
                v % 100
            );
            Value::Text(s.into())
        }
        Kind::DateTime => {
            let v = c.u64("datetime")?;
            let (d, t) = (v / 1_000_000, v % 1_000_000);
            let s = format!(
                "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
                d / 10000,
                d / 100 % 100,
                d % 100,
                t / 10000,
                t / 100 % 100,
                t % 100
            );
            Value::Text(s.into())
        }
        Kind::Timestamp => Value::Text(timestamp(u64::from(c.u32("timestamp")?), 0, 0).into()),
        Kind::Timestamp2 { fsp } => {
            let secs = be(c.take(4, "timestamp")?);
            let usec = frac(c, fsp)?;
            Value::Text(timestamp(secs, usec, fsp).into())
        }
        Kind::DateTime2 { fsp } => {
            let packed = be(c.take(5, "datetime")?);
            let usec = frac(c, fsp)?;
            Value::Text(datetime2(packed, usec, fsp).into())
        }
        Kind::Time2 { fsp } => Value::Text(time2(c, fsp)?.into()),
        Kind::Str { len_bytes } => {
            let n = c.uint(usize::from(len_bytes), "string length")? as usize;
            string(c.take(n, "string")?, col.charset)
        }
        Kind::Blob { len_bytes } => {
            let n = c.uint(usize::from(len_bytes), "blob length")? as usize;
            string(c.take(n, "blob")?, col.charset)
        }
        Kind::Json { len_bytes } => {
            let n = c.uint(usize::from(len_bytes), "json length")? as usize;
            let b = c.take(n, "json")?;
            super::json::to_text(b)
                .map_or_else(|_| Value::Bytes(b.into()), |s| Value::Json(s.into()))
        }
        Kind::Bit { len } => Value::Bytes(c.take(usize::from(len), "bit")?.into()),
        Kind::Enum { pack } => {
            let i = c.uint(usize::from(pack), "enum")? as usize;
            match (i, &col.members) {
                (0, _) => Value::Text("".into()),
                (i, Some(m)) if i <= m.len() => Value::Text(m[i - 1].clone()),
                (i, _) => Value::Int(i as i64),
            }
        }
        Kind::Set { pack } => {
            let bits = c.uint(usize::from(pack), "set")?;
            match &col.members {
                Some(m) => {
                    let mut s = String::new();
                    for (i, name) in m.iter().enumerate().take(64) {
                        if bits & (1 << i) != 0 {
                            if !s.is_empty() {
                                s.push(',');
                            }
                            s.push_str(name);
                        }
                    }
                    Value::Text(s.into())
                }
                None => Value::Int(bits as i64),
            }
        }
        Kind::Null => Value::Null,
    })
}

fn int(raw: u64, bytes: u8, unsigned: bool) -> Value {
    if unsigned {
        return match i64::try_from(raw) {
            Ok(v) => Value::Int(v),
            // Above i64: the exact decimal text (what the server prints).
            Err(_) => Value::Text(raw.to_string().into()),
        };
    }
    let shift = 64 - 8 * u32::from(bytes);
    Value::Int(((raw << shift) as i64) >> shift)
}

fn string(b: &[u8], charset: Charset) -> Value {
    match charset {
        Charset::Utf8 => match std::str::from_utf8(b) {
            Ok(s) => Value::Text(s.into()),
            Err(_) => Value::Bytes(b.into()),
        },
        Charset::Latin1 => Value::Text(latin1(b).into()),
        Charset::Binary | Charset::Other => Value::Bytes(b.into()),
    }
}

/// Fractional seconds of `fsp` digits stored in `(fsp + 1) / 2` big-endian bytes, as
/// microseconds.
fn frac(c: &mut Cursor<'_>, fsp: u8) -> Result<u32, DecodeError> {
    Ok(match fsp {
        0 => 0,
        1 | 2 => be(c.take(1, "fraction")?) as u32 * 10_000,
        3 | 4 => be(c.take(2, "fraction")?) as u32 * 100,
        _ => be(c.take(3, "fraction")?) as u32,
    })
}

/// `.f…` with `fsp` digits of `usec` (nothing for fsp 0).
fn push_frac(s: &mut String, usec: u32, fsp: u8) {
    if fsp > 0 {
        let digits = usec / 10u32.pow(6 - u32::from(fsp));
        let _ = write!(s, ".{digits:0width$}", width = usize::from(fsp));
    }
}

fn date(v: u32) -> String {
    format!("{:04}-{:02}-{:02}", v >> 9, (v >> 5) & 15, v & 31)
}

fn datetime2(packed: u64, usec: u32, fsp: u8) -> String {
    // 1 sign bit (always set: DATETIME is never negative), 17 bits year*13+month,
    // 5 day, 5 hour, 6 minute, 6 second.
    let v = packed.wrapping_sub(0x80_0000_0000) & 0x7f_ffff_ffff;
    let ymd = v >> 17;
    let ym = ymd >> 5;
    let hms = v & 0x1ffff;
    let mut s = format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        ym / 13,
        ym % 13,
        ymd & 31,
        hms >> 12,
        (hms >> 6) & 63,
        hms & 63
    );
    push_frac(&mut s, usec, fsp);
    s
}

fn time2(c: &mut Cursor<'_>, fsp: u8) -> Result<String, DecodeError> {
    const INT_OFS: i64 = 0x80_0000;
    let int_part = be(c.take(3, "time")?) as i64 - INT_OFS;
    // The packed form: integer part << 24 | fraction in microseconds.
    let packed: i64 = match fsp {
        0 => int_part << 24,
        1 | 2 => {
            let (mut i, mut f) = (int_part, be(c.take(1, "time fraction")?) as i64);
            if i < 0 && f != 0 {
                i += 1;
                f -= 0x100;
            }
            (i << 24) + f * 10_000
        }
        3 | 4 => {
            let (mut i, mut f) = (int_part, be(c.take(2, "time fraction")?) as i64);
            if i < 0 && f != 0 {
                i += 1;
                f -= 0x10000;
            }
            (i << 24) + f * 100
        }
        _ => {
            let f = be(c.take(3, "time fraction")?) as i64;
            (int_part << 24) | f
        }
    };
    let neg = packed < 0;
    let p = packed.unsigned_abs();
    let hms = p >> 24;
    let usec = (p % (1 << 24)) as u32;
    let mut s = format!(
        "{}{:02}:{:02}:{:02}",
        if neg { "-" } else { "" },
        (hms >> 12) % (1 << 10),
        (hms >> 6) % 64,
        hms % 64
    );
    push_frac(&mut s, usec, fsp);
    Ok(s)
}

/// Seconds since the epoch (UTC) as `YYYY-MM-DD HH:MM:SS[.f…]`; 0 is MySQL's zero
/// timestamp.
fn timestamp(secs: u64, usec: u32, fsp: u8) -> String {
    let mut s = if secs == 0 {
        "0000-00-00 00:00:00".to_string()
    } else {
        let days = (secs / 86_400) as i64;
        let rem = secs % 86_400;
        let (y, m, d) = civil(days);
        format!(
            "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
            rem / 3600,
            rem / 60 % 60,
            rem % 60
        )
    };
    push_frac(&mut s, usec, fsp);
    s
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Bytes a group of `digits` (< 9) decimal digits takes.
const DIG2BYTES: [usize; 10] = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4];

/// MySQL's binary DECIMAL: groups of 9 digits in 4 big-endian bytes, a shorter leading
/// and trailing group, the sign in the first bit (set: positive), negative values with
/// every bit inverted.
fn decimal(c: &mut Cursor<'_>, precision: u8, scale: u8) -> Result<String, DecodeError> {
    let (precision, scale) = (usize::from(precision), usize::from(scale));
    let intg = precision - scale;
    let (intg0, intg0x) = (intg / 9, intg % 9);
    let (frac0, frac0x) = (scale / 9, scale % 9);
    let size = intg0 * 4 + DIG2BYTES[intg0x] + frac0 * 4 + DIG2BYTES[frac0x];
    let raw = c.take(size, "decimal")?;
    if raw.is_empty() {
        return Err(DecodeError::new("decimal: no bytes".to_string()));
    }
    let neg = raw[0] & 0x80 == 0;
    let mask = if neg { 0xff } else { 0 };
    let mut bytes = [0u8; 32];
    let bytes = &mut bytes[..size];
    for (d, s) in bytes.iter_mut().zip(raw) {
        *d = s ^ mask;
    }
    bytes[0] ^= 0x80;
    let mut p = Cursor::new(bytes);
    let mut int_digits = String::new();
    let group = |p: &mut Cursor<'_>, n: usize, width: usize, out: &mut String| {
        let v = be(p.take(n, "decimal group")?);
        if width > 0 {
            let _ = write!(out, "{v:0width$}");
        }
        Ok::<(), DecodeError>(())
    };
    if intg0x > 0 {
        group(&mut p, DIG2BYTES[intg0x], intg0x, &mut int_digits)?;
    }
    for _ in 0..intg0 {
        group(&mut p, 4, 9, &mut int_digits)?;
    }
    let mut frac_digits = String::new();
    for _ in 0..frac0 {
        group(&mut p, 4, 9, &mut frac_digits)?;
    }
    if frac0x > 0 {
        group(&mut p, DIG2BYTES[frac0x], frac0x, &mut frac_digits)?;
    }
    let trimmed = int_digits.trim_start_matches('0');
    let mut s = String::with_capacity(precision + 3);
    if neg {
        s.push('-');
    }
    s.push_str(if trimmed.is_empty() { "0" } else { trimmed });
    if scale > 0 {
        s.push('.');
        // A corrupt group can print more digits than it should: keep the scale.
        s.push_str(frac_digits.get(..scale).unwrap_or(&frac_digits));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(kind: Kind) -> Column {
        Column {
            kind,
            code: 0,
            unsigned: false,
            charset: Charset::Utf8,
            members: None,
        }
    }

    fn one(kind: Kind, bytes: &[u8]) -> Value {
        let mut c = Cursor::new(bytes);
        let v = decode(&mut c, &col(kind)).unwrap();
        assert!(c.is_empty(), "{kind:?} left {} bytes", c.remaining());
        v
    }

    #[test]
    fn integers_and_signedness() {
        assert_eq!(one(Kind::Int(1), &[0xff]), Value::Int(-1));
        assert_eq!(one(Kind::Int(3), &[0xff, 0xff, 0xff]), Value::Int(-1));
        assert_eq!(one(Kind::Int(2), &[0x34, 0x12]), Value::Int(0x1234));
        let mut u = col(Kind::Int(1));
        u.unsigned = true;
        assert_eq!(
            decode(&mut Cursor::new(&[0xff]), &u).unwrap(),
            Value::Int(255)
        );
        u.kind = Kind::Int(8);
        assert_eq!(
            decode(&mut Cursor::new(&[0xff; 8]), &u).unwrap(),
            Value::Text("18446744073709551615".into())
        );
    }

    #[test]
    fn decimals() {
        // DECIMAL(10,2) 1234.56 and -1234.56, from the server's bytes.
        let pos = [0x80, 0x00, 0x04, 0xd2, 0x38];
        assert_eq!(
            one(
                Kind::Decimal {
                    precision: 10,
                    scale: 2
                },
                &pos
            ),
            Value::text("1234.56")
        );
        let neg: Vec<u8> = pos.iter().map(|b| b ^ 0xff).collect();
        assert_eq!(
            one(
                Kind::Decimal {
                    precision: 10,
                    scale: 2
                },
                &neg
            ),
            Value::text("-1234.56")
        );
        // DECIMAL(5,2) 0.05: the integer part prints as 0, the scale is kept.
        assert_eq!(
            one(
                Kind::Decimal {
                    precision: 5,
                    scale: 2
                },
                &[0x80, 0x00, 0x05]
            ),
            Value::text("0.05")
        );
        // DECIMAL(20,0) 123456789012: two integer groups.
        let big = [0x80, 0x00, 0x00, 0x00, 0x7b, 0x1b, 0x3a, 0x0c, 0x14];
        assert_eq!(
            one(
                Kind::Decimal {
                    precision: 20,
                    scale: 0
                },
                &big[..]
            )
            .to_text()
            .unwrap(),
            "123456789012"
        );
    }

    #[test]
    fn dates_and_times() {
        // 2024-02-29: 2024 << 9 | 2 << 5 | 29.
        let d = (2024u32 << 9) | (2 << 5) | 29;
        assert_eq!(
            one(Kind::Date, &d.to_le_bytes()[..3]),
            Value::text("2024-02-29")
        );
        // DATETIME(0) 2024-02-29 13:14:15.
        let ym = 2024u64 * 13 + 2;
        let packed = 0x80_0000_0000u64 + (((ym << 5) | 29) << 17) + ((13 << 12) | (14 << 6) | 15);
        let b = &packed.to_be_bytes()[3..];
        assert_eq!(
            one(Kind::DateTime2 { fsp: 0 }, b),
            Value::text("2024-02-29 13:14:15")
        );
        // DATETIME(3) …​.123: two fraction bytes holding 1230 (in 1/10000 s).
        let mut b3 = b.to_vec();
        b3.extend_from_slice(&1230u16.to_be_bytes());
        assert_eq!(
            one(Kind::DateTime2 { fsp: 3 }, &b3),
            Value::text("2024-02-29 13:14:15.123")
        );
        // TIMESTAMP(6) 1700000000.000042 UTC.
        let mut t = 1_700_000_000u32.to_be_bytes().to_vec();
        t.extend_from_slice(&42u32.to_be_bytes()[1..]);
        assert_eq!(
            one(Kind::Timestamp2 { fsp: 6 }, &t),
            Value::text("2023-11-14 22:13:20.000042")
        );
        assert_eq!(
            one(Kind::Timestamp2 { fsp: 0 }, &[0, 0, 0, 0]),
            Value::text("0000-00-00 00:00:00")
        );
        assert_eq!(one(Kind::Year, &[124]), Value::Int(2024));
    }

    #[test]
    fn time2_positive_and_negative() {
        // 838:59:59 and -01:00:00.5 (fsp 1).
        let hms = |h: i64, m: i64, s: i64| (h << 12) | (m << 6) | s;
        let pos = (0x80_0000 + hms(838, 59, 59)) as u32;
        assert_eq!(
            one(Kind::Time2 { fsp: 0 }, &pos.to_be_bytes()[1..]),
            Value::text("838:59:59")
        );
        // -01:00:00.50: packed = -(hms(1,0,0) << 24 | 500000); int part floor, frac borrow.
        let packed: i64 = -((hms(1, 0, 0) << 24) + 500_000);
        let int_part = (packed >> 24) + 0x80_0000; // floor division
        // The server stores C's truncating remainder: -500000 µs as the byte -50.
        let frac = (-50i8) as u8;
        let mut b = (int_part as u32).to_be_bytes()[1..].to_vec();
        b.push(frac);
        assert_eq!(one(Kind::Time2 { fsp: 2 }, &b), Value::text("-01:00:00.50"));
    }

    #[test]
    fn strings_by_charset() {
        let mut c = col(Kind::Str { len_bytes: 1 });
        assert_eq!(
            decode(&mut Cursor::new(b"\x03abc"), &c).unwrap(),
            Value::text("abc")
        );
        c.charset = Charset::Latin1;
        assert_eq!(
            decode(&mut Cursor::new(b"\x02\xe9\x80"), &c).unwrap(),
            Value::text("é€")
        );
        c.charset = Charset::Binary;
        assert_eq!(
            decode(&mut Cursor::new(b"\x02\x00\xff"), &c).unwrap(),
            Value::Bytes(vec![0, 255].into())
        );
        let blob = col(Kind::Blob { len_bytes: 2 });
        assert_eq!(
            decode(&mut Cursor::new(b"\x01\x00z"), &blob).unwrap(),
            Value::text("z")
        );
    }

    #[test]
    fn enum_and_set_members() {
        let mut e = col(Kind::Enum { pack: 1 });
        e.members = Some(vec![Box::from("red"), Box::from("blue")].into());
        assert_eq!(
            decode(&mut Cursor::new(&[2]), &e).unwrap(),
            Value::text("blue")
        );
        assert_eq!(decode(&mut Cursor::new(&[0]), &e).unwrap(), Value::text(""));
        assert_eq!(decode(&mut Cursor::new(&[9]), &e).unwrap(), Value::Int(9));
        let mut s = col(Kind::Set { pack: 1 });
        s.members = Some(vec![Box::from("a"), Box::from("b"), Box::from("c")].into());
        assert_eq!(
            decode(&mut Cursor::new(&[0b101]), &s).unwrap(),
            Value::text("a,c")
        );
        assert_eq!(decode(&mut Cursor::new(&[0]), &s).unwrap(), Value::text(""));
    }

    #[test]
    fn truncated_values_are_errors() {
        for kind in [
            Kind::Int(8),
            Kind::Decimal {
                precision: 10,
                scale: 2,
            },
            Kind::DateTime2 { fsp: 6 },
            Kind::Time2 { fsp: 4 },
            Kind::Str { len_bytes: 2 },
            Kind::Blob { len_bytes: 4 },
        ] {
            assert!(
                decode(&mut Cursor::new(&[0x80]), &col(kind)).is_err(),
                "{kind:?}"
            );
        }
        // A length that claims more than is there.
        assert!(
            decode(
                &mut Cursor::new(b"\x09abc"),
                &col(Kind::Str { len_bytes: 1 })
            )
            .is_err()
        );
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_782), (2024, 2, 29));
        assert_eq!(civil(-1), (1969, 12, 31));
    }
}
