//! `freshen check`: the file, then the database — everything a configuration needs to
//! work, reported at once.

use std::fmt;

use freshen_postgres::{ConnectionConfig, PgAdmin, Pool, TableName};
use serde::Serialize;
use tokio_postgres::types::Kind;

use crate::config::{self, Config, PublicationMode, SlotMode, Source, View};

/// A slot further behind than this is reported: an abandoned pipeline retains WAL.
pub const LAG_WARNING_BYTES: u64 = 1 << 30;

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Checked and fine.
    Ok,
    /// Works, but something can go wrong; says how to fix it.
    Warning,
    /// Will not work.
    Error,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Ok => "ok",
            Level::Warning => "warning",
            Level::Error => "error",
        })
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Severity.
    pub level: Level,
    /// Which check (`config`, `wal_level`, `slot`, `replica_identity`, `statement`, …).
    pub check: &'static str,
    /// What it is about (a table, a view, a statement).
    pub subject: String,
    /// What was found and what to do.
    pub message: String,
}

/// Everything `check` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    /// True when there is no error.
    pub ok: bool,
    /// The findings, in the order they were made.
    pub findings: Vec<Finding>,
}

impl CheckReport {
    fn push(
        &mut self,
        level: Level,
        check: &'static str,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.findings.push(Finding {
            level,
            check,
            subject: subject.into(),
            message: message.into(),
        });
    }

    /// How many findings are warnings (`--deny-warnings` fails on any).
    pub fn warnings(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.level == Level::Warning)
            .count()
    }

    fn finish(mut self) -> CheckReport {
        self.ok = !self.findings.iter().any(|f| f.level == Level::Error);
        self
    }

    /// One line per finding.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            out.push_str(&format!(
                "{:<8} {:<17} {}: {}\n",
                f.level, f.check, f.subject, f.message
            ));
        }
        let errors = self
            .findings
            .iter()
            .filter(|f| f.level == Level::Error)
            .count();
        let warnings = self
            .findings
            .iter()
            .filter(|f| f.level == Level::Warning)
            .count();
        out.push_str(&format!("\n{errors} error(s), {warnings} warning(s)\n"));
        out
    }
}

/// Checks the file at `path` and, unless `offline`, the databases it names.
pub async fn check(path: &std::path::Path, offline: bool) -> CheckReport {
    let mut report = CheckReport::default();
    let cfg = match config::load(path) {
        Ok(cfg) => cfg,
        Err(e) => {
            for (place, message) in e.located() {
                report.push(Level::Error, "config", place, message);
            }
            return report.finish();
        }
    };
    report.push(
        Level::Ok,
        "config",
        path.display().to_string(),
        format!(
            "{} view(s) over {} table(s)",
            cfg.views.len(),
            cfg.watched_tables().len()
        ),
    );
    if !offline {
        check_database(&cfg, &mut report).await;
    }
    report.finish()
}

fn table_names(cfg: &Config) -> Vec<TableName> {
    cfg.watched_tables()
        .into_iter()
        .map(|(s, t)| TableName::new(s, t))
        .collect()
}

async fn check_database(cfg: &Config, report: &mut CheckReport) {
    match &cfg.source {
        Source::Postgres(pg) => check_postgres_source(cfg, pg, report).await,
        Source::Pulsar(p) => report.push(
            Level::Ok,
            "source",
            format!("pulsar {}", freshen::redact_url(&p.url)),
            format!(
                "subscription {} reads {} as {:?} (the broker is not contacted by check)",
                p.subscription, p.topic, p.format
            ),
        ),
        Source::Kafka(k) => report.push(
            Level::Ok,
            "source",
            format!("kafka {}", k.brokers),
            format!(
                "group {} reads {} as {:?} (brokers are not contacted by check)",
                k.group,
                k.topics.join(", "),
                k.format
            ),
        ),
    }
    if cfg.views.is_empty() {
        return;
    }
    let target = match ConnectionConfig::from_url(cfg.target.url.expose())
        .and_then(|c| freshen_postgres::connect_pool(&c, 2))
    {
        Ok(pool) => pool,
        Err(e) => {
            report.push(
                Level::Error,
                "target",
                cfg.target.url.redacted(),
                e.to_string(),
            );
            return;
        }
    };
    for view in &cfg.views {
        for f in check_statements(&target, view).await {
            report.findings.push(f);
        }
    }
    match target.get().await {
        Ok(client) => {
            for view in &cfg.views {
                let spec = view_spec(view);
                for f in freshen_postgres::check::check_view(&client, &spec).await {
                    report.findings.push(finding(f));
                }
            }
        }
        Err(e) => report.push(
            Level::Error,
            "target",
            cfg.target.url.redacted(),
            format!("cannot connect: {e}"),
        ),
    }
}

