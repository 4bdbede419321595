//! The first minutes: the README's quick start run verbatim against a real PostgreSQL
//! (`init --create`, `check`, `run`: a complete, fresh table from a plain SELECT), and a
//! materialized view imported (`init --from-matview`), built, and swapped for a view over
//! the fresh table while readers keep reading.

use crate::support::*;

use std::process::{Command, Stdio};
use std::time::Duration;

use freshen_testenv::refresher::eventually;
use tokio_postgres::Client;

/// At the identity a table has by default: a DELETE carries only `id`.
const ORDERS: &str = "
CREATE TABLE orders (id int PRIMARY KEY, region text NOT NULL, amount int NOT NULL);
INSERT INTO orders SELECT g, (ARRAY['eu', 'us', 'ap', 'sa', 'af', 'oc'])[1 + g % 6], g % 50 FROM generate_series(1, 6000) g;
";

const REGIONS: &str =
    "SELECT region, count(*) AS orders, sum(amount) AS revenue FROM orders GROUP BY region";

/// The commands of the README's quick start, continuation lines joined, `export` lines
/// left out (the test sets the variable).
fn quick_start() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let block = readme
        .split("<!-- quick-start")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("the README's quick-start block");
    let mut commands = Vec::new();
    let mut line = String::new();
    for l in block.lines() {
        match l.strip_suffix('\\') {
            Some(part) => line.push_str(part),
            None => {
                line.push_str(l);
                commands.push(std::mem::take(&mut line));
            }
        }
    }
    commands
        .into_iter()
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty() && !c.starts_with("export "))
        .collect()
}

/// `command` through the shell in `dir`, with `freshen` on the PATH.
fn shell(dir: &std::path::Path, url: &str, command: &str) -> Command {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_freshen"))
        .parent()
        .expect("the binary's directory")
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(command)
        .current_dir(dir)
        .env("PATH", path)
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "info");
    c
}

