//! The set-based statement behind a query-mode rebuild: one statement per batch of keys
//! that makes a table's rows for those keys equal to what a query returns for them.
//!
//! PostgreSQL 15 has no `MERGE … WHEN NOT MATCHED BY SOURCE`, so the statement is three
//! data-modifying CTEs over the query's result, all in one snapshot:
//!
//! - an UPDATE of the rows whose values differ (`IS DISTINCT FROM` over a row of the
//!   value columns, so NULLs compare as values): an unchanged row is not touched, which
//!   leaves no dead tuple and writes no WAL;
//! - an INSERT of the keys the table does not have yet;
//! - a DELETE of the rows of the batch's keys (`$1..$n`, one array per key part) that the
//!   query no longer returns.
//!
//! The three touch disjoint rows (a key is either in the result or not, and either in
//! the table or not), so seeing the table as it was before the statement is right.
//! Everything here is text: identifiers are quoted, values are never spliced (the keys
//! are the statement's parameters, shared with the query).

use crate::TableName;
use crate::quote::quote_ident;

/// What a merge writes: the table, its key columns (the view's key, `$1..$n` in this
/// order) and the value columns the query returns besides the key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Merge<'a> {
    /// The target table.
    pub(crate) into: &'a TableName,
    /// Key columns, in the order of the statement's parameters.
    pub(crate) key: &'a [String],
    /// The other columns the query returns.
    pub(crate) values: &'a [String],
    /// The key parameters' array types (`integer[]`, …), when the statement's query does
    /// not use `$1..$n` itself (so PostgreSQL cannot infer them): a separate target.
    pub(crate) key_types: Option<&'a [String]>,
}

