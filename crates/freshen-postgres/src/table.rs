//! [`TableName`]: a schema-qualified table name, parsed as PostgreSQL reads one and
//! quoted for SQL.

use std::fmt;
use std::str::FromStr;

use crate::quote::quote_ident;

/// A schema-qualified table name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName {
    /// Schema (`public` when not given).
    pub schema: String,
    /// Table.
    pub name: String,
}

impl TableName {
    /// `schema.name`.
    pub fn new(schema: impl Into<String>, name: impl Into<String>) -> TableName {
        TableName {
            schema: schema.into(),
            name: name.into(),
        }
    }

    /// The name quoted for SQL: `"schema"."name"`.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

impl FromStr for TableName {
    type Err = String;

    /// `table`, `schema.table`, with double quotes around parts that need them.
    fn from_str(s: &str) -> Result<TableName, String> {
        let mut parts = Vec::new();
        let mut cur = String::new();
        let mut quoted = false;
        let mut chars = s.trim().chars().peekable();
        let mut was_quoted = false;
        while let Some(c) = chars.next() {
            match (c, quoted) {
                ('"', false) => {
                    quoted = true;
                    was_quoted = true;
                }
                ('"', true) if chars.peek() == Some(&'"') => {
                    chars.next();
                    cur.push('"');
                }
                ('"', true) => quoted = false,
                ('.', false) => {
                    parts.push((std::mem::take(&mut cur), was_quoted));
                    was_quoted = false;
                }
                (c, _) => cur.push(c),
            }
        }
        if quoted {
            return Err(format!("unclosed quote in table name {s:?}"));
        }
        parts.push((cur, was_quoted));
        // Unquoted identifiers fold to lower case, as in SQL.
        let fold = |(p, q): (String, bool)| if q { p } else { p.to_lowercase() };
        let mut parts: Vec<String> = parts.into_iter().map(fold).collect();
        if parts.iter().any(|p| p.is_empty()) || parts.len() > 2 {
            return Err(format!(
                "invalid table name {s:?} (expected table or schema.table)"
            ));
        }
        let name = parts.pop().unwrap_or_default();
        let schema = parts.pop().unwrap_or_else(|| "public".into());
        Ok(TableName { schema, name })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert_eq!(
            "t".parse::<TableName>().unwrap(),
            TableName::new("public", "t")
        );
        assert_eq!(
            "S.T".parse::<TableName>().unwrap(),
            TableName::new("s", "t")
        );
        assert_eq!(
            r#""My Schema"."a.b""#.parse::<TableName>().unwrap(),
            TableName::new("My Schema", "a.b")
        );
        assert!("a.b.c".parse::<TableName>().is_err());
        assert!("\"open".parse::<TableName>().is_err());
        assert_eq!(TableName::new("s", "we\"ird").quoted(), r#""s"."we""ird""#);
    }
}
