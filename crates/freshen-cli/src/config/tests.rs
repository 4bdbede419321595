use super::*;
use crate::registry::Found;

/// [`super::parse`] with the kinds this binary registers.
fn parse(
    src: &str,
    file: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    super::parse(src, file, env, crate::kinds::builtin())
}

const GOOD: &str = r#"
[source]
kind = "postgres"
url = "${DATABASE_URL}"
slot = "freshen"
publication = "freshen"
ack = "after-rebuild"

[target]
url = "${TARGET_URL}"
pool_size = 8

[http]
listen = "127.0.0.1:9999"

[defaults]
coalesce = "50ms"
max_wait = "2s"
workers = 3
poison_after = 4
backoff = { base = "10ms", max = "1s" }

[[views]]
name = "device_totals"
watch = [ { table = "public.readings", key = ["device"] } ]
rebuild = [
  "DELETE FROM device_totals WHERE device = $1",
  "INSERT INTO device_totals SELECT device, sum(value), count(*) FROM readings WHERE device = $1 GROUP BY device",
]
reconcile = { every = "1h", keys = "SELECT device FROM readings UNION SELECT device FROM device_totals" }

[[views]]
name = "site_totals"
coalesce = "200ms"
rebuild_batch = 50
watch = [
  { table = "readings", key = ["site"] },
  { table = "sites", key = ["id"] },
]
rebuild = "SELECT 1 WHERE $1::text IS NOT NULL"
"#;

fn env(name: &str) -> Option<String> {
    match name {
        "DATABASE_URL" => Some("postgres://app:s3cret@db/app".into()),
        "TARGET_URL" => Some("postgres://app:s3cret@replica/app".into()),
        _ => None,
    }
}

fn problems(src: &str) -> Vec<String> {
    parse(src, "f.toml", &env).unwrap_err().lines()
}

#[test]
fn a_good_file_resolves_with_defaults_and_overrides() {
    let c = parse(GOOD, "f.toml", &env).unwrap();
    assert_eq!(c.source.kind(), "postgres");
    assert_eq!(
        c.source.database_url(),
        Some("postgres://app:s3cret@db/app")
    );
    let shown = format!("{:?}", c.source);
    assert!(shown.contains("slot_mode: Create"), "{shown}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert_eq!(c.target.pool_size, Some(8));
    assert_eq!(c.target.url.expose(), "postgres://app:s3cret@replica/app");
    assert_eq!(
        c.http.as_ref().map(|h| h.listen),
        Some("127.0.0.1:9999".parse().unwrap())
    );
    assert_eq!(c.ack, AckPolicy::AfterRebuild);
    assert_eq!(c.views.len(), 2);
    let v = &c.views[0];
    assert_eq!(v.timing.coalesce, Duration::from_millis(50));
    assert_eq!(v.timing.workers, 3);
    assert_eq!(v.timing.backoff_base, Duration::from_millis(10));
    assert_eq!(v.rebuild.len(), 2);
    assert_eq!(
        v.reconcile.as_ref().unwrap().every,
        Duration::from_secs(3600)
    );
    let s = &c.views[1];
    assert_eq!(
        s.timing.coalesce,
        Duration::from_millis(200),
        "view overrides defaults"
    );
    assert_eq!(
        s.timing.max_wait,
        Duration::from_secs(2),
        "and inherits the rest"
    );
    assert_eq!(s.rebuild_batch, Some(50));
    assert_eq!(s.watch[0].qualified(), "public.readings");
    assert_eq!(s.watch[1].key, ["id"]);
    assert_eq!(
        c.watched_tables(),
        [
            ("public".into(), "readings".into()),
            ("public".into(), "sites".into())
        ]
    );
}

#[test]
fn secrets_never_show_in_debug_output() {
    let c = parse(GOOD, "f.toml", &env).unwrap();
    let shown = format!("{c:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("app:***@db"), "{shown}");
    assert_eq!(
        redact_url("host=db password=x user=a"),
        "host=db password=*** user=a"
    );
}

#[test]
fn every_problem_is_listed_at_once_with_its_line() {
    let src = r#"
[source]
kind = "postgres"
url = "${MISSING_URL}"
colour = "blue"

[defaults]
coalesce = "10 parsecs"
max_wait = "1s"
workrs = 2

[[views]]
name = "a"
watch = [ { table = "t1", key = ["x"] }, { table = "t2", key = ["x", "y"] } ]
rebuild = ["SELECT $1"]

[[views]]
name = "a"
watch = [ { table = "t3", key = ["z"] } ]
rebuild = ["SELECT $1"]
reconcile = { every = "0s", keys = "SELECT 1" }
"#;
    let p = problems(src);
    let want = [
        "f.toml:4: environment variable `MISSING_URL` is not set",
        "f.toml:5: in `source`: unknown field `colour`",
        "f.toml:8: `defaults.coalesce` is not a duration",
        "f.toml:10: unknown key `workrs` in `defaults` (did you mean `workers`?)",
        "f.toml:14: view `a`: every watched table must give a key of the same arity",
        "f.toml:18: duplicate view name `a` (first used on line 12)",
        "f.toml:21: `reconcile.every` must be greater than zero",
    ];
    // The URL is not judged while a variable in it is missing.
    for w in want {
        assert!(
            p.iter().any(|l| l.starts_with(w)),
            "missing {w:?} in\n{}",
            p.join("\n")
        );
    }
    assert_eq!(p.len(), want.len(), "{}", p.join("\n"));
}

#[test]
fn missing_sections_and_keys_are_named() {
    let p = problems("[http]\nlisten = \"nowhere\"\n");
    assert!(p.iter().any(|l| l.contains("needs `source`")), "{p:?}");
    assert!(p.iter().any(|l| l.contains("needs `views`")), "{p:?}");
    assert!(
        p.iter()
            .any(|l| l.contains("f.toml:2: `http.listen` must be an address")),
        "{p:?}"
    );

    let p = problems("[source]\nkind = \"postgres\"\n[[views]]\nwatch = []\n");
    for needle in [
        "missing field `url`",
        "needs `name`",
        "needs `rebuild`",
        "at least one watched table",
    ] {
        assert!(
            p.iter().any(|l| l.contains(needle)),
            "missing {needle}: {p:?}"
        );
    }
}

#[test]
fn wrong_types_and_choices_are_explained() {
    let src = r#"
[source]
kind = "postgress"
ack = "sometimes"
[[views]]
name = 7
watch = "readings"
rebuild = ["x"]
"#;
    let p = problems(src);
    let kinds: Vec<String> = crate::kinds::builtin()
        .sources
        .built()
        .iter()
        .map(|k| format!("`{k}`"))
        .collect();
    let want = format!(
        "f.toml:3: `source.kind` must be one of {}, not `postgress` (did you mean `postgres`?)",
        kinds.join(", ")
    );
    assert!(p.iter().any(|l| l.contains(&want)), "{want}\n{p:?}");
    assert!(
        p.iter()
            .any(|l| l.contains("f.toml:4: `source.ack` must be one of")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|l| l.contains("f.toml:6: `views[0].name` must be a string, not an integer")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|l| l.contains("f.toml:7: `views[0].watch` must be a list of tables")),
        "{p:?}"
    );
}

#[test]
fn coalesce_above_max_wait_is_rejected() {
    let src = GOOD.replace("coalesce = \"200ms\"", "coalesce = \"3s\"");
    let p = problems(&src);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].contains("coalesce (3s) must not exceed max_wait (2s)"),
        "{p:?}"
    );
}

