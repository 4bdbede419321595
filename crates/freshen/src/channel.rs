//! An in-memory source: push batches from code (tests, home-made capture).

use tokio::sync::mpsc;

use crate::{Batch, BoxFuture, Capabilities, Source, SourceError};

/// A source fed from code through its [`Feed`]: for tests, or a program that captures
/// changes itself. The stream ends when every `Feed` is dropped.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use freshen::{channel, Ack, Batch, Op, RowEvent, Source};
/// let (feed, mut source) = channel(8);
/// feed.send(Batch::new(vec![RowEvent::new("public", "t", Op::Insert)], Ack::none())).await.unwrap();
/// drop(feed);
/// assert_eq!(source.next_batch().await.unwrap().unwrap().events().len(), 1);
/// assert!(source.next_batch().await.is_none());
/// # });
/// ```
pub fn channel(capacity: usize) -> (Feed, ChannelSource) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (
        Feed { tx },
        ChannelSource {
            rx,
            capabilities: Capabilities::default(),
        },
    )
}

/// The sending side of [`channel`].
#[derive(Debug, Clone)]
pub struct Feed {
    tx: mpsc::Sender<Result<Batch, SourceError>>,
}

/// The source dropped (its refresher stopped); nothing more will be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedClosed;

impl std::fmt::Display for FeedClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the channel source was dropped")
    }
}

impl std::error::Error for FeedClosed {}

impl Feed {
    /// Sends a batch, waiting while the source is full.
    pub async fn send(&self, batch: Batch) -> Result<(), FeedClosed> {
        self.tx.send(Ok(batch)).await.map_err(|_| FeedClosed)
    }

    /// Makes the source fail for good with `error` (ends the refresher's run).
    pub async fn fail(&self, error: SourceError) -> Result<(), FeedClosed> {
        self.tx.send(Err(error)).await.map_err(|_| FeedClosed)
    }
}

/// The source side of [`channel`].
#[derive(Debug)]
pub struct ChannelSource {
    rx: mpsc::Receiver<Result<Batch, SourceError>>,
    capabilities: Capabilities,
}

impl ChannelSource {
    /// Declares what this source guarantees (the default promises nothing).
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> ChannelSource {
        self.capabilities = capabilities;
        self
    }
}

impl Source for ChannelSource {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, SourceError>>> {
        Box::pin(self.rx.recv())
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }
}
