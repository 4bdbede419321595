//! `freshen check` against a real PostgreSQL, and offline.

use crate::support;

use serde_json::Value;
use support::saas;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_finds_weak_replica_identity_and_wrong_parameter_counts() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    // readings keeps the default identity: a delete carries only the id, not the device.
    c.batch_execute("ALTER TABLE readings REPLICA IDENTITY DEFAULT")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bad = config(&pg.url(), "off")
        .replace(
            "\"DELETE FROM device_totals WHERE device = $1\"",
            "\"DELETE FROM device_totals WHERE device = $1 AND n > $2\"",
        )
        .replace(
            "GROUP BY device\",\n]",
            "GROUP BY device\",\n]\nrebuild_set = [\"DELETE FROM device_totals WHERE device = ANY($1)\", \"DELETE FROM device_totals WHERE device = $1\"]",
        );
    assert!(bad.contains("rebuild_set"), "{bad}");
    let cfg = write_config(dir.path(), &bad);
    let out = freshen()
        .args(["check", "--json", "-c"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "errors exit 1");
    let f = findings(&out);
    assert!(has(&f, "ok", "wal_level", "logical"), "{f:#?}");
    assert!(has(&f, "ok", "privilege", "may replicate"), "{f:#?}");
    assert!(
        has(
            &f,
            "warning",
            "replica_identity",
            "Cheapest that does: USING INDEX on (device, site, id)"
        ),
        "{f:#?}"
    );
    assert!(
        has(
            &f,
            "error",
            "statement",
            "takes 2 parameter(s) but the view's key has 1 part(s)"
        ),
        "{f:#?}"
    );
    assert!(
        has(&f, "ok", "statement", "lists keys of 1 part(s)"),
        "{f:#?}"
    );
    // Set statements are checked as arrays, each named.
    let set: Vec<(&str, &str)> = f
        .iter()
        .filter(|x| {
            x["subject"]
                .as_str()
                .is_some_and(|s| s.contains("rebuild_set["))
        })
        .map(|x| (x["subject"].as_str().unwrap(), x["level"].as_str().unwrap()))
        .collect();
    assert!(
        set.contains(&("view device_totals rebuild_set[0]", "ok")),
        "{f:#?}"
    );
    assert!(
        set.contains(&("view device_totals rebuild_set[1]", "error")),
        "{f:#?}"
    );
    assert!(
        has(
            &f,
            "error",
            "statement",
            "in a set statement each parameter is an array"
        ),
        "{f:#?}"
    );

    c.batch_execute("ALTER TABLE readings REPLICA IDENTITY FULL")
        .await
        .unwrap();
    let good = write_config(dir.path(), &config(&pg.url(), "off"));
    let out = freshen().args(["check", "-c"]).arg(&good).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // device_totals has no reconcile: warned, and a failure under --deny-warnings.
    assert!(text.contains("0 error(s), 1 warning(s)"), "{text}");
    assert!(text.contains("has no `reconcile`"), "{text}");
    let strict = freshen()
        .args(["check", "--deny-warnings", "-c"])
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(
        strict.status.code(),
        Some(1),
        "--deny-warnings fails on a warning"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_changefeed_tables_whose_updates_can_leave_out_large_values() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    // docs keeps the default identity and has a TOASTable column; readings is FULL.
    c.batch_execute("CREATE TABLE docs (id int PRIMARY KEY, body text)")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{}\n[changefeed]\npath = \"{}\"\n[changefeed.http]\nlisten = \"127.0.0.1:{}\"\n",
        config(&pg.url(), "off").replace(
            "publication = \"freshen_test\"",
            "publication = \"freshen_test\"\ntables = [\"public.docs\"]"
        ),
        dir.path().join("feed.redb").display(),
        free_port()
    );
    let cfg = write_config(dir.path(), &text);
    let out = freshen()
        .args(["check", "--json", "-c"])
        .arg(&cfg)
        .output()
        .unwrap();
    let f = findings(&out);
    assert!(
        has(
            &f,
            "warning",
            "changefeed",
            "ALTER TABLE \"public\".\"docs\" REPLICA IDENTITY FULL"
        ),
        "{f:#?}"
    );
    assert!(
        !f.iter()
            .any(|x| x["check"] == "changefeed" && x["subject"] == "public.readings"),
        "a FULL table needs nothing: {f:#?}"
    );
}

