//! Redaction on every output, proven with a canary: every clear value in a redacted
//! column — primary keys included — carries `CNRY`, and after snapshots (the
//! changefeed's and each sink's, at start and on demand), live changes (TOASTed values,
//! unchanged TOAST, a primary-key change, a delete, a TRUNCATE, a streamed and spilled
//! transaction), outbox rows (relayed and dead-lettered), a consumer group's dead
//! letters and a restart, the canary is searched for in every place freshen writes:
//! the changefeed's store and every file left in its directory, every HTTP surface
//! (long poll, SSE, WebSocket, snapshot progress, groups and dead letters, `/status`,
//! `/healthz`, both `/metrics`, error bodies), every Kafka record's key, value and
//! headers (sink, outbox, dead letters), the log at debug level, and the bookkeeping
//! tables freshen writes in the database. Positive controls prove each search saw
//! data: a clear column (`city`) and the canary's hash are found where rows go.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use freshen_testenv::refresher::eventually;
use freshen_testenv::{KafkaServer, PgServer};
use futures_util::{SinkExt, StreamExt};
use rdkafka::message::{Headers, Message};
use serde_json::{Value, json};
use support::*;
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// What every clear value in a redacted column carries; no output may hold it.
const CANARY: &str = "CNRY";
/// The hash rules' key (from the environment, as in production).
const KEY: &str = "canary-test-key-0123456789abcdef";
const DEADLINE: Duration = Duration::from_secs(60);
const TOPICS: [&str; 3] = ["people-out", "outbox.event.person", "outbox.dlq"];
/// Rows there before freshen starts: its snapshots read them.
const PEOPLE: usize = 24;
/// A clear column: found wherever rows go, so a search that finds no canary saw rows.
const VISIBLE: &str = "Visible-Oslo";

const SCHEMA: &str = "
CREATE TABLE people (id text PRIMARY KEY, ssn text, bio text, city text NOT NULL);
CREATE TABLE visits (id bigint PRIMARY KEY, person text NOT NULL, note text);
CREATE TABLE outbox (id text PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload text);
-- One person's rebuild always fails: its key is quarantined, and shown.
CREATE TABLE people_copy (id text PRIMARY KEY CHECK (id <> 'CNRY-ID-0005'), city text NOT NULL);
";

/// The key whose rebuild always fails (the CHECK above).
const POISONED: &str = "CNRY-ID-0005";

/// The tables the test made: the rest of the database is freshen's bookkeeping.
const OURS: [&str; 4] = ["people", "visits", "outbox", "people_copy"];

fn config(pg: &str, brokers: &str, http: &str, feed: &str, store: &Path) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{pg}"
slot = "freshen_canary"
publication = "freshen_canary"
tables = ["public.people", "public.visits"]
status_interval = "50ms"
# Every streamed transaction goes to a spill file (in TMPDIR: the test's directory).
stream_memory_mb = 0

[http]
listen = "{http}"

[defaults]
coalesce = "10ms"
max_wait = "200ms"
poison_after = 2
backoff = {{ base = "10ms", max = "100ms" }}

[[views]]
name = "people_copy"
watch = [{{ table = "public.people", key = ["id"] }}]
reconcile = {{ every = "1h", keys = "SELECT id FROM people" }}
rebuild = [
  "DELETE FROM people_copy WHERE id = $1",
  "INSERT INTO people_copy SELECT id, city FROM people WHERE id = $1",
]

[[sinks]]
kind = "kafka"
brokers = "{brokers}"
topic = "people-out"
topic_mode = "single"
snapshot = "initial"
snapshot_chunk_rows = 5

[[sinks]]
kind = "kafka-outbox"
brokers = "{brokers}"
table = "public.outbox"
dead_letter_topic = "outbox.dlq"
payload_encoding = "text"
snapshot = "initial"
snapshot_chunk_rows = 2

