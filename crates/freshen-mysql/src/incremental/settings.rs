//! `MySqlIncrementalSettings`: the `[source]` table with `kind = "mysql-incremental"`,
//! its offline validation, what `freshen check` finds, and how it starts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use freshen::plug::{Finding, Lease, Plan, SourcePlug, Started};
use freshen::poller::{OwnTable, PollSettings};
use freshen::{Backoff, BoxError, BoxFuture, SecretUrl};
use mysql_async::prelude::Queryable;
use serde::{Deserialize, Deserializer};

use crate::incremental::source::{
    IncrementalConfig, MySqlIncrementalSource, PolledTable, capabilities,
};
use crate::incremental::table::{self, TableName};

/// The cursor-incremental MySQL/MariaDB source, as configured in a file. It needs only
/// SELECT on the polled tables (and somewhere to keep its cursors).
///
/// ```toml
/// [source]
/// kind = "mysql-incremental"
/// url = "mysql://reader:${PASSWORD}@replica:3306/app"
/// cursor = "updated_at"          # every polled table's cursor column, unless set below
/// poll_interval = "1s"
/// page_size = 1000
/// lookback = "30s"               # the only cover for late commits: see the crate docs
/// name = "freshen"               # the cursor table's rows are keyed by it
/// store_table = "freshen_cursors"
/// # store_url = "mysql://…/app"  # where the cursor table lives (default: url)
///
/// [source.tables."app.events"]   # polled besides the views' tables; overrides
/// cursor = "id"
/// ```
///
/// `Debug` never shows the password.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MySqlIncrementalSettings {
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
    /// stored (default `30s`): a row committed late with an earlier cursor value is
    /// found only if its transaction commits within it.
    #[serde(default = "default_lookback", deserialize_with = "duration")]
    pub lookback: Duration,
    /// Keys this source's rows in the cursor table (default `freshen`).
    #[serde(default = "default_name")]
    pub name: String,
    /// The cursor table, `table` (in the URL's database) or `database.table` (default
    /// `freshen_cursors`).
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

/// `[source.tables."database.table"]`: one table's own settings.
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
    Duration::from_secs(30)
}

fn default_name() -> String {
    "freshen".into()
}

fn default_store_table() -> String {
    "freshen_cursors".into()
}

fn secret_url<'de, D: Deserializer<'de>>(d: D) -> Result<SecretUrl, D::Error> {
    String::deserialize(d).map(SecretUrl::new)
}

fn optional_secret_url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SecretUrl>, D::Error> {
    secret_url(d).map(Some)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s)
        .map_err(|e| serde::de::Error::custom(format!("{s:?} is not a duration ({e})")))
}

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

impl MySqlIncrementalSettings {
    /// The URL's database (where an unqualified table name lives).
    fn database(&self) -> Option<String> {
        super::table::url_database(self.url.expose())
    }

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
        let db = self.database();
        PollSettings {
            cursor: self.cursor.as_deref(),
            poll_interval: self.poll_interval,
            page_size: self.page_size,
            lookback: self.lookback,
            name: &self.name,
            name_max: 64,
            store_table: self.store_table_name().err(),
            tables: self
                .tables
                .iter()
                .map(|(name, t)| OwnTable {
                    name,
                    table: TableName::parse(name, db.as_deref()),
                    cursor: t.cursor.as_deref(),
                    poll_interval: t.poll_interval,
                    page_size: t.page_size,
                })
                .collect(),
            form: "database.table",
        }
    }

    fn store_table_name(&self) -> Result<TableName, String> {
        let url = self.store_url.as_ref().unwrap_or(&self.url);
        let db = mysql_async::Opts::from_url(url.expose())
            .ok()
            .and_then(|o| o.db_name().map(str::to_owned));
        TableName::parse(&self.store_table, db.as_deref())
    }

    /// The source's configuration for `plan`.
    pub fn config(&self, plan: &Plan) -> Result<IncrementalConfig, BoxError> {
        Ok(IncrementalConfig {
            connection: self.url.expose().to_owned(),
            store_connection: self.store_url.as_ref().map(|u| u.expose().to_owned()),
            store_table: self.store_table_name()?,
            name: self.name.clone(),
            lookback: self.lookback,
            tables: self.polled(plan)?,
            queue_batches: 8,
            retry: Backoff::default(),
        })
    }
}

impl SourcePlug for MySqlIncrementalSettings {
    fn kind(&self) -> &'static str {
        "mysql-incremental"
    }

    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for problem in crate::url_problems(self.url.expose()) {
            p.push(format!("url: {problem}"));
        }
        if let Some(u) = &self.store_url {
            for problem in crate::url_problems(u.expose()) {
                p.push(format!("store_url: {problem}"));
            }
        }
        p.extend(self.poll_settings().problems());
        p
    }

    fn tables(&self) -> Vec<(String, String)> {
        self.table_names()
            .into_iter()
            .map(|t| (t.database, t.table))
            .collect()
    }

    fn database_url(&self) -> Option<&str> {
        Some(self.url.expose())
    }

    fn naming(&self) -> freshen::plug::Naming {
        super::table::url_naming(self.url.expose())
    }

    fn capabilities(&self) -> freshen::Capabilities {
        capabilities()
    }

    fn check<'a>(&'a self, plan: &'a Plan) -> BoxFuture<'a, Vec<Finding>> {
        Box::pin(check(self, plan))
    }

    /// One active process per source name: a named lock (`GET_LOCK`) held by a session
    /// of the cursor store's database (writable, unlike a read replica that may be the
    /// polled one); the server frees it when that session ends, a SIGKILL included.
    fn lead(&self) -> BoxFuture<'_, Result<Lease, BoxError>> {
        Box::pin(async move {
            let url = self.store_url.as_ref().unwrap_or(&self.url);
            // Keyed apart from a binlog source of the same name.
            let key = format!("mysql-incremental:{}", self.name);
            Ok(
                match crate::Leadership::try_acquire(url.expose(), &key).await? {
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
            let source = MySqlIncrementalSource::start(self.config(plan)?).await?;
            let probe = Arc::new(source.handle());
            Ok(Started {
                source: Box::new(source),
                probe,
            })
        })
    }
}

