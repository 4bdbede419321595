//! Which tables a `[source] tables` entry selects when it names more than one table:
//! `"all"`, a whole schema (`"app.*"`), or a name pattern in a schema (`"app.order_*"`).
//! Pure: the catalog is read elsewhere and filtered with [`TablePattern::matches`], so
//! the stream, `check` and the changefeed's snapshots agree on one definition.
//!
//! What each asks of the publication (PostgreSQL 15):
//!
//! - `"all"`: `FOR ALL TABLES` (a superuser creates it, or it exists already). Tables
//!   of system schemas and freshen's own bookkeeping (names starting with `freshen_`,
//!   such as the incremental source's `freshen_cursors`) are not captured.
//! - `"app.*"` and `"app.order_*"`: `FOR TABLES IN SCHEMA app` (a superuser, too). A
//!   pattern is filtered on freshen's side: a table created later is in the publication
//!   from its first row, with no catalog polling and no window in which its rows are
//!   written but not yet published (which `ALTER PUBLICATION … ADD TABLE` after seeing
//!   the table would leave), and no ownership of each new table is needed. The price:
//!   the schema's other tables are decoded by the server and dropped by freshen, and
//!   every table of the schema must be able to replicate UPDATE and DELETE.

use std::fmt;

use crate::TableName;

/// Schemas never captured by `"all"` (the server's own).
const SYSTEM_SCHEMAS: &[&str] = &["pg_catalog", "information_schema", "pg_toast"];

/// The prefix of freshen's bookkeeping tables, never captured by a pattern.
pub const BOOKKEEPING_PREFIX: &str = "freshen_";

/// A `[source] tables` entry that selects tables by pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TablePattern {
    /// Every table of the database outside system schemas and freshen's bookkeeping.
    All,
    /// The tables of `schema` whose name matches `name`, where `*` stands for any run
    /// of characters (`"*"`: the whole schema).
    In {
        /// The schema, exact.
        schema: String,
        /// The name pattern.
        name: String,
    },
}

/// A stand-in for `*` while the entry is parsed as a table name (a private-use
/// character no identifier of ours holds).
const STAR: char = '\u{E000}';

impl TablePattern {
    /// Parses an entry: `None` when it names one table (no `*`, not `"all"`), else the
    /// pattern or why it is not one. Parts are quoted and folded as table names are.
    pub fn parse(entry: &str) -> Option<Result<TablePattern, String>> {
        let trimmed = entry.trim();
        if trimmed.eq_ignore_ascii_case("all") {
            return Some(Ok(TablePattern::All));
        }
        if !trimmed.contains('*') {
            return None;
        }
        let parsed = trimmed
            .replace('*', &STAR.to_string())
            .parse::<TableName>()
            .map_err(|e| e.replace(STAR, "*"));
        Some(parsed.and_then(|t| {
            if t.schema.contains(STAR) {
                return Err(format!(
                    "{entry:?}: a pattern's schema is named exactly (`*` only in the table name)"
                ));
            }
            let name = t.name.replace(STAR, "*");
            Ok(TablePattern::In {
                schema: t.schema,
                name,
            })
        }))
    }

    /// A whole schema.
    pub fn schema(schema: impl Into<String>) -> TablePattern {
        TablePattern::In {
            schema: schema.into(),
            name: "*".into(),
        }
    }

    /// Whether `table` is selected.
    pub fn matches(&self, table: &TableName) -> bool {
        if !capturable(table) {
            return false;
        }
        match self {
            TablePattern::All => true,
            TablePattern::In { schema, name } => {
                *schema == table.schema && glob(name.as_bytes(), table.name.as_bytes())
            }
        }
    }

    /// The schema the pattern lies in (`None` for [`TablePattern::All`]).
    pub fn schema_name(&self) -> Option<&str> {
        match self {
            TablePattern::All => None,
            TablePattern::In { schema, .. } => Some(schema),
        }
    }
}

/// Why `patterns` cannot be published by a server of `server_version_num`: a schema or
/// name pattern is published `FOR TABLES IN SCHEMA`, which PostgreSQL 15 brought
/// (`"all"`, `FOR ALL TABLES`, works on every version). `None` when they can.
pub(crate) fn schema_patterns_unsupported(
    server_version_num: u32,
    patterns: &[TablePattern],
) -> Option<String> {
    let schemas: Vec<String> = patterns
        .iter()
        .filter(|p| p.schema_name().is_some())
        .map(|p| format!("{:?}", p.to_string()))
        .collect();
    (server_version_num < 150_000 && !schemas.is_empty()).then(|| {
        format!(
            "[source] tables {} needs a publication FOR TABLES IN SCHEMA, which PostgreSQL 15 \
             brought; this server is {}.{}: list the tables by name, or use \"all\"",
            schemas.join(", "),
            server_version_num / 10_000,
            server_version_num % 10_000 / 100,
        )
    })
}

