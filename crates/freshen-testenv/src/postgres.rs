//! `PgServer`: a throwaway PostgreSQL cluster.

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use rustix::process::{Pid, Signal};

use crate::TestEnvError;
use crate::support::{self, RunAs};

mod standby;

/// The Debian package that provides the server binaries.
const PACKAGE: &str = "postgresql-15";

/// Settings every test server runs with: logical decoding on, durability off (a test
/// server's data is thrown away), room for many slots and walsenders.
const BASE_SETTINGS: &[(&str, &str)] = &[
    ("wal_level", "logical"),
    ("max_replication_slots", "32"),
    ("max_wal_senders", "32"),
    ("max_connections", "100"),
    ("fsync", "off"),
    ("full_page_writes", "off"),
    ("autovacuum", "off"),
    ("shared_buffers", "64MB"),
    ("max_wal_size", "2GB"),
    ("log_min_messages", "warning"),
    ("log_line_prefix", "%m [%p] "),
    ("datestyle", "iso, mdy"),
    ("timezone", "UTC"),
];

/// How a running server is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Disconnects clients, writes a checkpoint and exits (`SIGINT`): a clean restart.
    Fast,
    /// Exits at once without a checkpoint (`SIGQUIT`): crash recovery on the next start.
    Immediate,
}

/// Where the version matrix's server builds are unpacked by `scripts/test-deps-postgres`
/// (one directory per major version, `MAJOR/bin/postgres`), unless `FRESHEN_PG_DIST`
/// says otherwise.
const DIST_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/postgresql");

/// The script that installs a major version that is missing.
const DIST_SCRIPT: &str = "scripts/test-deps-postgres";

/// Where the server binaries are and which major version they are.
#[derive(Debug, Clone)]
struct Binaries {
    dir: PathBuf,
    major: u32,
}

impl Binaries {
    /// The binaries a server is started from: those of `version` when a test asks for a
    /// major version, else `$FRESHEN_PG_BIN` (a directory), else those of
    /// `$FRESHEN_PG_VERSION` (a major version: how CI runs the matrix lane), else the
    /// `postgres` on `PATH` or the newest under /usr/lib/postgresql.
    fn find(version: Option<u32>) -> Result<Binaries, TestEnvError> {
        let version = match version {
            Some(v) => Some(v),
            None if std::env::var_os("FRESHEN_PG_BIN").is_some() => None,
            None => requested_version()?,
        };
        if let Some(major) = version {
            return Binaries::of_version(major);
        }
        let mut searched = Vec::new();
        let mut candidates = Vec::new();
        if let Some(dir) = std::env::var_os("FRESHEN_PG_BIN") {
            candidates.push(PathBuf::from(dir));
        }
        if let Some(p) = support::on_path("postgres") {
            // /usr/local/bin/postgres may be a link into the versioned directory that
            // also holds initdb, psql and pg_recvlogical.
            let real = fs::canonicalize(&p).unwrap_or(p);
            if let Some(dir) = real.parent() {
                candidates.push(dir.to_path_buf());
            }
        }
        candidates.extend(debian_dirs().into_iter().rev().map(|(_, d)| d));
        for dir in candidates {
            searched.push(dir.clone());
            if let Some(found) = Binaries::at(&dir)? {
                return Ok(found);
            }
        }
        searched.push(PathBuf::from("/usr/lib/postgresql/*/bin"));
        Err(TestEnvError::MissingBinaries {
            what: "PostgreSQL server binaries (postgres, initdb)".into(),
            searched,
            package: PACKAGE,
        })
    }

