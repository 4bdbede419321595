//! Character sets of string columns: a table map names each column's collation id; the
//! bytes in a row image are in that collation's character set.
//!
//! Text in UTF-8 (`utf8mb4`, `utf8mb3`), ASCII and `latin1` (which MySQL means as
//! Windows-1252) becomes [`Value::Text`](freshen::Value); `binary` strings and every
//! other character set stay [`Value::Bytes`](freshen::Value), since converting them
//! would need the server's tables. The built-in table covers the collations MySQL 8 and
//! MariaDB 10.x ship for those sets; a running source adds the server's own list
//! (`information_schema.COLLATIONS`), so new collation ids are known too.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

/// How a string column's bytes turn into a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Charset {
    /// UTF-8 (`utf8mb4`, `utf8mb3`) or ASCII: checked, then text.
    Utf8,
    /// `latin1`, which MySQL defines as Windows-1252: mapped to text.
    Latin1,
    /// `binary`: bytes.
    Binary,
    /// Another character set: bytes (not converted).
    Other,
}

impl Charset {
    /// The character set named `name` (`utf8mb4`, `latin1`, …).
    pub fn from_name(name: &str) -> Charset {
        match name.to_ascii_lowercase().as_str() {
            "utf8mb4" | "utf8mb3" | "utf8" | "ascii" => Charset::Utf8,
            "latin1" => Charset::Latin1,
            "binary" => Charset::Binary,
            _ => Charset::Other,
        }
    }
}

/// Collation id → character set, for the sets this crate decodes to text.
#[derive(Debug, Clone, Default)]
pub struct Charsets {
    server: Option<Arc<HashMap<u16, Charset>>>,
}

impl Charsets {
    /// The built-in table only.
    pub fn builtin() -> Charsets {
        Charsets::default()
    }

    /// The built-in table, overridden by the server's `(id, character set name)` list.
    pub fn with_server<I: IntoIterator<Item = (u16, String)>>(list: I) -> Charsets {
        let map = list
            .into_iter()
            .map(|(id, name)| (id, Charset::from_name(&name)))
            .collect();
        Charsets {
            server: Some(Arc::new(map)),
        }
    }

    /// The character set of collation `id`.
    pub fn of(&self, id: u16) -> Charset {
        if let Some(cs) = self.server.as_ref().and_then(|m| m.get(&id)) {
            return *cs;
        }
        builtin(id)
    }
}

/// The collations MySQL 8 and MariaDB 10.x define for UTF-8, ASCII, latin1 and binary.
fn builtin(id: u16) -> Charset {
    match id {
        63 => Charset::Binary,
        // latin1: swedish_ci, german1_ci, danish_ci, german2_ci, bin, general_ci,
        // general_cs, spanish_ci; MariaDB's nopad variants.
        5 | 8 | 15 | 31 | 47 | 48 | 49 | 94 | 1032 | 1071 | 1080 | 1082 => Charset::Latin1,
        // ascii_general_ci, ascii_bin (+ nopad).
        11 | 65 | 1035 | 1089 => Charset::Utf8,
        // utf8mb3: general_ci, bin, unicode_*, general_mysql500_ci, MySQL 8's 76;
        // MariaDB's nopad (1057, 1107, 1216..) variants.
        33 | 76 | 83 | 192..=215 | 223 | 1057 | 1107 | 1216..=1247 => Charset::Utf8,
        // utf8mb4: general_ci, bin, unicode_*, 0900_*, MariaDB's nopad and uca1400.
        45 | 46 | 224..=247 | 255..=323 | 1069 | 1070 | 1101 | 1124..=1151 | 2048..=3071 => {
            Charset::Utf8
        }
        _ => Charset::Other,
    }
}

/// Windows-1252's 0x80–0x9f (MySQL's latin1); the rest of the byte range is Unicode's.
const CP1252_HIGH: [char; 32] = [
    '\u{20ac}', '\u{81}', '\u{201a}', '\u{192}', '\u{201e}', '\u{2026}', '\u{2020}', '\u{2021}',
    '\u{2c6}', '\u{2030}', '\u{160}', '\u{2039}', '\u{152}', '\u{8d}', '\u{17d}', '\u{8f}',
    '\u{90}', '\u{2018}', '\u{2019}', '\u{201c}', '\u{201d}', '\u{2022}', '\u{2013}', '\u{2014}',
    '\u{2dc}', '\u{2122}', '\u{161}', '\u{203a}', '\u{153}', '\u{9d}', '\u{17e}', '\u{178}',
];

/// Bytes of `charset` as text (lossy for invalid UTF-8, which a server never sends for
/// a UTF-8 column).
pub(crate) fn text(bytes: &[u8], charset: Charset) -> Cow<'_, str> {
    match charset {
        Charset::Latin1 => Cow::Owned(latin1(bytes)),
        _ => String::from_utf8_lossy(bytes),
    }
}

/// latin1 (Windows-1252) bytes as text.
pub(crate) fn latin1(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            0x80..=0x9f => CP1252_HIGH[usize::from(b - 0x80)],
            _ => char::from(b),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_collations() {
        let c = Charsets::builtin();
        assert_eq!(c.of(45), Charset::Utf8);
        assert_eq!(c.of(255), Charset::Utf8);
        assert_eq!(c.of(33), Charset::Utf8);
        assert_eq!(c.of(8), Charset::Latin1);
        assert_eq!(c.of(63), Charset::Binary);
        assert_eq!(c.of(28), Charset::Other); // gbk
    }

    #[test]
    fn server_list_overrides() {
        let c = Charsets::with_server([(28, "gbk".to_string()), (4000, "utf8mb4".to_string())]);
        assert_eq!(c.of(4000), Charset::Utf8);
        assert_eq!(c.of(28), Charset::Other);
        assert_eq!(c.of(45), Charset::Utf8);
    }

    #[test]
    fn latin1_is_windows_1252() {
        assert_eq!(latin1(b"caf\xe9 \x80"), "café €");
        assert_eq!(latin1(b"\x81"), "\u{81}");
    }
}
