//! `$n` placeholders and typed key parts.
//!
//! Rebuild statements name key parts as `$1`, `$2`, … — the PostgreSQL source's
//! spelling, so one `rebuild` configuration reads the same for both sources, and a part
//! can be used twice (`… WHERE a = $1 UNION … WHERE b = $1`), which MySQL's positional
//! `?` cannot say. Each statement is rewritten to `?` markers once, at build; `$` inside
//! string literals, quoted identifiers and comments is left alone, and a bare `?` is
//! refused so that the two spellings never mix.

use std::fmt;
use std::str::FromStr;

use freshen::Key;
use serde::Deserialize;

/// A statement rewritten for the server: `?` markers and, per marker, the key part
/// (0-based) it binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rewritten {
    pub(crate) sql: String,
    pub(crate) parts: Vec<usize>,
}

/// Rewrites `$n` to `?`; errors name what is wrong.
pub(crate) fn rewrite(sql: &str) -> Result<Rewritten, String> {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut parts = Vec::new();
    let mut i = 0;
    let mut copied = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"' | b'`') => {
                i += 1;
                while i < b.len() {
                    if b[i] == b'\\' && q != b'`' {
                        i += 2;
                        continue;
                    }
                    if b[i] == q {
                        if b.get(i + 1) == Some(&q) {
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    i += 1;
                }
                if i >= b.len() {
                    return Err(format!("unclosed {} quote", q as char));
                }
                i += 1;
            }
            b'-' if b.get(i + 1) == Some(&b'-')
                && b.get(i + 2).is_none_or(|c| c.is_ascii_whitespace()) =>
            {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => match sql[i + 2..].find("*/") {
                Some(end) => i += 2 + end + 2,
                None => return Err("unclosed /* comment".into()),
            },
            b'?' => {
                return Err(
                    "uses ?: write key parts as $1, $2, … (one spelling for every source)".into(),
                );
            }
            b'$' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                let n: usize = sql[i + 1..i + 1 + digits]
                    .parse()
                    .map_err(|_| "a placeholder number is too large".to_string())?;
                if n == 0 {
                    return Err("$0 is not a key part: parts are numbered from $1".into());
                }
                out.push_str(&sql[copied..i]);
                out.push('?');
                parts.push(n - 1);
                i += 1 + digits;
                copied = i;
            }
            _ => i += 1,
        }
    }
    out.push_str(&sql[copied..]);
    Ok(Rewritten { sql: out, parts })
}

/// How a key part is bound to its placeholder.
///
/// Key parts are text (the form the binlog and enumerate queries give). Bound as text,
/// MySQL converts them to the compared column's type — exactly for DECIMAL, dates and
/// strings, but through a double for integer columns, which is wrong above 2^53; so
/// integer parts should be declared `int` (or `uint`), and binary parts `bytes` (their
/// text is `\x` hex).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyType {
    /// Sent as a string (the default).
    #[default]
    Text,
    /// A signed 64-bit integer.
    Int,
    /// An unsigned 64-bit integer.
    Uint,
    /// Bytes, from the `\x…` hex text of a binary key part.
    Bytes,
}

impl FromStr for KeyType {
    type Err = String;

    fn from_str(s: &str) -> Result<KeyType, String> {
        match s {
            "text" => Ok(KeyType::Text),
            "int" => Ok(KeyType::Int),
            "uint" => Ok(KeyType::Uint),
            "bytes" => Ok(KeyType::Bytes),
            _ => Err(format!("key type {s:?} is not text, int, uint or bytes")),
        }
    }
}

impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyType::Text => "text",
            KeyType::Int => "int",
            KeyType::Uint => "uint",
            KeyType::Bytes => "bytes",
        })
    }
}

/// Part `part` of `key` as a parameter of type `ty`.
pub(crate) fn bind(key: &Key, part: usize, ty: KeyType) -> Result<mysql_async::Value, String> {
    let Some(p) = key.parts().nth(part) else {
        // Never the key's value: perhaps one `[[redact]]` hides, and this message
        // reaches logs and `/status`.
        return Err(format!(
            "uses ${} but a key has {} part(s)",
            part + 1,
            key.len()
        ));
    };
    let Some(text) = p else {
        return Ok(mysql_async::Value::NULL);
    };
    let bad = || format!("part {} of a key is not a valid {ty}", part + 1);
    Ok(match ty {
        KeyType::Text => mysql_async::Value::Bytes(text.as_bytes().to_vec()),
        KeyType::Int => mysql_async::Value::Int(text.trim().parse().map_err(|_| bad())?),
        KeyType::Uint => mysql_async::Value::UInt(text.trim().parse().map_err(|_| bad())?),
        KeyType::Bytes => mysql_async::Value::Bytes(unhex(text).ok_or_else(bad)?),
    })
}

