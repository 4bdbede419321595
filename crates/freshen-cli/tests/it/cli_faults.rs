//! `freshen run` under database faults, against real PostgreSQL: restarts (fast and
//! immediate) under load with views that have no reconcile sweep, a key failing by its
//! own data and then fixed, a target on another cluster.
//!
//! The promise under test: an outage may delay a rebuild, never drop it.

use crate::support;

use std::time::Duration;

use freshen_testenv::{PgServer, Shutdown};
use support::*;

/// The two views of `support::config` without any reconcile sweep (nothing would heal
/// a dropped change) and with a debounce long enough that changes are still pending
/// when the server goes down.
fn no_sweep(url: &str, http: &str) -> String {
    let text = without_sweeps(&config(url, http));
    let text = edited(&text, "coalesce = \"20ms\"", "coalesce = \"1s\"");
    edited(&text, "max_wait = \"500ms\"", "max_wait = \"2s\"")
}

async fn status(base: &str) -> freshen_cli::Status {
    freshen_cli::status::fetch(base).await.expect("/status")
}

/// Polls `/status` until `cond` holds, or fails after `within` with the last status.
async fn wait_status(
    base: &str,
    what: &str,
    within: Duration,
    cond: impl Fn(&freshen_cli::Status) -> bool,
) -> freshen_cli::Status {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Ok(s) = freshen_cli::status::fetch(base).await
            && cond(&s)
        {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {within:?}; last status: {:?}",
            freshen_cli::status::fetch(base).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_under_load_delay_rebuilds_and_quarantine_nothing() {
    let mut pg = start_pg();
    let mut c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let Started { dir, base, mut run } = run_healthy(|http| no_sweep(&pg.url(), http), None).await;
    let mut r = Rng::new(0xfa17);
    workload(&mut c, &mut r, 50).await;
    // Witnesses written now and changed once more just before the second fault.
    witness(&c, "early", 3).await;
    wait_equal(&c, Duration::from_secs(30)).await;

    for (how, tag) in [(Shutdown::Fast, "fast"), (Shutdown::Immediate, "immediate")] {
        // Changes freshen has received but not rebuilt (the debounce is 1 s) and so not
        // confirmed: the server must still stop promptly, and the changes survive. The
        // witnesses among them are never changed again: only the stream can bring them.
        workload(&mut c, &mut r, 100).await;
        witness(&c, tag, 5).await;
        if how == Shutdown::Immediate {
            witness(&c, "early", 3).await;
        }
        drop(c);
        pg.stop_within(how, Duration::from_secs(15))
            .unwrap_or_else(|e| panic!("{how:?} shutdown held up: {e}\n{}", log_of(dir.path(), 1)));
        // Down for longer than poison_after × backoff: the old behaviour quarantined here.
        tokio::time::sleep(Duration::from_secs(2)).await;
        pg.start_again().unwrap();
        c = connect(&pg.url()).await;
        workload(&mut c, &mut r, 50).await;
    }
    wait_equal(&c, Duration::from_secs(90)).await;
    assert_witnesses(&c, &["early"], 3).await;
    assert_witnesses(&c, &["fast", "immediate"], 5).await;
    let s = wait_status(&base, "streaming again", Duration::from_secs(30), |s| {
        s.source.streaming
    })
    .await;
    for v in &s.views {
        assert_eq!(
            v.poisoned, 0,
            "{}: an outage quarantined keys: {v:?}",
            v.name
        );
        assert!(v.quarantined.is_empty(), "{v:?}");
        assert_eq!(v.quarantine_releases, 0, "{v:?}");
    }
    assert!(
        s.views.iter().any(|v| v.path_failures > 0),
        "the outage was seen as failures of the path: {s:?}"
    );
    let metrics = wait_http(&base, "/metrics", 200, Duration::from_secs(5)).await;
    assert!(
        metrics.contains("freshen_keys_poisoned_total{view=\"device_totals\"} 0"),
        "{metrics}"
    );
    assert_no_sweep_ran(&base).await;
    run.kill().unwrap();
    run.wait().unwrap();
}

/// Writers that keep going until told to stop: three connections of `workload` (a
/// transaction aborted by a deadlock between them is simply not written), one
/// transaction at a time with a short pause (about 200 transactions a second on a quiet
/// machine).
struct Writers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    async fn start(url: &str, seed: u64) -> Writers {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = Vec::new();
        for w in 0..3 {
            let mut c = connect(url).await;
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                let mut r = Rng::new(seed + w);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    concurrent_workload(&mut c, &mut r, 1).await;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }));
        }
        Writers { stop, tasks }
    }

    async fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("a writer");
        }
    }
}

