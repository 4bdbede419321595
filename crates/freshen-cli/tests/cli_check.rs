//! `freshen check` against a real PostgreSQL, and offline.

mod support;

use serde_json::Value;
use support::*;

fn findings(out: &std::process::Output) -> Vec<Value> {
    let doc: Value = serde_json::from_slice(&out.stdout).expect("check --json prints JSON");
    doc["findings"].as_array().expect("findings").clone()
}

fn has(f: &[Value], level: &str, check: &str, needle: &str) -> bool {
    f.iter().any(|x| {
        x["level"] == level
            && x["check"] == check
            && x["message"].as_str().is_some_and(|m| m.contains(needle))
    })
}

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
    let bad = config(&pg.url(), "off").replace(
        "\"DELETE FROM device_totals WHERE device = $1\"",
        "\"DELETE FROM device_totals WHERE device = $1 AND n > $2\"",
    );
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
        has(&f, "warning", "replica_identity", "REPLICA IDENTITY FULL"),
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

    c.batch_execute("ALTER TABLE readings REPLICA IDENTITY FULL")
        .await
        .unwrap();
    let good = write_config(dir.path(), &config(&pg.url(), "off"));
    let out = freshen().args(["check", "-c"]).arg(&good).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("0 error(s), 0 warning(s)"), "{text}");
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
        text.contains("environment variable `FRESHEN_TEST_UNSET_URL` is not set"),
        "{text}"
    );
    assert!(
        text.contains("`views[0].coalesce` is not a duration"),
        "{text}"
    );
    assert!(
        text.contains("freshen.toml:3: ") && text.contains("freshen.toml:8: "),
        "lines are given: {text}"
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
