//! Which of several hosts a connection uses (`postgres://h1,h2/db?target_session_attrs=read-write`).
//! tokio-postgres chooses for SQL connections itself; the replication client takes one
//! host, so the reader asks each in order, every time it connects, the way libpq's
//! `target_session_attrs` does: after a promotion the next session finds the new
//! primary without a restart.

use crate::error::ErrorKind;
use crate::pool::client;
use crate::{ConnectionConfig, PgError, SessionAttrs, connect_pool};

/// The first host of `conn` that answers (and, with `read-write`, accepts writes), as a
/// configuration of that host alone. One host: `conn` itself, unasked.
pub(crate) async fn pick(conn: &ConnectionConfig) -> Result<ConnectionConfig, PgError> {
    if conn.more_hosts.is_empty() {
        return Ok(conn.clone());
    }
    let mut why = Vec::new();
    for one in conn.each_host() {
        match suits(&one).await {
            Ok(true) => return Ok(one),
            Ok(false) => why.push(format!("{}:{} does not accept writes", one.host, one.port)),
            Err(e) => why.push(format!("{}:{}: {e}", one.host, one.port)),
        }
    }
    Err(PgError::new(
        ErrorKind::Connection,
        format!("no host suits target_session_attrs: {}", why.join("; ")),
    ))
}

/// Whether `one` (a single host) answers and, when writes are asked for, takes them.
async fn suits(one: &ConnectionConfig) -> Result<bool, PgError> {
    let pool = connect_pool(one, 1)?;
    let c = client(&pool).await?;
    if one.target_session_attrs == SessionAttrs::Any {
        return Ok(true);
    }
    let row = c
        .query_one(
            "SELECT NOT (pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on')",
            &[],
        )
        .await
        .map_err(|e| PgError::sql("cannot ask whether the host accepts writes", e))?;
    Ok(row.get(0))
}
