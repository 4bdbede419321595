//! The Pulsar source as the `freshen` binary plugs it in.

use std::sync::Arc;

use freshen::plug::{Finding, Plan, SourcePlug, Started};
use freshen::{BoxError, BoxFuture};

use crate::{PulsarSource, PulsarSourceConfig};

impl SourcePlug for PulsarSourceConfig {
    fn kind(&self) -> &'static str {
        "pulsar"
    }

    fn problems(&self) -> Vec<String> {
        PulsarSourceConfig::problems(self)
    }

    fn naming(&self) -> freshen::plug::Naming {
        self.format.naming()
    }

    fn capabilities(&self) -> freshen::Capabilities {
        self.format.capabilities()
    }

    fn check<'a>(&'a self, _plan: &'a Plan) -> BoxFuture<'a, Vec<Finding>> {
        // A subscription is only proven by subscribing, which would take the
        // failover slot from a running instance: say what is read instead.
        let f = Finding::ok(
            "source",
            format!("pulsar {}", freshen::redact_url(&self.url)),
            format!(
                "subscription {} reads {} as {:?} (the broker is not contacted by check)",
                self.subscription, self.topic, self.format
            ),
        );
        Box::pin(async move { vec![f] })
    }

    fn start<'a>(&'a self, _plan: &'a Plan) -> BoxFuture<'a, Result<Started, BoxError>> {
        Box::pin(async move {
            let source = PulsarSource::new(self.clone())?;
            let probe = Arc::new(source.stats_handle());
            Ok(Started {
                source: Box::new(source),
                probe,
            })
        })
    }
}
