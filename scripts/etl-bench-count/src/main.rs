//! A counting destination for supabase/etl, for freshen's `capture` benchmark.
//!
//! Runs etl's own `Pipeline` (its replication client, decoder, batching and status
//! updates) from an existing apply slot and exits once `ROWS` inserts have reached the
//! destination. The benchmark copies an unread slot to `supabase_etl_apply_<PIPELINE_ID>`
//! first, so etl streams exactly the WAL the other readers stream.
//!
//! Usage: etl-bench-count HOST PORT DATABASE USER PIPELINE_ID PUBLICATION TABLE ROWS
//!
//! etl normally copies a table before streaming it and starts the table's stream at the
//! copy's snapshot; rows written before that would be skipped. Here the table is declared
//! already `Ready` in an in-memory store, with its schema read from the catalog, so the
//! apply worker streams every row from the slot's position.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etl::data::TableRow;
use etl::destination::{
    Destination, DestinationWriteStatus, DropTableForCopyResult, WriteEventsDurability,
    WriteEventsResult, WriteTableRowsResult,
};
use etl::error::EtlResult;
use etl::event::Event;
use etl::pipeline::Pipeline;
use etl::schema::{ColumnSchema, ReplicatedTableSchema, TableId, TableName, TableSchema, Type};
use etl::store::{MemoryStore, SchemaStore, StateStore, TableState};
use etl_config::shared::{
    BatchConfig, InvalidatedSlotBehavior, MemoryBackpressureConfig, PgConnectionConfig,
    PipelineConfig, TableSyncCopyConfig, TcpKeepaliveConfig, TlsConfig,
};
use tokio::sync::Notify;

/// Counts inserted rows and wakes `main` once `target` is reached.
#[derive(Clone)]
struct Counter {
    rows: Arc<AtomicU64>,
    target: u64,
    reached: Arc<Notify>,
}

impl Destination for Counter {
    fn name() -> &'static str {
        "count"
    }

    async fn drop_table_for_copy(
        &self,
        _schema: &ReplicatedTableSchema,
        async_result: DropTableForCopyResult<()>,
    ) -> EtlResult<()> {
        async_result.send(Ok(()));
        Ok(())
    }

    async fn write_table_rows(
        &self,
        _schema: &ReplicatedTableSchema,
        _rows: Vec<TableRow>,
        async_result: WriteTableRowsResult,
    ) -> EtlResult<()> {
        async_result.send(Ok(DestinationWriteStatus::Durable));
        Ok(())
    }

    async fn write_events(
        &self,
        events: Vec<Event>,
        _durability: WriteEventsDurability,
        async_result: WriteEventsResult,
    ) -> EtlResult<()> {
        let inserts = events
            .iter()
            .filter(|e| matches!(e, Event::Insert(_)))
            .count() as u64;
        let total = self.rows.fetch_add(inserts, Ordering::AcqRel) + inserts;
        async_result.send(Ok(DestinationWriteStatus::Durable));
        if total >= self.target {
            self.reached.notify_one();
        }
        Ok(())
    }
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| {
            eprintln!(
                "usage: etl-bench-count HOST PORT DATABASE USER PIPELINE_ID PUBLICATION TABLE ROWS \
                 ({what} missing or invalid)"
            );
            std::process::exit(2)
        })
}