impl fmt::Display for TablePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TablePattern::All => f.write_str("all"),
            TablePattern::In { schema, name } => write!(f, "{schema}.{name}"),
        }
    }
}

/// Whether a pattern may capture `table`: not in a system schema, not freshen's own.
pub fn capturable(table: &TableName) -> bool {
    !system_schema(&table.schema) && !table.name.starts_with(BOOKKEEPING_PREFIX)
}

/// The server's own schemas (`pg_catalog`, `information_schema`, `pg_toast`, and the
/// temporary ones).
pub fn system_schema(schema: &str) -> bool {
    SYSTEM_SCHEMAS.contains(&schema)
        || schema.starts_with("pg_temp_")
        || schema.starts_with("pg_toast_temp_")
}

/// Whether any of `patterns` selects `table`.
pub(crate) fn any_matches(patterns: &[TablePattern], table: &TableName) -> bool {
    patterns.iter().any(|p| p.matches(table))
}

/// `*` matches any run of bytes; everything else itself.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    // Greedy with one backtrack point: linear enough for names of 63 bytes.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    #[test]
    fn schema_patterns_need_15_and_all_does_not() {
        let app: TablePattern = TablePattern::In {
            schema: "app".into(),
            name: "*".into(),
        };
        let why = schema_patterns_unsupported(140_023, &[app.clone(), TablePattern::All])
            .expect("14 cannot publish a schema");
        assert!(why.contains("\"app.*\"") && why.contains("14.0"), "{why}");
        assert!(!why.contains("\"all\","), "{why}");
        assert_eq!(
            schema_patterns_unsupported(140_023, &[TablePattern::All]),
            None
        );
        assert_eq!(schema_patterns_unsupported(150_000, &[app]), None);
    }

    use super::*;

    fn t(schema: &str, name: &str) -> TableName {
        TableName::new(schema, name)
    }

    #[test]
    fn entries_parse_as_patterns_or_names() {
        assert_eq!(TablePattern::parse("public.orders"), None);
        assert_eq!(TablePattern::parse("ALL"), Some(Ok(TablePattern::All)));
        assert_eq!(
            TablePattern::parse("App.Order_*"),
            Some(Ok(TablePattern::In {
                schema: "app".into(),
                name: "order_*".into()
            }))
        );
        assert_eq!(
            TablePattern::parse("\"Audit\".*"),
            Some(Ok(TablePattern::schema("Audit")))
        );
        assert_eq!(
            TablePattern::parse("order_*"),
            Some(Ok(TablePattern::In {
                schema: "public".into(),
                name: "order_*".into()
            }))
        );
        assert!(matches!(TablePattern::parse("ap*.orders"), Some(Err(_))));
        assert!(matches!(TablePattern::parse("a.b.*"), Some(Err(_))));
    }

    #[test]
    fn patterns_match_names_and_leave_out_system_and_bookkeeping_tables() {
        let p = TablePattern::parse("app.order_*").unwrap().unwrap();
        assert!(p.matches(&t("app", "order_lines")));
        assert!(p.matches(&t("app", "order_")));
        assert!(!p.matches(&t("app", "orders")));
        assert!(!p.matches(&t("public", "order_lines")));
        let mid = TablePattern::parse("app.a*b*c").unwrap().unwrap();
        assert!(mid.matches(&t("app", "axxbyyc")));
        assert!(mid.matches(&t("app", "abc")));
        assert!(!mid.matches(&t("app", "abcd")));
        assert!(TablePattern::All.matches(&t("sales", "x")));
        assert!(!TablePattern::All.matches(&t("pg_catalog", "pg_class")));
        assert!(!TablePattern::All.matches(&t("information_schema", "tables")));
        assert!(!TablePattern::All.matches(&t("public", "freshen_cursors")));
        assert!(!TablePattern::schema("app").matches(&t("app", "freshen_cursors")));
        assert!(any_matches(
            &[TablePattern::schema("x"), p.clone()],
            &t("app", "order_x")
        ));
        assert_eq!(p.to_string(), "app.order_*");
    }
}