#[test]
fn check_offline_lists_every_config_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "[source]\nkind = \"postgres\"\nurl = \"${FRESHEN_TEST_UNSET_URL}\"\n[[views]]\nname = \"v\"\nwatch = [{ table = \"t\", key = [\"a\"] }]\nrebuild = [\"SELECT $1\"]\ncoalesce = \"soon\"\n",
    );
    let out = freshen()
        .args(["check", "--offline", "-c"])
        .arg(&cfg)
        .env_remove("FRESHEN_TEST_UNSET_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("freshen.toml:8: `views[0].coalesce` is not a duration"),
        "{text}"
    );
    assert!(
        !text.contains("FRESHEN_TEST_UNSET_URL"),
        "offline, an unset variable is not a problem: {text}"
    );

    // Without the mistake the file passes offline, the unset variable named as a
    // warning; online the same file fails on it.
    let cfg = write_config(
        dir.path(),
        "[source]\nkind = \"postgres\"\nurl = \"${FRESHEN_TEST_UNSET_URL}\"\n[[views]]\nname = \"v\"\nwatch = [{ table = \"t\", key = [\"a\"] }]\nrebuild = [\"SELECT $1\"]\nreconcile = { every = \"10m\", keys = \"SELECT a FROM t\" }\n",
    );
    let out = freshen()
        .args(["check", "--offline", "-c"])
        .arg(&cfg)
        .env_remove("FRESHEN_TEST_UNSET_URL")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("warning")
            && l.contains("freshen.toml:3")
            && l.contains("environment variable `FRESHEN_TEST_UNSET_URL` is not set here")),
        "{text}"
    );
    let out = freshen()
        .args(["check", "-c"])
        .arg(&cfg)
        .env_remove("FRESHEN_TEST_UNSET_URL")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("environment variable `FRESHEN_TEST_UNSET_URL` is not set"),
        "{text}"
    );
}

#[test]
fn run_rejects_a_bad_file_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "[source]\nkind = \"oracle\"\n");
    let out = freshen().args(["run", "-c"]).arg(&cfg).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`source.kind` must be one of `postgres`") && err.contains("not `oracle`"),
        "{err}"
    );
    assert!(err.contains("needs `views`"), "{err}");
}