[changefeed]
path = "{store}"
snapshot = "initial"
snapshot_chunk_rows = 5
snapshot_pause_ms = 20

[changefeed.http]
listen = "{feed}"

[[redact]]
table = "public.people"
column = "id"
action = "hash"
key_env = "FRESHEN_CANARY_KEY"

[[redact]]
table = "people"
column = "ssn"
action = "drop"

[[redact]]
table = "people"
column = "bio"
action = "mask"

[[redact]]
table = "visits"
column = "person"
action = "hash"
key_env = "FRESHEN_CANARY_KEY"

[[redact]]
table = "visits"
column = "note"
action = "truncate"
length = 2

[[redact]]
table = "outbox"
column = "id"
action = "hash"
key_env = "FRESHEN_CANARY_KEY"

[[redact]]
table = "outbox"
column = "aggregateid"
action = "hash"
key_env = "FRESHEN_CANARY_KEY"

[[redact]]
table = "outbox"
column = "payload"
action = "mask"
"#,
        store = store.display(),
    )
}

fn hashed(clear: &str) -> String {
    freshen_codec::hmac_hex(&freshen_codec::HashKey::new(KEY.as_bytes().to_vec()), clear)
}

/// Where `needle` first occurs in `hay`, with some context, for a failure message.
fn found(hay: &[u8], needle: &str) -> Option<String> {
    let at = hay
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())?;
    let from = at.saturating_sub(160);
    let to = (at + 160).min(hay.len());
    Some(String::from_utf8_lossy(&hay[from..to]).into_owned())
}

/// Everything one output showed, by name, for the search.
#[derive(Default)]
struct Outputs(Vec<(String, Vec<u8>)>);

impl Outputs {
    fn add(&mut self, name: impl Into<String>, bytes: impl Into<Vec<u8>>) {
        self.0.push((name.into(), bytes.into()));
    }

    /// Fails naming every output that holds the canary.
    fn assert_no_canary(&self) {
        let leaks: Vec<String> = self
            .0
            .iter()
            .filter_map(|(name, bytes)| found(bytes, CANARY).map(|at| format!("{name}: …{at}…")))
            .collect();
        assert!(
            leaks.is_empty(),
            "the clear canary left freshen in {} place(s):\n{}",
            leaks.len(),
            leaks.join("\n")
        );
    }

    /// Fails unless `needle` is in the output called `name` (that search saw data).
    fn assert_holds(&self, name: &str, needle: &str) {
        let out = self
            .0
            .iter()
            .filter(|(n, _)| n.starts_with(name))
            .find(|(_, b)| found(b, needle).is_some());
        assert!(out.is_some(), "{needle:?} is in no output named {name}*");
    }
}

/// Every record of `topic` from its start (key, value and each header as bytes) until
/// it holds at least `min` and nothing more came for two seconds.
fn records(bootstrap: &str, topic: &str, min: usize, group: &str) -> Vec<Vec<u8>> {
    let consumer = reader(bootstrap, group, &[topic]);
    let mut out = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    let mut quiet_since = Instant::now();
    while out.len() < min || quiet_since.elapsed() < Duration::from_secs(2) {
        assert!(
            Instant::now() < deadline,
            "{topic}: {} records, wanted {min}",
            out.len()
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(m.key().unwrap_or_default());
            bytes.push(b'|');
            bytes.extend_from_slice(m.payload().unwrap_or_default());
            if let Some(h) = m.headers() {
                for header in h.iter() {
                    bytes.push(b'|');
                    bytes.extend_from_slice(header.key.as_bytes());
                    bytes.push(b'=');
                    bytes.extend_from_slice(header.value.unwrap_or_default());
                }
            }
            out.push(bytes);
            quiet_since = Instant::now();
        }
    }
    out
}

async fn get(base: &str, path: &str) -> (u16, String) {
    freshen_cli::status::get(base, path)
        .await
        .unwrap_or_else(|e| panic!("GET {base}{path}: {e}"))
}

