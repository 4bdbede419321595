//! The Kafka source as the `freshen` binary plugs it in.

use std::sync::Arc;

use freshen::plug::{Finding, Plan, SourcePlug, Started};
use freshen::{BoxError, BoxFuture};

use crate::{KafkaSource, KafkaSourceConfig};

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
