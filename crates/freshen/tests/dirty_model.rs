//! DirtySet against a deliberately simple reference model: a list scanned on every
//! operation (what the Go original does). Random operation sequences must agree on what
//! fires when.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use freshen::{Backoff, Completion, DirtyConfig, DirtySet, Key, Mark};
use proptest::prelude::*;

const CO: u64 = 10;
const MAX_WAIT: u64 = 40;
const POISON_AFTER: u32 = 3;

#[derive(Debug, Clone)]
enum St {
    /// `floor`: a key re-queued after its rebuild never fires before the rebuild ended.
    Dirty {
        first: u64,
        last: u64,
        floor: u64,
    },
    Backoff {
        first: u64,
        at: u64,
    },
    Running {
        job_first: u64,
        redirty: Option<(u64, u64)>,
    },
    Poisoned,
}

#[derive(Debug, Clone)]
struct Entry {
    st: St,
    failures: u32,
}

#[derive(Default)]
struct Model {
    keys: HashMap<u8, Entry>,
}

impl Model {
    fn deadline(e: &Entry) -> Option<u64> {
        match e.st {
            St::Dirty { first, last, floor } => Some((last + CO).min(first + MAX_WAIT).max(floor)),
            St::Backoff { at, .. } => Some(at),
            _ => None,
        }
    }

    fn mark(&mut self, k: u8, now: u64, revive: bool) -> Mark {
        let Some(e) = self.keys.get_mut(&k) else {
            self.keys.insert(
                k,
                Entry {
                    st: St::Dirty {
                        first: now,
                        last: now,
                        floor: 0,
                    },
                    failures: 0,
                },
            );
            return Mark::Queued;
        };
        match &mut e.st {
            St::Dirty { last, .. } => {
                *last = now;
                Mark::Pending
            }
            St::Backoff { .. } => Mark::Pending,
            St::Running { redirty, .. } => {
                match redirty {
                    Some((_, last)) => *last = now,
                    None => *redirty = Some((now, now)),
                }
                Mark::Redirtied
            }
            St::Poisoned if revive => {
                *e = Entry {
                    st: St::Dirty {
                        first: now,
                        last: now,
                        floor: 0,
                    },
                    failures: 0,
                };
                Mark::Revived
            }
            St::Poisoned => Mark::Ignored,
        }
    }

    /// Keys due at `now` with the earliest deadline among them.
    fn earliest_due(&self, now: u64) -> (Option<u64>, Vec<u8>) {
        let min = self.keys.values().filter_map(Self::deadline).min();
        let due = match min {
            Some(d) if d <= now => self
                .keys
                .iter()
                .filter(|(_, e)| Self::deadline(e) == Some(d))
                .map(|(k, _)| *k)
                .collect(),
            _ => Vec::new(),
        };
        (min, due)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Mark(u8),
    Revive(u8),
    Advance(u64),
    Pop,
    Complete { which: usize, ok: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6).prop_map(Op::Mark),
        1 => (0u8..6).prop_map(Op::Revive),
        3 => (0u64..25).prop_map(Op::Advance),
        3 => Just(Op::Pop),
        3 => (0usize..6, proptest::bool::weighted(0.6)).prop_map(|(which, ok)| Op::Complete { which, ok }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn dirty_set_agrees_with_the_scan_model(ops in proptest::collection::vec(op(), 1..300)) {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let cfg = DirtyConfig {
            coalesce: Duration::from_millis(CO),
            max_wait: Duration::from_millis(MAX_WAIT),
            backoff: Backoff::new(Duration::from_millis(4), Duration::from_millis(30)),
            poison_after: POISON_AFTER,
            seed: 99,
        };
        let mut set = DirtySet::new(cfg, t0);
        let mut model = Model::default();
        let mut now = 0u64;
        let mut running: Vec<u8> = Vec::new();
        let key = |k: u8| Key::from(format!("k{k}"));

        for op in ops {
            match op {
                Op::Mark(k) => prop_assert_eq!(set.mark(&key(k), ms(now)), model.mark(k, now, false)),
                Op::Revive(k) => prop_assert_eq!(set.revive(&key(k), ms(now)), model.mark(k, now, true)),
                Op::Advance(d) => now += d,
                Op::Pop => {
                    let (_, due) = model.earliest_due(now);
                    match set.pop_ready(ms(now)) {
                        None => prop_assert!(due.is_empty(), "model has {:?} due at {}", due, now),
                        Some(r) => {
                            let k: u8 = r.key.to_string()[1..].parse().unwrap();
                            prop_assert!(due.contains(&k), "popped {} but model's earliest due are {:?}", k, due);
                            let e = model.keys.get_mut(&k).unwrap();
                            let first = match e.st {
                                St::Dirty { first, .. } | St::Backoff { first, .. } => first,
                                _ => unreachable!(),
                            };
                            prop_assert_eq!(r.first_dirty, ms(first));
                            prop_assert_eq!(r.failures, e.failures);
                            e.st = St::Running { job_first: first, redirty: None };
                            running.push(k);
                        }
                    }
                }
                Op::Complete { which, ok } => {
                    if running.is_empty() {
                        continue;
                    }
                    let k = running.remove(which % running.len());
                    let got = set.complete(&key(k), ok, ms(now));
                    let e = model.keys.get_mut(&k).unwrap();
                    let St::Running { job_first, redirty } = e.st.clone() else { unreachable!() };
                    if ok {
                        e.failures = 0;
                        match redirty {
                            None => {
                                model.keys.remove(&k);
                                prop_assert_eq!(got, Completion::Clean);
                            }
                            Some((first, last)) => {
                                e.st = St::Dirty { first, last, floor: now };
                                prop_assert_eq!(got, Completion::Requeued);
                            }
                        }
                    } else {
                        e.failures += 1;
                        if e.failures >= POISON_AFTER {
                            e.st = St::Poisoned;
                            prop_assert_eq!(got, Completion::Poisoned);
                        } else {
                            let Completion::Retry { at, failures } = got else {
                                return Err(TestCaseError::fail(format!("expected retry, got {got:?}")));
                            };
                            prop_assert_eq!(failures, e.failures);
                            let ceiling = cfg.backoff.ceiling(failures);
                            let delay = at - ms(now);
                            prop_assert!(delay >= ceiling / 2 && delay <= ceiling, "delay {:?}", delay);
                            // Adopt the jittered retry time (rounded like the set's clock).
                            let at_ms = now + delay.as_millis() as u64;
                            let exact = delay.as_nanos() % 1_000_000 == 0;
                            // The model counts whole milliseconds: a sub-millisecond retry time
                            // is due at the next millisecond, in both.
                            e.st = St::Backoff { first: job_first, at: if exact { at_ms } else { at_ms + 1 } };
                        }
                    }
                }
            }
            // Invariants after every step.
            let (min, _) = model.earliest_due(u64::MAX);
            let next = set.next_deadline();
            match (min, next) {
                (None, None) => {}
                (Some(m), Some(n)) => {
                    let n_ms = (n - t0).as_nanos().div_ceil(1_000_000) as u64;
                    prop_assert_eq!(m, n_ms, "next deadline");
                }
                (m, n) => prop_assert!(false, "next deadline: model {:?}, set {:?}", m, n),
            }
            let queued = model.keys.values().filter(|e| matches!(e.st, St::Dirty { .. } | St::Backoff { .. })).count();
            let poisoned = model.keys.values().filter(|e| matches!(e.st, St::Poisoned)).count();
            prop_assert_eq!(set.queued(), queued);
            prop_assert_eq!(set.running(), running.len());
            prop_assert_eq!(set.poisoned(), poisoned);
        }
    }
}