#[test]
fn invalid_toml_points_at_the_line() {
    let p = problems("[source]\nkind = \"postgres\nurl = 1\n");
    assert_eq!(p.len(), 1);
    assert!(p[0].starts_with("f.toml:2: not valid TOML"), "{p:?}");
}

#[test]
fn dollar_escapes_and_literal_text_survive_expansion() {
    let src = GOOD.replace(
        "${TARGET_URL}",
        "postgres://u:pa$$word@h/db?application_name=$y",
    );
    let c = parse(&src, "f.toml", &env).unwrap();
    assert_eq!(
        c.target.url.expose(),
        "postgres://u:pa$word@h/db?application_name=$y"
    );
}

#[test]
#[cfg(feature = "kafka")]
fn kafka_source_sinks_and_changefeed_are_read_by_their_crates() {
    let src = r#"
[source]
kind = "kafka"
brokers = ["127.0.0.1:9092", "127.0.0.1:9093"]
topics = ["tidb-changes"]
group = "freshen"
format = "canal-json"
ack = "on-enqueue"

[target]
url = "${TARGET_URL}"

[[views]]
name = "v"
watch = [{ table = "demo.readings", key = ["device"] }]
rebuild = ["SELECT $1"]

[[sinks]]
kind = "kafka"
brokers = "127.0.0.1:9092"
topic = "changes"

[changefeed]
path = "/tmp/feed.redb"
"#;
    let c = parse(src, "f.toml", &env).unwrap();
    assert_eq!(c.source.kind(), "kafka");
    let shown = format!("{:?}", c.source);
    assert!(shown.contains("\"tidb-changes\""), "{shown}");
    assert!(shown.contains("127.0.0.1:9092,127.0.0.1:9093"), "{shown}");
    assert_eq!(c.ack, AckPolicy::OnEnqueue);
    assert_eq!(c.sinks.len(), 1);
    assert!(c.changefeed.is_some());
    assert_eq!(c.consumers(), 3);
    assert_eq!(c.watched_tables(), [("demo".into(), "readings".into())]);
}

#[test]
#[cfg(feature = "kafka")]
fn problems_inside_delegated_tables_have_lines_too() {
    let src = r#"
[source]
kind = "kafka"
brokers = "${MISSING_BROKERS}"
topics = ["t"]
group = "g"
format = "canal-json"

[[views]]
name = "v"
watch = [{ table = "readings", key = ["device"] }]
rebuild = ["SELECT $1"]

[changefeed]
path = "/tmp/feed.redb"
durabilty = "fsync"
"#;
    let p = problems(src);
    assert!(
        p.iter()
            .any(|l| l.starts_with("f.toml:4: environment variable `MISSING_BROKERS` is not set")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|l| l.starts_with("f.toml:16: in `changefeed`") && l.contains("durabilty")),
        "{p:?}"
    );
    assert!(
        p.iter().any(|l| l.contains("needs `target`")),
        "a kafka source needs a target: {p:?}"
    );
}

#[test]
fn a_changefeed_listener_flag_that_is_not_a_boolean_is_a_problem_on_its_line() {
    let src = "[source]\nkind = \"postgres\"\nurl = \"${DATABASE_URL}\"\ntables = [\"public.orders\"]\n[changefeed]\npath = \"/tmp/f.redb\"\n[changefeed.http]\ntransaction_markers = \"yes\"\n";
    let p = problems(src);
    assert!(
        p.iter()
            .any(|l| l.starts_with("f.toml:8: in `changefeed`") && l.contains("expected a boolean")),
        "{p:?}"
    );
}