async fn send(base: &str, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
    let body = body.map(|b| b.to_string());
    freshen_cli::status::request(base, method, path, None, body.as_deref())
        .await
        .unwrap_or_else(|e| panic!("{method} {base}{path}: {e}"))
}

/// Every event a WebSocket subscription from the log's start delivers, up to `n` (or
/// what came before a 10 s silence or a minute: the delivery of ~2000 acknowledged
/// events takes ~10 s of a debug build on two busy cores).
async fn websocket(feed: &str, n: usize) -> String {
    let url = format!(
        "{}/v2/cdc/stream?tx=1",
        feed.replacen("http://", "ws://", 1)
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("connect");
    ws.send(WsMessage::Text(
        json!({"action": "subscribe", "id": "s1", "from_seq": 0})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let mut text = String::new();
    let mut events = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while events < n && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(WsMessage::Text(t)))) => {
                let frame: Value = serde_json::from_str(&t).unwrap_or_default();
                if let Some(seq) = frame["sequence"].as_u64() {
                    events += 1;
                    let ack = json!({"action": "ack", "id": "s1", "sequence": seq});
                    ws.send(WsMessage::Text(ack.to_string().into()))
                        .await
                        .unwrap();
                }
                text.push_str(&t);
                text.push('\n');
            }
            Ok(Some(Ok(_))) => {}
            _ => break,
        }
    }
    let _ = ws.close(None).await;
    assert!(
        events >= n,
        "the WebSocket delivered {events} of {n} events"
    );
    text
}

/// What one running freshen shows over HTTP: every surface, its error bodies included.
async fn http_surfaces(out: &mut Outputs, round: &str, base: &str, feed: &str, events: usize) {
    let paths = [
        "/changefeed?from_seq=0&limit=100000&long_poll_ms=0",
        "/changefeed?from_seq=0&limit=100000&long_poll_ms=0&tx=1",
        "/changefeed?cursors=people:0,visits:0,outbox:0&limit=100000&long_poll_ms=0",
        "/changefeed/stream?from_seq=0&keep_alive=false&max_events=100000",
        "/changefeed/stream?cursors=people:0,outbox:0&keep_alive=false&tx=1",
        "/changefeed/snapshot",
        "/changefeed/stats",
        "/changefeed/groups",
        "/changefeed/groups/canary",
        "/changefeed/groups/canary/dead-letters",
        "/metrics",
        // Error bodies.
        "/changefeed?cursors=people",
        "/changefeed/groups/nobody/dead-letters",
        "/changefeed?from_seq=x",
    ];
    for p in paths {
        let (code, body) = get(feed, p).await;
        out.add(format!("{round} changefeed GET {p} ({code})"), body);
    }
    let (code, body) = send(
        feed,
        "POST",
        "/changefeed/snapshot",
        Some(json!({"tables": ["nope"]})),
    )
    .await;
    out.add(
        format!("{round} changefeed POST /changefeed/snapshot error ({code})"),
        body,
    );
    for p in [
        "/status",
        "/healthz",
        "/metrics",
        "/admin/views/people_copy/quarantined",
        "/admin/views/nope/quarantined",
    ] {
        let (code, body) = get(base, p).await;
        out.add(format!("{round} http GET {p} ({code})"), body);
    }
    let ws = websocket(feed, events).await;
    out.add(format!("{round} changefeed WebSocket"), ws);
}

/// Every row of every table in the database that the test did not make: freshen's
/// bookkeeping (sink snapshot progress, leases, cursors…), whatever its name.
async fn bookkeeping(c: &tokio_postgres::Client) -> Vec<(String, Vec<u8>)> {
    let tables = c
        .query(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c \
               JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE c.relkind IN ('r', 'p') \
                AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') \
                AND NOT (n.nspname = 'public' AND c.relname = ANY($1))",
            &[&OURS.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()],
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    for t in tables {
        let name: String = t.get(0);
        let rows = c
            .query(&format!("SELECT t::text FROM {name} t"), &[])
            .await
            .unwrap();
        let text: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        out.push((format!("table {name}"), text.join("\n").into_bytes()));
    }
    out
}

/// Every file under `dir` (the changefeed's store, the spill directory, the log).
fn files(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, out);
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((format!("file {}", path.display()), bytes));
        }
    }
}

