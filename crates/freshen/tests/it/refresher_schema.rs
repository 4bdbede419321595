//! Gaps (rows the stream did not carry) sweep the views over their table; schema changes
//! that break a view's key pause it, holding its keys and acks, until undone.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freshen::{Difference, Gap, Key, Refresher, Report, SchemaChange, channel};
use support::*;

fn dropped(column: &str) -> SchemaChange {
    SchemaChange {
        schema: "public".into(),
        table: "readings".into(),
        differences: vec![Difference::ColumnDropped {
            column: column.into(),
        }],
    }
}

fn reading_without_device(value: i64) -> freshen::RowEvent {
    freshen::RowEvent::new("public", "readings", freshen::Op::Insert).with_new(
        freshen::Row::from_pairs([("value", freshen::Value::Int(value))]),
    )
}

fn restored() -> SchemaChange {
    SchemaChange {
        schema: "public".into(),
        table: "readings".into(),
        differences: Vec::new(),
    }
}

/// Report texts, by kind, as the refresher gave them.
#[derive(Clone, Default)]
struct Reports(Arc<Mutex<Vec<String>>>);

impl Reports {
    fn hook(&self) -> impl Fn(&Report<'_>) + Send + Sync + 'static {
        let log = self.0.clone();
        move |r: &Report<'_>| {
            let kind = match r {
                Report::Gap { .. } => "gap",
                Report::Paused { .. } => "paused",
                Report::Resumed { .. } => "resumed",
                Report::SchemaChanged { .. } => "changed",
                _ => return,
            };
            log.lock().unwrap().push(format!("{kind}: {r}"));
        }
    }

    fn of(&self, kind: &str) -> Vec<String> {
        let prefix = format!("{kind}: ");
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.starts_with(&prefix))
            .cloned()
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn a_gap_in_a_watched_table_sweeps_and_holds_its_batch_until_then() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let reports = Reports::default();
    let rebuilt = Log::default();
    let sweeps = Arc::new(AtomicUsize::new(0));
    let (sw, log) = (sweeps.clone(), rebuilt.clone());
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .watches("public", "readings", &["device"])
        .rebuild(move |k: Key| {
            log.push(k.to_string());
            async { Ok::<_, std::io::Error>(()) }
        })
        .coalesce(10 * MS)
        .reconcile(Duration::from_secs(3600), move || {
            sw.fetch_add(1, SeqCst);
            async { Ok::<_, std::io::Error>(vec![Key::from("d1")]) }
        })
        .on_error(reports.hook())
        .build()
        .unwrap();
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    waiting(&mut run, "start-up sweep", Duration::from_secs(1), || {
        h.stats().rebuilds_ok == 1
    })
    .await;

    // A gap in another table concerns another view.
    let other = Gap::new("public", "other", "key-only message");
    feed.send(acks.batch(1, vec![]).with_gaps(vec![other]))
        .await
        .unwrap();
    waiting(&mut run, "batch 1 acked", Duration::from_secs(1), || {
        acks.list() == [1]
    })
    .await;
    assert_eq!(h.stats().gaps, 0);
    assert_eq!(sweeps.load(SeqCst), 1, "no sweep for an unwatched table");

    // Two gaps in the watched table: both sweep (one report until the sweep ends).
    let gap = Gap::new(
        "public",
        "readings",
        "key-only message (_tidb.onlyHandleKey)",
    );
    feed.send(acks.batch(2, vec![]).with_gaps(vec![gap.clone(), gap]))
        .await
        .unwrap();
    waiting(&mut run, "batch 2 acked", Duration::from_secs(1), || {
        acks.list() == [1, 2]
    })
    .await;
    assert_eq!(h.stats().gaps, 2);
    assert_eq!(sweeps.load(SeqCst), 2, "the gap swept the view");
    assert_eq!(rebuilt.count("d1"), 2, "the sweep's key was rebuilt");
    let gaps = reports.of("gap");
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert!(gaps[0].contains("public.readings") && gaps[0].contains("onlyHandleKey"));
    assert!(
        h.stats().unhealed_gaps.is_empty(),
        "a sweep heals the gap: nothing for a person to do"
    );
    drop(feed);
}

