//! A captured schema (`FOR TABLES IN SCHEMA`, PostgreSQL 15): tables created after the
//! start are delivered as they appear; tables of other schemas are not; a table in it
//! that would break the application's UPDATE and DELETE once published is refused.

mod support;

use freshen_postgres::PgSource;
use support::*;

#[tokio::test]
async fn tables_created_in_a_captured_schema_are_delivered_as_they_appear() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE SCHEMA app; CREATE TABLE app.a (id int PRIMARY KEY); \
         CREATE TABLE public.elsewhere (id int PRIMARY KEY);",
    )
    .await
    .unwrap();
    let mut cfg = config(&pg, "disc", &[]);
    cfg.schemas = vec!["app".into()];
    let mut src = source(cfg).await;

    c.batch_execute(
        "CREATE TABLE app.b (id int PRIMARY KEY, note text); \
         INSERT INTO public.elsewhere VALUES (1); \
         INSERT INTO app.b VALUES (1, 'new'); \
         INSERT INTO app.a VALUES (2);",
    )
    .await
    .unwrap();
    let evs = events(&take_events(&mut src, 2, 20).await);
    let tables: Vec<String> = evs
        .iter()
        .map(|e| format!("{}.{}", e.schema, e.table))
        .collect();
    assert_eq!(
        tables,
        ["app.b", "app.a"],
        "public.elsewhere is not captured"
    );
    assert_eq!(
        evs[0].new.as_ref().unwrap().get("note"),
        Some(&freshen::Value::text("new"))
    );
}

#[tokio::test]
async fn a_keyless_table_in_a_captured_schema_is_refused() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute("CREATE SCHEMA app; CREATE TABLE app.log (line text)")
        .await
        .unwrap();
    let mut cfg = config(&pg, "keyless", &[]);
    cfg.schemas = vec!["app".into()];
    let err = PgSource::start(cfg).await.unwrap_err().to_string();
    assert!(err.contains("app") && err.contains("log"), "{err}");
    assert!(err.contains("REPLICA IDENTITY FULL"), "{err}");
    let published: i64 = c
        .query_one("SELECT count(*) FROM pg_publication", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(published, 0, "nothing was published");
}
