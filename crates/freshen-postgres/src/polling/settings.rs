//! `PgIncrementalSettings`: the `[source]` table with `kind = "postgres-incremental"`,
//! its offline validation, what `freshen check` finds, and how it starts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use freshen::plug::{Finding, Lease, Plan, SourcePlug, Started};
use freshen::poller::{OwnTable, PollSettings};
use freshen::{Backoff, BoxError, BoxFuture, SecretUrl};
use serde::{Deserialize, Deserializer};

use crate::capture::settings::{duration, secret_url, url_problems};
use crate::polling::source::{IncrementalConfig, PgIncrementalSource, PolledTable, capabilities};
use crate::polling::table;
use crate::pool::client;
use crate::{ConnectionConfig, TableName, connect_pool};

/// The cursor-incremental PostgreSQL source, as configured in a file. It needs only
/// SELECT on the polled tables (and somewhere to keep its cursors).
///
/// ```toml
/// [source]
/// kind = "postgres-incremental"
/// url = "${DATABASE_URL}"
/// cursor = "updated_at"          # every polled table's cursor column, unless set below
/// poll_interval = "1s"
/// page_size = 1000
/// lookback = "5s"                # see the crate docs: late commits and clock skew
/// name = "freshen"               # the cursor table's rows are keyed by it
/// store_table = "freshen_cursors"
/// # store_url = "…"              # where the cursor table lives (default: url)
///
/// [source.tables."public.events"]   # polled besides the views' tables; overrides
/// cursor = "id"
/// poll_interval = "200ms"
/// ```
///
/// `Debug` never shows the password.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgIncrementalSettings {
    /// The polled database's URL.
    #[serde(deserialize_with = "secret_url")]
    pub url: SecretUrl,
    /// The cursor column of every table without its own.
    #[serde(default)]
    pub cursor: Option<String>,
    /// Time between polls of a table once caught up (default `1s`).
    #[serde(default = "default_poll_interval", deserialize_with = "duration")]
    pub poll_interval: Duration,
    /// Rows per page (default 1000).
    #[serde(default = "default_page_size")]
    pub page_size: usize,
    /// How long a read position is held and its range read again before it may be
    /// stored (default `5s`).
    #[serde(default = "default_lookback", deserialize_with = "duration")]
    pub lookback: Duration,
    /// Keys this source's rows in the cursor table (default `freshen`).
    #[serde(default = "default_name")]
    pub name: String,
    /// The cursor table, `table` or `schema.table` (default `freshen_cursors`).
    #[serde(default = "default_store_table")]
    pub store_table: String,
    /// The database of the cursor table (default: `url`'s).
    #[serde(default, deserialize_with = "optional_secret_url")]
    pub store_url: Option<SecretUrl>,
    /// Tables polled besides the views' (for the changefeed and sinks), and per-table
    /// settings.
    #[serde(default)]
    pub tables: BTreeMap<String, TableSettings>,
}

/// `[source.tables."schema.table"]`: one table's own settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSettings {
    /// Its cursor column.
    #[serde(default)]
    pub cursor: Option<String>,
    /// Its poll interval.
    #[serde(default, deserialize_with = "optional_duration")]
    pub poll_interval: Option<Duration>,
    /// Its page size.
    #[serde(default)]
    pub page_size: Option<usize>,
}

fn default_poll_interval() -> Duration {
    Duration::from_secs(1)
}

fn default_page_size() -> usize {
    1000
}

fn default_lookback() -> Duration {
    Duration::from_secs(5)
}

fn default_name() -> String {
    "freshen".into()
}

fn default_store_table() -> String {
    "freshen_cursors".into()
}

fn optional_secret_url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SecretUrl>, D::Error> {
    secret_url(d).map(Some)
}

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

impl PgIncrementalSettings {
    /// The tables this configuration names itself, parsed.
    pub fn table_names(&self) -> Vec<TableName> {
        self.poll_settings().own_tables()
    }

    /// What to poll for `plan`: its tables and this configuration's own, each with its
    /// settings; a table without a cursor column is an error naming it.
    pub fn polled(&self, plan: &Plan) -> Result<Vec<PolledTable>, String> {
        let planned = plan
            .tables
            .iter()
            .map(|(s, t)| TableName::new(s, t))
            .collect();
        self.poll_settings().polled(planned)
    }

