//! Changefeed: durable append throughput (group commit against one commit per event;
//! with the latest-per-key index and without; updates whose unchanged values the index
//! fills in; a compaction pass),
//! delivery throughput over long-poll and Server-Sent Events to 1 and 100 clients
//! (beside the library's own read, one `String` per event), and server memory per
//! idle SSE connection.
//!
//! Server and clients share the machine (and its cores); clients are raw HTTP/1.1 over
//! TCP that count events without parsing them, so the figures are the server's.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use freshen::{Ack, Batch, Op, Row, RowEvent, Tx, Value};
use freshen_changefeed::{AppState, Changefeed, ChangefeedConfig, Durability, Filter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::report::{Table, dur, rate};
use crate::{Opts, alloc};

/// A typical row: an order with a handful of columns (~330 bytes of event JSON).
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

fn events(from: i64, n: i64) -> Vec<RowEvent> {
    (from..from + n).map(event).collect()
}

/// An UPDATE of one of `keys` rows under PostgreSQL's default replica identity: one
/// large column left out as unchanged (TOAST), which the changefeed fills in.
fn toast_update(id: i64, keys: i64, base: i64) -> RowEvent {
    let seq = base + id;
    RowEvent::new("public", "orders", Op::Update)
        .with_pk(["id"])
        .with_new(Row::from_pairs([
            ("id", Value::Int(id % keys)),
            ("customer", Value::text(format!("c-{}", id % 977))),
            ("amount", Value::text(format!("{}.50", id % 10_000))),
            ("status", Value::Unchanged),
            ("paid", Value::Bool(true)),
        ]))
        .with_tx(Tx {
            id: 700 + seq as u64 / 100,
            commit: 1_000 + seq as u64 / 100,
            index: (seq % 100) as u32,
        })
}

async fn open(dir: &std::path::Path, durability: Durability) -> anyhow::Result<Changefeed> {
    open_with(dir, durability, true).await
}

async fn open_with(
    dir: &std::path::Path,
    durability: Durability,
    key_index: bool,
) -> anyhow::Result<Changefeed> {
    let mut config = ChangefeedConfig::new(dir.join("feed.redb"));
    config.durability = durability;
    config.key_index = key_index;
    Ok(Changefeed::open(&config).await?)
}

/// Appends `n` events through the capture loop (a source handing batches of `batch`),
/// the way the binary runs it.
async fn capture(cf: &Changefeed, n: i64, batch: i64) -> anyhow::Result<Duration> {
    let batches: Vec<Vec<RowEvent>> = (0..n / batch).map(|b| events(b * batch, batch)).collect();
    capture_batches(cf, batches, n).await
}

async fn capture_batches(
    cf: &Changefeed,
    batches: Vec<Vec<RowEvent>>,
    n: i64,
) -> anyhow::Result<Duration> {
    let (feed, source) = freshen::channel(64);
    let start = Instant::now();
    let producer = tokio::spawn(async move {
        for b in batches {
            if feed.send(Batch::new(b, Ack::none())).await.is_err() {
                break;
            }
        }
    });
    let report = cf.capture(source, std::future::pending()).await?;
    producer.await?;
    anyhow::ensure!(
        report.appended == n as u64,
        "appended {} of {n}",
        report.appended
    );
    Ok(start.elapsed())
}

/// `tasks` concurrent appenders of one event each, `per` times: group commit merges
/// what arrives while a commit runs.
async fn concurrent(cf: &Changefeed, tasks: i64, per: i64, base: i64) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let cf = cf.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..per {
                cf.append(&[event(base + t * per + i)]).await?;
            }
            Ok::<_, freshen_changefeed::Error>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok(start.elapsed())
}

/// One event per commit, one after the other: what an append costs without grouping.
async fn one_by_one(cf: &Changefeed, n: i64, base: i64) -> anyhow::Result<Duration> {
    let start = Instant::now();
    for i in 0..n {
        cf.append(&[event(base + i)]).await?;
    }
    Ok(start.elapsed())
}

