//! `MariaDbServer` starts a real server with the binlog settings freshen needs, and
//! survives a stop and a start.

use freshen_testenv::MariaDbServer;

#[test]
fn starts_with_a_row_based_binlog_and_restarts() {
    let mut db = MariaDbServer::start().unwrap_or_else(|e| panic!("MariaDB for this test: {e}"));
    let vars = db
        .sql("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata, @@binlog_checksum")
        .unwrap();
    assert_eq!(vars, "1\tROW\tFULL\tFULL\tCRC32");
    db.sql("CREATE DATABASE app; CREATE TABLE app.t (id int PRIMARY KEY); INSERT INTO app.t VALUES (1)")
        .unwrap();
    db.restart().unwrap();
    assert_eq!(db.sql("SELECT count(*) FROM app.t").unwrap(), "1");
    assert!(db.url("app").starts_with("mysql://root@127.0.0.1:"));
}
