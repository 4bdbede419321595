//! One active process per source name: the standby lock against a real MariaDB.

use crate::support;

use std::time::Duration;

use freshen::plug::{Lease, SourcePlug};
use freshen_mysql::{Attempt, Leadership, MySqlSourceConfig};
use mysql_async::prelude::Queryable;

fn held(a: Attempt) -> Option<freshen_mysql::Holder> {
    match a {
        Attempt::Held(h) => h,
        Attempt::Leader(_) => panic!("expected the lock to be held elsewhere"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_holds_the_lock_and_a_standby_takes_it_when_the_holder_goes() {
    let db = support::server();
    let url = db.url("app");

    let Attempt::Leader(first) = Leadership::try_acquire(&url, "rollups").await.unwrap() else {
        panic!("the first process must get the lock");
    };
    // A second process on the same source waits, and is told who holds it.
    let holder =
        held(Leadership::try_acquire(&url, "rollups").await.unwrap()).expect("the holder is named");
    assert!(holder.connection > 0, "{holder:?}");
    assert!(
        holder.to_string().contains("connection"),
        "the holder's description names its connection: {holder}"
    );
    // Another source name is another lock.
    assert!(matches!(
        Leadership::try_acquire(&url, "other").await.unwrap(),
        Attempt::Leader(_)
    ));

    // The holder goes away (as by SIGKILL: the session ends) → the standby gets it.
    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Attempt::Leader(_) = Leadership::try_acquire(&url, "rollups").await.unwrap() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lock was not released after its holder's session ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_process_learns_when_its_session_is_killed() {
    let db = support::server();
    let url = db.url("app");
    let Attempt::Leader(mut leader) = Leadership::try_acquire(&url, "rollups").await.unwrap()
    else {
        panic!("the first process must get the lock");
    };
    let mut admin = support::sql(&db).await;
    let id: Option<u64> = admin
        .exec_first("SELECT IS_USED_LOCK(?)", ("freshen:rollups",))
        .await
        .unwrap();
    let id = id.expect("the lock is held");
    admin.query_drop(format!("KILL {id}")).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(30), leader.lost())
        .await
        .expect("lost() must resolve once the session is killed");
    assert!(
        e.to_string().contains("standby lock"),
        "the error says what was lost: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_plug_leads_through_the_lock() {
    let db = support::server();
    let cfg = MySqlSourceConfig::new(db.url("app"), "rollups");
    let Lease::Granted(lost) = cfg.lead().await.unwrap() else {
        panic!("the first process must be granted the lease");
    };
    match cfg.lead().await.unwrap() {
        Lease::Held(who) => assert!(who.contains("connection"), "{who}"),
        other => panic!("expected Held, got {other:?}"),
    }
    drop(lost);
}
