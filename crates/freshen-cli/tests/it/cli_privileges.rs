//! The least-privilege guide's blocks (docs/privileges.md), run: each ```sql block headed `-- least
//! privilege: NAME` is executed against a real server by an administrator, freshen runs
//! the tour's configuration (docs/views.md) (or the feature's configuration) as the role the
//! block makes — never a superuser — and works; then each privilege is left out in turn
//! (a privilege of a GRANT's list, a role attribute, the publication) and the run shows
//! the error its absence gives. A line of the guide that the test has no expected
//! error for fails the test, so the guide and this file move together.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use freshen_testenv::PgServer;
use support::*;

const GUIDE: &str = include_str!("../../../../docs/privileges.md");
/// The guide whose tour configuration the blocks are run with.
const VIEWS: &str = include_str!("../../../../docs/views.md");
/// The password the guide's `'…'` stands for.
const PASSWORD: &str = "least-privilege-pw";

/// The guide's least-privilege block `name`: its statements, one per line.
fn block(name: &str) -> Vec<String> {
    let head = format!("-- least privilege: {name}\n");
    let at = GUIDE
        .find(&head)
        .unwrap_or_else(|| panic!("docs/privileges.md has no block {head:?}"));
    let body = &GUIDE[at + head.len()..];
    let end = body.find("```").expect("the block ends");
    body[..end]
        .lines()
        .map(|l| l.split("-- ").next().unwrap_or("").trim().to_owned())
        .filter(|l| !l.is_empty())
        .map(|l| l.replace('…', PASSWORD))
        .collect()
}

/// The first ```toml block after `heading` in docs/views.md.
fn readme_toml(heading: &str) -> String {
    let at = VIEWS.find(heading).expect("the heading");
    let body = &VIEWS[at..];
    let start = body.find("```toml\n").expect("a TOML block") + "```toml\n".len();
    let end = body[start..].find("```").expect("its end");
    body[start..start + end].to_owned()
}

/// One privilege left out of a block: a description, and the block without it.
#[derive(Debug)]
struct Without {
    /// What was left out, e.g. `INSERT of GRANT INSERT ON public.device_totals`.
    what: String,
    lines: Vec<String>,
}

/// Every way to leave one privilege out of `lines`: each privilege of a GRANT's list,
/// a role's REPLICATION attribute, a CREATE PUBLICATION. (The role or user itself is
/// not left out: without it nothing logs in.)
fn withouts(lines: &[String]) -> Vec<Without> {
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let mut with = |what: String, replacement: Option<String>| {
            let mut l = lines.to_vec();
            match replacement {
                Some(r) => l[i] = r,
                None => {
                    l.remove(i);
                }
            }
            out.push(Without { what, lines: l });
        };
        if let Some(rest) = line.strip_prefix("GRANT ") {
            let (privs, on) = rest.split_once(" ON ").expect("GRANT … ON …");
            let privs: Vec<&str> = privs.split(", ").collect();
            for p in &privs {
                let others: Vec<&str> = privs.iter().filter(|q| *q != p).copied().collect();
                let replacement =
                    (!others.is_empty()).then(|| format!("GRANT {} ON {on}", others.join(", ")));
                with(format!("{p} of {line}"), replacement);
            }
        } else if line.starts_with("CREATE ROLE") && line.contains(" REPLICATION") {
            with(
                format!("REPLICATION of {line}"),
                Some(line.replace(" REPLICATION", "")),
            );
        } else if line.starts_with("CREATE PUBLICATION") {
            with(line.clone(), None);
        } else {
            assert!(
                line.starts_with("CREATE ROLE") || line.starts_with("CREATE USER"),
                "a guide line the test does not know how to leave out: {line}"
            );
        }
    }
    out
}

/// The error `what`'s absence must show, by the first entry of `expected` whose key is
/// in `what`; a line with no entry fails (the guide changed: say what it needs).
fn expected<'a>(expected: &[(&str, &'a str)], what: &str) -> &'a str {
    expected
        .iter()
        .find(|(k, _)| what.contains(k))
        .map(|(_, e)| *e)
        .unwrap_or_else(|| panic!("no expected error for leaving out {what:?}"))
}

/// Whether a run works yet.
type Check = std::pin::Pin<Box<dyn std::future::Future<Output = bool>>>;

/// Where a run is: the database as its administrator sees it, the run's HTTP listener
/// and its changefeed's.
#[derive(Clone)]
struct Ctx {
    admin_url: String,
    base: String,
    feed: String,
}

