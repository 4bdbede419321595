//! `freshen check`: the file, then the database — everything a configuration needs to
//! work, reported at once.

use freshen::plug::{Finding, Level};
use serde::Serialize;
use serde::ser::SerializeStruct;

use crate::config::{self, Config};

/// Everything `check` found.
#[derive(Debug, Clone, Default)]
pub(crate) struct CheckReport {
    /// True when there is no error.
    pub ok: bool,
    /// The findings, in the order they were made.
    pub findings: Vec<Finding>,
}

/// `{"ok": …, "findings": [{"level", "check", "subject", "message"}]}` — the form
/// `check --json` prints.
impl Serialize for CheckReport {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Row<'a> {
            level: String,
            check: &'a str,
            subject: &'a str,
            message: &'a str,
        }
        let rows: Vec<Row<'_>> = self
            .findings
            .iter()
            .map(|f| Row {
                level: f.level.to_string(),
                check: f.check,
                subject: &f.subject,
                message: &f.message,
            })
            .collect();
        let mut st = s.serialize_struct("CheckReport", 2)?;
        st.serialize_field("ok", &self.ok)?;
        st.serialize_field("findings", &rows)?;
        st.end()
    }
}

impl CheckReport {
    fn push(
        &mut self,
        level: Level,
        check: &'static str,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.findings
            .push(Finding::new(level, check, subject, message));
    }

    /// How many findings are warnings (`--deny-warnings` fails on any).
    pub(crate) fn warnings(&self) -> usize {
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
    pub(crate) fn render(&self) -> String {
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
pub(crate) async fn check(path: &std::path::Path, offline: bool) -> CheckReport {
    let mut report = CheckReport::default();
    let loaded = if offline {
        config::load_offline(path, crate::kinds::builtin())
    } else {
        config::load(path, crate::kinds::builtin())
    };
    let cfg = match loaded {
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
    for (line, name, used) in &cfg.unset {
        let place = match line {
            Some(n) => format!("{}:{n}", path.display()),
            None => path.display().to_string(),
        };
        report.push(
            Level::Warning,
            "config",
            place,
            format!("environment variable `{name}` is not set here (used by `{used}`): its value was not checked, and `run` needs it"),
        );
    }
    let at = |line: Option<usize>| match line {
        Some(n) => format!("{}:{n}", path.display()),
        None => path.display().to_string(),
    };
    for u in cfg.unmatched_redactions() {
        report.push(Level::Warning, "redact", at(u.line), u.message);
    }
    // What each view relies on that the source cannot give: known without I/O.
    let caps = cfg.source.capabilities();
    for view in &cfg.views {
        let reliance = freshen::plug::Reliance {
            view: &view.name,
            sweep: view.reconcile.as_ref().map(|r| r.every),
        };
        report
            .findings
            .extend(freshen::plug::gaps(cfg.source.kind(), &caps, &reliance));
    }
    if !offline {
        check_database(&cfg, &mut report).await;
        for u in redacted_columns(&cfg).await {
            report.push(Level::Warning, "redact", at(u.line), u.message);
        }
    }
    report.finish()
}

/// `[[redact]]` rules naming a column their tables do not have, as the source's catalog
/// says (a PostgreSQL source's, whatever the role's column privileges); a source that
/// cannot tell, or a table it cannot read, is left to the source's own findings.
async fn redacted_columns(cfg: &Config) -> Vec<crate::redact_coverage::Unmatched> {
    if cfg.redact.is_empty() {
        return Vec::new();
    }
    let captured = cfg.watched_tables();
    let Some(columns) = cfg.source.columns(&captured).await else {
        return Vec::new();
    };
    let columns: std::collections::BTreeMap<_, _> = columns.into_iter().collect();
    crate::redact_coverage::unmatched_columns(
        cfg.redact.rules(),
        &cfg.redact_lines,
        &captured,
        |s, t| {
            columns
                .get(&(s.to_owned(), t.to_owned()))
                .filter(|c| !c.is_empty())
                .cloned()
        },
    )
}

async fn check_database(cfg: &Config, report: &mut CheckReport) {
    // Views rebuilt by `query` get their missing entries inferred first: the source's
    // findings (publication, replica identity) then cover the inferred tables too.
    let target = if cfg.views.is_empty() {
        None
    } else {
        match cfg.target.connect(cfg.source.database_url()).await {
            Ok(t) => Some(t),
            Err(e) => {
                report.push(
                    Level::Error,
                    "target",
                    cfg.target.url.redacted(),
                    freshen::redact_text(&format!("{e:#}")),
                );
                None
            }
        }
    };
    let mut refused = Vec::new();
    let completed = match &target {
        Some(t) if crate::infer::wanted(cfg) => {
            let done = crate::infer::complete(cfg, &**t).await;
            let naming = cfg.source.naming();
            for (view, inferred) in &done.inferred {
                report.push(
                    Level::Ok,
                    "infer",
                    format!("view {view}"),
                    format!(
                        "watches what its query reads; to pin these entries, paste into the view:\n{}",
                        crate::infer::toml(inferred, &naming)
                    ),
                );
                report.findings.extend(inferred.advice.iter().cloned());
            }
            for (view, problems) in &done.refused {
                // The subject names the view; each sentence does too, for `run`'s error.
                let named = format!("view `{view}`: ");
                for p in problems {
                    let p = p.strip_prefix(&named).unwrap_or(p);
                    report.push(Level::Error, "infer", format!("view {view}"), p);
                }
                refused.push(view.clone());
            }
            Some(done.config)
        }
        _ => None,
    };
    let cfg = completed.as_ref().unwrap_or(cfg);
    let plan = cfg.plan();
    report.findings.extend(cfg.source.check(&plan).await);
    let Some(target) = target else { return };
    for view in cfg.views.iter().filter(|v| !refused.contains(&v.name)) {
        match target.view(&view.spec(Some(1))) {
            Ok(on) => report.findings.extend(on.check().await),
            Err(e) => report.push(
                Level::Error,
                "target",
                cfg.target.url.redacted(),
                freshen::redact_text(&format!("{e:#}")),
            ),
        }
    }
}
