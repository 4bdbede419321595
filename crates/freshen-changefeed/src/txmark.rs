//! Transaction markers: a `TRANSACTION_COMMIT` entry after the last event of each source
//! transaction, for the readers that ask (`?tx=1`), so that a consumer can apply a
//! transaction at once. Pure: the reader feeds it the log's records in order.
//!
//! Markers are not stored: they are made while reading, from the `lsn` and `xid` every
//! event of a transaction carries (PostgreSQL hands transactions over whole, in commit
//! order, so one transaction's events are consecutive in the log). A transaction is
//! complete when a record of another transaction (or a snapshot row) follows it, or when
//! the source said so ([`freshen::Batch::committed_through`], kept in the store).
//!
//! A page never ends right after a transaction's last event without its marker: when the
//! log ends inside a transaction not known to be complete, its events are held back to
//! a later page (the reader's next position is before them). Only the page's `limit`
//! can end a page inside a transaction; the marker then comes in a later page. A reader
//! that starts inside a transaction (a cursor mid-transaction) gets the rest of it and
//! then the marker, whose `first_sequence` and `event_count` describe the whole
//! transaction, so the reader can tell that it began before its cursor.

use std::io::Write as _;

/// A transaction being read: its source position and what the reader got of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Open {
    /// The commit position (PostgreSQL: the commit LSN).
    pub(crate) commit: u64,
    /// The source's transaction id.
    pub(crate) xid: u64,
    /// The sequence of its first event in the log.
    pub(crate) first: u64,
    /// The sequence of its last event seen so far.
    pub(crate) last: u64,
    /// Its events that match the reader's filter.
    pub(crate) count: u64,
    /// The reader got some of its events: on this page, or before its position. A
    /// transaction whose kept events all lay at or before their tables' cursors (per-table
    /// cursors) gets no marker: the reader had them, and their marker, already.
    delivered: bool,
    /// Where its events begin in the page being written (and how many entries the page
    /// held then), to hold them back if the page ends before it does.
    page_at: usize,
    page_entries: usize,
}

impl Open {
    /// A transaction that began before the reader's position: `count` of its events
    /// before the position matched, the first at sequence `first`.
    pub(crate) fn before(position: (u64, u64), first: u64, last: u64, count: u64) -> Open {
        Open {
            commit: position.0,
            xid: position.1,
            first,
            last,
            count,
            delivered: true,
            page_at: 0,
            page_entries: 0,
        }
    }
}

/// What to do with a record after the marker logic saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Write the record if it matches the filter.
    Write,
    /// Stop before this record: the page is full.
    Stop,
}

/// How entries are written: a long-poll page's JSON array (comma-separated),
/// Server-Sent Events frames (a marker is `event: transaction`, without an `id`, so
/// that `Last-Event-ID` stays the last event's sequence), or one JSON object per
/// WebSocket frame, each entry's end recorded in [`Page::frames`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    Json,
    Sse,
    Frames,
}

/// Where an entry written with [`Framing::Frames`] ends in the output (it begins where
/// the one before it ends), its sequence (a marker's is its transaction's last event's)
/// and whether it is a marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameEnd {
    pub(crate) end: usize,
    pub(crate) seq: u64,
    pub(crate) marker: bool,
}

/// Writes a page with markers: events go through [`Page::record`], the end through
/// [`Page::finish`].
#[derive(Debug)]
pub(crate) struct Page {
    framing: Framing,
    /// The transaction the reader's position is inside, if the first record read
    /// continues it (otherwise its marker was already written, or is not this page's).
    candidate: Option<Open>,
    open: Option<Open>,
    /// Row events written (the page's limit counts these).
    pub(crate) events: usize,
    /// Entries written: events and markers.
    pub(crate) entries: usize,
    /// Markers written.
    pub(crate) markers: usize,
    /// With [`Framing::Frames`], one per entry written and kept, in order.
    pub(crate) frames: Vec<FrameEnd>,
    limit: usize,
}

