//! The user callbacks that touch the database: `Rebuild`, `Expand` and `Enumerate`.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::{BoxError, BoxFuture, Key, Retry};

/// A key due for rebuild, with what the source said about the changes behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The scope to recompute.
    pub key: Key,
    /// Ids of the transactions (PostgreSQL `xid8`) whose changes dirtied the key since
    /// its last rebuild started, oldest first. A rebuild must see all of them: a database
    /// can ship a commit through its change stream a moment before the commit is visible
    /// to new snapshots, and `freshen-postgres` checks its snapshot against these.
    /// Empty when the source gives no transaction ids or a reconcile sweep listed the key.
    pub txids: Vec<u64>,
}

/// Recomputes dirty scopes from the source tables. Must be idempotent: a key may be
/// rebuilt more than once for one change (at-least-once delivery, reconcile sweeps).
///
/// Cancellation is by drop: the refresher drops a rebuild future it gives up on (a
/// shutdown past its grace period). An implementation that starts work elsewhere
/// should stop it on drop (`freshen-postgres`'s `SqlRebuild` cancels its statement on
/// the server).
///
/// Most programs pass a closure to [`Builder::rebuild`](crate::Builder::rebuild) or
/// [`Builder::rebuild_batch`](crate::Builder::rebuild_batch); implement this trait to see
/// transaction ids or to rebuild several keys in one round trip.
pub trait Rebuild: Send + Sync + 'static {
    /// Rebuilds `due` (at most [`max_batch`](Self::max_batch) keys, never two rebuilds of
    /// one key at once). An error fails every key in the call; each is retried on its own.
    fn rebuild<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<(), BoxError>>;

    /// How many keys one call may take (1 = one key per call).
    fn max_batch(&self) -> usize {
        1
    }

    /// How many keys one call may take while a backlog waits (a large fan-out, a
    /// sweep): the refresher then splits the waiting keys over its workers, each call
    /// taking from [`max_batch`](Self::max_batch) up to this many. A set-based rebuild
    /// spreads its fixed cost per statement over more keys this way; small batches stay
    /// small, so freshness under a steady trickle does not change. The default,
    /// `max_batch`, never grows a call.
    fn bulk_batch(&self) -> usize {
        self.max_batch()
    }

    /// Whose fault a failure returned by [`rebuild`](Self::rebuild) was: the key's
    /// (counts toward quarantine) or the path's (an outage: retried, never quarantined).
    /// The default blames the key; adapters classify their own errors from codes.
    fn classify(&self, error: &BoxError) -> Retry {
        let _ = error;
        Retry::Key
    }

    /// How this rebuild recomputes its whole derived table at once, if it can (a view
    /// defined by a plain query): the refresher then builds an empty table in one
    /// statement at start and, where a backlog reaches a large share of the table,
    /// recomputes the table instead of its keys one set at a time. `None` (the default):
    /// keys only.
    fn whole(&self) -> Option<Arc<dyn Whole>> {
        None
    }
}

/// Which ways a refresher may rebuild a view's keys ([`Builder::rebuild_by`](crate::Builder::rebuild_by)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RebuildBy {
    /// Chosen per call from what it measures: a trickle in calls of
    /// [`Rebuild::max_batch`] keys, a backlog in set calls grown up to
    /// [`Rebuild::bulk_batch`], and past a share of the table the whole table at once
    /// (where [`Rebuild::whole`] can); an empty table is built whole at start. The
    /// default.
    #[default]
    Auto,
    /// Calls of at most [`Rebuild::max_batch`] keys, never grown, never the whole table;
    /// an empty table is left to a reconcile sweep.
    PerKey,
    /// Every call as large a set as waits (up to [`Rebuild::bulk_batch`]), trickle or
    /// not; the whole table past its share, as `Auto`.
    Set,
}

impl RebuildBy {
    /// The mode as a configuration file writes it.
    pub fn name(self) -> &'static str {
        match self {
            RebuildBy::Auto => "auto",
            RebuildBy::PerKey => "per-key",
            RebuildBy::Set => "set",
        }
    }
}

/// How [`Whole::rebuild_all`] writes the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WholeWay {
    /// Only if the table is empty: fill it ([`WholeDone::built`] says whether it was).
    Build,
    /// Replace every row (most rows change): as a full refresh does, in one
    /// transaction, so that readers never see the table empty or half written.
    Replace,
    /// Write only the rows that differ (few rows change): a table that did not change
    /// is not written at all.
    Diff,
}

