//! A view's tables, key columns, types, fan-outs and dependencies, as PostgreSQL sees them.

use freshen::plug::{Finding, Level, ViewSpec};
use tokio_postgres::Client;

use crate::TableName;
use crate::catalog::{TypeInfo, columns, key_fits, type_info};
use crate::spelling::closest;

/// A view as the checks below read it: its tables parsed, borrowed from the
/// [`ViewSpec`] (a `query` is its one rebuild statement).
#[derive(Debug, Clone)]
struct Checked<'a> {
    /// The view's name.
    pub name: &'a str,
    /// Its watched tables.
    pub watch: Vec<CheckedWatch<'a>>,
    /// The rebuild statements (then the set statements), each with its name in the
    /// findings and whether it takes arrays of key parts.
    pub rebuild: Vec<Statement<'a>>,
    /// Whether the view is a plain query (built whole while empty).
    pub plain: bool,
    /// Tables the view reads without watching them, on purpose.
    pub static_tables: Vec<TableName>,
    /// Whether it has a reconcile sweep.
    pub reconcile: bool,
}

/// A statement of a [`Checked`] view that takes its key.
#[derive(Debug, Clone)]
struct Statement<'a> {
    /// How findings name it: `rebuild[0]`, `rebuild_set[1]`.
    pub what: String,
    /// Its text.
    pub sql: std::borrow::Cow<'a, str>,
    /// Whether its parameters are arrays of key parts (`rebuild_batch`, a query, a set
    /// statement).
    pub arrays: bool,
}

/// A watched table of a [`Checked`] view.
#[derive(Debug, Clone)]
struct CheckedWatch<'a> {
    /// The table.
    pub table: TableName,
    /// Its key columns (`$1..$n`).
    pub key: &'a [String],
    /// The fan-out statement, for an entry that maps its rows to the view's keys.
    pub keys: Option<&'a str>,
}

impl<'a> Checked<'a> {
    fn of(view: &'a ViewSpec) -> Self {
        Checked {
            name: &view.name,
            watch: view
                .watch
                .iter()
                .map(|w| CheckedWatch {
                    table: TableName::new(&w.schema, &w.table),
                    key: &w.key,
                    keys: w.keys.as_deref(),
                })
                .collect(),
            plain: view
                .query
                .as_ref()
                .is_some_and(|q| freshen::plug::is_plain_query(&q.query)),
            rebuild: match &view.query {
                Some(q) => vec![Statement {
                    what: "rebuild[0]".into(),
                    sql: crate::target::keyed::batch_query(&q.query, view.key()).into(),
                    arrays: true,
                }],
                None => {
                    let batch = view.rebuild_batch.is_some();
                    let own = view.rebuild.iter().enumerate().map(|(i, s)| Statement {
                        what: format!("rebuild[{i}]"),
                        sql: s.as_str().into(),
                        arrays: batch,
                    });
                    let set = view.rebuild_set.iter().enumerate().map(|(i, s)| Statement {
                        what: format!("rebuild_set[{i}]"),
                        sql: s.as_str().into(),
                        arrays: true,
                    });
                    own.chain(set).collect()
                }
            },
            static_tables: view
                .static_tables
                .iter()
                .map(|(s, t)| TableName::new(s, t))
                .collect(),
            reconcile: view.reconcile.is_some(),
        }
    }
}

fn finding(level: Level, check: &'static str, subject: String, message: String) -> Finding {
    Finding::new(level, check, subject, message)
}

