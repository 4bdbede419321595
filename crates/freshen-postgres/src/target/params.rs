//! Key parts as typed statement parameters.
//!
//! A key part is text (the form PostgreSQL prints). It is sent in PostgreSQL's *text*
//! parameter format, so the server parses it with the parameter type's own input
//! function — exactly the inverse of the output that produced it — for every type:
//! int2/4/8, text, varchar, uuid, numeric, bool, date, timestamp[tz], and arrays of
//! them for batch statements. Integer, boolean and uuid parts are checked here first so
//! that a wrong key says which part and parameter are wrong.

use std::error::Error;

use bytes::BytesMut;
use tokio_postgres::types::{Format, IsNull, Kind, ToSql, Type, to_sql_checked};

/// One parameter value in text format; `None` is NULL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TextParam(pub(crate) Option<String>);

impl ToSql for TextParam {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match &self.0 {
            None => Ok(IsNull::Yes),
            Some(s) => {
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    fn encode_format(&self, _ty: &Type) -> Format {
        Format::Text
    }

    to_sql_checked!();
}

/// Checks that `text` can be a value of `ty` where that is cheap to know.
pub(crate) fn check_scalar(ty: &Type, text: &str) -> Result<(), String> {
    let ok = match *ty {
        Type::INT2 => text.trim().parse::<i16>().is_ok(),
        Type::INT4 => text.trim().parse::<i32>().is_ok(),
        Type::INT8 => text.trim().parse::<i64>().is_ok(),
        Type::BOOL => matches!(
            text.trim().to_ascii_lowercase().as_str(),
            "t" | "f" | "true" | "false" | "1" | "0" | "yes" | "no" | "on" | "off" | "y" | "n"
        ),
        Type::UUID => {
            let hex: String = text
                .chars()
                .filter(|c| *c != '-' && *c != '{' && *c != '}')
                .collect();
            hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit())
        }
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        // Never the value: it is a key's, perhaps one `[[redact]]` hides, and this
        // message reaches logs and `/status`.
        Err(format!("not a valid {}", ty.name()))
    }
}

/// The element type of an array type.
pub(crate) fn element(ty: &Type) -> Option<&Type> {
    match ty.kind() {
        Kind::Array(e) => Some(e),
        _ => None,
    }
}

/// A PostgreSQL array literal (`{"a","b",NULL}`) of text elements.
pub(crate) fn array_literal<'a>(items: impl IntoIterator<Item = Option<&'a str>>) -> String {
    let mut s = String::from("{");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        match item {
            None => s.push_str("NULL"),
            Some(t) => {
                s.push('"');
                for c in t.chars() {
                    if c == '"' || c == '\\' {
                        s.push('\\');
                    }
                    s.push(c);
                }
                s.push('"');
            }
        }
    }
    s.push('}');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_literals_quote_everything() {
        assert_eq!(
            array_literal([Some("a"), None, Some("")]),
            r#"{"a",NULL,""}"#
        );
        assert_eq!(array_literal([Some(r#"q"b\s"#)]), r#"{"q\"b\\s"}"#);
        assert_eq!(array_literal([Some("NULL")]), r#"{"NULL"}"#);
        assert_eq!(array_literal(std::iter::empty()), "{}");
    }

    #[test]
    fn scalar_checks() {
        assert!(check_scalar(&Type::INT4, "42").is_ok());
        assert!(check_scalar(&Type::INT2, "70000").is_err());
        assert!(check_scalar(&Type::INT8, "x").unwrap_err().contains("int8"));
        assert!(check_scalar(&Type::BOOL, "true").is_ok());
        assert!(check_scalar(&Type::UUID, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11").is_ok());
        assert!(check_scalar(&Type::UUID, "nope").is_err());
        assert!(check_scalar(&Type::NUMERIC, "anything: the server decides").is_ok());
    }
}
