//! What `freshen run` does next, as pure state machines: [`run`](crate::run) does the
//! I/O (asks the source for the lease, starts and runs the pipeline, sleeps) and asks
//! these what follows each outcome. Three decisions, one per phase:
//!
//! - [`Standby`]: waiting for the lease (a second process on the same configuration);
//! - [`Restarts`]: which configuration to start after a start failed, a reload was
//!   accepted or the database went away, and how long to wait first;
//! - [`Reacquire`]: the lease was lost while active — take it again, or stop because
//!   another process holds it.
//!
//! ```text
//!                lease granted / not needed                 stop signal
//!   Standby ─────────────────────────────▶ Starting ──ok──▶ Running ──────────▶ exit 0
//!    │  ▲ held elsewhere: 1 s                │   ▲  ▲          │ reload accepted
//!    └──┘ unreachable (after a first         │   │  └──────────┘ (new file; the one that
//!         answer): 2 s, else exit            │   │               ran is kept as previous)
//!                                            │   │
//!          start failed, a reload was tried ─┤   ├─ back to the previous file (the new
//!                                            │   │  one set aside)
//!          start failed, something ran ──────┤   └─ after a wait (1 s doubling to 30 s),
//!                                            │      the set-aside file first
//!          start failed, nothing ran ────────┴──▶ exit with the error
//!
//!   Running, lease lost ─▶ Reacquire ─granted─▶ Running
//!                            ├─ held by this process's old session (within 10 s): retry
//!                            └─ held past the grace: another process took over ─▶ exit 1
//! ```
//!
//! | state of [`Restarts`] | start ok | start failed | stopped for a reload |
//! |---|---|---|---|
//! | trying a reload (`previous` set) | run it; forget the set-aside file | roll back to `previous`, set the new one aside, full start-up sweeps | — |
//! | something ran before | run it; reset the wait | wait, double the wait, then the set-aside file (if any) with the other as `previous` | — |
//! | nothing ran yet | run it | give up: the error ends `run` | — |
//! | running | — | — | start the new file; views whose configuration is unchanged skip their start-up sweep |

use std::time::{Duration, Instant};

use freshen::plug::Lease;

/// The source's answer to a request for the lease, as the decisions see it (the
/// granted lease's loss future stays with the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer<'a> {
    /// The source needs no arbiter.
    Unneeded,
    /// This process holds the lease.
    Granted,
    /// Another process does (as far as the upstream can tell).
    Held(&'a str),
    /// The source could not be asked.
    Unreachable,
}

impl<'a> Answer<'a> {
    /// What `answer` says.
    pub(crate) fn of<E>(answer: &'a Result<Lease, E>) -> Answer<'a> {
        match answer {
            Ok(Lease::Unneeded) => Answer::Unneeded,
            Ok(Lease::Granted(_)) => Answer::Granted,
            Ok(Lease::Held(who)) => Answer::Held(who),
            Err(_) => Answer::Unreachable,
        }
    }
}

/// The first wait before starting the pipeline again after it could not start.
pub(crate) const RESTART_FIRST_DELAY: Duration = Duration::from_secs(1);
/// The longest such wait.
pub(crate) const RESTART_MAX_DELAY: Duration = Duration::from_secs(30);
/// How often a standby asks for the lease: the takeover delay after the active process
/// dies.
pub(crate) const STANDBY_RETRY: Duration = Duration::from_secs(1);
/// How long to wait between tries when the upstream cannot be reached at all.
pub(crate) const UNREACHABLE_RETRY: Duration = Duration::from_secs(2);
/// How long a re-taken lease may show as held before this process concludes that
/// another one holds it.
pub(crate) const REACQUIRE_GRACE: Duration = Duration::from_secs(10);

/// The configurations `freshen run` moves between, generic over what a configuration is
/// (the tests use strings).
#[derive(Debug)]
pub(crate) struct Restarts<C> {
    /// What starts next.
    cfg: C,
    /// The configuration that ran before an accepted reload: where a failed start of
    /// the reloaded one goes back to.
    previous: Option<C>,
    /// A reloaded configuration that could not start, kept while the one before it
    /// cannot start either (a database outage): it is tried first again.
    unstarted: Option<C>,
    /// Views whose configuration the last reload left as it was: they skip the
    /// start-up sweep (they were right when the previous pipeline stopped).
    unchanged: Vec<String>,
    /// Whether any pipeline ran in this process.
    ran: bool,
    /// The next wait after a failed start.
    delay: Duration,
}

/// What follows a failed start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// The reloaded configuration cannot start: start the one that ran before, now.
    RollBack,
    /// What ran before cannot start again (most likely an outage): wait this long,
    /// then call [`Restarts::waited`] and start again.
    Wait(Duration),
    /// Nothing ever ran: the error is the outcome of `run`.
    GiveUp,
}