#[test]
fn a_changefeed_alone_needs_no_views() {
    let src = "[source]\nkind = \"postgres\"\nurl = \"${DATABASE_URL}\"\ntables = [\"public.orders\"]\n[changefeed]\npath = \"/tmp/f.redb\"\n";
    let c = parse(src, "f.toml", &env).unwrap();
    assert!(c.views.is_empty());
    assert_eq!(c.watched_tables(), [("public".into(), "orders".into())]);
    assert_eq!(c.consumers(), 1);
}

#[test]
#[cfg(feature = "pulsar")]
fn a_pulsar_source_is_read_by_its_crate() {
    let src = r#"
[source]
kind = "pulsar"
url = "pulsar://127.0.0.1:6650"
topic = "ticdc"
subscription = "freshen"

[target]
url = "${TARGET_URL}"

[[views]]
name = "v"
watch = [{ table = "demo.readings", key = ["device"] }]
rebuild = ["SELECT $1"]
"#;
    let c = parse(src, "f.toml", &env).unwrap();
    assert_eq!(c.source.kind(), "pulsar");
    let shown = format!("{:?}", c.source);
    assert!(shown.contains("subscription: \"freshen\""), "{shown}");
}

/// The values that passed `check --offline` and then panicked `run`: each is now a
/// problem on its own line, all reported at once.
#[test]
fn huge_numbers_are_problems_with_lines_not_panics() {
    const HUGE: &str = "18446744073709551615";
    // TOML integers stop at i64::MAX.
    const BIG: &str = "9223372036854775807";
    let src = format!(
        r#"
[source]
kind = "postgres"
url = "postgres://app@db/app?connect_timeout={HUGE}"
status_interval = "{HUGE}s"

[target]
url = "postgres://app@db/app?connect_timeout=99999"

[http]
header_timeout = "{HUGE}s"
request_timeout = "{HUGE}s"
max_connections = {BIG}

[defaults]
coalesce = "{HUGE}s"
max_wait = "{HUGE}s"
backoff = {{ base = "{HUGE}s", max = "{HUGE}s" }}

[[views]]
name = "v"
watch = [{{ table = "t", key = ["k"] }}]
rebuild = ["SELECT $1"]
reconcile = {{ every = "{HUGE}s", keys = "SELECT 1" }}

[changefeed]
path = "/tmp/f.redb"
[changefeed.retention]
interval_secs = {BIG}
[changefeed.http]
header_timeout_ms = {BIG}
"#
    );
    let p = problems(&src);
    let want = [
        "f.toml:4: in `source`: url: invalid PostgreSQL URL: connect_timeout must be at most 3600",
        "f.toml:5: in `source`: status_interval: must be between 1ms and 1h",
        "f.toml:8: `target.url`: invalid PostgreSQL URL: connect_timeout must be at most 3600",
        "f.toml:11: `http.header_timeout` must be between 1s and 5m",
        "f.toml:12: `http.request_timeout` must be between 1s and 1h",
        "f.toml:13: `http.max_connections` must be between 1 and 65536",
        "f.toml:16: `defaults.coalesce` must be at most 1year",
        "f.toml:17: `defaults.max_wait` must be at most 1year",
        "f.toml:18: `defaults.backoff.base` must be at most 1year",
        "f.toml:18: `defaults.backoff.max` must be at most 1year",
        "f.toml:24: `reconcile.every` must be at most 1year",
        "f.toml:29: in `changefeed`: changefeed.retention.interval_secs: between 1 and 86400",
        "f.toml:31: in `changefeed`: changefeed.http.header_timeout_ms: between 1000 and 300000",
    ];
    for w in want {
        assert!(
            p.iter().any(|l| l.starts_with(w)),
            "missing {w:?} in\n{}",
            p.join("\n")
        );
    }
}

#[test]
#[cfg(all(feature = "kafka", feature = "pulsar"))]
fn huge_numbers_in_kafka_and_pulsar_tables_are_problems_on_their_lines() {
    let kafka = r#"
[source]
kind = "kafka"
brokers = "127.0.0.1:9092"
topics = ["t"]
group = "g"
format = "canal-json"
max_batch = 9223372036854775807
batch_linger_ms = 9223372036854775807
session_timeout_ms = 4294967295

[target]
url = "postgres://app@db/app"

[[sinks]]
kind = "kafka"
brokers = "127.0.0.1:9092"
topic = "s"
delivery_timeout_ms = 4294967295
"#;
    let p = problems(kafka);
    for w in [
        "f.toml:8: in `source`: max_batch must be between 1 and",
        "f.toml:9: in `source`: batch_linger_ms must be at most 60000",
        "f.toml:10: in `source`: session_timeout_ms must be between 1000 and 3600000",
        "f.toml:19: in `sinks[0]`: delivery_timeout_ms must be between 1 and 2147483647",
    ] {
        assert!(
            p.iter().any(|l| l.starts_with(w)),
            "missing {w:?} in\n{}",
            p.join("\n")
        );
    }
    let pulsar = r#"
[source]
kind = "pulsar"
url = "pulsar://127.0.0.1:6650"
topic = "t"
subscription = "s"
batch_linger_ms = 9223372036854775807
receiver_queue = 4294967295

[changefeed]
path = "/tmp/f.redb"
"#;
    let p = problems(pulsar);
    for w in [
        "f.toml:7: in `source`: batch_linger_ms must be at most 60000",
        "f.toml:8: in `source`: receiver_queue must be between 2 and 1000000",
    ] {
        assert!(
            p.iter().any(|l| l.starts_with(w)),
            "missing {w:?} in\n{}",
            p.join("\n")
        );
    }
}

