//! Whole-table runs (`Rebuild::whole`) against an in-memory rebuild that records its
//! calls: the first build of an empty table, a backlog past the threshold, a fan-out
//! estimated too large, failures by data and by the path, and the per-key mode.

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freshen::{
    BoxError, BoxFuture, Due, Expand, KeySink, Rebuild, RebuildBy, Refresher, Report, Retry,
    RowEvent, Whole, WholeDone, WholeWay, channel,
};
use support::*;

/// What the recording rebuild saw, in order: `call <n keys>` for a call of keys,
/// `whole <way> <txids>` for a whole-table run.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<String>>>);

impl Calls {
    fn push(&self, s: String) {
        self.0.lock().unwrap().push(s);
    }

    fn list(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn wholes(&self) -> Vec<String> {
        self.list()
            .into_iter()
            .filter(|c| c.starts_with("whole"))
            .collect()
    }
}

/// How the whole-table run behaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fails {
    Never,
    /// By the data (a key of it breaks the query), from this attempt on.
    ByData(u64),
    /// By the path, this many times before it works.
    ByPath(u64),
    /// By the path (its timeout, say) at this attempt only.
    ByPathAt(u64),
}

struct Table {
    calls: Calls,
    keys: Log,
    rows: AtomicU64,
    fails: Fails,
    attempts: AtomicU64,
    /// The whole-table run waits until this opens.
    gate: Arc<tokio::sync::Semaphore>,
    /// Keys whose rebuild fails by data.
    bad: Option<&'static str>,
}

#[derive(Clone)]
struct Recording(Arc<Table>);

impl Recording {
    fn new(rows: u64, fails: Fails, bad: Option<&'static str>) -> Recording {
        Recording(Arc::new(Table {
            calls: Calls::default(),
            keys: Log::default(),
            rows: AtomicU64::new(rows),
            fails,
            attempts: AtomicU64::new(0),
            gate: Arc::new(tokio::sync::Semaphore::new(1000)),
            bad,
        }))
    }

    fn held(self) -> Recording {
        self.0.gate.forget_permits(1000);
        self
    }

    fn open(&self) {
        self.0.gate.add_permits(1000);
    }
}

#[derive(Debug)]
struct DataError;

impl std::fmt::Display for DataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("division by zero")
    }
}

impl std::error::Error for DataError {}

fn classify(e: &BoxError) -> Retry {
    if e.is::<DataError>() {
        Retry::Key
    } else {
        Retry::Path
    }
}

impl Rebuild for Recording {
    fn rebuild<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move {
            self.0.calls.push(format!("call {}", due.len()));
            if let Some(bad) = self.0.bad
                && due.iter().any(|d| d.key.as_str() == Some(bad))
            {
                return Err(Box::new(DataError) as BoxError);
            }
            for d in due {
                self.0.keys.push(d.key.to_string());
            }
            Ok(())
        })
    }

    fn max_batch(&self) -> usize {
        64
    }

    fn bulk_batch(&self) -> usize {
        10_000
    }

    fn classify(&self, e: &BoxError) -> Retry {
        classify(e)
    }

    fn whole(&self) -> Option<Arc<dyn Whole>> {
        Some(Arc::new(self.clone()))
    }
}

impl Whole for Recording {
    fn rebuild_all<'a>(
        &'a self,
        way: WholeWay,
        txids: &'a [u64],
    ) -> BoxFuture<'a, Result<WholeDone, BoxError>> {
        Box::pin(async move {
            let _permit = self.0.gate.acquire().await.expect("gate");
            self.0.calls.push(format!("whole {} {txids:?}", way.name()));
            let attempt = self.0.attempts.fetch_add(1, Ordering::Relaxed);
            match self.0.fails {
                Fails::ByData(from) if attempt >= from => {
                    return Err(Box::new(DataError) as BoxError);
                }
                Fails::ByPath(n) if attempt < n => return Err("connection refused".into()),
                Fails::ByPathAt(n) if attempt == n => {
                    return Err("canceling statement due to statement timeout".into());
                }
                _ => {}
            }
            let rows = self.0.rows.load(Ordering::Relaxed);
            if way == WholeWay::Build && rows > 0 {
                return Ok(WholeDone {
                    rows,
                    written: 0,
                    built: false,
                });
            }
            let rows = rows.max(10);
            self.0.rows.store(rows, Ordering::Relaxed);
            Ok(WholeDone {
                rows,
                written: rows,
                built: way == WholeWay::Build,
            })
        })
    }

    fn classify(&self, e: &BoxError) -> Retry {
        classify(e)
    }
}

