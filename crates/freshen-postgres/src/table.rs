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

    /// The table a snapshot's progress is of.
    pub fn of(progress: &freshen_codec::SnapshotProgress) -> TableName {
        TableName::new(&progress.schema, &progress.table)
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

impl FromStr for TableName {
    type Err = String;

    /// `table`, `schema.table`, with double quotes around parts that need them (see
    /// [`naming`]).
    fn from_str(s: &str) -> Result<TableName, String> {
        let (schema, name) = naming().parse(s)?;
        Ok(TableName { schema, name })
    }
}

/// PostgreSQL's rules for a table name in the file: double quotes keep a part as
/// written, an unquoted part folds to lower case, an unqualified table is in `public`.
pub fn naming() -> freshen::plug::Naming {
    freshen::plug::Naming {
        quote: '"',
        fold_unquoted: true,
        default_schema: Some("public".into()),
        schema_word: "schema",
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
