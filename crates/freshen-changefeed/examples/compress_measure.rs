//! Measures compressed long-poll delivery: bytes per event on the wire and events/s
//! without compression, with gzip and with zstd (the levels the server uses), to 1 and
//! 4 concurrent clients; then whether compressing each stored record with zstd would pay
//! for the store (size against the cost of decompressing every event a reader reads).
//!
//! `cargo run -p freshen-changefeed --release --example compress_measure [EVENTS]`
//!
//! Clients and server share the machine. Clients do not decode pages (each asks for the
//! next 1000 sequences, the log has no holes), so the time is the server's: reading,
//! encoding JSON, compressing. The first page of each encoding is decoded and checked.

use std::io::Read as _;
use std::time::{Duration, Instant};

use bytes::Bytes;
use freshen::{Op, Row, RowEvent, Tx, Value};
use freshen_changefeed::{AppState, Changefeed, ChangefeedConfig, Durability, Filter, serve};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The bench's typical row (~330 bytes of event JSON): an order with a few columns.
fn event(id: i64) -> RowEvent {
    RowEvent::new("public", "orders", Op::Insert)
        .with_pk(["id"])
        .with_new(Row::from_pairs([
            ("id", Value::Int(id)),
            ("customer", Value::text(format!("c-{}", id % 977))),
            ("amount", Value::text(format!("{}.50", id % 10_000))),
            ("status", Value::text("paid")),
            ("paid", Value::Bool(true)),
        ]))
        .with_tx(Tx {
            id: 700 + id as u64 / 100,
            commit: 1_000 + id as u64 / 100,
            index: (id % 100) as u32,
        })
}

const PAGE: u64 = 1000;

type Http = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn get(client: &Http, url: &str, accept: &str) -> (Option<String>, Bytes) {
    let mut req = Request::get(url);
    if accept != "identity" {
        req = req.header("accept-encoding", accept);
    }
    let resp = client
        .request(req.body(Full::new(Bytes::new())).unwrap())
        .await
        .expect("a response");
    assert!(resp.status().is_success());
    let enc = resp
        .headers()
        .get("content-encoding")
        .map(|v| v.to_str().unwrap().to_owned());
    (enc, resp.into_body().collect().await.unwrap().to_bytes())
}

fn decode(enc: Option<&str>, body: &[u8]) -> Vec<u8> {
    match enc {
        None => body.to_vec(),
        Some("gzip") => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut out)
                .unwrap();
            out
        }
        Some("zstd") => zstd::stream::decode_all(body).unwrap(),
        Some(other) => panic!("unexpected encoding {other}"),
    }
}

/// `clients` clients each reading the whole log in pages; returns wire bytes and time.
async fn deliver(base: &str, n: u64, clients: usize, accept: &str) -> (u64, Duration) {
    let start = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..clients {
        let base = base.to_owned();
        let accept = accept.to_owned();
        handles.push(tokio::spawn(async move {
            let client: Http = Client::builder(TokioExecutor::new()).build_http();
            let mut bytes = 0u64;
            let mut from = 0;
            while from < n {
                let url = format!("{base}/changefeed?from_seq={from}&limit={PAGE}");
                let (_, body) = get(&client, &url, &accept).await;
                bytes += body.len() as u64;
                from += PAGE;
            }
            bytes
        }));
    }
    let mut bytes = 0;
    for h in handles {
        bytes += h.await.unwrap();
    }
    (bytes, start.elapsed())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("EVENTS: a number"))
        .unwrap_or(200_000);
    let dir = tempfile::tempdir().unwrap();
    let mut config = ChangefeedConfig::new(dir.path().join("feed.redb"));
    config.durability = Durability::None;
    let cf = Changefeed::open(&config).await.unwrap();
    for b in 0..n.div_ceil(PAGE) {
        let from = (b * PAGE) as i64;
        let to = ((b + 1) * PAGE).min(n) as i64;
        let events: Vec<RowEvent> = (from..to).map(event).collect();
        cf.append(&events).await.unwrap();
    }
    let state = AppState::new(cf.clone(), &config.http).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, state, async {
        let _ = stopped.await;
    }));

    println!("{n} events (~330 bytes of JSON each), pages of {PAGE}, 2 worker threads");
    println!("| encoding | clients | wire bytes/event | events/s (all clients) |");
    println!("|---|---|---|---|");
    let client: Http = Client::builder(TokioExecutor::new()).build_http();
    let plain_page = get(
        &client,
        &format!("{base}/changefeed?from_seq=0&limit={PAGE}"),
        "identity",
    )
    .await
    .1;
    for accept in ["identity", "gzip", "zstd"] {
        let (enc, body) = get(
            &client,
            &format!("{base}/changefeed?from_seq=0&limit={PAGE}"),
            accept,
        )
        .await;
        assert_eq!(
            enc.as_deref(),
            (accept != "identity").then_some(accept),
            "{accept}"
        );
        assert_eq!(
            decode(enc.as_deref(), &body),
            plain_page.to_vec(),
            "{accept}"
        );
        for clients in [1, 4] {
            let (bytes, d) = deliver(&base, n, clients, accept).await;
            let events = n * clients as u64;
            println!(
                "| {accept} | {clients} | {:.1} | {:.0} k/s |",
                bytes as f64 / events as f64,
                events as f64 / d.as_secs_f64() / 1000.0
            );
        }
    }
    let _ = stop.send(());
    let _ = server.await;

    // The store: each record compressed on its own (records are read one by one), zstd
    // level 1, against the read that every reader does.
    let sample = cf.read(0, 20_000, &Filter::default()).unwrap();
    let raw: usize = sample.iter().map(|e| e.json.len()).sum();
    // One context each, reused, as a store would keep them.
    let mut packer = zstd::bulk::Compressor::new(1).unwrap();
    let packed: Vec<Vec<u8>> = sample
        .iter()
        .map(|e| packer.compress(e.json.as_bytes()).unwrap())
        .collect();
    let small: usize = packed.iter().map(Vec::len).sum();
    let mut unpacker = zstd::bulk::Decompressor::new().unwrap();
    let mut buf = Vec::with_capacity(4096);
    let start = Instant::now();
    let mut out = 0usize;
    for p in &packed {
        buf.clear();
        out += unpacker.decompress_to_buffer(p, &mut buf).unwrap();
    }
    let unpack = start.elapsed();
    assert_eq!(out, raw);
    let start = Instant::now();
    let read = cf.read(0, 20_000, &Filter::default()).unwrap();
    let scan = start.elapsed();
    println!(
        "store: {} events, {:.0} → {:.0} bytes/event with zstd-1 per record ({:.2}×); \
         decompressing costs {:.0} ns/event, the read itself {:.0} ns/event",
        read.len(),
        raw as f64 / sample.len() as f64,
        small as f64 / sample.len() as f64,
        raw as f64 / small as f64,
        unpack.as_nanos() as f64 / sample.len() as f64,
        scan.as_nanos() as f64 / read.len() as f64,
    );
    cf.close().await;
}
