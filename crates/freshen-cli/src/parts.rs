//! The parts a running pipeline is made of: each a task run until the stop signal
//! ([`Part`]), and what runs on a branch of the source ([`SinkRun`]: a sink, the key
//! publisher).

use std::future::Future;

use freshen::Branch;

/// A sink's run, started with its branch of the source and the shutdown signal.
pub(crate) type SinkRun = Box<
    dyn FnOnce(
            Branch,
            freshen::BoxFuture<'static, ()>,
        ) -> freshen::BoxFuture<'static, anyhow::Result<()>>
        + Send,
>;

/// Until the pipeline stops.
pub(crate) type Stop = freshen::BoxFuture<'static, ()>;

/// One task of a running pipeline — a view's refresher, a sink, a snapshot driver, the
/// changefeed's writer or its listener — named as the log calls it. Every part runs
/// until the stop signal or its own end; the first failure stops the others.
pub(crate) struct Part {
    pub(crate) name: String,
    pub(crate) run: Box<dyn FnOnce(Stop) -> freshen::BoxFuture<'static, anyhow::Result<()>> + Send>,
}

impl Part {
    pub(crate) fn new<F, Fut>(name: impl Into<String>, run: F) -> Part
    where
        F: FnOnce(Stop) -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        Part {
            name: name.into(),
            run: Box::new(move |stop| Box::pin(run(stop))),
        }
    }
}