impl Merge<'_> {
    /// The statement for `query`, which selects the batch's rows with `$1..$n`.
    pub(crate) fn statement(&self, query: &str) -> String {
        let into = self.into.quoted();
        let on = |a: &str, b: &str| {
            self.key
                .iter()
                .map(|k| format!("{a}.{k} = {b}.{k}", k = quote_ident(k)))
                .collect::<Vec<_>>()
                .join(" AND ")
        };
        let all: Vec<String> = self
            .key
            .iter()
            .chain(self.values)
            .map(|c| quote_ident(c))
            .collect();
        let mut sql = format!("WITH q AS MATERIALIZED ({}\n)", query.trim_end());
        if !self.values.is_empty() {
            let set: Vec<String> = self
                .values
                .iter()
                .map(|c| format!("{c} = q.{c}", c = quote_ident(c)))
                .collect();
            let row = |side: &str| {
                self.values
                    .iter()
                    .map(|c| format!("{side}.{}", quote_ident(c)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            sql.push_str(&format!(
                ",\nupd AS (UPDATE {into} AS t SET {} FROM q WHERE {} AND ROW({}) IS DISTINCT FROM ROW({}))",
                set.join(", "),
                on("t", "q"),
                row("t"),
                row("q"),
            ));
        }
        sql.push_str(&format!(
            ",\nins AS (INSERT INTO {into} ({}) SELECT {} FROM q WHERE NOT EXISTS (SELECT FROM {into} AS t WHERE {}))",
            all.join(", "),
            all.iter()
                .map(|c| format!("q.{c}"))
                .collect::<Vec<_>>()
                .join(", "),
            on("t", "q"),
        ));
        sql.push_str(&format!(
            "\nDELETE FROM {into} AS t WHERE {} AND NOT EXISTS (SELECT FROM q WHERE {})",
            self.in_batch(),
            on("q", "t"),
        ));
        sql
    }

    /// `t`'s key is one of the batch's: `$1..$n` are arrays of key parts, typed by the
    /// query that uses them first.
    fn in_batch(&self) -> String {
        let param = |i: usize| match self.key_types.and_then(|t| t.get(i - 1)) {
            Some(ty) => format!("${i}::{ty}"),
            None => format!("${i}"),
        };
        match self.key {
            [one] => format!("t.{} = ANY({})", quote_ident(one), param(1)),
            parts => {
                let cols: Vec<String> = parts
                    .iter()
                    .map(|k| format!("t.{}", quote_ident(k)))
                    .collect();
                let params: Vec<String> = (1..=parts.len()).map(param).collect();
                format!(
                    "({}) IN (SELECT * FROM unnest({}))",
                    cols.join(", "),
                    params.join(", ")
                )
            }
        }
    }
}

/// What is wrong with a query's output columns for writing into a table with `target`
/// columns, keyed on `key`; empty when nothing. Every mismatch is listed.
pub(crate) fn column_problems(key: &[String], output: &[String], target: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, c) in output.iter().enumerate() {
        if output[..i].contains(c) {
            out.push(format!("the query returns column `{c}` twice"));
        }
    }
    for c in output {
        if !target.contains(c) {
            let hint = crate::spelling::closest(c, target.iter().map(String::as_str))
                .map(|t| format!(" (did you mean `{t}`?)"))
                .unwrap_or_default();
            out.push(format!(
                "the query returns `{c}`, which the target table does not have{hint}"
            ));
        }
    }
    for k in key {
        if !output.contains(k) {
            out.push(format!(
                "the query does not return the key column `{k}` (name it `{k}`: AS {})",
                quote_ident(k)
            ));
        }
        if !target.contains(k) {
            out.push(format!("the target table has no key column `{k}`"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn one_part_key_statement() {
        let into = TableName::new("public", "device_totals");
        let key = s(&["device"]);
        let values = s(&["total", "n"]);
        let sql = Merge {
            into: &into,
            key: &key,
            values: &values,
            key_types: None,
        }
        .statement("SELECT device, sum(v) AS total, count(*) AS n FROM r WHERE device = ANY($1) GROUP BY device");
        assert_eq!(
            sql,
            "WITH q AS MATERIALIZED (SELECT device, sum(v) AS total, count(*) AS n FROM r WHERE device = ANY($1) GROUP BY device\n),\n\
             upd AS (UPDATE \"public\".\"device_totals\" AS t SET \"total\" = q.\"total\", \"n\" = q.\"n\" FROM q WHERE t.\"device\" = q.\"device\" AND ROW(t.\"total\", t.\"n\") IS DISTINCT FROM ROW(q.\"total\", q.\"n\")),\n\
             ins AS (INSERT INTO \"public\".\"device_totals\" (\"device\", \"total\", \"n\") SELECT q.\"device\", q.\"total\", q.\"n\" FROM q WHERE NOT EXISTS (SELECT FROM \"public\".\"device_totals\" AS t WHERE t.\"device\" = q.\"device\"))\n\
             DELETE FROM \"public\".\"device_totals\" AS t WHERE t.\"device\" = ANY($1) AND NOT EXISTS (SELECT FROM q WHERE q.\"device\" = t.\"device\")"
        );
    }

    #[test]
    fn composite_key_and_no_values() {
        let into = TableName::new("app", "Pairs");
        let key = s(&["a", "b\"c"]);
        let sql = Merge {
            into: &into,
            key: &key,
            values: &[],
            key_types: None,
        }
        .statement(
            "SELECT a, \"b\"\"c\" FROM x WHERE (a, \"b\"\"c\") IN (SELECT * FROM unnest($1, $2))  ",
        );
        assert!(
            !sql.contains("upd AS"),
            "no value columns, nothing to update: {sql}"
        );
        assert!(
            sql.contains("INSERT INTO \"app\".\"Pairs\" (\"a\", \"b\"\"c\")"),
            "{sql}"
        );
        assert!(
            sql.ends_with("WHERE (t.\"a\", t.\"b\"\"c\") IN (SELECT * FROM unnest($1, $2)) AND NOT EXISTS (SELECT FROM q WHERE q.\"a\" = t.\"a\" AND q.\"b\"\"c\" = t.\"b\"\"c\")"),
            "{sql}"
        );
        assert!(
            sql.contains("$2))\n)"),
            "the query's trailing blanks are trimmed: {sql}"
        );
    }

    #[test]
    fn a_comment_ending_the_query_cannot_swallow_the_statement() {
        let into = TableName::new("public", "t");
        let key = s(&["k"]);
        let sql = Merge {
            into: &into,
            key: &key,
            values: &[],
            key_types: None,
        }
        .statement("SELECT k FROM x WHERE k = ANY($1) -- the batch");
        assert!(sql.contains("-- the batch\n)"), "{sql}");
    }

    #[test]
    fn every_column_mismatch_is_listed() {
        let p = column_problems(
            &s(&["device"]),
            &s(&["dev", "totl", "n", "n"]),
            &s(&["device", "total", "n"]),
        );
        assert_eq!(
            p,
            vec![
                "the query returns column `n` twice".to_string(),
                "the query returns `dev`, which the target table does not have".to_string(),
                "the query returns `totl`, which the target table does not have (did you mean `total`?)".to_string(),
                "the query does not return the key column `device` (name it `device`: AS \"device\")".to_string(),
            ]
        );
        assert!(
            column_problems(
                &s(&["device"]),
                &s(&["n", "device"]),
                &s(&["device", "total", "n"])
            )
            .is_empty()
        );
        assert_eq!(
            column_problems(&s(&["k"]), &s(&["k"]), &s(&["identifier"])),
            vec![
                "the query returns `k`, which the target table does not have".to_string(),
                "the target table has no key column `k`".to_string(),
            ]
        );
    }
}
