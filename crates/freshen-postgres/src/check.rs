//! What `freshen check` asks of PostgreSQL: a source set up for logical replication
//! (wal_level, privilege, slot, publication, replica identities) and rebuild statements
//! that prepare with the view's key. Every finding says what to do.

use freshen::plug::{Finding, Plan};
use tokio_postgres::types::Kind;

use crate::settings::{PgSourceSettings, PublicationChoice, SlotChoice};
use crate::{PgAdmin, Pool, TableName, quote_ident};

/// A slot further behind than this is reported: an abandoned pipeline retains WAL.
pub const LAG_WARNING_BYTES: u64 = 1 << 30;

/// The source's findings for `plan`.
pub(crate) async fn source(s: &PgSourceSettings, plan: &Plan) -> Vec<Finding> {
    let mut out = Vec::new();
    let subject = s.url.redacted();
    let conn = match s.connection() {
        Ok(c) => c,
        Err(e) => return vec![Finding::error("source", subject, e.to_string())],
    };
    let admin = match PgAdmin::connect(&conn).await {
        Ok(a) => a,
        Err(e) => {
            return vec![Finding::error(
                "source",
                subject,
                format!("cannot connect: {e}"),
            )];
        }
    };
    out.push(match admin.wal_level().await {
        Ok(l) if l == "logical" => Finding::ok("wal_level", &subject, "logical"),
        Ok(l) => Finding::error(
            "wal_level",
            &subject,
            format!("wal_level is {l}; logical replication needs `wal_level = logical` in postgresql.conf and a restart"),
        ),
        Err(e) => Finding::error("wal_level", &subject, e.to_string()),
    });
    out.push(match admin.can_replicate().await {
        Ok(true) => Finding::ok(
            "privilege",
            &subject,
            format!("{} may replicate", conn.user),
        ),
        Ok(false) => Finding::error(
            "privilege",
            &subject,
            format!(
                "role {} lacks REPLICATION: ALTER ROLE {} WITH REPLICATION",
                conn.user,
                quote_ident(&conn.user)
            ),
        ),
        Err(e) => Finding::error("privilege", &subject, e.to_string()),
    });
    out.push(slot(&admin, &s.slot, s.slot_mode).await);
    let tables: Vec<TableName> = plan
        .tables
        .iter()
        .map(|(schema, table)| TableName::new(schema, table))
        .collect();
    if let Some(f) = publication(&admin, s, &tables).await {
        out.push(f);
    }
    for w in &plan.watched {
        out.push(identity(&admin, w).await);
    }
    if plan.changefeed {
        out.extend(partial_updates(&admin, &tables).await);
    }
    out
}

async fn slot(admin: &PgAdmin, slot: &str, mode: SlotChoice) -> Finding {
    match admin.slot(slot).await {
        Ok(None) => match mode {
            SlotChoice::Existing => Finding::error(
                "slot",
                slot,
                "does not exist and slot_mode = \"existing\": create it, or use slot_mode = \"create\"",
            ),
            SlotChoice::Temporary => Finding::ok("slot", slot, "temporary: created per session"),
            SlotChoice::Create => Finding::ok("slot", slot, "will be created"),
        },
        Ok(Some(info)) if info.is_lost() => Finding::error(
            "slot",
            slot,
            "was invalidated by the server (wal_status = lost): drop it with `freshen drop`, run again, and let the reconcile sweep rebuild",
        ),
        Ok(Some(info)) => {
            let lag = info.lag_bytes.unwrap_or(0);
            if info.active {
                Finding::warning(
                    "slot",
                    slot,
                    format!(
                        "is in use by process {} — another freshen may be running on it",
                        info.active_pid.map_or("?".into(), |p| p.to_string())
                    ),
                )
            } else if lag > LAG_WARNING_BYTES {
                Finding::warning(
                    "slot",
                    slot,
                    format!(
                        "exists, is idle and retains {} MiB of WAL: start `freshen run`, or `freshen drop` it if the pipeline is abandoned",
                        lag >> 20
                    ),
                )
            } else {
                Finding::ok("slot", slot, format!("exists, {lag} bytes behind"))
            }
        }
        Err(e) => Finding::error("slot", slot, e.to_string()),
    }
}

