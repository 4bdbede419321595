//! A view's unhealed gaps, kept across restarts (and reloads) in the target's
//! [`GapLedger`]. Only a view without a reconcile sweep has them: nothing finds the keys
//! a gap dirtied, so it stays 503 until a person rebuilds them and acknowledges it.
//!
//! The view's source is wrapped ([`GapKeeper::source`]): a batch carrying a gap that
//! concerns the view goes on only once the gap is recorded (retried until it is), so
//! the batch — and the source position past the gap — cannot be confirmed before the
//! gap is durable; at start the kept gaps come first, as a batch of their own, so the
//! view reports them again. Acknowledging forgets them in the ledger first
//! ([`GapKeeper::forget`]), then in the view.

use std::sync::Arc;
use std::time::Duration;

use freshen::plug::GapLedger;
use freshen::{Ack, Backoff, Batch, BoxError, BoxFuture, Capabilities, Gap, Jitter, Source};

use crate::config::View;

/// One view's gaps in the ledger.
pub struct GapKeeper {
    ledger: Arc<dyn GapLedger>,
    view: String,
    /// The tables the view declares (direct and fan-out entries).
    watched: Vec<(String, String)>,
    /// The kept gaps' lines until the refresher reports a gap itself (the kept ones come
    /// first, so by then it has them): the view shows these meanwhile, so a restart never
    /// looks healthy before the refresher has taken them in.
    pending: std::sync::Mutex<Vec<String>>,
}

impl std::fmt::Debug for GapKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GapKeeper")
            .field("view", &self.view)
            .finish_non_exhaustive()
    }
}

impl GapKeeper {
    /// The keeper of `view`'s gaps in `ledger`, when the view needs one (it has no
    /// reconcile sweep: a sweep would heal its gaps, at start too).
    pub fn for_view(ledger: &Arc<dyn GapLedger>, view: &View) -> Option<Arc<GapKeeper>> {
        // The refresher sweeps where the view has a reconcile that lists keys.
        view.reconcile_keys().is_none().then(|| {
            Arc::new(GapKeeper {
                ledger: ledger.clone(),
                view: view.name.clone(),
                watched: view
                    .watch
                    .iter()
                    .map(|w| (w.schema.clone(), w.table.clone()))
                    .collect(),
                pending: std::sync::Mutex::default(),
            })
        })
    }

    /// Whether `gap` concerns the view, as the refresher decides it (a gap of an unknown
    /// table concerns every view).
    pub fn concerns(&self, gap: &Gap) -> bool {
        gap.table.is_empty()
            || self
                .watched
                .iter()
                .any(|(s, t)| **s == *gap.schema && **t == *gap.table)
    }

    /// The gaps kept for the view.
    pub async fn load(&self) -> Result<Vec<Gap>, BoxError> {
        self.ledger.load(&self.view).await
    }

    /// Forgets the gaps a person acknowledged (their lines), before the view does.
    pub async fn forget(&self, lines: &[String]) -> Result<(), BoxError> {
        self.ledger.forget(&self.view, lines).await
    }

    /// What the view reports as unhealed, given what its refresher reports: the
    /// refresher's lines once it has any (the kept gaps are then among them), else the
    /// kept gaps it has not taken in yet.
    pub fn unhealed(&self, reported: Vec<String>) -> Vec<String> {
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if reported.is_empty() {
            pending.clone()
        } else {
            pending.clear();
            reported
        }
    }

    /// `inner` with `kept` coming first and every gap concerning the view recorded
    /// before its batch goes on.
    pub fn source(self: &Arc<Self>, inner: Box<dyn Source>, kept: Vec<Gap>) -> Box<dyn Source> {
        *self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            kept.iter().map(ToString::to_string).collect();
        Box::new(Keeping {
            inner,
            keeper: self.clone(),
            kept: (!kept.is_empty()).then_some(kept),
        })
    }

    /// Records `gaps`, retrying until the ledger takes them: an outage delays the
    /// view's batches, never drops a gap.
    async fn record(&self, gaps: &[Gap]) {
        let backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
        let mut jitter = Jitter::from_clock();
        let mut failures = 0u32;
        while let Err(e) = self.ledger.record(&self.view, gaps).await {
            tracing::warn!(view = %self.view, error = %e, "cannot keep an unhealed gap; the view's changes wait until it is kept");
            tokio::time::sleep(backoff.delay(failures, jitter.unit())).await;
            failures = failures.saturating_add(1);
        }
    }
}

/// A view's source with its gaps kept.
struct Keeping {
    inner: Box<dyn Source>,
    keeper: Arc<GapKeeper>,
    /// The gaps kept from before, until handed over.
    kept: Option<Vec<Gap>>,
}

impl Source for Keeping {
    fn next_batch(&mut self) -> BoxFuture<'_, Option<Result<Batch, freshen::SourceError>>> {
        Box::pin(async move {
            if let Some(kept) = self.kept.take() {
                tracing::warn!(view = %self.keeper.view, gaps = ?kept.iter().map(ToString::to_string).collect::<Vec<_>>(), "unhealed gaps kept from before: the view reports them until a person acknowledges them");
                return Some(Ok(Batch::new(Vec::new(), Ack::none()).with_gaps(kept)));
            }
            let batch = self.inner.next_batch().await?;
            if let Ok(b) = &batch {
                let gaps: Vec<Gap> = b
                    .gaps()
                    .iter()
                    .filter(|g| self.keeper.concerns(g))
                    .cloned()
                    .collect();
                if !gaps.is_empty() {
                    self.keeper.record(&gaps).await;
                }
            }
            Some(batch)
        })
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn close(&mut self) -> BoxFuture<'_, ()> {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::config::{Reconcile, Watch};

