//! `deploy/prometheus/` and `deploy/grafana/`, against the real tools: `promtool check
//! rules` on the rules file, and a real Prometheus (Debian's `prometheus` package, its own
//! directory and port, killed at the end) scraping a running freshen and its changefeed:
//! every recording rule and every dashboard panel's query returns data during a workload,
//! every metric the rules and the dashboard name is one freshen exports, and a database
//! outage makes the not-streaming alert pending or firing, which resolves after recovery.

use crate::deploy::{need, ok, read, repo, run};
use crate::support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use freshen_testenv::refresher::eventually;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RULES: &str = "deploy/prometheus/freshen-rules.yml";
const DASHBOARD: &str = "deploy/grafana/freshen.json";

#[test]
fn the_rules_pass_promtool_check_rules() {
    need("promtool", "prometheus");
    let said = ok(Command::new("promtool")
        .args(["check", "rules"])
        .arg(repo().join(RULES)));
    assert!(said.contains("SUCCESS"), "{said}");

    // promtool is not a rubber stamp: a rule with a broken expression is refused.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("rules.yml");
    let text = read(RULES).replace(
        "expr: freshen_view_paused == 1",
        "expr: freshen_view_paused == == 1",
    );
    assert!(text.contains("== == 1"));
    std::fs::write(&broken, text).unwrap();
    let out = run(Command::new("promtool")
        .args(["check", "rules"])
        .arg(&broken));
    assert!(!out.status.success(), "{out:?}");
}

#[test]
fn the_dashboard_is_one_grafana_document_with_a_query_in_every_panel() {
    let d: Value = serde_json::from_str(&read(DASHBOARD)).expect("freshen.json is JSON");
    assert_eq!(d["uid"], "freshen");
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().expect("an id")), "ids repeat");
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{p}");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        assert!(!queries(p).is_empty(), "{} has no query", p["title"]);
    }
    let titles: Vec<&str> = panels.iter().filter_map(|p| p["title"].as_str()).collect();
    for want in [
        "Freshness lag p50 / p99",
        "Rebuild rate by outcome",
        "Rebuild failures",
        "Dirty keys and rebuilds in flight",
        "Slot lag (bytes)",
        "Per-view state",
    ] {
        assert!(titles.contains(&want), "no panel {want}: {titles:?}");
    }
}

