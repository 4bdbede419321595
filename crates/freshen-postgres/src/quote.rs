//! Quoting for the few places SQL must be spliced: identifiers in DDL, and literals
//! where the replication protocol takes no parameters. Values are otherwise always bound.

/// Quotes an identifier for SQL.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Quotes a string literal for SQL (used only where the replication protocol cannot take
/// parameters).
pub(crate) fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}