impl<C> Restarts<C> {
    /// Before the first start, with the file as read.
    pub(crate) fn new(cfg: C) -> Restarts<C> {
        Restarts {
            cfg,
            previous: None,
            unstarted: None,
            unchanged: Vec::new(),
            ran: false,
            delay: RESTART_FIRST_DELAY,
        }
    }

    /// A reload accepted before anything ran (while standing by): the latest file wins.
    pub(crate) fn reloaded_before_start(&mut self, cfg: C) {
        self.cfg = cfg;
    }

    /// The configuration to start now.
    pub(crate) fn config(&self) -> &C {
        &self.cfg
    }

    /// The views that may skip their start-up sweep in the start about to happen.
    pub(crate) fn unchanged(&self) -> &[String] {
        &self.unchanged
    }

    /// The pipeline of [`config`](Self::config) started: it is what runs now, and what
    /// a failed start of a later reload goes back to.
    pub(crate) fn started(&mut self) {
        self.delay = RESTART_FIRST_DELAY;
        self.unstarted = None;
        self.previous = None;
        self.ran = true;
    }

    /// The pipeline of [`config`](Self::config) did not start.
    pub(crate) fn failed(&mut self) -> AfterFailure {
        if let Some(previous) = self.previous.take() {
            self.unstarted = Some(std::mem::replace(&mut self.cfg, previous));
            // The previous configuration's views were not stopped as they were: sweep.
            self.unchanged.clear();
            return AfterFailure::RollBack;
        }
        if !self.ran {
            return AfterFailure::GiveUp;
        }
        let wait = self.delay;
        self.delay = (self.delay * 2).min(RESTART_MAX_DELAY);
        AfterFailure::Wait(wait)
    }

    /// The wait of [`AfterFailure::Wait`] is over: the newest accepted configuration is
    /// tried first.
    pub(crate) fn waited(&mut self) {
        if let Some(new) = self.unstarted.take() {
            self.previous = Some(std::mem::replace(&mut self.cfg, new));
        }
    }

    /// The running pipeline stopped for an accepted reload to `cfg`, which leaves the
    /// views named in `unchanged` as they were.
    pub(crate) fn reloaded(&mut self, cfg: C, unchanged: Vec<String>) {
        self.unchanged = unchanged;
        self.previous = Some(std::mem::replace(&mut self.cfg, cfg));
    }
}

/// What a process waiting for the lease does with the source's answer.
#[derive(Debug, Default)]
pub(crate) struct Standby {
    /// The process announced as active (logged once per holder).
    announced: Option<String>,
}

/// What follows one answer to a standby's request for the lease.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StandbyStep {
    /// Active now. `took_over`: a process was active before and is gone.
    Lead {
        /// Whether this process waited as a standby first.
        took_over: bool,
    },
    /// Another process holds the lease: stand by and ask again after the delay.
    /// `announce`: the holder is new to this process (log it once).
    Wait {
        /// Who holds it.
        holder: String,
        /// Whether to say so in the log.
        announce: bool,
        /// When to ask again.
        after: Duration,
    },
    /// The source cannot be asked now; ask again after the delay.
    Retry(Duration),
    /// Unusable from the start (unreachable, wrong password, bad URL): fail as starting
    /// the pipeline would.
    Fail,
}