/// What `check` finds: each polled table readable, with its cursor column (indexed,
/// NOT NULL) and primary key; the cursor table writable or creatable; the lookback —
/// the only cover for late commits here, so it is always reported.
async fn check(s: &MySqlIncrementalSettings, plan: &Plan) -> Vec<Finding> {
    let subject = s.url.redacted();
    let polled = match s.polled(plan) {
        Ok(p) => p,
        Err(e) => return vec![Finding::error("cursor", subject, e)],
    };
    let pool = match crate::connect_pool(s.url.expose(), 1) {
        Ok(p) => p,
        Err(e) => return vec![Finding::error("source", subject, e.to_string())],
    };
    let mut c = match pool.get_conn().await {
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
        // A probe SELECT says what the grants allow, whatever granted them.
        let probe: Result<Vec<u8>, _> = c
            .query(format!("SELECT 1 FROM {} LIMIT 0", t.table.quoted()))
            .await;
        if let Err(e) = probe {
            let e = crate::MySqlError::driver(format!("cannot SELECT from {name}"), e);
            out.push(Finding::error(
                if matches!(e.code(), Some(1142 | 1044)) {
                    "privilege"
                } else {
                    "table"
                },
                &name,
                match e.code() {
                    Some(1142 | 1044) => format!(
                        "cannot SELECT from {name}: GRANT SELECT ON {} TO the source's user",
                        t.table.quoted()
                    ),
                    _ => e.to_string(),
                },
            ));
            continue;
        }
        let d = match table::describe(&mut c, &t.table, &t.cursor).await {
            Ok(d) => d,
            Err(e) => {
                out.push(Finding::error("cursor", &name, e.to_string()));
                continue;
            }
        };
        out.push(Finding::ok(
            "cursor",
            &name,
            format!("pages by ({})", d.position_columns().join(", ")),
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
                    "no index starts with {}: every poll scans the table (CREATE INDEX … ON {} ({}))",
                    t.cursor,
                    t.table.quoted(),
                    table::quote(&t.cursor)
                ),
            ));
        }
    }
    out.push(store_finding(s).await);
    let lookback = humantime::format_duration(s.lookback);
    out.push(Finding::warning(
        "lookback",
        &subject,
        if s.lookback.is_zero() {
            "lookback = \"0s\": MySQL reports no transaction horizon, so a row committed after a poll read past its cursor value (an AUTO_INCREMENT id or updated_at taken early in a transaction that commits later) is missed; set lookback above your longest write transaction".to_owned()
        } else {
            format!(
                "late commits are found within lookback = \"{lookback}\" only (MySQL reports no transaction horizon): a write transaction that commits more than {lookback} after a poll read past its cursor value loses its row until the row changes again or a reconcile sweep"
            )
        },
    ));
    out
}

/// Whether the cursor table can be written (or created).
async fn store_finding(s: &MySqlIncrementalSettings) -> Finding {
    let table = match s.store_table_name() {
        Ok(t) => t,
        Err(e) => return Finding::error("cursor_store", &s.store_table, e),
    };
    let name = table.to_string();
    let url = s.store_url.as_ref().unwrap_or(&s.url);
    let pool = match crate::connect_pool(url.expose(), 1) {
        Ok(p) => p,
        Err(e) => return Finding::error("cursor_store", name, e.to_string()),
    };
    let mut c = match pool.get_conn().await {
        Ok(c) => c,
        Err(e) => return Finding::error("cursor_store", name, format!("cannot connect: {e}")),
    };
    let exists: Result<Option<u8>, _> = c
        .exec_first(
            "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (&table.database, &table.table),
        )
        .await;
    match exists {
        Err(e) => Finding::error("cursor_store", name, e.to_string()),
        Ok(Some(_)) => Finding::ok("cursor_store", name, "cursors are stored here"),
        Ok(None) => Finding::ok(
            "cursor_store",
            name,
            "will be created at the first run to store the cursors (needs CREATE on its database)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> MySqlIncrementalSettings {
        MySqlIncrementalSettings {
            url: SecretUrl::new("mysql://app:hunter2@db:3306/app"),
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
    fn every_polled_table_needs_a_cursor_and_unqualified_names_are_the_urls_database() {
        let mut s = settings();
        let plan = Plan {
            tables: vec![("app".into(), "orders".into())],
            ..Plan::default()
        };
        s.tables.insert(
            "events".into(),
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
        assert_eq!(p[1].table, TableName::new("app", "events"));
        assert_eq!((p[1].cursor.as_str(), p[1].page_size), ("id", 10));
        assert_eq!(
            s.store_table_name().unwrap(),
            TableName::new("app", "freshen_cursors")
        );
        assert!(capabilities().lookback_only);
    }
}