/// A kind this build left out is named with the feature that adds it, not as a typo.
#[test]
fn a_kind_left_out_of_the_build_names_its_feature() {
    for (kind, feature) in [("mysql", "mysql"), ("kafka", "kafka"), ("pulsar", "pulsar")] {
        let src = format!("[source]\nkind = \"{kind}\"\n[changefeed]\npath = \"/tmp/f.redb\"\n");
        let built = matches!(crate::kinds::builtin().sources.find(kind), Found::Built(..));
        match parse(&src, "f.toml", &env) {
            Err(e) if !built => {
                let want = format!(
                    "f.toml:2: `source.kind` \"{kind}\" is not built into this freshen: build it with `--features {feature}`"
                );
                assert!(e.lines().contains(&want), "{:?}", e.lines());
            }
            Err(e) => assert!(
                e.lines().iter().all(|l| !l.contains("not built")),
                "{:?}",
                e.lines()
            ),
            Ok(_) => panic!("{kind}: the source's required keys are missing"),
        }
    }
}

/// So is a sink kind, and the key stream, where this build left them out.
#[test]
fn a_sink_or_key_stream_left_out_of_the_build_names_its_feature() {
    let src = r#"[source]
kind = "postgres"
url = "postgres://app@db/app"

[[views]]
name = "v"
watch = [{ table = "readings", key = ["device"] }]
rebuild = ["SELECT 1 WHERE $1::text IS NOT NULL"]

[[sinks]]
kind = "kafka"
brokers = "k:9092"
topic = "changes"

[key_stream]
brokers = "k:9092"
topic = "keys"
group = "w"
"#;
    let sink_built = matches!(
        crate::kinds::builtin().sinks.find("kafka"),
        Found::Built(..)
    );
    let key_stream_built = cfg!(feature = "kafka");
    let lines = match parse(src, "f.toml", &env) {
        Ok(c) => {
            assert_eq!(c.sinks.len(), 1);
            assert!(c.key_stream.is_some());
            Vec::new()
        }
        Err(e) => e.lines(),
    };
    let sink = "f.toml:11: `sinks[0].kind` \"kafka\" is not built into this freshen: build it with `--features kafka`";
    let key_stream =
        "f.toml:15: [key_stream] is not built into this freshen: build it with `--features kafka`";
    assert_eq!(lines.iter().any(|l| l == sink), !sink_built, "{lines:?}");
    assert_eq!(
        lines.iter().any(|l| l == key_stream),
        !key_stream_built,
        "{lines:?}"
    );
    assert_eq!(
        lines.len(),
        usize::from(!sink_built) + usize::from(!key_stream_built)
    );
}

const JOINED: &str = r#"
[source]
kind = "postgres"
url = "postgres://app@db/app"

[[views]]
name = "account_mrr"
static = ["public.countries", "currencies"]
watch = [
  { table = "subscriptions", key = ["account_id"] },
  { table = "plans", key = ["id"], keys = "SELECT account_id FROM subscriptions WHERE plan_id = $1" },
]
rebuild = ["SELECT $1"]
"#;

#[test]
fn fan_out_entries_and_static_tables_are_read() {
    let c = parse(JOINED, "f.toml", &env).unwrap();
    let v = &c.views[0];
    assert_eq!(v.arity(), 1);
    assert_eq!(v.direct().count(), 1);
    let f: Vec<&Watch> = v.fanouts().collect();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].table, "plans");
    assert_eq!(
        f[0].keys.as_deref(),
        Some("SELECT account_id FROM subscriptions WHERE plan_id = $1")
    );
    assert_eq!(
        v.static_tables,
        [
            ("public".to_string(), "countries".to_string()),
            ("public".to_string(), "currencies".to_string())
        ]
    );
    // A fan-out's parent key may differ in arity from the view's key.
    let wide = JOINED.replace("key = [\"id\"]", "key = [\"id\", \"region\"]");
    assert!(parse(&wide, "f.toml", &env).is_ok());
}

#[test]
fn fan_out_mistakes_are_problems_with_lines() {
    let only_fanout = JOINED.replace(
        "  { table = \"subscriptions\", key = [\"account_id\"] },\n",
        "",
    );
    let p = problems(&only_fanout);
    assert!(
        p.iter()
            .any(|l| l.contains("at least one watched table must carry the view's key")),
        "{p:?}"
    );
    let p = problems(&JOINED.replace(
        "keys = \"SELECT account_id FROM subscriptions WHERE plan_id = $1\"",
        "keys = \"  \"",
    ));
    assert!(
        p.iter()
            .any(|l| l.starts_with("f.toml:11:") && l.contains("`keys` must be a query")),
        "{p:?}"
    );
    let p = problems(&JOINED.replace("\"currencies\"", "\"a.b.c\""));
    assert!(
        p.iter()
            .any(|l| l.starts_with("f.toml:8:") && l.contains("`static` entry `a.b.c`")),
        "{p:?}"
    );
    let p = problems(&JOINED.replace("keys = ", "kyes = "));
    assert!(p.iter().any(|l| l.contains("kyes")), "{p:?}");
}

#[test]
fn an_admin_token_is_long_enough_and_never_printed() {
    let src = |token: &str| {
        format!(
            "[source]\nkind = \"postgres\"\nurl = \"postgres://a@h/d\"\n[http]\nadmin_token = \"{token}\"\n[[views]]\nname = \"v\"\nwatch = [{{ table = \"t\", key = [\"k\"] }}]\nrebuild = [\"SELECT $1\"]\n"
        )
    };
    let env = |_: &str| None;
    let e = parse(&src("short"), "f.toml", &env)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("f.toml:5: `http.admin_token` must be at least 16"),
        "{e}"
    );
    assert!(!e.contains("short"), "{e}");
    let c = parse(&src("a-long-enough-s3cret"), "f.toml", &env).unwrap();
    let http = c.http.unwrap();
    assert_eq!(
        http.admin_token.as_ref().unwrap().expose(),
        "a-long-enough-s3cret"
    );
    assert!(!format!("{http:?}").contains("s3cret"));
}