/// A view as freshen-postgres' checks take it.
fn view_spec(view: &View) -> freshen_postgres::check::ViewSpec<'_> {
    freshen_postgres::check::ViewSpec {
        name: &view.name,
        watch: view
            .watch
            .iter()
            .map(|w| freshen_postgres::check::WatchSpec {
                table: TableName::new(&w.schema, &w.table),
                key: &w.key,
                keys: w.keys.as_deref(),
            })
            .collect(),
        rebuild: view.rebuild.iter().map(String::as_str).collect(),
        batch: view.rebuild_batch.is_some(),
        static_tables: view
            .static_tables
            .iter()
            .map(|(s, t)| TableName::new(s, t))
            .collect(),
        reconcile: view.reconcile.is_some(),
    }
}

fn finding(f: freshen_postgres::check::Finding) -> Finding {
    use freshen_postgres::check::Severity;
    Finding {
        level: match f.severity {
            Severity::Ok => Level::Ok,
            Severity::Warning => Level::Warning,
            Severity::Error => Level::Error,
        },
        check: f.check,
        subject: f.subject,
        message: f.message,
    }
}

/// Publication safety and the privileges to create or extend it, from freshen-postgres.
async fn check_publication_safety(
    admin: &PgAdmin,
    pg: &crate::config::PgSource,
    tables: &[TableName],
    report: &mut CheckReport,
) {
    let client = match admin.pool().get().await {
        Ok(c) => c,
        Err(e) => {
            report.push(Level::Error, "publication", &pg.publication, e.to_string());
            return;
        }
    };
    match freshen_postgres::check::unpublishable(&client, tables).await {
        Ok(bad) if bad.is_empty() => report.push(
            Level::Ok,
            "publication",
            &pg.publication,
            "every watched table can replicate UPDATE and DELETE",
        ),
        Ok(bad) => {
            for b in bad {
                report.push(
                    Level::Error,
                    "publication",
                    b.table.to_string(),
                    format!("freshen refuses to publish it: {b}"),
                );
            }
        }
        Err(e) => report.push(Level::Error, "publication", &pg.publication, e.to_string()),
    }
    // Creating the publication, or adding tables to it, needs ownership of the tables.
    let to_add: Vec<TableName> = match admin.coverage(&pg.publication, tables).await {
        Ok(None) if pg.publication_mode == PublicationMode::Create => tables.to_vec(),
        Ok(Some(c)) => c.missing_tables,
        _ => Vec::new(),
    };
    if to_add.is_empty() {
        return;
    }
    match freshen_postgres::check::publication_privileges(&client, &to_add).await {
        Ok(lacks) => {
            for l in lacks {
                report.push(Level::Error, "privilege", &pg.publication, l);
            }
        }
        Err(e) => report.push(Level::Error, "privilege", &pg.publication, e.to_string()),
    }
}

