//! The cursor of a polled table, without I/O: where the next page starts, which part of
//! the table must be read again because transactions that could still write into it
//! were running, and how far the durable cursor may move. Shared by the incremental
//! sources (`postgres-incremental`, `mysql-incremental`): pure, so it is tested without
//! a database.
//!
//! ```text
//!   ───────────────────────┬──────────────────────────┬──────────────────►  (cursor, pk)
//!        final (stored)    safe      pending           high     new rows
//!                          └─ re-read each poll, only ─┘
//!                             rows written by xid ≥ the
//!                             previous poll's xmin
//! ```
//!
//! Each poll reads in one REPEATABLE READ snapshot `S` with `xmin` (the oldest
//! transaction still running) and `xmax` (the next transaction id). A row that commits
//! late with a cursor value below `high` is one whose transaction was running (or not
//! yet begun) when an earlier poll read that range. Such a transaction's id is at least
//! that poll's `xmin`, so re-reading `(safe, high]` for rows written by
//! `xid ≥ previous xmin` finds it once it commits, and nothing visible earlier is
//! handed over again except rows of transactions that ended between `xmin` and `xmax`
//! (a subtransaction's id is not in `pg_current_snapshot()`'s list, so the exact set
//! cannot be told from SQL: a duplicate doorbell is harmless, a lost one is not).
//!
//! After each poll a `Mark` records `high`. It becomes final — `safe` moves to it —
//! once `lookback` has passed since it was taken *and* every transaction that had an id
//! by then has ended: its `xmax` is stamped at the first poll at least `lookback` after
//! the mark, and the mark is final at a poll whose `xmin` reaches that `xmax`. The
//! lookback covers what transaction ids cannot: a cursor value fixed before the
//! transaction got its id (`now()` is the transaction's *start*; its first write may
//! come later) and writers whose clocks lag.
//!
//! # Without a transaction horizon (MySQL, MariaDB)
//!
//! A server that does not expose its snapshot's transaction ids polls with
//! [`Horizon::NONE`]: every mark becomes final once `lookback` has passed, and the
//! re-read returns every row of the pending range (no writer filter), so the source
//! drops rows it handed over already with [`Handed`]. A row committed late with an
//! earlier cursor value is then found only if its transaction commits within `lookback`
//! of the poll that first read past that value — a longer transaction's row is missed.

use std::collections::VecDeque;
use std::time::Duration;

/// A keyset position: the cursor column's value, then the primary key's, as their
/// output text (read back with each type's input function).
pub type Position = Vec<String>;

/// What a poll's snapshot says about running transactions (`pg_current_snapshot()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Horizon {
    /// The oldest transaction still running (every id below it has ended).
    pub xmin: u64,
    /// The next transaction id to be assigned (no id at or above it had begun).
    pub xmax: u64,
}

impl Horizon {
    /// No transaction ids known: marks become final on `lookback` alone, and re-reads
    /// return every row of the range (`writers_from` is 0).
    pub const NONE: Horizon = Horizon { xmin: 0, xmax: 0 };
}

/// A range to read again in this poll's snapshot: rows after `after` (from the start
/// when `None`) up to and including `upto`, written by a transaction whose full id is
/// at least `writers_from`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reread {
    /// Exclusive lower bound (`None`: the table's start).
    pub after: Option<Position>,
    /// Inclusive upper bound.
    pub upto: Position,
    /// Rows written by older transactions were handed over already.
    pub writers_from: u64,
}

/// A read position waiting to become final.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mark {
    high: Position,
    /// When it was taken (the caller's monotonic clock).
    at: Duration,
    /// The `xmax` every transaction must end below before the mark is final; stamped at
    /// the first poll at least `lookback` after `at`.
    xmax: Option<u64>,
}

/// Most marks kept while a long transaction holds them all back; beyond it the newest
/// two merge (the later one kept), which only delays how soon `safe` moves.
const MAX_MARKS: usize = 1024;

