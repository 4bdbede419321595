//! The throwaway PostgreSQL server: starts, serves, restarts, cleans up.

use std::process::Command;

use freshen_testenv::PgServer;

#[test]
fn starts_logical_ready_and_cleans_up() {
    let mut pg = PgServer::start().expect("start PostgreSQL");
    assert_eq!(pg.psql("SHOW wal_level").unwrap(), "logical");
    assert_eq!(pg.psql("SHOW fsync").unwrap(), "off");
    assert!(pg.url().starts_with("postgres://postgres@127.0.0.1:"));
    assert!(pg.url().ends_with(&format!(":{}/postgres", pg.port())));
    let data = pg.data_dir();
    assert!(data.join("PG_VERSION").is_file());

    pg.psql("CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)")
        .unwrap();
    pg.restart().expect("restart");
    assert_eq!(
        pg.psql("SELECT x FROM kept").unwrap(),
        "7",
        "data survives a restart"
    );

    pg.kill().expect("kill");
    assert!(!pg.is_running());
    assert!(
        pg.psql("SELECT 1").is_err(),
        "a killed server answers nothing"
    );
    pg.start_again().expect("start after a crash");
    assert_eq!(pg.psql("SELECT x FROM kept").unwrap(), "7");

    drop(pg);
    assert!(!data.exists(), "the directory is removed on drop");
}

#[test]
fn never_runs_as_root() {
    let pg = PgServer::start().expect("start PostgreSQL");
    let pidfile = std::fs::read_to_string(pg.data_dir().join("postmaster.pid")).unwrap();
    let pid = pidfile.lines().next().unwrap().trim().to_string();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    let uid: u32 = uid_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_ne!(uid, 0, "the postmaster runs unprivileged: {uid_line}");
}

#[test]
fn password_is_required_over_tcp() {
    let pg = PgServer::builder()
        .password("s3cret pw")
        .start()
        .expect("start PostgreSQL");
    assert!(pg.url().contains("s3cret%20pw"));
    let psql = pg.tool("psql");
    let try_with = |pw: &str| {
        Command::new(&psql)
            .args([
                "-X",
                "-A",
                "-t",
                "-w",
                "-h",
                "127.0.0.1",
                "-p",
                &pg.port().to_string(),
            ])
            .args(["-U", "postgres", "-d", "postgres", "-c", "SELECT 42"])
            .env("PGPASSWORD", pw)
            .output()
            .unwrap()
    };
    let ok = try_with("s3cret pw");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "42");
    let bad = try_with("wrong");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("password authentication failed"));
}

#[test]
fn serves_tls_with_a_throwaway_ca() {
    let pg = PgServer::builder()
        .tls(true)
        .start()
        .expect("start PostgreSQL with TLS");
    let ca = pg.ca_cert().expect("a CA");
    let out = Command::new(pg.tool("psql"))
        .args(["-X", "-A", "-t", "-c", "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"])
        .arg(format!(
            "host=localhost port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert={}",
            pg.port(),
            ca.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "t");
}

#[test]
fn starts_the_version_asked_for() {
    let major = PgServer::find_major_version().expect("an installed PostgreSQL");
    let pg = PgServer::builder()
        .version(major)
        .start()
        .expect("start PostgreSQL");
    assert_eq!(pg.major_version(), major);
    let num: u32 = pg.psql("SHOW server_version_num").unwrap().parse().unwrap();
    assert_eq!(num / 10_000, major, "the server runs the version asked for");
    assert!(pg.tool("psql").is_file(), "a psql for every version");
}

#[test]
fn one_process_starts_servers_of_two_versions() {
    // A benchmark run starts the default server and, for one scenario, another major
    // version: each must get its own cluster template.
    let major = PgServer::find_major_version().expect("an installed PostgreSQL");
    let other = if major == 16 { 17 } else { 16 };
    for v in [major, other, major] {
        let pg = PgServer::builder().version(v).start().unwrap_or_else(|e| {
            panic!("start PostgreSQL {v} (other versions: scripts/test-deps-postgres): {e}")
        });
        let num: u32 = pg.psql("SHOW server_version_num").unwrap().parse().unwrap();
        assert_eq!(num / 10_000, v);
    }
}

#[test]
fn a_standby_streams_holds_back_and_promotes() {
    let mut primary = PgServer::start().expect("start PostgreSQL");
    let standby = primary
        .start_standby(PgServer::builder())
        .expect("start a standby");
    assert!(standby.in_recovery().unwrap());
    assert!(!primary.in_recovery().unwrap());
    let slot = standby
        .standby_slot()
        .expect("the standby's slot")
        .to_string();
    assert_eq!(
        primary
            .psql(&format!(
                "SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'"
            ))
            .unwrap(),
        "t",
        "the standby streams through its slot"
    );
    primary
        .psql("CREATE TABLE seen (x int); INSERT INTO seen VALUES (1)")
        .unwrap();
    freshen_testenv::support::wait_for(std::time::Duration::from_secs(30), || {
        (standby.psql("SELECT count(*) FROM seen").ok()? == "1").then_some(())
    })
    .expect("the standby replays the primary's change");

    standby.hold_wal_receiver().expect("hold the receiver");
    primary.psql("INSERT INTO seen VALUES (2)").unwrap();
    // What the primary flushed after the hold never reaches the standby: its slot on the
    // primary stays behind the primary's position.
    let behind = primary
        .psql(&format!(
            "SELECT restart_lsn < pg_current_wal_flush_lsn() FROM pg_replication_slots \
             WHERE slot_name = '{slot}'"
        ))
        .unwrap();
    assert_eq!(behind, "t");
    standby.promote().expect("promote");
    assert!(!standby.in_recovery().unwrap());
    assert_eq!(
        standby.psql("SELECT count(*) FROM seen").unwrap(),
        "1",
        "the held-back change is not on the promoted standby"
    );
    standby.psql("INSERT INTO seen VALUES (3)").unwrap();
}