#[tokio::test(start_paused = true)]
async fn a_gap_without_a_sweep_is_reported_as_unhealed() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let reports = Reports::default();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .rebuild(|_k: Key| async { Ok::<_, std::io::Error>(()) })
        .on_error(reports.hook())
        .build()
        .unwrap();
    let h = r.handle();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    let gap = Gap::new("demo", "readings", "a statement instead of rows");
    feed.send(acks.batch(1, vec![]).with_gaps(vec![gap]))
        .await
        .unwrap();
    waiting(&mut run, "acked", Duration::from_secs(1), || {
        acks.list() == [1]
    })
    .await;
    assert_eq!(
        h.stats().gaps,
        1,
        "a view that declared nothing watches every table"
    );
    let gaps = reports.of("gap");
    assert_eq!(gaps.len(), 1);
    assert!(gaps[0].contains("no reconcile sweep"), "{}", gaps[0]);
    // Nothing heals it by itself: the view says so, whatever comes next, until a
    // person acknowledges it.
    assert_eq!(
        h.stats().unhealed_gaps,
        ["demo.readings: a statement instead of rows"]
    );
    feed.send(acks.batch(2, vec![reading("d1", 1)]))
        .await
        .unwrap();
    waiting(&mut run, "acked", Duration::from_secs(1), || {
        acks.list() == [1, 2]
    })
    .await;
    assert_eq!(
        h.stats().unhealed_gaps.len(),
        1,
        "later changes heal nothing"
    );
    let seen = h.acknowledge_gaps();
    assert_eq!(seen, ["demo.readings: a statement instead of rows"]);
    waiting(&mut run, "acknowledged", Duration::from_secs(1), || {
        h.stats().unhealed_gaps.is_empty()
    })
    .await;
    // A later gap is reported anew.
    let again = Gap::new("demo", "readings", "a table back in the publication");
    feed.send(acks.batch(3, vec![]).with_gaps(vec![again]))
        .await
        .unwrap();
    waiting(&mut run, "the later gap", Duration::from_secs(1), || {
        h.stats().unhealed_gaps == ["demo.readings: a table back in the publication"]
    })
    .await;
    drop(feed);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_key_column_pauses_the_view_until_it_is_back() {
    let (feed, source) = channel(8);
    let mut branches = freshen::fanout(source, 2).into_iter();
    let acks = Acks::default();
    let reports = Reports::default();
    let (keyed, other) = (Log::default(), Log::default());
    let sweeps = Arc::new(AtomicUsize::new(0));
    let (log, sw) = (keyed.clone(), sweeps.clone());
    // This view keys on `device`; the other on `value`, which stays.
    let paused = Refresher::builder()
        .source(branches.next().unwrap())
        .scope(scope)
        .watches("public", "readings", &["device"])
        .rebuild(move |k: Key| {
            log.push(k.to_string());
            async { Ok::<_, std::io::Error>(()) }
        })
        .coalesce(10 * MS)
        .reconcile(Duration::from_secs(3600), move || {
            let n = sw.fetch_add(1, SeqCst);
            async move {
                Ok::<_, std::io::Error>(if n == 0 {
                    vec![]
                } else {
                    vec![Key::from("swept")]
                })
            }
        })
        .on_error(reports.hook())
        .build()
        .unwrap();
    let log = other.clone();
    let going = Refresher::builder()
        .source(branches.next().unwrap())
        .scope(|e: &freshen::RowEvent| e.scope_keys(&["value"]))
        .watches("public", "readings", &["value"])
        .rebuild(move |k: Key| {
            log.push(k.to_string());
            async { Ok::<_, std::io::Error>(()) }
        })
        .coalesce(10 * MS)
        .build()
        .unwrap();
    let (hp, hg) = (paused.handle(), going.handle());
    let run = async {
        let (a, b) = tokio::join!(
            paused.run(std::future::pending()),
            going.run(std::future::pending())
        );
        (a, b)
    };
    tokio::pin!(run);

    feed.send(
        acks.batch(1, vec![reading("d1", 5)])
            .with_schema_changes(vec![dropped("device")]),
    )
    .await
    .unwrap();
    waiting(
        &mut run,
        "the other view rebuilt",
        Duration::from_secs(1),
        || other.list() == ["5"],
    )
    .await;
    // Long past the debounce: the paused view rebuilt nothing and holds the batch.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(keyed.list().is_empty(), "{:?}", keyed.list());
    assert!(acks.list().is_empty(), "the batch stays unconfirmed");
    let s = hp.stats();
    assert_eq!(s.dirty, 1, "its key stays dirty");
    assert_eq!(s.paused, ["public.readings: column device dropped"]);
    assert_eq!(s.schema_changes, 1);
    assert!(hg.stats().paused.is_empty());
    let p = reports.of("paused");
    assert_eq!(p.len(), 1);
    assert!(p[0].contains("column device dropped"), "{}", p[0]);

    // A change whose key went with the column: its batch waits for the resume's sweep.
    feed.send(acks.batch(2, vec![reading_without_device(7)]))
        .await
        .unwrap();
    waiting(
        &mut run,
        "the other view rebuilt again",
        Duration::from_secs(1),
        || other.sorted() == ["5", "7"],
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(acks.list().is_empty(), "held while paused");

    // The column is back: the view resumes, rebuilds, sweeps, and the batches go.
    feed.send(acks.batch(3, vec![]).with_schema_changes(vec![restored()]))
        .await
        .unwrap();
    waiting(
        &mut run,
        "every batch acked",
        Duration::from_secs(5),
        || acks.list() == [1, 2, 3],
    )
    .await;
    assert!(hp.stats().paused.is_empty());
    assert_eq!(
        keyed.sorted(),
        ["d1", "swept"],
        "its key, then the resume's sweep"
    );
    assert_eq!(reports.of("resumed").len(), 1);
    drop(feed);
}

#[tokio::test(start_paused = true)]
async fn an_added_column_is_reported_and_pauses_nothing() {
    let (feed, source) = channel(8);
    let acks = Acks::default();
    let reports = Reports::default();
    let rebuilt = Log::default();
    let log = rebuilt.clone();
    let r = Refresher::builder()
        .source(source)
        .scope(scope)
        .watches("public", "readings", &["device"])
        .rebuild(move |k: Key| {
            log.push(k.to_string());
            async { Ok::<_, std::io::Error>(()) }
        })
        .coalesce(10 * MS)
        .on_error(reports.hook())
        .build()
        .unwrap();
    let run = r.run(std::future::pending());
    tokio::pin!(run);
    let added = SchemaChange {
        schema: "public".into(),
        table: "readings".into(),
        differences: vec![
            Difference::ColumnAdded {
                column: "unit".into(),
            },
            Difference::ColumnDropped {
                column: "note".into(),
            },
        ],
    };
    feed.send(
        acks.batch(1, vec![reading("d1", 1)])
            .with_schema_changes(vec![added]),
    )
    .await
    .unwrap();
    waiting(
        &mut run,
        "rebuilt and acked",
        Duration::from_secs(1),
        || acks.list() == [1] && rebuilt.list() == ["d1"],
    )
    .await;
    assert!(reports.of("paused").is_empty());
    assert_eq!(reports.of("changed").len(), 1);
    drop(feed);
}