/// The cursor of one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    safe: Option<Position>,
    high: Option<Position>,
    /// The previous poll's `xmin`: everything in `(safe, high]` visible then was handed
    /// over. `None` before the first poll (nothing pending).
    seen_xmin: Option<u64>,
    marks: VecDeque<Mark>,
    lookback: Duration,
}

impl Cursor {
    /// A cursor resuming after `stored` (the table's start when `None`): everything at
    /// or before it was handed over and rebuilt.
    pub fn resume(stored: Option<Position>, lookback: Duration) -> Cursor {
        Cursor {
            high: stored.clone(),
            safe: stored,
            seen_xmin: None,
            marks: VecDeque::new(),
            lookback,
        }
    }

    /// The durable position: every row at or before it was handed over, and nothing
    /// still running can write there (within `lookback`).
    pub fn safe(&self) -> Option<&Position> {
        self.safe.as_ref()
    }

    /// Where new rows start (exclusive).
    pub fn high(&self) -> Option<&Position> {
        self.high.as_ref()
    }

    /// Read positions taken and not yet final.
    pub fn pending_marks(&self) -> usize {
        self.marks.len()
    }

    /// What this poll must read again before reading new rows; `None` when nothing is
    /// pending.
    pub fn reread(&self) -> Option<Reread> {
        let writers_from = self.seen_xmin?;
        let upto = self.high.clone()?;
        if self.safe.as_ref() == Some(&upto) {
            return None;
        }
        Some(Reread {
            after: self.safe.clone(),
            upto,
            writers_from,
        })
    }

    /// A page of new rows was read up to `last` (the page's last row's position).
    pub fn advance(&mut self, last: Position) {
        self.high = Some(last);
    }

    /// Ends a poll read under `snapshot` at `now`, after the re-read and the new pages:
    /// finalizes what may be final and marks `high`. Returns the new `safe` when it moved.
    pub fn end_poll(&mut self, snapshot: Horizon, now: Duration) -> Option<Position> {
        self.mark(snapshot, now);
        // A mark stamped with this very snapshot is final when nothing ran: the snapshot
        // saw every transaction that had an id, and this poll read what they wrote.
        let mut moved = None;
        while let Some(front) = self.marks.front() {
            match front.xmax {
                Some(x) if x <= snapshot.xmin => moved = self.marks.pop_front(),
                _ => break,
            }
        }
        self.seen_xmin = Some(snapshot.xmin);
        let moved = moved?.high;
        self.safe = Some(moved.clone());
        Some(moved)
    }

    /// Ends a poll that read new pages but skipped the pending range's re-read (a
    /// catch-up poll following another at once): nothing becomes final, and what the
    /// pending range's re-read must still find is kept (the previous `xmin` stays, and it
    /// is at most this snapshot's, so rows this poll could not see are covered too).
    pub fn end_catch_up(&mut self, snapshot: Horizon, now: Duration) {
        self.mark(snapshot, now);
        // Before the first poll nothing was pending: this poll saw all it read.
        if self.seen_xmin.is_none() {
            self.seen_xmin = Some(snapshot.xmin);
        }
    }

    /// Marks `high` if it moved, and stamps the marks `lookback` old.
    fn mark(&mut self, snapshot: Horizon, now: Duration) {
        if let Some(high) = &self.high {
            let known = self.marks.back().map(|m| &m.high).or(self.safe.as_ref());
            if known != Some(high) {
                self.marks.push_back(Mark {
                    high: high.clone(),
                    at: now,
                    xmax: None,
                });
                if self.marks.len() > MAX_MARKS {
                    let n = self.marks.len();
                    self.marks.remove(n - 2);
                }
            }
        }
        for m in self.marks.iter_mut() {
            if m.xmax.is_none() && m.at + self.lookback <= now {
                m.xmax = Some(snapshot.xmax);
            }
        }
    }
}