const QUERY_VIEW: &str = r#"
[source]
kind = "postgres"
url = "${DATABASE_URL}"

[[views]]
name = "device_totals"
watch = [ { table = "readings", key = ["device"] } ]
into = "device_totals"
query = "SELECT device, sum(value) AS total, count(*) AS n FROM readings WHERE device = ANY($1) GROUP BY device"
"#;

#[test]
fn a_query_view_resolves_and_batches_by_default() {
    let c = parse(QUERY_VIEW, "f.toml", &env).unwrap();
    let v = &c.views[0];
    let q = v.query.as_ref().expect("query mode");
    assert_eq!(q.into, ("public".to_string(), "device_totals".to_string()));
    assert!(q.query.contains("ANY($1)"), "{}", q.query);
    assert_eq!(q.line, Some(10));
    assert!(v.rebuild.is_empty());
    assert_eq!(v.rebuild_batch, Some(freshen::plug::DEFAULT_QUERY_BATCH));
    let mine = QUERY_VIEW.replace("into = ", "rebuild_batch = 8\ninto = ");
    let c = parse(&mine, "f.toml", &env).unwrap();
    assert_eq!(
        c.views[0].rebuild_batch,
        Some(8),
        "the batch setting is honoured"
    );
}

#[test]
fn a_view_says_how_to_rebuild_in_exactly_one_way() {
    // Both ways at once.
    let both = QUERY_VIEW.replace(
        "into = ",
        "rebuild = [\"DELETE FROM device_totals WHERE device = $1\"]\ninto = ",
    );
    let p = problems(&both);
    assert!(
        p.iter().any(|l| l.starts_with(
            "f.toml:9: view `device_totals`: has both `rebuild` statements and `into`/`query`"
        )),
        "{p:#?}"
    );
    // Neither.
    let neither: String = QUERY_VIEW
        .lines()
        .filter(|l| !l.starts_with("into") && !l.starts_with("query"))
        .collect::<Vec<_>>()
        .join("\n");
    let p = problems(&neither);
    assert!(
        p.iter().any(|l| l
            .starts_with("f.toml:6: `views[0]` needs `rebuild` (how to recompute a key: `into`")),
        "{p:#?}"
    );
    // Half of query mode, each half.
    let no_into = QUERY_VIEW.replace("into = \"device_totals\"\n", "");
    let p = problems(&no_into);
    assert!(p.iter().any(|l| l.contains("needs `into`")), "{p:#?}");
    let no_query: String = QUERY_VIEW
        .lines()
        .filter(|l| !l.starts_with("query"))
        .collect::<Vec<_>>()
        .join("\n");
    let p = problems(&no_query);
    assert!(p.iter().any(|l| l.contains("needs `query`")), "{p:#?}");
}

#[test]
fn query_mode_problems_are_listed_at_once_with_their_lines() {
    let src = r#"
[source]
kind = "postgres"
url = "${DATABASE_URL}"

[[views]]
name = "a"
watch = [ { table = "readings", key = ["device", "site"] } ]
into = "x.y.z"
query = "SELECT device, site FROM readings WHERE device = ANY($1)"
keys_per_transaction = 4

[[views]]
name = "b"
watch = [ { table = "readings", key = ["device"] } ]
into = "t"
query = "  "
"#;
    let p = problems(src);
    let want = [
        "f.toml:9: view `a`: `into` `x.y.z` is not a table name",
        "f.toml:10: view `a`: the query must select its batch of keys with one array per key part (device = ANY($1) AND site = ANY($2)), but never uses $2",
        "f.toml:11: view `a`: `keys_per_transaction` is for per-key statements; a query rebuilds batches of keys",
        "f.toml:17: view `b`: `query` must not be empty",
    ];
    for w in want {
        assert!(
            p.iter().any(|l| l.starts_with(w)),
            "missing {w:?} in\n{}",
            p.join("\n")
        );
    }
}

#[test]
fn query_mode_needs_a_postgres_target_and_source() {
    // Another PostgreSQL database: the query reads the source and writes there.
    let other = QUERY_VIEW.replace(
        "[[views]]",
        "[target]\nurl = \"postgres://app@elsewhere/app\"\n\n[[views]]",
    );
    assert!(
        parse(&other, "f.toml", &env).is_ok(),
        "{:#?}",
        problems(&other)
    );
    let same = QUERY_VIEW.replace(
        "[[views]]",
        "[target]\nurl = \"${DATABASE_URL}\"\n\n[[views]]",
    );
    assert!(
        parse(&same, "f.toml", &env).is_ok(),
        "the source database named again is fine"
    );
    #[cfg(feature = "mysql")]
    {
        let mysql = QUERY_VIEW.replace(
            "[[views]]",
            "[target]\nurl = \"mysql://app@db/app\"\n\n[[views]]",
        );
        let p = problems(&mysql);
        assert!(
            p.iter().any(|l| l.starts_with("f.toml:13: view `device_totals`: `query` writes with PostgreSQL statements; on a MySQL/MariaDB target")),
            "{p:#?}"
        );
        // A view left to inference is told that inference needs PostgreSQL.
        let inferred: String = mysql
            .lines()
            .filter(|l| !l.starts_with("watch"))
            .collect::<Vec<_>>()
            .join("\n");
        let p = problems(&inferred);
        assert!(
            p.iter().any(|l| l.contains(
                "write hand-written `rebuild` statements with their `watch` entries (freshen infers what a view watches only on PostgreSQL)"
            )),
            "{p:#?}"
        );
    }
}