impl Page {
    /// A page of at most `limit` events; `before` is the transaction of the record at
    /// the reader's position, if it has one: it is continued only if the first record
    /// read belongs to it too.
    pub(crate) fn new(before: Option<Open>, limit: usize, framing: Framing) -> Page {
        Page {
            framing,
            candidate: before,
            open: None,
            events: 0,
            entries: 0,
            markers: 0,
            frames: Vec::new(),
            limit,
        }
    }

    /// The record at `seq` with source position `position` comes next; `matches`: the
    /// reader's filter keeps it. Writes the marker of the transaction it ends, if any,
    /// and says whether the record belongs on this page. Call [`Page::written`] after
    /// writing a matching record.
    pub(crate) fn record(
        &mut self,
        seq: u64,
        position: Option<(u64, u64)>,
        matches: bool,
        out: &mut Vec<u8>,
    ) -> Next {
        if let Some(c) = self.candidate.take()
            && position == Some((c.commit, c.xid))
        {
            self.open = Some(c);
        }
        if let Some(open) = self.open
            && position != Some((open.commit, open.xid))
        {
            self.close(out);
        }
        if matches && self.events >= self.limit {
            return Next::Stop;
        }
        match (&mut self.open, position) {
            (Some(open), _) => {
                open.last = seq;
                open.count += u64::from(matches);
            }
            (None, Some((commit, xid))) => {
                self.open = Some(Open {
                    commit,
                    xid,
                    first: seq,
                    last: seq,
                    count: u64::from(matches),
                    delivered: false,
                    page_at: out.len(),
                    page_entries: self.entries,
                });
            }
            (None, None) => {}
        }
        Next::Write
    }

    /// Counts the record at `seq` the caller wrote into `out` (after [`Page::record`]
    /// said `Write` and the filter matched). The caller separates entries with commas:
    /// see [`Page::separator`].
    pub(crate) fn written(&mut self, seq: u64, out: &[u8]) {
        if let Some(open) = &mut self.open {
            open.delivered = true;
        }
        self.events += 1;
        self.entries += 1;
        if self.framing == Framing::Frames {
            self.frames.push(FrameEnd {
                end: out.len(),
                seq,
                marker: false,
            });
        }
    }

    /// Writes the comma before the next entry, if one came before it.
    pub(crate) fn separator(&self, out: &mut Vec<u8>) {
        if self.framing == Framing::Json && self.entries > 0 {
            out.push(b',');
        }
    }

    /// The page stopped before the log's end for another reason than its limit (a scan
    /// bound, or events appended meanwhile): the record after it has source position
    /// `position`. If that ends the open transaction, its marker goes on this page —
    /// the next page, starting after this one, could not tell it was not sent.
    pub(crate) fn peek(&mut self, position: Option<(u64, u64)>, out: &mut Vec<u8>) {
        if let Some(open) = self.open
            && position != Some((open.commit, open.xid))
        {
            self.close(out);
        }
    }

    /// Ends the page: `at_end` says the log was read to its end (not stopped by the
    /// limit or a scan bound); `complete_through` is the source's commit position
    /// through which transactions are complete. Returns the reader's next position:
    /// `consumed` (the last record examined), or before the events of a transaction
    /// held back.
    pub(crate) fn finish(
        &mut self,
        at_end: bool,
        complete_through: u64,
        from: u64,
        consumed: u64,
        out: &mut Vec<u8>,
    ) -> u64 {
        let Some(open) = self.open else {
            return consumed;
        };
        if !at_end {
            return consumed;
        }
        if open.commit <= complete_through {
            self.close(out);
            return consumed;
        }
        // The log ends inside a transaction that may go on: hold its events back.
        out.truncate(open.page_at);
        self.events -= self.entries - open.page_entries;
        self.entries = open.page_entries;
        self.frames.truncate(self.entries);
        self.open = None;
        if open.first > from {
            open.first - 1
        } else {
            from
        }
    }