    /// The settings every polling source shares, for the core to decide on.
    fn poll_settings(&self) -> PollSettings<'_, TableName> {
        let form = "(\"schema.table\" or \"table\")";
        PollSettings {
            cursor: self.cursor.as_deref(),
            poll_interval: self.poll_interval,
            page_size: self.page_size,
            lookback: self.lookback,
            name: &self.name,
            name_max: 63,
            store_table: self
                .store_table
                .parse::<TableName>()
                .err()
                .map(|e| format!("{e} {form}")),
            tables: self
                .tables
                .iter()
                .map(|(name, t)| OwnTable {
                    name,
                    table: name.parse().map_err(|e| format!("{e} {form}")),
                    cursor: t.cursor.as_deref(),
                    poll_interval: t.poll_interval,
                    page_size: t.page_size,
                })
                .collect(),
            form: "schema.table",
        }
    }

    fn connection(&self) -> Result<ConnectionConfig, crate::PgError> {
        ConnectionConfig::from_url(self.url.expose())
    }

    fn config(&self, plan: &Plan) -> Result<IncrementalConfig, BoxError> {
        let store_table: TableName = self.store_table.parse()?;
        Ok(IncrementalConfig {
            connection: self.connection()?,
            store_connection: match &self.store_url {
                Some(u) => Some(ConnectionConfig::from_url(u.expose())?),
                None => None,
            },
            store_table,
            name: self.name.clone(),
            lookback: self.lookback,
            tables: self.polled(plan)?,
            queue_batches: 8,
            retry: Backoff::default(),
        })
    }
}

impl SourcePlug for PgIncrementalSettings {
    fn kind(&self) -> &'static str {
        "postgres-incremental"
    }

    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for problem in url_problems(self.url.expose()) {
            p.push(format!("url: {problem}"));
        }
        if let Some(u) = &self.store_url {
            for problem in url_problems(u.expose()) {
                p.push(format!("store_url: {problem}"));
            }
        }
        p.extend(self.poll_settings().problems());
        p
    }

    fn tables(&self) -> Vec<(String, String)> {
        self.table_names()
            .into_iter()
            .map(|t| (t.schema, t.name))
            .collect()
    }

    fn database_url(&self) -> Option<&str> {
        Some(self.url.expose())
    }

    fn naming(&self) -> freshen::plug::Naming {
        crate::naming()
    }

    fn capabilities(&self) -> freshen::Capabilities {
        capabilities()
    }

    fn check<'a>(&'a self, plan: &'a Plan) -> BoxFuture<'a, Vec<Finding>> {
        Box::pin(check(self, plan))
    }

    /// One active process per source name: the advisory lock lives in the cursor
    /// store's database (writable, unlike a read replica that may be the polled one),
    /// keyed apart from replication slots' (a slot name holds no `:`).
    fn lead(&self) -> BoxFuture<'_, Result<Lease, BoxError>> {
        Box::pin(async move {
            let url = self.store_url.as_ref().unwrap_or(&self.url);
            let connection = ConnectionConfig::from_url(url.expose())?;
            let key = format!("postgres-incremental:{}", self.name);
            Ok(
                match crate::Leadership::try_acquire(&connection, &key).await? {
                    crate::Attempt::Leader(mut l) => {
                        Lease::Granted(Box::pin(async move { BoxError::from(l.lost().await) }))
                    }
                    crate::Attempt::Held(holder) => Lease::Held(match holder {
                        Some(h) => h.to_string(),
                        None => "another process".to_owned(),
                    }),
                },
            )
        })
    }

    fn start<'a>(&'a self, plan: &'a Plan) -> BoxFuture<'a, Result<Started, BoxError>> {
        Box::pin(async move {
            let source = PgIncrementalSource::start(self.config(plan)?).await?;
            let probe = Arc::new(source.handle());
            Ok(Started {
                source: Box::new(source),
                probe,
            })
        })
    }
}