#[test]
fn a_polling_source_takes_no_changefeed_snapshot() {
    let src = |snapshot: &str| {
        format!(
            "[source]\nkind = \"postgres-incremental\"\nurl = \"postgres://a@h/d\"\ncursor = \"updated_at\"\n[changefeed]\npath = \"/tmp/f.redb\"\n{snapshot}\n"
        )
    };
    let env = |_: &str| None;
    let e = parse(&src("snapshot = \"initial\""), "f.toml", &env)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("changefeed.snapshot: a postgres-incremental source"),
        "{e}"
    );
    assert!(parse(&src(""), "f.toml", &env).is_ok());
}

#[cfg(feature = "mysql")]
#[test]
fn table_names_are_read_by_the_source_databases_rules() {
    let file = |url: &str, table: &str| {
        format!(
            "[source]\nkind = \"mysql\"\nname = \"t\"\nurl = \"{url}\"\nserver_id = 4242\n\n[[views]]\nname = \"v\"\nwatch = [ {{ table = \"{table}\", key = [\"id\"] }} ]\nrebuild = \"SELECT 1\"\n"
        )
    };
    let env = |_: &str| None;
    let watched = |url: &str, table: &str| {
        parse(&file(url, table), "f.toml", &env)
            .map(|c| c.watched_tables())
            .map_err(|e| e.to_string())
    };
    // MySQL keeps case (table names are case-sensitive on Linux servers) and an
    // unqualified table is in the URL's database, never PostgreSQL's `public`.
    assert_eq!(
        watched("mysql://u@h/app", "Sales.Orders").unwrap(),
        [("Sales".to_string(), "Orders".to_string())]
    );
    assert_eq!(
        watched("mysql://u@h/app", "Orders").unwrap(),
        [("app".to_string(), "Orders".to_string())]
    );
    assert_eq!(
        watched("mysql://u@h/app", "`my.db`.`Or``ders`").unwrap(),
        [("my.db".to_string(), "Or`ders".to_string())]
    );
    let e = watched("mysql://u@h/app", "a.b.c").unwrap_err();
    assert!(
        e.contains("`a.b.c` is not a table name (\"database.table\" or \"table\")"),
        "{e}"
    );
    // Offline with the URL's variable unset, the database is not known: an unqualified
    // name waits for `run` instead of being refused.
    let offline = file("${MYSQL_URL}", "Orders");
    assert!(
        super::parse_with(&offline, "f.toml", &env, crate::kinds::builtin(), true).is_ok(),
        "{:?}",
        super::parse_with(&offline, "f.toml", &env, crate::kinds::builtin(), true).err()
    );
    // PostgreSQL folds what is not quoted, as the server does.
    let pg = GOOD.replace("\"readings\"", "\"Readings\"");
    let c = parse(&pg, "f.toml", &self::env).unwrap();
    assert!(
        c.watched_tables()
            .contains(&("public".to_string(), "readings".to_string())),
        "{:?}",
        c.watched_tables()
    );
}

#[test]
fn a_query_view_may_leave_watch_to_inference_but_a_rebuild_view_may_not() {
    let inferred: String = QUERY_VIEW
        .lines()
        .filter(|l| !l.starts_with("watch"))
        .collect::<Vec<_>>()
        .join("\n");
    let c = parse(&inferred, "f.toml", &env).unwrap();
    assert!(c.views[0].watch.is_empty());
    assert!(c.views[0].key_names.is_empty(), "named once inferred");
    // A plain query (no parameter: the SELECT of a materialized view) gets its batch
    // filter from freshen, on the `key` the file gives or the target's primary key.
    let plain = inferred.replace("WHERE device = ANY($1) ", "");
    let c = parse(&plain, "f.toml", &env).unwrap();
    assert!(!c.views[0].query.as_ref().unwrap().query.contains('$'));
    assert!(
        c.views[0].key_names.is_empty(),
        "the target's key, once inferred"
    );
    let keyed = plain.replace("into = ", "key = [\"device\"]\ninto = ");
    let c = parse(&keyed, "f.toml", &env).unwrap();
    assert_eq!(c.views[0].key_names, ["device"]);
    // A plain query's sweep needs no `keys`: it is one whole-table diff (listing, should
    // it have to, from the query and the target).
    let swept = keyed.replace("into = ", "reconcile = { every = \"1h\" }\ninto = ");
    let mut c = parse(&swept, "f.toml", &env).unwrap();
    assert_eq!(
        c.views[0].reconcile.as_ref().map(|r| r.keys.clone()),
        Some(None)
    );
    c.views[0].key_names = vec!["device".into()];
    assert_eq!(
        c.views[0].reconcile_keys().as_deref(),
        Some(
            "SELECT \"device\" FROM (\nSELECT device, sum(value) AS total, count(*) AS n FROM readings GROUP BY device\n) AS freshen_q UNION SELECT \"device\" FROM \"public\".\"device_totals\""
        )
    );
    // A query that uses parameters selects its batch itself: from $1 on.
    let p = problems(&inferred.replace("ANY($1)", "ANY($2)"));
    assert!(
        p.iter()
            .any(|l| l.contains("(key = ANY($1)), but never uses $1")),
        "{p:#?}"
    );
    // `key` is for a query's target: statements take theirs from the watch entries.
    let p = problems(&GOOD.replace(
        "name = \"site_totals\"",
        "name = \"site_totals\"\nkey = [\"site\"]",
    ));
    assert!(
        p.iter()
            .any(|l| l.contains("`key` names the key columns of `into` for a `query`")),
        "{p:#?}"
    );
    // Hand-written statements name their tables: inference reads a query's plan.
    let p = problems(
        "[source]\nkind = \"postgres\"\nurl = \"${DATABASE_URL}\"\n[[views]]\nname = \"v\"\nrebuild = [\"SELECT $1::int\"]\n",
    );
    assert!(
        p.iter().any(|l| l.contains("needs `watch`")
            && l.contains("only a view rebuilt by `query` on PostgreSQL may leave it out")),
        "{p:#?}"
    );
}

