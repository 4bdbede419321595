//! A MySQL/MariaDB target keeps views' unhealed gaps across restarts (`freshen_gaps`),
//! as a PostgreSQL target does: a fresh ledger (a restarted process) reads back what an
//! earlier one recorded, and only what a person acknowledged is forgotten.

use std::sync::Arc;

use freshen::Gap;
use freshen::plug::{GapLedger, TargetPlug};
use freshen_mysql::{GAP_TABLE, MySqlTarget};

use crate::support::*;

/// The ledger of the target at `url`, as `freshen run` gets it: through the target's plug.
async fn ledger(url: &str) -> Arc<dyn GapLedger> {
    let target = MySqlTarget::open(url).unwrap();
    let connected = target.connect(None).await.unwrap();
    connected.gap_ledger().expect("a MySQL target keeps gaps")
}

fn tables(db: &freshen_testenv::MariaDbServer) -> String {
    db.sql(&format!(
        "SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'app' AND TABLE_NAME = '{GAP_TABLE}'"
    ))
    .unwrap()
}

#[tokio::test]
async fn a_gap_outlives_its_process_until_acknowledged() {
    let db = server();
    let url = db.url("app");
    let first = ledger(&url).await;
    assert_eq!(first.load("totals").await.unwrap(), []);
    assert_eq!(tables(&db), "0", "no gap, no table");

    let purged = Gap::new("app", "readings", "binlog purged");
    let other = Gap::new("app", "devices", "statement-based event");
    first
        .record("totals", &[purged.clone(), other.clone()])
        .await
        .unwrap();
    first
        .record("elsewhere", std::slice::from_ref(&other))
        .await
        .unwrap();
    assert_eq!(tables(&db), "1", "made at the first gap");

    // A restart: a new ledger over a new pool reads them back, by view.
    let again = ledger(&url).await;
    assert_eq!(
        again.load("totals").await.unwrap(),
        [other.clone(), purged.clone()]
    );
    // A table's newer reason replaces its older one.
    let newer = Gap::new("app", "readings", "a partition dropped");
    again
        .record("totals", std::slice::from_ref(&newer))
        .await
        .unwrap();
    assert_eq!(
        again.load("totals").await.unwrap(),
        [other.clone(), newer.clone()]
    );
    // A person acknowledged one line: only it goes, and only for that view; a line
    // that no longer matches a kept reason forgets nothing.
    again
        .forget("totals", &[newer.to_string(), purged.to_string()])
        .await
        .unwrap();
    assert_eq!(
        ledger(&url).await.load("totals").await.unwrap(),
        std::slice::from_ref(&other)
    );
    assert_eq!(ledger(&url).await.load("elsewhere").await.unwrap(), [other]);
}

#[tokio::test]
async fn without_create_the_first_gap_says_what_to_grant_and_a_made_table_needs_none() {
    let db = server();
    db.sql(
        "CREATE USER 'keeper'@'%'; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON app.* TO 'keeper'@'%'",
    )
    .unwrap();
    let keeper = ledger(&format!("mysql://keeper@127.0.0.1:{}/app", db.port())).await;
    let gap = Gap::new("app", "readings", "binlog purged");
    let e = keeper
        .record("totals", std::slice::from_ref(&gap))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("grant CREATE"), "{e}");
    // Made by someone allowed to (as docs/privileges.md says): no CREATE needed then.
    ledger(&db.url("app"))
        .await
        .record("other", std::slice::from_ref(&gap))
        .await
        .unwrap();
    keeper
        .record("totals", std::slice::from_ref(&gap))
        .await
        .unwrap();
    assert_eq!(keeper.load("totals").await.unwrap(), [gap]);
}