    /// The binaries of one major version: Debian's (/usr/lib/postgresql/MAJOR/bin) or the
    /// matrix's (`FRESHEN_PG_DIST` or target/postgresql, MAJOR/bin).
    fn of_version(major: u32) -> Result<Binaries, TestEnvError> {
        let mut searched = Vec::new();
        let dist = std::env::var_os("FRESHEN_PG_DIST")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DIST_DIR));
        let debian = debian_dirs()
            .into_iter()
            .filter(|(v, _)| *v == major)
            .map(|(_, d)| d);
        for dir in debian.chain([dist.join(major.to_string()).join("bin")]) {
            searched.push(dir.clone());
            match Binaries::at(&dir)? {
                Some(found) if found.major == major => return Ok(found),
                Some(found) => {
                    return Err(TestEnvError::Command {
                        command: format!("{} --version", dir.join("postgres").display()),
                        output: format!("PostgreSQL {} where {major} was asked for", found.major),
                    });
                }
                None => {}
            }
        }
        Err(TestEnvError::MissingVersion {
            major,
            searched,
            script: DIST_SCRIPT,
        })
    }

    /// The binaries in `dir`, if it holds a server.
    fn at(dir: &Path) -> Result<Option<Binaries>, TestEnvError> {
        if !(dir.join("postgres").is_file() && dir.join("initdb").is_file()) {
            return Ok(None);
        }
        let out = support::run(Command::new(dir.join("postgres")).arg("--version"))?;
        let major = parse_major(&out).ok_or_else(|| TestEnvError::Command {
            command: format!("{} --version", dir.join("postgres").display()),
            output: format!("unexpected version text: {out}"),
        })?;
        Ok(Some(Binaries {
            dir: dir.to_path_buf(),
            major,
        }))
    }

    fn bin(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A client tool (`psql`, `pg_recvlogical`, `pgbench`, …): beside the server when it
    /// is there, else the system's (the matrix's builds ship no client tools; the
    /// newest installed client speaks to every older server).
    fn tool(&self, name: &str) -> PathBuf {
        let beside = self.dir.join(name);
        if beside.is_file() {
            return beside;
        }
        debian_dirs()
            .into_iter()
            .rev()
            .map(|(_, d)| d.join(name))
            .find(|p| p.is_file())
            .or_else(|| support::on_path(name))
            .unwrap_or(beside)
    }
}

/// `FRESHEN_PG_VERSION`, the major version every server of the run starts with.
fn requested_version() -> Result<Option<u32>, TestEnvError> {
    match std::env::var("FRESHEN_PG_VERSION") {
        Err(_) => Ok(None),
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| TestEnvError::Command {
                command: "FRESHEN_PG_VERSION".into(),
                output: format!("`{v}` is not a major version (e.g. 17)"),
            }),
    }
}

/// Debian's server directories, /usr/lib/postgresql/MAJOR/bin, oldest first.
fn debian_dirs() -> Vec<(u32, PathBuf)> {
    let mut versioned: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                    Some((v, e.path().join("bin")))
                })
                .collect()
        })
        .unwrap_or_default();
    versioned.sort();
    versioned
}

/// `15` from `postgres (PostgreSQL) 15.8 (Debian 15.8-1)`.
fn parse_major(version: &str) -> Option<u32> {
    let v = version.split(')').nth(1)?.split_whitespace().next()?;
    v.split(['.', 'b', 'r']).next()?.parse().ok()
}

/// A freshly initialised cluster directory shared by every server of this process and
/// later ones (initdb takes most of a second; a copy takes a tenth). Never modified.
/// One per major version: a process may start servers of several (a benchmark run).
fn template(bins: &Binaries, run_as: &RunAs) -> Result<PathBuf, TestEnvError> {
    static TEMPLATES: OnceLock<Mutex<HashMap<u32, Result<PathBuf, String>>>> = OnceLock::new();
    let mut templates = TEMPLATES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    templates
        .entry(bins.major)
        .or_insert_with(|| make_template(bins, run_as).map_err(|e| e.to_string()))
        .clone()
        .map_err(|reason| TestEnvError::StartFailed {
            reason: format!("could not prepare the cluster template: {reason}"),
            log: String::new(),
        })
}

