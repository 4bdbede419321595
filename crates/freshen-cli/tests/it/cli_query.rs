//! Query-mode views (`into` + `query`) through the binary, against real PostgreSQL: the
//! SaaS read models declared as queries under a randomized workload (inserts, updates,
//! deletes, children moved between parents, cascades, dimension fan-outs) across a
//! SIGKILL end equal to a fresh computation; and `check` lists every way a query does
//! not fit its target table.

use crate::support;

use serde_json::Value;
use support::saas;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_views_equal_a_fresh_computation_under_a_random_workload() {
    let pg = start_pg();
    let mut c = connect(&pg.url()).await;
    c.batch_execute(saas::SCHEMA).await.unwrap();
    let timing = "coalesce = \"100ms\"\nmax_wait = \"1s\"";
    // Changes still pending when the process dies are replayed to the restarted one.
    let (_dir, base, mut second) = saas::across_a_sigkill(
        &mut c,
        |http| saas::query_config(&pg.url(), http, timing),
        0x9e37,
        [200, 100, 100, 100],
    )
    .await;

    let counts: (i64, i64) = {
        let row = c
            .query_one(
                "SELECT (SELECT count(*) FROM account_mrr WHERE mrr > 0), \
                        (SELECT count(*) FROM accounts)",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert!(counts.0 > 0, "the workload produced revenue to check");
    let deleted: i64 = c
        .query_one(
            "SELECT count(*) FROM account_search s WHERE NOT EXISTS (SELECT FROM accounts a WHERE a.id = s.account_id)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(deleted, 0, "deleted accounts lost their rows");
    let fanned = saas::fanned_keys(&base).await;
    assert!(fanned > 0, "plan changes fanned out to the query-mode view");
    second.kill().unwrap();
    second.wait().unwrap();
}

const TOTALS: &str = "SELECT device, sum(value)::bigint AS total, count(*) AS n FROM readings WHERE device = ANY($1) GROUP BY device";

fn view(url: &str, query: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"

[http]
listen = "off"

[[views]]
name = "device_totals"
watch = [{{ table = "readings", key = ["device"] }}]
into = "device_totals"
query = "{query}"
reconcile = {{ every = "1h", keys = "SELECT device FROM readings UNION SELECT device FROM device_totals" }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_lists_every_mismatch_between_a_query_and_its_target() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();

    let (code, f) = check_findings(dir.path(), &view(&pg.url(), TOTALS), false);
    let errors: Vec<&Value> = f.iter().filter(|x| x["level"] == "error").collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(code, Some(0));
    assert!(
        has(
            &f,
            "ok",
            "query",
            "writes into public.device_totals keyed on (device), up to 64 key(s) per statement"
        ),
        "{f:#?}"
    );
    assert!(
        has(
            &f,
            "ok",
            "index",
            "rebuilds find a key's rows through readings_device_idx"
        ),
        "{f:#?}"
    );

    // Three mistakes at once: a misspelt column, a text total, no key column.
    let bad = "SELECT 'x' || sum(value) AS total, count(*) AS cnt FROM readings WHERE device = ANY($1) GROUP BY device";
    let (code, f) = check_findings(dir.path(), &view(&pg.url(), bad), false);
    assert_eq!(code, Some(1), "{f:#?}");
    for want in [
        "the query returns `cnt`, which the target table does not have",
        "the query does not return the key column `device`",
        "public.device_totals.n is NOT NULL without a default, and the query does not return it",
        "column `total`: the query returns text, which does not fit public.device_totals.total (bigint)",
    ] {
        assert!(
            has(&f, "error", "query", want),
            "missing {want:?} in {f:#?}"
        );
    }
    assert!(
        f.iter()
            .filter(|x| x["check"] == "query")
            .all(|x| x["subject"] == "view device_totals query"),
        "every finding names the view: {f:#?}"
    );

    // Without the index on the key, check says which one to create.
    c.batch_execute("DROP INDEX readings_device_idx")
        .await
        .unwrap();
    let (_, f) = check_findings(dir.path(), &view(&pg.url(), TOTALS), false);
    assert!(
        has(
            &f,
            "warning",
            "index",
            "no index leads with (\"device\"): every rebuild reads the whole of public.readings. CREATE INDEX ON \"public\".\"readings\" (\"device\")"
        ),
        "{f:#?}"
    );

    // Offline: what the file alone shows.
    let scalar = TOTALS.replace("= ANY($1)", "= ANY($2)");
    let (code, f) = check_findings(dir.path(), &view(&pg.url(), &scalar), true);
    assert_eq!(code, Some(1), "{f:#?}");
    assert!(
        has(
            &f,
            "error",
            "config",
            "the query must select its batch of keys with one array per key part (device = ANY($1)), but never uses $1"
        ),
        "{f:#?}"
    );
    let other_target = view(&pg.url(), TOTALS).replace(
        "[[views]]",
        "[target]\nurl = \"postgres://app@elsewhere/app\"\n\n[[views]]",
    );
    // Another PostgreSQL target is fine: the query reads the source and writes there
    // (cli_query_target).
    let (_, f) = check_findings(dir.path(), &other_target, true);
    assert!(
        !f.iter()
            .any(|x| x["level"] == "error" && x["check"] == "config"),
        "{f:#?}"
    );
}