fn append_table(rows: Vec<(String, u64, Duration)>) {
    let mut t = Table::new(&[
        "durable append (fsync per commit)",
        "events",
        "time",
        "events/s",
    ]);
    for (case, n, d) in rows {
        t.row(vec![case, n.to_string(), dur(d), rate(n as f64, d)]);
    }
    t.print();
}

/// Serves `cf` on a loopback port with room for `connections` at once.
async fn serve(
    cf: &Changefeed,
    connections: usize,
) -> anyhow::Result<(SocketAddr, tokio::sync::oneshot::Sender<()>)> {
    let http = freshen_changefeed::HttpConfig {
        max_limit: 10_000,
        max_events_per_frame: 1_000,
        // The memory measurement holds 2 × its count of idle streams open at once: past
        // the default limit (512) the rest wait in the listen queue, and once that is
        // full their connects time out (os error 110).
        max_connections: connections,
        ..Default::default()
    };
    let state = AppState::new(cf.clone(), &http)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(freshen_changefeed::serve(listener, state, async {
        let _ = stopped.await;
    }));
    Ok((addr, stop))
}

/// An SSE client: reads the stream after `from` until it has counted `n` events.
async fn sse_client(addr: SocketAddr, from: u64, n: u64) -> anyhow::Result<()> {
    let mut s = TcpStream::connect(addr).await?;
    let req = format!(
        "GET /changefeed/stream?from_seq={from}&max_events=1000 HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    // Sequences are contiguous, so the last complete `id:` seen says how far the stream
    // got; looking only at the end of each read keeps the client's cost far below the
    // server's (a client that scanned every byte would be measured instead).
    let target = from + n;
    let mut window: Vec<u8> = Vec::with_capacity(4096);
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let r = s.read(&mut buf).await?;
        anyhow::ensure!(r > 0, "stream ended before sequence {target}");
        let chunk = &buf[..r];
        if chunk.len() >= 2048 {
            window.clear();
            window.extend_from_slice(&chunk[chunk.len() - 2048..]);
        } else {
            window.extend_from_slice(chunk);
            let excess = window.len().saturating_sub(4096);
            window.drain(..excess);
        }
        if last_id(&window).is_some_and(|id| id >= target) {
            break;
        }
    }
    Ok(())
}

/// The last complete `id: N` line in `bytes`.
fn last_id(bytes: &[u8]) -> Option<u64> {
    let mut end = bytes.len();
    while let Some(at) = bytes[..end].windows(5).rposition(|w| w == b"\nid: ") {
        let digits = &bytes[at + 5..];
        let len = digits.iter().take_while(|b| b.is_ascii_digit()).count();
        if len > 0 && digits.get(len) == Some(&b'\n') {
            return std::str::from_utf8(&digits[..len]).ok()?.parse().ok();
        }
        end = at;
    }
    None
}

/// Reads one HTTP/1.1 response with a Content-Length body into `body`.
async fn response(s: &mut TcpStream, buf: &mut Vec<u8>, body: &mut Vec<u8>) -> anyhow::Result<()> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end])?.to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .ok_or_else(|| anyhow::anyhow!("no content-length"))?
                .trim()
                .parse()?;
            while buf.len() < end + 4 + len {
                let mut chunk = [0u8; 65536];
                let r = s.read(&mut chunk).await?;
                anyhow::ensure!(r > 0, "connection closed");
                buf.extend_from_slice(&chunk[..r]);
            }
            body.clear();
            body.extend_from_slice(&buf[end + 4..end + 4 + len]);
            buf.drain(..end + 4 + len);
            return Ok(());
        }
        let mut chunk = [0u8; 65536];
        let r = s.read(&mut chunk).await?;
        anyhow::ensure!(r > 0, "connection closed");
        buf.extend_from_slice(&chunk[..r]);
    }
}

