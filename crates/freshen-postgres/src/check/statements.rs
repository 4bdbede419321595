//! Rebuild statements and a reconcile query prepared against a view's key.

use freshen::plug::Finding;
use tokio_postgres::types::Kind;

use crate::Pool;
use crate::error::db_message;

/// What a view asks of its rebuild statements, for [`statements`].
#[derive(Debug, Clone, Copy)]
pub struct StatementShape<'a> {
    /// The view's name, for the findings' subjects.
    pub view: &'a str,
    /// Parts of the view's key.
    pub arity: usize,
    /// The key's columns as the first watch names them (for the message).
    pub key_columns: &'a [String],
    /// Whether keys are passed as arrays of parts (`rebuild_batch`).
    pub batch: bool,
    /// How the findings name the statements: `rebuild` (`rebuild[0]`, …) or
    /// `rebuild_set`, which are always written over arrays.
    pub list: &'a str,
}

/// Prepares every rebuild statement and the reconcile query of a view on the target,
/// checking parameters and columns against the view's key.
pub async fn statements(
    pool: &Pool,
    shape: StatementShape<'_>,
    rebuild: &[String],
    reconcile: Option<&str>,
) -> Vec<Finding> {
    let view = shape.view;
    let arity = shape.arity;
    let client = match crate::pool::client(pool).await {
        Ok(c) => c,
        Err(e) => {
            return vec![Finding::error(
                "target",
                view,
                format!("cannot connect: {e}"),
            )];
        }
    };
    let mut out = Vec::new();
    for (i, sql) in rebuild.iter().enumerate() {
        let subject = format!("view {view} {}[{i}]", shape.list);
        out.push(match client.prepare(sql).await {
            Err(e) => Finding::error("statement", subject, format!("does not prepare: {}", db_message(&e))),
            Ok(stmt) => {
                let params = stmt.params();
                let non_array: Vec<String> = params
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| !matches!(t.kind(), Kind::Array(_)))
                    .map(|(n, t)| format!("${} is {}", n + 1, t.name()))
                    .collect();
                if params.len() != arity {
                    Finding::error(
                        "statement",
                        subject,
                        format!(
                            "takes {} parameter(s) but the view's key has {arity} part(s) ({}): use $1..${arity}",
                            params.len(),
                            shape.key_columns.join(", ")
                        ),
                    )
                } else if shape.batch && !non_array.is_empty() {
                    Finding::error(
                        "statement",
                        subject,
                        format!(
                            "{} each parameter is an array of key parts (e.g. `= ANY($1)`), but {}",
                            if shape.list == "rebuild" { "with rebuild_batch" } else { "in a set statement" },
                            non_array.join(", ")
                        ),
                    )
                } else {
                    Finding::ok("statement", subject, format!("prepares with {arity} parameter(s)"))
                }
            }
        });
    }
    if let Some(keys) = reconcile {
        let subject = format!("view {view} reconcile.keys");
        out.push(match client.prepare(keys).await {
            Err(e) => Finding::error(
                "statement",
                subject,
                format!("does not prepare: {}", db_message(&e)),
            ),
            Ok(stmt) if !stmt.params().is_empty() => {
                Finding::error("statement", subject, "must not take parameters")
            }
            Ok(stmt) if stmt.columns().len() != arity => Finding::error(
                "statement",
                subject,
                format!(
                    "returns {} column(s) but the view's key has {arity} part(s)",
                    stmt.columns().len()
                ),
            ),
            Ok(_) => Finding::ok(
                "statement",
                subject,
                format!("lists keys of {arity} part(s)"),
            ),
        });
    }
    out
}
