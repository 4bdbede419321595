//! Measures the two embedded-store candidates for the changefeed log in one run, with the
//! same workload: durable appends (one fsync per group commit) of sequential 8-byte keys
//! and ~300-byte values, then a full forward scan.
//!
//! ```text
//! cargo run -p freshen-changefeed --release --features compare-stores --example store_compare -- [EVENTS] [GROUP]
//! ```
//!
//! EVENTS defaults to 200000, GROUP (events per group commit) to 1000.

use std::time::{Duration, Instant};

fn value(seq: u64) -> Vec<u8> {
    // A changefeed record: a small header, then the event's JSON text.
    let json = format!(
        "{{\"type\":\"PUT\",\"key\":\"orders:{seq}\",\"value\":\"{{\\\"id\\\":{seq},\\\"customer\\\":\\\"c-{c}\\\",\\\"amount\\\":\\\"{a}.50\\\",\\\"status\\\":\\\"paid\\\"}}\",\"timestamp_ms\":1767225600000,\"metadata\":{{\"table\":\"orders\",\"pk\":\"{seq}\"}},\"op\":\"insert\",\"schema\":\"public\",\"table\":\"orders\",\"lsn\":\"0/16B3748\",\"xid\":{x}}}",
        c = seq % 977,
        a = seq % 10_000,
        x = 700 + seq / 100,
    );
    let mut v = Vec::with_capacity(24 + json.len());
    v.extend_from_slice(&[1, 0]);
    v.extend_from_slice(&seq.to_be_bytes());
    v.extend_from_slice(json.as_bytes());
    v
}

struct Figures {
    append: Duration,
    scan: Duration,
    bytes_on_disk: u64,
}

fn dir_size(path: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.flatten() {
            let m = match e.metadata() {
                Ok(m) => m,
                Err(_) => continue,
            };
            total += if m.is_dir() {
                dir_size(&e.path())
            } else {
                m.len()
            };
        }
    }
    total
}

fn redb_run(events: u64, group: u64) -> Figures {
    use redb::{Database, Durability, ReadableDatabase, TableDefinition};
    const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
    let dir = tempfile::tempdir().expect("temp dir");
    let db = Database::create(dir.path().join("log.redb")).expect("open redb");
    let start = Instant::now();
    let mut seq = 0;
    while seq < events {
        let mut tx = db.begin_write().expect("begin");
        tx.set_durability(Durability::Immediate)
            .expect("durability");
        {
            let mut t = tx.open_table(EVENTS).expect("table");
            for _ in 0..group.min(events - seq) {
                seq += 1;
                t.insert(seq, value(seq).as_slice()).expect("insert");
            }
        }
        tx.commit().expect("commit");
    }
    let append = start.elapsed();
    let start = Instant::now();
    let rx = db.begin_read().expect("read");
    let t = rx.open_table(EVENTS).expect("table");
    let mut n = 0u64;
    for item in t.range(1..).expect("range") {
        let (_k, v) = item.expect("item");
        n += v.value().len() as u64 & 1;
    }
    std::hint::black_box(n);
    let scan = start.elapsed();
    drop(t);
    drop(rx);
    drop(db);
    Figures {
        append,
        scan,
        bytes_on_disk: dir_size(dir.path()),
    }
}

fn fjall_run(events: u64, group: u64) -> Figures {
    use fjall::{Database, KeyspaceCreateOptions, PersistMode};
    let dir = tempfile::tempdir().expect("temp dir");
    let db = Database::builder(dir.path()).open().expect("open fjall");
    let ks = db
        .keyspace("events", KeyspaceCreateOptions::default)
        .expect("keyspace");
    let start = Instant::now();
    let mut seq = 0;
    while seq < events {
        let mut batch = db.batch();
        for _ in 0..group.min(events - seq) {
            seq += 1;
            batch.insert(&ks, seq.to_be_bytes(), value(seq));
        }
        batch.commit().expect("commit");
        db.persist(PersistMode::SyncAll).expect("fsync");
    }
    let append = start.elapsed();
    let start = Instant::now();
    let mut n = 0u64;
    for item in ks.range(1u64.to_be_bytes()..) {
        let v = item.value().expect("item");
        n += v.len() as u64 & 1;
    }
    std::hint::black_box(n);
    let scan = start.elapsed();
    drop(ks);
    drop(db);
    Figures {
        append,
        scan,
        bytes_on_disk: dir_size(dir.path()),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let events: u64 = args.next().map_or(200_000, |a| a.parse().expect("EVENTS"));
    let group: u64 = args.next().map_or(1000, |a| a.parse().expect("GROUP"));
    println!("{events} events, {group} per group commit (fsync each), ~300 B values");
    for (name, f) in [
        ("redb", redb_run as fn(u64, u64) -> Figures),
        ("fjall", fjall_run),
    ] {
        let r = f(events, group);
        println!(
            "{name:>6}: append {:>9.0} events/s ({:>6.0} commits/s)  scan {:>10.0} events/s  on disk {:.1} MiB",
            events as f64 / r.append.as_secs_f64(),
            (events as f64 / group as f64) / r.append.as_secs_f64(),
            events as f64 / r.scan.as_secs_f64(),
            r.bytes_on_disk as f64 / (1024.0 * 1024.0),
        );
    }
}