impl Standby {
    /// The source answered.
    pub(crate) fn answered(&mut self, answer: Answer<'_>) -> StandbyStep {
        match answer {
            Answer::Unneeded => StandbyStep::Lead { took_over: false },
            Answer::Granted => StandbyStep::Lead {
                took_over: self.announced.is_some(),
            },
            Answer::Held(who) => {
                let announce = self.announced.as_deref() != Some(who);
                if announce {
                    self.announced = Some(who.to_owned());
                }
                StandbyStep::Wait {
                    holder: who.to_owned(),
                    announce,
                    after: STANDBY_RETRY,
                }
            }
            // A standby that loses the database retries; a process that never had an
            // answer fails.
            Answer::Unreachable if self.announced.is_none() => StandbyStep::Fail,
            Answer::Unreachable => StandbyStep::Retry(UNREACHABLE_RETRY),
        }
    }
}

/// The lease was lost while active: try to take it again, until a deadline after which
/// a holder is another process.
#[derive(Debug)]
pub(crate) struct Reacquire {
    /// The lease may still show as held by this process's own previous session until
    /// the server has noticed that session end (a probe that timed out on a slow
    /// server, a socket not yet closed): only a holder that stays past this is another
    /// process.
    grace_until: Instant,
}

/// What follows one answer while taking a lost lease again.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReacquireStep {
    /// Held again: active as before.
    Held,
    /// The source needs no lease any more: nothing to keep.
    Unneeded,
    /// Ask again after the delay.
    Retry(Duration),
    /// Another process holds it: this one must stop.
    TakenBy(String),
}

impl Reacquire {
    /// The lease was lost at `now`.
    pub(crate) fn lost_at(now: Instant) -> Reacquire {
        Reacquire {
            grace_until: now + REACQUIRE_GRACE,
        }
    }

