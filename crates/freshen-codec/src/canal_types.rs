//! How canal-json column values become [`Value`]s: by `mysqlType` (`"int"`,
//! `"varchar(64)"`, `"bigint(20) unsigned"`), else by `sqlType` (a `java.sql.Types`
//! code), else as text. The table of choices is in the crate docs; the rule behind it:
//! a value that does not parse as its column's type stays text rather than failing the
//! message, because the event is a doorbell and losing it is worse than a key in text.

use freshen::Value;

use crate::json::Scalar;

/// The value family of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ColType {
    Int,
    Float,
    Bool,
    Json,
    Bytes,
    Text,
}

impl ColType {
    /// From a MySQL column type as canal writes it (`"int(11) unsigned"`, `"json"`).
    pub(crate) fn from_mysql(t: &str) -> ColType {
        let t = t.trim();
        let base = t
            .split(|c: char| c == '(' || c.is_ascii_whitespace())
            .next()
            .unwrap_or("");
        let is = |name: &str| base.eq_ignore_ascii_case(name);
        if [
            "tinyint",
            "smallint",
            "mediumint",
            "int",
            "integer",
            "bigint",
            "year",
            "bit",
        ]
        .iter()
        .any(|n| is(n))
        {
            ColType::Int
        } else if ["float", "double", "real"].iter().any(|n| is(n)) {
            ColType::Float
        } else if is("bool") || is("boolean") {
            ColType::Bool
        } else if is("json") {
            ColType::Json
        } else if [
            "binary",
            "varbinary",
            "tinyblob",
            "blob",
            "mediumblob",
            "longblob",
        ]
        .iter()
        .any(|n| is(n))
        {
            ColType::Bytes
        } else {
            ColType::Text
        }
    }

    /// From a `java.sql.Types` code.
    pub(crate) fn from_sql(code: i64) -> ColType {
        match code {
            // BIT, TINYINT, SMALLINT, INTEGER, BIGINT
            -7 | -6 | 5 | 4 | -5 => ColType::Int,
            // FLOAT, REAL, DOUBLE
            6..=8 => ColType::Float,
            // BOOLEAN
            16 => ColType::Bool,
            // BINARY, VARBINARY, LONGVARBINARY, BLOB
            -2 | -3 | -4 | 2004 => ColType::Bytes,
            _ => ColType::Text,
        }
    }

    /// From a column's `mysqlType` entry, else its `sqlType` entry, else text.
    pub(crate) fn of(mysql: Option<&Scalar<'_>>, sql: Option<&Scalar<'_>>) -> ColType {
        // An empty entry (Canal on MySQL 8 without table metadata) says nothing.
        if let Some(Scalar::Str(t)) = mysql
            && !t.trim().is_empty()
        {
            return ColType::from_mysql(t);
        }
        match sql {
            Some(Scalar::I64(code)) => ColType::from_sql(*code),
            Some(Scalar::Str(code)) => code.trim().parse().map_or(ColType::Text, ColType::from_sql),
            _ => ColType::Text,
        }
    }

    /// Converts one wire value of a column of this type.
    pub(crate) fn convert(self, raw: &Scalar<'_>) -> Value {
        match raw {
            Scalar::Null => Value::Null,
            Scalar::Bool(b) => Value::Bool(*b),
            Scalar::I64(i) => match self {
                ColType::Float => Value::Float(*i as f64),
                _ => Value::Int(*i),
            },
            Scalar::U64(u) => Value::Text(u.to_string().into()),
            Scalar::F64(x) => Value::Float(*x),
            Scalar::Nested(json) => Value::Json(json.as_str().into()),
            Scalar::Str(s) => self.convert_str(s),
        }
    }

    fn convert_str(self, s: &str) -> Value {
        let text = || Value::Text(Box::from(s));
        match self {
            ColType::Text => text(),
            ColType::Int => s.parse().map_or_else(|_| text(), Value::Int),
            ColType::Float => s.parse().map_or_else(|_| text(), Value::Float),
            ColType::Bool => match s {
                "1" | "true" | "TRUE" => Value::Bool(true),
                "0" | "false" | "FALSE" => Value::Bool(false),
                _ => text(),
            },
            ColType::Json => Value::Json(Box::from(s)),
            ColType::Bytes => latin1_bytes(s).map_or_else(text, |b| Value::Bytes(b.into())),
        }
    }
}

/// The bytes behind ISO-8859-1 text (each char U+0000..=U+00FF is one byte).
fn latin1_bytes(s: &str) -> Option<Vec<u8>> {
    s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Scalar<'_> {
        Scalar::Str(std::borrow::Cow::Borrowed(v))
    }

    #[test]
    fn mysql_type_names() {
        assert_eq!(ColType::from_mysql("int"), ColType::Int);
        assert_eq!(ColType::from_mysql("bigint(20) unsigned"), ColType::Int);
        assert_eq!(ColType::from_mysql("TINYINT(1)"), ColType::Int);
        assert_eq!(ColType::from_mysql("double precision"), ColType::Float);
        assert_eq!(ColType::from_mysql("json"), ColType::Json);
        assert_eq!(ColType::from_mysql("varbinary(16)"), ColType::Bytes);
        assert_eq!(ColType::from_mysql("mediumblob"), ColType::Bytes);
        assert_eq!(ColType::from_mysql("decimal(10,2)"), ColType::Text);
        assert_eq!(ColType::from_mysql("text"), ColType::Text);
        assert_eq!(ColType::from_mysql(""), ColType::Text);
    }

    #[test]
    fn values_by_type() {
        assert_eq!(ColType::Int.convert(&s("-42")), Value::Int(-42));
        assert_eq!(
            ColType::Int.convert(&s("18446744073709551615")),
            Value::text("18446744073709551615"),
        );
        assert_eq!(ColType::Float.convert(&s("1.5")), Value::Float(1.5));
        assert_eq!(ColType::Bool.convert(&s("1")), Value::Bool(true));
        assert_eq!(
            ColType::Json.convert(&s("{\"a\":1}")),
            Value::Json("{\"a\":1}".into())
        );
        assert_eq!(ColType::Text.convert(&s("10.50")), Value::text("10.50"));
        assert_eq!(ColType::Int.convert(&s("n/a")), Value::text("n/a"));
        assert_eq!(ColType::Int.convert(&Scalar::Null), Value::Null);
    }

    #[test]
    fn bytes_are_latin1_text() {
        assert_eq!(
            ColType::Bytes.convert(&s("\u{0}\u{ff}A")),
            Value::Bytes(vec![0, 0xff, b'A'].into()),
        );
        assert_eq!(ColType::Bytes.convert(&s("€")), Value::text("€"));
    }

    #[test]
    fn sql_type_codes() {
        assert_eq!(ColType::of(None, Some(&Scalar::I64(4))), ColType::Int);
        assert_eq!(ColType::of(None, Some(&Scalar::I64(2004))), ColType::Bytes);
        assert_eq!(
            ColType::of(Some(&s("json")), Some(&Scalar::I64(12))),
            ColType::Json
        );
        assert_eq!(ColType::of(None, None), ColType::Text);
    }

    #[test]
    fn an_empty_mysql_type_defers_to_the_sql_type() {
        let t = ColType::of(Some(&s("")), Some(&Scalar::I64(4)));
        assert_eq!(t, ColType::Int);
        assert_eq!(t.convert(&s("5")), Value::Int(5));
        assert_eq!(
            ColType::of(Some(&s(" ")), Some(&Scalar::I64(8))).convert(&s("1.5")),
            Value::Float(1.5)
        );
        assert_eq!(ColType::of(Some(&s("")), None), ColType::Text);
    }
}