/// The positions handed over since the durable cursor, for a source whose re-read
/// cannot filter by writer ([`Horizon::NONE`]): a row of the pending range read again
/// is handed over only if its position is new (a late commit, or the row updated with a
/// new cursor value), never once per poll. Memory: the rows read within the pending
/// range (those of the last `lookback`, and of a catch-up until its marks are final).
///
/// Positions compare as text only for equality; what may be forgotten is known by poll
/// (a poll's rows all lie at or below its `high`), so no order of text is needed.
#[derive(Debug, Default, Clone)]
pub struct Handed {
    /// Each position handed over, with the number of the poll that handed it.
    seen: std::collections::HashMap<Position, u64>,
    /// The poll under way.
    poll: u64,
    /// Ended polls still holding positions, oldest first: number and `high` at its end.
    ends: VecDeque<(u64, Option<Position>)>,
}

impl Handed {
    /// Nothing handed over yet.
    pub fn new() -> Handed {
        Handed::default()
    }

    /// Whether `position` is new since the durable cursor; records it (in the poll
    /// under way) when it is.
    pub fn first_time(&mut self, position: &Position) -> bool {
        if self.seen.contains_key(position) {
            return false;
        }
        self.seen.insert(position.clone(), self.poll);
        true
    }

    /// Ends the poll under way at `high`, then forgets what polls up to the last one
    /// that ended at `safe` (the durable cursor, when it moved) handed over: a poll's
    /// rows all lie at or below its `high`, and the re-read starts after `safe`.
    pub fn end_poll(&mut self, high: Option<&Position>, safe: Option<&Position>) {
        // Polls ending where the previous one did are one (a quiet table adds nothing).
        match self.ends.back_mut() {
            Some((n, h)) if h.as_ref() == high => *n = self.poll,
            _ => self.ends.push_back((self.poll, high.cloned())),
        }
        self.poll += 1;
        let Some(safe) = safe else { return };
        let Some(i) = self
            .ends
            .iter()
            .rposition(|(_, h)| h.as_ref() == Some(safe))
        else {
            return;
        };
        let upto = self.ends[i].0;
        self.ends.drain(..=i);
        self.seen.retain(|_, poll| *poll > upto);
    }

