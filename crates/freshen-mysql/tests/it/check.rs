//! `check_source` and `check_statements` against a real server: a good setup has no
//! errors; a missing REPLICATION SLAVE is named as such; a wrong password as such;
//! statements that do not prepare are named by number.

use crate::support;

use freshen::plug::Level;
use freshen_mysql::{SecretUrl, check_source, check_statements, connect_pool};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_finds_what_a_person_must_fix() {
    let db = server();
    let cfg = config(&db, "chk", &["app.t"]);
    let good = check_source(&cfg).await;
    assert!(good.iter().all(|f| f.level == Level::Warning), "{good:#?}");

    db.sql(
        "CREATE USER 'norepl'@'127.0.0.1' IDENTIFIED BY 'pw';
         GRANT SELECT ON *.* TO 'norepl'@'127.0.0.1';
         GRANT BINLOG MONITOR ON *.* TO 'norepl'@'127.0.0.1';",
    )
    .unwrap();
    let mut no_grant = cfg.clone();
    no_grant.url = SecretUrl::new(format!("mysql://norepl:pw@127.0.0.1:{}/app", db.port()));
    let found = check_source(&no_grant).await;
    let errors: Vec<String> = found
        .iter()
        .filter(|f| f.level == Level::Error)
        .map(|f| f.to_string())
        .collect();
    assert_eq!(errors.len(), 1, "{found:#?}");
    assert!(
        errors[0].contains("REPLICATION SLAVE grant is missing (not a wrong password)"),
        "{errors:?}"
    );

    let mut wrong = cfg.clone();
    wrong.url = SecretUrl::new(format!("mysql://norepl:nope@127.0.0.1:{}/app", db.port()));
    let found = check_source(&wrong).await;
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].message.contains("wrong user or password"),
        "{found:?}"
    );
    assert!(!found[0].to_string().contains("nope"));

    db.sql("CREATE TABLE app.t (id INT PRIMARY KEY)").unwrap();
    let pool = connect_pool(&db.url("app"), 1).unwrap();
    let statements = [
        "DELETE FROM app.t WHERE id = $1".to_string(),
        "DELETE FROM app.missing WHERE id = $1".to_string(),
        "DELETE FROM app.t WHERE id = ?".to_string(),
    ];
    let found = check_statements(&pool, "rebuild", &statements).await;
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0]
            .message
            .starts_with("rebuild statement 2 does not prepare"),
        "{found:?}"
    );
    assert!(
        found[1].message.contains("statement 3") && found[1].message.contains("$1"),
        "{found:?}"
    );
}
