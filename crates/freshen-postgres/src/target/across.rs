//! Query mode with a separate target: the query runs on the source database and the
//! batch's rows are written into another database with the same set-based statement as
//! in one database ([`merge`](crate::target::merge)): insert what is new, update only what
//! differs, delete the batch's keys the query no longer returns.
//!
//! The read is a REPEATABLE READ, READ ONLY transaction on the source whose snapshot is
//! proved to see every transaction that dirtied the batch (the visibility guard of
//! hand-written rebuilds, pipelined with the query). Its rows travel as text, one array
//! per column, bound as parameters of the write (`unnest($n+1::text[], …)`), and each
//! value is cast to its target column's type there: every type with a text form crosses,
//! and nothing is spliced into SQL. The write is one statement on the target, atomic on
//! its own; two rebuilds of one key never overlap (single flight), so a later read is
//! always written after an earlier one.

use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_postgres::Client;
use tokio_postgres::IsolationLevel;
use tokio_postgres::types::{Kind, ToSql, Type};

use crate::error::ErrorKind;
use crate::pool::client;
use crate::quote::quote_ident;
use crate::target::merge::Merge;
use crate::target::params::{TextParam, array_literal, check_scalar, element};
use crate::target::rebuild::{CancelOnDrop, NOT_VISIBLE, not_visible, txids};
use crate::{PgError, TableName};
use freshen::Due;

/// The prepared shape of a cross-database query rebuild.
#[derive(Clone, Debug)]
pub(crate) struct Across {
    pub(crate) source: Pool,
    pub(crate) target: Pool,
    /// `SELECT q.c::text, … FROM (query) q`, run on the source.
    pub(crate) fetch: String,
    /// The merge over the fetched arrays, run on the target.
    pub(crate) write: String,
    /// Element types of the query's key parameters (for checking key parts early).
    pub(crate) key_types: Vec<Type>,
    /// Whether to prove the source snapshot sees the dirtying transactions.
    pub(crate) check: bool,
    pub(crate) visibility_wait: Duration,
    /// Keys per call.
    pub(crate) batch: usize,
}

/// A target column: name and `format_type` spelling.
pub(crate) struct Column {
    pub(crate) name: String,
    pub(crate) type_name: String,
}

/// The statements for `query`'s `output` columns written into `into`, whose columns
/// (name, type) are `target`: `(fetch, write)`.
pub(crate) fn statements(
    into: &TableName,
    key: &[String],
    query: &str,
    output: &[String],
    target: &[Column],
) -> (String, String) {
    let type_of = |c: &str| {
        target
            .iter()
            .find(|t| t.name == c)
            .map_or("text", |t| t.type_name.as_str())
    };
    let fetch = format!(
        "SELECT {} FROM ({}\n) AS q",
        output
            .iter()
            .map(|c| format!("q.{}::text", quote_ident(c)))
            .collect::<Vec<_>>()
            .join(", "),
        query.trim_end()
    );
    let n = key.len();
    let arrays: Vec<String> = (0..output.len())
        .map(|i| format!("${}::text[]", n + 1 + i))
        .collect();
    let cols: Vec<String> = output.iter().map(|c| quote_ident(c)).collect();
    let rows = format!(
        "SELECT {} FROM unnest({}) AS s({})",
        output
            .iter()
            .map(|c| format!("s.{q}::{} AS {q}", type_of(c), q = quote_ident(c)))
            .collect::<Vec<_>>()
            .join(", "),
        arrays.join(", "),
        cols.join(", ")
    );
    let key_types: Vec<String> = key.iter().map(|k| format!("{}[]", type_of(k))).collect();
    let values: Vec<String> = output
        .iter()
        .filter(|c| !key.contains(c))
        .cloned()
        .collect();
    let write = Merge {
        into,
        key,
        values: &values,
        key_types: Some(&key_types),
    }
    .statement(&rows);
    (fetch, write)
}

impl Across {
    /// Reads the batch on the source, then writes it into the target.
    pub(crate) async fn run(&self, due: &[Due]) -> Result<(), PgError> {
        let keys = self.key_arrays(due)?;
        let columns = self.read(due, &keys).await?;
        let mut attempts = 0;
        loop {
            match self.write(&keys, &columns).await {
                Err(e) if matches!(e.sqlstate(), Some("40001" | "40P01")) && attempts < 3 => {
                    attempts += 1;
                }
                other => return other,
            }
        }
    }

    /// One array literal per key part, every part checked against its parameter type.
    fn key_arrays(&self, due: &[Due]) -> Result<Vec<TextParam>, PgError> {
        let mut out = Vec::with_capacity(self.key_types.len());
        for (j, ty) in self.key_types.iter().enumerate() {
            let mut column = Vec::with_capacity(due.len());
            for d in due {
                let part = d.key.parts().nth(j).ok_or_else(|| {
                    PgError::new(
                        ErrorKind::Config,
                        format!(
                            "the query uses ${} but a key has {} part(s)",
                            j + 1,
                            d.key.len()
                        ),
                    )
                })?;
                if let Some(text) = part {
                    check_scalar(ty, text).map_err(|why| {
                        PgError::new(
                            ErrorKind::Config,
                            format!("a key's part {} for ${}: {why}", j + 1, j + 1),
                        )
                    })?;
                }
                column.push(part);
            }
            out.push(TextParam(Some(array_literal(column))));
        }
        Ok(out)
    }

