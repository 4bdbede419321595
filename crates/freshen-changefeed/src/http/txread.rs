//! Reading a page of the log with `TRANSACTION_COMMIT` markers ([`crate::txmark`]), for
//! the long poll, Server-Sent Events and WebSocket subscriptions.

use super::MAX_SCAN;
use crate::Error;
use crate::filter::Selection;
use crate::record;
use crate::shared::Core;
use crate::txmark::{FrameEnd, Framing, Next, Page};

/// A page read with transaction markers.
pub(crate) struct TxRead {
    pub(crate) next: u64,
    pub(crate) entries: usize,
    pub(crate) events: usize,
    pub(crate) markers: usize,
    /// The log was read to its end.
    pub(crate) at_end: bool,
    /// The last sequence examined (`next` is before it when a transaction is held back).
    pub(crate) examined: u64,
    /// With [`Framing::Frames`]: where each entry ends in the output.
    pub(crate) frames: Vec<FrameEnd>,
}

/// Reads a page after `after` with a `TRANSACTION_COMMIT` marker after each source
/// transaction ([`crate::txmark`]); `through`: the commit position through which the
/// source said transactions are complete.
pub(crate) fn with_markers(
    core: &Core,
    after: u64,
    limit: usize,
    through: u64,
    filter: &(impl Selection + ?Sized),
    out: &mut Vec<u8>,
    framing: Framing,
) -> Result<TxRead, Error> {
    let before = if after > 0 {
        core.tx_at(after, MAX_SCAN, filter)?
    } else {
        None
    };
    let mut p = Page::new(before, limit, framing);
    let mut consumed = after;
    let mut stopped = false;
    core.scan(after, MAX_SCAN, |seq, r| {
        // Counted in the transaction's marker even where it is not delivered (before its
        // table's cursor): the marker describes the whole transaction, as with `from_seq`.
        let keeps = filter.keeps(r);
        if p.record(seq, record::position_of(r), keeps, out) == Next::Stop {
            stopped = true;
            return false;
        }
        if keeps && filter.delivers(seq, r) {
            p.separator(out);
            if framing == Framing::Sse {
                out.extend_from_slice(b"id: ");
                filter.write_id(seq, out);
                out.extend_from_slice(b"\ndata: ");
                r.write_json(seq, out);
                out.extend_from_slice(b"\n\n");
            } else {
                r.write_json(seq, out);
            }
            p.written(seq, out);
        }
        consumed = seq;
        true
    })?;
    let mut at_end = !stopped && consumed >= core.latest();
    if !stopped && !at_end {
        // Cut by the scan bound or by events appended meanwhile: the next record says
        // whether the open transaction ended here.
        let mut next = None;
        core.scan(consumed, 1, |_, r| {
            next = Some(record::position_of(r));
            false
        })?;
        match next {
            Some(position) => p.peek(position, out),
            None => at_end = true,
        }
    }
    let next = p.finish(at_end, through, after, consumed, out);
    Ok(TxRead {
        next,
        entries: p.entries,
        events: p.events,
        markers: p.markers,
        at_end,
        examined: consumed,
        frames: std::mem::take(&mut p.frames),
    })
}
