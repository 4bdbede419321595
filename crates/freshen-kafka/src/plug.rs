//! The Kafka source and sink as the `freshen` binary plugs them in.

use std::sync::Arc;

use freshen::plug::{Finding, Plan, Redact, RunSink, SinkPlug, SinkProbe, SourcePlug, Started};
use freshen::{BoxError, BoxFuture};

use crate::{
    KafkaOutbox, KafkaOutboxConfig, KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig,
};

impl SourcePlug for KafkaSourceConfig {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn problems(&self) -> Vec<String> {
        KafkaSourceConfig::problems(self)
    }

    fn naming(&self) -> freshen::plug::Naming {
        self.format.naming()
    }

    fn capabilities(&self) -> freshen::Capabilities {
        self.format.capabilities()
    }

    fn check<'a>(&'a self, _plan: &'a Plan) -> BoxFuture<'a, Vec<Finding>> {
        // Reaching the brokers proves little (topics and ACLs are per request) and
        // would make `check` hang on an unreachable cluster: say what is read instead.
        let f = Finding::ok(
            "source",
            format!("kafka {}", self.brokers),
            format!(
                "group {} reads {} as {:?} (brokers are not contacted by check)",
                self.group,
                self.topics.join(", "),
                self.format
            ),
        );
        Box::pin(async move { vec![f] })
    }

    fn start<'a>(&'a self, _plan: &'a Plan) -> BoxFuture<'a, Result<Started, BoxError>> {
        Box::pin(async move {
            let source = KafkaSource::new(self)?;
            let probe = Arc::new(source.stats_handle());
            Ok(Started {
                source: Box::new(source),
                probe,
            })
        })
    }
}

impl SinkPlug for KafkaSinkConfig {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn name(&self) -> &'static str {
        "Kafka"
    }

    fn problems(&self) -> Vec<String> {
        KafkaSinkConfig::problems(self)
    }

    fn identity(&self) -> String {
        format!("kafka:{}", self.topic)
    }

    fn open(&self) -> Result<RunSink, BoxError> {
        run(KafkaSink::new(self)?)
    }

    fn open_redacted(&self, redact: Arc<dyn Redact>) -> Result<RunSink, BoxError> {
        run(KafkaSink::new(self)?.with_redactor(redact))
    }

    fn open_probed(
        &self,
        redact: Option<Arc<dyn Redact>>,
    ) -> Result<(RunSink, Option<Arc<dyn SinkProbe>>), BoxError> {
        let mut sink = KafkaSink::new(self)?;
        if let Some(r) = redact {
            sink = sink.with_redactor(r);
        }
        let probe = sink.probe();
        Ok((run(sink)?, Some(probe)))
    }
}

/// How the binary runs `sink` on its branch, with a snapshot's rows spliced in.
fn run(sink: KafkaSink) -> Result<RunSink, BoxError> {
    Ok(Box::new(move |branch, splice, stop| {
        Box::pin(async move {
            match splice {
                Some(splice) => sink.run_interleaved(branch, splice, stop).await,
                None => sink.run(branch, stop).await,
            }
            .map_err(Into::into)
        })
    }))
}

impl SinkPlug for KafkaOutboxConfig {
    fn kind(&self) -> &'static str {
        "kafka-outbox"
    }

    fn name(&self) -> &'static str {
        "Kafka outbox"
    }

    fn problems(&self) -> Vec<String> {
        KafkaOutboxConfig::problems(self)
    }

    fn identity(&self) -> String {
        format!("kafka-outbox:{}", self.table)
    }

    fn tables(&self) -> Vec<(String, String)> {
        self.table_parts()
            .map(|(s, t)| (s.to_owned(), t.to_owned()))
            .into_iter()
            .collect()
    }

    fn open(&self) -> Result<RunSink, BoxError> {
        run_outbox(KafkaOutbox::new(self)?)
    }

    fn open_redacted(&self, redact: Arc<dyn Redact>) -> Result<RunSink, BoxError> {
        run_outbox(KafkaOutbox::new(self)?.with_redactor(redact))
    }

    fn open_probed(
        &self,
        redact: Option<Arc<dyn Redact>>,
    ) -> Result<(RunSink, Option<Arc<dyn SinkProbe>>), BoxError> {
        let mut outbox = KafkaOutbox::new(self)?;
        if let Some(r) = redact {
            outbox = outbox.with_redactor(r);
        }
        let probe = outbox.probe();
        Ok((run_outbox(outbox)?, Some(probe)))
    }
}

/// How the binary runs an outbox relay on its branch, with a snapshot's rows spliced in.
fn run_outbox(outbox: KafkaOutbox) -> Result<RunSink, BoxError> {
    Ok(Box::new(move |branch, splice, stop| {
        Box::pin(async move {
            match splice {
                Some(splice) => outbox.run_interleaved(branch, splice, stop).await,
                None => outbox.run(branch, stop).await,
            }
            .map_err(Into::into)
        })
    }))
}
