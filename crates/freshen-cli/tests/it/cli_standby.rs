//! Two `freshen run` processes on one configuration: one is active, the other waits as
//! a standby (and says so), takes over when the active one is SIGKILLed under load, and
//! the derived tables end equal to truth. The killed one, restarted, becomes the standby.

use crate::support;

use std::time::Duration;

use support::*;

const PATIENCE: Duration = Duration::from_secs(60);

/// One configuration for two processes, each with a listener (and a log folder) of its
/// own.
struct Pair {
    dirs: [tempfile::TempDir; 2],
    bases: [String; 2],
    cfgs: [std::path::PathBuf; 2],
}

/// The schema's tables in `pg`, and a [`Pair`] of configurations on it whose views never
/// sweep: every row, the sites included (written once the first process is active:
/// [`SITES`]), reaches them through the slot, and so must the witnesses after a fault.
async fn pair(pg: &freshen_testenv::PgServer, c: &tokio_postgres::Client) -> Pair {
    c.batch_execute(TABLES).await.unwrap();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let ports = [free_port(), free_port()];
    let bases = ports.map(|p| format!("http://127.0.0.1:{p}"));
    let cfgs = [0, 1].map(|i| {
        write_config(
            dirs[i].path(),
            &without_sweeps(&config(&pg.url(), &format!("127.0.0.1:{}", ports[i]))),
        )
    });
    Pair { dirs, bases, cfgs }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_when_the_active_process_is_killed_under_load() {
    let pg = start_pg();
    let mut c = connect(&pg.url()).await;
    let Pair { dirs, bases, cfgs } = pair(&pg, &c).await;

    let mut a = spawn_run(dirs[0].path(), &cfgs[0], 1);
    wait_http(&bases[0], "/healthz", 200, PATIENCE).await;
    c.batch_execute(SITES).await.unwrap();
    let b = spawn_run(dirs[1].path(), &cfgs[1], 1);
    // The standby answers, unhealthy, naming what it waits for.
    let body = wait_http(&bases[1], "/healthz", 503, PATIENCE).await;
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut status = freshen_cli::status::fetch(&bases[1]).await.unwrap();
    while status.role != "standby" {
        assert!(
            std::time::Instant::now() < deadline,
            "never standby: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        status = freshen_cli::status::fetch(&bases[1]).await.unwrap();
    }
    let waits_for = status.standby_for.clone().unwrap();
    assert!(
        waits_for.contains("freshen (slot freshen_test)"),
        "{waits_for}"
    );
    assert!(
        status.views.is_empty(),
        "a standby rebuilds nothing: {status:?}"
    );
    let (_, body_now) = freshen_cli::status::get(&bases[1], "/healthz")
        .await
        .unwrap();
    assert!(body_now.contains("standby"), "{body} / {body_now}");
    let metrics = wait_http(&bases[1], "/metrics", 200, PATIENCE).await;
    assert!(metrics.contains("freshen_active 0"), "{metrics}");
    let metrics = wait_http(&bases[0], "/metrics", 200, PATIENCE).await;
    assert!(metrics.contains("freshen_active 1"), "{metrics}");

    // Load, and the active process dies in the middle of it.
    let mut r = Rng::new(0x57a4d);
    workload(&mut c, &mut r, 120).await;
    // Never changed again: no view sweeps, so the new active process must take them
    // from the slot.
    witness(&c, "takeover", 5).await;
    a.kill().unwrap();
    a.wait().unwrap();
    workload(&mut c, &mut r, 120).await;
    wait_http(&bases[1], "/healthz", 200, PATIENCE).await;
    let status = freshen_cli::status::fetch(&bases[1]).await.unwrap();
    assert_eq!(status.role, "active");
    workload(&mut c, &mut r, 60).await;
    wait_equal(&c, PATIENCE).await;
    assert_witnesses(&c, &["takeover"], 5).await;
    assert_no_sweep_ran(&bases[1]).await;
    assert!(
        log_of(dirs[1].path(), 1).contains("taking over"),
        "{}",
        log_of(dirs[1].path(), 1)
    );

    // The first one comes back as the standby.
    let _a2 = spawn_run(dirs[0].path(), &cfgs[0], 2);
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let Ok(s) = freshen_cli::status::fetch(&bases[0]).await
            && s.role == "standby"
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the restarted one never became standby"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    workload(&mut c, &mut r, 40).await;
    wait_equal(&c, PATIENCE).await;
    drop(b);
}

/// Polls both processes until exactly one is active and the other is a standby or has
/// stopped (an active process whose lease was taken by the other stops, exit 1);
/// returns the active one's index.
async fn one_active(bases: &[String; 2], runs: &mut [&mut Running; 2]) -> usize {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let mut roles = Vec::new();
        for i in 0..2 {
            let gone = matches!(runs[i].try_wait(), Ok(Some(_)));
            let role = if gone {
                "stopped".to_owned()
            } else {
                freshen_cli::status::fetch(&bases[i])
                    .await
                    .map_or_else(|_| "unreachable".to_owned(), |s| s.role)
            };
            roles.push(role);
        }
        let active: Vec<usize> = (0..2).filter(|&i| roles[i] == "active").collect();
        if let [i] = active[..]
            && matches!(roles[1 - i].as_str(), "standby" | "stopped")
        {
            return i;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never exactly one active process: {roles:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_source_restarts_exactly_one_process_is_active() {
    let mut pg = start_pg();
    let mut c = connect(&pg.url()).await;
    let Pair { dirs, bases, cfgs } = pair(&pg, &c).await;
    let mut a = spawn_run(dirs[0].path(), &cfgs[0], 1);
    wait_http(&bases[0], "/healthz", 200, PATIENCE).await;
    c.batch_execute(SITES).await.unwrap();
    let mut b = spawn_run(dirs[1].path(), &cfgs[1], 1);
    assert_eq!(one_active(&bases, &mut [&mut a, &mut b]).await, 0);
    let mut r = Rng::new(0x5e57a);
    workload(&mut c, &mut r, 60).await;
    witness(&c, "restart", 5).await;

    // Every session ends, the lock's too: both processes race for it afterwards.
    pg.restart().unwrap();
    let mut c = connect(&pg.url()).await;
    workload(&mut c, &mut r, 120).await;
    let active = one_active(&bases, &mut [&mut a, &mut b]).await;
    workload(&mut c, &mut r, 60).await;
    wait_equal(&c, PATIENCE).await;
    assert_witnesses(&c, &["restart"], 5).await;
    assert_no_sweep_ran(&bases[active]).await;
    // Still exactly the same one, and what the other said is in its log.
    assert_eq!(one_active(&bases, &mut [&mut a, &mut b]).await, active);
    let other = log_of(dirs[1 - active].path(), 1);
    assert!(
        other.contains("lease") || other.contains("standby"),
        "the other process says what it is: {other}"
    );
}