/// A changefeed and a file's `[[redact]]` entries after [`GOOD`]'s source and views.
fn with_redact(entries: &str) -> String {
    format!("{GOOD}\n[changefeed]\npath = \"/nonexistent/feed.db\"\n{entries}")
}

fn redact_env(name: &str) -> Option<String> {
    match name {
        "PII_KEY" => Some("a-key-of-32-bytes-for-the-tests!".into()),
        "SHORT_KEY" => Some("short".into()),
        other => env(other),
    }
}

#[test]
fn redact_entries_resolve_into_rules() {
    let src = with_redact(
        r#"
[[redact]]
table = "public.users"
column = "email"
action = "hash"
key_env = "PII_KEY"

[[redact]]
table = "users"
column = "card"
action = "mask"
keep = 4

[[redact]]
table = "users"
column = "note"
action = "truncate"
length = 10

[[redact]]
table = "users"
column = "ssn"
action = "drop"

[[redact]]
table = "users"
column = "phone"
action = "mask"
"#,
    );
    let c = parse(&src, "f.toml", &redact_env).unwrap();
    let rules = c.redact.rules();
    let got: Vec<String> = rules
        .iter()
        .map(|r| format!("{:?}.{}.{} {:?}", r.schema, r.table, r.column, r.action))
        .collect();
    assert_eq!(got.len(), 5, "{got:?}");
    assert!(
        got[0].starts_with("Some(\"public\").users.email Hash"),
        "{got:?}"
    );
    assert_eq!(got[1], "None.users.card Mask(KeepLast(4))");
    assert_eq!(got[2], "None.users.note Truncate(10)");
    assert_eq!(got[3], "None.users.ssn Drop");
    assert_eq!(got[4], "None.users.phone Mask(Fixed(8))");
    // The key is read, never shown.
    let debug = format!("{c:?}");
    assert!(!debug.contains("a-key-of-32"), "{debug}");
    // The rules hash with the key from the environment.
    let e = freshen::RowEvent::new("public", "users", freshen::Op::Insert)
        .with_new(freshen::Row::from_pairs([("email", "ann@example.com")]));
    let out = c.redact.apply(&e).unwrap();
    assert_eq!(
        out.new.unwrap().get("email"),
        Some(&freshen::Value::text(freshen_codec::hmac_hex(
            &freshen_codec::HashKey::new(b"a-key-of-32-bytes-for-the-tests!".to_vec()),
            "ann@example.com"
        )))
    );
}

#[test]
fn redact_problems_are_listed_at_once_with_their_lines() {
    let src = with_redact(
        r#"
[[redact]]
table = "users"
column = "email"
action = "hush"

[[redact]]
table = "users"
column = "email2"
action = "hash"
key_env = "NO_SUCH_KEY"

[[redact]]
table = "users"
column = "email3"
action = "hash"
key_env = "SHORT_KEY"

[[redact]]
table = "users"
column = "card"
action = "mask"
length = 4
keep = 2

[[redact]]
table = "users"
column = "note"
action = "truncate"

[[redact]]
table = "users"
column = "ssn"
action = "drop"
length = 3

[[redact]]
table = "users"
column = "ssn"
action = "drop"

[[redact]]
table = "users"
column = "zip"
action = "truncate"
length = 0
colour = "red"
"#,
    );
    let base = GOOD.lines().count() + 4;
    let p = parse(&src, "f.toml", &redact_env).unwrap_err().lines();
    let at = |n: usize| format!("f.toml:{}: ", base + n);
    let want = [
        format!(
            "{}`redact[0].action` must be one of `drop`, `mask`, `hash`, `truncate`, not `hush` (did you mean `hash`?)",
            at(4)
        ),
        format!(
            "{}environment variable `NO_SUCH_KEY` is not set (used by `redact[1].key_env`)",
            at(10)
        ),
        format!(
            "{}`redact[2].key_env`: the key in `SHORT_KEY` is 5 bytes long; use at least 16",
            at(16)
        ),
        format!("{}`redact[3]`: a mask has either `length`", at(23)),
        format!("{}`redact[4]` needs `length`", at(25)),
        format!(
            "{}`redact[5].length` does not apply to action `drop`",
            at(34)
        ),
        format!(
            "{}`redact[6]`: column `ssn` of `users` (in any schema) is already redacted by the entry on line {} (`users` (in any schema))",
            at(36),
            base + 30
        ),
        format!(
            "{}`redact[7].length` must be between 1 and 65536, not 0",
            at(45)
        ),
        format!("{}unknown key `colour` in `redact[7]`", at(46)),
    ];
    for w in &want {
        assert!(
            p.iter().any(|l| l.starts_with(w.as_str())),
            "missing {w:?} in\n{}",
            p.join("\n")
        );
    }
    assert_eq!(p.len(), want.len(), "{}", p.join("\n"));
}

