//! One active freshen per source name: a standby waits on a named server lock.
//!
//! The MySQL twin of the PostgreSQL source's advisory lock. Two `freshen run`
//! processes on one configuration would both read the binlog, both store the position
//! and both rebuild — and a rebuild from an older snapshot that commits last leaves a
//! derived row stale. So before it reads anything a process takes `GET_LOCK` on the
//! source server, named after the source's `name` (the key its position is stored
//! under). The one that holds it is active; the others are standbys that try again
//! every second. The lock lives on its own connection: when the active process dies,
//! even by SIGKILL, the server ends its session and releases the lock.
//!
//! Unlike a PostgreSQL connection, a MySQL connection has no task that notices the
//! session ending by itself, so [`Leadership::lost`] pings it every
//! [`PROBE_EVERY`] and also asks the server whether this session still holds the lock
//! (an administrator's `RELEASE_ALL_LOCKS()` or a `KILL` end it without closing the
//! socket at once).
//!
//! ```text
//!   try_acquire ──granted──▶ Leader ──ping fails / lock gone──▶ lost() resolves
//!        │                                                     (re-acquire, or stop)
//!        └──held elsewhere──▶ Held { holder } ──1 s──▶ try_acquire
//! ```

use std::time::Duration;

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use crate::error::{ErrorKind, MySqlError};
use crate::server;

/// How often the held lock's session is checked.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long one check may take before the session counts as gone: long enough that a
/// busy server does not demote the active process, short enough that a silent network
/// failure is noticed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// The lock's name for a source: `freshen:` and the source name, cut to the 64
/// characters a lock name may have (MySQL 5.7+; MariaDB takes longer ones).
pub fn lock_name(source: &str) -> String {
    let mut name = format!("freshen:{source}");
    if let Some((cut, _)) = name.char_indices().nth(64) {
        name.truncate(cut);
    }
    name
}

/// Who holds the lock, as the server sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's connection id.
    pub connection: u64,
    /// Its user and host (`user@host:port`), when the process list could be read.
    pub client: Option<String>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.client {
            Some(c) => write!(f, "{c} (connection {})", self.connection),
            None => write!(f, "connection {}", self.connection),
        }
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
    conn: Conn,
    name: String,
}

impl Leadership {
    /// Tries once to become the active process for source `source` on the server of
    /// `url`.
    pub async fn try_acquire(url: &str, source: &str) -> Result<Attempt, MySqlError> {
        let opts = server::opts(url)?;
        let mut conn = server::connect(&opts, "the standby lock").await?;
        let name = lock_name(source);
        // GET_LOCK: 1 granted, 0 held by another session (after the timeout, 0 here),
        // NULL on an error.
        let granted: Option<Option<i64>> = conn
            .exec_first("SELECT GET_LOCK(?, 0)", (&name,))
            .await
            .map_err(|e| MySqlError::driver("cannot take the standby lock", e))?;
        match granted.flatten() {
            Some(1) => return Ok(Attempt::Leader(Leadership { conn, name })),
            Some(_) => {}
            None => {
                return Err(MySqlError::new(
                    ErrorKind::Server,
                    format!("the server could not take the standby lock {name:?}"),
                ));
            }
        }
        // NULL when the lock was released since GET_LOCK: no holder to name (read as an
        // `Option`, so that a NULL is never a panic in the row conversion).
        let holder: Option<Option<Option<u64>>> = conn
            .exec_first("SELECT IS_USED_LOCK(?)", (&name,))
            .await
            .ok();
        let holder = match holder.flatten().flatten() {
            Some(connection) => {
                // The process list shows other users' sessions only with PROCESS;
                // without it the connection id is all there is to say.
                let client: Option<(String, String)> = conn
                    .exec_first(
                        "SELECT USER, HOST FROM information_schema.PROCESSLIST WHERE ID = ?",
                        (connection,),
                    )
                    .await
                    .ok()
                    .flatten();
                Some(Holder {
                    connection,
                    client: client.map(|(user, host)| format!("{user}@{host}")),
                })
            }
            None => None,
        };
        let _ = conn.disconnect().await;
        Ok(Attempt::Held(holder))
    }

    /// Resolves when the lock is gone (the server restarted, the network failed, an
    /// administrator killed the session or released the lock): another process may
    /// take it now.
    pub async fn lost(&mut self) -> MySqlError {
        let mut tick = tokio::time::interval(PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let mine: Result<Option<Option<i64>>, _> = tokio::time::timeout(
                PROBE_TIMEOUT,
                self.conn
                    .exec_first("SELECT IS_USED_LOCK(?) = CONNECTION_ID()", (&self.name,)),
            )
            .await
            .unwrap_or_else(|_| Err(mysql_async::DriverError::ConnectionClosed.into()));
            match mine {
                Ok(Some(Some(1))) => continue,
                Ok(_) => {
                    return MySqlError::new(
                        ErrorKind::Connection,
                        format!(
                            "the standby lock {:?} was released on the server",
                            self.name
                        ),
                    );
                }
                Err(e) => return MySqlError::driver("the standby lock's session ended", e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_are_prefixed_and_fit_the_server_limit() {
        assert_eq!(lock_name("rollups"), "freshen:rollups");
        let long = "x".repeat(100);
        assert_eq!(lock_name(&long).chars().count(), 64);
        // Cut on a character, never inside one.
        let wide = "é".repeat(100);
        assert_eq!(lock_name(&wide).chars().count(), 64);
    }
}