async fn wait_snapshots_done(base: &str, feed: &str) {
    eventually(120, "every snapshot done", || async {
        let status: Value = serde_json::from_str(&get(base, "/status").await.1).ok()?;
        let feed: Value = serde_json::from_str(&get(feed, "/changefeed/snapshot").await.1).ok()?;
        let sinks = status["sink_snapshots"].as_array()?;
        let tables = sinks
            .iter()
            .flat_map(|s| s["tables"].as_array().cloned().unwrap_or_default());
        let all = tables.chain(feed["snapshots"].as_array().cloned().unwrap_or_default());
        let states: Vec<Value> = all.map(|t| t["state"].clone()).collect();
        (!states.is_empty() && states.iter().all(|s| s == "done")).then_some(())
    })
    .await;
}

/// Polls until the changefeed's log holds at least `n` events; their count.
async fn wait_events(feed: &str, n: usize) -> usize {
    eventually(60, "the changes in the changefeed", || async {
        let got = changefeed_events(feed).await.len();
        (got >= n).then_some(got)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clear_canary_reaches_no_output() {
    let kafka =
        KafkaServer::start().expect("a Kafka-protocol broker (run scripts/test-deps-brokers)");
    // Small transactions are streamed while they run (protocol 2), so the spill path
    // is taken by the large one below.
    let pg = PgServer::builder()
        .setting("logical_decoding_work_mem", "64kB")
        .start()
        .expect("a throwaway PostgreSQL (apt-get install postgresql-15)");
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    // A TOASTed value: long and incompressible, stored out of line.
    let bio = "(SELECT 'CNRY-BIO-' || string_agg(md5(random()::text || g), '') FROM generate_series(1, 200) g)";
    c.batch_execute(&format!(
        "INSERT INTO people SELECT 'CNRY-ID-' || lpad(g::text, 4, '0'), 'CNRY-SSN-' || g, {bio}, '{VISIBLE}' FROM generate_series(1, {PEOPLE}) g;
         INSERT INTO visits SELECT g, 'CNRY-ID-' || lpad(g::text, 4, '0'), 'CNRY-NOTE-' || g FROM generate_series(1, 5) g;
         INSERT INTO outbox VALUES
           ('CNRY-EVT-0001', 'person', 'CNRY-AGG-0001', 'PersonCreated', 'CNRY-PAYLOAD-0001'),
           ('CNRY-EVT-0002', 'person', 'CNRY-AGG-0002', 'PersonCreated', 'CNRY-PAYLOAD-0002'),
           ('CNRY-EVT-0003', 'person', 'CNRY-AGG-0003', 'PersonCreated', 'CNRY-PAYLOAD-0003');"
    ))
    .await
    .unwrap();
    create_topics(&kafka.bootstrap(), &TOPICS, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    let (port, feed_port) = (free_port(), free_port());
    let base = format!("http://127.0.0.1:{port}");
    let feed = format!("http://127.0.0.1:{feed_port}");
    let store = dir.path().join("feed").join("changes.redb");
    std::fs::create_dir(store.parent().unwrap()).unwrap();
    let cfg = write_config(
        dir.path(),
        &config(
            &pg.url(),
            &kafka.bootstrap(),
            &format!("127.0.0.1:{port}"),
            &format!("127.0.0.1:{feed_port}"),
            &store,
        ),
    );
    let env = [
        ("FRESHEN_CANARY_KEY", KEY),
        ("RUST_LOG", "debug"),
        ("TMPDIR", spill.to_str().unwrap()),
    ];
    let mut run = spawn_run_env(dir.path(), &cfg, 1, &env);
    wait_healthy(&base, dir.path(), 1, DEADLINE).await;
    wait_snapshots_done(&base, &feed).await;

    // Live changes of every kind.
    c.batch_execute(&format!(
        "INSERT INTO people VALUES ('CNRY-ID-0100', 'CNRY-SSN-100', {bio}, '{VISIBLE}');
         UPDATE people SET bio = {bio} WHERE id = 'CNRY-ID-0001';
         UPDATE people SET city = 'Bergen' WHERE id = 'CNRY-ID-0002';
         UPDATE people SET id = 'CNRY-ID-9003' WHERE id = 'CNRY-ID-0003';
         DELETE FROM people WHERE id = 'CNRY-ID-0004';
         UPDATE visits SET note = 'CNRY-NOTE-changed' WHERE id = 1;
         INSERT INTO outbox VALUES
           ('CNRY-EVT-0010', 'person', 'CNRY-AGG-0010', 'PersonMoved', 'CNRY-PAYLOAD-0010'),
           ('CNRY-EVT-0011', NULL, 'CNRY-AGG-0011', 'Malformed', 'CNRY-PAYLOAD-0011');"
    ))
    .await
    .unwrap();
    // A transaction large enough to be streamed while it runs, and spilled.
    c.batch_execute(&format!(
        "INSERT INTO people SELECT 'CNRY-ID-B' || g, 'CNRY-SSN-B' || g, repeat('CNRY-BULK-', 20), '{VISIBLE}' FROM generate_series(1, 2000) g;"
    ))
    .await
    .unwrap();
    c.batch_execute("TRUNCATE visits").await.unwrap();
    // Snapshots asked for while running: the changefeed's and the Kafka sink's.
    let (code, body) = send(
        &feed,
        "POST",
        "/changefeed/snapshot",
        Some(json!({"tables": ["people"]})),
    )
    .await;
    assert!(code < 300, "{code} {body}");
    let (code, body) = send(
        &base,
        "POST",
        "/admin/sinks/0/snapshot",
        Some(json!({"tables": ["public.people"]})),
    )
    .await;
    assert!(code < 300, "{code} {body}");
    // A consumer group whose events are all dead-lettered.
    let (code, body) = send(
        &feed,
        "POST",
        "/changefeed/groups",
        Some(json!({"name": "canary", "max_deliveries": 1})),
    )
    .await;
    assert!(code < 300, "{code} {body}");
    let events = wait_events(&feed, PEOPLE + 2000).await;
    wait_snapshots_done(&base, &feed).await;
    let (_, leased) = send(
        &feed,
        "POST",
        "/changefeed/groups/canary/receive",
        Some(json!({"consumer_id": "c1", "max_events": 50})),
    )
    .await;
    let leased: Value = serde_json::from_str(&leased).unwrap();
    let seqs: Vec<u64> = leased["events"]
        .as_array()
        .expect("leased events")
        .iter()
        .filter_map(|e| e["sequence"].as_u64())
        .collect();
    assert!(!seqs.is_empty(), "{leased}");
    let (code, body) = send(
        &feed,
        "POST",
        "/changefeed/groups/canary/nack",
        Some(json!({"consumer_id": "c1", "sequences": seqs, "reason": "canary"})),
    )
    .await;
    assert!(code < 300, "{code} {body}");

    // The poisoned key is quarantined (and shown hashed, as the changefeed shows it:
    // asserted below).
    eventually(60, "the poisoned key quarantined", || async {
        let status: Value = serde_json::from_str(&get(&base, "/status").await.1).ok()?;
        let views = status["views"].as_array()?;
        views
            .iter()
            .any(|v| v["quarantined"].as_array().is_some_and(|q| !q.is_empty()))
            .then_some(())
    })
    .await;
    let mut out = Outputs::default();
    http_surfaces(&mut out, "first run", &base, &feed, events).await;
    let (code, body) = send(
        &base,
        "POST",
        "/admin/views/people_copy/readmit",
        Some(json!({"key": hashed(POISONED)})),
    )
    .await;
    out.add("first run http POST readmit", body.clone());
    assert!(
        code == 200 && body.contains("readmitted"),
        "readmitted by the key shown: {code} {body}"
    );
    let (_, dead) = get(&feed, "/changefeed/groups/canary/dead-letters").await;
    assert!(
        dead.contains("sequence"),
        "the group's dead letters: {dead}"
    );

    // A restart: the stored progress is read back, more rows relayed after it.
    stop_run(&mut run, dir.path(), 1);
    let mut run = spawn_run_env(dir.path(), &cfg, 2, &env);
    wait_healthy(&base, dir.path(), 2, DEADLINE).await;
    c.batch_execute(&format!(
        "INSERT INTO people VALUES ('CNRY-ID-0200', 'CNRY-SSN-200', 'CNRY-BIO-short', '{VISIBLE}');
         UPDATE people SET city = 'Tromso' WHERE id = 'CNRY-ID-0001';
         INSERT INTO outbox VALUES ('CNRY-EVT-0020', 'person', 'CNRY-AGG-0020', 'PersonCreated', 'CNRY-PAYLOAD-0020');"
    ))
    .await
    .unwrap();
    let events = wait_events(&feed, events + 3).await;
    wait_snapshots_done(&base, &feed).await;
    http_surfaces(&mut out, "after the restart", &base, &feed, events).await;
    stop_run(&mut run, dir.path(), 2);

    // Kafka: every record of every topic, keys, values and headers.
    let sink = records(
        &kafka.bootstrap(),
        "people-out",
        PEOPLE + 2000,
        "canary-sink",
    );
    let relayed = records(
        &kafka.bootstrap(),
        "outbox.event.person",
        5,
        "canary-outbox",
    );
    let dead = records(&kafka.bootstrap(), "outbox.dlq", 1, "canary-dlq");
    for (topic, recs) in [
        ("people-out", &sink),
        ("outbox.event.person", &relayed),
        ("outbox.dlq", &dead),
    ] {
        out.add(format!("kafka {topic}"), recs.concat());
    }
    // The log at debug level, the database's bookkeeping, every file left on disk.
    for n in [1, 2] {
        out.add(format!("log of run {n}"), log_of(dir.path(), n));
    }
    for (name, bytes) in bookkeeping(&c).await {
        out.add(name, bytes);
    }
    let mut on_disk = Vec::new();
    files(dir.path(), &mut on_disk);
    for (name, bytes) in on_disk {
        out.add(name, bytes);
    }

    // Each search saw data: the clear column, and the canary's hash where it belongs.
    let id1 = hashed("CNRY-ID-0001");
    for name in [
        "kafka people-out",
        "first run changefeed GET /changefeed?",
        "first run changefeed WebSocket",
        "file",
    ] {
        out.assert_holds(name, VISIBLE);
        out.assert_holds(name, &id1);
    }
    out.assert_holds("kafka outbox.event.person", &hashed("CNRY-AGG-0010"));
    out.assert_holds("kafka outbox.dlq", &hashed("CNRY-EVT-0011"));
    out.assert_holds("table public.freshen_sink_snapshots", "kafka");
    out.assert_holds("log of run 1", "DEBUG");
    out.assert_no_canary();
    // The quarantined key was shown, hashed.
    out.assert_holds("first run http GET /status", &hashed(POISONED));
    out.assert_holds(
        "first run http GET /admin/views/people_copy/quarantined",
        &hashed(POISONED),
    );
    out.assert_holds("log of run 1", &hashed(POISONED));
    // The key is no output's either.
    for (name, bytes) in &out.0 {
        assert!(found(bytes, KEY).is_none(), "the hash key in {name}");
    }
}