/// Offline, `check` says per view what it relies on that its source cannot give: a
/// temporary slot loses changes at a restart (an error without a sweep, a warning with
/// one); a complete source is one `ok` line.
#[test]
fn check_names_what_a_view_relies_on_that_the_source_cannot_give() {
    let dir = tempfile::tempdir().unwrap();
    let text = |slot_mode: &str| {
        format!(
            r#"
[source]
kind = "postgres"
url = "postgres://app@127.0.0.1:1/app"
slot_mode = "{slot_mode}"

[[views]]
name = "unswept"
watch = [{{ table = "t", key = ["a"] }}]
rebuild = ["SELECT $1"]

[[views]]
name = "swept"
watch = [{{ table = "t", key = ["a"] }}]
rebuild = ["SELECT $1"]
reconcile = {{ every = "10m", keys = "SELECT a FROM t" }}
"#
        )
    };
    let run = |slot_mode: &str| {
        let cfg = write_config(dir.path(), &text(slot_mode));
        let out = freshen()
            .args(["check", "--offline", "--json", "-c"])
            .arg(&cfg)
            .output()
            .unwrap();
        (out.status.code(), findings(&out))
    };
    let (code, f) = run("temporary");
    assert_eq!(code, Some(1), "{f:?}");
    let contract: Vec<&Value> = f.iter().filter(|x| x["check"] == "contract").collect();
    assert!(
        contract.iter().any(|x| x["level"] == "error"
            && x["subject"] == "view unswept"
            && x["message"].as_str().unwrap().contains("restart")),
        "{contract:?}"
    );
    assert!(
        contract.iter().any(|x| x["level"] == "warning"
            && x["subject"] == "view swept"
            && x["message"].as_str().unwrap().contains("every 10m")),
        "{contract:?}"
    );
    let (code, f) = run("create");
    assert_eq!(code, Some(0), "{f:?}");
    assert!(
        has(
            &f,
            "ok",
            "contract",
            "postgres gives what the view relies on"
        ),
        "{f:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_accepts_the_saas_views_and_fails_on_each_mistake_with_its_fix() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(saas::SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let good = saas::config(&pg.url(), "off", "coalesce = \"20ms\"");
    let (code, f) = check_json(dir.path(), &good);
    let errors: Vec<&Value> = f.iter().filter(|x| x["level"] == "error").collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(code, Some(0));
    assert!(
        has(&f, "ok", "fanout", "maps id to the view's key (account_id)"),
        "{f:#?}"
    );
    assert!(
        has(&f, "ok", "depends", "reads only watched or static tables"),
        "{f:#?}"
    );
    assert!(
        has(&f, "warning", "reconcile", "no start-up backfill"),
        "{f:#?}"
    );

    // The MRR view reads plans but does not watch it: the fan-out entry is proposed.
    let plans_line = "  { table = \"public.plans\", key = [\"id\"], keys = \"SELECT account_id FROM subscriptions WHERE plan_id = $1\" },\n";
    assert!(good.contains(plans_line));
    // The first view's entry only (account_search keeps its own).
    let unwatched = good.replacen(plans_line, "", 1);
    let (code, f) = check_json(dir.path(), &unwatched);
    assert_eq!(code, Some(1), "{f:#?}");
    assert!(
        has(
            &f,
            "error",
            "depends",
            "reads public.plans, which the view neither watches nor lists as static"
        ),
        "{f:#?}"
    );
    assert!(
        has(
            &f,
            "error",
            "depends",
            "{ table = \"public.plans\", key = [\"id\"], keys = \"SELECT account_id FROM public.subscriptions WHERE plan_id = $1\" }"
        ),
        "{f:#?}"
    );
    // Declared static, it passes.
    let declared = unwatched.replacen(
        "name = \"account_mrr\"",
        "name = \"account_mrr\"\nstatic = [\"public.plans\"]",
        1,
    );
    let (_, f) = check_json(dir.path(), &declared);
    assert!(
        !f.iter()
            .any(|x| x["level"] == "error" && x["check"] == "depends"),
        "{f:#?}"
    );

    // One mistake at a time, each failing with its fix: (what changes, into what, the
    // check that fails, what it says).
    let mistakes = [
        // A misspelled key column: did you mean.
        (
            "{ table = \"public.subscriptions\", key = [\"account_id\"] }",
            "{ table = \"public.subscriptions\", key = [\"acount_id\"] }",
            "key_column",
            "has no column `acount_id` (did you mean `account_id`?)",
        ),
        // A text key bound to a bigint parameter.
        (
            "{ table = \"public.accounts\", key = [\"id\"] }",
            "{ table = \"public.accounts\", key = [\"name\"] }",
            "key_type",
            "`name` (text) is bound to $1 of rebuild[0], which PostgreSQL reads as bigint",
        ),
        // A fan-out returning the wrong number of columns.
        (
            "keys = \"SELECT account_id FROM subscriptions WHERE plan_id = $1\"",
            "keys = \"SELECT account_id, seats FROM subscriptions WHERE plan_id = $1\"",
            "fanout",
            "returns 2 column(s) but the view's key has 1 part(s)",
        ),
    ];
    for (from, to, check, says) in mistakes {
        assert!(good.contains(from), "{from}");
        let (code, f) = check_json(dir.path(), &good.replacen(from, to, 1));
        assert_eq!(code, Some(1), "{to}: {f:#?}");
        assert!(has(&f, "error", check, says), "{to}: {f:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_run_refuse_a_publication_that_would_break_the_applications_writes() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    // A watched table without a primary key, and one with identity NOTHING.
    c.batch_execute(
        "CREATE TABLE events (device text NOT NULL, value bigint NOT NULL);
         ALTER TABLE sites REPLICA IDENTITY NOTHING;",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = config(&pg.url(), "off").replacen(
        "watch = [{ table = \"public.readings\", key = [\"device\"] }]",
        "watch = [{ table = \"public.readings\", key = [\"device\"] }, { table = \"public.events\", key = [\"device\"] }]",
        1,
    );
    let (code, f) = check_json(dir.path(), &text);
    assert_eq!(code, Some(1), "{f:#?}");
    assert!(
        has(
            &f,
            "error",
            "publication",
            "ALTER TABLE \"public\".\"events\" REPLICA IDENTITY FULL (or add a primary key)"
        ),
        "{f:#?}"
    );
    assert!(
        has(&f, "error", "publication", "has REPLICA IDENTITY NOTHING"),
        "{f:#?}"
    );
    // `run` refuses before creating anything, and the application's writes still work.
    let cfg = write_config(dir.path(), &text);
    let out = freshen().args(["run", "-c"]).arg(&cfg).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to create or use publication"),
        "{err}"
    );
    let publications: i64 = c
        .query_one("SELECT count(*) FROM pg_publication", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(publications, 0, "nothing was published");
    c.batch_execute(
        "INSERT INTO events VALUES ('d', 1); UPDATE events SET value = 2; DELETE FROM events;",
    )
    .await
    .expect("the application's writes are untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_what_a_role_lacks_to_create_the_publication() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    c.batch_execute("CREATE ROLE app LOGIN; GRANT SELECT ON ALL TABLES IN SCHEMA public TO app;")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = pg.url().replacen("postgres@", "app@", 1);
    assert_ne!(url, pg.url(), "the URL names its user");
    let (code, f) = check_json(dir.path(), &config(&url, "off"));
    assert_eq!(code, Some(1), "{f:#?}");
    assert!(has(&f, "error", "privilege", "lacks REPLICATION"), "{f:#?}");
    assert!(
        has(
            &f,
            "error",
            "privilege",
            "does not own public.readings (owner: postgres)"
        ),
        "{f:#?}"
    );
    assert!(
        has(&f, "error", "privilege", "may not create a publication"),
        "{f:#?}"
    );
}

/// A connection that fails says why — the server refused the password, nothing listens
/// — and never shows the password, even in a URL too malformed to parse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_failures_name_their_cause_and_hide_the_password() {
    let pg = freshen_testenv::PgServer::builder()
        .password("R1ghtSecret")
        .start()
        .expect("a throwaway PostgreSQL (apt-get install postgresql-15)");
    let url = pg.url();
    let (scheme_user, rest) = url.split_once('@').expect("a URL with credentials");
    let user = scheme_user
        .trim_start_matches("postgres://")
        .split(':')
        .next()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let view = "[[views]]\nname = \"v\"\nwatch = [{ table = \"t\", key = [\"a\"] }]\nrebuild = [\"SELECT $1\"]\nreconcile = { every = \"10m\", keys = \"SELECT a FROM t\" }\n";
    let check = |source_url: &str| {
        let cfg = write_config(
            dir.path(),
            &format!("[source]\nkind = \"postgres\"\nurl = \"{source_url}\"\n{view}"),
        );
        let out = freshen().args(["check", "-c"]).arg(&cfg).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, text) = check(&format!("postgres://{user}:Wr0ngSecret@{rest}"));
    assert!(!text.contains("R1ghtSecret"), "{text}");
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("28P01") || text.contains("password authentication failed"),
        "{text}"
    );
    assert!(!text.contains("Wr0ngSecret"), "{text}");

    let port = free_port();
    let (code, text) = check(&format!(
        "postgres://{user}:Wr0ngSecret@127.0.0.1:{port}/app"
    ));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(!text.contains("Wr0ngSecret"), "{text}");

    let (code, text) = check("postgres://app:Wr0ngSecret@db:notaport/app");
    assert_eq!(code, Some(1), "{text}");
    assert!(!text.contains("Wr0ngSecret"), "{text}");
}

/// A `[[redact]]` rule that matches nothing — a table nothing captures, a column its
/// table does not have — would let the column it meant leave in clear: `check` warns
/// about each, naming the rule's line (`--deny-warnings` fails on them), and `run` logs
/// the table warning once at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redact_rules_that_match_nothing_are_warnings_with_their_lines() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let text = format!(
        "{}\n[[redact]]\ntable = \"public.readings\"\ncolumn = \"device\"\naction = \"mask\"\n\n\
         [[redact]]\ntable = \"public.reading\"\ncolumn = \"device\"\naction = \"mask\"\n\n\
         [[redact]]\ntable = \"sites\"\ncolumn = \"regoin\"\naction = \"drop\"\n",
        config(&pg.url(), &format!("127.0.0.1:{port}"))
    );
    let lines: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| *l == "[[redact]]")
        .map(|(i, _)| i + 1)
        .collect();
    let cfg = write_config(dir.path(), &text);
    let at = |line: usize| format!("{}:{line}", cfg.display());

    let out = freshen()
        .args(["check", "--json", "-c"])
        .arg(&cfg)
        .output()
        .unwrap();
    let f = findings(&out);
    let redact: Vec<(String, String)> = f
        .iter()
        .filter(|x| x["check"] == "redact")
        .map(|x| {
            assert_eq!(x["level"], "warning", "{x}");
            (
                x["subject"].as_str().unwrap().to_owned(),
                x["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        redact.len(),
        2,
        "the rule that matches is no warning: {f:#?}"
    );
    assert_eq!(redact[0].0, at(lines[1]), "{redact:?}");
    assert!(
        redact[0]
            .1
            .contains("`public.reading` column `device` matches nothing"),
        "{redact:?}"
    );
    assert_eq!(redact[1].0, at(lines[2]), "{redact:?}");
    assert!(
        redact[1].1.contains("public.sites has no column `regoin`"),
        "{redact:?}"
    );
    assert_eq!(out.status.code(), Some(0), "warnings alone pass");
    let strict = freshen()
        .args(["check", "--deny-warnings", "-c"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_ne!(
        strict.status.code(),
        Some(0),
        "--deny-warnings fails on them"
    );

    // Offline, the table is known to be captured by nothing; the column is not asked.
    let offline = freshen()
        .args(["check", "--offline", "--json", "-c"])
        .arg(&cfg)
        .output()
        .unwrap();
    let f = findings(&offline);
    assert!(
        has(&f, "warning", "redact", "`public.reading` column"),
        "{f:#?}"
    );
    assert!(!has(&f, "warning", "redact", "regoin"), "{f:#?}");

    let _run = spawn_run(dir.path(), &cfg, 1);
    wait_healthy(
        &format!("http://127.0.0.1:{port}"),
        dir.path(),
        1,
        std::time::Duration::from_secs(60),
    )
    .await;
    let log = log_of(dir.path(), 1);
    let warned = format!("{}: `[[redact]]` for `public.reading`", at(lines[1]));
    assert_eq!(log.matches(&warned).count(), 1, "{log}");
}