fn field(body: &[u8], name: &str) -> Option<u64> {
    let text = std::str::from_utf8(body).ok()?;
    let at = text.rfind(&format!("\"{name}\":"))? + name.len() + 3;
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// A long-poll client: pages of 1000 from the start until it has `n` events.
async fn poll_client(addr: SocketAddr, from: u64, n: u64) -> anyhow::Result<()> {
    let mut s = TcpStream::connect(addr).await?;
    let (mut buf, mut body) = (Vec::new(), Vec::new());
    let (mut from, mut got) = (from, 0u64);
    while got < n {
        let req = format!(
            "GET /changefeed?from_seq={from}&limit=1000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await?;
        response(&mut s, &mut buf, &mut body).await?;
        got += field(&body, "count").ok_or_else(|| anyhow::anyhow!("no count"))?;
        from = field(&body, "next_from_seq").ok_or_else(|| anyhow::anyhow!("no next_from_seq"))?;
    }
    Ok(())
}

/// `clients` clients each reading the last `n` events of a log of `log_n`.
async fn clients(
    clients: usize,
    n: u64,
    log_n: u64,
    addr: SocketAddr,
    sse: bool,
) -> anyhow::Result<Duration> {
    let from = log_n - n;
    let start = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..clients {
        handles.push(tokio::spawn(async move {
            if sse {
                sse_client(addr, from, n).await
            } else {
                poll_client(addr, from, n).await
            }
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok(start.elapsed())
}

/// The library's read: one reader in-process, each event's JSON as its own `String`.
fn scan(cf: &Changefeed, n: u64) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let (mut after, mut got) = (0, 0u64);
    while got < n {
        let page = cf.read(after, 1000, &Filter::default())?;
        let last = page
            .last()
            .ok_or_else(|| anyhow::anyhow!("log ended at {got}"))?;
        after = last.sequence;
        got += page.len() as u64;
        std::hint::black_box(&page);
    }
    Ok(start.elapsed())
}

/// Server heap bytes per idle SSE connection: the heap growth from `n` to `2n` open
/// streams (raw TCP clients, whose own heap use is a few bytes), once they are idle.
async fn memory_per_connection(addr: SocketAddr, cf: &Changefeed, n: usize) -> anyhow::Result<f64> {
    let mut conns = Vec::with_capacity(2 * n);
    let mut samples = Vec::new();
    for _ in 0..2 {
        let target = open_streams(cf) + n as u64;
        for _ in 0..n {
            let latest = cf.latest_sequence();
            let mut s = TcpStream::connect(addr).await?;
            let req = format!(
                "GET /changefeed/stream?from_seq={latest} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            );
            s.write_all(req.as_bytes()).await?;
            conns.push(s);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while open_streams(cf) < target {
            anyhow::ensure!(Instant::now() < deadline, "streams did not open");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Each stream has sent its `retry:` and gone idle.
        let mut buf = [0u8; 4096];
        let from = conns.len() - n;
        for s in &mut conns[from..] {
            let _ = s.read(&mut buf).await?;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        samples.push(alloc::live_bytes());
    }
    drop(conns);
    Ok(samples[1].saturating_sub(samples[0]) as f64 / n as f64)
}

fn metric(cf: &Changefeed, name: &str) -> u64 {
    cf.metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

fn open_streams(cf: &Changefeed) -> u64 {
    cf.metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix("freshen_changefeed_sse_open ")?.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn run(opts: &Opts) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run_async(opts))
}

async fn run_async(opts: &Opts) -> anyhow::Result<()> {
    let (n, single, log_n, many_n) = if opts.quick {
        (20_000i64, 100i64, 20_000u64, 2_000u64)
    } else {
        (500_000, 1_000, 200_000, 20_000)
    };

    // Appends, each in a fresh log.
    let mut rows = Vec::new();
    for batch in [1000i64, 100] {
        let dir = tempfile::tempdir()?;
        let cf = open(dir.path(), Durability::Fsync).await?;
        let d = capture(&cf, n, batch).await?;
        rows.push((
            format!("capture loop, batches of {batch} (group commit)"),
            n as u64,
            d,
        ));
        cf.close().await;
    }
    {
        let dir = tempfile::tempdir()?;
        let cf = open(dir.path(), Durability::Fsync).await?;
        let (tasks, per) = (64, single / 4);
        let d = concurrent(&cf, tasks, per, 0).await?;
        rows.push((
            format!("{tasks} concurrent appenders, 1 event each (group commit)"),
            (tasks * per) as u64,
            d,
        ));
        let d = one_by_one(&cf, single, 10_000_000).await?;
        rows.push((
            "rival: 1 event per commit, sequential (no grouping)".into(),
            single as u64,
            d,
        ));
        cf.close().await;
    }
    {
        let dir = tempfile::tempdir()?;
        let cf = open(dir.path(), Durability::None).await?;
        let d = capture(&cf, n, 1000).await?;
        rows.push((
            "capture loop, batches of 1000, durability = none".into(),
            n as u64,
            d,
        ));
        cf.close().await;
    }
    // The latest-per-key index (on above, by default) against none; then updates whose
    // unchanged column the writer fills from the row's last image.
    {
        let dir = tempfile::tempdir()?;
        let cf = open_with(dir.path(), Durability::Fsync, false).await?;
        let d = capture(&cf, n, 1000).await?;
        rows.push((
            "capture loop, batches of 1000, key_index = false".into(),
            n as u64,
            d,
        ));
        cf.close().await;
    }
    let compaction = {
        let dir = tempfile::tempdir()?;
        let cf = open(dir.path(), Durability::Fsync).await?;
        let keys = n / 10;
        capture(&cf, keys, 1000).await?;
        let batches: Vec<Vec<RowEvent>> = (0..n / 1000)
            .map(|b| {
                (b * 1000..(b + 1) * 1000)
                    .map(|i| toast_update(i, keys, keys))
                    .collect()
            })
            .collect();
        let d = capture_batches(&cf, batches, n).await?;
        let filled = metric(&cf, "freshen_changefeed_filled_events_total");
        anyhow::ensure!(filled == n as u64, "filled {filled} of {n}");
        rows.push((
            format!("updates of {keys} rows, 1 unchanged column filled from the index"),
            n as u64,
            d,
        ));
        let stored = cf.stats().total_events;
        let policy = freshen_changefeed::RetentionConfig {
            keep: freshen_changefeed::Keep::LatestPerKey,
            ..freshen_changefeed::RetentionConfig::default()
        };
        let start = Instant::now();
        let deleted = cf.enforce_retention(&policy).await?;
        let took = start.elapsed();
        anyhow::ensure!(
            cf.stats().total_events == keys as u64,
            "compacted to one event per row"
        );
        cf.close().await;
        (stored, deleted, took)
    };
    append_table(rows);
    let (stored, deleted, took) = compaction;
    println!(
        "\nCompaction to the latest event per row (keep = \"latest-per-key\"): {stored} events, \
         {deleted} deleted in {} ({})",
        dur(took),
        rate(stored as f64, took)
    );

    // Delivery from a log of `log_n` events.
    let dir = tempfile::tempdir()?;
    let cf = open(dir.path(), Durability::None).await?;
    capture(&cf, log_n as i64, 1000).await?;
    let conns = if opts.quick { 50 } else { 1000 };
    // 2 × `conns` idle streams (`memory_per_connection`); then 100 clients, with room
    // for streams whose close the server has yet to see.
    let (addr, stop) = serve(&cf, 2 * conns + 100).await?;
    let per = memory_per_connection(addr, &cf, conns).await?;
    println!(
        "\nServer heap per idle SSE connection ({conns} open, counting allocator): {:.1} KiB",
        per / 1024.0
    );
    println!();
    let mut t = Table::new(&[
        "delivery (each client reads the log's tail)",
        "clients",
        "events delivered",
        "time",
        "events/s (all clients)",
    ]);
    let library = scan(&cf, log_n)?;
    t.row(vec![
        "in-process Changefeed::read (a String per event)".into(),
        "–".into(),
        log_n.to_string(),
        dur(library),
        rate(log_n as f64, library),
    ]);
    for (name, sse, k, per) in [
        ("Server-Sent Events", true, 1usize, log_n),
        ("Server-Sent Events", true, 100, many_n),
        ("long-poll, limit 1000", false, 1, log_n),
        ("long-poll, limit 1000", false, 100, many_n),
    ] {
        let d = clients(k, per, log_n, addr, sse).await?;
        let total = per * k as u64;
        t.row(vec![
            name.into(),
            k.to_string(),
            total.to_string(),
            dur(d),
            rate(total as f64, d),
        ]);
    }
    t.print();

    let _ = stop.send(());
    cf.close().await;
    Ok(())
}