/// The table's schema as etl's table copy would have stored it: columns in attribute
/// order, primary-key positions, nullability.
async fn table_schema(
    host: &str,
    port: u16,
    database: &str,
    user: &str,
    table: &str,
) -> Result<TableSchema, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(
        &format!("host={host} port={port} dbname={database} user={user}"),
        tokio_postgres::NoTls,
    )
    .await?;
    tokio::spawn(connection);
    let rel = client
        .query_one(
            "SELECT c.oid, n.nspname, c.relname FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1::text::regclass",
            &[&table],
        )
        .await?;
    let oid: u32 = rel.get(0);
    let cols = client
        .query(
            "SELECT a.attname, a.atttypid, a.atttypmod, a.attnum::int4, a.attnotnull, \
                    array_position(i.indkey::int2[], a.attnum)::int4 \
             FROM pg_attribute a \
             LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&oid],
        )
        .await?;
    let columns = cols
        .iter()
        .map(|c| {
            let typ = Type::from_oid(c.get::<_, u32>(1)).unwrap_or(Type::TEXT);
            let mut b = ColumnSchema::builder(c.get(0), typ, c.get(3)).type_modifier(c.get(2));
            if c.get::<_, bool>(4) {
                b = b.not_null();
            }
            b.primary_key_ordinal_position(c.get(5)).build()
        })
        .collect();
    Ok(TableSchema::new(
        TableId::new(oid),
        TableName::new(rel.get(1), rel.get(2)),
        columns,
    ))
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let host: String = arg(&args, 1, "HOST");
    let port: u16 = arg(&args, 2, "PORT");
    let database: String = arg(&args, 3, "DATABASE");
    let user: String = arg(&args, 4, "USER");
    let pipeline_id: u64 = arg(&args, 5, "PIPELINE_ID");
    let publication: String = arg(&args, 6, "PUBLICATION");
    let table: String = arg(&args, 7, "TABLE");
    let rows: u64 = arg(&args, 8, "ROWS");

    let schema = match table_schema(&host, port, &database, &user, &table).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("etl-bench-count: reading the schema of {table}: {e}");
            std::process::exit(1)
        }
    };
    let store = MemoryStore::new();
    let table_id = schema.id;
    let prepared = async {
        store.store_table_schema(schema).await?;
        store.update_table_state(table_id, TableState::Ready).await
    };
    if let Err(e) = prepared.await {
        eprintln!("etl-bench-count: preparing the store: {e}");
        std::process::exit(1)
    }

    let counter = Counter {
        rows: Arc::new(AtomicU64::new(0)),
        target: rows,
        reached: Arc::new(Notify::new()),
    };
    // etl's defaults but for the batch fill time: a batch is handed over when its byte
    // budget fills or `max_fill_ms` after its first event (default 10 s, which would
    // hold the tail of every run for 10 s; etl's own benchmarks use 1 s). 10 ms is
    // close to freshen's hand-over (1024 events, or the wire quiet for 1 ms). No source
    // migrations: the DDL event trigger is not needed to stream inserts.
    let config = PipelineConfig {
        id: pipeline_id,
        publication_name: publication,
        pg_connection: PgConnectionConfig {
            host,
            hostaddr: None,
            port,
            name: database,
            username: user,
            password: None,
            tls: TlsConfig {
                trusted_root_certs: String::new(),
                enabled: false,
            },
            keepalive: TcpKeepaliveConfig::default(),
        },
        store_pg_connection: None,
        batch: BatchConfig {
            max_fill_ms: 10,
            ..BatchConfig::default()
        },
        table_error_retry_delay_ms: PipelineConfig::DEFAULT_TABLE_ERROR_RETRY_DELAY_MS,
        table_error_retry_max_attempts: PipelineConfig::DEFAULT_TABLE_ERROR_RETRY_MAX_ATTEMPTS,
        max_table_sync_workers: 1,
        memory_refresh_interval_ms: PipelineConfig::DEFAULT_MEMORY_REFRESH_INTERVAL_MS,
        replication_lag_refresh_interval_ms:
            PipelineConfig::DEFAULT_REPLICATION_LAG_REFRESH_INTERVAL_MS,
        memory_backpressure: Some(MemoryBackpressureConfig::default()),
        table_sync_copy: TableSyncCopyConfig::SkipAllTables,
        invalidated_slot_behavior: InvalidatedSlotBehavior::Error,
        max_copy_connections_per_table: 1,
        run_source_migrations: false,
    };
    let t0 = Instant::now();
    let mut pipeline = Pipeline::new(config, store, counter.clone());
    if let Err(e) = pipeline.start().await {
        eprintln!("etl-bench-count: starting the pipeline: {e}");
        std::process::exit(1)
    }
    let reached = counter.reached.clone();
    tokio::select! {
        () = reached.notified() => {}
        res = pipeline.wait() => {
            eprintln!(
                "etl-bench-count: the pipeline ended after {} of {rows} rows: {res:?}",
                counter.rows.load(Ordering::Acquire)
            );
            std::process::exit(1)
        }
        () = tokio::time::sleep(Duration::from_secs(600)) => {
            eprintln!(
                "etl-bench-count: stalled after {} of {rows} rows",
                counter.rows.load(Ordering::Acquire)
            );
            std::process::exit(1)
        }
    }
    // The walsender's work ends when the connection closes; a graceful shutdown would
    // only add etl's teardown to the measured time.
    println!(
        "{} rows in {:.3} s",
        counter.rows.load(Ordering::Acquire),
        t0.elapsed().as_secs_f64()
    );
    std::process::exit(0)
}
