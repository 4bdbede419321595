//! The source survives a server restart: it reconnects with backoff, resumes after the
//! last transaction it saw, and counts the reconnect.

use crate::support;

use freshen::{Source, Value};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_server_restarts_and_loses_nothing() {
    let mut db = server();
    let mut c = sql(&db).await;
    exec(&mut c, "CREATE TABLE app.t (id INT PRIMARY KEY)").await;
    let mut src = source(config(&db, "rc", &["app.t"])).await;
    exec(&mut c, "INSERT INTO app.t VALUES (1)").await;
    take_events(&mut src, 1, 30).await;
    drop(c);

    db.restart().expect("restart the server");
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
