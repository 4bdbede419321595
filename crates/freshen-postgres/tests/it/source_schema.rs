//! Schema changes a real server reports through Relation messages: a retyped column, an
//! added one (which rows then carry), a renamed table — each seen with the next change to
//! the table, each reported once, as differences from the table at start.

use crate::support;

use std::time::Duration;

use freshen::{Batch, Source, Value};
use support::*;

/// Reads batches (acknowledging them) until one carries a schema change; returns the
/// batches read.
async fn until_change(src: &mut freshen_postgres::PgSource) -> Vec<Batch> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut out: Vec<Batch> = Vec::new();
    while !out.iter().any(|b| !b.schema_changes().is_empty()) {
        let b = tokio::time::timeout_at(deadline, src.next_batch())
            .await
            .expect("a schema change within 20 s")
            .expect("stream ended")
            .expect("source failed");
        out.push(b);
    }
    out
}

fn changes(batches: &[Batch]) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| b.schema_changes().iter().map(ToString::to_string))
        .collect()
}

#[tokio::test]
async fn retyped_added_and_renamed_are_reported_once_with_the_next_change() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute("CREATE TABLE gauges (id int PRIMARY KEY, device text, v int)")
        .await
        .unwrap();
    let mut src = source(config(&pg, "drift", &["gauges"])).await;
    assert!(src.capabilities().schema_changes);

    // Changed while freshen runs, before any row of it streamed: the shape at start is
    // what the first Relation message is compared with.
    c.batch_execute(
        "ALTER TABLE gauges ALTER COLUMN device TYPE varchar(32); \
         INSERT INTO gauges VALUES (1, 'a', 1);",
    )
    .await
    .unwrap();
    let batches = until_change(&mut src).await;
    assert_eq!(
        changes(&batches),
        ["public.gauges: column device retyped from text to varchar"]
    );
    assert_eq!(events(&batches).len(), 1, "the row that showed it");

    // An added column passes through: it is reported, and rows carry it.
    c.batch_execute(
        "ALTER TABLE gauges ADD COLUMN unit text; \
         INSERT INTO gauges VALUES (2, 'b', 2, 'kg'); \
         INSERT INTO gauges VALUES (3, 'c', 3, 'g');",
    )
    .await
    .unwrap();
    let mut batches = until_change(&mut src).await;
    while events(&batches).len() < 2 {
        batches.extend(take_events(&mut src, 1, 20).await);
    }
    assert_eq!(
        changes(&batches),
        ["public.gauges: column device retyped from text to varchar, column unit added"],
        "reported once, with every difference from the start"
    );
    let evs = events(&batches);
    assert_eq!(
        evs[0].new.as_ref().unwrap().get("unit"),
        Some(&Value::text("kg"))
    );

    // Renamed: reported (its rows, under a name nobody watches, are not delivered).
    c.batch_execute(
        "ALTER TABLE gauges RENAME TO gauges_old; \
         INSERT INTO gauges_old VALUES (4, 'd', 4, 'kg');",
    )
    .await
    .unwrap();
    let batches = until_change(&mut src).await;
    let seen = changes(&batches);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].starts_with("public.gauges: renamed to public.gauges_old"),
        "{seen:?}"
    );
    assert!(events(&batches).is_empty());
}