    /// The query's rows for the batch, one text array literal per output column, from a
    /// source snapshot that sees every dirtying transaction.
    async fn read(&self, due: &[Due], keys: &[TextParam]) -> Result<Vec<TextParam>, PgError> {
        let ids = if self.check { txids(due) } else { Vec::new() };
        let mut guard = CancelOnDrop::new(client(&self.source).await?);
        let outcome = self.read_in(guard.client(), &ids, keys).await;
        guard.disarm();
        outcome
    }

    async fn read_in(
        &self,
        c: &mut deadpool_postgres::Object,
        ids: &[String],
        keys: &[TextParam],
    ) -> Result<Vec<TextParam>, PgError> {
        let fetch = c
            .prepare_cached(&self.fetch)
            .await
            .map_err(|e| PgError::sql("the query does not prepare on the source", e))?;
        let check = c
            .prepare_cached(NOT_VISIBLE)
            .await
            .map_err(|e| PgError::sql("the visibility check does not prepare", e))?;
        let deadline = tokio::time::Instant::now() + self.visibility_wait;
        let mut pause = Duration::from_millis(2);
        loop {
            let tx = c
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(|e| PgError::sql("cannot begin the read on the source", e))?;
            let tx_ref = &tx;
            let unseen = async {
                if ids.is_empty() {
                    Ok(Vec::new())
                } else {
                    tx_ref.query(&check, &[&ids]).await
                }
            };
            let refs: Vec<&(dyn ToSql + Sync)> =
                keys.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
            let rows = tx_ref.query(&fetch, &refs);
            let (unseen, rows) = futures_util::future::join(unseen, rows).await;
            let unseen = unseen.map_err(|e| PgError::sql("visibility check failed", e))?;
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
            let rows = rows.map_err(|e| PgError::sql("the query failed on the source", e))?;
            let _ = tx.commit().await;
            let width = fetch.columns().len();
            return Ok((0..width)
                .map(|i| {
                    TextParam(Some(array_literal(
                        rows.iter().map(|r| r.get::<_, Option<&str>>(i)),
                    )))
                })
                .collect());
        }
    }

    async fn write(&self, keys: &[TextParam], columns: &[TextParam]) -> Result<(), PgError> {
        let mut guard = CancelOnDrop::new(client(&self.target).await?);
        let c = guard.client();
        let outcome = async {
            let stmt = c
                .prepare_cached(&self.write)
                .await
                .map_err(|e| PgError::sql("the write does not prepare on the target", e))?;
            let refs: Vec<&(dyn ToSql + Sync)> = keys
                .iter()
                .chain(columns)
                .map(|p| p as &(dyn ToSql + Sync))
                .collect();
            c.execute(&stmt, &refs)
                .await
                .map(|_| ())
                .map_err(|e| PgError::sql("writing the batch into the target failed", e))
        }
        .await;
        guard.disarm();
        outcome
    }
}

/// Element types of `stmt`'s parameters when each is an array (`None` otherwise).
pub(crate) fn array_elements(params: &[Type]) -> Option<Vec<Type>> {
    params
        .iter()
        .map(|t| match t.kind() {
            Kind::Array(_) => element(t).cloned(),
            _ => None,
        })
        .collect()
}

/// Whether a value of type `from` (the source's) can be written into a column of type
/// `to` on the target: the same type, or one the target casts to it on assignment.
/// Built-in types share their OIDs across databases; others are compared by name.
pub(crate) async fn fits(target: &Client, from: &Type, to_oid: u32) -> Result<bool, PgError> {
    if from.oid() == to_oid {
        return Ok(true);
    }
    let row = target
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_type WHERE oid = $2 AND typname = $3) \
                 OR EXISTS (SELECT 1 FROM pg_cast WHERE castsource = $1 AND casttarget = $2 \
                            AND castcontext IN ('a', 'i'))",
            &[&from.oid(), &to_oid, &from.name()],
        )
        .await
        .map_err(|e| PgError::sql("cannot compare the column types", e))?;
    Ok(row.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_write_casts_each_array_to_its_target_type() {
        let into = TableName::new("public", "device_totals");
        let target = vec![
            Column {
                name: "device".into(),
                type_name: "integer".into(),
            },
            Column {
                name: "total".into(),
                type_name: "numeric(12,2)".into(),
            },
        ];
        let (fetch, write) = statements(
            &into,
            &["device".into()],
            "SELECT device, sum(value) AS total FROM readings WHERE device = ANY($1) GROUP BY device",
            &["device".into(), "total".into()],
            &target,
        );
        assert_eq!(
            fetch,
            "SELECT q.\"device\"::text, q.\"total\"::text FROM (SELECT device, sum(value) AS total FROM readings WHERE device = ANY($1) GROUP BY device\n) AS q"
        );
        assert!(
            write.contains(
                "SELECT s.\"device\"::integer AS \"device\", s.\"total\"::numeric(12,2) AS \"total\" FROM unnest($2::text[], $3::text[]) AS s(\"device\", \"total\")"
            ),
            "{write}"
        );
        assert!(
            write.contains("t.\"device\" = ANY($1::integer[])"),
            "{write}"
        );
    }
}
