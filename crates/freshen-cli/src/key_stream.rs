//! The key stream's one kind, Kafka's (`[key_stream]`, see `role.rs`): the capture
//! role's publisher and the workers' source (its settings are read by
//! `config/key_stream.rs`). With `config/key_stream.rs`, the only place the roles name
//! Kafka: without the `kafka` feature configuration refuses `[key_stream]`, so neither
//! role can start.

pub(crate) use kind::{publisher, worker};

use std::sync::Arc;

/// How the capture role reads a change's keys: `(view index, key)` for each view.
pub(crate) type Keyer = dyn Fn(&freshen::RowEvent, &mut Vec<(usize, freshen::Key)>) + Send + Sync;

/// What a worker runs its views on: one source per view (its keys from the stream) and
/// each view's rebuild fenced by partition ownership.
pub(crate) struct Worker {
    /// Per view, in configuration order.
    pub(crate) sources: Vec<Box<dyn freshen::Source>>,
    /// Per view, fenced.
    pub(crate) rebuilds: Vec<Box<dyn freshen::Rebuild>>,
    /// The key stream's health (partitions owned).
    pub(crate) probe: Arc<dyn freshen::SourceProbe>,
}

/// Kafka's key stream.
#[cfg(feature = "kafka")]
mod kind {
    use std::sync::Arc;

    use anyhow::Context as _;

    use super::{Keyer, Worker};
    use crate::config::KeyStream;
    use crate::parts::SinkRun;

    /// Connects the capture role's publisher of the views named `views` (in order),
    /// whose keys `keyer` reads from each change.
    pub(crate) async fn publisher(
        ks: &KeyStream,
        views: Vec<String>,
        keyer: Box<Keyer>,
    ) -> anyhow::Result<SinkRun> {
        let publisher = freshen_kafka::KeyPublisher::connect(ks)
            .await
            .context("cannot set up the key stream's producer")?;
        tracing::info!(
            topic = %ks.topic,
            partitions = publisher.partitions(),
            "capture: publishing the views' keys"
        );
        Ok(Box::new(move |branch, stop| {
            Box::pin(async move {
                publisher
                    .run(branch, &views, &*keyer, stop)
                    .await
                    .map_err(Into::into)
            })
        }))
    }

    /// Joins the workers' group and fences each view's rebuild, `(name, rebuild)` in
    /// configuration order.
    pub(crate) async fn worker(
        ks: &KeyStream,
        views: Vec<(String, Box<dyn freshen::Rebuild>)>,
    ) -> anyhow::Result<Worker> {
        let source = freshen_kafka::KeySource::connect(ks)
            .await
            .context("cannot join the key stream's consumer group")?;
        tracing::info!(
            topic = %ks.topic,
            group = %ks.group,
            partitions = source.partitions(),
            "worker: rebuilding the keys of the partitions assigned here"
        );
        let probe = Arc::new(source.probe());
        let (names, rebuilds): (Vec<String>, Vec<_>) = views
            .into_iter()
            .map(|(name, r)| {
                let fenced = source.fence(&name, r);
                (name, fenced)
            })
            .unzip();
        let sources = source
            .split(names)
            .into_iter()
            .map(|s| Box::new(s) as Box<dyn freshen::Source>)
            .collect();
        Ok(Worker {
            sources,
            rebuilds,
            probe,
        })
    }

    #[cfg(test)]
    mod tests {
        /// [`crate::config::parse`] with the kinds this binary registers.
        fn parse(
            src: &str,
            file: &str,
            env: &dyn Fn(&str) -> Option<String>,
        ) -> Result<crate::config::Config, crate::config::ConfigError> {
            crate::config::parse(src, file, env, crate::kinds::builtin())
        }
        use crate::role::{Role, resolve};

        const BASE: &str = r#"
[source]
kind = "postgres"
url = "postgres://app@db/app"

[[views]]
name = "device_totals"
watch = [{ table = "readings", key = ["device"] }]
rebuild = ["SELECT 1 WHERE $1::text IS NOT NULL"]
"#;