/// A rule's table is read as the source reads table names: `People` is `people`, a
/// quoted part keeps its case, `people` (any schema) covers `public.people`. Two rules
/// for one column of one table, however spelt, are one problem naming both lines.
#[test]
fn redact_rules_are_resolved_before_they_are_compared() {
    let entry = |table: &str, column: &str| {
        format!("\n[[redact]]\ntable = '{table}'\ncolumn = \"{column}\"\naction = \"drop\"\n")
    };
    let src = with_redact(
        &[
            entry("people", "ssn"),
            entry("public.people", "ssn"),
            entry("People", "email"),
            entry("people", "email"),
            entry("\"People\"", "email"),
            entry("audit.people", "phone"),
            entry("public.people", "phone"),
            entry("PUBLIC.\"Staff\"", "ssn"),
            entry("public.\"Staff\"", "ssn"),
        ]
        .concat(),
    );
    let base = GOOD.lines().count() + 4;
    let line = |entry: usize| base + 1 + entry * 5;
    let p = parse(&src, "f.toml", &redact_env).unwrap_err().lines();
    let want = [
        format!(
            "f.toml:{}: `redact[1]`: column `ssn` of `public.people` is already redacted by the entry on line {} (`people` (in any schema)): a column takes one rule",
            line(1),
            line(0)
        ),
        format!(
            "f.toml:{}: `redact[3]`: column `email` of `people` (in any schema) is already redacted by the entry on line {} (`people` (in any schema))",
            line(3),
            line(2)
        ),
        format!(
            "f.toml:{}: `redact[8]`: column `ssn` of `public.Staff` is already redacted by the entry on line {} (`public.Staff`)",
            line(8),
            line(7)
        ),
    ];
    for w in &want {
        assert!(
            p.iter().any(|l| l.starts_with(w.as_str())),
            "missing {w:?} in\n{}",
            p.join("\n")
        );
    }
    assert_eq!(p.len(), want.len(), "{}", p.join("\n"));

    // What is left apply as the source names tables.
    let src = with_redact(&[entry("People", "email"), entry("\"People\"", "email")].concat());
    let c = parse(&src, "f.toml", &redact_env).unwrap();
    let row = |table: &str| {
        freshen::RowEvent::new("public", table, freshen::Op::Insert)
            .with_new(freshen::Row::from_pairs([("email", "ann@example.com")]))
    };
    for table in ["people", "People"] {
        let out = c.redact.apply(&row(table)).expect(table);
        assert_eq!(out.new.unwrap().get("email"), None, "{table}: dropped");
    }
}

#[test]
#[cfg(feature = "kafka")]
fn an_outbox_sink_lists_every_problem_with_its_line() {
    let good = r#"
[source]
kind = "postgres"
url = "postgres://app@db/app"
tables = ["public.orders"]

[[sinks]]
kind = "kafka-outbox"
brokers = "127.0.0.1:9092"
table = "public.outbox"
dead_letter_topic = "outbox.dead-letter"
"#;
    let c = parse(good, "f.toml", &env).unwrap();
    assert_eq!(c.sinks.len(), 1);
    assert_eq!(
        c.watched_tables(),
        [
            ("public".into(), "orders".into()),
            ("public".into(), "outbox".into())
        ],
        "the outbox table is captured without being listed"
    );
    let bad = r#"
[source]
kind = "postgres"
url = "postgres://app@db/app"
tables = ["public.outbox"]

[[sinks]]
kind = "kafka-outbox"
brokers = "127.0.0.1:9092"
table = "outbox"
topic = "events/{routedByValue}"
dead_letter_topic = "outbox.dead-letter"
type_column = "aggregateid"

[[sinks]]
kind = "kafka-outbox"
brokers = "127.0.0.1:9092"
table = "public.outbox"
payload_encoding = "xml"
"#;
    let p = problems(bad);
    let at = |line: &str, words: &str| {
        assert!(
            p.iter()
                .any(|l| l.starts_with(&format!("f.toml:{line}:")) && l.contains(words)),
            "no `{words}` at line {line}: {p:#?}"
        );
    };
    at("10", "table \"outbox\" must be written schema.table");
    at("11", "topic \"events/{routedByValue}\"");
    at(
        "13",
        "type_column names column \"aggregateid\", as aggregate_id_column does",
    );
    at("19", "unknown variant `xml`");
}

#[test]
fn set_statements_go_with_hand_written_statements_only() {
    let set = GOOD.replace(
        "reconcile = { every = \"1h\"",
        "rebuild_set = [\"DELETE FROM device_totals WHERE device = ANY($1)\"]\nreconcile = { every = \"1h\"",
    );
    let c = parse(&set, "f.toml", &env).unwrap();
    assert_eq!(
        c.views[0].rebuild_set,
        ["DELETE FROM device_totals WHERE device = ANY($1)"]
    );
    assert!(c.views[1].rebuild_set.is_empty(), "unset: none");
    let spec = c.views[0].spec(None);
    assert_eq!(
        spec.rebuild_set, c.views[0].rebuild_set,
        "handed to the target"
    );

    // With a query freshen writes the set statement itself; an empty one is nothing.
    let with_query = QUERY_VIEW.replace("into = ", "rebuild_set = \"SELECT 1\"\ninto = ");
    let empty = GOOD.replace("rebuild_batch = 50", "rebuild_set = [\" \"]");
    let p = [problems(&with_query), problems(&empty)].concat();
    for w in [
        "f.toml:9: view `device_totals`: `rebuild_set` is for hand-written `rebuild` statements",
        "f.toml:35: view `site_totals`: `rebuild_set` statements must not be empty",
    ] {
        assert!(
            p.iter().any(|l| l.starts_with(w)),
            "missing {w:?} in\n{}",
            p.join("\n")
        );
    }
}