fn quoted_list(tables: &[TableName]) -> String {
    tables
        .iter()
        .map(TableName::quoted)
        .collect::<Vec<_>>()
        .join(", ")
}

async fn publication(
    admin: &PgAdmin,
    s: &PgSourceSettings,
    tables: &[TableName],
) -> Option<Finding> {
    let name = &s.publication;
    Some(match admin.publication(name).await {
        Ok(None) if s.publication_mode == PublicationChoice::Existing => Finding::error(
            "publication",
            name,
            format!(
                "does not exist and publication_mode = \"existing\": CREATE PUBLICATION {} FOR TABLE {}",
                quote_ident(name),
                quoted_list(tables)
            ),
        ),
        Ok(None) => Finding::ok(
            "publication",
            name,
            "will be created for the watched tables",
        ),
        Ok(Some(_)) => match admin.coverage(name, tables).await {
            Ok(Some(c)) if c.is_complete() => Finding::ok(
                "publication",
                name,
                "covers every watched table and operation",
            ),
            Ok(Some(c)) => {
                let mut what = Vec::new();
                if !c.missing_tables.is_empty() {
                    what.push(format!(
                        "lacks {}: ALTER PUBLICATION {} ADD TABLE {}",
                        c.missing_tables
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", "),
                        quote_ident(name),
                        quoted_list(&c.missing_tables)
                    ));
                }
                if !c.missing_operations.is_empty() {
                    what.push(format!(
                        "does not publish {}",
                        c.missing_operations.join(", ")
                    ));
                }
                Finding::error("publication", name, what.join("; "))
            }
            Ok(None) => return None,
            Err(e) => Finding::error("publication", name, e.to_string()),
        },
        Err(e) => Finding::error("publication", name, e.to_string()),
    })
}

async fn identity(admin: &PgAdmin, w: &freshen::plug::Watched) -> Finding {
    let table = TableName::new(&w.schema, &w.table);
    let cols: Vec<&str> = w.key.iter().map(String::as_str).collect();
    match admin.check_replica_identity(&table, &cols).await {
        Ok(c) if c.carries_old_scope => Finding::ok(
            "replica_identity",
            table.to_string(),
            format!(
                "{} carries the old key of view {}",
                c.identity.identity, w.view
            ),
        ),
        Ok(c) => Finding::warning(
            "replica_identity",
            table.to_string(),
            format!(
                "view {}: {}",
                w.view,
                c.advice
                    .unwrap_or_else(|| "the old key is not carried".into())
            ),
        ),
        Err(e) => Finding::error("replica_identity", table.to_string(), e.to_string()),
    }
}

/// Tables whose changefeed events can lack an unchanged large value: under a replica
/// identity other than FULL an UPDATE does not send a TOASTed column it left alone, and
/// the changefeed fills it from the row's last image only when it has one.
async fn partial_updates(admin: &PgAdmin, tables: &[TableName]) -> Vec<Finding> {
    let advice = match admin.partial_updates(tables).await {
        Ok(a) => a,
        Err(e) => {
            return vec![Finding::error(
                "changefeed",
                "replica identity",
                e.to_string(),
            )];
        }
    };
    if advice.is_empty() {
        return vec![Finding::ok(
            "changefeed",
            "replica identity",
            "every captured table sends whole rows (or has no out-of-line columns)",
        )];
    }
    advice
        .into_iter()
        .map(|a| {
            Finding::warning(
                "changefeed",
                &a.table,
                format!(
                    "an UPDATE that leaves {} alone does not send them: the changefeed fills them from the row's last image, and marks the event \"partial\" when it has none; to always send whole rows: {}",
                    a.columns.join(", "),
                    a.fix
                ),
            )
        })
        .collect()
}

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
        let subject = format!("view {view} rebuild[{i}]");
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
                            "with rebuild_batch each parameter is an array of key parts (e.g. `= ANY($1)`), but {}",
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

/// The server's own message for a SQL error (tokio-postgres' Display is just "db error").
pub fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut m = db.message().to_string();
            if let Some(hint) = db.hint() {
                m.push_str(&format!(" (hint: {hint})"));
            }
            m
        }
        None => e.to_string(),
    }
}
