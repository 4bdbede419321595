//! A standby as the source: logical decoding on a standby (PostgreSQL 16). What it
//! needs (the version; a publication made on the primary, since a standby is
//! read-only), and a slot created there without waiting for the primary's next
//! checkpoint.
//!
//! A logical slot on a standby can only be created once the standby has replayed a
//! record of the primary's running transactions (`xl_running_xacts`). The primary
//! writes one at each checkpoint and, when busy, every 15 s (the background writer);
//! an idle primary writes one only at its next checkpoint — up to `checkpoint_timeout`,
//! 5 minutes by default. `pg_log_standby_snapshot()` (16+) on the primary writes one
//! now: freshen calls it every second while it creates a slot on a standby, when it can
//! reach the primary (`[source] primary_url`).

use std::time::Duration;

use crate::error::ErrorKind;
use crate::pool::client;
use crate::{ConnectionConfig, PgAdmin, PgError, Pool, connect_pool};

/// The first version that decodes on a standby (`server_version_num`).
pub(crate) const STANDBY_DECODING_SINCE: u32 = 160_000;

/// The first version with failover slots (`server_version_num`).
pub(crate) const FAILOVER_SLOTS_SINCE: u32 = 170_000;

/// How often the primary is asked for a standby snapshot while a slot is created.
const SNAPSHOT_EVERY: Duration = Duration::from_secs(1);

impl PgAdmin {
    /// Whether the server is a standby (`pg_is_in_recovery()`).
    pub async fn in_recovery(&self) -> Result<bool, PgError> {
        let row = self
            .one_row(
                "whether the server is a standby",
                "SELECT pg_is_in_recovery()",
                &[],
            )
            .await?;
        Ok(row.is_some_and(|r| r.get(0)))
    }

    /// A server setting's value (`current_setting`), `""` when it has none.
    pub async fn setting(&self, name: &str) -> Result<String, PgError> {
        let row = self
            .one_row(
                "a server setting",
                "SELECT current_setting($1, true)",
                &[&name],
            )
            .await?;
        Ok(row
            .and_then(|r| r.get::<_, Option<String>>(0))
            .unwrap_or_default())
    }

    /// Why rebuilds cannot write here: the server is a standby (in recovery) or its
    /// sessions are read-only (`default_transaction_read_only`). `None` when writable.
    pub async fn read_only(&self) -> Result<Option<&'static str>, PgError> {
        let row = self
            .one_row(
                "whether the server accepts writes",
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
                &[],
            )
            .await?;
        Ok(
            match row.map(|r| (r.get::<_, bool>(0), r.get::<_, bool>(1))) {
                Some((true, _)) => Some("is a standby (in recovery)"),
                Some((false, true)) => Some("is read-only (default_transaction_read_only = on)"),
                _ => None,
            },
        )
    }

    /// Whether a slot created now is a failover slot: `wanted` as set, or (`None`) where
    /// the server can make one: PostgreSQL 17 and later, on a primary. Asking for one
    /// where the server cannot is a setup error.
    pub(crate) async fn failover_for(&self, wanted: Option<bool>) -> Result<bool, PgError> {
        if wanted == Some(false) {
            return Ok(false);
        }
        let can = failover_possible(self.server_version_num().await?, self.in_recovery().await?);
        match (wanted, can) {
            (_, Ok(())) => Ok(true),
            (None, Err(_)) => Ok(false),
            (Some(_), Err(why)) => Err(PgError::new(ErrorKind::Setup, why)),
        }
    }

    /// Whether slot `name` is a failover slot, and the primary's
    /// `synchronized_standby_slots` (PostgreSQL 17; `None` before, or no such slot).
    pub async fn slot_failover(&self, name: &str) -> Result<Option<(bool, String)>, PgError> {
        if self.server_version_num().await? < FAILOVER_SLOTS_SINCE {
            return Ok(None);
        }
        let row = self
            .one_row(
                "whether the slot is a failover slot",
                "SELECT failover, current_setting('synchronized_standby_slots') \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&name],
            )
            .await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    /// Why this standby cannot be a source: decoding on a standby came with
    /// PostgreSQL 16. `None` on a primary or a standby that can.
    pub async fn standby_source_problem(&self) -> Result<Option<String>, PgError> {
        if !self.in_recovery().await? {
            return Ok(None);
        }
        Ok(standby_too_old(self.server_version_num().await?))
    }

    /// Creates a persistent `pgoutput` slot like [`create_slot`](Self::create_slot); on
    /// a standby, asks `primary` (when given) for a standby snapshot every second until
    /// the creation ends. Dropping the future cancels the creation on the server (a
    /// shutdown while it waits ends it).
    pub(crate) async fn create_slot_on(
        &self,
        name: &str,
        primary: Option<&ConnectionConfig>,
        failover: bool,
    ) -> Result<(), PgError> {
        let standby = self.in_recovery().await?;
        let c = client(&self.pool).await?;
        let pid: i32 = c
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .map_err(|e| PgError::sql("cannot read the backend's pid", e))?
            .get(0);
        // Should freshen go away while the creation waits (a shutdown ends the process
        // before the cancel below is sent; a SIGKILL), the server notices the closed
        // connection within a second and drops the half-made slot (PostgreSQL 14+).
        let _ = c
            .batch_execute("SET client_connection_check_interval = 1000")
            .await;
        let mut guard = CancelOnDrop {
            pool: self.pool.clone(),
            pid,
            armed: true,
        };
        // The failover argument exists from 17 on: named only when asked for.
        let sql = if failover {
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput', failover => true)"
        } else {
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')"
        };
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&name];
        let create = c.execute(sql, &params);
        let result = match (standby, primary) {
            (true, Some(primary)) => {
                tokio::pin!(create);
                let asking = ask_for_snapshots(primary);
                tokio::pin!(asking);
                tokio::select! {
                    r = &mut create => r,
                    never = &mut asking => match never {
                        Err(e) => {
                            tracing::warn!(slot = %name, "cannot ask the primary for a standby snapshot: {e}; the slot is created at its next checkpoint");
                            create.await
                        }
                    },
                }
            }
            (true, None) => {
                tracing::warn!(
                    slot = %name,
                    "creating the slot on a standby: it waits for the primary's next standby snapshot (an idle primary writes one at its next checkpoint); set [source] primary_url so freshen asks the primary for one"
                );
                create.await
            }
            (false, _) => create.await,
        };
        guard.armed = false;
        result.map_err(|e| PgError::sql(format!("cannot create replication slot {name:?}"), e))?;
        Ok(())
    }
}

