//! Which part of the work an instance does when a configuration spreads its rebuilds
//! over many instances (`[key_stream]`; docs/scaling.md):
//!
//! - **capture** (one at a time: it holds the source's slot): reads `[source]`, maps
//!   each change to the views' scope keys and publishes them to the key stream, to the
//!   partition that owns each key; a transaction is confirmed to the source only once
//!   all its keys are in Kafka. Sinks and the changefeed run here too. No rebuilds.
//! - **worker** (as many as the topic has partitions): reads the key stream as a
//!   consumer group and rebuilds with the views' SQL; a key's rebuild runs only while
//!   its partition is owned here, and offsets are committed after the rebuilds.
//!
//! Without `[key_stream]` an instance does everything itself, as always.

use crate::config::Config;
use crate::key_stream::{Keyer, Worker};

/// A role, as `freshen run --role` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Read the source, publish the views' keys to the key stream.
    Capture,
    /// Read the key stream, rebuild.
    Worker,
}

impl Role {
    /// As the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Capture => "capture",
            Role::Worker => "worker",
        }
    }
}

/// The role this instance runs: `None` does everything itself (no `[key_stream]`).
/// A configuration with `[key_stream]` says which role by `--role`; one without cannot
/// take a role.
pub(crate) fn resolve(cfg: &Config, asked: Option<Role>) -> Result<Option<Role>, String> {
    match (cfg.key_stream.is_some(), asked) {
        (true, Some(r)) => Ok(Some(r)),
        (true, None) => Err(
            "the configuration has a [key_stream]: say which part this instance runs, `--role capture` (one instance: reads the source, publishes keys) or `--role worker` (any number: rebuilds)"
                .into(),
        ),
        (false, Some(r)) => Err(format!(
            "`--role {}` needs a [key_stream] table in the configuration (the Kafka topic between the capture instance and the workers)",
            r.name()
        )),
        (false, None) => Ok(None),
    }
}

/// The capture role's publisher, run like a sink on its branch of the source.
pub(crate) async fn publisher(cfg: &Config) -> anyhow::Result<crate::parts::SinkRun> {
    use anyhow::Context as _;
    let ks = cfg
        .key_stream
        .as_ref()
        .context("the capture role needs [key_stream]")?;
    let scopes: Vec<_> = cfg.views.iter().map(crate::scope::ViewScope::new).collect();
    let names: Vec<String> = cfg.views.iter().map(|v| v.name.clone()).collect();
    let keyer: Box<Keyer> = Box::new(move |e, out| {
        for (i, s) in scopes.iter().enumerate() {
            out.extend(s.keys(e).map(|k| (i, k)));
        }
    });
    crate::key_stream::publisher(ks, names, keyer).await
}

/// Joins the workers' group and fences `rebuilds` (one per view).
pub(crate) async fn worker(
    cfg: &Config,
    rebuilds: Vec<Box<dyn freshen::Rebuild>>,
) -> anyhow::Result<Worker> {
    use anyhow::Context as _;
    let ks = cfg
        .key_stream
        .as_ref()
        .context("the worker role needs [key_stream]")?;
    let views = cfg.views.iter().map(|v| v.name.clone()).zip(rebuilds);
    crate::key_stream::worker(ks, views.collect()).await
}

/// The status line of a worker's partitions: which key stream partitions it owns.
pub(crate) fn partitions_line(parts: &[i32]) -> String {
    if parts.is_empty() {
        return "key stream partitions owned: none (waiting for an assignment, or more workers than partitions)\n".into();
    }
    let list: Vec<String> = parts.iter().map(i32::to_string).collect();
    format!(
        "key stream partitions owned: {} ({})\n",
        list.join(", "),
        parts.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_read_as_a_list() {
        assert_eq!(
            partitions_line(&[0, 3, 5]),
            "key stream partitions owned: 0, 3, 5 (3)\n"
        );
        assert!(partitions_line(&[]).contains("none"));
    }
}
