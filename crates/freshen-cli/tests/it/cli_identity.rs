//! `freshen check`'s replica identity advice against a real PostgreSQL: the cheapest
//! identity that carries the old key each table's views need, the statements that set
//! it (run here, as printed), and FULL reported when it is more than needed.

use crate::support;

use support::*;

/// `check --json`'s finding of kind `check` for `table`, if any: (level, message).
fn finding(cfg: &std::path::Path, check: &str, table: &str) -> Option<(String, String)> {
    let out = freshen()
        .args(["check", "--json", "-c"])
        .arg(cfg)
        .output()
        .unwrap();
    findings(&out)
        .iter()
        .find(|x| x["check"] == check && x["subject"] == table)
        .map(|hit| {
            (
                hit["level"].as_str().unwrap_or_default().to_owned(),
                hit["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

/// The `replica_identity` finding for `table`: (level, message).
fn identity_of(cfg: &std::path::Path, table: &str) -> (String, String) {
    finding(cfg, "replica_identity", table)
        .unwrap_or_else(|| panic!("no replica_identity finding for {table}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_recommends_the_cheapest_identity_that_carries_the_old_key() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    // readings and sites start FULL; readings is watched by device (device_totals) and
    // by site (site_totals), sites by its primary key.
    c.batch_execute(SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &config(&pg.url(), "off"));

    // FULL is more than either table needs: said, with the statements and the cost.
    let (level, msg) = identity_of(&cfg, "public.sites");
    assert_eq!(level, "ok", "{msg}");
    assert!(
        msg.contains("is more than view(s) site_totals need"),
        "{msg}"
    );
    assert!(msg.contains("WAL"), "the measured cost is quoted: {msg}");
    assert!(
        msg.contains("ALTER TABLE \"public\".\"sites\" REPLICA IDENTITY DEFAULT;"),
        "{msg}"
    );
    let (level, msg) = identity_of(&cfg, "public.readings");
    assert_eq!(level, "ok", "{msg}");
    assert!(
        msg.contains("is more than view(s) device_totals, site_totals need"),
        "{msg}"
    );
    assert!(msg.contains("USING INDEX on (device, site, id)"), "{msg}");

    // The printed statements work as printed, one by one (CONCURRENTLY cannot run in a
    // transaction block).
    let run = msg.split("To switch: ").nth(1).expect("statements");
    let statements: Vec<&str> = run
        .split_inclusive(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(statements.len(), 2, "{statements:?}");
    assert!(
        statements[0].starts_with("CREATE UNIQUE INDEX CONCURRENTLY"),
        "{statements:?}"
    );
    for s in &statements {
        c.batch_execute(s)
            .await
            .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    let (level, msg) = identity_of(&cfg, "public.readings");
    assert_eq!(level, "ok", "{msg}");
    assert!(
        msg.contains(
            "REPLICA IDENTITY USING INDEX (device, site, id) is the cheapest that carries"
        ),
        "{msg}"
    );

    // DEFAULT misses the old device and site: a warning that names the views, and the
    // index now exists, so only the switch to it is printed.
    c.batch_execute("ALTER TABLE readings REPLICA IDENTITY DEFAULT")
        .await
        .unwrap();
    let (level, msg) = identity_of(&cfg, "public.readings");
    assert_eq!(level, "warning", "{msg}");
    assert!(
        msg.contains("view(s) device_totals, site_totals need the old device, site"),
        "{msg}"
    );
    assert!(
        msg.contains("REPLICA IDENTITY USING INDEX \"readings_device_site_id_identity\";"),
        "{msg}"
    );
    assert!(!msg.contains("CREATE UNIQUE INDEX"), "{msg}");
    assert!(msg.contains("fixed_key = true"), "{msg}");

    // Declared fixed keys need no old key: DEFAULT is the cheapest, and fits.
    let fixed = config(&pg.url(), "off").replace(
        "key = [\"device\"] }",
        "key = [\"device\"], fixed_key = true }",
    );
    let fixed = fixed.replace("key = [\"site\"] }", "key = [\"site\"], fixed_key = true }");
    assert_eq!(fixed.matches("fixed_key").count(), 2, "{fixed}");
    let cfg = write_config(dir.path(), &fixed);
    let (level, msg) = identity_of(&cfg, "public.readings");
    assert_eq!(level, "ok", "{msg}");
    assert!(
        msg.contains("REPLICA IDENTITY DEFAULT (id) is the cheapest that carries"),
        "{msg}"
    );

    // A nullable key column cannot be in an identity index: FULL is the answer.
    c.batch_execute("CREATE TABLE notes (id int PRIMARY KEY, device text, body text)")
        .await
        .unwrap();
    let notes = config(&pg.url(), "off").replace(
        "watch = [{ table = \"public.readings\", key = [\"device\"] }]",
        "watch = [{ table = \"public.readings\", key = [\"device\"] }, { table = \"notes\", key = [\"device\"] }]",
    );
    assert!(notes.contains("table = \"notes\""), "{notes}");
    let cfg = write_config(dir.path(), &notes);
    let (level, msg) = identity_of(&cfg, "public.notes");
    assert_eq!(level, "warning", "{msg}");
    assert!(msg.contains("Cheapest that does: FULL"), "{msg}");
    assert!(msg.contains("device may be NULL"), "{msg}");
}

#[test]
fn fixed_key_must_be_a_boolean() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "[source]\nkind = \"postgres\"\nurl = \"postgres://u@localhost/db\"\n[[views]]\nname = \"v\"\nwatch = [{ table = \"t\", key = [\"a\"], fixed_key = \"yes\" }]\nrebuild = [\"SELECT $1\"]\n",
    );
    let out = freshen()
        .args(["check", "--offline", "-c"])
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("`views[0].watch[0].fixed_key` must be true or false, not a string"),
        "{text}"
    );
}

/// The `column_list` finding for `table`, if any: (level, message).
fn column_list_of(cfg: &std::path::Path, table: &str) -> Option<(String, String)> {
    finding(cfg, "column_list", table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reads_the_publications_column_lists() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(SCHEMA).await.unwrap();
    c.batch_execute(
        "CREATE UNIQUE INDEX readings_identity ON readings (device, site, id);
         ALTER TABLE readings REPLICA IDENTITY USING INDEX readings_identity;
         ALTER TABLE sites REPLICA IDENTITY DEFAULT;",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &config(&pg.url(), "off"));

    // No list: nothing to say.
    c.batch_execute("CREATE PUBLICATION freshen_test FOR TABLE readings, sites")
        .await
        .unwrap();
    assert_eq!(column_list_of(&cfg, "public.readings"), None);
    if pg.major_version() < 15 {
        // Column lists came with PostgreSQL 15: there is nothing more to read on 14.
        return;
    }

    // The keys and the identity listed: fine.
    c.batch_execute("ALTER PUBLICATION freshen_test SET TABLE readings (id, device, site), sites")
        .await
        .unwrap();
    let (level, msg) = column_list_of(&cfg, "public.readings").expect("a finding");
    assert_eq!(level, "ok", "{msg}");

    // site left out: a key of site_totals and part of the identity.
    c.batch_execute("ALTER PUBLICATION freshen_test SET TABLE readings (id, device), sites")
        .await
        .unwrap();
    let (level, msg) = column_list_of(&cfg, "public.readings").expect("a finding");
    assert_eq!(level, "error", "{msg}");
    assert!(
        msg.contains("without site of the replica identity"),
        "{msg}"
    );
}
