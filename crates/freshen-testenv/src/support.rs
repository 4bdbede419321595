//! Helpers every throwaway server needs: free ports, the OS user to run as, owned
//! temporary directories, polling with a deadline, running helper commands.

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::TestEnvError;

/// A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it). Servers that
/// fail to bind it are retried on another by their starters.
pub fn free_port() -> Result<u16, TestEnvError> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| TestEnvError::io("binding a probe socket on 127.0.0.1", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| TestEnvError::io("reading the probe socket's port", e))?
        .port();
    Ok(port)
}

/// Polls `check` every few milliseconds until it returns `Some`, or `None` once
/// `timeout` has passed.
pub fn wait_for<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// The OS account a server process runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// User name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Whether this differs from the test process's own user (so files must be chowned
    /// and processes started with the id switched).
    pub switch: bool,
}

impl RunAs {
    /// The user servers run as: the test process's own user, or — when the tests run
    /// as root, which PostgreSQL refuses — `$FRESHEN_TESTENV_USER` or `postgres`.
    pub fn for_servers() -> Result<RunAs, TestEnvError> {
        let euid = rustix::process::geteuid().as_raw();
        if euid != 0 {
            return Ok(RunAs {
                name: std::env::var("USER").unwrap_or_else(|_| euid.to_string()),
                uid: euid,
                gid: rustix::process::getegid().as_raw(),
                switch: false,
            });
        }
        let name = std::env::var("FRESHEN_TESTENV_USER").unwrap_or_else(|_| "postgres".into());
        let (uid, gid) = lookup_user(&name)?
            .ok_or_else(|| TestEnvError::NoUnprivilegedUser { user: name.clone() })?;
        if uid == 0 {
            return Err(TestEnvError::NoUnprivilegedUser { user: name });
        }
        Ok(RunAs {
            name,
            uid,
            gid,
            switch: true,
        })
    }

    /// Hands `path` (not recursively) to this user.
    pub fn own(&self, path: &Path) -> Result<(), TestEnvError> {
        if self.switch {
            std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
                .map_err(|e| TestEnvError::io(format!("chown {}", path.display()), e))?;
        }
        Ok(())
    }

    /// A command that runs as this user.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        if self.switch {
            use std::os::unix::process::CommandExt;
            // std drops root's supplementary groups when it switches the uid.
            cmd.uid(self.uid).gid(self.gid);
            // Tools such as initdb look at HOME and chdir-relative paths.
            cmd.env("HOME", "/tmp").current_dir("/tmp");
        }
        cmd
    }
}

/// `(uid, gid)` of `name` from /etc/passwd.
fn lookup_user(name: &str) -> Result<Option<(u32, u32)>, TestEnvError> {
    let passwd = fs::read_to_string("/etc/passwd")
        .map_err(|e| TestEnvError::io("reading /etc/passwd", e))?;
    Ok(passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        let (user, _pw, uid, gid) = (f.next()?, f.next()?, f.next()?, f.next()?);
        (user == name).then(|| Some((uid.parse().ok()?, gid.parse().ok()?)))?
    }))
}

/// A fresh private temporary directory (mode 0700) owned by `owner`, removed on drop.
pub fn private_dir(prefix: &str, owner: &RunAs) -> Result<tempfile::TempDir, TestEnvError> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| TestEnvError::io("creating a temporary directory", e))?;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700))
        .map_err(|e| TestEnvError::io("chmod of the temporary directory", e))?;
    owner.own(dir.path())?;
    Ok(dir)
}

/// Copies the tree `from` into the new directory `to`, keeping modes, giving every
/// entry to `owner`.
pub fn copy_tree(from: &Path, to: &Path, owner: &RunAs) -> Result<(), TestEnvError> {
    let meta =
        fs::metadata(from).map_err(|e| TestEnvError::io(format!("stat {}", from.display()), e))?;
    fs::create_dir(to).map_err(|e| TestEnvError::io(format!("mkdir {}", to.display()), e))?;
    fs::set_permissions(to, meta.permissions())
        .map_err(|e| TestEnvError::io(format!("chmod {}", to.display()), e))?;
    owner.own(to)?;
    let entries = fs::read_dir(from)
        .map_err(|e| TestEnvError::io(format!("reading {}", from.display()), e))?;
    for entry in entries {
        let entry =
            entry.map_err(|e| TestEnvError::io(format!("reading {}", from.display()), e))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let kind = entry
            .file_type()
            .map_err(|e| TestEnvError::io(format!("stat {}", src.display()), e))?;
        if kind.is_dir() {
            copy_tree(&src, &dst, owner)?;
        } else if kind.is_file() {
            fs::copy(&src, &dst).map_err(|e| {
                TestEnvError::io(format!("copy {} to {}", src.display(), dst.display()), e)
            })?;
            owner.own(&dst)?;
        }
    }
    Ok(())
}

/// Runs `cmd` to completion; a non-zero exit is an error carrying its output.
pub fn run(cmd: &mut Command) -> Result<String, TestEnvError> {
    let line = format!("{cmd:?}");
    let out = cmd
        .output()
        .map_err(|e| TestEnvError::io(format!("running {line}"), e))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(TestEnvError::Command {
            command: line,
            output: format!(
                "{}\n{}{}",
                out.status,
                stdout,
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }
}

/// The last `lines` lines of the file at `path` (empty when unreadable).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Finds `program` on `PATH`.
pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}