/// Every backend of freshen's (`application_name`) that `what` selects, terminated.
async fn terminate(c: &tokio_postgres::Client, what: &str) -> i64 {
    c.query(
        &format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {what} AND pid <> pg_backend_pid()"),
        &[],
    )
    .await
    .expect("terminate")
    .len() as i64
}

/// The simplest way the reader once stalled for good: one walsender termination under an
/// ordinary write load (about one run in three, then every derived row stale while
/// `/healthz` said 200); and the same with every connection freshen holds terminated;
/// three of each. Witness rows written just before each fault are never changed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_terminated_under_load_lose_nothing_and_streaming_goes_on() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let Started {
        dir,
        base,
        run: _run,
    } = run_healthy(|http| no_sweep(&pg.url(), http), None).await;
    let writers = Writers::start(&pg.url(), 0x7e57).await;
    // Each fault once caught the reader about one time in three: three of each.
    let walsender = "backend_type = 'walsender'";
    let all = "(backend_type = 'walsender' OR application_name LIKE 'freshen%')";
    let faults = [
        ("walsender-1", walsender),
        ("all-1", all),
        ("walsender-2", walsender),
        ("all-2", all),
        ("walsender-3", walsender),
        ("all-3", all),
    ];
    for (tag, what) in faults {
        // An ordinary stream for a while (the load is the point, not a synchronization).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        witness(&c, tag, 5).await;
        assert!(terminate(&c, what).await >= 1, "{tag}: nothing terminated");
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    writers.stop().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while differences(&c).await.iter().any(|(_, n)| *n != 0) {
        if std::time::Instant::now() > deadline {
            let walsenders: Vec<(String, Option<String>)> = c
                .query(
                    "SELECT state, wait_event FROM pg_stat_activity WHERE backend_type = 'walsender'",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            panic!(
                "derived tables never matched truth: {:?}; walsenders {walsenders:?}; /status {:?}\n{}",
                differences(&c).await,
                freshen_cli::status::get(&base, "/status").await,
                log_of(dir.path(), 1)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tags: Vec<&str> = faults.iter().map(|(tag, _)| *tag).collect();
    assert_witnesses(&c, &tags, 5).await;
    let s = wait_status(&base, "streaming again", Duration::from_secs(30), |s| {
        s.source.streaming
    })
    .await;
    assert!(
        s.source.reconnects >= faults.len() as u64,
        "every fault was seen: {s:?}"
    );
    assert_no_sweep_ran(&base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_failing_by_its_data_holds_its_transactions_and_heals_when_fixed() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    // device_totals divides by zero for a device with a negative reading.
    let text = |http: &str| {
        let text = edited(
            &no_sweep(&pg.url(), http),
            "coalesce = \"1s\"",
            "coalesce = \"20ms\"\npoison_after = 2\nbackoff = { base = \"20ms\", max = \"200ms\" }",
        );
        edited(
            &text,
            "INSERT INTO device_totals SELECT device, sum(value), count(*) FROM readings WHERE device = $1 GROUP BY device",
            "INSERT INTO device_totals SELECT device, sum(value) / (CASE WHEN min(value) < 0 THEN 0 ELSE 1 END), count(*) FROM readings WHERE device = $1 GROUP BY device",
        )
    };
    let Started { dir, base, mut run } = run_healthy(text, None).await;
    c.batch_execute(
        "INSERT INTO readings (device, site, value) VALUES ('good', 's1', 5), ('bad', 's2', -1)",
    )
    .await
    .unwrap();
    let s = wait_status(&base, "quarantined", Duration::from_secs(30), |s| {
        s.views
            .iter()
            .any(|v| v.name == "device_totals" && v.poisoned_holding == 1)
    })
    .await;
    let v = s.views.iter().find(|v| v.name == "device_totals").unwrap();
    assert_eq!(v.quarantined.len(), 1, "{v:?}");
    // What the held transaction retains is reported in time, not only in bytes.
    let s = wait_status(
        &base,
        "the retained change has an age",
        Duration::from_secs(10),
        |s| s.source.lag_seconds.is_some_and(|a| a > 0.0),
    )
    .await;
    assert!(s.source.confirmed_lsn.is_some(), "{s:?}");
    assert_eq!(v.quarantined[0].key, "bad");
    assert!(
        v.quarantined[0].error.contains("22012"),
        "the server's SQLSTATE: {v:?}"
    );
    assert!(v.quarantined[0].error.contains("division by zero"), "{v:?}");
    let health = wait_http(&base, "/healthz", 503, Duration::from_secs(5)).await;
    assert!(
        health.contains("device_totals") && health.contains("\"bad\""),
        "/healthz names the view and the key: {health}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while c
        .query_opt(
            "SELECT 1 FROM device_totals WHERE device = 'good' AND total = 5",
            &[],
        )
        .await
        .unwrap()
        .is_none()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "one failing key held up another"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The data is fixed: that change is not ignored, it rebuilds the key.
    c.batch_execute("UPDATE readings SET value = 7 WHERE device = 'bad'")
        .await
        .unwrap();
    wait_status(&base, "healed", Duration::from_secs(30), |s| {
        s.views
            .iter()
            .all(|v| v.poisoned == 0 && v.poisoned_holding == 0)
    })
    .await;
    let bad: i64 = c
        .query_one("SELECT total FROM device_totals WHERE device = 'bad'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(bad, 7);
    wait_http(&base, "/healthz", 200, Duration::from_secs(10)).await;
    let log = log_of(dir.path(), 1);
    assert!(
        log.contains("quarantined") && log.contains("rebuilt again"),
        "{log}"
    );
    assert!(
        !log.contains("for key  "),
        "an empty-looking key in the log: {log}"
    );
    run.kill().unwrap();
    run.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_on_another_cluster_rebuilds_from_the_source() {
    let source = start_pg();
    let target = PgServer::builder()
        .own_cluster(true)
        .start()
        .expect("a second throwaway PostgreSQL, a cluster of its own");
    let mut s = connect(&source.url()).await;
    s.batch_execute(SCHEMA).await.unwrap();
    let t = connect(&target.url()).await;
    // The target reads the source's tables through postgres_fdw and holds the derived
    // tables; nothing about transaction ids is shared between the clusters.
    t.batch_execute(&format!(
        "CREATE EXTENSION postgres_fdw;
         CREATE SERVER src FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '{host}', port '{port}', dbname 'postgres');
         CREATE USER MAPPING FOR CURRENT_USER SERVER src OPTIONS (user '{user}');
         IMPORT FOREIGN SCHEMA public LIMIT TO (readings, sites) FROM SERVER src INTO public;
         CREATE TABLE device_totals (device text PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL);
         CREATE TABLE site_totals (site text PRIMARY KEY, region text NOT NULL, total bigint NOT NULL, n bigint NOT NULL);",
        host = source.host(),
        port = source.port(),
        user = source.user(),
    ))
    .await
    .unwrap();
    // The source's transaction ids run far ahead of the target's: looked up in the
    // target's snapshot they would never be visible.
    s.batch_execute(
        "DO $$ BEGIN FOR i IN 1..5000 LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$",
    )
    .await
    .unwrap();
    let text = |http: &str| {
        format!(
            "{}\n[target]\nurl = \"{}\"\n",
            edited(
                &no_sweep(&source.url(), http),
                "coalesce = \"1s\"",
                "coalesce = \"20ms\""
            ),
            target.url()
        )
    };
    let Started { dir, base, mut run } = run_healthy(text, None).await;
    let mut r = Rng::new(0xc1c1);
    workload(&mut s, &mut r, 150).await;
    // Truth is computed on the target too (through the foreign tables): equal means the
    // derived tables match the source.
    wait_equal(&t, Duration::from_secs(60)).await;
    let st = status(&base).await;
    for v in &st.views {
        assert_eq!(v.poisoned, 0, "{v:?}");
        assert!(v.rebuilds_ok > 0, "{v:?}");
    }
    let log = log_of(dir.path(), 1);
    assert!(log.contains("another cluster"), "{log}");
    run.kill().unwrap();
    run.wait().unwrap();
}

/// How many witness devices a publication-gap test writes while `readings` is out of
/// the publication.
const OUT: usize = 3;

/// The witness devices written while `readings` was out: wrong in `device_totals` (no
/// sweep), which shows the gap was real.
async fn stale_witnesses(c: &tokio_postgres::Client) -> usize {
    let mut stale = 0;
    for i in 0..OUT {
        let key = format!("w-out-{i}");
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM device_totals WHERE device = $1",
                &[&key],
            )
            .await
            .unwrap()
            .get(0);
        stale += usize::from(n == 0);
    }
    stale
}

/// After a publication gap: `/healthz` stays 503 naming the view without a sweep, the
/// table and what to run, however long one waits, while the view with a sweep heals.
/// A rebuild of the lost keys and an acknowledgement make it 200, and everything equal.
async fn gap_is_reported_until_healed(
    c: &tokio_postgres::Client,
    base: &str,
    dir: &std::path::Path,
    run: u32,
) {
    // site_totals has a reconcile: the gap swept it, and the witnesses' sites are right.
    let st = wait_status(
        base,
        "the unhealed gap in device_totals",
        Duration::from_secs(30),
        |s| {
            s.views
                .iter()
                .any(|v| v.name == "device_totals" && !v.unhealed_gaps.is_empty())
        },
    )
    .await;
    let site = st.views.iter().find(|v| v.name == "site_totals").unwrap();
    assert!(site.unhealed_gaps.is_empty(), "a sweep heals it: {site:?}");
    let (code, health) = freshen_cli::status::get(base, "/healthz").await.unwrap();
    assert_eq!(code, 503, "{health}");
    for part in [
        "device_totals",
        "public.readings",
        "/admin/views/device_totals/gaps/acknowledge",
    ] {
        assert!(health.contains(part), "/healthz names {part}: {health}");
    }
    assert!(!health.contains("view site_totals"), "{health}");
    // The hole is there: nothing else will bring those rows.
    assert_eq!(stale_witnesses(c).await, OUT, "{}", log_of(dir, run));
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        let (code, _) = freshen_cli::status::get(base, "/healthz").await.unwrap();
        assert_eq!(code, 503, "never back to 200 with the hole still there");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let keys: Vec<String> = (0..OUT).map(|i| format!("\"w-out-{i}\"")).collect();
    let body = format!("{{\"keys\": [{}]}}", keys.join(", "));
    let (code, body) = freshen_cli::status::request(
        base,
        "POST",
        "/admin/views/device_totals/rebuild",
        None,
        Some(&body),
    )
    .await
    .unwrap();
    assert_eq!(code, 202, "{body}");
    let (code, body) = freshen_cli::status::request(
        base,
        "POST",
        "/admin/views/device_totals/gaps/acknowledge",
        None,
        None,
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("public.readings"), "{body}");
    wait_http(base, "/healthz", 200, Duration::from_secs(30)).await;
    wait_equal(c, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_out_of_the_publication_for_a_while_is_a_gap_until_healed() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let Started { dir, base, mut run } = run_healthy(|http| config(&pg.url(), http), None).await;
    c.batch_execute("ALTER PUBLICATION freshen_test DROP TABLE readings")
        .await
        .unwrap();
    let health = wait_http(&base, "/healthz", 503, Duration::from_secs(30)).await;
    assert!(
        health.contains("public.readings") && health.contains("device_totals"),
        "/healthz names the table and the views that lost it: {health}"
    );
    let s = status(&base).await;
    assert!(
        s.source.problems.iter().any(|p| p.contains("ADD TABLE")),
        "{s:?}"
    );
    // Written while the table is out: the stream never carries these.
    witness(&c, "out", OUT).await;
    c.batch_execute("ALTER PUBLICATION freshen_test ADD TABLE readings")
        .await
        .unwrap();
    gap_is_reported_until_healed(&c, &base, dir.path(), 1).await;
    let log = log_of(dir.path(), 1);
    assert!(log.contains("no longer includes public.readings"), "{log}");
    assert!(log.contains("is back in publication"), "{log}");
    run.kill().unwrap();
    run.wait().unwrap();
}

/// An unhealed gap is state freshen keeps (in the target's `freshen_gaps`): a crash and
/// a restart later the view still reports it and `/healthz` stays 503, until a person
/// rebuilds the keys and acknowledges it; then 200, the table equal to the truth, and
/// nothing kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_survives_restarts_until_a_person_acknowledges_it() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let Started { dir, base, mut run } = run_healthy(|http| config(&pg.url(), http), None).await;
    wait_equal(&c, Duration::from_secs(30)).await;
    c.batch_execute("ALTER PUBLICATION freshen_test DROP TABLE readings")
        .await
        .unwrap();
    wait_http(&base, "/healthz", 503, Duration::from_secs(30)).await;
    witness(&c, "out", OUT).await;
    c.batch_execute("ALTER PUBLICATION freshen_test ADD TABLE readings")
        .await
        .unwrap();
    let unhealed = |s: &freshen_cli::Status| {
        s.views
            .iter()
            .find(|v| v.name == "device_totals")
            .map(|v| v.unhealed_gaps.clone())
            .unwrap_or_default()
    };
    let before = unhealed(
        &wait_status(&base, "the unhealed gap", Duration::from_secs(30), |s| {
            !unhealed(s).is_empty()
        })
        .await,
    );
    let kept = || async {
        c.query_one(
            "SELECT count(*) FROM freshen_gaps WHERE view = 'device_totals'",
            &[],
        )
        .await
        .map(|r| r.get::<_, i64>(0))
        .unwrap_or(0)
    };
    assert_eq!(kept().await, 1, "kept in the target");
    // A crash, then a graceful restart: the gap is still there each time, and the
    // view never looks healthy with the hole.
    run.kill().unwrap();
    run.wait().unwrap();
    let cfg = write_config(
        dir.path(),
        &config(&pg.url(), base.trim_start_matches("http://")),
    );
    for n in [2, 3] {
        let mut again = spawn_run(dir.path(), &cfg, n);
        // From the first answer on, never 200 with the hole still there: asked until
        // the view reports the gap again, and two seconds more.
        let mut seen_since = None;
        while seen_since.is_none_or(|t: std::time::Instant| t.elapsed() < Duration::from_secs(2)) {
            if let Ok((code, body)) = freshen_cli::status::get(&base, "/healthz").await {
                assert_eq!(code, 503, "never 200 with the hole still there: {body}");
            }
            if seen_since.is_none()
                && let Ok(s) = freshen_cli::status::fetch(&base).await
                && !unhealed(&s).is_empty()
            {
                assert_eq!(unhealed(&s), before, "{}", log_of(dir.path(), n));
                seen_since = Some(std::time::Instant::now());
            }
            assert!(
                again.try_wait().unwrap().is_none(),
                "run {n} ended: {}",
                log_of(dir.path(), n)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(stale_witnesses(&c).await, OUT, "the hole is real");
        if n == 2 {
            stop_run(&mut again, dir.path(), n);
        } else {
            run = again;
        }
    }
    gap_is_reported_until_healed(&c, &base, dir.path(), 3).await;
    assert_eq!(kept().await, 0, "forgotten once acknowledged");
    run.kill().unwrap();
    run.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_freshen_puts_back_into_its_publication_at_start_is_a_gap() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let text = |http: &str| config(&pg.url(), http);
    let Started { dir, base, mut run } = run_healthy(text, None).await;
    wait_equal(&c, Duration::from_secs(30)).await;
    run.kill().unwrap();
    run.wait().unwrap();
    // While freshen is down, a person takes the table out; rows change meanwhile.
    c.batch_execute("ALTER PUBLICATION freshen_test DROP TABLE readings")
        .await
        .unwrap();
    witness(&c, "out", OUT).await;
    // At start freshen puts the table back into its own publication: the slot resumes
    // past those changes without them.
    let cfg = write_config(
        dir.path(),
        &config(&pg.url(), base.trim_start_matches("http://")),
    );
    let mut run = spawn_run(dir.path(), &cfg, 2);
    let log = |n| log_of(dir.path(), n);
    wait_status(&base, "the second run", Duration::from_secs(30), |_| true).await;
    gap_is_reported_until_healed(&c, &base, dir.path(), 2).await;
    assert!(log(2).contains("was added to publication"), "{}", log(2));
    run.kill().unwrap();
    run.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_abandoned_at_shutdown_is_cancelled_on_the_server() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let text = |http: &str| {
        let text = edited(
            &config(&pg.url(), http),
            "max_wait = \"500ms\"",
            "max_wait = \"500ms\"\nshutdown_grace = \"500ms\"",
        );
        edited(
            &text,
            "\"DELETE FROM device_totals WHERE device = $1\",",
            "\"SELECT pg_sleep(120) WHERE $1::text IS NOT NULL\",",
        )
    };
    let Started {
        dir,
        base: _,
        mut run,
    } = run_healthy(text, None).await;
    c.batch_execute("INSERT INTO readings (device, site, value) VALUES ('d1', 's1', 1)")
        .await
        .unwrap();
    let sleeping = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(120)%'";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while c.query_one(sleeping, &[]).await.unwrap().get::<_, i64>(0) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the rebuild never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let code = run.wait().unwrap();
    assert!(code.success(), "{}", log_of(dir.path(), 1));
    let log = log_of(dir.path(), 1);
    assert!(
        log.contains("cancelled") && !log.contains("stopped cleanly"),
        "{log}"
    );
    // The statement does not go on running on the server after freshen left.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while c.query_one(sleeping, &[]).await.unwrap().get::<_, i64>(0) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned rebuild still runs on the server"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_to_the_metrics_port_cannot_starve_rebuilds_of_descriptors() {
    let pg = start_pg();
    let mut c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    // 256 descriptors in all; the metrics listener keeps at most 64 connections.
    let Started { dir, base, run } = run_healthy(|http| no_sweep(&pg.url(), http), Some(256)).await;
    let port: u16 = base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port");
    // More idle connections than the process has descriptors, each sending half a
    // request and then nothing (slowloris).
    let mut idle = Vec::new();
    for _ in 0..400 {
        // Past the listener's backlog a connect waits for SYN retries: do not wait.
        let connect = tokio::net::TcpStream::connect(("127.0.0.1", port));
        if let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_millis(100), connect).await {
            use tokio::io::AsyncWriteExt;
            let _ = s
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .await;
            idle.push(s);
        }
    }
    // The rebuilds still get their connections (new ones too: the pool is lazy and the
    // server is restarted under them).
    let mut r = Rng::new(0xfd);
    workload(&mut c, &mut r, 100).await;
    wait_equal(&c, Duration::from_secs(60)).await;
    drop(idle);
    let s = wait_status(&base, "served again", Duration::from_secs(30), |_| true).await;
    for v in &s.views {
        assert_eq!(v.poisoned, 0, "{v:?}");
    }
    let log = log_of(dir.path(), 1);
    assert!(
        log.contains("HTTP connection limit reached"),
        "the limit was logged: {log}"
    );
    drop(run);
}

/// A derived table locked by someone else stalls only its own view: its rebuilds are
/// cancelled by the server at `statement_timeout` and retried (a failure of the path,
/// never a quarantine), `/healthz` names it, and the other view — with its own
/// connections — keeps equal to truth. Released, the stalled view catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_derived_table_stalls_only_its_own_view() {
    let pg = start_pg();
    let mut c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let text = |http: &str| {
        edited(
            &config(&pg.url(), http),
            "max_wait = \"500ms\"\n",
            "max_wait = \"500ms\"\nstatement_timeout = \"300ms\"\nbackoff = { base = \"50ms\", max = \"300ms\" }\n",
        )
    };
    let Started { dir, base, mut run } = run_healthy(text, None).await;
    let mut r = Rng::new(0x10c4);
    workload(&mut c, &mut r, 50).await;
    wait_equal(&c, Duration::from_secs(30)).await;

    let locker = connect(&pg.url()).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE device_totals IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    workload(&mut c, &mut r, 100).await;
    // The other view keeps up while the lock is held (reading device_totals would
    // wait for the lock too: only site_totals is compared).
    let (_, derived, truth) = TRUTH[1];
    let diff = format!(
        "SELECT count(*) FROM (({derived} EXCEPT {truth}) UNION ALL ({truth} EXCEPT {derived})) d"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = c.query_one(&diff, &[]).await.unwrap().get(0);
        if n == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "site_totals waited for device_totals' lock: {n} rows differ"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let health = wait_http(&base, "/healthz", 503, Duration::from_secs(15)).await;
    assert!(
        health.contains("device_totals") && !health.contains("site_totals"),
        "/healthz names only the stalled view: {health}"
    );
    let s = wait_status(
        &base,
        "the timeouts are counted",
        Duration::from_secs(10),
        |s| {
            s.views.iter().any(|v| {
                v.name == "device_totals"
                    && v.last_error.as_deref().is_some_and(|e| e.contains("57014"))
            })
        },
    )
    .await;
    for v in &s.views {
        assert_eq!(v.poisoned, 0, "a timeout never quarantines: {v:?}");
    }

    locker.batch_execute("ROLLBACK").await.unwrap();
    wait_equal(&c, Duration::from_secs(30)).await;
    wait_http(&base, "/healthz", 200, Duration::from_secs(15)).await;
    // The recent window shows the stall the lifetime median hides.
    let s = wait_status(&base, "a recent freshness", Duration::from_secs(15), |s| {
        s.views.iter().all(|v| v.recent_p99_ms.is_some())
    })
    .await;
    let d = s.views.iter().find(|v| v.name == "device_totals").unwrap();
    assert!(
        d.recent_p99_ms.unwrap() >= 300.0,
        "rebuilds waited out at least one statement_timeout: {d:?}"
    );
    run.kill().unwrap();
    run.wait().unwrap();
    let log = log_of(dir.path(), 1);
    assert!(log.contains("device_totals"), "{log}");
    // Lifecycle lines an operator follows, in plain text (the log is not a terminal).
    for line in [
        "created the replication slot",
        "created the publication",
        "reconcile sweep listed",
    ] {
        assert!(log.contains(line), "{line:?} missing from\n{log}");
    }
    assert!(
        !log.contains('\x1b'),
        "no colour codes in a log file:\n{log}"
    );
}