/// Everything PostgreSQL can tell about a view before it runs: its key columns exist
/// (with a did-you-mean), their types suit the parameters every statement binds them
/// to, its fan-out statements return its key, every relation its statements read is
/// watched or declared static (with the missing watch entry proposed), and whether it
/// has a start-up backfill.
pub async fn check_view(client: &Client, view: &ViewSpec) -> Vec<Finding> {
    let view = &Checked::of(view);
    let mut out = Vec::new();
    let name = view.name;
    if !view.reconcile && view.plain {
        // A plain query's empty table is built whole at start; what stays unhealed is a
        // TRUNCATE, a gap, a quarantined key.
        out.push(finding(
            Level::Warning,
            "reconcile",
            format!("view {name}"),
            "has no `reconcile`: its table is built whole while empty, but a truncated watched table (or a change the stream did not carry) leaves rows nothing heals; add reconcile = { every = \"1h\" } (for a plain query, one whole-table diff that writes only what differs)".into(),
        ));
    } else if !view.reconcile {
        out.push(finding(
            Level::Warning,
            "reconcile",
            format!("view {name}"),
            "has no `reconcile`: no start-up backfill (rows that exist before the first change stay missing) and no TRUNCATE heal (a truncated watched table leaves its rows); add reconcile = { every = \"1h\", keys = \"SELECT …\" }".into(),
        ));
    }
    // Parameter types of each rebuild statement ($n of a batch statement: its element).
    let mut rebuild_params: Vec<(&str, Vec<TypeInfo>)> = Vec::new();
    for st in &view.rebuild {
        let mut types = Vec::new();
        if let Ok(stmt) = client.prepare(st.sql.as_ref()).await {
            for ty in stmt.params() {
                let ty = match ty.kind() {
                    tokio_postgres::types::Kind::Array(e) if st.arrays => e.clone(),
                    _ => ty.clone(),
                };
                if let Ok(t) = type_info(client, &ty).await {
                    types.push(t);
                }
            }
        }
        rebuild_params.push((&st.what, types));
    }
    let mut keyed = Vec::new();
    for w in &view.watch {
        let subject = format!("view {name} watch {}", w.table);
        let cols = match columns(client, &w.table).await {
            Ok(c) => c,
            Err(e) => {
                out.push(finding(Level::Error, "key_column", subject, e.to_string()));
                continue;
            }
        };
        let mut key_types = Vec::new();
        for k in w.key {
            match cols.iter().find(|c| c.name == *k) {
                Some(c) => key_types.push(c.ty.clone()),
                None => {
                    let hint = closest(k, cols.iter().map(|c| c.name.as_str()))
                        .map(|c| format!(" (did you mean `{c}`?)"))
                        .unwrap_or_default();
                    out.push(finding(
                        Level::Error,
                        "key_column",
                        subject.clone(),
                        format!(
                            "{} has no column `{k}`{hint}; its columns: {}",
                            w.table,
                            cols.iter()
                                .map(|c| c.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
            }
        }
        if key_types.len() != w.key.len() {
            continue;
        }
        match w.keys {
            None => {
                keyed.push(crate::check::depends::KeyedTable {
                    table: w.table.clone(),
                    key: w.key.to_vec(),
                });
                for (what, params) in &rebuild_params {
                    type_findings(&mut out, &subject, what, w.key, &key_types, params);
                }
            }
            Some(sql) => {
                fanout_findings(
                    client,
                    &mut out,
                    &subject,
                    w,
                    &key_types,
                    sql,
                    &rebuild_params,
                )
                .await;
            }
        }
    }
    // Dependencies: every relation read must be watched or static.
    let watched: Vec<&TableName> = view.watch.iter().map(|w| &w.table).collect();
    let mut statements: Vec<(String, &str)> = view
        .rebuild
        .iter()
        .map(|s| (s.what.clone(), s.sql.as_ref()))
        .collect();
    for w in &view.watch {
        if let Some(k) = w.keys {
            statements.push((format!("keys of {}", w.table), k));
        }
    }
    let mut found = Vec::new();
    let mut written = Vec::new();
    for (what, sql) in &statements {
        match crate::check::depends::relations(client, sql).await {
            Ok(r) => {
                written.extend(r.writes.clone());
                for f in &r.opaque_functions {
                    out.push(finding(
                        Level::Warning,
                        "depends",
                        format!("view {name} {what}"),
                        format!(
                            "calls {f}, whose body PostgreSQL does not track: the tables it reads cannot be checked. Watch them (or list them in `static`), or write it as a SQL-standard function (BEGIN ATOMIC … END) so check can see them"
                        ),
                    ));
                }
                found.push((what.clone(), r.reads));
            }
            Err(e) => out.push(finding(
                Level::Error,
                "depends",
                format!("view {name} {what}"),
                format!("cannot tell which tables it reads: {e}"),
            )),
        }
    }
    let mut reported: Vec<TableName> = Vec::new();
    for (what, reads) in found {
        let subject = format!("view {name} {what}");
        let mut missing = Vec::new();
        for t in reads {
            if watched.contains(&&t) || view.static_tables.contains(&t) || written.contains(&t) {
                continue;
            }
            missing.push(t);
        }
        if missing.is_empty() {
            out.push(finding(
                Level::Ok,
                "depends",
                subject,
                "reads only watched or static tables".into(),
            ));
            continue;
        }
        for t in missing {
            if reported.contains(&t) {
                continue;
            }
            reported.push(t.clone());
            let proposal = match crate::check::depends::propose_watch(client, &t, &keyed).await {
                Ok(Some(p)) => format!("Add to the view's watch: {p}"),
                _ => "Add a watch entry for it (with `keys` mapping its rows to the view's key)"
                    .to_string(),
            };
            out.push(finding(
                Level::Error,
                "depends",
                subject.clone(),
                format!(
                    "reads {t}, which the view neither watches nor lists as static: a change to it would leave the view stale. {proposal}; or, if it never changes (or its changes are deliberately ignored), static = [\"{t}\"]"
                ),
            ));
        }
    }
    out
}

fn type_findings(
    out: &mut Vec<Finding>,
    subject: &str,
    statement: &str,
    key: &[String],
    key_types: &[TypeInfo],
    params: &[TypeInfo],
) {
    for (j, (col, ty)) in key.iter().zip(key_types).enumerate() {
        let Some(param) = params.get(j) else { continue };
        if let Some(why) = key_fits(ty, param) {
            out.push(finding(
                Level::Error,
                "key_type",
                subject.to_owned(),
                format!(
                    "`{col}` ({}) is bound to ${} of {statement}, which PostgreSQL reads as {}: {why}; cast in the statement (${}::{}) or key on a column of that type",
                    ty.name,
                    j + 1,
                    param.name,
                    j + 1,
                    ty.name
                ),
            ));
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn fanout_findings(
    client: &Client,
    out: &mut Vec<Finding>,
    subject: &str,
    w: &CheckedWatch<'_>,
    key_types: &[TypeInfo],
    sql: &str,
    rebuild_params: &[(&str, Vec<TypeInfo>)],
) {
    let stmt = match client.prepare(sql).await {
        Ok(s) => s,
        Err(e) => {
            out.push(finding(
                Level::Error,
                "fanout",
                subject.to_owned(),
                format!(
                    "the `keys` statement does not prepare: {}",
                    crate::error::describe(&e)
                ),
            ));
            return;
        }
    };
    if stmt.params().len() > w.key.len() {
        out.push(finding(
            Level::Error,
            "fanout",
            subject.to_owned(),
            format!(
                "the `keys` statement uses ${} but `key` names {} column(s) ({})",
                stmt.params().len(),
                w.key.len(),
                w.key.join(", ")
            ),
        ));
    }
    let mut params = Vec::new();
    for ty in stmt.params() {
        if let Ok(t) = type_info(client, ty).await {
            params.push(t);
        }
    }
    type_findings(
        out,
        subject,
        "the `keys` statement",
        w.key,
        key_types,
        &params,
    );
    // What it returns is bound to the rebuild statements as the view's key.
    let arity = rebuild_params
        .iter()
        .map(|(_, p)| p.len())
        .max()
        .unwrap_or(0);
    if stmt.columns().len() != arity && arity > 0 {
        out.push(finding(
            Level::Error,
            "fanout",
            subject.to_owned(),
            format!(
                "the `keys` statement returns {} column(s) but the view's key has {arity} part(s)",
                stmt.columns().len()
            ),
        ));
        return;
    }
    let names: Vec<String> = stmt.columns().iter().map(|c| c.name().to_owned()).collect();
    let mut returned = Vec::new();
    for c in stmt.columns() {
        if let Ok(t) = type_info(client, c.type_()).await {
            returned.push(t);
        }
    }
    if returned.len() == names.len() {
        for (what, params) in rebuild_params {
            type_findings(out, subject, what, &names, &returned, params);
        }
    }
    out.push(finding(
        Level::Ok,
        "fanout",
        subject.to_owned(),
        format!(
            "the `keys` statement maps {} to the view's key ({})",
            w.key.join(", "),
            names.join(", ")
        ),
    ));
}