fn make_template(bins: &Binaries, run_as: &RunAs) -> Result<PathBuf, TestEnvError> {
    let cache = std::env::temp_dir().join("freshen-testenv");
    fs::create_dir_all(&cache).map_err(|e| TestEnvError::io("creating the template cache", e))?;
    let _ = fs::set_permissions(&cache, fs::Permissions::from_mode(0o755));
    let path = cache.join(format!("pg{}-{}", bins.major, run_as.uid));
    if path.join("PG_VERSION").is_file() {
        return Ok(path);
    }
    // initdb into a staging directory, then rename: concurrent test processes never see
    // a half-written template.
    let staging = cache.join(format!(
        "pg{}-{}.staging-{}",
        bins.major,
        run_as.uid,
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir(&staging).map_err(|e| TestEnvError::io("creating the staging directory", e))?;
    run_as.own(&staging)?;
    let data = staging.join("data");
    if let Err(e) = initdb(bins, run_as, &data) {
        let _ = fs::remove_dir_all(&staging);
        return Err(e);
    }
    match fs::rename(&data, &path) {
        Ok(()) => {}
        Err(_) if path.join("PG_VERSION").is_file() => {} // another process won the race
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            return Err(TestEnvError::io("installing the cluster template", e));
        }
    }
    let _ = fs::remove_dir_all(&staging);
    Ok(path)
}

fn initdb(bins: &Binaries, run_as: &RunAs, data: &Path) -> Result<(), TestEnvError> {
    support::run(
        run_as
            .command(bins.bin("initdb"))
            .arg("-D")
            .arg(data)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ]),
    )
    .map(|_| ())
}

/// Options for a [`PgServer`]; from [`PgServer::builder`].
#[derive(Clone, Default)]
pub struct PgServerBuilder {
    settings: Vec<(String, String)>,
    password: Option<String>,
    tls: bool,
    own_cluster: bool,
    version: Option<u32>,
    detached: bool,
}

impl fmt::Debug for PgServerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgServerBuilder")
            .field("settings", &self.settings)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("version", &self.version)
            .finish()
    }
}

impl PgServerBuilder {
    /// A server setting (`-c name=value`), applied after the defaults.
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Require this password (SCRAM-SHA-256) for the superuser over TCP. Without it TCP
    /// connections are trusted.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Serve TLS too, with a certificate for `localhost` and `127.0.0.1` signed by a
    /// throwaway CA ([`PgServer::ca_cert`]). Needs the `openssl` command.
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    /// Run initdb for this server instead of copying the shared template (slower, about
    /// a second): its system identifier then differs from every other server's, as a
    /// separate production cluster's does. Servers copied from the template share one.
    pub fn own_cluster(mut self, on: bool) -> Self {
        self.own_cluster = on;
        self
    }

    /// Start the server in a process group of its own, so that a terminal's Ctrl-C
    /// (sent to this process's group) does not stop it: for a server meant to outlive
    /// this process (`freshen demo --keep`). By default it shares the group and a
    /// Ctrl-C stops both.
    pub fn detached(mut self, on: bool) -> Self {
        self.detached = on;
        self
    }

    /// Start this major version (`16`): Debian's build when installed, else the version
    /// matrix's (`scripts/test-deps-postgres`). Without it, `$FRESHEN_PG_BIN` or
    /// `$FRESHEN_PG_VERSION` decide, else the newest installed.
    pub fn version(mut self, major: u32) -> Self {
        self.version = Some(major);
        self
    }

    /// Start the run's version (`$FRESHEN_PG_VERSION`, else the newest installed) when
    /// it is `major` or later, else `major`: for a test of what came with `major` (16:
    /// decoding on a standby; 17: failover slots) that runs in every lane of the matrix.
    pub fn at_least(self, major: u32) -> Self {
        let run = Binaries::find(None).map_or(major, |b| b.major);
        self.version(run.max(major))
    }

    /// The directory of the server binaries this builder would start, without starting
    /// one (e.g. to look for an extension installed beside them in `../lib`); fails as
    /// [`start`](Self::start) would when they are missing, naming what installs them.
    pub fn bin_dir(&self) -> Result<PathBuf, TestEnvError> {
        Ok(Binaries::find(self.version)?.dir)
    }

    /// Starts the server.
    pub fn start(self) -> Result<PgServer, TestEnvError> {
        PgServer::launch(self)
    }
}

/// A throwaway PostgreSQL cluster: its own directory, a free port on 127.0.0.1, its own
/// socket directory, run as an unprivileged user. Dropping it stops it (immediately)
/// and removes the directory.
pub struct PgServer {
    bins: Binaries,
    run_as: RunAs,
    dir: tempfile::TempDir,
    port: u16,
    options: PgServerBuilder,
    child: Option<Child>,
    /// How many standbys of this server were started (names their slots).
    standbys: u32,
    /// A standby's physical slot on its primary.
    slot: Option<String>,
}

