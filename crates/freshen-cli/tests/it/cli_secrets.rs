//! No output ever shows a secret: each form a password took in hostile testing, through
//! `check` (human and JSON, offline and online), `run`'s logs and errors, and a running
//! pipeline's `/healthz`, `/status`, `/metrics` and `freshen status`.

use crate::support;

use std::process::Output;
use std::time::{Duration, Instant};

use support::*;

/// (what, URL with `{port}` for a port where nothing listens, the secret text).
const FORMS: &[(&str, &str, &str)] = &[
    (
        "userinfo",
        "postgres://app:SEKRIT1@127.0.0.1:{port}/db",
        "SEKRIT1",
    ),
    (
        "unencoded @",
        "postgres://app:p@SEKRIT2@127.0.0.1:{port}/db",
        "SEKRIT2",
    ),
    (
        "colon",
        "postgres://app:a:SEKRIT3@127.0.0.1:{port}/db",
        "SEKRIT3",
    ),
    (
        "slash",
        "postgres://app:a/SEKRIT4@127.0.0.1:{port}/db",
        "SEKRIT4",
    ),
    (
        "query password",
        "postgres://app@127.0.0.1:{port}/db?password=SEKRIT5",
        "SEKRIT5",
    ),
    (
        "misspelled passwd",
        "postgres://app@127.0.0.1:{port}/db?passwd=SEKRIT6",
        "SEKRIT6",
    ),
    (
        "sslpassword",
        "postgres://app@127.0.0.1:{port}/db?sslpassword=SEKRIT7",
        "SEKRIT7",
    ),
    (
        "pasted into the query",
        "postgres://app@127.0.0.1:{port}/db?SEKRIT8",
        "SEKRIT8",
    ),
    (
        "libpq key=value, quoted",
        "host=127.0.0.1 port={port} password='SEKRIT9 x' user=app",
        "SEKRIT9",
    ),
    ("forgotten host", "postgres://app:SEKRIT10/db", "SEKRIT10"),
];

fn config_with(url: &str, http: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
tables = ["public.readings"]

[http]
listen = "{http}"

[[views]]
name = "device_totals"
watch = [{{ table = "public.readings", key = ["device"] }}]
rebuild = ["DELETE FROM device_totals WHERE device = $1"]
"#
    )
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `freshen run`, which must end by itself (nothing listens at the URL), within a bound.
fn run_to_exit(cfg: &std::path::Path) -> (Option<i32>, String) {
    let dir = cfg.parent().unwrap();
    let log = dir.join("run.log");
    let mut child = freshen()
        .args(["run", "-c"])
        .arg(cfg)
        .env("RUST_LOG", "debug")
        .stdout(std::fs::File::create(dir.join("run.out")).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn freshen run");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("freshen run did not stop on an unusable database");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(dir.join("run.out")).unwrap_or_default();
    (
        status.code(),
        out + &std::fs::read_to_string(log).unwrap_or_default(),
    )
}

#[test]
fn no_output_shows_a_password_in_any_form() {
    let port = free_port().to_string();
    for (what, url, secret) in FORMS {
        let url = url.replace("{port}", &port);
        let dir = tempfile::tempdir().unwrap();
        let cfg = write_config(dir.path(), &config_with(&url, "off"));
        let mut outputs = Vec::new();
        for args in [
            &["check", "--offline"][..],
            &["check", "--offline", "--json"],
            &["check"],
            &["check", "--json"],
        ] {
            let out = freshen().args(args).arg("-c").arg(&cfg).output().unwrap();
            let online = !args.contains(&"--offline");
            assert!(
                !online || out.status.code() != Some(0),
                "{what}: `{args:?}` finds the database unusable: {}",
                text(&out)
            );
            assert!(
                text(&out).contains("error") || !online,
                "{what}: {}",
                text(&out)
            );
            outputs.push((format!("{args:?}"), text(&out)));
        }
        let (code, log) = run_to_exit(&cfg);
        assert_ne!(code, Some(0), "{what}: run fails: {log}");
        assert!(!log.trim().is_empty(), "{what}: run says why it stopped");
        outputs.push(("run".into(), log));
        for (output, shown) in outputs {
            assert!(
                !shown.contains(secret),
                "{what}: `{output}` shows the secret:\n{shown}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pipeline_never_shows_its_password() {
    const SECRET: &str = "SEKRIT-running-pw";
    let pg = freshen_testenv::PgServer::builder()
        .password(SECRET)
        .start()
        .expect("a throwaway PostgreSQL (apt-get install postgresql-15)");
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    // The password as a query parameter: the form the old redaction printed verbatim.
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?password={SECRET}&application_name=freshen",
        pg.port()
    );
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let cfg = write_config(dir.path(), &config(&url, &format!("127.0.0.1:{port}")));
    let mut shown = Vec::new();
    for args in [&["check"][..], &["check", "--json"]] {
        let out = freshen().args(args).arg("-c").arg(&cfg).output().unwrap();
        let t = text(&out);
        assert!(
            t.contains("postgres@127.0.0.1"),
            "check names the database: {t}"
        );
        shown.push((format!("{args:?}"), t));
    }
    let mut run = spawn_run(dir.path(), &cfg, 1);
    wait_http(&base, "/healthz", 200, Duration::from_secs(30)).await;
    for path in ["/healthz", "/status", "/metrics"] {
        shown.push((
            path.into(),
            wait_http(&base, path, 200, Duration::from_secs(5)).await,
        ));
    }
    for args in [&["status", "--url"][..], &["status", "--json", "--url"]] {
        let out = freshen().args(args).arg(&base).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        shown.push((format!("{args:?}"), text(&out)));
    }
    run.kill().unwrap();
    run.wait().unwrap();
    let log = log_of(dir.path(), 1);
    assert!(log.contains("running"), "the log is there: {log}");
    shown.push(("run log".into(), log));
    for (output, text) in shown {
        assert!(
            !text.contains(SECRET),
            "`{output}` shows the password:\n{text}"
        );
    }
}
