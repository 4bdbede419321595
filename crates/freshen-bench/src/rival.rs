//! Rival programs built outside this repository (their source is not ours to commit),
//! named by environment variables: a scenario runs them when set, and says in one line
//! what it skipped when not.

use std::path::PathBuf;

/// The program `env` names, or `None` (with a line saying the row was skipped and what
/// the variable must name) when it is unset. A variable naming no file is an error.
pub(crate) fn binary(env: &str, row: &str, names: &str) -> anyhow::Result<Option<PathBuf>> {
    let Some(path) = std::env::var_os(env) else {
        println!("{row} not run: {env} is unset (it names {names})\n");
        return Ok(None);
    };
    let path = PathBuf::from(path);
    anyhow::ensure!(
        path.is_file(),
        "{env}={} is not a file (it names {names})",
        path.display()
    );
    Ok(Some(path))
}
