//! Crash safety at the log's level: a child process appends with fsync and reports each
//! acknowledged append; it is SIGKILLed mid-stream, then the log is reopened and the
//! "source" replays from a little before its last acknowledged position, as PostgreSQL
//! does. Every acknowledged event must be there exactly once, in order.

use crate::support;

use std::process::Stdio;

use freshen_changefeed::Filter;
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};

const CHILD_ENV: &str = "FRESHEN_CHANGEFEED_CRASH_CHILD_DIR";
const START_ENV: &str = "FRESHEN_CHANGEFEED_CRASH_CHILD_START";
/// Rows per source transaction.
const TX_ROWS: i64 = 10;

/// An order whose source position follows from its id: transaction `id / 10`, row
/// `id % 10` in it — the same on every replay.
fn positioned(id: i64) -> freshen::RowEvent {
    order(id, (id / TX_ROWS) as u64, (id % TX_ROWS) as u32)
}

/// The child: appends batches of five transactions forever, printing the last id of
/// each batch once it is durable. Not a test of its own: the parent runs it.
#[tokio::test]
#[ignore = "the child process of sigkill_loses_no_acknowledged_append_…; the parent runs it"]
async fn crash_child() {
    // Run directly (`--include-ignored`), it has nothing to do.
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let start: i64 = std::env::var(START_ENV).unwrap().parse().unwrap();
    let cf = open(&config(std::path::Path::new(&dir))).await;
    let mut next = start;
    loop {
        let batch: Vec<_> = (next..next + 5 * TX_ROWS).map(positioned).collect();
        cf.append(&batch).await.unwrap();
        next += 5 * TX_ROWS;
        println!("acked {}", next - 1);
    }
}

/// Runs the child from `start` until it acknowledged `acks` appends, SIGKILLs it, and
/// returns the last id it acknowledged.
async fn run_child_and_kill(dir: &std::path::Path, start: i64, acks: usize) -> i64 {
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "log_crash::crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir)
        .env(START_ENV, start.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the child");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut last = start - 1;
    let mut seen = 0;
    while seen < acks {
        let line = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .expect("the child makes progress")
            .unwrap()
            .expect("the child is alive");
        if let Some(id) = line.strip_prefix("acked ") {
            last = id.parse().unwrap();
            seen += 1;
        }
    }
    child.start_kill().expect("SIGKILL");
    child.wait().await.unwrap();
    last
}

fn ids(cf: &freshen_changefeed::Changefeed) -> Vec<i64> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = cf.read(after, 5000, &Filter::default()).unwrap();
        let Some(last) = page.last() else { return out };
        after = last.sequence;
        for e in &page {
            let j: serde_json::Value = serde_json::from_str(&e.json).unwrap();
            out.push(
                j["key"]
                    .as_str()
                    .unwrap()
                    .strip_prefix("orders:")
                    .unwrap()
                    .parse()
                    .unwrap(),
            );
        }
    }
}

#[tokio::test]
async fn sigkill_loses_no_acknowledged_append_and_a_replay_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut start = 0;
    for (round, acks) in [7usize, 23, 3, 41].into_iter().enumerate() {
        let acked = run_child_and_kill(dir.path(), start, acks).await;
        let cf = open(&config(dir.path())).await;
        let got = ids(&cf);
        let expected: Vec<i64> = (0..got.len() as i64).collect();
        assert_eq!(got, expected, "round {round}: every event once, in order");
        assert!(
            got.len() as i64 > acked,
            "round {round}: acknowledged up to {acked}, found {}",
            got.len()
        );
        cf.close().await;
        drop(cf);
        // The source replays from the start of the transaction holding the last
        // confirmed position minus a few rows: some of it is already in the log.
        start = ((acked - 3).max(0) / TX_ROWS) * TX_ROWS;
    }
    // A final replay in-process, and a check that nothing doubled.
    let cf = open(&config(dir.path())).await;
    let before = ids(&cf).len() as i64;
    let replay: Vec<_> = (start..before + 20).map(positioned).collect();
    let out = cf.append(&replay).await.unwrap();
    assert_eq!(out.duplicates as i64, before - start);
    assert_eq!(ids(&cf), (0..before + 20).collect::<Vec<_>>());
    cf.close().await;
}
