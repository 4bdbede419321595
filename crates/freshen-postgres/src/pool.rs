//! The SQL connection pool every part of this crate uses (rebuilds, sweeps, admin).

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

use crate::error::ErrorKind;
use crate::{ConnectionConfig, PgError, tls};

/// A pool of SQL connections (deadpool-postgres over tokio-postgres, TLS by rustls).
/// Connections are opened lazily; the pool spawns their tasks on the runtime that
/// first uses them.
pub fn connect_pool(conn: &ConnectionConfig, max_size: usize) -> Result<Pool, PgError> {
    let problems = conn.problems();
    if !problems.is_empty() {
        return Err(PgError::config(&problems));
    }
    let manager = Manager::from_config(
        conn.to_tokio(),
        tls::sql_connector(conn)?,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max_size.max(1))
        .build()
        .map_err(|e| {
            PgError::new(
                ErrorKind::Config,
                format!("cannot build the connection pool: {e}"),
            )
        })
}

/// Takes a connection from `pool`, mapping pool errors to [`PgError`].
pub(crate) async fn client(pool: &Pool) -> Result<deadpool_postgres::Object, PgError> {
    pool.get().await.map_err(|e| match e {
        deadpool_postgres::PoolError::Backend(e) => PgError::sql("cannot connect to PostgreSQL", e),
        other => PgError::new(
            ErrorKind::Connection,
            format!("cannot get a connection: {other}"),
        ),
    })
}