    /// Positions remembered.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Position {
        vec![s.to_string(), "1".to_string()]
    }

    fn h(xmin: u64, xmax: u64) -> Horizon {
        Horizon { xmin, xmax }
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_quiet_database_makes_every_poll_final_at_once() {
        let mut c = Cursor::resume(None, Duration::ZERO);
        assert_eq!(c.reread(), None, "nothing pending before the first poll");
        c.advance(p("10"));
        assert_eq!(c.end_poll(h(50, 50), S), Some(p("10")));
        assert_eq!(c.reread(), None, "nothing pending once safe == high");
        assert_eq!(c.pending_marks(), 0);
    }

    #[test]
    fn a_running_transaction_holds_the_cursor_and_its_range_is_read_again() {
        let mut c = Cursor::resume(Some(p("5")), Duration::ZERO);
        c.advance(p("10"));
        // Transaction 40 runs: it may commit a row below 10 later.
        assert_eq!(c.end_poll(h(40, 45), S), None);
        assert_eq!(c.safe(), Some(&p("5")));
        assert_eq!(
            c.reread(),
            Some(Reread {
                after: Some(p("5")),
                upto: p("10"),
                writers_from: 40
            })
        );
        // Still running at the next poll (which read more).
        c.advance(p("20"));
        assert_eq!(c.end_poll(h(40, 48), 2 * S), None);
        assert_eq!(c.reread().unwrap().after, Some(p("5")));
        assert_eq!(c.reread().unwrap().upto, p("20"));
        // 40 ended; 46 (begun after the first mark) still runs: the first mark is final.
        assert_eq!(c.end_poll(h(46, 50), 3 * S), Some(p("10")));
        assert_eq!(c.reread().unwrap().writers_from, 46);
        // Everything below 48 ended: the second mark is final too.
        assert_eq!(c.end_poll(h(48, 50), 4 * S), Some(p("20")));
        assert_eq!(c.reread(), None);
    }

    #[test]
    fn lookback_holds_a_mark_until_it_has_passed_and_then_waits_for_its_transactions() {
        let mut c = Cursor::resume(None, 5 * S);
        c.advance(p("10"));
        assert_eq!(c.end_poll(h(30, 30), S), None, "younger than the lookback");
        assert_eq!(c.end_poll(h(31, 31), 3 * S), None);
        assert!(c.reread().is_some(), "the window is read again meanwhile");
        // Old enough: stamped with this snapshot's xmax (35), and 33 still runs.
        assert_eq!(c.end_poll(h(33, 35), 6 * S), None);
        assert_eq!(c.end_poll(h(34, 36), 7 * S), None);
        assert_eq!(c.end_poll(h(35, 36), 8 * S), Some(p("10")));
    }

    #[test]
    fn a_poll_without_new_rows_adds_no_mark() {
        let mut c = Cursor::resume(None, Duration::ZERO);
        c.advance(p("10"));
        c.end_poll(h(40, 45), S);
        c.end_poll(h(40, 46), 2 * S);
        c.end_poll(h(40, 47), 3 * S);
        assert_eq!(c.pending_marks(), 1);
        assert_eq!(c.end_poll(h(45, 47), 4 * S), Some(p("10")));
    }

    #[test]
    fn marks_stay_bounded_under_a_transaction_that_never_ends() {
        let mut c = Cursor::resume(None, Duration::ZERO);
        for i in 0..5000u64 {
            c.advance(p(&format!("{i:06}")));
            assert_eq!(c.end_poll(h(7, 100 + i), S * i as u32), None);
        }
        assert_eq!(c.pending_marks(), MAX_MARKS, "bounded, and no tighter");
        assert_eq!(c.safe(), None, "nothing is final while transaction 7 runs");
        assert_eq!(c.reread().unwrap().writers_from, 7);
        // It ends: everything read becomes final in one step.
        assert_eq!(c.end_poll(h(6000, 6000), S * 6000), Some(p("004999")));
    }

    #[test]
    fn a_catch_up_poll_that_skips_the_reread_finalizes_nothing_and_keeps_the_old_xmin() {
        let mut c = Cursor::resume(None, Duration::ZERO);
        c.advance(p("10"));
        assert_eq!(c.end_poll(h(40, 45), S), None);
        // A burst: new pages only, in a snapshot where 40 has ended.
        c.advance(p("20"));
        c.end_catch_up(h(44, 46), 2 * S);
        assert_eq!(c.safe(), None, "nothing final without the re-read");
        let r = c.reread().unwrap();
        assert_eq!((r.after, r.upto, r.writers_from), (None, p("20"), 40));
        // The next full poll re-reads from 40's horizon, then both marks can be final.
        assert_eq!(c.end_poll(h(46, 46), 3 * S), Some(p("20")));
    }

    #[test]
    fn a_catch_up_poll_marks_what_it_read_when_it_read_it() {
        let none = Horizon::NONE;
        let mut c = Cursor::resume(None, 5 * S);
        c.advance(p("10"));
        c.end_catch_up(none, S);
        assert_eq!(c.pending_marks(), 1);
        // The lookback runs from the catch-up poll (1 s), not from the next full one.
        assert_eq!(c.end_poll(none, 6 * S), Some(p("10")));
    }

    #[test]
    fn resuming_pends_nothing_until_read() {
        let c = Cursor::resume(Some(p("9")), S);
        assert_eq!(c.safe(), Some(&p("9")));
        assert_eq!(c.high(), Some(&p("9")));
        assert_eq!(c.reread(), None);
    }

    #[test]
    fn without_a_horizon_a_mark_is_final_once_the_lookback_has_passed() {
        let none = Horizon::NONE;
        let mut c = Cursor::resume(None, 5 * S);
        c.advance(p("10"));
        assert_eq!(c.end_poll(none, S), None);
        let r = c.reread().unwrap();
        assert_eq!((r.after, r.upto, r.writers_from), (None, p("10"), 0));
        assert_eq!(c.end_poll(none, 5 * S), None, "4s old");
        assert_eq!(c.end_poll(none, 6 * S), Some(p("10")), "5s old");
        assert_eq!(c.reread(), None);
        // No lookback: final at the very poll that read it.
        let mut c = Cursor::resume(None, Duration::ZERO);
        c.advance(p("10"));
        assert_eq!(c.end_poll(none, S), Some(p("10")));
    }

    #[test]
    fn handed_drops_rows_read_again_until_the_cursor_passes_them() {
        let mut h = Handed::new();
        assert!(h.first_time(&p("10")));
        assert!(h.first_time(&p("20")));
        h.end_poll(Some(&p("20")), None);
        // The re-read of the next poll finds both again, and a late one.
        assert!(!h.first_time(&p("10")));
        assert!(h.first_time(&p("15")));
        assert!(!h.first_time(&p("20")));
        assert!(h.first_time(&p("30")));
        assert!(!h.is_empty());
        h.end_poll(Some(&p("30")), None);
        // Quiet polls end where the previous one did: nothing grows.
        h.end_poll(Some(&p("30")), None);
        h.end_poll(Some(&p("30")), None);
        assert_eq!(h.ends.len(), 2);
        assert_eq!(h.len(), 4);
        // The first poll's mark is final: what it handed over is forgotten, what the
        // later polls handed (15 lies below 20, but was handed later) waits for theirs.
        h.end_poll(Some(&p("30")), Some(&p("20")));
        assert_eq!(h.len(), 2);
        assert!(!h.first_time(&p("15")));
        h.end_poll(Some(&p("30")), Some(&p("30")));
        assert!(h.is_empty());
        assert!(h.ends.is_empty());
    }

    /// A simulated table under concurrent writers, polled through [`Cursor`] with the
    /// same reads the poller runs: every committed row version is handed over.
    mod simulation {
        use std::collections::{BTreeMap, BTreeSet};

        use proptest::prelude::*;

        use super::super::*;

        /// A writer: begins at `start` (its cursor value is its start, as `now()`),
        /// takes an id at its first write `delay` ticks later, writes `pks`, commits
        /// after `len` ticks.
        #[derive(Debug, Clone)]
        struct Writer {
            start: u64,
            delay: u64,
            len: u64,
            pks: Vec<u8>,
        }

        fn writer() -> impl Strategy<Value = Writer> {
            (
                0u64..60,
                0u64..4,
                0u64..30,
                proptest::collection::vec(0u8..12, 1..4),
            )
                .prop_map(|(start, delay, len, pks)| Writer {
                    start,
                    delay,
                    len,
                    pks,
                })
        }

        fn pos(value: u64, pk: u8) -> Position {
            vec![format!("{value:06}"), format!("{pk:03}")]
        }

        /// Runs the writers, polling every `every` ticks with pages of `page` (every
        /// third poll skipping the re-read, as a catch-up poll does); returns
        /// the row versions (pk, writer) never handed over after they committed.
        fn lost(
            writers: &[Writer],
            every: u64,
            page: usize,
            lookback: u64,
            horizon: bool,
        ) -> Vec<(u8, u64)> {
            let mut c = Cursor::resume(None, Duration::from_secs(lookback));
            // pk → (value, xid): the committed version.
            let mut table: BTreeMap<u8, (u64, u64)> = BTreeMap::new();
            let mut next_xid = 100u64;
            let mut ids: BTreeMap<usize, u64> = BTreeMap::new();
            let mut handed: BTreeSet<(u8, u64)> = BTreeSet::new();
            let end = writers
                .iter()
                .map(|w| w.start + w.delay + w.len)
                .max()
                .unwrap_or(0);
            for t in 0..=end + lookback + 3 * every + 3 {
                // Writers take ids at their first write, then commit, in time order.
                for (i, w) in writers.iter().enumerate() {
                    if w.start + w.delay == t {
                        ids.insert(i, next_xid);
                        next_xid += 1;
                    }
                }
                for (i, w) in writers.iter().enumerate() {
                    if w.start + w.delay + w.len == t {
                        let xid = ids[&i];
                        for pk in &w.pks {
                            table.insert(*pk, (w.start, xid));
                        }
                    }
                }
                if t % every != 0 {
                    continue;
                }
                let running: Vec<u64> = writers
                    .iter()
                    .enumerate()
                    .filter(|(i, w)| ids.contains_key(i) && w.start + w.delay + w.len > t)
                    .map(|(i, _)| ids[&i])
                    .collect();
                let h = if horizon {
                    Horizon {
                        xmin: running.iter().copied().min().unwrap_or(next_xid),
                        xmax: next_xid,
                    }
                } else {
                    Horizon::NONE
                };
                let rows: Vec<(Position, u8, u64)> = table
                    .iter()
                    .map(|(pk, (v, x))| (pos(*v, *pk), *pk, *x))
                    .collect();
                let mut sorted = rows.clone();
                sorted.sort();
                // Every third poll is a catch-up poll that skips the re-read.
                let skip = (t / every) % 3 == 1;
                if let Some(r) = c.reread().filter(|_| !skip) {
                    for (p, pk, x) in &sorted {
                        if r.after.as_ref().is_none_or(|a| p > a)
                            && *p <= r.upto
                            && *x >= r.writers_from
                        {
                            handed.insert((*pk, *x));
                        }
                    }
                }
                for _ in 0..2 {
                    let from = c.high().cloned();
                    let got: Vec<_> = sorted
                        .iter()
                        .filter(|(p, ..)| from.as_ref().is_none_or(|f| p > f))
                        .take(page)
                        .collect();
                    for (_, pk, x) in &got {
                        handed.insert((*pk, *x));
                    }
                    if let Some((p, ..)) = got.last() {
                        c.advance(p.clone());
                    }
                    if got.len() < page {
                        break;
                    }
                }
                if skip {
                    c.end_catch_up(h, Duration::from_secs(t));
                } else {
                    c.end_poll(h, Duration::from_secs(t));
                }
            }
            table
                .iter()
                .map(|(pk, (_, x))| (*pk, *x))
                .filter(|v| !handed.contains(v))
                .collect()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(300))]

            /// Writers that take their id when they begin: the xid horizon alone finds
            /// every late commit, at any transaction length.
            #[test]
            fn the_horizon_finds_every_late_commit(
                mut writers in proptest::collection::vec(writer(), 1..12),
                every in 1u64..6,
                page in 1usize..4,
            ) {
                for w in &mut writers {
                    w.delay = 0;
                }
                prop_assert_eq!(lost(&writers, every, page, 0, true), vec![]);
            }

            /// Writers whose first write comes up to 3 ticks after their value: a
            /// lookback of 3 finds them too.
            #[test]
            fn a_lookback_covers_a_late_first_write(
                writers in proptest::collection::vec(writer(), 1..12),
                every in 1u64..6,
                page in 1usize..4,
            ) {
                prop_assert_eq!(lost(&writers, every, page, 3, true), vec![]);
            }

            /// No horizon (MySQL): a lookback at least as long as every writer (its
            /// first write's delay and its length) finds every late commit.
            #[test]
            fn without_a_horizon_a_lookback_longer_than_every_writer_finds_them(
                writers in proptest::collection::vec(writer(), 1..12),
                every in 1u64..6,
                page in 1usize..4,
            ) {
                let longest = writers.iter().map(|w| w.delay + w.len).max().unwrap_or(0);
                prop_assert_eq!(lost(&writers, every, page, longest, false), vec![]);
            }
        }

        /// No horizon and no lookback: a transaction that holds an early cursor value
        /// across a poll that reads past it is missed — what the lookback is for.
        #[test]
        fn without_a_horizon_or_lookback_a_long_writer_is_missed() {
            let long = Writer {
                start: 0,
                delay: 0,
                len: 10,
                pks: vec![1],
            };
            let short = Writer {
                start: 2,
                delay: 0,
                len: 0,
                pks: vec![2],
            };
            let writers = [long, short];
            assert_eq!(lost(&writers, 1, 10, 0, false), vec![(1, 100)]);
            assert_eq!(lost(&writers, 1, 10, 10, false), vec![]);
            assert_eq!(
                lost(&writers, 1, 10, 0, true),
                vec![],
                "the horizon finds it"
            );
        }
    }
}