impl fmt::Debug for PgServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgServer")
            .field("dir", &self.dir.path())
            .field("port", &self.port)
            .field("major", &self.bins.major)
            .field("running", &self.child.is_some())
            .finish_non_exhaustive()
    }
}

impl PgServer {
    /// Starts a server with the default options.
    pub fn start() -> Result<PgServer, TestEnvError> {
        PgServer::builder().start()
    }

    /// Options for a server.
    pub fn builder() -> PgServerBuilder {
        PgServerBuilder::default()
    }

    /// The directory of the server binaries a server would be started from, without
    /// starting one (e.g. to look for an extension installed beside them in `../lib`).
    pub fn find_bin_dir() -> Result<PathBuf, TestEnvError> {
        PgServer::builder().bin_dir()
    }

    /// The major version a server started without [`PgServerBuilder::version`] runs
    /// (`$FRESHEN_PG_VERSION` in the matrix lane), without starting one: for a test that
    /// only applies from some version on to say so.
    pub fn find_major_version() -> Result<u32, TestEnvError> {
        Ok(Binaries::find(None)?.major)
    }

    fn launch(options: PgServerBuilder) -> Result<PgServer, TestEnvError> {
        let bins = Binaries::find(options.version)?;
        let run_as = RunAs::for_servers()?;
        let dir = support::private_dir("freshen-pg-", &run_as)?;
        if options.own_cluster {
            initdb(&bins, &run_as, &dir.path().join("data"))?;
        } else {
            let template = template(&bins, &run_as)?;
            support::copy_tree(&template, &dir.path().join("data"), &run_as)?;
        }
        let sock = dir.path().join("s");
        fs::create_dir(&sock).map_err(|e| TestEnvError::io("creating the socket directory", e))?;
        run_as.own(&sock)?;
        let mut server = PgServer {
            bins,
            run_as,
            dir,
            port: 0,
            options,
            child: None,
            standbys: 0,
            slot: None,
        };
        server.write_hba(false)?;
        if server.options.tls {
            server.make_certificates()?;
        }
        server.spawn_on_free_port()?;
        if let Some(pw) = server.options.password.clone() {
            server.psql(&format!(
                "ALTER USER postgres PASSWORD '{}'",
                pw.replace('\'', "''")
            ))?;
            server.write_hba(true)?;
            server.psql("SELECT pg_reload_conf()")?;
        }
        Ok(server)
    }