        fn no_env(_: &str) -> Option<String> {
            None
        }

        #[test]
        fn a_key_stream_is_read_with_its_defaults() {
            let src = format!(
                "{BASE}\n[key_stream]\nbrokers = [\"k1:9092\", \"k2:9092\"]\ntopic = \"keys\"\ngroup = \"workers\"\n"
            );
            let c = parse(&src, "f.toml", &no_env).unwrap();
            let ks = c.key_stream.expect("read");
            assert_eq!(ks.brokers, "k1:9092,k2:9092");
            assert_eq!(ks.revoke_timeout_ms, 30_000);
        }

        #[test]
        fn every_key_stream_problem_is_listed_with_its_line() {
            let src = format!(
                r#"{BASE}
[[views]]
name = "plan_totals"
watch = [
  {{ table = "accounts", key = ["id"] }},
  {{ table = "plans", key = ["id"], keys = "SELECT id FROM accounts WHERE plan_id = $1" }},
]
rebuild = ["SELECT 1 WHERE $1::text IS NOT NULL"]

[key_stream]
brokers = "k:9092"
topic = "bad topic"
group = ""
max_batch = 0
propertys = {{}}
"#
            );
            let err = parse(&src, "f.toml", &no_env).unwrap_err();
            let text = err.to_string();
            let lines = err.lines();
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains("plan_totals") && l.contains("fan-out")),
                "{text}"
            );
            assert!(lines.iter().any(|l| l.contains("propertys")), "{text}");
            // Unknown keys are reported first (serde stops there); fixed, the values are
            // judged: every one of them at once, each on its line.
            let src = src.replace("propertys = {}\n", "");
            let err = parse(&src, "f.toml", &no_env).unwrap_err();
            let text = err.to_string();
            for (what, line) in [("topic", 21), ("group", 22), ("max_batch", 23)] {
                assert!(
                    err.problems
                        .iter()
                        .any(|p| p.line == Some(line) && p.message.contains(what)),
                    "{what} on line {line}: {text}"
                );
            }
        }

        #[test]
        fn a_role_needs_a_key_stream_and_a_key_stream_needs_a_role() {
            let base = r#"
[source]
kind = "postgres"
url = "postgres://app@db/app"

[[views]]
name = "v"
watch = [{ table = "readings", key = ["device"] }]
rebuild = ["SELECT 1 WHERE $1::text IS NOT NULL"]
"#;
            let env = |_: &str| None;
            let single = parse(base, "f.toml", &env).unwrap();
            assert_eq!(resolve(&single, None), Ok(None));
            let e = resolve(&single, Some(Role::Worker)).unwrap_err();
            assert!(
                e.contains("--role worker") && e.contains("[key_stream]"),
                "{e}"
            );
            let spread = format!(
                "{base}\n[key_stream]\nbrokers = \"k:9092\"\ntopic = \"keys\"\ngroup = \"w\"\n"
            );
            let spread = parse(&spread, "f.toml", &env).unwrap();
            assert_eq!(
                resolve(&spread, Some(Role::Capture)),
                Ok(Some(Role::Capture))
            );
            let e = resolve(&spread, None).unwrap_err();
            assert!(
                e.contains("--role capture") && e.contains("--role worker"),
                "{e}"
            );
        }
    }
}

/// Without Kafka built in: configuration refuses `[key_stream]`, so no settings exist.
#[cfg(not(feature = "kafka"))]
mod kind {
    use super::{Keyer, Worker};
    use crate::config::KeyStream;
    use crate::parts::SinkRun;

    /// Never called: no settings exist.
    pub(crate) async fn publisher(
        ks: &KeyStream,
        _views: Vec<String>,
        _keyer: Box<Keyer>,
    ) -> anyhow::Result<SinkRun> {
        match *ks {}
    }

    /// Never called: no settings exist.
    pub(crate) async fn worker(
        ks: &KeyStream,
        _views: Vec<(String, Box<dyn freshen::Rebuild>)>,
    ) -> anyhow::Result<Worker> {
        match *ks {}
    }
}