/// What `check` finds: each polled table readable, with its cursor column (indexed,
/// NOT NULL) and primary key; the cursor table writable or creatable; the lookback.
async fn check(s: &PgIncrementalSettings, plan: &Plan) -> Vec<Finding> {
    let subject = s.url.redacted();
    let polled = match s.polled(plan) {
        Ok(p) => p,
        Err(e) => return vec![Finding::error("cursor", subject, e)],
    };
    let pool = match s.connection().and_then(|c| connect_pool(&c, 1)) {
        Ok(p) => p,
        Err(e) => return vec![Finding::error("source", subject, e.to_string())],
    };
    let c = match client(&pool).await {
        Ok(c) => c,
        Err(e) => {
            return vec![Finding::error(
                "source",
                subject,
                format!("cannot connect: {e}"),
            )];
        }
    };
    let mut out = vec![Finding::ok(
        "source",
        &subject,
        "connected (an incremental source needs only SELECT on its tables)",
    )];
    for t in &polled {
        let name = t.table.to_string();
        let readable = c
            .query_one(
                "SELECT has_table_privilege($1::text::regclass, 'SELECT')",
                &[&t.table.quoted()],
            )
            .await;
        match readable {
            Ok(r) if r.get::<_, bool>(0) => {}
            Ok(_) => {
                out.push(Finding::error(
                    "privilege",
                    &name,
                    format!(
                        "cannot SELECT from {name}: GRANT SELECT ON {} TO the source's user",
                        t.table.quoted()
                    ),
                ));
                continue;
            }
            Err(e) => {
                out.push(Finding::error("table", &name, crate::error::db_message(&e)));
                continue;
            }
        }
        let d = match table::describe(&c, &t.table, &t.cursor).await {
            Ok(d) => d,
            Err(e) => {
                out.push(Finding::error("cursor", &name, e.to_string()));
                continue;
            }
        };
        let by = d
            .position
            .iter()
            .map(|(c, _)| c.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        out.push(Finding::ok(
            "cursor",
            &name,
            format!("pages by ({by}) of type {}", d.position[0].1),
        ));
        if d.cursor_nullable {
            out.push(Finding::warning(
                "cursor",
                &name,
                format!(
                    "{} may be NULL: rows where it is NULL are never read (make it NOT NULL)",
                    t.cursor
                ),
            ));
        }
        if !d.cursor_indexed {
            out.push(Finding::warning(
                "cursor_index",
                &name,
                format!(
                    "no index starts with {}: every poll scans the table (CREATE INDEX ON {} ({}))",
                    t.cursor,
                    t.table.quoted(),
                    crate::quote_ident(&t.cursor)
                ),
            ));
        }
    }
    out.push(store_finding(s).await);
    if s.lookback.is_zero() {
        out.push(Finding::warning(
            "lookback",
            &subject,
            "lookback = \"0s\": a row whose cursor value was taken before its transaction's first write (updated_at = now() early in a longer transaction), or by a writer whose clock lags, can be missed; set lookback to cover both",
        ));
    }
    out
}

/// Whether the cursor table can be written (or created).
async fn store_finding(s: &PgIncrementalSettings) -> Finding {
    let Ok(table) = s.store_table.parse::<TableName>() else {
        return Finding::error("cursor_store", &s.store_table, "not a table name");
    };
    let name = table.to_string();
    let url = s.store_url.as_ref().unwrap_or(&s.url);
    let pool = match ConnectionConfig::from_url(url.expose()).and_then(|c| connect_pool(&c, 1)) {
        Ok(p) => p,
        Err(e) => return Finding::error("cursor_store", name, e.to_string()),
    };
    let c = match client(&pool).await {
        Ok(c) => c,
        Err(e) => return Finding::error("cursor_store", name, format!("cannot connect: {e}")),
    };
    let r = c
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL, \
                    COALESCE(has_table_privilege(to_regclass($1), 'SELECT, INSERT, UPDATE'), false), \
                    COALESCE(has_schema_privilege($2::text, 'CREATE'), false)",
            &[&table.quoted(), &table.schema],
        )
        .await;
    match r {
        Err(e) => Finding::error("cursor_store", name, crate::error::db_message(&e)),
        Ok(r) => match (
            r.get::<_, bool>(0),
            r.get::<_, bool>(1),
            r.get::<_, bool>(2),
        ) {
            (true, true, _) => Finding::ok("cursor_store", name, "cursors are stored here"),
            (true, false, _) => Finding::error(
                "cursor_store",
                &name,
                format!(
                    "cannot write {name}: GRANT SELECT, INSERT, UPDATE ON {} to the source's user",
                    table.quoted()
                ),
            ),
            (false, _, true) => Finding::ok(
                "cursor_store",
                name,
                "will be created at the first run to store the cursors",
            ),
            (false, _, false) => Finding::error(
                "cursor_store",
                &name,
                format!(
                    "{name} does not exist and cannot be created (no CREATE on schema {}): create it, grant CREATE, or set store_table/store_url",
                    table.schema
                ),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PgIncrementalSettings {
        PgIncrementalSettings {
            url: SecretUrl::new("postgres://app:hunter2@db/app"),
            cursor: None,
            poll_interval: default_poll_interval(),
            page_size: default_page_size(),
            lookback: default_lookback(),
            name: default_name(),
            store_table: default_store_table(),
            store_url: None,
            tables: BTreeMap::new(),
        }
    }

    #[test]
    fn problems_name_their_field_and_never_the_password() {
        let mut s = settings();
        s.page_size = 0;
        s.poll_interval = Duration::ZERO;
        s.store_table = "a.b.c".into();
        s.tables.insert(
            "app.events".into(),
            TableSettings {
                page_size: Some(100_001),
                ..TableSettings::default()
            },
        );
        let p = s.problems();
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p[0].starts_with("poll_interval: "));
        assert!(p[1].starts_with("page_size: "));
        assert!(p[2].starts_with("store_table: "));
        assert!(p[3].starts_with("tables.app.events.page_size: "));
        assert!(p.iter().all(|l| !l.contains("hunter2")));
        assert!(!format!("{s:?}").contains("hunter2"));
    }

    #[test]
    fn every_polled_table_needs_a_cursor_and_tables_override_the_defaults() {
        let mut s = settings();
        let plan = Plan {
            tables: vec![("app".into(), "orders".into())],
            ..Plan::default()
        };
        s.tables.insert(
            "app.events".into(),
            TableSettings {
                cursor: Some("id".into()),
                page_size: Some(10),
                ..TableSettings::default()
            },
        );
        let e = s.polled(&plan).unwrap_err();
        assert!(e.contains("app.orders") && !e.contains("app.events"), "{e}");
        s.cursor = Some("updated_at".into());
        let p = s.polled(&plan).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].cursor.as_str(), p[0].page_size), ("updated_at", 1000));
        assert_eq!((p[1].cursor.as_str(), p[1].page_size), ("id", 10));
        assert_eq!(p[1].poll_interval, Duration::from_secs(1));
    }
}
