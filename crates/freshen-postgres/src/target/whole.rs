//! `PgWhole`: a view defined by a plain query, recomputed as a whole table
//! ([`freshen::Whole`]) — its first build, a backlog past the refresher's threshold, a
//! fan-out to a large share of the table. One REPEATABLE READ transaction that first
//! proves it sees the transactions behind the keys it covers (as every rebuild does),
//! then one of:
//!
//! | way       | statement                                                       | readers |
//! |-----------|-----------------------------------------------------------------|---------|
//! | build     | if the table is empty: `INSERT … SELECT … ORDER BY key`          | never see it half built (one transaction) |
//! | replace   | `TRUNCATE` (or `DELETE`, see below) + `INSERT … SELECT … ORDER BY key` | wait for it, as for `REFRESH MATERIALIZED VIEW` |
//! | diff      | one statement: the query `FULL JOIN` the table, the differing rows only: UPDATE, INSERT, DELETE | never wait; a table that did not change is not written |
//!
//! Rows go in in key order so that the key index is filled at its right edge. `TRUNCATE`
//! is used where the role may and no foreign key references the table; otherwise the
//! old rows are deleted in the same transaction (slower, and readers do not wait).
//! Like `REFRESH MATERIALIZED VIEW`, `TRUNCATE` is not MVCC-safe: a REPEATABLE READ
//! reader whose snapshot is older than the replace sees the table empty afterwards.
//!
//! A whole run may take longer than the view's `statement_timeout` (a recompute of
//! millions of rows): it runs under its own timeout, and under a `lock_timeout` of the
//! view's `statement_timeout`, so a locked table fails it quickly (a path failure, tried
//! again) instead of holding the view.
//!
//! Pure text here (identifiers quoted, nothing spliced) and the I/O in [`PgWhole`].

use std::time::Duration;

use deadpool_postgres::Pool;
use freshen::{BoxError, BoxFuture, Retry, Whole, WholeDone, WholeWay};
use tokio_postgres::IsolationLevel;

use crate::pool::client;
use crate::quote::quote_ident;
use crate::target::rebuild::{
    CancelOnDrop, NOT_VISIBLE, Visibility, not_visible, visible_on_source,
};
use crate::{PgError, TableName};

/// The statements of a whole run over one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Statements {
    /// Whether the table has a row.
    pub(crate) any: String,
    /// The table's rows, estimated (`reltuples`; -1: never analysed).
    pub(crate) estimate: String,
    /// The table's rows, counted.
    pub(crate) count: String,
    /// Empties the table (TRUNCATE, or DELETE where TRUNCATE may not be used).
    pub(crate) clear: String,
    /// Fills the table from the query, in key order.
    pub(crate) fill: String,
    /// Writes the differences; returns (updated, inserted, deleted).
    pub(crate) diff: String,
}