/// Every `expr` of a panel's targets.
fn queries(panel: &Value) -> Vec<String> {
    panel["targets"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["expr"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Prometheus on its own directory and port, killed when dropped.
struct Prometheus {
    child: Child,
    base: String,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `targets` (`host:port`) as job `freshen` every second, evaluating the rules
    /// file every second.
    fn start(targets: &[String]) -> Prometheus {
        need("prometheus", "prometheus");
        let dir = tempfile::tempdir().unwrap();
        let port = support::free_port();
        let list = targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - '{}'\nscrape_configs:\n  - job_name: freshen\n    static_configs:\n      - targets: [{list}]\n",
            repo().join(RULES).display()
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Prometheus {
            child,
            base: format!("127.0.0.1:{port}"),
            dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` over HTTP/1.0 (so the body is neither chunked nor kept alive): the
    /// status code and the body.
    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut s = tokio::net::TcpStream::connect(&self.base).await.ok()?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.base);
        s.write_all(req.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8(raw).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        let code = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, body.to_owned()))
    }

    /// The `data` of a successful API call.
    async fn api(&self, path: &str) -> Value {
        let (code, body) = self
            .get(path)
            .await
            .unwrap_or_else(|| panic!("no answer to {path}:\n{}", self.log()));
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert!(
            code == 200 && v["status"] == "success",
            "{path} answered {code}: {body}"
        );
        v["data"].clone()
    }

    /// The instant vector (or scalar) `query` evaluates to now.
    async fn query(&self, query: &str) -> Vec<Value> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(query)))
            .await;
        match data["resultType"].as_str() {
            Some("vector") => data["result"].as_array().cloned().unwrap_or_default(),
            _ => vec![data["result"].clone()],
        }
    }

    /// The values of `label` over the series `selector` matches (Grafana's
    /// `label_values(selector, label)`).
    async fn label_values(&self, selector: &str, label: &str) -> Vec<String> {
        let data = self
            .api(&format!(
                "/api/v1/label/{label}/values?match[]={}",
                encode(selector)
            ))
            .await;
        data.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The state (`pending`, `firing`) of alert `name`, if it is active.
    async fn alert(&self, name: &str) -> Option<String> {
        let data = self.api("/api/v1/alerts").await;
        data["alerts"].as_array()?.iter().find_map(|a| {
            (a["labels"]["alertname"] == name).then(|| a["state"].as_str().unwrap_or("").into())
        })
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encodes a query parameter (RFC 3986 unreserved characters pass).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `label_values(SELECTOR, LABEL)` of a Grafana variable's query.
fn label_values_of(query: &str) -> (String, String) {
    let inner = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values query: {query}"));
    let (selector, label) = inner
        .rsplit_once(',')
        .expect("label_values(selector, label)");
    (selector.trim().to_owned(), label.trim().to_owned())
}

/// The metric names (`freshen_…`) a PromQL text names; recording rules (`freshen:…`)
/// are not metric names of freshen's.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("freshen_") {
        let start = i + at;
        let preceded = start > 0 && (b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b':');
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        if !preceded {
            out.insert(text[start..end].to_owned());
        }
        i = end;
    }
    out
}

/// Substitutes the dashboard's variables: the job and view as a person would pick them
/// (values from the variables' own queries), Grafana's rate interval as it would be at a
/// 1 s scrape interval with its 4-scrape floor raised to a minute.
fn substitute(expr: &str, job: &str, view: &str) -> String {
    let out = expr
        .replace("$__rate_interval", "1m")
        .replace("${job}", job)
        .replace("$job", job)
        .replace("${view}", view)
        .replace("$view", view);
    assert!(!out.contains('$'), "an unknown variable in {expr}");
    out
}

fn changefeed_config(url: &str, http: u16, feed: u16, path: &Path) -> String {
    format!(
        "{}\n[changefeed]\npath = \"{}\"\n\n[changefeed.http]\nlisten = \"127.0.0.1:{feed}\"\n",
        support::config(url, &format!("127.0.0.1:{http}")),
        path.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_alerts_on_an_outage_and_every_rule_and_panel_has_data() {
    need("prometheus", "prometheus");
    let mut pg = support::start_pg();
    let c = support::connect(&pg.url()).await;
    c.batch_execute(support::SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (http, feed) = (support::free_port(), support::free_port());
    let cfg = support::write_config(
        dir.path(),
        &changefeed_config(&pg.url(), http, feed, &dir.path().join("feed.redb")),
    );
    let base = format!("http://127.0.0.1:{http}");
    let feed_base = format!("http://127.0.0.1:{feed}");
    let _run = support::spawn_run(dir.path(), &cfg, 1);
    support::wait_healthy(&base, dir.path(), 1, Duration::from_secs(60)).await;
    // A consumer group, so the changefeed exports its per-group gauges.
    let (code, body) = freshen_cli::status::request(
        &feed_base,
        "POST",
        "/changefeed/groups",
        None,
        Some(r#"{"name":"ops"}"#),
    )
    .await
    .expect("create a consumer group");
    assert!((200..300).contains(&code), "{code}: {body}");

    let prometheus = Prometheus::start(&[format!("127.0.0.1:{http}"), format!("127.0.0.1:{feed}")]);
    let prom = &prometheus;
    eventually(60, "Prometheus is ready", || async move {
        matches!(prom.get("/-/ready").await, Some((200, _))).then_some(())
    })
    .await;
    eventually(60, "both targets are scraped and up", || async move {
        let t = prom.api("/api/v1/targets").await;
        let active = t["activeTargets"].as_array().cloned().unwrap_or_default();
        (active.len() == 2 && active.iter().all(|t| t["health"] == "up")).then_some(())
    })
    .await;

    // A workload while the queries are asked: inserts, updates, deletes of readings.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let writing = writing.clone();
        let url = pg.url();
        tokio::spawn(async move {
            let mut c = support::connect(&url).await;
            let mut r = support::Rng::new(33);
            while writing.load(Ordering::Relaxed) {
                support::workload(&mut c, &mut r, 5).await;
            }
        })
    };

    // Every recording rule returns data.
    let rules = prom.api("/api/v1/rules").await;
    let mut recorded = Vec::new();
    let mut alerts = Vec::new();
    let mut said = String::new();
    for group in rules["groups"].as_array().expect("rule groups") {
        for rule in group["rules"].as_array().expect("rules") {
            said.push_str(rule["query"].as_str().unwrap_or(""));
            said.push('\n');
            match rule["type"].as_str() {
                Some("recording") => recorded.push(rule["name"].as_str().unwrap().to_owned()),
                Some("alerting") => alerts.push(rule.clone()),
                other => panic!("a rule of type {other:?}"),
            }
        }
    }
    assert!(recorded.len() >= 5, "{recorded:?}");
    for name in &recorded {
        eventually(
            90,
            &format!("recording rule {name} has data"),
            || async move { (!prom.query(name).await.is_empty()).then_some(()) },
        )
        .await;
    }

    // Every alert carries a summary and a runbook line whose section exists.
    let runbook = read("docs/runbook.md").to_lowercase();
    for a in &alerts {
        let name = a["name"].as_str().unwrap();
        let ann = &a["annotations"];
        assert!(
            ann["summary"].as_str().is_some_and(|s| !s.is_empty()),
            "{name}"
        );
        let url = ann["runbook_url"].as_str().unwrap_or_default();
        let anchor = url
            .split_once("docs/runbook.md#")
            .map(|(_, a)| a)
            .unwrap_or_else(|| panic!("{name}: runbook_url {url:?}"));
        assert!(
            runbook.lines().any(|l| l.starts_with('#')
                && l.trim_start_matches('#').trim().replace(' ', "-") == anchor),
            "{name}: docs/runbook.md has no section #{anchor}"
        );
        assert!(
            a["labels"]["severity"].as_str().is_some(),
            "{name} has no severity"
        );
    }

    // Every dashboard panel's query returns data, its variables as a person picks them.
    let d: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    let vars = d["templating"]["list"].as_array().unwrap();
    let var_query = |name: &str| {
        let v = vars.iter().find(|v| v["name"] == name).unwrap();
        v["query"]["query"].as_str().unwrap().to_owned()
    };
    let (selector, label) = label_values_of(&var_query("job"));
    let jobs = prom.label_values(&selector, &label).await;
    assert_eq!(jobs, ["freshen"]);
    let job = jobs[0].clone();
    let (selector, label) = label_values_of(&var_query("view"));
    let views = prom
        .label_values(&substitute(&selector, &job, ""), &label)
        .await;
    assert_eq!(views, ["device_totals", "site_totals"]);
    let mut named = metric_names(&said);
    for p in d["panels"].as_array().unwrap() {
        for expr in queries(p) {
            named.extend(metric_names(&expr));
            for view in &views {
                let q = &substitute(&expr, &job, view);
                eventually(
                    60,
                    &format!("panel {} ({view}): {q}", p["title"]),
                    || async move { (!prom.query(q).await.is_empty()).then_some(()) },
                )
                .await;
            }
        }
    }

    // No name is a typo: each is a series Prometheus holds, or (a key stream worker's
    // gauge, a sink's series: absent from this configuration, which has neither) a name
    // freshen's metrics module defines. cli_outbox reads the sink series from a running
    // relay.
    let held: BTreeSet<String> = prom
        .api("/api/v1/label/__name__/values")
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let defined = read("crates/freshen-cli/src/metrics.rs");
    for name in &named {
        if name == "freshen_key_stream_partitions_owned" || name.starts_with("freshen_sink_") {
            assert!(defined.contains(&format!("\"{name}\"")), "{name}");
            continue;
        }
        assert!(
            held.contains(name),
            "{name} is not a series freshen exports: {held:?}"
        );
    }

    writing.store(false, Ordering::Relaxed);
    writer.await.unwrap();
    support::wait_equal(&c, Duration::from_secs(60)).await;
    drop(c);

    // The outage: the database stops. The not-streaming alert goes pending, then firing.
    assert_eq!(prom.alert("FreshenSourceNotStreaming").await, None);
    pg.stop().expect("stop PostgreSQL");
    let state = eventually(
        60,
        "FreshenSourceNotStreaming is pending or firing",
        || async move { prom.alert("FreshenSourceNotStreaming").await },
    )
    .await;
    assert!(state == "pending" || state == "firing", "{state}");
    let (code, _) = freshen_cli::status::get(&base, "/healthz").await.unwrap();
    assert_eq!(code, 503);

    // Recovery: it streams again and the alert resolves.
    pg.start_again().expect("start PostgreSQL again");
    support::wait_healthy(&base, dir.path(), 1, Duration::from_secs(60)).await;
    eventually(60, "FreshenSourceNotStreaming resolves", || async move {
        prom.alert("FreshenSourceNotStreaming")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    // The pipeline works again: a change after the outage reaches the derived tables.
    let c = support::connect(&pg.url()).await;
    c.batch_execute("INSERT INTO readings (device, site, value) VALUES ('after', 's1', 7)")
        .await
        .unwrap();
    support::wait_equal(&c, Duration::from_secs(60)).await;
}
