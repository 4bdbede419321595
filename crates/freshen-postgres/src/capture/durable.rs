//! Durable where a failover lands: a position is confirmed to the slot only once the
//! rebuilds behind it are on the standbys that a promotion would make the primary.
//!
//! After-rebuild acks let the reader confirm a commit once every rebuild it caused has
//! committed — on the primary. A failover slot is synchronized to a standby up to what
//! that standby has flushed, and the source change that freshen confirmed is older
//! than the rebuild it caused: a standby can hold the change and the slot's position
//! past it, and not yet the rebuild. Promoted, it resumes after the change, and the
//! rebuild is lost for good (no reconcile heals it).
//!
//! So before confirming a position `p`, the watcher reads the primary's WAL position
//! `w` (every rebuild acknowledged before `p` was wanted committed before `w`) and
//! waits until each standby that matters has flushed WAL up to `w`:
//!
//! - a primary source: the physical slots named in its `synchronized_standby_slots`
//!   (PostgreSQL 17: the standbys that keep its failover slots), their `restart_lsn`
//!   being what each standby flushed — read again each time, so after a promotion the
//!   new primary's list counts (none: nothing to wait for);
//! - a standby source (decoding on a standby): the source itself, whose slot is the
//!   one a promotion keeps, by `pg_last_wal_receive_lsn()`; `w` is read on
//!   `[source] primary_url`.
//!
//! Without either (no `synchronized_standby_slots`, or no `primary_url`) nothing is
//! held: `check` warns that a promotion can then lose a rebuild.
//!
//! Waiting costs the confirmation a round trip to the standbys (a few milliseconds);
//! rebuilds and the stream never wait for it. A standby that stops flushing holds the
//! slot's position (and WAL on the source) until it flushes again or leaves
//! `synchronized_standby_slots`: the same promise the server makes its own walsenders.

use std::time::Duration;

use crate::{ConnectionConfig, Lsn, PgError, Pool, connect_pool, pool::client};

/// Whose flushed WAL a confirmation waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Standbys {
    /// The physical slots the primary names in `synchronized_standby_slots`, read
    /// again each time (after a promotion, the new primary's): their `restart_lsn`.
    Synchronized,
    /// The source, a standby: its `pg_last_wal_receive_lsn()`.
    Source(Box<ConnectionConfig>),
}

/// Where a confirmation's rebuilds must be before it is sent.
#[derive(Debug, Clone)]
pub(crate) struct DurableConfig {
    /// The primary, where rebuilds commit and the WAL position is read.
    pub(crate) primary: ConnectionConfig,
    /// Whose flush a confirmation waits for.
    pub(crate) standbys: Standbys,
}

/// The slot names of a `synchronized_standby_slots` value (pure): comma-separated,
/// blanks around them dropped.
pub(crate) fn standby_slots(setting: &str) -> Vec<String> {
    setting
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Whether a position wanted when the primary's WAL was at `w` may be confirmed, given
/// what the standbys flushed (`None`: a standby's position is unknown, so no).
pub(crate) fn durable(w: u64, flushed: Option<u64>) -> bool {
    flushed.is_some_and(|f| f >= w)
}

/// The connections the watcher reads positions on.
pub(crate) struct Probe {
    primary: Pool,
    standbys: Standbys,
    source: Option<Pool>,
}

impl Probe {
    pub(crate) fn new(config: &DurableConfig) -> Result<Probe, PgError> {
        let source = match &config.standbys {
            Standbys::Source(c) => Some(connect_pool(c, 1)?),
            Standbys::Synchronized => None,
        };
        Ok(Probe {
            primary: connect_pool(&config.primary, 1)?,
            standbys: config.standbys.clone(),
            source,
        })
    }

    /// The primary's WAL insert position now.
    pub(crate) async fn primary_wal(&self) -> Result<u64, PgError> {
        let c = client(&self.primary).await?;
        let row = c
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .map_err(|e| PgError::sql("cannot read the primary's WAL position", e))?;
        Ok(parse(row.get(0)))
    }

    /// What every standby that matters has flushed; `None` when one is unknown (a
    /// named slot missing or never used); `u64::MAX` when the primary names none.
    pub(crate) async fn flushed(&self) -> Result<Option<u64>, PgError> {
        match (&self.standbys, &self.source) {
            (Standbys::Synchronized, _) => {
                let c = client(&self.primary).await?;
                let setting: Option<String> = c
                    .query_one(
                        "SELECT current_setting('synchronized_standby_slots', true)",
                        &[],
                    )
                    .await
                    .map_err(|e| PgError::sql("cannot read synchronized_standby_slots", e))?
                    .get(0);
                let slots = standby_slots(setting.as_deref().unwrap_or_default());
                if slots.is_empty() {
                    return Ok(Some(u64::MAX));
                }
                let row = c
                    .query_one(
                        "SELECT count(restart_lsn) = cardinality($1::text[]), min(restart_lsn)::text \
                         FROM pg_replication_slots \
                         WHERE slot_type = 'physical' AND slot_name = ANY($1::text[])",
                        &[&slots],
                    )
                    .await
                    .map_err(|e| PgError::sql("cannot read the standbys' slots", e))?;
                let all: bool = row.get(0);
                Ok(all
                    .then(|| row.get::<_, Option<String>>(1).map(parse))
                    .flatten())
            }
            (Standbys::Source(_), Some(pool)) => {
                let c = client(pool).await?;
                let row = c
                    .query_one("SELECT pg_last_wal_receive_lsn()::text", &[])
                    .await
                    .map_err(|e| PgError::sql("cannot read the standby's WAL position", e))?;
                Ok(row.get::<_, Option<String>>(0).map(parse))
            }
            (Standbys::Source(_), None) => Ok(None),
        }
    }
}

fn parse(text: String) -> u64 {
    text.parse::<Lsn>().map_or(0, |l| l.0)
}

/// How often the standbys' positions are read while a confirmation waits.
pub(crate) const POLL: Duration = Duration::from_millis(20);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_names_slots() {
        assert_eq!(standby_slots(" a, \"b\" ,,c"), ["a", "b", "c"]);
        assert!(standby_slots("").is_empty());
    }

    #[test]
    fn a_position_is_durable_once_every_standby_flushed_past_the_rebuilds() {
        assert!(!durable(100, None), "an unknown standby holds it");
        assert!(!durable(100, Some(99)));
        assert!(durable(100, Some(100)));
    }
}