impl Statements {
    /// The statements for `query` (a plain query returning `key` and `values`) into
    /// `into`; `truncate`: whether the table may be emptied by TRUNCATE.
    pub(crate) fn new(
        into: &TableName,
        key: &[String],
        values: &[String],
        query: &str,
        truncate: bool,
    ) -> Statements {
        let t = into.quoted();
        let q = crate::target::keyed::trim(query);
        let cols: Vec<String> = key.iter().chain(values).map(|c| quote_ident(c)).collect();
        let list = cols.join(", ");
        let order = key
            .iter()
            .map(|k| quote_ident(k))
            .collect::<Vec<_>>()
            .join(", ");
        let fill = format!(
            "INSERT INTO {t} ({list}) SELECT {list} FROM (\n{q}\n) AS freshen_q ORDER BY {order}"
        );
        let on = |a: &str, b: &str, prefix: &str| {
            key.iter()
                .map(|k| {
                    format!(
                        "{a}.{} = {b}.{}",
                        quote_ident(k),
                        quote_ident(&format!("{prefix}{k}"))
                    )
                })
                .collect::<Vec<_>>()
                .join(" AND ")
        };
        // d: the query's rows that differ from the table's, and the table's rows the
        // query no longer returns (their keys as `freshen_t_<k>`).
        let first = quote_ident(&key[0]);
        let t_keys: Vec<String> = key
            .iter()
            .map(|k| {
                format!(
                    "t.{} AS {}",
                    quote_ident(k),
                    quote_ident(&format!("freshen_t_{k}"))
                )
            })
            .collect();
        let q_cols: Vec<String> = key
            .iter()
            .chain(values)
            .map(|c| format!("q.{}", quote_ident(c)))
            .collect();
        let join: Vec<String> = key
            .iter()
            .map(|k| format!("q.{c} = t.{c}", c = quote_ident(k)))
            .collect();
        let differs = if values.is_empty() {
            "false".to_owned()
        } else {
            let row = |side: &str| {
                values
                    .iter()
                    .map(|c| format!("{side}.{}", quote_ident(c)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!("ROW({}) IS DISTINCT FROM ROW({})", row("t"), row("q"))
        };
        let mut diff = format!(
            "WITH d AS MATERIALIZED (SELECT {}, {}, q.{first} IS NOT NULL AS freshen_in_q \
             FROM (\n{q}\n) AS q FULL JOIN {t} AS t ON {} \
             WHERE q.{first} IS NULL OR t.{first} IS NULL OR {differs})",
            q_cols.join(", "),
            t_keys.join(", "),
            join.join(" AND "),
        );
        let t_first = quote_ident(&format!("freshen_t_{}", key[0]));
        if !values.is_empty() {
            let set: Vec<String> = values
                .iter()
                .map(|c| format!("{c} = d.{c}", c = quote_ident(c)))
                .collect();
            diff.push_str(&format!(
                ",\nupd AS (UPDATE {t} AS t SET {} FROM d WHERE d.freshen_in_q AND d.{t_first} IS NOT NULL AND {} RETURNING 1)",
                set.join(", "),
                on("t", "d", ""),
            ));
        }
        diff.push_str(&format!(
            ",\nins AS (INSERT INTO {t} ({list}) SELECT {} FROM d WHERE d.freshen_in_q AND d.{t_first} IS NULL ORDER BY {} RETURNING 1)",
            cols.iter().map(|c| format!("d.{c}")).collect::<Vec<_>>().join(", "),
            key.iter().map(|k| format!("d.{}", quote_ident(k))).collect::<Vec<_>>().join(", "),
        ));
        diff.push_str(&format!(
            ",\ndel AS (DELETE FROM {t} AS t USING d WHERE NOT d.freshen_in_q AND {} RETURNING 1)",
            on("t", "d", "freshen_t_"),
        ));
        diff.push_str(&format!(
            "\nSELECT {}, (SELECT count(*) FROM ins), (SELECT count(*) FROM del)",
            if values.is_empty() {
                "0::bigint".to_owned()
            } else {
                "(SELECT count(*) FROM upd)".to_owned()
            }
        ));
        Statements {
            any: format!("SELECT EXISTS (SELECT FROM {t})"),
            estimate: format!(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = {}::regclass",
                crate::quote::quote_literal(&t)
            ),
            count: format!("SELECT count(*) FROM {t}"),
            clear: if truncate {
                format!("TRUNCATE {t}")
            } else {
                format!("DELETE FROM {t}")
            },
            fill,
            diff,
        }
    }
}

/// Recomputes a query view's whole table; from [`QueryRebuild`](crate::QueryRebuild).
#[derive(Clone)]
pub(crate) struct PgWhole {
    pub(crate) pool: Pool,
    pub(crate) statements: Statements,
    pub(crate) visibility: Visibility,
    pub(crate) visibility_wait: Duration,
    /// The run's own statement timeout (`None`: none).
    pub(crate) timeout: Option<Duration>,
    /// How long it waits for a lock: the view's statement timeout.
    pub(crate) lock_timeout: Option<Duration>,
}

impl std::fmt::Debug for PgWhole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgWhole")
            .field("fill", &self.statements.fill)
            .finish_non_exhaustive()
    }
}

/// `SET LOCAL` text for a timeout (`0`: none).
fn millis(d: Option<Duration>) -> u128 {
    d.map_or(0, |d| d.as_millis().max(1))
}

impl PgWhole {
    async fn run(&self, way: WholeWay, txids: &[u64]) -> Result<WholeDone, PgError> {
        let ids: Vec<String> = txids.iter().map(u64::to_string).collect();
        let mut in_snapshot: &[String] = &[];
        match &self.visibility {
            Visibility::InSnapshot => in_snapshot = &ids,
            Visibility::OnSource(source) if !ids.is_empty() => {
                visible_on_source(source, &ids, self.visibility_wait).await?
            }
            _ => {}
        }
        let mut guard = CancelOnDrop::new(client(&self.pool).await?);
        let outcome = self.transaction(guard.client(), way, in_snapshot).await;
        guard.disarm();
        outcome
    }