impl WholeWay {
    /// The way's name, for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            WholeWay::Build => "build",
            WholeWay::Replace => "replace",
            WholeWay::Diff => "diff",
        }
    }
}

/// What a [`Whole::rebuild_all`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WholeDone {
    /// Rows the table holds afterwards (an estimate serves: it weighs the whole table
    /// against a backlog of keys). A build that found rows says how many.
    pub rows: u64,
    /// Rows inserted, updated or deleted.
    pub written: u64,
    /// With [`WholeWay::Build`]: whether the table was empty and is now built (else
    /// nothing was written).
    pub built: bool,
}

/// A rebuild's way of recomputing its whole derived table; from [`Rebuild::whole`].
pub trait Whole: Send + Sync + 'static {
    /// Recomputes the whole table in one transaction whose snapshot sees every
    /// transaction in `txids` (as [`Due::txids`]), writing it the `way` asked.
    fn rebuild_all<'a>(
        &'a self,
        way: WholeWay,
        txids: &'a [u64],
    ) -> BoxFuture<'a, Result<WholeDone, BoxError>>;

    /// Whose fault a failure was, as [`Rebuild::classify`].
    fn classify(&self, error: &BoxError) -> Retry {
        let _ = error;
        Retry::Key
    }
}

/// A key fan-out: maps changed *parent* rows (a plan, a product: a table that does not
/// carry the view's key) to the view keys they affect, streaming them into a
/// [`KeySink`]. Added with [`Builder::fan_out`](crate::Builder::fan_out).
///
/// Parent keys are scheduled like view keys (debounced, single flight, backoff,
/// quarantine) but off the receive path, and up to [`max_batch`](Self::max_batch) of
/// them are expanded in one call. Under [`AckPolicy::AfterRebuild`](crate::AckPolicy)
/// every key sent takes over the holds of the parent keys of the call before they are
/// released, so a transaction is confirmed only once its fan-out and every rebuild that
/// fan-out caused have finished. A call that fails after sending some keys is retried
/// whole (the keys it sent are rebuilt anyway: rebuilds are idempotent).
///
/// Visibility: the keys must be read from a snapshot that sees the transactions in
/// [`Due::txids`]. The view keys sent inherit no transaction ids, because any snapshot
/// taken later on the same server sees them too.
pub trait Expand: Send + Sync + 'static {
    /// Sends every view key that the parent keys in `due` map to, in their old and new
    /// state alike (the refresher hands over both images' keys as parents).
    fn expand<'a>(
        &'a self,
        due: &'a [Due],
        sink: &'a KeySink,
    ) -> BoxFuture<'a, Result<(), BoxError>>;

    /// How many parent keys one call may take.
    fn max_batch(&self) -> usize {
        1
    }

    /// Whose fault a failure was, as [`Rebuild::classify`].
    fn classify(&self, error: &BoxError) -> Retry {
        let _ = error;
        Retry::Key
    }

    /// About how many view keys [`expand`](Self::expand) would send for `due`, if the
    /// fan-out can tell cheaply (a plan's row estimate): a fan-out to a large share of
    /// the view is then recomputed as a whole table instead of key by key. `None` (the
    /// default): unknown.
    fn estimate<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<Option<u64>, BoxError>> {
        let _ = due;
        Box::pin(async { Ok(None) })
    }
}

/// Lists the live key universe for a reconcile sweep, streaming keys into a [`KeySink`].
pub trait Enumerate: Send + Sync + 'static {
    /// Sends every key that should exist (and every key the derived table holds, so that
    /// stale rows are removed) into `sink`.
    fn enumerate(&self, sink: KeySink) -> BoxFuture<'_, Result<(), BoxError>>;
}

/// A rebuild chosen at run time (a program that picks its target database from
/// configuration).
impl Rebuild for Box<dyn Rebuild> {
    fn rebuild<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<(), BoxError>> {
        (**self).rebuild(due)
    }

    fn max_batch(&self) -> usize {
        (**self).max_batch()
    }

    fn bulk_batch(&self) -> usize {
        (**self).bulk_batch()
    }

    fn classify(&self, error: &BoxError) -> Retry {
        (**self).classify(error)
    }

    fn whole(&self) -> Option<Arc<dyn Whole>> {
        (**self).whole()
    }
}

/// A fan-out chosen at run time.
impl Expand for Box<dyn Expand> {
    fn expand<'a>(
        &'a self,
        due: &'a [Due],
        sink: &'a KeySink,
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        (**self).expand(due, sink)
    }

    fn max_batch(&self) -> usize {
        (**self).max_batch()
    }

    fn classify(&self, error: &BoxError) -> Retry {
        (**self).classify(error)
    }

    fn estimate<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<Option<u64>, BoxError>> {
        (**self).estimate(due)
    }
}