/// Part `part` of every key as one JSON array, for a set statement's `$n` (read with
/// `JSON_TABLE`): integer parts as numbers, text as strings, binary parts as hex strings
/// (their `\x` dropped: `UNHEX`), a NULL part as `null`. Errors never carry a key's
/// value: perhaps one `[[redact]]` hides.
pub(crate) fn bind_set(
    keys: &[&Key],
    part: usize,
    ty: KeyType,
) -> Result<mysql_async::Value, String> {
    use serde_json::Value as J;
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let Some(p) = key.parts().nth(part) else {
            return Err(format!(
                "uses ${} but a key has {} part(s)",
                part + 1,
                key.len()
            ));
        };
        let Some(text) = p else {
            out.push(J::Null);
            continue;
        };
        let bad = || format!("part {} of a key is not a valid {ty}", part + 1);
        out.push(match ty {
            KeyType::Text => J::from(text),
            KeyType::Int => J::from(text.trim().parse::<i64>().map_err(|_| bad())?),
            KeyType::Uint => J::from(text.trim().parse::<u64>().map_err(|_| bad())?),
            KeyType::Bytes => {
                unhex(text).ok_or_else(bad)?;
                J::from(&text[2..])
            }
        });
    }
    Ok(mysql_async::Value::Bytes(
        J::Array(out).to_string().into_bytes(),
    ))
}

/// `\x0a0b` → bytes.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    let h = s.strip_prefix("\\x")?;
    if h.len() % 2 != 0 {
        return None;
    }
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_dollar_placeholders() {
        let r = rewrite("DELETE FROM t WHERE a = $1 AND b = $2 OR c = $1").unwrap();
        assert_eq!(r.sql, "DELETE FROM t WHERE a = ? AND b = ? OR c = ?");
        assert_eq!(r.parts, [0, 1, 0]);
    }

    #[test]
    fn leaves_quotes_and_comments_alone() {
        let r = rewrite("SELECT '$1', \"$2\", `$3`, 'it''s $4' /* $5 */ -- $6\n, $1 # $7").unwrap();
        assert_eq!(r.parts, [0]);
        assert!(r.sql.contains("'$1'") && r.sql.contains("/* $5 */") && r.sql.ends_with("? # $7"));
        let r = rewrite(r"SELECT 'a\'$1' , $2").unwrap();
        assert_eq!(r.parts, [1]);
    }

    #[test]
    fn refuses_question_marks_and_bad_numbers() {
        assert!(rewrite("SELECT ?").unwrap_err().contains("$1"));
        assert!(rewrite("SELECT $0").is_err());
        assert!(rewrite("SELECT 'open").is_err());
        assert!(rewrite("SELECT 1 /* open").is_err());
        assert_eq!(rewrite("SELECT '?'").unwrap().parts, Vec::<usize>::new());
    }

    #[test]
    fn binds_typed_parts() {
        let k = Key::from_parts([Some("42"), None, Some("\\x00ff")]);
        assert_eq!(
            bind(&k, 0, KeyType::Int).unwrap(),
            mysql_async::Value::Int(42)
        );
        assert_eq!(bind(&k, 1, KeyType::Int).unwrap(), mysql_async::Value::NULL);
        assert_eq!(
            bind(&k, 2, KeyType::Bytes).unwrap(),
            mysql_async::Value::Bytes(vec![0, 255])
        );
        assert_eq!(
            bind(&k, 0, KeyType::Text).unwrap(),
            mysql_async::Value::Bytes(b"42".to_vec())
        );
        assert!(
            bind(&k, 2, KeyType::Int)
                .unwrap_err()
                .contains("not a valid int")
        );
        assert!(bind(&k, 3, KeyType::Text).unwrap_err().contains("$4"));
        assert_eq!(
            bind(&Key::from("18446744073709551615"), 0, KeyType::Uint).unwrap(),
            mysql_async::Value::UInt(u64::MAX)
        );
    }

    #[test]
    fn binds_a_part_of_every_key_as_one_json_array() {
        let a = Key::from_parts([Some("42"), Some("say \"hi\"\n"), Some("\\x00ff")]);
        let b = Key::from_parts([Some("18446744073709551615"), None, None]);
        let json = |v: mysql_async::Value| match v {
            mysql_async::Value::Bytes(b) => String::from_utf8(b).unwrap(),
            other => panic!("not bytes: {other:?}"),
        };
        assert_eq!(json(bind_set(&[&a], 0, KeyType::Int).unwrap()), "[42]");
        assert_eq!(
            json(bind_set(&[&a, &b], 0, KeyType::Uint).unwrap()),
            "[42,18446744073709551615]"
        );
        assert_eq!(
            json(bind_set(&[&a, &b], 1, KeyType::Text).unwrap()),
            r#"["say \"hi\"\n",null]"#
        );
        assert_eq!(
            json(bind_set(&[&a, &b], 2, KeyType::Bytes).unwrap()),
            r#"["00ff",null]"#
        );
        let e = bind_set(&[&a, &b], 0, KeyType::Int).unwrap_err();
        assert!(e.contains("not a valid int") && !e.contains("1844"), "{e}");
        assert!(
            bind_set(&[&a], 3, KeyType::Text)
                .unwrap_err()
                .contains("$4")
        );
    }
}
