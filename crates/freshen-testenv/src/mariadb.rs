//! `MariaDbServer`: a throwaway MariaDB server with a row-based binlog.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use rustix::process::{Pid, Signal};

use crate::support::{self, RunAs};
use crate::{Shutdown, TestEnvError};

/// The Debian package that provides the server binaries.
const PACKAGE: &str = "mariadb-server";

/// Settings every test server runs with: the binlog freshen reads (row-based, full row
/// images and metadata, CRC32 checksums, GTIDs), durability off (a test server's data
/// is thrown away), small memory.
const BASE_SETTINGS: &[(&str, &str)] = &[
    ("server-id", "1"),
    ("log-bin", "binlog"),
    ("binlog-format", "ROW"),
    ("binlog-row-image", "FULL"),
    ("binlog-row-metadata", "FULL"),
    ("binlog-checksum", "CRC32"),
    ("innodb-flush-log-at-trx-commit", "0"),
    ("sync-binlog", "0"),
    ("innodb-buffer-pool-size", "128M"),
    ("innodb-log-file-size", "64M"),
    ("max-connections", "200"),
    ("skip-name-resolve", "ON"),
    ("character-set-server", "utf8mb4"),
    ("collation-server", "utf8mb4_general_ci"),
    ("default-time-zone", "+00:00"),
    ("max-allowed-packet", "64M"),
];

/// Where the server binaries are.
#[derive(Debug, Clone)]
struct Binaries {
    server: PathBuf,
    install_db: PathBuf,
    client: PathBuf,
}

impl Binaries {
    fn find() -> Result<Binaries, TestEnvError> {
        let dirs = ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"];
        let find = |names: &[&str]| {
            names.iter().find_map(|n| {
                support::on_path(n).or_else(|| {
                    dirs.iter()
                        .map(|d| PathBuf::from(d).join(n))
                        .find(|p| p.is_file())
                })
            })
        };
        let server = find(&["mariadbd", "mysqld"]);
        let install_db = find(&["mariadb-install-db", "mysql_install_db"]);
        let client = find(&["mariadb", "mysql"]);
        match (server, install_db, client) {
            (Some(server), Some(install_db), Some(client)) => Ok(Binaries {
                server,
                install_db,
                client,
            }),
            _ => Err(TestEnvError::MissingBinaries {
                what: "MariaDB server binaries (mariadbd, mariadb-install-db, mariadb)".into(),
                searched: dirs.iter().map(PathBuf::from).collect(),
                package: PACKAGE,
            }),
        }
    }
}

/// A freshly installed data directory shared by every server of this process and later
/// ones (mariadb-install-db takes seconds; a copy takes a fraction). Never modified.
fn template(bins: &Binaries, run_as: &RunAs) -> Result<PathBuf, TestEnvError> {
    static TEMPLATE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| make_template(bins, run_as).map_err(|e| e.to_string()))
        .clone()
        .map_err(|reason| TestEnvError::StartFailed {
            reason: format!("could not prepare the MariaDB data template: {reason}"),
            log: String::new(),
        })
}

fn make_template(bins: &Binaries, run_as: &RunAs) -> Result<PathBuf, TestEnvError> {
    let cache = std::env::temp_dir().join("freshen-testenv");
    fs::create_dir_all(&cache).map_err(|e| TestEnvError::io("creating the template cache", e))?;
    let path = cache.join(format!("mariadb-{}", run_as.uid));
    if path.join("mysql").is_dir() && path.join("freshen-template-done").is_file() {
        return Ok(path);
    }
    let staging = cache.join(format!(
        "mariadb-{}.staging-{}",
        run_as.uid,
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir(&staging).map_err(|e| TestEnvError::io("creating the staging directory", e))?;
    run_as.own(&staging)?;
    let data = staging.join("data");
    let result = support::run(
        run_as
            .command(&bins.install_db)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
                "--innodb-log-file-size=64M",
            ]),
    )
    .and_then(|_| {
        let done = data.join("freshen-template-done");
        fs::write(&done, b"").map_err(|e| TestEnvError::io("marking the template complete", e))?;
        run_as.own(&done)
    });
    if let Err(e) = result {
        let _ = fs::remove_dir_all(&staging);
        return Err(e);
    }
    match fs::rename(&data, &path) {
        Ok(()) => {}
        Err(_) if path.join("freshen-template-done").is_file() => {} // another process won
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            return Err(TestEnvError::io("installing the MariaDB template", e));
        }
    }
    let _ = fs::remove_dir_all(&staging);
    Ok(path)
}

/// Options for a [`MariaDbServer`]; from [`MariaDbServer::builder`].
#[derive(Debug, Clone, Default)]
pub struct MariaDbServerBuilder {
    settings: Vec<(String, String)>,
}

impl MariaDbServerBuilder {
    /// A server option (`--name=value`), applied after the defaults (which it
    /// overrides: `binlog-row-metadata=MINIMAL` for a test of a misconfigured server).
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Starts the server.
    pub fn start(self) -> Result<MariaDbServer, TestEnvError> {
        MariaDbServer::launch(self)
    }
}

/// A throwaway MariaDB server: its own data directory (copied from a template made by
/// `mariadb-install-db`), a free port on 127.0.0.1, its own socket, the binlog freshen
/// reads, run as an unprivileged user. The `root` user has no password over the
/// socket and TCP. Dropping it kills it and removes the directory.
pub struct MariaDbServer {
    bins: Binaries,
    run_as: RunAs,
    dir: tempfile::TempDir,
    port: u16,
    options: MariaDbServerBuilder,
    child: Option<Child>,
}