fn readings(n: usize, xid: u64) -> Vec<RowEvent> {
    (0..n)
        .map(|i| reading_in_tx(&format!("d{i}"), 1, xid))
        .collect()
}

fn refresher(
    rebuild: &Recording,
    by: RebuildBy,
    source: freshen::ChannelSource,
    reports: &Log,
) -> Refresher {
    let rep = reports.clone();
    Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild_with(rebuild.clone())
        .rebuild_by(by)
        .coalesce(10 * MS)
        .backoff(50 * MS, 200 * MS)
        .poison_after(2)
        .on_error(move |r: &Report<'_>| rep.push(r.to_string()))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_empty_table_is_built_whole_first_and_keys_dirtied_meanwhile_after() {
    let (feed, source) = channel(8);
    let table = Recording::new(0, Fails::Never, None).held();
    let (acks, reports) = (Acks::default(), Log::default());
    let r = refresher(&table, RebuildBy::Auto, source, &reports);
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    // The build waits at its gate; a change meanwhile is not rebuilt beside it.
    feed.send(acks.batch(1, readings(3, 7))).await.unwrap();
    waiting(&mut run, "the build runs", Duration::from_secs(1), || {
        h.stats().whole_running.is_some()
    })
    .await;
    meanwhile(&mut run, tokio::time::sleep(Duration::from_millis(200))).await;
    assert!(table.0.keys.list().is_empty(), "nothing beside the build");
    assert!(acks.list().is_empty(), "not before the keys are rebuilt");
    let running = h.stats().whole_running.expect("running");
    assert_eq!(
        (running.reason, running.way, running.keys),
        ("build", "build", 0)
    );
    table.open();
    waiting(
        &mut run,
        "the keys after the build",
        Duration::from_secs(5),
        || table.0.keys.list().len() == 3,
    )
    .await;
    assert_eq!(acks.list(), [1]);
    let calls = table.0.calls.list();
    assert_eq!(calls[0], "whole build []", "{calls:?}");
    assert!(
        calls[1..].iter().all(|c| c.starts_with("call")),
        "{calls:?}"
    );
    let s = h.stats();
    assert_eq!((s.whole_runs, s.whole_keys, s.table_rows), (1, 0, Some(10)));
    assert!(s.whole_running.is_none());
    assert!(reports.list().iter().any(|r| r.starts_with("first build")));
}

#[tokio::test(start_paused = true)]
async fn a_table_that_holds_rows_is_not_rebuilt_at_start() {
    let (feed, source) = channel(8);
    let table = Recording::new(5000, Fails::Never, None);
    let (acks, reports) = (Acks::default(), Log::default());
    let r = refresher(&table, RebuildBy::Auto, source, &reports);
    let h = r.handle();
    feed.send(acks.batch(1, readings(2, 3))).await.unwrap();
    drop(feed);
    within(
        "drains",
        Duration::from_secs(5),
        r.run(std::future::pending()),
    )
    .await
    .unwrap();
    assert_eq!(table.0.calls.wholes(), ["whole build []"]);
    let s = h.stats();
    assert_eq!(s.whole_runs, 0, "a build that found rows is no run");
    assert_eq!(s.table_rows, Some(5000));
    // 5000 rows × 2 µs / 10 µs / 0.8: a quarter of the table, at least 1000 keys.
    assert_eq!(s.whole_threshold, Some(1250));
    assert_eq!(acks.list(), [1]);
    assert!(
        reports
            .list()
            .iter()
            .any(|r| r.contains("first build not needed"))
    );
}

#[tokio::test(start_paused = true)]
async fn a_backlog_past_the_threshold_goes_whole_and_is_confirmed_after_it_commits() {
    let (feed, source) = channel(8);
    let table = Recording::new(4000, Fails::Never, None);
    let (acks, reports) = (Acks::default(), Log::default());
    let r = refresher(&table, RebuildBy::Auto, source, &reports);
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(
        &mut run,
        "the start-up check",
        Duration::from_secs(1),
        || h.stats().table_rows == Some(4000),
    )
    .await;
    // A small batch stays per key.
    feed.send(acks.batch(1, readings(50, 5))).await.unwrap();
    waiting(&mut run, "per key", Duration::from_secs(5), || {
        acks.list() == [1]
    })
    .await;
    assert_eq!(h.stats().whole_runs, 0);
    assert_eq!(h.stats().set_calls, 0, "50 keys are no set");
    // Past the threshold (1000 keys of 4000 rows), in one batch: the whole table,
    // covering every waiting key, and its transaction seen.
    table.0.gate.forget_permits(1000);
    feed.send(acks.batch(2, readings(1500, 9))).await.unwrap();
    waiting(&mut run, "the whole run", Duration::from_secs(5), || {
        h.stats().whole_running.is_some()
    })
    .await;
    let running = h.stats().whole_running.expect("running");
    assert_eq!(
        (running.reason, running.way, running.keys),
        ("backlog", "replace", 1500)
    );
    // A change to a covered key while it runs: queued again, rebuilt after it.
    feed.send(acks.batch(3, vec![reading_in_tx("d7", 2, 11)]))
        .await
        .unwrap();
    meanwhile(&mut run, tokio::time::sleep(Duration::from_millis(300))).await;
    assert_eq!(acks.list(), [1], "confirmed only once the run commits");
    table.open();
    waiting(&mut run, "all confirmed", Duration::from_secs(5), || {
        acks.list() == [1, 2, 3]
    })
    .await;
    assert_eq!(table.0.calls.wholes()[1], "whole replace [9]");
    assert_eq!(
        table.0.keys.count("d7"),
        2,
        "per key before, and again after"
    );
    assert_eq!(table.0.keys.count("d1000"), 0, "covered by the run alone");
    let s = h.stats();
    assert_eq!((s.whole_runs, s.whole_keys), (1, 1500));
    assert_eq!(s.rebuilds_ok, 50 + 1500 + 1);
}

#[tokio::test(start_paused = true)]
async fn a_whole_run_failing_by_data_finds_the_failing_key_by_halves() {
    let (feed, source) = channel(8);
    // The start-up check works; the backlog's run fails on d333's data.
    let table = Recording::new(4000, Fails::ByData(1), Some("d333"));
    let (acks, reports) = (Acks::default(), Log::default());
    let r = refresher(&table, RebuildBy::Auto, source, &reports);
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(
        &mut run,
        "the start-up check",
        Duration::from_secs(1),
        || h.stats().table_rows == Some(4000),
    )
    .await;
    feed.send(acks.batch(1, readings(1500, 4))).await.unwrap();
    waiting(
        &mut run,
        "the healthy keys",
        Duration::from_secs(30),
        || table.0.keys.list().len() == 1499,
    )
    .await;
    waiting(
        &mut run,
        "the bad key quarantined",
        Duration::from_secs(30),
        || h.stats().poisoned == 1,
    )
    .await;
    assert_eq!(table.0.keys.count("d333"), 0);
    assert_eq!(table.0.calls.wholes().len(), 2, "no run tried again");
    let s = h.stats();
    assert_eq!((s.whole_runs, s.whole_failures, s.keys_poisoned), (0, 1, 1));
    assert!(
        reports
            .list()
            .iter()
            .any(|r| r.contains("whole-table run (backlog) failed, its keys are rebuilt in halves"))
    );
    // Without a sweep, the bad key's batch stays unconfirmed; nothing else is lost.
    assert!(acks.list().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_first_build_failing_by_data_leaves_the_table_to_its_keys() {
    let (feed, source) = channel(8);
    let table = Recording::new(0, Fails::ByData(0), None);
    let (acks, reports) = (Acks::default(), Log::default());
    let r = refresher(&table, RebuildBy::Auto, source, &reports);
    let h = r.handle();
    feed.send(acks.batch(1, readings(3, 4))).await.unwrap();
    drop(feed);
    within(
        "drains",
        Duration::from_secs(10),
        r.run(std::future::pending()),
    )
    .await
    .unwrap();
    let s = h.stats();
    assert_eq!(s.build_failed.as_deref(), Some("division by zero"));
    assert_eq!(
        (s.whole_runs, s.whole_failures, s.whole_threshold),
        (0, 1, None)
    );
    assert_eq!(table.0.keys.list().len(), 3, "the changed keys are rebuilt");
    assert_eq!(acks.list(), [1]);
    assert!(reports.list().iter().any(|r| {
        r.contains("whole-table run (build) failed, the table holds only the keys rebuilt since")
    }));
}

#[tokio::test(start_paused = true)]
async fn a_whole_run_failing_by_the_path_is_tried_again() {
    let (feed, source) = channel(8);
    let table = Recording::new(0, Fails::ByPath(2), None);
    let (acks, reports) = (Acks::default(), Log::default());
    let r = refresher(&table, RebuildBy::Auto, source, &reports);
    let h = r.handle();
    feed.send(acks.batch(1, readings(2, 3))).await.unwrap();
    drop(feed);
    within(
        "drains",
        Duration::from_secs(10),
        r.run(std::future::pending()),
    )
    .await
    .unwrap();
    assert_eq!(
        table.0.calls.wholes(),
        ["whole build []", "whole build []", "whole build []"]
    );
    let s = h.stats();
    assert_eq!((s.whole_runs, s.whole_failures), (1, 2));
    assert!(s.stalled_since.is_none(), "recovered");
    assert_eq!(acks.list(), [1]);
    let r = reports.list();
    assert!(
        r.iter()
            .any(|l| l.contains("rebuilds cannot reach the database"))
    );
    assert!(r.iter().any(|l| l.contains("rebuilds work again")));
}

#[tokio::test(start_paused = true)]
async fn a_backlog_run_failing_by_the_path_falls_back_to_set_work() {
    let (feed, source) = channel(8);
    let table = Recording::new(4000, Fails::ByPathAt(1), None);
    let (acks, reports) = (Acks::default(), Log::default());
    let r = refresher(&table, RebuildBy::Auto, source, &reports);
    let h = r.handle();
    feed.send(acks.batch(1, readings(1500, 4))).await.unwrap();
    drop(feed);
    within(
        "drains",
        Duration::from_secs(30),
        r.run(std::future::pending()),
    )
    .await
    .unwrap();
    assert_eq!(acks.list(), [1]);
    assert_eq!(table.0.keys.list().len(), 1500, "every key by set work");
    assert_eq!(
        table.0.calls.wholes().len(),
        2,
        "the check and the failed run only"
    );
    let s = h.stats();
    assert_eq!((s.whole_runs, s.whole_failures), (0, 1));
    assert!(s.stalled_since.is_none(), "the calls after it worked");
}

#[tokio::test(start_paused = true)]
async fn a_sweep_is_one_whole_diff_and_covers_a_truncate() {
    let (feed, source) = channel(8);
    let table = Recording::new(4000, Fails::Never, None);
    let (acks, reports) = (Acks::default(), Log::default());
    let listed = Log::default();
    let (rep, l) = (reports.clone(), listed.clone());
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild_with(table.clone())
        .coalesce(10 * MS)
        .reconcile(Duration::from_secs(3600), move || {
            l.push("listed");
            std::future::ready(Ok::<_, std::io::Error>(Vec::new()))
        })
        .on_error(move |r: &Report<'_>| rep.push(r.to_string()))
        .build()
        .unwrap();
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    // At start: the build finds rows, so the start-up sweep is a diff of the table.
    waiting(
        &mut run,
        "the start-up sweep",
        Duration::from_secs(5),
        || h.stats().reconciles == 1,
    )
    .await;
    assert_eq!(table.0.calls.wholes(), ["whole build []", "whole diff []"]);
    // A TRUNCATE of a watched table asks for a sweep: another diff, and the TRUNCATE's
    // batch is confirmed only once it committed.
    table.0.gate.forget_permits(1000);
    feed.send(acks.batch(1, vec![truncate("readings")]))
        .await
        .unwrap();
    waiting(&mut run, "the sweep's run", Duration::from_secs(5), || {
        h.stats().whole_running.is_some()
    })
    .await;
    meanwhile(&mut run, tokio::time::sleep(Duration::from_millis(200))).await;
    assert!(acks.list().is_empty(), "not before the diff commits");
    table.open();
    waiting(
        &mut run,
        "the TRUNCATE covered",
        Duration::from_secs(5),
        || acks.list() == [1],
    )
    .await;
    assert_eq!(h.stats().reconciles, 2);
    assert_eq!(table.0.calls.wholes().len(), 3);
    assert!(listed.list().is_empty(), "no key was ever listed");
    assert_eq!(
        reports
            .list()
            .iter()
            .filter(|r| r.contains("for a sweep"))
            .count(),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn a_first_build_covers_the_start_up_sweep() {
    let (feed, source) = channel(8);
    let table = Recording::new(0, Fails::Never, None);
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild_with(table.clone())
        .reconcile(Duration::from_secs(3600), || {
            std::future::ready(Ok::<_, std::io::Error>(Vec::new()))
        })
        .build()
        .unwrap();
    let h = r.handle();
    drop(feed);
    within(
        "drains",
        Duration::from_secs(5),
        r.run(std::future::pending()),
    )
    .await
    .unwrap();
    assert_eq!(
        table.0.calls.wholes(),
        ["whole build []"],
        "no diff after it"
    );
    assert_eq!(h.stats().reconciles, 1);
}

/// Sends nothing, estimates `n` keys per parent.
struct Estimated(u64, Calls);

impl Expand for Estimated {
    fn expand<'a>(&'a self, due: &'a [Due], _: &'a KeySink) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move {
            self.1.push(format!("expand {}", due.len()));
            Ok(())
        })
    }

    fn estimate<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<Option<u64>, BoxError>> {
        Box::pin(async move { Ok(Some(self.0 * due.len() as u64)) })
    }
}

#[tokio::test(start_paused = true)]
async fn a_fan_out_estimated_past_the_threshold_goes_whole_unexpanded() {
    for (estimate, whole) in [(3000, true), (100, false)] {
        let (feed, source) = channel(8);
        let table = Recording::new(4000, Fails::Never, None);
        let (acks, reports) = (Acks::default(), Log::default());
        let expanded = Calls::default();
        let rep = reports.clone();
        let r = Refresher::builder()
            .source(source)
            .scope(scope)
            .fan_out(
                |e: &RowEvent| e.scope_keys(&["plan"]),
                Estimated(estimate, expanded.clone()),
            )
            .rebuild_with(table.clone())
            .coalesce(10 * MS)
            .on_error(move |r: &Report<'_>| rep.push(r.to_string()))
            .build()
            .unwrap();
        let h = r.handle();
        let plan = freshen::RowEvent::new("public", "plans", freshen::Op::Update)
            .with_new(freshen::Row::from_pairs([("plan", freshen::Value::Int(1))]))
            .with_tx(freshen::Tx {
                id: 42,
                commit: 4200,
                index: 0,
            });
        feed.send(acks.batch(1, vec![plan])).await.unwrap();
        drop(feed);
        within(
            "drains",
            Duration::from_secs(5),
            r.run(std::future::pending()),
        )
        .await
        .unwrap();
        assert_eq!(acks.list(), [1], "estimate {estimate}");
        let s = h.stats();
        if whole {
            assert!(expanded.list().is_empty(), "never expanded");
            assert_eq!(table.0.calls.wholes()[1], "whole replace [42]");
            assert_eq!((s.whole_runs, s.whole_keys), (1, 1));
            assert!(
                reports
                    .list()
                    .iter()
                    .any(|r| r.contains("for a fan-out covering 1 waiting keys"))
            );
        } else {
            assert_eq!(expanded.list(), ["expand 1"]);
            assert_eq!(s.whole_runs, 0);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn per_key_mode_never_builds_nor_goes_whole_and_set_mode_always_sets() {
    let (feed, source) = channel(8);
    let table = Recording::new(0, Fails::Never, None);
    let (acks, reports) = (Acks::default(), Log::default());
    let r = refresher(&table, RebuildBy::PerKey, source, &reports);
    let h = r.handle();
    feed.send(acks.batch(1, readings(1500, 3))).await.unwrap();
    drop(feed);
    within(
        "drains",
        Duration::from_secs(10),
        r.run(std::future::pending()),
    )
    .await
    .unwrap();
    assert!(table.0.calls.wholes().is_empty());
    let s = h.stats();
    assert_eq!((s.whole_runs, s.set_calls, s.whole_threshold), (0, 0, None));
    assert!(
        table.0.calls.list().iter().all(|c| c
            .strip_prefix("call ")
            .and_then(|n| n.parse::<usize>().ok())
            <= Some(64)),
        "batches of the rebuild's size only"
    );
    assert_eq!(acks.list(), [1]);

    // `set`: one set call for a trickle of three keys.
    let (feed, source) = channel(8);
    let table = Recording::new(100, Fails::Never, None);
    let r = refresher(&table, RebuildBy::Set, source, &reports);
    feed.send(acks.batch(2, readings(3, 4))).await.unwrap();
    drop(feed);
    within(
        "drains",
        Duration::from_secs(10),
        r.run(std::future::pending()),
    )
    .await
    .unwrap();
    let calls: Vec<String> = table
        .0
        .calls
        .list()
        .into_iter()
        .filter(|c| c.starts_with("call"))
        .collect();
    assert_eq!(calls, ["call 3"]);
}