    /// The source answered `answer` at `now`.
    pub(crate) fn answered(&self, answer: Answer<'_>, now: Instant) -> ReacquireStep {
        match answer {
            Answer::Granted => ReacquireStep::Held,
            Answer::Unneeded => ReacquireStep::Unneeded,
            Answer::Held(_) if now < self.grace_until => ReacquireStep::Retry(STANDBY_RETRY),
            Answer::Held(who) => ReacquireStep::TakenBy(who.to_owned()),
            Answer::Unreachable => ReacquireStep::Retry(UNREACHABLE_RETRY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restarts() -> Restarts<&'static str> {
        Restarts::new("a")
    }

    #[test]
    fn a_first_start_that_fails_gives_up() {
        let mut r = restarts();
        assert_eq!(r.failed(), AfterFailure::GiveUp);
        assert_eq!(*r.config(), "a");
    }

    #[test]
    fn a_reload_while_standing_by_replaces_the_file_and_keeps_no_previous() {
        let mut r = restarts();
        r.reloaded_before_start("b");
        r.reloaded_before_start("c");
        assert_eq!(*r.config(), "c");
        // Nothing ran and nothing to go back to: the error ends the run.
        assert_eq!(r.failed(), AfterFailure::GiveUp);
    }

    #[test]
    fn an_outage_waits_doubling_to_the_cap_and_resets_after_a_start() {
        let mut r = restarts();
        r.started();
        let mut waits = Vec::new();
        for _ in 0..7 {
            match r.failed() {
                AfterFailure::Wait(d) => waits.push(d.as_secs()),
                other => panic!("expected a wait, got {other:?}"),
            }
            r.waited();
            assert_eq!(*r.config(), "a");
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        r.started();
        assert_eq!(r.failed(), AfterFailure::Wait(RESTART_FIRST_DELAY));
    }

    #[test]
    fn a_reload_that_cannot_start_rolls_back_with_full_sweeps() {
        let mut r = restarts();
        r.started();
        r.reloaded("b", vec!["v1".into()]);
        assert_eq!(*r.config(), "b");
        assert_eq!(r.unchanged(), ["v1".to_string()]);
        assert_eq!(r.failed(), AfterFailure::RollBack);
        assert_eq!(*r.config(), "a");
        assert!(r.unchanged().is_empty(), "the rolled-back views sweep");
        r.started();
        // The set-aside file is forgotten once the previous one runs.
        r.reloaded("c", Vec::new());
        assert_eq!(r.failed(), AfterFailure::RollBack);
        assert_eq!(*r.config(), "a");
    }

    #[test]
    fn during_an_outage_the_newest_accepted_file_is_tried_first_then_the_old_one() {
        let mut r = restarts();
        r.started();
        r.reloaded("b", Vec::new());
        // b fails: back to a, which fails too (the database is down).
        assert_eq!(r.failed(), AfterFailure::RollBack);
        assert_eq!(r.failed(), AfterFailure::Wait(Duration::from_secs(1)));
        r.waited();
        assert_eq!(*r.config(), "b", "the newest accepted file first");
        assert_eq!(r.failed(), AfterFailure::RollBack);
        assert_eq!(*r.config(), "a");
        assert_eq!(r.failed(), AfterFailure::Wait(Duration::from_secs(2)));
        r.waited();
        assert_eq!(*r.config(), "b");
        r.started();
        assert_eq!(*r.config(), "b");
        // b ran: a later failure without a reload waits instead of rolling back.
        assert_eq!(r.failed(), AfterFailure::Wait(RESTART_FIRST_DELAY));
    }

    #[test]
    fn a_rolled_back_start_that_runs_forgets_the_set_aside_file() {
        let mut r = restarts();
        r.started();
        r.reloaded("b", Vec::new());
        assert_eq!(r.failed(), AfterFailure::RollBack);
        r.started();
        assert_eq!(*r.config(), "a");
        assert_eq!(r.failed(), AfterFailure::Wait(RESTART_FIRST_DELAY));
        r.waited();
        assert_eq!(*r.config(), "a", "b was dropped when a started");
    }

    #[test]
    fn a_standby_announces_each_holder_once_and_takes_over_when_granted() {
        let mut s = Standby::default();
        let step = s.answered(Answer::Held("p1"));
        assert_eq!(
            step,
            StandbyStep::Wait {
                holder: "p1".into(),
                announce: true,
                after: STANDBY_RETRY
            }
        );
        let again = s.answered(Answer::Held("p1"));
        assert!(matches!(
            again,
            StandbyStep::Wait {
                announce: false,
                ..
            }
        ));
        let other = s.answered(Answer::Held("p2"));
        assert!(matches!(other, StandbyStep::Wait { announce: true, .. }));
        // A standby that loses the database keeps waiting.
        assert_eq!(
            s.answered(Answer::Unreachable),
            StandbyStep::Retry(UNREACHABLE_RETRY)
        );
        assert_eq!(
            s.answered(Answer::Granted),
            StandbyStep::Lead { took_over: true }
        );
    }

    #[test]
    fn a_first_answer_decides_without_waiting() {
        assert_eq!(
            Standby::default().answered(Answer::Granted),
            StandbyStep::Lead { took_over: false }
        );
        assert_eq!(
            Standby::default().answered(Answer::Unneeded),
            StandbyStep::Lead { took_over: false }
        );
        assert_eq!(
            Standby::default().answered(Answer::Unreachable),
            StandbyStep::Fail
        );
    }

    #[test]
    fn a_lost_lease_is_taken_again_and_only_a_lasting_holder_is_another_process() {
        let t0 = Instant::now();
        let r = Reacquire::lost_at(t0);
        let held = Answer::Held("p2");
        assert_eq!(r.answered(held, t0), ReacquireStep::Retry(STANDBY_RETRY));
        assert_eq!(
            r.answered(held, t0 + REACQUIRE_GRACE - Duration::from_millis(1)),
            ReacquireStep::Retry(STANDBY_RETRY)
        );
        assert_eq!(
            r.answered(held, t0 + REACQUIRE_GRACE),
            ReacquireStep::TakenBy("p2".into())
        );
        assert_eq!(
            r.answered(Answer::Unreachable, t0 + REACQUIRE_GRACE * 2),
            ReacquireStep::Retry(UNREACHABLE_RETRY)
        );
        assert_eq!(
            r.answered(Answer::Granted, t0 + REACQUIRE_GRACE * 2),
            ReacquireStep::Held
        );
        assert_eq!(r.answered(Answer::Unneeded, t0), ReacquireStep::Unneeded);
    }
}
