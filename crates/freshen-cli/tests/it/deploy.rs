//! The files of `deploy/`, exercised: the systemd unit passes `systemd-analyze verify`
//! with its `ExecStart` on the binary under test, and runs it — hardening and all — under
//! systemd in a podman container against a real PostgreSQL; the container image is built
//! with podman from `deploy/Containerfile` (on local Debian base images made with
//! mmdebstrap, since no registry of images is reachable from a test) and runs `freshen` in
//! it.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub(crate) fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Panics naming the Debian package when `tool` is not installed: never a skip.
pub(crate) fn need(tool: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(found, "`{tool}` is missing: apt-get install {package}");
}

pub(crate) fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

pub(crate) fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `systemd-analyze verify` on the unit with `ExecStart` on `binary`: its exit status and
/// everything it said about the unit (it only warns about unknown or unparsable keys).
fn verify_unit(text: &str, binary: &Path) -> (bool, String) {
    need("systemd-analyze", "systemd");
    let dir = tempfile::tempdir().unwrap();
    let unit = dir.path().join("freshen.service");
    let text = text.replace("/usr/local/bin/freshen", binary.to_str().unwrap());
    std::fs::write(&unit, text).unwrap();
    let out = run(Command::new("systemd-analyze").arg("verify").arg(&unit));
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    (out.status.success(), said)
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let unit = read("deploy/freshen.service");
    let binary = Path::new(env!("CARGO_BIN_EXE_freshen"));
    let (passed, said) = verify_unit(&unit, binary);
    assert!(passed && said.trim().is_empty(), "{said}");

    // The verifier is not a rubber stamp: a misspelt key, or no binary, is reported.
    let (_, said) = verify_unit(&unit.replace("ProtectHome=", "ProtectHomes="), binary);
    assert!(said.contains("ProtectHomes"), "{said}");
    let (passed, _) = verify_unit(&unit, Path::new("/nonexistent/freshen"));
    assert!(!passed);

    // What the unit promises: hardened, restarted on failure but not on a bad
    // configuration, secrets from a file, reload by SIGHUP (freshen re-reads its file).
    let lines: Vec<&str> = unit.lines().map(str::trim).collect();
    for want in [
        "Type=simple",
        "Restart=on-failure",
        "RestartPreventExitStatus=2",
        "EnvironmentFile=-/etc/freshen/freshen.env",
        "DynamicUser=yes",
        "StateDirectory=freshen",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "ExecStart=/usr/local/bin/freshen run -c /etc/freshen/freshen.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ] {
        assert!(lines.contains(&want), "the unit lacks `{want}`");
    }
}

/// The instructions of the Containerfile, continuation lines joined, comments dropped.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    out
}

#[test]
fn the_containerfile_is_multi_stage_non_root_and_health_checked() {
    let all = instructions(&read("deploy/Containerfile"));
    let froms = all.iter().filter(|i| i.starts_with("FROM ")).count();
    assert!(froms >= 2, "a build stage and a runtime stage: {all:#?}");
    let last_from = all.iter().rposition(|i| i.starts_with("FROM ")).unwrap();
    let runtime = &all[last_from..];
    let has = |prefix: &str| runtime.iter().find(|i| i.starts_with(prefix));
    let user = has("USER ").expect("the runtime stage sets USER");
    let uid = user["USER ".len()..].split(':').next().unwrap().trim();
    assert!(uid != "0" && uid != "root", "{user}");
    let health = has("HEALTHCHECK ").expect("a HEALTHCHECK");
    assert!(health.contains(r#"["freshen", "health"]"#), "{health}");
    assert!(
        has("CMD ").is_some_and(|c| c.contains("/etc/freshen/freshen.toml")),
        "the configuration is read from its mount point"
    );
    // The runtime stage runs nothing, so a distroless base works too.
    assert!(has("RUN ").is_none(), "{runtime:#?}");
    // No secret is baked into the image.
    for i in &all {
        let upper = i.to_uppercase();
        if upper.starts_with("ENV ") || upper.starts_with("ARG ") {
            for word in ["PASSWORD", "SECRET", "TOKEN", "DATABASE_URL", "_URL"] {
                assert!(!upper.contains(word), "a secret in the image: {i}");
            }
        }
    }
    // The context is the repository: the build directories must not be sent.
    let ignore = read(".dockerignore");
    assert!(ignore.lines().any(|l| l.trim() == "target"), "{ignore}");
}

// ---- the image, built and run with podman ----

/// Podman's global options on this machine's kind of host: runc, since crun refuses
/// hybrid cgroup hierarchies.
fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc"]);
    c
}

/// Limits below the host's hard ones: podman's defaults raise them, which a host without
/// CAP_SYS_RESOURCE (a sandbox) refuses.
const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=4096:4096",
];

