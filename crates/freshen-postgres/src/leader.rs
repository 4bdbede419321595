//! One active freshen per slot: a standby waits on a session advisory lock.
//!
//! Two `freshen run` processes on one configuration would both rebuild (sweeps at
//! start, keys from whatever each reads), and a rebuild from an older snapshot that
//! commits last leaves a derived row stale. So before it touches the slot a process
//! takes a session-level advisory lock on the source database, keyed by the slot's name.
//! The one that holds it is active; the others are standbys that try again every
//! second. The lock lives on its own connection: when the active process dies, even by
//! SIGKILL, the server ends its session and releases the lock, and a standby takes over
//! on its next try. The slot itself is exclusive too, but only while streaming — the
//! lock also covers what a process does before and beside it.
//!
//! ```text
//!   try_acquire ──granted──▶ Leader ──connection ends──▶ lost() resolves
//!        │                                               (re-acquire, or stop)
//!        └──held elsewhere──▶ Held { holder } ──1 s──▶ try_acquire
//! ```

use tokio_postgres::Client;

use crate::error::ErrorKind;
use crate::{ConnectionConfig, PgError, tls};

/// The advisory lock's first key: "fres" — the lock space freshen uses.
const LOCK_CLASS: i32 = 0x6672_6573;

/// The second key: a stable 32-bit FNV-1a hash of the slot's name (stable across builds
/// and machines, unlike the standard library's hasher).
fn lock_key(slot: &str) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in slot.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h as i32
}

/// Who holds the lock, as the server sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's backend pid.
    pub pid: i32,
    /// Its `application_name` (freshen sets `freshen (slot NAME)` and the host name).
    pub application: String,
    /// Its client address (`local` for a Unix socket).
    pub client: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} from {} (backend pid {})",
            self.application, self.client, self.pid
        )
    }
}

/// The outcome of one [`Leadership::try_acquire`].
#[derive(Debug)]
pub enum Attempt {
    /// This process is active.
    Leader(Leadership),
    /// Another process is (the holder, when it could be read).
    Held(Option<Holder>),
}

/// The held lock: keep it alive as long as this process is active.
#[derive(Debug)]
pub struct Leadership {
    _client: Client,
    ended: tokio::sync::oneshot::Receiver<PgError>,
}

impl Leadership {
    /// Tries once to become the active process for `slot` on the database of `conn`.
    pub async fn try_acquire(conn: &ConnectionConfig, slot: &str) -> Result<Attempt, PgError> {
        let mut config = conn.to_tokio();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        config.application_name(format!("freshen (slot {slot}) on {host}"));
        let connect = config.connect(tls::sql_connector(conn)?);
        let (client, connection) = tokio::time::timeout(conn.connect_timeout, connect)
            .await
            .map_err(|_| {
                PgError::new(
                    ErrorKind::Connection,
                    "timed out connecting for the standby lock",
                )
            })?
            .map_err(|e| PgError::sql("cannot connect for the standby lock", e))?;
        let (tx, ended) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let e = match connection.await {
                Ok(()) => PgError::new(ErrorKind::Connection, "the standby lock's session ended"),
                Err(e) => PgError::sql("the standby lock's session ended", e),
            };
            let _ = tx.send(e);
        });
        let key = lock_key(slot);
        let granted: bool = client
            .query_one("SELECT pg_try_advisory_lock($1, $2)", &[&LOCK_CLASS, &key])
            .await
            .map_err(|e| PgError::sql("cannot take the standby lock", e))?
            .get(0);
        if granted {
            return Ok(Attempt::Leader(Leadership {
                _client: client,
                ended,
            }));
        }
        let holder = client
            .query_opt(
                "SELECT a.pid, a.application_name, coalesce(host(a.client_addr), 'local')
                   FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                  WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                    AND l.classid::bigint = ($1::int4::bigint & 4294967295)
                    AND l.objid::bigint = ($2::int4::bigint & 4294967295)",
                &[&LOCK_CLASS, &key],
            )
            .await
            .ok()
            .flatten()
            .map(|r| Holder {
                pid: r.get(0),
                application: r.get(1),
                client: r.get(2),
            });
        Ok(Attempt::Held(holder))
    }

    /// Resolves when the lock's session ends (the server restarted, the network
    /// failed, an administrator terminated it): the lock is gone and another process
    /// may take it.
    pub async fn lost(&mut self) -> PgError {
        match (&mut self.ended).await {
            Ok(e) => e,
            Err(_) => PgError::new(ErrorKind::Connection, "the standby lock's session ended"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_key_is_stable_and_tells_slots_apart() {
        // FNV-1a of "freshen": a fixed value, so two builds agree on the lock.
        assert_eq!(lock_key("freshen") as u32, 0x8c51_8230);
        assert_ne!(lock_key("freshen"), lock_key("freshen_2"));
    }
}