/// Calls `pg_log_standby_snapshot()` on the primary every second; returns only on an
/// error (the caller stops asking when the slot exists).
async fn ask_for_snapshots(
    primary: &ConnectionConfig,
) -> Result<std::convert::Infallible, PgError> {
    let pool = connect_pool(primary, 1)?;
    let c = client(&pool).await?;
    loop {
        c.execute("SELECT pg_log_standby_snapshot()", &[])
            .await
            .map_err(|e| PgError::sql("pg_log_standby_snapshot() on the primary", e))?;
        tokio::time::sleep(SNAPSHOT_EVERY).await;
    }
}

/// Cancels backend `pid`'s statement when dropped while armed: a slot creation left
/// behind by a shutdown would otherwise wait on, and create the slot, after freshen
/// is gone.
struct CancelOnDrop {
    pool: Pool,
    pid: i32,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (pool, pid) = (self.pool.clone(), self.pid);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Ok(c) = client(&pool).await {
                    let _ = c.execute("SELECT pg_cancel_backend($1)", &[&pid]).await;
                }
            });
        }
    }
}

/// Why a standby of `server_version_num` cannot be decoded from (pure).
pub(crate) fn standby_too_old(server_version_num: u32) -> Option<String> {
    (server_version_num < STANDBY_DECODING_SINCE).then(|| {
        format!(
            "the source is a standby (in recovery) running PostgreSQL {}.{}: logical decoding on a standby needs PostgreSQL 16 or later; point [source] url at the primary, or upgrade",
            server_version_num / 10_000,
            server_version_num % 10_000 / 100
        )
    })
}

/// Whether a server of `server_version_num` (a standby when `standby`) can create a
/// failover slot, and why not (pure).
pub(crate) fn failover_possible(server_version_num: u32, standby: bool) -> Result<(), String> {
    if server_version_num < FAILOVER_SLOTS_SINCE {
        return Err(format!(
            "failover = true needs PostgreSQL 17 (failover slots); this server is {}.{}: set failover = false",
            server_version_num / 10_000,
            server_version_num % 10_000 / 100
        ));
    }
    if standby {
        return Err(
            "failover = true: a standby cannot create a failover slot (a standby's own slots are not synchronized further); set failover = false, or decode on the primary".to_owned(),
        );
    }
    Ok(())
}

/// The error for a publication that a standby source would have freshen create or
/// extend: a standby is read-only, so it is made on the primary (pure).
pub(crate) fn publication_on_primary(name: &str, statement: &str) -> PgError {
    PgError::new(
        ErrorKind::Setup,
        format!(
            "the source is a standby (in recovery), where publication {name:?} cannot be created or changed: run on the primary {statement} and set publication_mode = \"existing\""
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_on_a_standby_needs_16() {
        let why = standby_too_old(150_014).expect("15 cannot");
        assert!(
            why.contains("15.0") && why.contains("PostgreSQL 16"),
            "{why}"
        );
        assert_eq!(standby_too_old(160_000), None);
        assert_eq!(standby_too_old(180_004), None);
    }

    #[test]
    fn failover_slots_from_17_on_a_primary() {
        assert!(
            failover_possible(160_004, false)
                .unwrap_err()
                .contains("17")
        );
        assert!(
            failover_possible(170_000, true)
                .unwrap_err()
                .contains("standby")
        );
        assert_eq!(failover_possible(180_004, false), Ok(()));
    }

    #[test]
    fn the_publication_error_names_the_statement_and_the_setting() {
        let e = publication_on_primary("freshen", "CREATE PUBLICATION freshen FOR TABLE t");
        assert_eq!(e.kind(), ErrorKind::Setup);
        let text = e.to_string();
        assert!(text.contains("on the primary CREATE PUBLICATION freshen FOR TABLE t"));
        assert!(text.contains("publication_mode = \"existing\""));
    }
}
