//! How the reader paces its reads of a real server: pauses between reads of a busy stream,
//! and on a loopback connection the socket's wake-up threshold. Neither may hold a change
//! back once the stream goes quiet.

mod support;

use std::time::Duration;

use freshen::Value;
use support::*;

/// A busy stream of one-row transactions raises the threshold; the lone change after it
/// is fewer bytes than the threshold, so only lowering it on the reader's deadline
/// delivers it (the server sends nothing more for tens of seconds).
async fn lone_change_after_a_busy_stream(read_gap: Duration, threshold: bool) {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE TABLE paced (id int PRIMARY KEY, v text NOT NULL);
         CREATE PROCEDURE fill(n int) LANGUAGE plpgsql AS $$
         BEGIN
           FOR i IN 1..n LOOP INSERT INTO paced VALUES (i, 'busy'); COMMIT; END LOOP;
         END $$;",
    )
    .await
    .unwrap();
    let mut cfg = config(&pg, "paced", &["paced"]);
    cfg.read_gap = read_gap;
    let mut src = source(cfg).await;
    assert_eq!(src.health().wake_threshold, threshold);

    c.batch_execute("CALL fill(5000)").await.unwrap();
    let busy = take_events(&mut src, 5000, 60).await;
    assert_eq!(events(&busy).len(), 5000);

    c.batch_execute("INSERT INTO paced VALUES (0, 'lone')")
        .await
        .unwrap();
    let lone = events(&take_events(&mut src, 1, 10).await);
    assert_eq!(lone.len(), 1);
    assert_eq!(
        lone[0].new.as_ref().unwrap().get("v"),
        Some(&Value::Text("lone".into()))
    );
}

#[tokio::test]
async fn the_wake_up_threshold_holds_no_change_back() {
    lone_change_after_a_busy_stream(Duration::from_millis(10), true).await;
}

#[tokio::test]
async fn reading_each_message_uses_no_threshold() {
    lone_change_after_a_busy_stream(Duration::ZERO, false).await;
}
