//! `PulsarServer`: a throwaway Pulsar-protocol broker (pulsar-lite).

use std::path::Path;

use crate::TestEnvError;
use crate::broker::{Binary, Process};

const PULSAR_LITE: Binary = Binary {
    what: "the pulsar-lite binary (a Pulsar-protocol broker)",
    package: "pulsar-lite==0.2.0",
    in_site_packages: "pulsar_lite/bin/pulsar-lite",
    env: "FRESHEN_PULSAR_LITE_BIN",
};

/// Its configuration: the metrics endpoint is off (it would bind 0.0.0.0:8080, on every
/// interface and on one fixed port for every broker).
const CONFIG: &str = "[metrics]\nenabled = false\n";

/// A throwaway pulsar-lite 0.2.0 broker on a free 127.0.0.1 port with its RocksDB in a
/// temporary directory; dropping it kills it and removes the directory. Topics are
/// created on first use (non-partitioned).
///
/// ```no_run
/// let pulsar = freshen_testenv::PulsarServer::start().expect("a Pulsar broker for tests");
/// println!("service URL {}", pulsar.url());
/// ```
#[derive(Debug)]
pub struct PulsarServer {
    process: Process,
}

impl PulsarServer {
    /// Starts a broker.
    pub fn start() -> Result<PulsarServer, TestEnvError> {
        let bin = PULSAR_LITE.find()?;
        let process = Process::start("pulsar-lite", &bin, |dir: &Path, port| {
            let config = dir.join("pulsar-lite.toml");
            // A failed write shows up as the broker's own start error, with the log.
            let _ = std::fs::write(&config, CONFIG);
            vec![
                "--config".into(),
                config.display().to_string(),
                "--addr".into(),
                format!("127.0.0.1:{port}"),
                "--db-path".into(),
                dir.join("db").display().to_string(),
                "--log-level".into(),
                "warn".into(),
            ]
        })?;
        Ok(PulsarServer { process })
    }

    /// The service URL for clients: `pulsar://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("pulsar://127.0.0.1:{}", self.process.port())
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.process.port()
    }

    /// The broker's temporary directory (its database and its log).
    pub fn dir(&self) -> &Path {
        self.process.dir()
    }

    /// The tail of the broker's output, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::support::tail(&self.process.log_path(), lines)
    }

    /// Whether the broker is still running.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// Kills the broker at once (SIGKILL).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Kills the broker and starts it again on the same port and database: topics,
    /// messages and subscriptions survive (what it had not written to disk may not).
    pub fn restart(&mut self) -> Result<(), TestEnvError> {
        self.process.restart()
    }
}
