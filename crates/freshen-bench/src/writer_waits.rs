//! What the writers' backends — and freshen's — were doing while the load ran: running,
//! waiting for their client, or waiting inside the server and on what
//! (`pg_stat_activity`'s `wait_event_type:wait_event`), sampled every few milliseconds.
//!
//! On a machine with a fast disk the durable write-tax runs showed the writers' TPS
//! falling with freshen running while the two cores still had room. CPU times cannot say
//! what a backend waited for; PostgreSQL's wait events can. Sampling costs one small
//! query per tick on the sampler's own backend, whose pid the caller gets so that it can
//! take that backend's CPU out of the run's.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;

use crate::workload::{connect, thread_cpu};

/// How often the writers' states are read.
const TICK: Duration = Duration::from_millis(5);

/// What the writers' backends were seen doing, one count per backend per sample.
#[derive(Debug, Clone, Default)]
pub(crate) struct Waits {
    seen: BTreeMap<String, u64>,
}

impl Waits {
    /// Counts `n` backends seen in `state`.
    fn add(&mut self, state: &str, n: u64) {
        *self.seen.entry(state.to_string()).or_default() += n;
    }

    /// Adds another run's counts to these.
    pub(crate) fn merge(&mut self, other: &Waits) {
        for (state, n) in &other.seen {
            self.add(state, *n);
        }
    }

    /// The `k` most frequent states with their share of all observations, most frequent
    /// first, e.g. `running 61%, IO:WALSync 22%, client 14%`.
    pub(crate) fn top(&self, k: usize) -> String {
        let all: u64 = self.seen.values().sum();
        if all == 0 {
            return "–".into();
        }
        let mut states: Vec<(&String, &u64)> = self.seen.iter().collect();
        states.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        states
            .into_iter()
            .take(k)
            .map(|(state, n)| format!("{state} {:.0}%", *n as f64 * 100.0 / all as f64))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What each group of backends was seen doing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    /// pgbench's backends: the writers.
    pub(crate) writers: Waits,
    /// freshen's pool backends: the rebuilds (empty without freshen).
    pub(crate) rebuilds: Waits,
}

/// A running sampler of the writers' backends (`application_name` pgbench's) and of
/// freshen's pool backends (theirs start with "freshen").
///
/// It runs on a thread of its own with its own runtime, so that the CPU it spends in this
/// process — which also hosts freshen — is known and can be taken out of the run's.
pub(crate) struct Sampler {
    stop: watch::Sender<bool>,
    thread: std::thread::JoinHandle<anyhow::Result<(Seen, Duration)>>,
    /// The sampler's own backend.
    pub(crate) pid: u32,
}

/// What a sampler saw, and what it cost this process.
pub(crate) struct Sampled {
    pub(crate) seen: Seen,
    /// CPU of the sampler's thread over its whole life.
    pub(crate) own_cpu: Duration,
}

/// The state of each writer's or freshen backend: `client` (idle between statements:
/// until the client sends the next and the backend gets a CPU to read it), `running`
/// (active, no wait event: on a CPU or waiting for one), or the wait event; and whether
/// it is a writer's.
const STATES: &str = "SELECT application_name = 'pgbench', \
                             CASE WHEN state <> 'active' THEN 'client' \
                             WHEN wait_event IS NULL THEN 'running' \
                             ELSE wait_event_type || ':' || wait_event END, count(*) \
                      FROM pg_stat_activity \
                      WHERE backend_type = 'client backend' \
                        AND (application_name = 'pgbench' OR application_name LIKE 'freshen%') \
                      GROUP BY 1, 2";

impl Sampler {
    /// Connects and starts sampling.
    pub(crate) async fn start(url: &str) -> anyhow::Result<Sampler> {
        let url = url.to_string();
        let (stop, stopped) = watch::channel(false);
        let (pid_tx, pid_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("writer-waits".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let seen = rt.block_on(sample(&url, pid_tx, stopped));
                drop(rt);
                Ok((seen?, thread_cpu()))
            })?;
        let pid = pid_rx
            .await
            .map_err(|_| anyhow::anyhow!("the wait sampler could not connect"))?;
        Ok(Sampler { stop, thread, pid })
    }

    /// Stops sampling and returns what was seen.
    pub(crate) async fn finish(self) -> anyhow::Result<Sampled> {
        let _ = self.stop.send(true);
        let thread = self.thread;
        let (seen, own_cpu) = tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the wait sampler panicked"))??;
        Ok(Sampled { seen, own_cpu })
    }
}

/// The sampling loop: reports its backend's pid, then reads the states every [`TICK`]
/// until told to stop.
async fn sample(
    url: &str,
    pid_tx: tokio::sync::oneshot::Sender<u32>,
    mut stopped: watch::Receiver<bool>,
) -> anyhow::Result<Seen> {
    let c = connect(url).await?;
    let pid = c
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get::<_, i32>(0) as u32;
    let statement = c.prepare(STATES).await?;
    let _ = pid_tx.send(pid);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = Seen::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.changed() => return Ok(seen),
        }
        for row in c.query(&statement, &[]).await? {
            let group = if row.get::<_, bool>(0) {
                &mut seen.writers
            } else {
                &mut seen.rebuilds
            };
            group.add(row.get(1), row.get::<_, i64>(2) as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_states_come_most_frequent_first_with_their_share() {
        let mut w = Waits::default();
        w.add("running", 6);
        w.add("IO:WALSync", 3);
        w.add("client", 1);
        let mut more = Waits::default();
        more.add("client", 2);
        more.add("Lock:transactionid", 1);
        w.merge(&more);
        assert_eq!(w.top(3), "running 46%, IO:WALSync 23%, client 23%");
        assert_eq!(Waits::default().top(3), "–");
    }
}
