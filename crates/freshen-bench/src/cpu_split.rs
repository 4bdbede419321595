//! Where a run's CPU went, by the role of each process: the walsender decoding for a
//! reader, the backends running freshen's rebuilds, the reader's own process, and the
//! rest (the writers' backends, pgbench, the server's background processes).
//!
//! `tree_cpu` gives one total per run; issue 18 asks *whose* share misses the goal. A
//! sampling profiler would answer per function but perturbs the run; per-process CPU
//! times from `/proc` cost nothing and are exact. The server's processes are told apart
//! by `pg_stat_activity` (`backend_type`, and the `application_name`s freshen sets, all starting with "freshen"), read
//! at the start of the load and at its end: a backend's CPU counts from the first sample
//! it appears in (all of it when it started in between). A backend that exits in between
//! falls into "rest" — the writers' backends, which is where it belongs: freshen's pool
//! and the walsender live for the whole run.

use std::collections::HashMap;
use std::time::Duration;

use tokio_postgres::Client;

use crate::workload::process_cpu;

/// A server process's part in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Decodes WAL for a replication reader (freshen's or `pg_recvlogical`'s).
    Walsender,
    /// A backend of freshen's pool: rebuilds, visibility checks, sweeps.
    Rebuilds,
}

/// The server's walsenders and freshen's backends with the CPU each had spent, at one
/// moment.
pub(crate) struct Sample {
    backends: HashMap<u32, (Role, Duration)>,
    /// The reader's own process: freshen (this process) or `pg_recvlogical`.
    reader: Duration,
}

/// CPU of a run, split by role.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Split {
    pub(crate) walsender: Duration,
    pub(crate) rebuilds: Duration,
    pub(crate) reader: Duration,
}

impl Sample {
    /// Reads the roles from `pg_stat_activity` and each one's CPU from `/proc`; `reader`
    /// is the pid of the process reading the slot, if any.
    pub(crate) async fn take(c: &Client, reader: Option<u32>) -> anyhow::Result<Sample> {
        let rows = c
            .query(
                "SELECT pid, backend_type = 'walsender' FROM pg_stat_activity \
                 WHERE backend_type = 'walsender' \
                    OR (application_name LIKE 'freshen%' AND pid <> pg_backend_pid())",
                &[],
            )
            .await?;
        let backends = rows
            .iter()
            .map(|r| {
                let pid = r.get::<_, i32>(0) as u32;
                let role = if r.get::<_, bool>(1) {
                    Role::Walsender
                } else {
                    Role::Rebuilds
                };
                (pid, (role, process_cpu(pid)))
            })
            .collect();
        Ok(Sample {
            backends,
            reader: reader.map_or(Duration::ZERO, process_cpu),
        })
    }

    /// What each role spent from `earlier` to this sample.
    pub(crate) fn since(&self, earlier: &Sample) -> Split {
        let mut split = Split {
            reader: self.reader.saturating_sub(earlier.reader),
            ..Split::default()
        };
        for (pid, (role, cpu)) in &self.backends {
            let before = earlier
                .backends
                .get(pid)
                .map_or(Duration::ZERO, |(_, c)| *c);
            let spent = cpu.saturating_sub(before);
            match role {
                Role::Walsender => split.walsender += spent,
                Role::Rebuilds => split.rebuilds += spent,
            }
        }
        split
    }
}

impl Split {
    /// Each part per committed transaction.
    pub(crate) fn per(self, tx: u64) -> Split {
        let n = u32::try_from(tx.max(1)).unwrap_or(u32::MAX);
        Split {
            walsender: self.walsender / n,
            rebuilds: self.rebuilds / n,
            reader: self.reader / n,
        }
    }

    /// The parts' sum.
    pub(crate) fn total(self) -> Duration {
        self.walsender + self.rebuilds + self.reader
    }
}