    /// Starts the server on a free port, trying another when the one picked was taken
    /// in the meantime.
    fn spawn_on_free_port(&mut self) -> Result<(), TestEnvError> {
        let mut last = None;
        for _ in 0..5 {
            self.port = support::free_port()?;
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let log = fs::read_to_string(self.log_path()).unwrap_or_default();
                    let port_taken = log.contains("could not bind") || log.contains("in use");
                    last = Some(e);
                    if !port_taken {
                        break;
                    }
                }
            }
        }
        Err(last.expect("at least one attempt"))
    }

    fn data_path(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn write_hba(&self, password: bool) -> Result<(), TestEnvError> {
        let method = if password { "scram-sha-256" } else { "trust" };
        let hba = format!(
            "local all all trust\nlocal replication all trust\n\
             host all all 127.0.0.1/32 {method}\nhost replication all 127.0.0.1/32 {method}\n\
             host all all ::1/128 {method}\nhost replication all ::1/128 {method}\n"
        );
        let path = self.data_path().join("pg_hba.conf");
        fs::write(&path, hba).map_err(|e| TestEnvError::io("writing pg_hba.conf", e))?;
        self.run_as.own(&path)
    }

    fn make_certificates(&self) -> Result<(), TestEnvError> {
        let openssl = support::on_path("openssl").ok_or_else(|| TestEnvError::MissingBinaries {
            what: "the openssl command (for test certificates)".into(),
            searched: vec![PathBuf::from("$PATH")],
            package: "openssl",
        })?;
        let tls = self.dir.path().join("tls");
        fs::create_dir(&tls).map_err(|e| TestEnvError::io("creating the tls directory", e))?;
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        support::run(
            Command::new(&openssl)
                .current_dir(&tls)
                .args(["req", "-x509"])
                .args(ec)
                .args(["-keyout", "ca.key", "-out", "ca.crt", "-days", "3"])
                .args(["-subj", "/CN=freshen test CA"])
                .args(["-addext", "basicConstraints=critical,CA:TRUE"])
                .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]),
        )?;
        support::run(
            Command::new(&openssl)
                .current_dir(&tls)
                .arg("req")
                .args(ec)
                .args(["-keyout", "server.key", "-out", "server.csr"])
                .args(["-subj", "/CN=localhost"]),
        )?;
        fs::write(
            tls.join("ext.cnf"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .map_err(|e| TestEnvError::io("writing the certificate extensions", e))?;
        support::run(
            Command::new(&openssl)
                .current_dir(&tls)
                .args(["x509", "-req", "-in", "server.csr", "-CA", "ca.crt"])
                .args(["-CAkey", "ca.key", "-CAcreateserial", "-out", "server.crt"])
                .args(["-days", "3", "-extfile", "ext.cnf"]),
        )?;
        for f in ["server.key", "server.crt"] {
            let p = tls.join(f);
            fs::set_permissions(&p, fs::Permissions::from_mode(0o600))
                .map_err(|e| TestEnvError::io("chmod of the server key", e))?;
            self.run_as.own(&p)?;
        }
        self.run_as.own(&tls)?;
        Ok(())
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
        let mut cmd = self.run_as.command(self.bins.bin("postgres"));
        if self.options.detached {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        cmd.arg("-D")
            .arg(self.data_path())
            .arg("-k")
            .arg(self.dir.path().join("s"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        let mut settings: Vec<(String, String)> = BASE_SETTINGS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if self.options.tls {
            let tls = self.dir.path().join("tls");
            settings.push(("ssl".into(), "on".into()));
            settings.push((
                "ssl_cert_file".into(),
                tls.join("server.crt").display().to_string(),
            ));
            settings.push((
                "ssl_key_file".into(),
                tls.join("server.key").display().to_string(),
            ));
        }
        settings.extend(self.options.settings.iter().cloned());
        for (k, v) in &settings {
            cmd.arg("-c").arg(format!("{k}={v}"));
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2))
            .spawn()
            .map_err(|e| TestEnvError::io("starting postgres", e))?;
        let pidfile = self.data_path().join("postmaster.pid");
        let ready = support::wait_for(Duration::from_secs(60), || {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(Err(format!("postgres exited with {status}")));
            }
            // Line 8 of postmaster.pid is the postmaster's status; "ready" once it
            // accepts connections.
            let text = fs::read_to_string(&pidfile).ok()?;
            let status = text.lines().nth(7)?.trim();
            // "standby": a hot standby that accepts read-only connections.
            (status == "ready" || status == "standby").then_some(Ok(()))
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

    /// Stops the server (it can be started again with [`start_again`](Self::start_again)).
    pub fn stop_with(&mut self, how: Shutdown) -> Result<(), TestEnvError> {
        self.stop_within(how, Duration::from_secs(60))
    }

    /// Stops the server, failing (and killing it) if it has not exited within `within`:
    /// for tests that a client never holds a shutdown up.
    pub fn stop_within(&mut self, how: Shutdown, within: Duration) -> Result<(), TestEnvError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let signal = match how {
            Shutdown::Fast => Signal::INT,
            Shutdown::Immediate => Signal::QUIT,
        };
        if let Some(pid) = Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process(pid, signal);
        }
        let exited = support::wait_for(within, || child.try_wait().ok().flatten().map(|_| ()));
        if exited.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(TestEnvError::StartFailed {
                reason: format!("the server did not stop within {within:?} and was killed"),
                log: support::tail(&self.log_path(), 30),
            });
        }
        Ok(())
    }

    /// Stops the server cleanly (fast shutdown: clients are disconnected).
    pub fn stop(&mut self) -> Result<(), TestEnvError> {
        self.stop_with(Shutdown::Fast)
    }

    /// Kills the server as a crash would (immediate shutdown).
    pub fn kill(&mut self) -> Result<(), TestEnvError> {
        self.stop_with(Shutdown::Immediate)
    }

    /// Starts a stopped server again, on the same port and directory.
    pub fn start_again(&mut self) -> Result<(), TestEnvError> {
        if self.child.is_some() {
            return Ok(());
        }
        self.spawn()
    }

    /// Stops (fast) and starts the server again.
    pub fn restart(&mut self) -> Result<(), TestEnvError> {
        self.stop()?;
        self.start_again()
    }

    /// Whether the server process is running.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Host to connect to over TCP (`127.0.0.1`).
    pub fn host(&self) -> &str {
        "127.0.0.1"
    }

    /// TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The superuser's name (`postgres`).
    pub fn user(&self) -> &str {
        "postgres"
    }

    /// The superuser's password, when one was set.
    pub fn password(&self) -> Option<&str> {
        self.options.password.as_deref()
    }

    /// The directory holding the server's unix socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("s")
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.data_path()
    }

    /// The directory holding the server binaries (`postgres`, `initdb`; Debian's also
    /// hold the client tools, the matrix's builds do not: use [`tool`](Self::tool)).
    pub fn bin_dir(&self) -> &Path {
        &self.bins.dir
    }

    /// A client tool for this server (`psql`, `pg_recvlogical`, `pgbench`): beside the
    /// server binaries when there, else the system's newest.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.bins.tool(name)
    }

    /// The server's major version (`15`).
    pub fn major_version(&self) -> u32 {
        self.bins.major
    }

    /// The throwaway CA that signed the server certificate (servers built with
    /// [`PgServerBuilder::tls`]).
    pub fn ca_cert(&self) -> Option<PathBuf> {
        self.options
            .tls
            .then(|| self.dir.path().join("tls").join("ca.crt"))
    }

    /// Superuser URL for database `postgres` over TCP:
    /// `postgres://postgres[:password]@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// Superuser URL for `database` over TCP.
    pub fn url_for(&self, database: &str) -> String {
        let auth = match &self.options.password {
            Some(pw) => format!("postgres:{}", percent_encode(pw)),
            None => "postgres".to_string(),
        };
        format!("postgres://{auth}@127.0.0.1:{}/{database}", self.port)
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Runs SQL through `psql` over the unix socket as the superuser (trusted) and
    /// returns its unaligned, tuples-only output, trimmed. Stops at the first error.
    pub fn psql(&self, sql: &str) -> Result<String, TestEnvError> {
        self.psql_in("postgres", sql)
    }

    /// Like [`psql`](Self::psql), in `database`.
    pub fn psql_in(&self, database: &str, sql: &str) -> Result<String, TestEnvError> {
        let out = support::run(
            Command::new(self.bins.tool("psql"))
                .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
                .arg("-h")
                .arg(self.socket_dir())
                .args([
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                    "-d",
                    database,
                ])
                .args(["-c", sql]),
        )?;
        Ok(out.trim().to_string())
    }

    /// Waits until replication slot `slot` is streaming to someone (a reader started
    /// elsewhere, e.g. in a child process, is connected), or fails after `within`.
    /// Blocking: it asks `psql` every 50 ms.
    pub fn wait_for_slot(&self, slot: &str, within: Duration) -> Result<(), TestEnvError> {
        let deadline = std::time::Instant::now() + within;
        let sql = format!(
            "SELECT active FROM pg_replication_slots WHERE slot_name = '{}'",
            slot.replace('\'', "''")
        );
        loop {
            if self.psql(&sql)? == "t" {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(TestEnvError::Timeout(format!(
                    "slot {slot} streaming, within {within:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Appends a line to the server log (marks phases of a test in its diagnostics).
    pub fn note(&self, line: &str) {
        if let Ok(mut f) = OpenOptions::new().append(true).open(self.log_path()) {
            let _ = writeln!(f, "--- test: {line}");
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // The TempDir removes the directory once the server is gone.
        let _ = self.stop_with(Shutdown::Immediate);
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_major_versions() {
        assert_eq!(
            parse_major("postgres (PostgreSQL) 15.8 (Debian 15.8-1.pgdg120+1)\n"),
            Some(15)
        );
        assert_eq!(parse_major("postgres (PostgreSQL) 17beta1"), Some(17));
        assert_eq!(parse_major("nonsense"), None);
    }

    #[test]
    fn encodes_passwords_for_urls() {
        assert_eq!(percent_encode("a b@c"), "a%20b%40c");
    }
}