    async fn transaction(
        &self,
        c: &mut deadpool_postgres::Object,
        way: WholeWay,
        txids: &[String],
    ) -> Result<WholeDone, PgError> {
        let s = &self.statements;
        let deadline = tokio::time::Instant::now() + self.visibility_wait;
        let mut pause = Duration::from_millis(2);
        loop {
            let tx = c
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .start()
                .await
                .map_err(|e| PgError::sql("cannot begin the whole-table run", e))?;
            tx.batch_execute(&format!(
                "SET LOCAL statement_timeout = {}; SET LOCAL lock_timeout = {}",
                millis(self.timeout),
                millis(self.lock_timeout)
            ))
            .await
            .map_err(|e| PgError::sql("cannot set the whole-table run's timeouts", e))?;
            if !txids.is_empty() {
                let unseen = tx
                    .query(NOT_VISIBLE, &[&txids])
                    .await
                    .map_err(|e| PgError::sql("visibility check failed", e))?;
                if !unseen.is_empty() {
                    let _ = tx.rollback().await;
                    if tokio::time::Instant::now() >= deadline {
                        let ids: Vec<String> = unseen.iter().map(|r| r.get(0)).collect();
                        return Err(not_visible(&ids, self.visibility_wait));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                    continue;
                }
            }
            let done = match way {
                WholeWay::Build => {
                    let any: bool = tx
                        .query_one(&s.any, &[])
                        .await
                        .map_err(|e| PgError::sql("cannot tell whether the table is empty", e))?
                        .get(0);
                    if any {
                        let rows = rows(&tx, s).await?;
                        let _ = tx.rollback().await;
                        return Ok(WholeDone {
                            rows,
                            written: 0,
                            built: false,
                        });
                    }
                    let n = tx
                        .execute(&s.fill, &[])
                        .await
                        .map_err(|e| PgError::sql("the first build failed", e))?;
                    WholeDone {
                        rows: n,
                        written: n,
                        built: true,
                    }
                }
                WholeWay::Replace => {
                    tx.batch_execute(&s.clear)
                        .await
                        .map_err(|e| PgError::sql("cannot empty the table to replace it", e))?;
                    let n = tx
                        .execute(&s.fill, &[])
                        .await
                        .map_err(|e| PgError::sql("the whole-table recompute failed", e))?;
                    WholeDone {
                        rows: n,
                        written: n,
                        built: false,
                    }
                }
                WholeWay::Diff => {
                    let r = tx
                        .query_one(&s.diff, &[])
                        .await
                        .map_err(|e| PgError::sql("the whole-table recompute failed", e))?;
                    let (u, i, d): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
                    let written = u64::try_from(u + i + d).unwrap_or(0);
                    WholeDone {
                        rows: rows(&tx, s).await?,
                        written,
                        built: false,
                    }
                }
            };
            tx.commit()
                .await
                .map_err(|e| PgError::sql("cannot commit the whole-table run", e))?;
            return Ok(done);
        }
    }
}

/// The table's rows: its estimate, or a count where it was never analysed.
async fn rows(tx: &tokio_postgres::Transaction<'_>, s: &Statements) -> Result<u64, PgError> {
    let estimate: i64 = tx
        .query_one(&s.estimate, &[])
        .await
        .map_err(|e| PgError::sql("cannot estimate the table's rows", e))?
        .get(0);
    if estimate >= 0 {
        return Ok(estimate as u64);
    }
    let n: i64 = tx
        .query_one(&s.count, &[])
        .await
        .map_err(|e| PgError::sql("cannot count the table's rows", e))?
        .get(0);
    Ok(n.max(0) as u64)
}

impl Whole for PgWhole {
    fn rebuild_all<'a>(
        &'a self,
        way: WholeWay,
        txids: &'a [u64],
    ) -> BoxFuture<'a, Result<WholeDone, BoxError>> {
        Box::pin(async move { self.run(way, txids).await.map_err(Into::into) })
    }