impl fmt::Debug for MariaDbServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MariaDbServer")
            .field("dir", &self.dir.path())
            .field("port", &self.port)
            .field("running", &self.child.is_some())
            .finish_non_exhaustive()
    }
}

impl MariaDbServer {
    /// Starts a server with the default options.
    pub fn start() -> Result<MariaDbServer, TestEnvError> {
        MariaDbServer::builder().start()
    }

    /// Options for a server.
    pub fn builder() -> MariaDbServerBuilder {
        MariaDbServerBuilder::default()
    }

    fn launch(options: MariaDbServerBuilder) -> Result<MariaDbServer, TestEnvError> {
        let bins = Binaries::find()?;
        let run_as = RunAs::for_servers()?;
        let template = template(&bins, &run_as)?;
        let dir = support::private_dir("freshen-mariadb-", &run_as)?;
        support::copy_tree(&template, &dir.path().join("data"), &run_as)?;
        let mut server = MariaDbServer {
            bins,
            run_as,
            dir,
            port: 0,
            options,
            child: None,
        };
        let mut last = None;
        for _ in 0..5 {
            server.port = support::free_port()?;
            match server.spawn() {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) => {
                    let log = server.log();
                    let port_taken = log.contains("Address already in use");
                    last = Some(e);
                    if !port_taken {
                        break;
                    }
                }
            }
        }
        if let Some(e) = last {
            return Err(e);
        }
        // TCP connections come from 127.0.0.1, a host the installed root@localhost does
        // not cover once names are not resolved.
        server.sql(
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; \
             GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;",
        )?;
        Ok(server)
    }

    fn data_path(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// The unix socket's path.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("mysqld.sock")
    }

    fn spawn(&mut self) -> Result<(), TestEnvError> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| TestEnvError::io("opening the server log", e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| TestEnvError::io("opening the server log", e))?;
        self.run_as.own(&self.log_path())?;
        let mut cmd = self.run_as.command(&self.bins.server);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", self.data_path().display()))
            .arg(format!("--socket={}", self.socket().display()))
            .arg(format!(
                "--pid-file={}",
                self.dir.path().join("mysqld.pid").display()
            ))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--log-error={}", self.log_path().display()));
        for (k, v) in BASE_SETTINGS {
            cmd.arg(format!("--{k}={v}"));
        }
        for (k, v) in &self.options.settings {
            cmd.arg(format!("--{k}={v}"));
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2))
            .spawn()
            .map_err(|e| TestEnvError::io("starting mariadbd", e))?;
        let ready = support::wait_for(Duration::from_secs(60), || {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(Err(format!("mariadbd exited with {status}")));
            }
            let ping = self.client().arg("-e").arg("SELECT 1").output().ok()?;
            ping.status.success().then_some(Ok(()))
        });
        match ready {
            Some(Ok(())) => {
                self.child = Some(child);
                Ok(())
            }
            other => {
                let _ = child.kill();
                let _ = child.wait();
                Err(TestEnvError::StartFailed {
                    reason: match other {
                        Some(Err(e)) => e,
                        _ => "not ready within 60 s".into(),
                    },
                    log: support::tail(&self.log_path(), 30),
                })
            }
        }
    }

    fn client(&self) -> Command {
        let mut cmd = Command::new(&self.bins.client);
        cmd.arg("--no-defaults")
            .arg("-uroot")
            .arg(format!("--socket={}", self.socket().display()))
            .args(["--batch", "--skip-column-names"]);
        cmd
    }

    /// Stops the server: `Fast` is a clean shutdown (SIGTERM), `Immediate` a crash
    /// (SIGKILL). [`start_again`](Self::start_again) brings it back.
    pub fn stop_with(&mut self, how: Shutdown) -> Result<(), TestEnvError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let signal = match how {
            Shutdown::Fast => Signal::TERM,
            Shutdown::Immediate => Signal::KILL,
        };
        if let Some(pid) = Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process(pid, signal);
        }
        let exited = support::wait_for(Duration::from_secs(60), || {
            child.try_wait().ok().flatten().map(|_| ())
        });
        if exited.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(TestEnvError::StartFailed {
                reason: "the server did not stop within 60 s and was killed".into(),
                log: support::tail(&self.log_path(), 30),
            });
        }
        Ok(())
    }

    /// Stops the server cleanly.
    pub fn stop(&mut self) -> Result<(), TestEnvError> {
        self.stop_with(Shutdown::Fast)
    }

    /// Starts a stopped server again, on the same port and directory.
    pub fn start_again(&mut self) -> Result<(), TestEnvError> {
        if self.child.is_some() {
            return Ok(());
        }
        self.spawn()
    }

    /// Stops (cleanly) and starts the server again.
    pub fn restart(&mut self) -> Result<(), TestEnvError> {
        self.stop()?;
        self.start_again()
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:PORT/database`.
    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    /// The `mariadb-binlog` program beside the server (for comparisons in benchmarks).
    pub fn binlog_tool(&self) -> Option<PathBuf> {
        let dir = self.bins.client.parent()?;
        ["mariadb-binlog", "mysqlbinlog"]
            .iter()
            .map(|n| dir.join(n))
            .find(|p| p.is_file())
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Runs SQL through the `mariadb` client over the socket as root and returns its
    /// tab-separated output without column names, trimmed. Stops at the first error.
    pub fn sql(&self, sql: &str) -> Result<String, TestEnvError> {
        let out = support::run(self.client().arg("-e").arg(sql))?;
        Ok(out.trim().to_string())
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        let _ = self.stop_with(Shutdown::Immediate);
    }
}
