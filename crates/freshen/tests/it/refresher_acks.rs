//! After-rebuild acknowledgement: order, timing, crashes and TRUNCATE.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freshen::{Key, Refresher, channel};
use support::*;
use tokio::sync::Semaphore;

/// A rebuild whose calls block per key until the test opens that key's gate.
#[derive(Clone, Default)]
struct Gates {
    gates: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
    done: Log,
}

impl Gates {
    fn gate(&self, key: &str) -> Arc<Semaphore> {
        self.gates
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(0)))
            .clone()
    }

    fn open(&self, key: &str, n: usize) {
        self.gate(key).add_permits(n);
    }

    fn rebuild(&self) -> impl Fn(Key) -> BoxFut + Send + Sync + 'static {
        let me = self.clone();
        move |key: Key| {
            let me = me.clone();
            Box::pin(async move {
                let name = key.to_string();
                let gate = me.gate(&name);
                gate.acquire().await.unwrap().forget();
                me.done.push(name);
                Ok(())
            })
        }
    }
}

type BoxFut =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), std::io::Error>> + Send>>;

#[tokio::test(start_paused = true)]
async fn acks_arrive_in_order_and_only_after_the_rebuilds() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let gates = Gates::default();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(gates.rebuild())
        .coalesce(10 * MS)
        .build()
        .unwrap();
    let h = r.handle();
    feed.send(acks.batch(1, vec![reading("slow", 1)]))
        .await
        .unwrap();
    feed.send(acks.batch(2, vec![reading("fast", 1)]))
        .await
        .unwrap();
    feed.send(acks.batch(3, vec![])).await.unwrap();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    gates.open("fast", 1);
    waiting(&mut run, "fast rebuilt", Duration::from_secs(1), || {
        gates.done.list() == ["fast"]
    })
    .await;
    assert!(acks.list().is_empty(), "batch 2 waits for batch 1");
    assert_eq!(h.stats().unacked_batches, 3);
    gates.open("slow", 1);
    waiting(&mut run, "all acked", Duration::from_secs(1), || {
        acks.list().len() == 3
    })
    .await;
    assert_eq!(acks.list(), [1, 2, 3]);
    drop(feed);
    within("drain", Duration::from_secs(5), run).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_batch_arriving_during_a_rebuild_waits_for_the_next_rebuild() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let gates = Gates::default();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(gates.rebuild())
        .coalesce(10 * MS)
        .build()
        .unwrap();
    let h = r.handle();
    feed.send(acks.batch(1, vec![reading("a", 1)]))
        .await
        .unwrap();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(&mut run, "rebuild started", Duration::from_secs(1), || {
        h.stats().in_flight == 1
    })
    .await;
    // Batch 2 arrives while a's first rebuild runs: that rebuild cannot cover it.
    feed.send(acks.batch(2, vec![reading("a", 2)]))
        .await
        .unwrap();
    waiting(&mut run, "batch 2 received", Duration::from_secs(1), || {
        h.stats().batches_received == 2
    })
    .await;
    gates.open("a", 1);
    waiting(&mut run, "batch 1 acked", Duration::from_secs(1), || {
        acks.list() == [1]
    })
    .await;
    // Nothing else will come unless a second rebuild of a runs.
    meanwhile(&mut run, tokio::time::sleep(Duration::from_secs(1))).await;
    assert_eq!(acks.list(), [1]);
    assert_eq!(h.stats().in_flight, 1, "the second rebuild of a is running");
    gates.open("a", 1);
    waiting(&mut run, "batch 2 acked", Duration::from_secs(1), || {
        acks.list() == [1, 2]
    })
    .await;
    drop(feed);
    within("drain", Duration::from_secs(5), run).await.unwrap();
    assert_eq!(gates.done.list(), ["a", "a"]);
}

#[tokio::test(start_paused = true)]
async fn a_crash_mid_rebuild_leaves_unrebuilt_batches_unacked() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let gates = Gates::default();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(gates.rebuild())
        .coalesce(10 * MS)
        .build()
        .unwrap();
    let h = r.handle();
    feed.send(acks.batch(1, vec![reading("a", 1)]))
        .await
        .unwrap();
    feed.send(acks.batch(2, vec![reading("b", 1)]))
        .await
        .unwrap();
    feed.send(acks.batch(3, vec![reading("a", 2)]))
        .await
        .unwrap();
    gates.open("a", 2);
    {
        let run = r.run(std::future::pending());
        tokio::pin!(run);
        waiting(
            &mut run,
            "a rebuilt, b stuck",
            Duration::from_secs(1),
            || gates.done.list() == ["a"] && h.stats().in_flight == 1,
        )
        .await;
        // The run future is dropped here: a crash in the middle of b's rebuild.
    }
    assert_eq!(acks.list(), [1]);
    gates.open("b", 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(acks.list(), [1], "nothing is acknowledged after the crash");
    assert_eq!(
        gates.done.list(),
        ["a"],
        "the aborted rebuild did not complete"
    );
    drop(feed);
}

#[tokio::test(start_paused = true)]
async fn truncate_sweeps_at_once_and_holds_its_batch_until_the_sweep_is_rebuilt() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let gates = Gates::default();
    let sweeps = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sw = sweeps.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(gates.rebuild())
        .coalesce(10 * MS)
        .reconcile(Duration::from_secs(3600), move || {
            sw.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<_, std::io::Error>(vec![Key::from("t1"), Key::from("t2")]) }
        })
        .build()
        .unwrap();
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    gates.open("t1", 1);
    gates.open("t2", 1);
    waiting(
        &mut run,
        "start-up sweep rebuilt",
        Duration::from_secs(1),
        || h.stats().rebuilds_ok == 2,
    )
    .await;
    feed.send(acks.batch(1, vec![truncate("readings")]))
        .await
        .unwrap();
    feed.send(acks.batch(2, vec![])).await.unwrap();
    waiting(
        &mut run,
        "second sweep listed",
        Duration::from_secs(1),
        || h.stats().reconcile_keys == 4,
    )
    .await;
    assert_eq!(h.stats().truncates, 1);
    assert!(
        acks.list().is_empty(),
        "the TRUNCATE waits for its sweep's rebuilds"
    );
    gates.open("t1", 1);
    gates.open("t2", 1);
    waiting(&mut run, "acked", Duration::from_secs(1), || {
        acks.list() == [1, 2]
    })
    .await;
    assert_eq!(sweeps.load(std::sync::atomic::Ordering::SeqCst), 2);
    drop(feed);
    within("drain", Duration::from_secs(5), run).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn truncate_without_reconcile_is_reported_and_acked() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let rep = reports.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(Gates::default().rebuild())
        .on_error(move |r: &freshen::Report<'_>| rep.lock().unwrap().push(r.to_string()))
        .build()
        .unwrap();
    feed.send(acks.batch(1, vec![truncate("readings")]))
        .await
        .unwrap();
    drop(feed);
    within(
        "drain",
        Duration::from_secs(5),
        r.run(std::future::pending()),
    )
    .await
    .unwrap();
    assert_eq!(acks.list(), [1]);
    let reports = reports.lock().unwrap();
    assert_eq!(reports.len(), 1);
    assert!(
        reports[0].contains("public.readings was truncated"),
        "{reports:?}"
    );
}
