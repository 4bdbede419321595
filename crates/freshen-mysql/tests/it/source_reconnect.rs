//! The source survives a server restart: it reconnects with backoff, resumes after the
//! last transaction it saw, and counts the reconnect. An outage longer than
//! `reconnect_deadline_s` is reported to the consumer, and reconnecting goes on.

use crate::support;

use std::time::Duration;

use freshen::{Retry, Source, Value};
use support::*;

/// One server for both claims: the outage is reported (past a deadline of 0 s: at the
/// first failed reconnect), and the source comes back after it, losing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_server_restarts_and_loses_nothing() {
    let mut db = server();
    let mut c = sql(&db).await;
    exec(&mut c, "CREATE TABLE app.t (id INT PRIMARY KEY)").await;
    let mut cfg = config(&db, "rc", &["app.t"]);
    cfg.reconnect_deadline_s = 0;
    let mut src = source(cfg).await;
    exec(&mut c, "INSERT INTO app.t VALUES (1)").await;
    take_events(&mut src, 1, 30).await;
    drop(c);

    db.stop().expect("stop the server");
    // Past the deadline the consumer hears of the outage: an error it may read past.
    let outage = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match src.next_batch().await.expect("the stream goes on") {
                Err(e) => break e,
                Ok(b) => assert!(b.events().is_empty(), "no rows while the server is down"),
            }
        }
    })
    .await
    .expect("the outage is reported within 60 s");
    assert_eq!(outage.retry(), Retry::Path, "{outage}");
    assert!(!outage.is_final(), "{outage}");
    assert!(!src.handle().health().streaming);

    db.start_again().expect("start the server again");
    let mut c = sql(&db).await;
    exec(
        &mut c,
        "INSERT INTO app.t VALUES (2); INSERT INTO app.t VALUES (3)",
    )
    .await;
    let evs = events(&take_events(&mut src, 2, 60).await);
    let ids: Vec<&Value> = evs
        .iter()
        .filter_map(|e| e.new.as_ref()?.get("id"))
        .collect();
    assert_eq!(
        ids,
        [&Value::Int(2), &Value::Int(3)],
        "nothing lost, nothing before them replayed twice"
    );
    let h = src.handle().health();
    assert!(h.reconnects >= 1, "{h:?}");
    assert!(h.streaming);
    assert!(h.last_error.is_some(), "the broken session was reported");
    src.close().await;
}