fn image_exists(name: &str) -> bool {
    run(podman().args(["image", "exists", name]))
        .status
        .success()
}

/// Imports a Debian 12 minbase root file system with `include` (and `hook`, an mmdebstrap
/// customize hook) as `name` with the Containerfile instructions `changes`, unless it
/// exists.
fn debian_image(name: &str, include: &str, hook: Option<&str>, changes: &[&str]) {
    if image_exists(name) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("rootfs.tar");
    let mut m = Command::new("mmdebstrap");
    m.args(["--variant=minbase", "--quiet"]);
    if !include.is_empty() {
        m.arg(format!("--include={include}"));
    }
    if let Some(hook) = hook {
        m.arg(format!("--customize-hook={hook}"));
    }
    ok(m.args(["bookworm"]).arg(&tar));
    let mut import = podman();
    import.arg("import");
    for c in changes {
        import.args(["--change", c]);
    }
    ok(import.arg(&tar).arg(name));
}

/// Builds the image from the Containerfile for real — a cold release build inside the
/// container (22 min on this 2-core machine under load; seconds once its cache mount is
/// warm) — and runs `freshen check`, `--version`, and the pipeline with `freshen health`
/// in it. Ignored in the suite; `.ci/run` runs it by name:
/// `cargo nextest run -p freshen-cli --test it --run-ignored only -- deploy::the_container_image`.
#[test]
#[ignore = "a cold release build in a container: .ci/run runs it (--run-ignored only)"]
fn the_container_image_builds_and_runs_freshen_check_and_health() {
    need("podman", "podman");
    need("runc", "runc");
    need("mmdebstrap", "mmdebstrap");
    // Stand-ins for docker.io's debian:bookworm-slim and rust:bookworm, from Debian's
    // packages and this machine's Rust toolchain (the one building this test).
    let runtime = "localhost/freshen-test/debian:bookworm";
    debian_image(runtime, "", None, &[]);
    let rustc = ok(Command::new("rustc").arg("--version"));
    let sysroot = ok(Command::new("rustc").args(["--print", "sysroot"]));
    let tag = rustc.split_whitespace().nth(1).unwrap_or("unknown");
    let rust = format!("localhost/freshen-test/rust:{tag}-bookworm");
    // The build stage fetches crates.io over TLS: it trusts what this machine trusts (an
    // egress proxy's CA, say).
    let copy = format!(
        "mkdir -p \"$1/usr/local/rust\" && cp -a {0}/bin {0}/lib \"$1/usr/local/rust/\" \
         && cp /etc/ssl/certs/ca-certificates.crt \"$1/etc/ssl/certs/ca-certificates.crt\"",
        sysroot.trim()
    );
    debian_image(
        &rust,
        "ca-certificates,gcc,libc6-dev,binutils",
        Some(&copy),
        &[
            "ENV PATH=/usr/local/rust/bin:/usr/local/cargo/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV CARGO_HOME=/usr/local/cargo",
        ],
    );

    let image = "localhost/freshen-test/freshen:latest";
    ok(podman()
        .arg("build")
        .args(ULIMITS)
        // The build stage fetches crates from crates.io.
        .args(["--network", "host", "--format", "docker"])
        .args(["--build-arg", &format!("RUST_IMAGE={rust}")])
        .args(["--build-arg", &format!("RUNTIME_IMAGE={runtime}")])
        .args(["-f", "deploy/Containerfile", "-t", image, "."])
        .current_dir(repo()));

    let inspect = |format: &str| {
        ok(podman().args(["image", "inspect", "--format", format, image]))
            .trim()
            .to_string()
    };
    assert_eq!(inspect("{{.Config.User}}"), "10001:10001");
    let health = inspect("{{.Config.Healthcheck.Test}}");
    assert!(health.contains("freshen health"), "{health}");

    let in_image = |args: &[&str], config: &Path| {
        run(podman()
            .args(["run", "--rm", "--network", "none"])
            .args(ULIMITS)
            .args(["-e", "DATABASE_URL=postgres://app:secret@db.internal/app"])
            .arg("-v")
            .arg(format!("{}:/etc/freshen/freshen.toml:ro", config.display()))
            .arg(image)
            .args(args))
    };
    let example = repo().join("deploy/freshen.toml");
    let out = in_image(
        &["check", "--offline", "-c", "/etc/freshen/freshen.toml"],
        &example,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("0 error(s)"), "{text}");
    assert!(!text.contains("secret"), "{text}");

    // The check really reads the mounted file: a broken one fails, naming the line.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("freshen.toml");
    std::fs::write(
        &broken,
        std::fs::read_to_string(&example)
            .unwrap()
            .replace("slot = ", "slots = "),
    )
    .unwrap();
    let out = in_image(
        &["check", "--offline", "-c", "/etc/freshen/freshen.toml"],
        &broken,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("slots"), "{text}");

    // The image's binary is this build's (same version, default features), run as 10001
    // with its state directory its own.
    let said = in_image(&["--version"], &example);
    let host = ok(Command::new(env!("CARGO_BIN_EXE_freshen")).arg("--version"));
    if !cfg!(feature = "mysql") && !cfg!(feature = "kafka") && !cfg!(feature = "pulsar") {
        assert_eq!(String::from_utf8_lossy(&said.stdout), host);
    } else {
        assert!(
            String::from_utf8_lossy(&said.stdout).starts_with(&format!(
                "freshen {} (sources: postgres, postgres-incremental;",
                env!("CARGO_PKG_VERSION")
            )),
            "{said:?}"
        );
    }
    let owner = ok(podman()
        .args(["run", "--rm", "--network", "none"])
        .args(ULIMITS)
        .args([
            "--entrypoint",
            "stat",
            image,
            "-c",
            "%u %a",
            "/var/lib/freshen",
        ]));
    assert_eq!(owner.trim().split(' ').next(), Some("10001"), "{owner}");

    // The image runs the pipeline: `freshen run` (its default command) against a real
    // PostgreSQL, and `freshen health` in the container answers for it — failing, naming
    // why, while nothing listens, and exit 0 once /healthz answers 200.
    let pg = support::start_pg();
    pg.psql(support::SCHEMA).expect("the schema");
    let port = support::free_port();
    let config = dir.path().join("run.toml");
    std::fs::write(
        &config,
        read("deploy/freshen.toml").replace("127.0.0.1:9187", &format!("127.0.0.1:{port}")),
    )
    .unwrap();
    let name = format!("freshen-test-image-{}", std::process::id());
    let health = |c: &str| {
        run(podman().args(["exec", c, "freshen", "health", &format!("127.0.0.1:{port}")]))
    };
    ok(podman()
        .args(["run", "-d", "--name", &name, "--network", "host"])
        .args(ULIMITS)
        .args(["-e", &format!("DATABASE_URL={}", pg.url())])
        .arg("-v")
        .arg(format!("{}:/etc/freshen/freshen.toml:ro", config.display()))
        .arg(image));
    let c = Container(name);
    let healthy = freshen_testenv::support::wait_for(Duration::from_secs(60), || {
        health(&c.0).status.success().then_some(())
    });
    assert!(
        healthy.is_some(),
        "freshen health never passed: {:?}\n{}",
        health(&c.0),
        String::from_utf8_lossy(&run(podman().args(["logs", &c.0])).stderr)
    );
    let out = run(podman().args(["exec", &c.0, "freshen", "health", "127.0.0.1:1"]));
    assert!(!out.status.success(), "{out:?}");
}