/// The runs of a block: with every privilege (no error expected), then without each.
fn runs<'e>(
    lines: &[String],
    expect: &[(&str, &'e str)],
) -> Vec<(String, Vec<String>, Option<&'e str>)> {
    let mut out = vec![("every privilege".to_owned(), lines.to_vec(), None)];
    for w in withouts(lines) {
        let e = expected(expect, &w.what);
        out.push((w.what, w.lines, Some(e)));
    }
    out
}

/// Notes in `wrong` a run that did not show what it should have.
fn judge(
    wrong: &mut Vec<String>,
    name: &str,
    what: &str,
    needle: Option<&str>,
    ok: bool,
    seen: &Seen,
) {
    match needle {
        None if !ok => wrong.push(format!("with {what}, freshen never worked:\n{}", seen.text)),
        Some(needle) if !seen.text.contains(needle) => wrong.push(format!(
            "without {what}: expected {needle:?} in what the run showed:\n{}",
            seen.text
        )),
        _ => eprintln!("{name}: {what}: shown"),
    }
}

/// What a run showed: its log, and its `/healthz` and `/status` while it ran.
struct Seen {
    text: String,
}

/// Runs `freshen run -c cfg` (logging to `run-{n}.log` in `dir`, with `env`) until
/// `done` holds (a success) or `needle` appears in its log, `/healthz` or `/status`, or
/// it exits; stops it and returns what it showed. `base` is its HTTP listener.
async fn run_until(
    dir: &Path,
    cfg: &Path,
    n: u32,
    env: &[(&str, &str)],
    base: &str,
    needle: Option<&str>,
    done: &mut dyn FnMut() -> Check,
) -> (bool, Seen) {
    let mut run = spawn_run_env(dir, cfg, n, env);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut text;
    let ok = loop {
        let mut now = log_of(dir, n);
        for path in ["/healthz", "/status"] {
            if let Ok((_, body)) = freshen_cli::status::get(base, path).await {
                now.push('\n');
                now.push_str(&body);
            }
        }
        text = now;
        if needle.is_some_and(|w| text.contains(w)) {
            break false;
        }
        if needle.is_none() && done().await {
            break true;
        }
        if run.try_wait().ok().flatten().is_some() || Instant::now() > deadline {
            text = format!("{text}\n{}", log_of(dir, n));
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = run.kill();
    let _ = run.wait();
    (ok, Seen { text })
}

/// A PostgreSQL database `run{n}` for one run: the tour's tables, then `lines` run by
/// the superuser (role and user lines first), making role `freshen`; the previous
/// run's database, slot and role are dropped first.
async fn pg_setup(pg: &PgServer, n: usize, lines: &[String]) {
    let admin = connect(&pg.url()).await;
    // One statement at a time (DROP DATABASE runs outside a transaction); a killed
    // run's walsender may hold its slot a moment longer.
    let clean = [
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'freshen'"
            .to_owned(),
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots".to_owned(),
        format!(
            "DROP DATABASE IF EXISTS run{} WITH (FORCE)",
            n.wrapping_sub(1)
        ),
        "DROP ROLE IF EXISTS freshen".to_owned(),
    ];
    for sql in &clean {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(e) = admin.batch_execute(sql).await {
            assert!(Instant::now() < deadline, "{sql}: {e:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    admin
        .batch_execute(&format!("CREATE DATABASE run{n}"))
        .await
        .unwrap();
    let c = connect(&pg.url_for(&format!("run{n}"))).await;
    c.batch_execute(
        "CREATE TABLE readings (id bigserial PRIMARY KEY, device text NOT NULL, value bigint NOT NULL,
                                updated_at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE TABLE device_totals (device text PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);
         INSERT INTO readings (device, value) VALUES ('d1', 5), ('d2', 7);",
    )
    .await
    .unwrap();
    let (roles, rest): (Vec<&String>, Vec<&String>) =
        lines.iter().partition(|l| l.starts_with("CREATE ROLE"));
    for l in roles.into_iter().chain(rest) {
        c.batch_execute(l)
            .await
            .unwrap_or_else(|e| panic!("{l}: {e}"));
    }
}

/// The URL of database `db` as role `freshen` (trusted over TCP by the test server).
fn pg_url_as_freshen(pg: &PgServer, db: &str) -> String {
    pg.url_for(db)
        .replacen("postgres://postgres@", "postgres://freshen@", 1)
}

/// One feature on PostgreSQL: `blocks` made (the last one's privileges left out in
/// turn), `config` (given its listeners and its directory) run as `freshen` with the
/// URL in `DATABASE_URL`, `done` a success.
async fn pg_feature<F>(
    blocks: &[&str],
    config: impl Fn(&Ctx, &Path) -> String,
    expect: &[(&str, &str)],
    done: F,
) where
    F: Fn(Ctx) -> Check,
{
    let pg = start_pg();
    let dir = tempfile::tempdir().unwrap();
    let (given, varied) = blocks.split_at(blocks.len() - 1);
    let base_lines: Vec<String> = given.iter().flat_map(|b| block(b)).collect();
    let varied = block(varied[0]);
    let mut wrong = Vec::new();
    for (n, (what, lines, needle)) in runs(&varied, expect).into_iter().enumerate() {
        let db = format!("run{n}");
        let all: Vec<String> = base_lines.iter().cloned().chain(lines).collect();
        pg_setup(&pg, n, &all).await;
        let ctx = Ctx {
            admin_url: pg.url_for(&db),
            base: format!("http://127.0.0.1:{}", free_port()),
            feed: format!("http://127.0.0.1:{}", free_port()),
        };
        let url = pg_url_as_freshen(&pg, &db);
        let run_dir = dir.path().join(&db);
        std::fs::create_dir(&run_dir).unwrap();
        let cfg = write_config(&run_dir, &config(&ctx, &run_dir));
        let mut check = || done(ctx.clone());
        let (ok, seen) = run_until(
            &run_dir,
            &cfg,
            n as u32,
            &[("DATABASE_URL", url.as_str())],
            &ctx.base,
            needle,
            &mut check,
        )
        .await;
        judge(&mut wrong, &blocks.join(" + "), &what, needle, ok, &seen);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

/// The tour's configuration from docs/views.md, on the run's listener.
fn tour(ctx: &Ctx, _: &Path) -> String {
    readme_toml("## Describe the derived table")
        .replace("http://", "")
        .replace("127.0.0.1:9187", ctx.base.trim_start_matches("http://"))
        .replace("coalesce = \"100ms\"", "coalesce = \"10ms\"")
}

/// Whether `device_totals` equals its truth, a row written once while freshen runs
/// included (a change it must capture).
fn tour_converged(ctx: Ctx) -> Check {
    Box::pin(async move {
        let c = connect(&ctx.admin_url).await;
        let _ = c
            .batch_execute(
                "INSERT INTO readings (device, value) SELECT 'live', 1 \
                 WHERE NOT EXISTS (SELECT FROM readings WHERE device = 'live')",
            )
            .await;
        let diff: i64 = c
            .query_one(
                "SELECT count(*) FROM ((SELECT device, total, n FROM device_totals EXCEPT \
                   SELECT device, sum(value)::bigint, count(*) FROM readings GROUP BY device) \
                 UNION ALL (SELECT device, sum(value)::bigint, count(*) FROM readings GROUP BY device \
                   EXCEPT SELECT device, total, n FROM device_totals)) d",
                &[],
            )
            .await
            .map(|r| r.get(0))
            .unwrap_or(1);
        let rows: i64 = c
            .query_one("SELECT count(*) FROM device_totals", &[])
            .await
            .map(|r| r.get(0))
            .unwrap_or(0);
        diff == 0 && rows > 0
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_need_select_on_what_they_read_and_what_they_write() {
    pg_feature(
        &["postgres source", "views"],
        tour,
        &[
            (
                "SELECT of GRANT SELECT ON public.readings",
                "permission denied for table readings",
            ),
            (
                "SELECT of GRANT SELECT ON public.device_totals",
                "permission denied for table device_totals",
            ),
            ("INSERT of", "permission denied for table device_totals"),
            ("DELETE of", "permission denied for table device_totals"),
        ],
        tour_converged,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_source_needs_replication_and_a_publication() {
    pg_feature(
        &["views", "postgres source"],
        tour,
        &[
            ("REPLICATION", "may not open replication connections: run ALTER ROLE \"freshen\" REPLICATION"),
            ("CREATE PUBLICATION", "cannot create publication \"freshen\": ERROR 42501: permission denied for database"),
        ],
        tour_converged,
    )
    .await;
}

/// A changefeed on `ctx.feed` in `dir`, and `extra`, after a source on `DATABASE_URL`.
fn with_changefeed(source: &str, ctx: &Ctx, dir: &Path, extra: &str) -> String {
    format!(
        r#"
{source}

[http]
listen = "{}"

[changefeed]
path = "{}"
{extra}

[changefeed.http]
listen = "{}"
"#,
        ctx.base.trim_start_matches("http://"),
        dir.join("feed.redb").display(),
        ctx.feed.trim_start_matches("http://"),
    )
}

/// Whether the changefeed at `ctx.feed` holds at least `n` events.
fn feed_holds(ctx: &Ctx, n: usize) -> Check {
    let feed = ctx.feed.clone();
    Box::pin(async move {
        match freshen_cli::status::get(&feed, "/changefeed?from_seq=0&limit=100").await {
            Ok((200, body)) => serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|d| d["events"].as_array().map(|e| e.len() >= n))
                .unwrap_or(false),
            _ => false,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_incremental_needs_select_and_its_cursor_table() {
    pg_feature(
        &["postgres-incremental"],
        |ctx, dir| {
            let source = "[source]\nkind = \"postgres-incremental\"\nurl = \"${DATABASE_URL}\"\ncursor = \"updated_at\"\npoll_interval = \"50ms\"\nlookback = \"0s\"\n\n[source.tables.\"public.readings\"]";
            with_changefeed(source, ctx, dir, "")
        },
        &[
            ("SELECT of", "permission denied for table readings"),
            ("CREATE of", "(grant CREATE on its schema, or create it)"),
        ],
        |ctx| feed_holds(&ctx, 2),
    )
    .await;
}

/// Snapshots, the changefeed's and a Kafka sink's: SELECT on the table, and CREATE on
/// the schema where the sink keeps its progress.
#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_need_select_and_a_place_for_a_sinks_progress() {
    let kafka = freshen_testenv::KafkaServer::start()
        .expect("a Kafka-protocol broker (run scripts/test-deps-brokers)");
    create_topics(&kafka.bootstrap(), &["rows"], 1).await;
    let brokers = kafka.bootstrap();
    pg_feature(
        &["postgres source", "snapshots"],
        |ctx, dir| {
            let source = format!(
                "[source]\nkind = \"postgres\"\nurl = \"${{DATABASE_URL}}\"\ntables = [\"public.readings\"]\n\n\
                 [[sinks]]\nkind = \"kafka\"\nbrokers = \"{brokers}\"\ntopic = \"rows\"\ntopic_mode = \"single\"\nsnapshot = \"initial\""
            );
            with_changefeed(&source, ctx, dir, "snapshot = \"initial\"")
        },
        &[
            ("SELECT of", "permission denied for table readings"),
            ("CREATE of", "(grant CREATE on its schema, or create it)"),
        ],
        |ctx| {
            Box::pin(async move {
                let done = |body: String, key: &str| {
                    serde_json::from_str::<serde_json::Value>(&body)
                        .ok()
                        .map(|d| d.pointer(key).cloned().unwrap_or_default() == "done")
                        .unwrap_or(false)
                };
                let feed = freshen_cli::status::get(&ctx.feed, "/changefeed/snapshot").await;
                let status = freshen_cli::status::get(&ctx.base, "/status").await;
                match (feed, status) {
                    (Ok((_, f)), Ok((_, s))) => {
                        done(f, "/snapshots/0/state") && done(s, "/sink_snapshots/0/tables/0/state")
                    }
                    _ => false,
                }
            })
        },
    )
    .await;
}

/// MariaDB's side: one feature's blocks made by root (the last one's privileges left
/// out in turn), `config` (given the user's URL and the run's listeners) run as
/// `freshen`, `done` a success.
#[cfg(feature = "mysql")]
mod mariadb {
    use super::*;
    use mysql_async::prelude::Queryable;

    async fn setup(db: &freshen_testenv::MariaDbServer, lines: &[String]) {
        let mut c = mysql_async::Conn::from_url(db.url("mysql")).await.unwrap();
        for sql in [
            "DROP USER IF EXISTS 'freshen'@'%'",
            "DROP DATABASE IF EXISTS app",
            "CREATE DATABASE app",
            "CREATE TABLE app.readings (id INT AUTO_INCREMENT PRIMARY KEY, device VARCHAR(20) NOT NULL,
               value INT NOT NULL, updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6))",
            "CREATE TABLE app.device_totals (device VARCHAR(20) PRIMARY KEY, total BIGINT NOT NULL, n BIGINT NOT NULL)",
            "INSERT INTO app.readings (device, value) VALUES ('d1', 5), ('d2', 7)",
        ] {
            c.query_drop(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        let (users, rest): (Vec<&String>, Vec<&String>) =
            lines.iter().partition(|l| l.starts_with("CREATE USER"));
        for l in users.into_iter().chain(rest) {
            match c.query_drop(l.as_str()).await {
                Ok(()) => {}
                // Without CREATE in the list, privileges on a table not made yet cannot
                // be granted at all: the run goes without the line.
                Err(mysql_async::Error::Server(e)) if e.code == 1146 => {}
                Err(e) => panic!("{l}: {e}"),
            }
        }
    }

    pub(super) async fn feature<F>(
        name: &str,
        config: impl Fn(&str, &Ctx, &Path) -> String,
        expect: &[(&str, &str)],
        done: F,
    ) where
        F: Fn(Ctx) -> Check,
    {
        let db = freshen_testenv::MariaDbServer::start().unwrap_or_else(|e| {
            panic!("MariaDB for this test (apt-get install mariadb-server): {e}")
        });
        let dir = tempfile::tempdir().unwrap();
        let lines = block(name);
        let mut wrong = Vec::new();
        for (n, (what, lines, needle)) in runs(&lines, expect).into_iter().enumerate() {
            setup(&db, &lines).await;
            let ctx = Ctx {
                admin_url: db.url("app"),
                base: format!("http://127.0.0.1:{}", free_port()),
                feed: format!("http://127.0.0.1:{}", free_port()),
            };
            let url = format!("mysql://freshen:{PASSWORD}@127.0.0.1:{}/app", db.port());
            let run_dir = dir.path().join(format!("run{n}"));
            std::fs::create_dir(&run_dir).unwrap();
            let cfg = write_config(&run_dir, &config(&url, &ctx, &run_dir));
            let mut check = || done(ctx.clone());
            let (ok, seen) =
                run_until(&run_dir, &cfg, n as u32, &[], &ctx.base, needle, &mut check).await;
            judge(&mut wrong, name, &what, needle, ok, &seen);
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
    }

    /// Block `name` made, `config` run as `freshen` until `done`; then `revoke` run by
    /// root, the derived table emptied, and a second run until `done` again.
    pub(super) async fn two_runs<F>(
        name: &str,
        config: impl Fn(&str, &Ctx, &Path) -> String,
        revoke: &str,
        done: F,
    ) where
        F: Fn(Ctx) -> Check,
    {
        let db = freshen_testenv::MariaDbServer::start().unwrap_or_else(|e| {
            panic!("MariaDB for this test (apt-get install mariadb-server): {e}")
        });
        let dir = tempfile::tempdir().unwrap();
        setup(&db, &block(name)).await;
        let url = format!("mysql://freshen:{PASSWORD}@127.0.0.1:{}/app", db.port());
        for n in 0..2 {
            if n == 1 {
                let mut c = mysql_async::Conn::from_url(db.url("mysql")).await.unwrap();
                c.query_drop(revoke).await.unwrap();
                c.query_drop("DELETE FROM app.device_totals").await.unwrap();
            }
            let ctx = Ctx {
                admin_url: db.url("app"),
                base: format!("http://127.0.0.1:{}", free_port()),
                feed: format!("http://127.0.0.1:{}", free_port()),
            };
            let cfg = write_config(dir.path(), &config(&url, &ctx, dir.path()));
            let mut check = || done(ctx.clone());
            let (ok, seen) = run_until(dir.path(), &cfg, n, &[], &ctx.base, None, &mut check).await;
            assert!(ok, "run {n} never worked:\n{}", seen.text);
        }
    }

    /// Whether `app.device_totals` equals its truth, a row written once while freshen
    /// runs included (a change it must capture).
    pub(super) fn converged(ctx: Ctx) -> Check {
        Box::pin(async move {
            let Ok(mut c) = mysql_async::Conn::from_url(ctx.admin_url.as_str()).await else {
                return false;
            };
            let _ = c
                .query_drop(
                    "INSERT INTO app.readings (device, value) SELECT 'live', 1 FROM DUAL \
                     WHERE NOT EXISTS (SELECT 1 FROM app.readings WHERE device = 'live')",
                )
                .await;
            let truth: Vec<(String, i64, i64)> = c
                .query("SELECT device, CAST(sum(value) AS SIGNED), count(*) FROM app.readings GROUP BY device ORDER BY device")
                .await
                .unwrap_or_default();
            let derived: Vec<(String, i64, i64)> = c
                .query("SELECT device, total, n FROM app.device_totals ORDER BY device")
                .await
                .unwrap_or_default();
            !derived.is_empty() && truth == derived
        })
    }
}

/// The binlog source and the tour's view, on MariaDB, as user `url`.
#[cfg(feature = "mysql")]
fn binlog_config(url: &str, ctx: &Ctx, _: &Path) -> String {
    format!(
        r#"
[source]
kind = "mysql"
url = "{url}"
name = "least"
position_interval_ms = 20

[http]
listen = "{}"

[[views]]
name = "device_totals"
watch = [{{ table = "app.readings", key = ["device"] }}]
rebuild = [
  "DELETE FROM app.device_totals WHERE device = $1",
  "INSERT INTO app.device_totals SELECT device, sum(value), count(*) FROM app.readings WHERE device = $1 GROUP BY device",
]
reconcile = {{ every = "1h", keys = "SELECT device FROM app.readings" }}
coalesce = "10ms"
"#,
        ctx.base.trim_start_matches("http://")
    )
}

/// A position table that is there already needs no CREATE: a first run makes it, the
/// grant is revoked, and a second run resumes from it.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_table_that_exists_needs_no_create() {
    mariadb::two_runs(
        "mysql source",
        binlog_config,
        "REVOKE CREATE ON app.freshen_positions FROM 'freshen'@'%'",
        mariadb::converged,
    )
    .await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binlog_source_needs_its_grants_and_a_position_table() {
    mariadb::feature(
        "mysql source",
        binlog_config,
        &[
            ("REPLICATION SLAVE", "the user lacks the REPLICATION SLAVE grant"),
            ("BINLOG MONITOR", "cannot read the binlog position (needs REPLICATION CLIENT or BINLOG MONITOR)"),
            ("SELECT of GRANT SELECT ON app.readings", "does not exist (or the user may not see it: GRANT SELECT ON app.readings)"),
            ("CREATE of GRANT CREATE, SELECT, INSERT, UPDATE ON app.freshen_positions", "CREATE command denied to user 'freshen'@'127.0.0.1' for table `app`.`freshen_positions`"),
            ("SELECT of GRANT CREATE, SELECT, INSERT, UPDATE ON app.freshen_positions", "SELECT command denied to user 'freshen'@'127.0.0.1' for table `app`.`freshen_positions`"),
            ("INSERT of GRANT CREATE, SELECT, INSERT, UPDATE ON app.freshen_positions", "INSERT command denied to user 'freshen'@'127.0.0.1' for table `app`.`freshen_positions`"),
            ("UPDATE of GRANT CREATE, SELECT, INSERT, UPDATE ON app.freshen_positions", "UPDATE command denied to user 'freshen'@'127.0.0.1' for table `app`.`freshen_positions`"),
            ("SELECT of GRANT SELECT, INSERT, DELETE ON app.device_totals", "SELECT command denied to user 'freshen'@'127.0.0.1' for column 'device' in table 'device_totals'"),
            ("INSERT of GRANT SELECT, INSERT, DELETE ON app.device_totals", "INSERT command denied to user 'freshen'@'127.0.0.1' for table `app`.`device_totals`"),
            ("DELETE of GRANT SELECT, INSERT, DELETE ON app.device_totals", "DELETE command denied to user 'freshen'@'127.0.0.1' for table `app`.`device_totals`"),
        ],
        mariadb::converged,
    )
    .await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_incremental_needs_select_and_its_cursor_table() {
    mariadb::feature(
        "mysql-incremental",
        |url, ctx, dir| {
            let source = format!(
                "[source]\nkind = \"mysql-incremental\"\nurl = \"{url}\"\ncursor = \"updated_at\"\npoll_interval = \"50ms\"\nlookback = \"0s\"\n\n[source.tables.\"app.readings\"]"
            );
            with_changefeed(&source, ctx, dir, "")
        },
        &[
            ("SELECT of GRANT SELECT ON app.readings", "table app.readings does not exist (or the user may not see it)"),
            ("CREATE of", "CREATE command denied to user 'freshen'@'127.0.0.1' for table `app`.`freshen_cursors`"),
            ("SELECT of GRANT CREATE", "SELECT command denied to user 'freshen'@'127.0.0.1' for table `app`.`freshen_cursors`"),
            ("INSERT of", "INSERT command denied to user 'freshen'@'127.0.0.1' for table `app`.`freshen_cursors`"),
            ("UPDATE of", "UPDATE command denied to user 'freshen'@'127.0.0.1' for table `app`.`freshen_cursors`"),
        ],
        |ctx| feed_holds(&ctx, 2),
    )
    .await;
}