/// An enumeration chosen at run time.
impl Enumerate for Box<dyn Enumerate> {
    fn enumerate(&self, sink: KeySink) -> BoxFuture<'_, Result<(), BoxError>> {
        (**self).enumerate(sink)
    }
}

/// Where a reconcile sweep or a fan-out sends the keys it lists; each key joins the
/// normal pipeline. Sending waits while the refresher catches up, so a large listing
/// streams with bounded memory.
#[derive(Debug, Clone)]
pub struct KeySink {
    tx: Tx,
}

#[derive(Debug, Clone)]
enum Tx {
    Sweep(mpsc::Sender<Key>),
    /// Tagged with the fan-out call, whose holds the keys take over.
    Expand(mpsc::Sender<(u64, Key)>, u64),
}

/// The refresher stopped listening (it is shutting down); stop enumerating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkClosed;

impl fmt::Display for SinkClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the refresher stopped taking reconcile keys")
    }
}

impl std::error::Error for SinkClosed {}

impl KeySink {
    pub(crate) fn new(tx: mpsc::Sender<Key>) -> KeySink {
        KeySink { tx: Tx::Sweep(tx) }
    }

    pub(crate) fn expansion(tx: mpsc::Sender<(u64, Key)>, call: u64) -> KeySink {
        KeySink {
            tx: Tx::Expand(tx, call),
        }
    }

    /// Sends one key, waiting while the refresher catches up.
    pub async fn send(&self, key: Key) -> Result<(), SinkClosed> {
        match &self.tx {
            Tx::Sweep(tx) => tx.send(key).await.map_err(|_| SinkClosed),
            Tx::Expand(tx, call) => tx.send((*call, key)).await.map_err(|_| SinkClosed),
        }
    }
}

/// Adapts `Fn(Key) -> Future<Output = Result<(), E>>` to [`Rebuild`].
pub(crate) struct PerKey<F, Fut, E>(pub(crate) F, PhantomData<fn() -> (Fut, E)>);

impl<F, Fut, E> PerKey<F, Fut, E> {
    pub(crate) fn new(f: F) -> Self {
        PerKey(f, PhantomData)
    }
}

impl<F, Fut, E> Rebuild for PerKey<F, Fut, E>
where
    F: Fn(Key) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    fn rebuild<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<(), BoxError>> {
        // max_batch is 1, so there is exactly one key; run them in turn regardless.
        Box::pin(async move {
            for d in due {
                (self.0)(d.key.clone()).await.map_err(Into::into)?;
            }
            Ok(())
        })
    }
}

/// Adapts `Fn(Vec<Key>) -> Future<Output = Result<(), E>>` to [`Rebuild`].
pub(crate) struct Batched<F, Fut, E> {
    f: F,
    max: usize,
    _p: PhantomData<fn() -> (Fut, E)>,
}

impl<F, Fut, E> Batched<F, Fut, E> {
    pub(crate) fn new(max: usize, f: F) -> Self {
        Batched {
            f,
            max,
            _p: PhantomData,
        }
    }
}

impl<F, Fut, E> Rebuild for Batched<F, Fut, E>
where
    F: Fn(Vec<Key>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    fn rebuild<'a>(&'a self, due: &'a [Due]) -> BoxFuture<'a, Result<(), BoxError>> {
        let keys = due.iter().map(|d| d.key.clone()).collect();
        let fut = (self.f)(keys);
        Box::pin(async move { fut.await.map_err(Into::into) })
    }

    fn max_batch(&self) -> usize {
        self.max.max(1)
    }
}

/// Adapts `Fn() -> Future<Output = Result<Vec<Key>, E>>` to [`Enumerate`].
pub(crate) struct ListAll<F, Fut, E>(F, PhantomData<fn() -> (Fut, E)>);

impl<F, Fut, E> ListAll<F, Fut, E> {
    pub(crate) fn new(f: F) -> Self {
        ListAll(f, PhantomData)
    }
}

impl<F, Fut, E> Enumerate for ListAll<F, Fut, E>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<Key>, E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    fn enumerate(&self, sink: KeySink) -> BoxFuture<'_, Result<(), BoxError>> {
        let fut = (self.0)();
        Box::pin(async move {
            for key in fut.await.map_err(Into::into)? {
                sink.send(key).await?;
            }
            Ok(())
        })
    }
}
