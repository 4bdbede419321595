//! A captured schema (`FOR TABLES IN SCHEMA`, PostgreSQL 15), a name pattern and
//! `"all"`: tables created after the start are delivered as they appear; tables the
//! selection leaves out are not; a table that would break the application's UPDATE and
//! DELETE once published is refused; without a superuser the error names the fix.

use crate::support;

use freshen_postgres::{ConnectionConfig, PgSource, PgSourceConfig, TableName, TablePattern};
use support::*;

/// The source of a schema pattern, started on PostgreSQL 15 or later; on 14, which has
/// no `FOR TABLES IN SCHEMA`, the start is refused with the reason and the fix, and
/// nothing is published: `None`.
async fn start_from_15(pg: &freshen_testenv::PgServer, cfg: PgSourceConfig) -> Option<PgSource> {
    if pg.major_version() >= 15 {
        return Some(source(cfg).await);
    }
    let err = PgSource::start(cfg).await.unwrap_err().to_string();
    assert!(
        err.contains("PostgreSQL 15") && err.contains("list the tables by name"),
        "{err}"
    );
    let published: i64 = sql(pg)
        .await
        .query_one("SELECT count(*) FROM pg_publication", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(published, 0, "nothing was published");
    None
}

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
    let Some(mut src) = start_from_15(&pg, cfg).await else {
        return;
    };

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

/// `"app.order_*"`: the schema is published, the pattern filtered by freshen — a
/// matching table created later is delivered from its first row; the schema's other
/// tables and freshen's bookkeeping are not.
#[tokio::test]
async fn a_name_pattern_delivers_matching_tables_only_those_created_later_included() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE SCHEMA app; CREATE TABLE app.order_lines (id int PRIMARY KEY); \
         CREATE TABLE app.orders (id int PRIMARY KEY);",
    )
    .await
    .unwrap();
    let mut cfg = config(&pg, "pattern", &[]);
    cfg.patterns = vec![TablePattern::parse("app.order_*").unwrap().unwrap()];
    let Some(mut src) = start_from_15(&pg, cfg).await else {
        return;
    };
    let admin = freshen_postgres::PgAdmin::connect(&ConnectionConfig::from_url(&pg.url()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        admin
            .selected_tables(&[TablePattern::parse("app.order_*").unwrap().unwrap()])
            .await
            .unwrap(),
        [TableName::new("app", "order_lines")]
    );

    c.batch_execute(
        "CREATE TABLE app.order_refunds (id int PRIMARY KEY, amount int); \
         CREATE TABLE app.freshen_order_x (id int PRIMARY KEY); \
         INSERT INTO app.orders VALUES (1); \
         INSERT INTO app.freshen_order_x VALUES (1); \
         INSERT INTO app.order_refunds VALUES (7, 70); \
         INSERT INTO app.order_lines VALUES (2);",
    )
    .await
    .unwrap();
    let evs = events(&take_events(&mut src, 2, 20).await);
    let tables: Vec<String> = evs
        .iter()
        .map(|e| format!("{}.{}", e.schema, e.table))
        .collect();
    assert_eq!(tables, ["app.order_refunds", "app.order_lines"]);
}

/// `"all"`: a publication `FOR ALL TABLES` (the test role is a superuser): tables of a
/// schema created later are delivered; freshen's bookkeeping is not.
#[tokio::test]
async fn all_delivers_every_table_those_of_later_schemas_included_but_not_freshens_own() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute("CREATE TABLE public.a (id int PRIMARY KEY)")
        .await
        .unwrap();
    let mut cfg = config(&pg, "everything", &[]);
    cfg.patterns = vec![TablePattern::All];
    let mut src = source(cfg).await;
    let all: bool = c
        .query_one(
            "SELECT puballtables FROM pg_publication WHERE pubname = 'everything_pub'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(all, "FOR ALL TABLES");

    c.batch_execute(
        "CREATE SCHEMA later; CREATE TABLE later.b (id int PRIMARY KEY); \
         CREATE TABLE public.freshen_cursors (id int PRIMARY KEY); \
         INSERT INTO public.freshen_cursors VALUES (1); \
         INSERT INTO later.b VALUES (1); INSERT INTO public.a VALUES (2);",
    )
    .await
    .unwrap();
    let evs = events(&take_events(&mut src, 2, 20).await);
    let tables: Vec<String> = evs
        .iter()
        .map(|e| format!("{}.{}", e.schema, e.table))
        .collect();
    assert_eq!(tables, ["later.b", "public.a"]);
}

/// Without a superuser, a pattern's publication cannot be created: the error says so,
/// with the statement a superuser runs and the setting to change; nothing is published.
#[tokio::test]
async fn a_pattern_without_a_superuser_is_a_clear_error() {
    let pg = server();
    let c = sql(&pg).await;
    c.batch_execute(
        "CREATE ROLE plain LOGIN REPLICATION; GRANT CREATE ON DATABASE postgres TO plain; \
         CREATE SCHEMA app; GRANT USAGE ON SCHEMA app TO plain; \
         CREATE TABLE app.t (id int PRIMARY KEY); ALTER TABLE app.t OWNER TO plain",
    )
    .await
    .unwrap();
    let mut cfg = config(&pg, "plain", &[]);
    cfg.connection =
        ConnectionConfig::from_url(&pg.url().replacen("://postgres@", "://plain@", 1)).unwrap();
    cfg.patterns = vec![TablePattern::All];
    let err = PgSource::start(cfg.clone()).await.unwrap_err().to_string();
    assert!(err.contains("only a superuser"), "{err}");
    assert!(err.contains("FOR ALL TABLES"), "{err}");
    assert!(err.contains("publication_mode = \"existing\""), "{err}");
    cfg.patterns = vec![TablePattern::schema("app")];
    let err = PgSource::start(cfg).await.unwrap_err().to_string();
    if pg.major_version() < 15 {
        assert!(err.contains("PostgreSQL 15"), "{err}");
    } else {
        assert!(
            err.contains("TABLES IN SCHEMA \"app\"") || err.contains("TABLES IN SCHEMA app"),
            "{err}"
        );
    }
    let published: i64 = c
        .query_one("SELECT count(*) FROM pg_publication", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(published, 0, "nothing was published");
}