async fn check_postgres_source(
    cfg: &Config,
    pg: &crate::config::PgSource,
    report: &mut CheckReport,
) {
    let conn = match ConnectionConfig::from_url(pg.url.expose()) {
        Ok(c) => c,
        Err(e) => {
            report.push(Level::Error, "source", pg.url.redacted(), e.to_string());
            return;
        }
    };
    let admin = match PgAdmin::connect(&conn).await {
        Ok(a) => a,
        Err(e) => {
            report.push(
                Level::Error,
                "source",
                pg.url.redacted(),
                format!("cannot connect: {e}"),
            );
            return;
        }
    };
    let subject = pg.url.redacted();
    match admin.wal_level().await {
        Ok(l) if l == "logical" => report.push(Level::Ok, "wal_level", &subject, "logical"),
        Ok(l) => report.push(
            Level::Error,
            "wal_level",
            &subject,
            format!("wal_level is {l}; logical replication needs `wal_level = logical` in postgresql.conf and a restart"),
        ),
        Err(e) => report.push(Level::Error, "wal_level", &subject, e.to_string()),
    }
    match admin.can_replicate().await {
        Ok(true) => report.push(
            Level::Ok,
            "privilege",
            &subject,
            format!("{} may replicate", conn.user),
        ),
        Ok(false) => report.push(
            Level::Error,
            "privilege",
            &subject,
            format!(
                "role {} lacks REPLICATION: ALTER ROLE {} WITH REPLICATION",
                conn.user, conn.user
            ),
        ),
        Err(e) => report.push(Level::Error, "privilege", &subject, e.to_string()),
    }
    check_slot(&admin, &pg.slot, pg.slot_mode, report).await;
    let tables = table_names(cfg);
    match admin.publication(&pg.publication).await {
        Ok(None) if pg.publication_mode == PublicationMode::Existing => report.push(
            Level::Error,
            "publication",
            &pg.publication,
            format!(
                "does not exist and publication_mode = \"existing\": CREATE PUBLICATION {} FOR TABLE {}",
                freshen_postgres::quote_ident(&pg.publication),
                tables.iter().map(TableName::quoted).collect::<Vec<_>>().join(", ")
            ),
        ),
        Ok(None) => report.push(Level::Ok, "publication", &pg.publication, "will be created for the watched tables"),
        Ok(Some(_)) => match admin.coverage(&pg.publication, &tables).await {
            Ok(Some(c)) if c.is_complete() => {
                report.push(Level::Ok, "publication", &pg.publication, "covers every watched table and operation")
            }
            Ok(Some(c)) => {
                let mut what = Vec::new();
                if !c.missing_tables.is_empty() {
                    what.push(format!(
                        "lacks {}: ALTER PUBLICATION {} ADD TABLE {}",
                        c.missing_tables.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                        freshen_postgres::quote_ident(&pg.publication),
                        c.missing_tables.iter().map(TableName::quoted).collect::<Vec<_>>().join(", ")
                    ));
                }
                if !c.missing_operations.is_empty() {
                    what.push(format!("does not publish {}", c.missing_operations.join(", ")));
                }
                report.push(Level::Error, "publication", &pg.publication, what.join("; "));
            }
            Ok(None) => {}
            Err(e) => report.push(Level::Error, "publication", &pg.publication, e.to_string()),
        },
        Err(e) => report.push(Level::Error, "publication", &pg.publication, e.to_string()),
    }
    check_publication_safety(&admin, pg, &tables, report).await;
    for view in &cfg.views {
        check_identity(&admin, view, report).await;
    }
    if cfg.changefeed.is_some() {
        check_changefeed_identity(&admin, &tables, report).await;
    }
}

/// Tables whose changefeed events can lack an unchanged large value: under a replica
/// identity other than FULL an UPDATE does not send a TOASTed column it left alone, and
/// the changefeed fills it from the row's last image only when it has one.
async fn check_changefeed_identity(
    admin: &PgAdmin,
    tables: &[TableName],
    report: &mut CheckReport,
) {
    let names: Vec<String> = tables.iter().map(ToString::to_string).collect();
    let rows = match admin.pool().get().await {
        Ok(c) => c
            .query(freshen_changefeed::TOASTABLE_COLUMNS_SQL, &[&names])
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => {
            report.push(Level::Error, "changefeed", "replica identity", e);
            return;
        }
    };
    let storage: Vec<freshen_changefeed::TableStorage> = rows
        .iter()
        .map(|r| freshen_changefeed::TableStorage {
            schema: r.get(0),
            table: r.get(1),
            identity: r.get(2),
            toastable: r.get(3),
        })
        .collect();
    let advice = freshen_changefeed::needs_full_identity(&storage);
    if advice.is_empty() {
        report.push(
            Level::Ok,
            "changefeed",
            "replica identity",
            "every captured table sends whole rows (or has no out-of-line columns)",
        );
    }
    for a in advice {
        report.push(
            Level::Warning,
            "changefeed",
            &a.table,
            format!(
                "an UPDATE that leaves {} alone does not send them: the changefeed fills them from the row's last image, and marks the event \"partial\" when it has none; to always send whole rows: {}",
                a.columns.join(", "),
                a.fix
            ),
        );
    }
}

async fn check_slot(admin: &PgAdmin, slot: &str, mode: SlotMode, report: &mut CheckReport) {
    match admin.slot(slot).await {
        Ok(None) => match mode {
            SlotMode::Existing => report.push(
                Level::Error,
                "slot",
                slot,
                "does not exist and slot_mode = \"existing\": create it, or use slot_mode = \"create\"",
            ),
            SlotMode::Temporary => report.push(Level::Ok, "slot", slot, "temporary: created per session"),
            SlotMode::Create => report.push(Level::Ok, "slot", slot, "will be created"),
        },
        Ok(Some(info)) if info.is_lost() => report.push(
            Level::Error,
            "slot",
            slot,
            "was invalidated by the server (wal_status = lost): drop it with `freshen drop`, run again, and let the reconcile sweep rebuild",
        ),
        Ok(Some(info)) => {
            let lag = info.lag_bytes.unwrap_or(0);
            if info.active {
                report.push(
                    Level::Warning,
                    "slot",
                    slot,
                    format!(
                        "is in use by process {} — another freshen may be running on it",
                        info.active_pid.map_or("?".into(), |p| p.to_string())
                    ),
                );
            } else if lag > LAG_WARNING_BYTES {
                report.push(
                    Level::Warning,
                    "slot",
                    slot,
                    format!(
                        "exists, is idle and retains {} MiB of WAL: start `freshen run`, or `freshen drop` it if the pipeline is abandoned",
                        lag >> 20
                    ),
                );
            } else {
                report.push(Level::Ok, "slot", slot, format!("exists, {lag} bytes behind"));
            }
        }
        Err(e) => report.push(Level::Error, "slot", slot, e.to_string()),
    }
}

