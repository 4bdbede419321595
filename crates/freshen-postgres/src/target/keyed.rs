//! A query as its owner writes it for `CREATE MATERIALIZED VIEW` — no parameters —
//! turned into the query of a batch of keys: the key filter goes around it, and
//! PostgreSQL's planner pushes it into the query (through `GROUP BY`, `DISTINCT`,
//! `UNION ALL`, a window's `PARTITION BY`, a join's equalities) down to the tables.
//! Whether it got there is read from the plan afterwards
//! ([`Shape::filtered_above`](crate::infer::plan::Shape::filtered_above)): a filter left
//! above a whole-table aggregate would be correct but would compute the whole table for
//! every batch.
//!
//! ```text
//!   SELECT cid, count(*) AS n FROM items GROUP BY cid          (the query, as written)
//!   SELECT * FROM (
//!   SELECT cid, count(*) AS n FROM items GROUP BY cid
//!   ) AS freshen_q WHERE freshen_q.cid = ANY($1)                (a batch of keys)
//! ```
//!
//! A key of several parts is filtered part by part (`= ANY($k)` each: a qual the planner
//! can push) and then exactly, pair by pair (`IN (SELECT * FROM unnest($1, $2))`), so that
//! a batch never writes a key it does not hold (single flight). Pure text: identifiers are
//! quoted, values are parameters.

use crate::quote::quote_ident;

/// The alias the query is wrapped under.
pub(crate) const ALIAS: &str = "freshen_q";

/// `query` (a plain query, trailing `;` and blanks removed) restricted to a batch of
/// keys: `$1..$n` one array per part of `key` (the query's output columns).
pub(crate) fn keyed(query: &str, key: &[String]) -> String {
    let body = trim(query);
    let col = |k: &str| format!("{ALIAS}.{}", quote_ident(k));
    let mut filter: Vec<String> = key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{} = ANY(${})", col(k), i + 1))
        .collect();
    if key.len() > 1 {
        let cols: Vec<String> = key.iter().map(|k| col(k)).collect();
        let params: Vec<String> = (1..=key.len()).map(|i| format!("${i}")).collect();
        filter.push(format!(
            "({}) IN (SELECT * FROM unnest({}))",
            cols.join(", "),
            params.join(", ")
        ));
    }
    format!(
        "SELECT * FROM (\n{body}\n) AS {ALIAS} WHERE {}",
        filter.join(" AND ")
    )
}

/// The query of a batch: `query` itself when it selects its batch with `$1..$n`,
/// else the query wrapped in a filter by the key (`target::keyed`).
pub fn batch_query(query: &str, key: &[String]) -> String {
    if freshen::plug::is_plain_query(query) {
        keyed(query, key)
    } else {
        query.to_owned()
    }
}

/// The query without its trailing `;` and blanks (a `CREATE MATERIALIZED VIEW`'s
/// SELECT is often pasted with them).
pub(crate) fn trim(query: &str) -> &str {
    let mut q = query.trim_end();
    while let Some(rest) = q.strip_suffix(';') {
        q = rest.trim_end();
    }
    q.trim_start()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn one_part_key() {
        assert_eq!(
            keyed(
                "SELECT cid, count(*) AS n FROM items GROUP BY cid ;\n",
                &s(&["cid"])
            ),
            "SELECT * FROM (\nSELECT cid, count(*) AS n FROM items GROUP BY cid\n) AS freshen_q WHERE freshen_q.\"cid\" = ANY($1)"
        );
    }

    #[test]
    fn several_parts_filter_each_then_exactly() {
        assert_eq!(
            keyed("SELECT a, \"B\", n FROM t -- the pairs", &s(&["a", "B"])),
            "SELECT * FROM (\nSELECT a, \"B\", n FROM t -- the pairs\n) AS freshen_q WHERE freshen_q.\"a\" = ANY($1) AND freshen_q.\"B\" = ANY($2) AND (freshen_q.\"a\", freshen_q.\"B\") IN (SELECT * FROM unnest($1, $2))"
        );
    }

    #[test]
    fn a_query_with_parameters_is_its_own_batch_query() {
        let q = "SELECT a FROM t WHERE a = ANY($1)";
        assert_eq!(batch_query(q, &s(&["a"])), q);
        assert!(batch_query("SELECT a FROM t", &s(&["a"])).contains("= ANY($1)"));
    }
}