    /// Writes the open transaction's marker (none when the reader's filter kept none of
    /// its events).
    fn close(&mut self, out: &mut Vec<u8>) {
        let Some(open) = self.open.take() else {
            return;
        };
        if open.count == 0 || !open.delivered {
            return;
        }
        match self.framing {
            Framing::Json => {
                self.separator(out);
                marker_json(&open, out);
            }
            Framing::Sse => {
                out.extend_from_slice(b"event: transaction\ndata: ");
                marker_json(&open, out);
                out.extend_from_slice(b"\n\n");
            }
            Framing::Frames => {
                marker_json(&open, out);
                self.frames.push(FrameEnd {
                    end: out.len(),
                    seq: open.last,
                    marker: true,
                });
            }
        }
        self.entries += 1;
        self.markers += 1;
    }
}

/// `{"type":"TRANSACTION_COMMIT","sequence":…,"xid":…,"lsn":"X/X","event_count":…,
/// "first_sequence":…}`: `sequence` is the transaction's last event's (a marker takes no
/// sequence of its own, so cursors are unchanged); `event_count` counts the
/// transaction's events that the reader's filter keeps, before its cursor included.
pub(crate) fn marker_json(open: &Open, out: &mut Vec<u8>) {
    let _ = write!(
        out,
        "{{\"type\":\"TRANSACTION_COMMIT\",\"sequence\":{},\"xid\":{},\"lsn\":\"{:X}/{:X}\",\"event_count\":{},\"first_sequence\":{}}}",
        open.last,
        open.xid,
        open.commit >> 32,
        open.commit & 0xFFFF_FFFF,
        open.count,
        open.first
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the page sees it: sequence, source position, whether it matches.
    type Rec = (u64, Option<(u64, u64)>, bool);

    /// Runs a page over `(seq, position, matches)` records as the long poll does, each
    /// written event as `e<seq>`.
    fn page(
        open: Option<Open>,
        limit: usize,
        records: &[Rec],
        at_end: bool,
        complete: u64,
        from: u64,
    ) -> (serde_json::Value, u64) {
        let mut p = Page::new(open, limit, Framing::Json);
        let mut out = Vec::new();
        let mut consumed = from;
        let mut stopped = false;
        for &(seq, pos, m) in records {
            if p.record(seq, pos, m, &mut out) == Next::Stop {
                stopped = true;
                break;
            }
            if m {
                p.separator(&mut out);
                write!(out, "\"e{seq}\"").unwrap();
                p.written(seq, &out);
            }
            consumed = seq;
        }
        let next = p.finish(at_end && !stopped, complete, from, consumed, &mut out);
        let mut array = b"[".to_vec();
        array.extend_from_slice(&out);
        array.push(b']');
        (serde_json::from_slice(&array).expect("valid JSON"), next)
    }

    fn markers(v: &serde_json::Value) -> Vec<(u64, u64, u64)> {
        v.as_array()
            .unwrap()
            .iter()
            .filter(|e| e.is_object())
            .map(|m| {
                assert_eq!(m["type"], "TRANSACTION_COMMIT");
                (
                    m["sequence"].as_u64().unwrap(),
                    m["event_count"].as_u64().unwrap(),
                    m["first_sequence"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    const A: Option<(u64, u64)> = Some((0x100, 7));
    const B: Option<(u64, u64)> = Some((0x200, 8));

    #[test]
    fn a_marker_follows_each_transaction_in_place() {
        let recs = [
            (1, A, true),
            (2, A, true),
            (3, B, true),
            (4, None, true),
            (5, B, true),
        ];
        let (v, next) = page(None, 100, &recs, true, 0x200, 0);
        let order: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                e.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("m{}", e["sequence"]))
            })
            .collect();
        // A snapshot row (no position) ends B; the B that follows is a new one.
        assert_eq!(order, ["e1", "e2", "m2", "e3", "m3", "e4", "e5", "m5"]);
        assert_eq!(markers(&v), [(2, 2, 1), (3, 1, 3), (5, 1, 5)]);
        assert_eq!(v[2]["lsn"], "0/100");
        assert_eq!(v[2]["xid"], 7);
        assert_eq!(next, 5);
    }

    #[test]
    fn no_marker_for_a_transaction_the_reader_had_already() {
        // Per-table cursors: A's events are kept but lie before their table's cursor
        // (not written); B's second event is written, so B's marker counts both.
        let mut p = Page::new(None, 100, Framing::Json);
        let mut out = Vec::new();
        for (seq, pos, write) in [(1, A, false), (2, B, false), (3, B, true)] {
            assert_eq!(p.record(seq, pos, true, &mut out), Next::Write);
            if write {
                p.separator(&mut out);
                write!(out, "\"e{seq}\"").unwrap();
                p.written(seq, &out);
            }
        }
        assert_eq!(p.finish(true, 0x200, 0, 3, &mut out), 3);
        let v: serde_json::Value =
            serde_json::from_slice(&[b"[", &out[..], b"]"].concat()).unwrap();
        assert_eq!(v[0], "e3");
        assert_eq!(markers(&v), [(3, 2, 2)]);
        assert_eq!(p.markers, 1);
    }

    #[test]
    fn the_last_transaction_waits_until_it_is_known_complete() {
        let recs = [(1, A, true), (2, B, true), (3, B, true)];
        // Not complete: B is held back, the reader's position is before it.
        let (v, next) = page(None, 100, &recs, true, 0x100, 0);
        assert_eq!(v, serde_json::json!(["e1", v[1].clone()]));
        assert_eq!(markers(&v), [(1, 1, 1)]);
        assert_eq!(next, 1);
        // Complete: its marker closes the page.
        let (v, next) = page(None, 100, &recs, true, 0x200, 0);
        assert_eq!(markers(&v), [(1, 1, 1), (3, 2, 2)]);
        assert_eq!(next, 3);
        // Stopped by the scan bound, not the log's end: no decision yet, no hold-back.
        let (v, next) = page(None, 100, &recs, false, 0, 0);
        assert_eq!(markers(&v), [(1, 1, 1)]);
        assert_eq!((v.as_array().unwrap().len(), next), (4, 3));
    }

    #[test]
    fn the_limit_ends_a_page_inside_a_transaction_and_the_next_page_finishes_it() {
        let recs = [(1, A, true), (2, A, true), (3, A, true), (4, B, true)];
        let (v, next) = page(None, 2, &recs, true, 0x200, 0);
        assert_eq!(v, serde_json::json!(["e1", "e2"]));
        assert_eq!(next, 2);
        // The next page starts inside A: the caller found its first two events before.
        let open = Open::before(A.unwrap(), 1, 2, 2);
        let (v, next) = page(Some(open), 2, &recs[2..], true, 0x200, 2);
        assert_eq!(markers(&v), [(3, 3, 1), (4, 1, 4)]);
        assert_eq!(next, 4);
    }

    #[test]
    fn a_page_cut_by_a_scan_bound_peeks_at_the_next_record() {
        let mut p = Page::new(None, 100, Framing::Json);
        let mut out = Vec::new();
        for seq in [1, 2] {
            p.record(seq, A, true, &mut out);
            p.separator(&mut out);
            out.extend_from_slice(b"0");
            p.written(seq, &out);
        }
        // The next record is A's too: nothing to say yet.
        p.peek(A, &mut out);
        assert_eq!(p.markers, 0);
        // The next record is B's: A ended here, and only this page can say so.
        p.peek(B, &mut out);
        assert_eq!(p.markers, 1);
        assert_eq!(p.finish(false, 0, 0, 2, &mut out), 2);
        let v: serde_json::Value =
            serde_json::from_slice(&[&b"["[..], &out[..], &b"]"[..]].concat()).unwrap();
        assert_eq!(markers(&v), [(2, 2, 1)]);
    }

    #[test]
    fn a_transaction_ended_at_the_cursor_gets_no_second_marker() {
        // The last page ended with A's marker at sequence 2; the reader is at 2.
        let before = Open::before(A.unwrap(), 1, 2, 2);
        let (v, next) = page(Some(before), 100, &[], true, 0x200, 2);
        assert_eq!((v, next), (serde_json::json!([]), 2));
        let (v, _) = page(Some(before), 100, &[(3, B, true)], true, 0x200, 2);
        assert_eq!(markers(&v), [(3, 1, 3)]);
    }

    #[test]
    fn server_sent_events_get_a_named_frame_without_an_id() {
        let mut p = Page::new(None, 10, Framing::Sse);
        let mut out = Vec::new();
        for seq in [1, 2] {
            assert_eq!(p.record(seq, A, true, &mut out), Next::Write);
            p.separator(&mut out);
            write!(out, "id: {seq}\ndata: e\n\n").unwrap();
            p.written(seq, &out);
        }
        let next = p.finish(true, 0x100, 0, 2, &mut out);
        assert_eq!(next, 2);
        let text = String::from_utf8(out).unwrap();
        let (events, marker) = text.split_at(text.find("event: transaction").unwrap());
        assert_eq!(events, "id: 1\ndata: e\n\nid: 2\ndata: e\n\n");
        let data = marker
            .strip_prefix("event: transaction\ndata: ")
            .and_then(|m| m.strip_suffix("\n\n"))
            .unwrap();
        let m: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(
            (m["sequence"].as_u64(), m["event_count"].as_u64()),
            (Some(2), Some(2))
        );
        assert_eq!((p.events, p.entries, p.markers), (2, 3, 1));
    }

    #[test]
    fn filtered_readers_count_their_events_and_skip_empty_transactions() {
        let recs = [(1, A, false), (2, A, true), (3, B, false), (4, None, true)];
        let (v, next) = page(None, 100, &recs, true, 0, 0);
        assert_eq!(markers(&v), [(2, 1, 1)]);
        assert_eq!(v.as_array().unwrap().len(), 3);
        assert_eq!(next, 4);
    }

    #[test]
    fn a_held_back_transaction_that_began_before_the_cursor_keeps_the_cursor() {
        let open = Open::before(A.unwrap(), 1, 1, 1);
        let (v, next) = page(Some(open), 100, &[(2, A, true)], true, 0, 1);
        assert_eq!(v, serde_json::json!([]));
        assert_eq!(next, 1);
    }

    #[test]
    fn websocket_frames_record_each_entry_and_drop_those_held_back() {
        let mut p = Page::new(None, 10, Framing::Frames);
        let mut out = Vec::new();
        for (seq, pos) in [(1, A), (2, A), (3, B)] {
            assert_eq!(p.record(seq, pos, true, &mut out), Next::Write);
            write!(out, "{{\"e\":{seq}}}").unwrap();
            p.written(seq, &out);
        }
        // B may go on: its event is held back, A's marker stays.
        assert_eq!(p.finish(true, 0x100, 0, 3, &mut out), 2);
        let kinds: Vec<(u64, bool)> = p.frames.iter().map(|f| (f.seq, f.marker)).collect();
        assert_eq!(kinds, [(1, false), (2, false), (2, true)]);
        assert_eq!(p.frames.last().map(|f| f.end), Some(out.len()));
        let mut start = 0;
        let texts: Vec<serde_json::Value> = p
            .frames
            .iter()
            .map(|f| {
                let v = serde_json::from_slice(&out[start..f.end]).expect("one object");
                start = f.end;
                v
            })
            .collect();
        assert_eq!(texts[1], serde_json::json!({"e": 2}));
        assert_eq!(
            (texts[2]["type"].as_str(), texts[2]["event_count"].as_u64()),
            (Some("TRANSACTION_COMMIT"), Some(2))
        );
        assert_eq!((p.events, p.entries, p.markers), (2, 3, 1));
    }
}
