//! A query-mode view: its query, output columns, target key and source indexes.

use freshen::plug::{Finding, ViewSpec};
use tokio_postgres::Client;

use crate::{TableName, quote_ident};

/// A view rebuilt by `query`, as the checks below read it.
#[derive(Debug, Clone)]
struct CheckedQuery<'a> {
    /// The view's name.
    pub view: &'a str,
    /// The table the query's rows go into.
    pub into: TableName,
    /// The view's key columns (in the target, and `$1..$n`).
    pub key: &'a [String],
    /// The query.
    pub query: String,
    /// Keys per statement.
    pub batch: usize,
    /// The watched tables that carry the view's key, with their key columns: where the
    /// query finds a batch's rows.
    pub sources: Vec<(TableName, &'a [String])>,
}

impl<'a> CheckedQuery<'a> {
    /// `None` for a view rebuilt by statements.
    fn of(view: &'a ViewSpec) -> Option<Self> {
        let q = view.query.as_ref()?;
        Some(CheckedQuery {
            view: &view.name,
            into: TableName::new(&q.into.0, &q.into.1),
            key: view.key(),
            query: crate::target::keyed::batch_query(&q.query, view.key()),
            batch: view.rebuild_batch.unwrap_or(crate::DEFAULT_QUERY_BATCH),
            sources: view
                .direct()
                .map(|w| (TableName::new(&w.schema, &w.table), w.key.as_slice()))
                .collect(),
        })
    }
}

/// Everything PostgreSQL can tell about a query-mode view: the query prepares and takes
/// its batch as arrays, its output columns exist in the target (key columns included)
/// with types that can be written and compared, the target has a unique key, and each
/// watched table has an index leading with the key (every mismatch, each its own
/// finding).
pub async fn query_view(client: &Client, view: &ViewSpec) -> Vec<Finding> {
    let Some(spec) = &CheckedQuery::of(view) else {
        return Vec::new();
    };
    let subject = format!("view {} query", spec.view);
    let mut out = Vec::new();
    match crate::target::query::plan(client, &spec.into, spec.key, &spec.query).await {
        Err(e) => out.push(Finding::error("query", subject.clone(), e.to_string())),
        Ok(Err(problems)) => {
            for p in problems {
                out.push(Finding::error("query", subject.clone(), p));
            }
        }
        Ok(Ok(_)) => out.push(Finding::ok(
            "query",
            subject.clone(),
            format!(
                "writes into {} keyed on ({}), up to {} key(s) per statement; rows whose values did not change are not rewritten",
                spec.into,
                spec.key.join(", "),
                spec.batch
            ),
        )),
    }
    out.extend(index_findings(client, spec).await);
    out
}

/// [`query_view`] for a query that runs on `source` and whose rows are written into a
/// separate `target` database: the query's output is compared with the target table
/// there, and the watched tables' indexes are looked up on the source.
pub async fn query_view_across(source: &Client, target: &Client, view: &ViewSpec) -> Vec<Finding> {
    let Some(spec) = &CheckedQuery::of(view) else {
        return Vec::new();
    };
    let subject = format!("view {} query", spec.view);
    let mut out = Vec::new();
    match crate::target::query::plan_across(source, target, &spec.into, spec.key, &spec.query).await {
        Err(e) => out.push(Finding::error("query", subject.clone(), e.to_string())),
        Ok(Err(problems)) => {
            for p in problems {
                out.push(Finding::error("query", subject.clone(), p));
            }
        }
        Ok(Ok(_)) => out.push(Finding::ok(
            "query",
            subject.clone(),
            format!(
                "reads the source and writes into {} in the target database, keyed on ({}), up to {} key(s) per statement; rows whose values did not change are not rewritten",
                spec.into,
                spec.key.join(", "),
                spec.batch
            ),
        )),
    }
    out.extend(index_findings(source, spec).await);
    out
}

/// Whether each watched table has an index leading with the view's key.
async fn index_findings(client: &Client, spec: &CheckedQuery<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for (table, key) in &spec.sources {
        let subject = format!("view {} watch {table}", spec.view);
        match crate::target::query::indexes(client, table).await {
            Err(e) => out.push(Finding::error("index", subject, e.to_string())),
            Ok(found) => match found.iter().find(|i| i.leads_with(key)) {
                Some(i) => out.push(Finding::ok(
                    "index",
                    subject,
                    format!(
                        "rebuilds find a key's rows through {}{}",
                        i.name,
                        if i.clustered {
                            " (the table is clustered on it)"
                        } else if !i.include.is_empty() {
                            " (covering)"
                        } else {
                            ""
                        }
                    ),
                )),
                None => out.push(Finding::warning(
                    "index",
                    subject,
                    format!(
                        "no index leads with ({k}): every rebuild reads the whole of {table}. CREATE INDEX ON {} ({k}) — or a covering one, ({k}) INCLUDE (the columns the query reads), which answers from the index alone once vacuumed (see BENCHMARKS.md, rebuild-index). Where the replica_identity check proposes a unique identity index, it leads with ({k}) and serves the rebuilds too: create that one instead of both",
                        table.quoted(),
                        k = key.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ")
                    ),
                )),
            },
        }
    }
    out
}
