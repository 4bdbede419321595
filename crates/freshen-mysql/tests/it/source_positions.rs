//! Stored positions: what was acknowledged is not replayed after a restart, what was
//! not is; a position file works like the table; and a quiet database stays quiet (the
//! position table's own writes, which the binlog carries too, do not make the source
//! store again and again).

use crate::support;

use std::time::Duration;

use freshen::{Source, SourceProbe, Value};
use freshen_mysql::ResumeBy;
use mysql_async::prelude::Queryable;
use support::*;

fn ids(batches: &[freshen::Batch]) -> Vec<i64> {
    events(batches)
        .iter()
        .filter_map(|e| match e.new.as_ref()?.get("id")? {
            Value::Int(i) => Some(*i),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_transactions_are_not_replayed_and_the_rest_are() {
    let db = server();
    let mut c = sql(&db).await;
    exec(&mut c, "CREATE TABLE app.t (id INT PRIMARY KEY)").await;
    let dir = tempfile::tempdir().unwrap();
    for (by, file) in [
        (ResumeBy::Auto, None),
        (ResumeBy::File, Some(dir.path().join("pos"))),
    ] {
        exec(&mut c, "DELETE FROM app.t").await;
        let name = format!("p{}", file.is_some() as u8);
        let mut cfg = config(&db, &name, &["app.t"]);
        cfg.resume_by = by;
        cfg.position_file = file;
        let mut src = source(cfg.clone()).await;
        exec(&mut c, "INSERT INTO app.t VALUES (1)").await;
        let first = take_events(&mut src, 1, 30).await;
        assert_eq!(ids(&first), [1]);
        for b in first {
            b.into_parts().2.ack();
        }
        exec(&mut c, "INSERT INTO app.t VALUES (2)").await;
        let second = take_events(&mut src, 1, 30).await;
        assert_eq!(ids(&second), [2]);
        // Not acknowledged: the source must replay it.
        drop(second);
        let h = src.handle();
        eventually(30, "the acknowledged position is stored", || async {
            let h = h.health();
            (h.stored.is_some() && h.stored == h.confirmed).then_some(())
        })
        .await;
        src.close().await;
        exec(&mut c, "INSERT INTO app.t VALUES (3)").await;

        let mut again = source(cfg).await;
        let replay = take_events(&mut again, 2, 30).await;
        assert_eq!(
            ids(&replay),
            [2, 3],
            "{by:?}: 1 was acknowledged, 2 was not"
        );
        again.close().await;
    }
}

/// The binlog's end offset (`SHOW MASTER STATUS`).
async fn binlog_end(c: &mut mysql_async::Conn) -> u64 {
    let row: mysql_async::Row = c.query_first("SHOW MASTER STATUS").await.unwrap().unwrap();
    row.get::<u64, _>(1).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_database_stays_quiet() {
    let db = server();
    let mut c = sql(&db).await;
    exec(&mut c, "CREATE TABLE app.t (id INT PRIMARY KEY)").await;
    let mut src = source(config(&db, "quiet", &["app.t"])).await;
    exec(&mut c, "INSERT INTO app.t VALUES (1)").await;
    for b in take_events(&mut src, 1, 30).await {
        b.into_parts().2.ack();
    }
    let after_insert = binlog_end(&mut c).await;
    let h = src.handle();
    // Stored: the position after the insert (the store's own write then moves the safe
    // position a little further, which is not stored again).
    eventually(30, "the position after the insert is stored", || async {
        let stored = h.health().stored?;
        (stored.file_pos.pos >= after_insert).then_some(())
    })
    .await;
    let settled = binlog_end(&mut c).await;
    let stores = h.health().stores;
    // Twenty store intervals with nothing happening: no more writes of the position.
    tokio::time::sleep(Duration::from_millis(20 * 50)).await;
    let now = binlog_end(&mut c).await;
    assert_eq!(h.health().stores, stores, "{:?}", h.health());
    assert_eq!(now, settled, "the binlog grew while nothing happened");
    // The uniform probe: nothing unconfirmed, received up to the server's end.
    let probe: &dyn SourceProbe = &h;
    assert_eq!(probe.kind(), "mysql");
    probe.sample().await;
    let p = probe.health();
    assert_eq!(p.lag_bytes, Some(0), "{p:?}");
    assert!(
        p.streaming && p.received.is_some() && p.received == p.confirmed,
        "{p:?}"
    );
    src.close().await;
}
