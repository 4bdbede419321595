//! `freshen snapshot`: start a changefeed snapshot of some tables on a running instance
//! (`POST /changefeed/snapshot`), or show each table's progress (`GET`); with
//! `--sink N`, a snapshot into the N-th sink (`POST /admin/sinks/N/snapshot` on the
//! metrics listener), or its progress (from `/status`).
//!
//! The address is the configuration's `[changefeed.http] listen`; the bearer token,
//! when the changefeed requires one, the first `admin` token of the configuration (its
//! value or its `token_env`), else `$FRESHEN_CHANGEFEED_TOKEN`. For a sink: `[http]
//! listen` and `[http] admin_token`.

use anyhow::{Context, bail};

use crate::config::Config;

/// The environment variable read for the token when the configuration names none.
pub(crate) const TOKEN_ENV: &str = "FRESHEN_CHANGEFEED_TOKEN";

/// The changefeed's base URL and an admin token, from `cfg`.
fn endpoint(cfg: &Config) -> anyhow::Result<(String, Option<String>)> {
    let Some(cf) = &cfg.changefeed else {
        bail!("the configuration has no [changefeed]");
    };
    let configured = cf
        .http
        .tokens
        .iter()
        .filter(|t| t.scope == freshen_changefeed::Scope::Admin)
        .find_map(|t| {
            t.token
                .clone()
                .or_else(|| t.token_env.as_deref().and_then(|v| std::env::var(v).ok()))
        });
    let token = configured.or_else(|| std::env::var(TOKEN_ENV).ok());
    Ok((crate::status::local_url(cf.http.listen), token))
}

/// Starts a snapshot of `tables` (`schema.table`), or with none prints the progress.
pub(crate) async fn run(cfg: &Config, tables: &[String]) -> anyhow::Result<String> {
    let (base, token) = endpoint(cfg)?;
    let (code, body) = if tables.is_empty() {
        crate::status::request(&base, "GET", "/changefeed/snapshot", token.as_deref(), None).await?
    } else {
        let body = serde_json::json!({ "tables": tables }).to_string();
        crate::status::request(
            &base,
            "POST",
            "/changefeed/snapshot",
            token.as_deref(),
            Some(&body),
        )
        .await?
    };
    if !(200..300).contains(&code) {
        bail!(
            "{base}/changefeed/snapshot answered {code}: {}",
            body.trim()
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(&body).context("the changefeed's answer is not JSON")?;
    Ok(serde_json::to_string_pretty(&v)?)
}

/// Starts a snapshot of `tables` into sink `sink`, or with none prints its progress.
pub(crate) async fn run_sink(
    cfg: &Config,
    sink: usize,
    tables: &[String],
) -> anyhow::Result<String> {
    if sink >= cfg.sinks.len() {
        bail!(
            "the configuration has {} sink(s) ([[sinks]], numbered from 0): no sink {sink}",
            cfg.sinks.len()
        );
    }
    let Some(http) = &cfg.http else {
        bail!("the configuration has no [http]: a sink's snapshots are asked for on its listener");
    };
    let base = crate::status::local_url(http.listen);
    let token = http.admin_token.as_ref().map(|t| t.expose().to_owned());
    if tables.is_empty() {
        let (code, body) =
            crate::status::request(&base, "GET", "/status", token.as_deref(), None).await?;
        if !(200..300).contains(&code) {
            bail!("{base}/status answered {code}: {}", body.trim());
        }
        let status: crate::readout::Status =
            serde_json::from_str(&body).context("the status is not what this freshen reads")?;
        let mine: Vec<_> = status
            .sink_snapshots
            .into_iter()
            .filter(|s| s.sink == sink)
            .collect();
        return Ok(serde_json::to_string_pretty(&mine)?);
    }
    let path = format!("/admin/sinks/{sink}/snapshot");
    let body = serde_json::json!({ "tables": tables }).to_string();
    let (code, body) =
        crate::status::request(&base, "POST", &path, token.as_deref(), Some(&body)).await?;
    if !(200..300).contains(&code) {
        bail!("{base}{path} answered {code}: {}", body.trim());
    }
    let v: serde_json::Value = serde_json::from_str(&body).context("the answer is not JSON")?;
    Ok(serde_json::to_string_pretty(&v)?)
}