async fn differs(c: &Client, table: &str, query: &str) -> i64 {
    c.query_one(
        &format!(
            "SELECT count(*) FROM ((SELECT * FROM {table} EXCEPT ({query})) UNION ALL (({query}) EXCEPT SELECT * FROM {table})) d"
        ),
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Kills the process when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `command` (a `freshen run` of `dir`'s freshen.toml, holding `file`) through the shell,
/// logging to run.log, killed when dropped. Its listener moves off the default port,
/// which another freshen on this machine may hold: the one change to the file.
fn run_file(dir: &std::path::Path, url: &str, file: &str, command: &str) -> Killed {
    let port = free_port();
    std::fs::write(
        dir.join("freshen.toml"),
        format!("{file}\n[http]\nlisten = \"127.0.0.1:{port}\"\n"),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("run.log")).unwrap();
    Killed(
        shell(dir, url, command)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// Waits (60 s at most) until `table` holds exactly what `query` returns.
async fn until_true(c: &Client, table: &str, query: &str, what: &str) {
    eventually(60, what, || async move {
        (differs(c, table, query).await == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_builds_a_complete_fresh_table() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(ORDERS).await.unwrap();
    let commands = quick_start();
    assert_eq!(commands.len(), 3, "init, check, run: {commands:?}");
    assert!(commands[0].starts_with("freshen init") && commands[2].starts_with("freshen run"));
    let dir = tempfile::tempdir().unwrap();
    // init and check, as written.
    for command in &commands[..2] {
        let out = shell(dir.path(), &pg.url(), command).output().unwrap();
        assert!(
            out.status.success(),
            "{command}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if command.starts_with("freshen init") {
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(
                said.contains("running: CREATE TABLE"),
                "printed first: {said}"
            );
            assert!(said.contains("done: CREATE PUBLICATION"), "{said}");
            // --fix-identity: orders' DELETEs and region moves carry the old region.
            assert!(
                said.contains(
                    "running: ALTER TABLE \"public\".\"orders\" REPLICA IDENTITY USING INDEX"
                ),
                "{said}"
            );
            assert!(!said.contains("warning"), "{said}");
        }
    }
    let file = std::fs::read_to_string(dir.path().join("freshen.toml")).unwrap();
    for absent in ["watch = [", "= ANY($1)", "reconcile", &pg.url()] {
        assert!(
            file.lines()
                .filter(|l| !l.starts_with('#'))
                .all(|l| !l.contains(absent)),
            "no `{absent}` in the starting file:\n{file}"
        );
    }
    // run, as written: the table is built whole, complete, then kept fresh.
    let _run = run_file(dir.path(), &pg.url(), &file, &commands[2]);
    until_true(&c, "region_totals", REGIONS, "region_totals complete").await;
    let regions: i64 = c
        .query_one("SELECT count(*) FROM region_totals", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(regions, 6, "every region, before any change");
    c.batch_execute(
        "INSERT INTO orders VALUES (100001, 'an', 5);
         UPDATE orders SET region = 'eu' WHERE id % 7 = 0;
         DELETE FROM orders WHERE id % 11 = 0;",
    )
    .await
    .unwrap();
    until_true(&c, "region_totals", REGIONS, "region_totals fresh").await;
    let log = std::fs::read_to_string(dir.path().join("run.log")).unwrap();
    assert!(log.contains("first build done"), "{log}");
    assert!(!log.contains("need the old"), "no identity warning: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_materialized_view_is_imported_and_readers_switch_with_no_gap() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(ORDERS).await.unwrap();
    c.batch_execute(&format!(
        "CREATE MATERIALIZED VIEW region_stats AS {REGIONS};
         CREATE UNIQUE INDEX ON region_stats (region);"
    ))
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = shell(
        dir.path(),
        &pg.url(),
        "freshen init --from-matview public.region_stats --create -o freshen.toml",
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = std::fs::read_to_string(dir.path().join("freshen.toml")).unwrap();
    assert!(
        file.contains("into = \"public.region_stats_fresh\""),
        "{file}"
    );
    assert!(
        file.contains("keyed on its unique index (region)"),
        "{file}"
    );
    let swap = file
        .lines()
        .map(|l| l.trim_start_matches('#').trim())
        .find(|l| l.starts_with("BEGIN; DROP MATERIALIZED VIEW"))
        .expect("the swap, in the file")
        .to_owned();
    let port = free_port();
    let text = format!("{file}\n[http]\nlisten = \"127.0.0.1:{port}\"\n");
    std::fs::write(dir.path().join("freshen.toml"), &text).unwrap();
    let run = spawn_run_env(
        dir.path(),
        &dir.path().join("freshen.toml"),
        1,
        &[("DATABASE_URL", &pg.url())],
    );
    let base = format!("http://127.0.0.1:{port}");
    wait_healthy(&base, dir.path(), 1, Duration::from_secs(60)).await;
    until_true(&c, "region_stats_fresh", REGIONS, "the fresh table built").await;
    // Readers keep reading the old name while it is swapped for a view over the fresh
    // table: every read succeeds and sees every region.
    let url = pg.url();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let r = connect(&url).await;
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let n: i64 = r
                    .query_one("SELECT count(*) FROM region_stats", &[])
                    .await
                    .expect("a read during the swap")
                    .get(0);
                assert_eq!(n, 6, "a read saw {n} regions");
                reads += 1;
            }
            reads
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.batch_execute(&swap).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.await.expect("the reader never failed");
    assert!(reads > 10, "{reads} reads");
    let kind: String = c
        .query_one(
            "SELECT relkind::text FROM pg_class WHERE relname = 'region_stats'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(kind, "v", "a view now");
    // Through the old name, fresh with every change.
    c.batch_execute("UPDATE orders SET amount = amount + 1000 WHERE region = 'ap'")
        .await
        .unwrap();
    until_true(
        &c,
        "region_stats",
        REGIONS,
        "region_stats fresh through the view",
    )
    .await;
    drop(run);
}

const ITEMS: &str = "
CREATE TABLE items (id int PRIMARY KEY, cid int NOT NULL, v int NOT NULL);
INSERT INTO items SELECT g, g % 10, g FROM generate_series(1, 2000) g;
";

/// The new user's query: a count per `cid`, the key of the view and not of `items`.
const PER_CID: &str = "SELECT cid, count(*) AS n FROM items GROUP BY cid";

fn init_ct(extra: &str) -> String {
    format!("freshen init --into ct --create {extra} -o freshen.toml --query \"{PER_CID}\"")
}

/// `check --json`'s replica_identity finding for `public.items`: (level, message).
fn identity_finding(dir: &std::path::Path, url: &str) -> (String, String) {
    let out = shell(dir, url, "freshen check --json -c freshen.toml")
        .output()
        .unwrap();
    let f = findings(&out)
        .into_iter()
        .find(|f| f["check"] == "replica_identity" && f["subject"] == "public.items")
        .unwrap_or_else(|| {
            panic!(
                "no replica_identity finding: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
    (
        f["level"].as_str().unwrap_or_default().to_owned(),
        f["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// `init_ct("--fix-identity")` in `dir`, which must succeed: what it said.
fn init_fixing(dir: &std::path::Path, url: &str) -> String {
    let out = shell(dir, url, &init_ct("--fix-identity"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    said
}

async fn replica_identity(c: &Client) -> String {
    c.query_one(
        "SELECT relreplident::text FROM pg_class WHERE oid = 'items'::regclass",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_says_which_identity_loses_changes_in_checks_words_and_writes_the_fix() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(ITEMS).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = shell(dir.path(), &pg.url(), &init_ct("")).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    // Nothing of the user's table changed without the flag.
    assert_eq!(replica_identity(&c).await, "d");
    let file = std::fs::read_to_string(dir.path().join("freshen.toml")).unwrap();
    assert!(
        file.contains("# WARNING: as the database is now, this view loses changes."),
        "{file}"
    );
    assert!(
        file.contains(
            "no `reconcile` needed once the replica identity of public.items carries the key"
        ),
        "{file}"
    );
    // One advice: what init printed is check's finding, word for word.
    let printed = said
        .lines()
        .find_map(|l| l.strip_prefix("warning: public.items: "))
        .unwrap_or_else(|| panic!("init warned: {said}"))
        .to_owned();
    let (level, advice) = identity_finding(dir.path(), &pg.url());
    assert_eq!(level, "warning", "{advice}");
    assert_eq!(printed, advice);
    assert!(advice.contains("view(s) ct need the old cid"), "{advice}");
    // The statements the file asks for, run as written, make the identity carry cid.
    let statements: Vec<&str> = file
        .lines()
        .skip_while(|l| !l.starts_with("# Run before `freshen run`"))
        .skip(1)
        .map_while(|l| l.strip_prefix("#   "))
        .collect();
    assert_eq!(statements.len(), 2, "{file}");
    assert!(
        statements[0].starts_with("CREATE UNIQUE INDEX CONCURRENTLY"),
        "{statements:?}"
    );
    for s in &statements {
        assert!(
            advice.contains(s),
            "the file's statements are the advice's: {s}"
        );
        c.batch_execute(s)
            .await
            .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    assert_eq!(replica_identity(&c).await, "i");
    let (level, advice) = identity_finding(dir.path(), &pg.url());
    assert_eq!(level, "ok", "{advice}");
    assert!(advice.contains("is the cheapest that carries"), "{advice}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_fix_identity_keeps_a_count_per_key_true_through_deletes_and_key_moves() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(ITEMS).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let said = init_fixing(dir.path(), &pg.url());
    assert!(
        said.contains("running: CREATE UNIQUE INDEX CONCURRENTLY"),
        "{said}"
    );
    assert!(
        said.contains("done: ALTER TABLE \"public\".\"items\" REPLICA IDENTITY USING INDEX"),
        "{said}"
    );
    assert_eq!(replica_identity(&c).await, "i");
    let file = std::fs::read_to_string(dir.path().join("freshen.toml")).unwrap();
    assert!(
        file.contains("# Run by `freshen init --fix-identity`"),
        "{file}"
    );
    assert!(!file.contains("WARNING"), "{file}");
    let (level, advice) = identity_finding(dir.path(), &pg.url());
    assert_eq!(level, "ok", "{advice}");
    // Asked again: nothing left to change.
    let again = shell(
        dir.path(),
        &pg.url(),
        &init_ct("--fix-identity").replace("freshen.toml", "again.toml"),
    )
    .output()
    .unwrap();
    let said = String::from_utf8_lossy(&again.stderr).into_owned();
    assert!(again.status.success(), "{said}");
    assert!(said.contains("nothing changed"), "{said}");
    assert!(!said.contains("running: CREATE UNIQUE INDEX"), "{said}");

    let _run = run_file(dir.path(), &pg.url(), &file, "freshen run -c freshen.toml");
    until_true(&c, "ct", PER_CID, "ct built").await;
    // DELETEs and UPDATEs that move rows to another cid: each carries the cid the row
    // left only through the identity init set. cid 3 loses every row and cid 5 moves
    // whole into 4 (both must vanish from ct); single rows move and go.
    c.batch_execute(
        "DELETE FROM items WHERE cid = 3;
         UPDATE items SET cid = 4 WHERE cid = 5;
         UPDATE items SET cid = 7 WHERE id % 13 = 0;
         DELETE FROM items WHERE id % 17 = 0;
         UPDATE items SET cid = 11 WHERE id = 1;",
    )
    .await
    .unwrap();
    until_true(&c, "ct", PER_CID, "ct true after deletes and key moves").await;
    let gone: i64 = c
        .query_one("SELECT count(*) FROM ct WHERE cid IN (3, 5)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(gone, 0, "the cids every row left are gone");
    let log = std::fs::read_to_string(dir.path().join("run.log")).unwrap();
    assert!(!log.contains("need the old"), "no identity warning: {log}");
}

/// A `CREATE INDEX CONCURRENTLY` that failed (a lock timeout, a cancelled session) leaves
/// its index behind, invalid; `--fix-identity` asked again drops it and builds it anew
/// instead of stopping on "already exists".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_fix_identity_builds_again_an_index_a_failed_build_left_invalid() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(ITEMS).await.unwrap();
    // What the failed build left: the index, marked invalid as PostgreSQL marks it.
    c.batch_execute(
        "CREATE UNIQUE INDEX items_cid_id_identity ON items (cid, id);
         UPDATE pg_index SET indisvalid = false
          WHERE indexrelid = 'items_cid_id_identity'::regclass;",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let said = init_fixing(dir.path(), &pg.url());
    assert!(
        said.contains(
            "done: DROP INDEX CONCURRENTLY IF EXISTS \"public\".\"items_cid_id_identity\""
        ),
        "{said}"
    );
    assert_eq!(replica_identity(&c).await, "i");
    let valid: bool = c
        .query_one(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'items_cid_id_identity'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(valid, "built anew");
    let (level, advice) = identity_finding(dir.path(), &pg.url());
    assert_eq!(level, "ok", "{advice}");
}
