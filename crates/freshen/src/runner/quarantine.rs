//! `Quarantine`: the run loop's side of the quarantine list — how many entries the
//! shared list has (the loop is its only writer) and which quarantined keys still hold
//! acknowledgements, oldest first, for `release_quarantined_after`.
//!
//! A quarantined key releases the acknowledgements it holds only when a reconcile sweep
//! will heal it; without one its transactions stay unconfirmed until a change to it
//! rebuilds it, or until [`Builder::release_quarantined_after`](crate::Builder) passes.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::Key;
use crate::shared::{Quarantined, Shared};
use crate::sweep::later;

pub(super) struct Quarantine {
    /// Quarantined keys holding acks, oldest first, for `release_quarantined_after`.
    holding: VecDeque<(std::time::Instant, Key)>,
    release_quarantined_after: Option<Duration>,
    /// Entries of the shared quarantine list (this loop is its only writer): a
    /// successful rebuild looks the key up there only when there are any, so the
    /// success path takes no lock in the usual case.
    quarantined: usize,
}

impl Quarantine {
    pub(super) fn new(release_quarantined_after: Option<Duration>) -> Quarantine {
        Quarantine {
            holding: VecDeque::new(),
            release_quarantined_after,
            quarantined: 0,
        }
    }

    /// Puts `entry` on the shared list (replacing its key's entry); true when its key
    /// was not there yet.
    pub(super) fn enter(&mut self, shared: &Shared, entry: Quarantined) -> bool {
        let mut q = shared.quarantine();
        let first = !q.contains_key(&entry.key);
        if first {
            self.quarantined += 1;
        }
        q.insert(entry.key.clone(), entry);
        first
    }

    /// `key`, quarantined since `now`, holds the acks of its transactions (once).
    pub(super) fn hold(&mut self, key: &Key, now: std::time::Instant) {
        if !self.holding.iter().any(|(_, k)| k == key) {
            self.holding.push_back((now, key.clone()));
        }
    }

    /// Removes `key` from the quarantine list; true when it was there.
    pub(super) fn leave(&mut self, shared: &Shared, key: &Key) -> bool {
        if self.quarantined == 0 {
            return false;
        }
        let was = shared.quarantine().remove(key).is_some();
        if was {
            self.quarantined -= 1;
            self.holding.retain(|(_, k)| k != key);
        }
        was
    }

    /// When the oldest hold passes `release_quarantined_after`.
    pub(super) fn next_release(&self) -> Option<Instant> {
        match (self.release_quarantined_after, self.holding.front()) {
            (Some(after), Some((since, _))) => Some(later(Instant::from_std(*since), after)),
            _ => None,
        }
    }

    /// The oldest hold, with how long it held, once it has held for the configured
    /// bound at `now`: it is no longer counted as holding. `None` when there is none.
    pub(super) fn expired(&mut self, now: std::time::Instant) -> Option<(Key, Duration)> {
        let after = self.release_quarantined_after?;
        let (since, _) = self.holding.front()?;
        let held = now.saturating_duration_since(*since);
        if held < after {
            return None;
        }
        let (_, key) = self.holding.pop_front().expect("front exists");
        Some((key, held))
    }

    /// `key`'s holds were released: its entry on the list says so.
    pub(super) fn released(&self, shared: &Shared, key: &Key) {
        if let Some(q) = shared.quarantine().get_mut(key) {
            q.holding = false;
        }
    }

    /// Quarantined keys holding acks.
    pub(super) fn holding(&self) -> usize {
        self.holding.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Instant, SystemTime};

    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn entry(key: &str, holding: bool) -> Quarantined {
        Quarantined {
            key: Key::new(key),
            since: SystemTime::UNIX_EPOCH,
            failures: 3,
            error: "boom".into(),
            holding,
        }
    }

    #[test]
    fn the_list_counts_each_key_once() {
        let shared = Shared::new(false);
        let mut q = Quarantine::new(None);
        assert!(
            !q.leave(&shared, &Key::new("a")),
            "an empty list is not looked at"
        );
        assert!(q.enter(&shared, entry("a", true)));
        assert!(
            !q.enter(&shared, entry("a", false)),
            "a second entry replaces it"
        );
        assert!(!shared.quarantine()[&Key::new("a")].holding);
        assert!(q.enter(&shared, entry("b", true)));
        assert_eq!(q.quarantined, 2);
        assert!(!q.leave(&shared, &Key::new("c")));
        assert!(q.leave(&shared, &Key::new("a")));
        assert!(!q.leave(&shared, &Key::new("a")));
        assert_eq!(q.quarantined, 1);
        assert_eq!(shared.quarantine().len(), 1);
    }

    #[test]
    fn a_key_holds_once_and_leaving_the_list_ends_its_hold() {
        let shared = Shared::new(false);
        let mut q = Quarantine::new(Some(10 * SEC));
        let t0 = Instant::now();
        q.enter(&shared, entry("a", true));
        q.hold(&Key::new("a"), t0);
        q.hold(&Key::new("a"), t0 + SEC);
        assert_eq!(q.holding(), 1);
        assert_eq!(
            q.next_release(),
            Some(tokio::time::Instant::from_std(t0 + 10 * SEC))
        );
        assert!(q.leave(&shared, &Key::new("a")));
        assert_eq!((q.holding(), q.next_release()), (0, None));
    }

    #[test]
    fn holds_expire_oldest_first_after_the_bound() {
        let mut q = Quarantine::new(Some(10 * SEC));
        let t0 = Instant::now();
        q.hold(&Key::new("a"), t0);
        q.hold(&Key::new("b"), t0 + 2 * SEC);
        assert_eq!(q.expired(t0 + 9 * SEC), None);
        assert_eq!(q.expired(t0 + 11 * SEC), Some((Key::new("a"), 11 * SEC)));
        assert_eq!(q.expired(t0 + 11 * SEC), None, "b held 9s only");
        assert_eq!(q.holding(), 1);
        assert_eq!(q.expired(t0 + 12 * SEC), Some((Key::new("b"), 10 * SEC)));
        assert_eq!(q.expired(t0 + 60 * SEC), None);
    }

    #[test]
    fn without_a_bound_holds_never_expire() {
        let mut q = Quarantine::new(None);
        let t0 = Instant::now();
        q.hold(&Key::new("a"), t0);
        assert_eq!(q.next_release(), None);
        assert_eq!(q.expired(t0 + 1_000_000 * SEC), None);
        assert_eq!(q.holding(), 1);
    }

    #[test]
    fn a_released_entry_no_longer_says_holding() {
        let shared = Shared::new(false);
        let mut q = Quarantine::new(None);
        q.enter(&shared, entry("a", true));
        q.released(&shared, &Key::new("a"));
        q.released(&shared, &Key::new("gone"));
        assert!(!shared.quarantine()[&Key::new("a")].holding);
    }
}