async fn check_identity(admin: &PgAdmin, view: &View, report: &mut CheckReport) {
    for w in &view.watch {
        let table = TableName::new(&w.schema, &w.table);
        let cols: Vec<&str> = w.key.iter().map(String::as_str).collect();
        match admin.check_replica_identity(&table, &cols).await {
            Ok(c) if c.carries_old_scope => report.push(
                Level::Ok,
                "replica_identity",
                table.to_string(),
                format!(
                    "{} carries the old key of view {}",
                    c.identity.identity, view.name
                ),
            ),
            Ok(c) => report.push(
                Level::Warning,
                "replica_identity",
                table.to_string(),
                format!(
                    "view {}: {}",
                    view.name,
                    c.advice
                        .unwrap_or_else(|| "the old key is not carried".into())
                ),
            ),
            Err(e) => report.push(
                Level::Error,
                "replica_identity",
                table.to_string(),
                e.to_string(),
            ),
        }
    }
}

/// Prepares every statement of `view` on the target and checks its parameters and
/// columns against the view's key.
pub async fn check_statements(pool: &Pool, view: &View) -> Vec<Finding> {
    let mut out = Vec::new();
    let client = match pool.get().await {
        Ok(c) => c,
        Err(e) => {
            out.push(Finding {
                level: Level::Error,
                check: "target",
                subject: view.name.clone(),
                message: format!("cannot connect: {e}"),
            });
            return out;
        }
    };
    let arity = view.arity();
    let batch = view.rebuild_batch.is_some();
    for (i, sql) in view.rebuild.iter().enumerate() {
        let subject = format!("view {} rebuild[{i}]", view.name);
        let finding = match client.prepare(sql).await {
            Err(e) => Finding {
                level: Level::Error,
                check: "statement",
                subject,
                message: format!("does not prepare: {}", db_message(&e)),
            },
            Ok(stmt) => {
                let params = stmt.params();
                let non_array: Vec<String> = params
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| !matches!(t.kind(), Kind::Array(_)))
                    .map(|(n, t)| format!("${} is {}", n + 1, t.name()))
                    .collect();
                if params.len() != arity {
                    Finding {
                        level: Level::Error,
                        check: "statement",
                        subject,
                        message: format!(
                            "takes {} parameter(s) but the view's key has {arity} part(s) ({}): use $1..${arity}",
                            params.len(),
                            view.direct()
                                .next()
                                .map(|w| w.key.join(", "))
                                .unwrap_or_default()
                        ),
                    }
                } else if batch && !non_array.is_empty() {
                    Finding {
                        level: Level::Error,
                        check: "statement",
                        subject,
                        message: format!(
                            "with rebuild_batch each parameter is an array of key parts (e.g. `= ANY($1)`), but {}",
                            non_array.join(", ")
                        ),
                    }
                } else {
                    Finding {
                        level: Level::Ok,
                        check: "statement",
                        subject,
                        message: format!("prepares with {arity} parameter(s)"),
                    }
                }
            }
        };
        out.push(finding);
    }
    if let Some(rec) = &view.reconcile {
        let subject = format!("view {} reconcile.keys", view.name);
        out.push(match client.prepare(&rec.keys).await {
            Err(e) => Finding {
                level: Level::Error,
                check: "statement",
                subject,
                message: format!("does not prepare: {}", db_message(&e)),
            },
            Ok(stmt) if !stmt.params().is_empty() => Finding {
                level: Level::Error,
                check: "statement",
                subject,
                message: "must not take parameters".into(),
            },
            Ok(stmt) if stmt.columns().len() != arity => Finding {
                level: Level::Error,
                check: "statement",
                subject,
                message: format!(
                    "returns {} column(s) but the view's key has {arity} part(s)",
                    stmt.columns().len()
                ),
            },
            Ok(_) => Finding {
                level: Level::Ok,
                check: "statement",
                subject,
                message: format!("lists keys of {arity} part(s)"),
            },
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
