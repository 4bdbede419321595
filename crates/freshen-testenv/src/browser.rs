//! Headless Chromium for tests of pages: find it, and the flags that keep it quiet,
//! local and throwaway.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::TestEnvError;

/// Flags for a headless, sandbox-free (tests may run as root), offline-minded browser.
pub const HEADLESS_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
];

/// The Chromium binary: `$FRESHEN_CHROMIUM`, else `chromium` or `chromium-browser` on
/// `PATH`. Missing is an error naming the Debian package (`scripts/test-deps-browser`
/// installs it).
pub fn chromium() -> Result<PathBuf, TestEnvError> {
    if let Some(p) = std::env::var_os("FRESHEN_CHROMIUM") {
        return Ok(PathBuf::from(p));
    }
    let paths: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let names = ["chromium", "chromium-browser"];
    for dir in &paths {
        for name in names {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err(TestEnvError::MissingBinaries {
        what: "Chromium (chromium, chromium-browser or $FRESHEN_CHROMIUM)".into(),
        searched: paths,
        package: "chromium",
    })
}

/// Loads `url` in headless Chromium, lets its scripts run for `budget_ms` of virtual time
/// (paused while requests are in flight, so fetches finish), and returns the DOM as
/// serialized then.
pub fn dump_dom(url: &str, budget_ms: u32) -> Result<String, TestEnvError> {
    dump_dom_at(url, budget_ms, (1280, 900))
}

/// [`dump_dom`] in a window of `width × height` CSS pixels (what layout tests measure
/// against).
pub fn dump_dom_at(
    url: &str,
    budget_ms: u32,
    (width, height): (u32, u32),
) -> Result<String, TestEnvError> {
    let browser = chromium()?;
    let profile = tempfile::tempdir().map_err(|e| TestEnvError::io("a browser profile", e))?;
    let out = Command::new(&browser)
        .args(HEADLESS_FLAGS)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg("--dump-dom")
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| TestEnvError::io(format!("running {}", browser.display()), e))?;
    if !out.status.success() {
        return Err(TestEnvError::Command {
            command: format!("{} --dump-dom {url}", browser.display()),
            output: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