    /// A ledger in memory that fails its first `fail` records.
    #[derive(Default)]
    struct Memory {
        kept: Mutex<Vec<(String, Gap)>>,
        fail: Mutex<u32>,
    }

    impl GapLedger for Memory {
        fn load<'a>(&'a self, view: &'a str) -> BoxFuture<'a, Result<Vec<Gap>, BoxError>> {
            let kept = self.kept.lock().unwrap();
            let out = kept
                .iter()
                .filter(|(v, _)| v == view)
                .map(|(_, g)| g.clone())
                .collect();
            Box::pin(async move { Ok(out) })
        }

        fn record<'a>(
            &'a self,
            view: &'a str,
            gaps: &'a [Gap],
        ) -> BoxFuture<'a, Result<(), BoxError>> {
            Box::pin(async move {
                let mut fail = self.fail.lock().unwrap();
                if *fail > 0 {
                    *fail -= 1;
                    return Err("the database is down".into());
                }
                let mut kept = self.kept.lock().unwrap();
                for g in gaps {
                    kept.push((view.to_owned(), g.clone()));
                }
                Ok(())
            })
        }

        fn remove<'a>(
            &'a self,
            view: &'a str,
            gaps: &'a [Gap],
        ) -> BoxFuture<'a, Result<(), BoxError>> {
            self.kept
                .lock()
                .unwrap()
                .retain(|(v, g)| v != view || !gaps.contains(g));
            Box::pin(async { Ok(()) })
        }
    }

    fn view(reconcile: bool) -> View {
        let mut v = crate::scope::tests::view_with(vec![Watch {
            schema: "public".into(),
            table: "orders".into(),
            key: vec!["id".into()],
            keys: None,
            fixed_key: false,
            line: None,
        }]);
        if reconcile {
            v.reconcile = Some(Reconcile {
                every: Duration::from_secs(60),
                keys: Some("SELECT 1".into()),
                line: None,
            });
        }
        v
    }

    #[test]
    fn only_a_view_without_a_sweep_keeps_gaps_and_only_its_own() {
        let ledger: Arc<dyn GapLedger> = Arc::new(Memory::default());
        assert!(GapKeeper::for_view(&ledger, &view(true)).is_none());
        let k = GapKeeper::for_view(&ledger, &view(false)).unwrap();
        assert!(k.concerns(&Gap::new("public", "orders", "x")));
        assert!(k.concerns(&Gap::new("", "", "a table the source cannot name")));
        assert!(!k.concerns(&Gap::new("public", "other", "x")));
    }

    #[test]
    fn kept_gaps_show_until_the_refresher_reports_gaps_itself() {
        let ledger: Arc<dyn GapLedger> = Arc::new(Memory::default());
        let keeper = GapKeeper::for_view(&ledger, &view(false)).unwrap();
        let (_feed, inner) = freshen::channel(1);
        let kept = vec![Gap::new("public", "orders", "from before")];
        let _source = keeper.source(Box::new(inner), kept);
        let line = vec!["public.orders: from before".to_owned()];
        // Just after a start the refresher reports nothing yet: the view shows the kept.
        assert_eq!(keeper.unhealed(Vec::new()), line);
        assert_eq!(keeper.unhealed(Vec::new()), line, "as often as it is asked");
        // Once the refresher reports gaps, its lines are the view's, and stay so after
        // a person acknowledged them.
        let reported = vec!["public.orders: from before; minimal image".to_owned()];
        assert_eq!(keeper.unhealed(reported.clone()), reported);
        assert!(keeper.unhealed(Vec::new()).is_empty());
    }

    #[tokio::test]
    async fn a_batch_with_a_gap_goes_on_only_once_the_gap_is_kept() {
        let memory = Arc::new(Memory::default());
        *memory.fail.lock().unwrap() = 2;
        let ledger: Arc<dyn GapLedger> = memory.clone();
        let keeper = GapKeeper::for_view(&ledger, &view(false)).unwrap();
        let (feed, inner) = freshen::channel(4);
        let kept_before = vec![Gap::new("public", "orders", "from before")];
        let mut source = keeper.source(Box::new(inner), kept_before.clone());
        let first = source.next_batch().await.unwrap().unwrap();
        assert_eq!(first.gaps(), kept_before, "the kept gaps come first");
        assert!(first.events().is_empty());
        feed.send(Batch::new(Vec::new(), Ack::none()).with_gaps(vec![
            Gap::new("public", "orders", "minimal image"),
            Gap::new("public", "other", "not this view's"),
        ]))
        .await
        .unwrap();
        let b = source.next_batch().await.unwrap().unwrap();
        assert_eq!(b.gaps().len(), 2, "the batch goes on whole");
        assert_eq!(
            memory.kept.lock().unwrap().clone(),
            vec![(
                "v".to_owned(),
                Gap::new("public", "orders", "minimal image")
            )],
            "kept (after two failed tries) before the batch went on; only its own gap"
        );
        keeper
            .forget(&["public.orders: minimal image".to_owned()])
            .await
            .unwrap();
        assert!(keeper.load().await.unwrap().is_empty());
    }
}