    fn classify(&self, error: &BoxError) -> Retry {
        error
            .downcast_ref::<PgError>()
            .map_or(Retry::Key, PgError::retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn one_key_part_and_values() {
        let into = TableName::new("public", "ct");
        let st = Statements::new(
            &into,
            &s(&["cid"]),
            &s(&["n"]),
            "SELECT cid, count(*) AS n FROM items GROUP BY cid;",
            true,
        );
        assert_eq!(
            st.fill,
            "INSERT INTO \"public\".\"ct\" (\"cid\", \"n\") SELECT \"cid\", \"n\" FROM (\nSELECT cid, count(*) AS n FROM items GROUP BY cid\n) AS freshen_q ORDER BY \"cid\""
        );
        assert_eq!(st.clear, "TRUNCATE \"public\".\"ct\"");
        assert_eq!(st.any, "SELECT EXISTS (SELECT FROM \"public\".\"ct\")");
        assert_eq!(
            st.estimate,
            "SELECT reltuples::bigint FROM pg_class WHERE oid = '\"public\".\"ct\"'::regclass"
        );
        assert_eq!(
            st.diff,
            "WITH d AS MATERIALIZED (SELECT q.\"cid\", q.\"n\", t.\"cid\" AS \"freshen_t_cid\", q.\"cid\" IS NOT NULL AS freshen_in_q \
             FROM (\nSELECT cid, count(*) AS n FROM items GROUP BY cid\n) AS q FULL JOIN \"public\".\"ct\" AS t ON q.\"cid\" = t.\"cid\" \
             WHERE q.\"cid\" IS NULL OR t.\"cid\" IS NULL OR ROW(t.\"n\") IS DISTINCT FROM ROW(q.\"n\")),\n\
             upd AS (UPDATE \"public\".\"ct\" AS t SET \"n\" = d.\"n\" FROM d WHERE d.freshen_in_q AND d.\"freshen_t_cid\" IS NOT NULL AND t.\"cid\" = d.\"cid\" RETURNING 1),\n\
             ins AS (INSERT INTO \"public\".\"ct\" (\"cid\", \"n\") SELECT d.\"cid\", d.\"n\" FROM d WHERE d.freshen_in_q AND d.\"freshen_t_cid\" IS NULL ORDER BY d.\"cid\" RETURNING 1),\n\
             del AS (DELETE FROM \"public\".\"ct\" AS t USING d WHERE NOT d.freshen_in_q AND t.\"cid\" = d.\"freshen_t_cid\" RETURNING 1)\n\
             SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM ins), (SELECT count(*) FROM del)"
        );
    }

    #[test]
    fn a_key_of_two_parts_without_values_and_no_truncate() {
        let into = TableName::new("app", "Pairs");
        let st = Statements::new(
            &into,
            &s(&["a", "B"]),
            &[],
            "SELECT DISTINCT a, \"B\" FROM x",
            false,
        );
        assert_eq!(st.clear, "DELETE FROM \"app\".\"Pairs\"");
        assert!(st.fill.ends_with("ORDER BY \"a\", \"B\""), "{}", st.fill);
        assert!(
            !st.diff.contains("upd AS"),
            "nothing to update: {}",
            st.diff
        );
        assert!(
            st.diff
                .contains("ON q.\"a\" = t.\"a\" AND q.\"B\" = t.\"B\""),
            "{}",
            st.diff
        );
        assert!(
            st.diff
                .contains("WHERE q.\"a\" IS NULL OR t.\"a\" IS NULL OR false"),
            "{}",
            st.diff
        );
        assert!(
            st.diff
                .contains("t.\"a\" = d.\"freshen_t_a\" AND t.\"B\" = d.\"freshen_t_B\""),
            "{}",
            st.diff
        );
        assert!(
            st.diff.ends_with(
                "SELECT 0::bigint, (SELECT count(*) FROM ins), (SELECT count(*) FROM del)"
            )
        );
    }

    #[test]
    fn timeouts_are_milliseconds_and_none_is_zero() {
        assert_eq!(millis(None), 0);
        assert_eq!(millis(Some(Duration::from_secs(2))), 2000);
        assert_eq!(millis(Some(Duration::from_micros(10))), 1, "never 0 (none)");
    }
}