/// A container removed when dropped, so a failing test leaves none behind.
struct Container(String);

impl Container {
    fn exec(&self, args: &[&str]) -> Output {
        run(podman().args(["exec", &self.0]).args(args))
    }

    fn sh(&self, script: &str) -> String {
        let out = self.exec(&["sh", "-c", script]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn copy(&self, from: &Path, to: &str) {
        ok(podman().arg("cp").arg(from).arg(format!("{}:{to}", self.0)));
    }

    /// `systemctl show -p <property> --value freshen`.
    fn unit(&self, property: &str) -> String {
        self.sh(&format!("systemctl show -p {property} --value freshen"))
    }

    /// Polls `property` of the unit until it is `want`, or fails after `within`.
    fn until_unit(&self, property: &str, want: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let now = self.unit(property);
            if now == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{property} stayed `{now}`, not `{want}`:\n{}",
                self.sh("journalctl -u freshen --no-pager | tail -30")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", "-t", "0", &self.0]).output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_systemd_unit_runs_freshen_hardened_under_systemd() {
    need("podman", "podman");
    need("runc", "runc");
    need("mmdebstrap", "mmdebstrap");
    let image = "localhost/freshen-test/systemd:bookworm";
    debian_image(image, "systemd,systemd-sysv,dbus", None, &[]);

    let pg = support::start_pg();
    let db = support::connect(&pg.url()).await;
    db.batch_execute(support::SCHEMA).await.unwrap();
    db.batch_execute("INSERT INTO readings (device, site, value) SELECT 'd' || (g % 7), 's1', g FROM generate_series(1, 100) g")
        .await
        .unwrap();

    // systemd as the container's init. Privileged, because the unit's own namespaces
    // (ProtectSystem, PrivateTmp, …) need mounts; the host's network, to reach the
    // test's PostgreSQL and let the test reach /healthz.
    let name = format!("freshen-test-systemd-{}", std::process::id());
    ok(podman()
        .args([
            "run",
            "-d",
            "--name",
            &name,
            "--privileged",
            "--systemd=always",
        ])
        .args(["--network", "host"])
        .args(ULIMITS)
        .args([image, "/sbin/init"]));
    let c = Container(name);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state = c.sh("systemctl is-system-running");
        if state == "running" || state == "degraded" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "systemd did not come up: {state}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Installed as deploy/README.md says: the binary, the example configuration (on a
    // free port), the secret in the environment file, the unit as it is.
    let port = support::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let config =
        read("deploy/freshen.toml").replace("127.0.0.1:9187", &format!("127.0.0.1:{port}"));
    assert!(config.contains(&format!("127.0.0.1:{port}")));
    std::fs::write(dir.path().join("freshen.toml"), &config).unwrap();
    std::fs::write(
        dir.path().join("freshen.env"),
        format!("DATABASE_URL={}\n", pg.url()),
    )
    .unwrap();
    c.sh("mkdir -p /etc/freshen");
    c.copy(
        Path::new(env!("CARGO_BIN_EXE_freshen")),
        "/usr/local/bin/freshen",
    );
    c.copy(
        &dir.path().join("freshen.toml"),
        "/etc/freshen/freshen.toml",
    );
    c.copy(&dir.path().join("freshen.env"), "/etc/freshen/freshen.env");
    c.copy(
        &repo().join("deploy/freshen.service"),
        "/etc/systemd/system/freshen.service",
    );
    c.sh("chmod 0600 /etc/freshen/freshen.env && systemctl daemon-reload");
    let started = c.exec(&["systemctl", "start", "freshen"]);
    assert!(started.status.success(), "{started:?}");

    support::wait_http(&base, "/healthz", 200, Duration::from_secs(60)).await;
    // It keeps the example's derived table fresh.
    db.batch_execute("INSERT INTO readings (device, site, value) SELECT 'd' || (g % 5), 's2', g * 3 FROM generate_series(1, 50) g; DELETE FROM readings WHERE id % 11 = 0")
        .await
        .unwrap();
    let differ = "SELECT count(*) FROM ((SELECT device, total, n FROM device_totals EXCEPT SELECT device, sum(value)::bigint, count(*) FROM readings GROUP BY device) UNION ALL (SELECT device, sum(value)::bigint, count(*) FROM readings GROUP BY device EXCEPT SELECT device, total, n FROM device_totals)) d";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = db.query_one(differ, &[]).await.unwrap().get(0);
        if n == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "device_totals never matched: {n} rows differ"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // As its own unprivileged user, with no capabilities.
    let pid = c.unit("MainPID");
    let status = c.sh(&format!("cat /proc/{pid}/status"));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
            .unwrap_or_default()
    };
    assert_ne!(field("Uid:"), "0", "{status}");
    assert_eq!(field("CapEff:"), "0000000000000000", "{status}");
    assert_eq!(field("CapBnd:"), "0000000000000000", "{status}");
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");

    // Killed, it is restarted and healthy again.
    c.exec(&["systemctl", "kill", "-s", "KILL", "freshen"]);
    c.until_unit("NRestarts", "1", Duration::from_secs(30));
    support::wait_http(&base, "/healthz", 200, Duration::from_secs(60)).await;

    // SIGTERM stops it cleanly.
    c.exec(&["systemctl", "stop", "freshen"]);
    c.until_unit("ActiveState", "inactive", Duration::from_secs(40));
    assert_eq!(c.unit("Result"), "success");

    // A bad configuration (exit 2) fails the unit at once: no restart can fix it.
    std::fs::write(
        dir.path().join("freshen.toml"),
        config.replace("slot = ", "slots = "),
    )
    .unwrap();
    c.copy(
        &dir.path().join("freshen.toml"),
        "/etc/freshen/freshen.toml",
    );
    c.exec(&["systemctl", "start", "freshen"]);
    c.until_unit("ActiveState", "failed", Duration::from_secs(30));
    assert_eq!(c.unit("ExecMainStatus"), "2");
    assert_eq!(c.unit("NRestarts"), "0");
}
