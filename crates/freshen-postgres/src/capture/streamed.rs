//! Streamed in-progress transactions (pgoutput protocol 2, `streaming 'on'`): the
//! messages of a transaction the server sends while it runs are held here until its
//! Stream Commit, then replayed through the ordinary parser and assembler as if the
//! transaction had been sent whole at its commit. Pure apart from the spill file: no
//! network, no clock.
//!
//! Why hold rather than hand over: the core's `Tx` carries the commit LSN, a batch's ack
//! confirms a commit position, and a streamed transaction may still abort. So events
//! leave only at commit — what protocol 1 gives, without the server spilling the
//! transaction to its own disk and decoding it twice.
//!
//! ```text
//!                 S (xid, first)                      E
//!   outside ──────────────────────► in block (xid) ──────► outside
//!      │    first segment of a held xid: drop it  │
//!      │                                          └─ R/Y/I/U/D/T/M (subxid, …):
//!      │                                             held under xid, in stream order
//!      ├─ c (xid, commit LSN, end LSN, ts) ──► Replay: Begin, the held messages, Commit
//!      ├─ A (xid, subxid == xid) ────────────► drop the transaction
//!      ├─ A (xid, subxid) ───────────────────► drop that subtransaction's messages
//!      └─ anything else ─────────────────────► Pass: decoded as today
//! ```
//!
//! | invariant | why |
//! |---|---|
//! | one transaction's held messages keep stream order | replay must match what protocol 1 sends |
//! | blocks of different transactions never mix | each message is held under the block's top-level xid |
//! | nothing of a transaction leaves before its `c` | an abort must leave no trace downstream |
//! | a first segment for a held xid restarts it | the server re-streams an unfinished transaction from its start |
//! | at most `budget` bytes are held in memory | past it the largest transaction moves to an unlinked temp file |
//! | a malformed stream message is an error, never a panic | every read is bounds-checked |
//!
//! Cost of the spill: a transaction that moves to the file is written once and read
//! back once, sequentially, at its commit; the file is unlinked as soon as it is made,
//! so it goes with the process.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::capture::pgoutput::DecodeError;

/// Each held message: subtransaction xid, length, then the message without its xid.
const RECORD_HEAD: usize = 8;

/// Why a stream message could not be followed.
#[derive(Debug)]
pub(crate) enum StreamError {
    /// A malformed or out-of-place stream message.
    Malformed(DecodeError),
    /// The spill file could not be written or read.
    Spill(io::Error),
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamError::Malformed(e) => write!(f, "streamed transaction: {e}"),
            StreamError::Spill(e) => write!(f, "streamed transaction spill file: {e}"),
        }
    }
}

impl std::error::Error for StreamError {}

/// What to do with one message after [`Streams::feed`].
#[derive(Debug)]
pub(crate) enum Fed {
    /// Not part of a streamed transaction: decode it as today.
    Pass,
    /// Taken: held, or a stream start, stop or abort.
    Taken,
    /// A streamed transaction committed: replay it.
    Commit(Replay),
}

/// Where one transaction's messages are held.
#[derive(Debug)]
enum Store {
    Memory(Vec<u8>),
    File { file: BufWriter<File> },
}

#[derive(Debug)]
struct Held {
    store: Store,
    /// Aborted subtransactions whose records are in the file (skipped at replay).
    aborted: Vec<u32>,
}

/// The streamed transactions of one session.
#[derive(Debug)]
pub(crate) struct Streams {
    held: HashMap<u32, Held>,
    /// The top-level xid of the open stream block.
    block: Option<u32>,
    /// Bytes held in memory past which the largest transaction spills.
    budget: usize,
    in_memory: usize,
    /// Where spill files are made (and unlinked at once).
    dir: PathBuf,
    /// Transactions moved to a spill file so far.
    spills: u64,
}

fn malformed(tag: u8, reason: impl Into<String>) -> StreamError {
    StreamError::Malformed(DecodeError {
        tag: Some(tag),
        reason: reason.into(),
    })
}

fn u32_at(b: &[u8], at: usize, tag: u8, what: &str) -> Result<u32, StreamError> {
    b.get(at..at + 4)
        .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| malformed(tag, format!("truncated before the {what}")))
}

fn u64_at(b: &[u8], at: usize, tag: u8, what: &str) -> Result<u64, StreamError> {
    b.get(at..at + 8)
        .map(|s| {
            let mut a = [0u8; 8];
            a.copy_from_slice(s);
            u64::from_be_bytes(a)
        })
        .ok_or_else(|| malformed(tag, format!("truncated before the {what}")))
}

fn exact(b: &[u8], len: usize, tag: u8) -> Result<(), StreamError> {
    if b.len() == len {
        Ok(())
    } else {
        Err(malformed(tag, format!("{} bytes, expected {len}", b.len())))
    }
}

/// Appends one record: subxid, length, the tag, then the message past its xid.
fn record(out: &mut Vec<u8>, subxid: u32, tag: u8, rest: &[u8]) {
    out.extend_from_slice(&subxid.to_be_bytes());
    out.extend_from_slice(&((rest.len() + 1) as u32).to_be_bytes());
    out.push(tag);
    out.extend_from_slice(rest);
}

/// A new anonymous file in `dir`, owner-only. On Linux it never has a name
/// (`O_TMPFILE`): a crash cannot leave one behind. Elsewhere, or on a file system
/// without it, it is created under a unique name and unlinked at once.
fn spill_file(dir: &std::path::Path) -> io::Result<File> {
    #[cfg(target_os = "linux")]
    {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(dir)
        {
            Ok(file) => return Ok(file),
            // The file system (or an old kernel) has no O_TMPFILE: the named way.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {}
            Err(e) => return Err(e),
        }
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = dir.join(format!(
        "freshen-stream-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    // Owner-only: between its creation and its unlinking, the name of a file of row
    // data must not be open to another local user.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

impl Streams {
    /// Holds up to `budget` bytes in memory, spilling past it into files in `dir`.
    pub(crate) fn new(budget: usize, dir: PathBuf) -> Streams {
        Streams {
            held: HashMap::new(),
            block: None,
            budget,
            in_memory: 0,
            dir,
            spills: 0,
        }
    }

    /// Where spill files are made.
    pub(crate) fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// A new session: the server re-streams every unfinished transaction from its start.
    pub(crate) fn reset(&mut self) {
        self.held.clear();
        self.block = None;
        self.in_memory = 0;
    }

    /// Transactions held (streamed, neither committed nor aborted yet).
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.held.len()
    }

    /// Bytes held in memory now.
    #[cfg(test)]
    pub(crate) fn in_memory(&self) -> usize {
        self.in_memory
    }

    /// Transactions moved to a spill file so far.
    #[cfg(test)]
    pub(crate) fn spills(&self) -> u64 {
        self.spills
    }

    /// Takes one pgoutput message (the payload of one XLogData).
    pub(crate) fn feed(&mut self, data: &[u8]) -> Result<Fed, StreamError> {
        let Some((&tag, rest)) = data.split_first() else {
            // The decoder reports an empty message as today.
            return Ok(Fed::Pass);
        };
        match (tag, self.block) {
            (b'S', None) => {
                let xid = u32_at(rest, 0, tag, "xid")?;
                let first = *rest
                    .get(4)
                    .ok_or_else(|| malformed(tag, "truncated before the first-segment flag"))?;
                exact(rest, 5, tag)?;
                if first == 1
                    && let Some(old) = self.held.remove(&xid)
                {
                    self.forget(old);
                }
                self.block = Some(xid);
                Ok(Fed::Taken)
            }
            (b'S', Some(open)) => Err(malformed(
                tag,
                format!("stream start inside the open block of xid {open}"),
            )),
            (b'E', Some(_)) => {
                exact(rest, 0, tag)?;
                self.block = None;
                Ok(Fed::Taken)
            }
            (b'E', None) => Err(malformed(tag, "stream stop without a stream start")),
            (b'c' | b'A', Some(open)) => Err(malformed(
                tag,
                format!("inside the open stream block of xid {open}"),
            )),
            (b'c', None) => {
                let xid = u32_at(rest, 0, tag, "xid")?;
                // Flags (one byte, unused) at 4.
                let commit_lsn = u64_at(rest, 5, tag, "commit LSN")?;
                let end_lsn = u64_at(rest, 13, tag, "end LSN")?;
                let commit_ts = u64_at(rest, 21, tag, "commit timestamp")? as i64;
                exact(rest, 29, tag)?;
                let held = self.held.remove(&xid);
                let (source, aborted) = match held {
                    None => (Source::Memory(Vec::new(), 0), Vec::new()),
                    Some(Held {
                        store: Store::Memory(v),
                        aborted,
                    }) => {
                        self.in_memory -= v.len();
                        (Source::Memory(v, 0), aborted)
                    }
                    Some(Held {
                        store: Store::File { file },
                        aborted,
                    }) => {
                        let mut f = file
                            .into_inner()
                            .map_err(|e| StreamError::Spill(e.into_error()))?;
                        f.seek(SeekFrom::Start(0)).map_err(StreamError::Spill)?;
                        (Source::File(BufReader::with_capacity(1 << 16, f)), aborted)
                    }
                };
                Ok(Fed::Commit(Replay {
                    xid,
                    commit_lsn,
                    end_lsn,
                    commit_ts,
                    source,
                    aborted,
                }))
            }
            (b'A', None) => {
                let xid = u32_at(rest, 0, tag, "xid")?;
                let subxid = u32_at(rest, 4, tag, "subtransaction xid")?;
                // Protocol 4 adds the abort LSN and time; protocol 2 has neither.
                exact(rest, 8, tag)?;
                if subxid == xid {
                    if let Some(old) = self.held.remove(&xid) {
                        self.forget(old);
                    }
                } else if let Some(h) = self.held.get_mut(&xid) {
                    match &mut h.store {
                        Store::Memory(v) => {
                            let before = v.len();
                            *v = without(v, subxid);
                            self.in_memory -= before - v.len();
                        }
                        Store::File { .. } => h.aborted.push(subxid),
                    }
                }
                Ok(Fed::Taken)
            }
            (_, Some(xid)) => {
                let subxid = u32_at(rest, 0, tag, "xid of a streamed change")?;
                self.hold(xid, subxid, tag, &rest[4..])?;
                Ok(Fed::Taken)
            }
            (_, None) => Ok(Fed::Pass),
        }
    }

    fn forget(&mut self, old: Held) {
        if let Store::Memory(v) = old.store {
            self.in_memory -= v.len();
        }
    }

    fn hold(&mut self, xid: u32, subxid: u32, tag: u8, rest: &[u8]) -> Result<(), StreamError> {
        let h = self.held.entry(xid).or_insert_with(|| Held {
            store: Store::Memory(Vec::new()),
            aborted: Vec::new(),
        });
        match &mut h.store {
            Store::Memory(v) => {
                let before = v.len();
                record(v, subxid, tag, rest);
                self.in_memory += v.len() - before;
            }
            Store::File { file } => {
                let mut head = [0u8; RECORD_HEAD + 1];
                head[..4].copy_from_slice(&subxid.to_be_bytes());
                head[4..8].copy_from_slice(&((rest.len() + 1) as u32).to_be_bytes());
                head[RECORD_HEAD] = tag;
                file.write_all(&head).map_err(StreamError::Spill)?;
                file.write_all(rest).map_err(StreamError::Spill)?;
            }
        }
        while self.in_memory > self.budget {
            self.spill_largest()?;
        }
        Ok(())
    }

    /// Moves the transaction holding the most memory to a spill file.
    fn spill_largest(&mut self) -> Result<(), StreamError> {
        let Some((&xid, _)) = self
            .held
            .iter()
            .filter_map(|(x, h)| match &h.store {
                Store::Memory(v) => Some((x, v.len())),
                Store::File { .. } => None,
            })
            .max_by_key(|(_, n)| *n)
        else {
            return Ok(());
        };
        let file = spill_file(&self.dir).map_err(StreamError::Spill)?;
        let mut file = BufWriter::with_capacity(1 << 16, file);
        let Some(h) = self.held.get_mut(&xid) else {
            return Ok(());
        };
        if let Store::Memory(v) = &h.store {
            file.write_all(v).map_err(StreamError::Spill)?;
            self.in_memory -= v.len();
        }
        h.store = Store::File { file };
        self.spills += 1;
        tracing::debug!(
            xid,
            spills = self.spills,
            "freshen-postgres: a streamed transaction outgrew stream_memory: held in a temporary file until its commit"
        );
        Ok(())
    }
}

/// A record list without the records of `subxid`.
fn without(v: &[u8], subxid: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    let mut at = 0;
    while at + RECORD_HEAD <= v.len() {
        let sub = u32::from_be_bytes([v[at], v[at + 1], v[at + 2], v[at + 3]]);
        let len = u32::from_be_bytes([v[at + 4], v[at + 5], v[at + 6], v[at + 7]]) as usize;
        let end = (at + RECORD_HEAD + len).min(v.len());
        if sub != subxid {
            out.extend_from_slice(&v[at..end]);
        }
        at = end;
    }
    out
}

#[derive(Debug)]
enum Source {
    Memory(Vec<u8>, usize),
    File(BufReader<File>),
}

/// A committed streamed transaction, its messages read back in stream order.
#[derive(Debug)]
pub(crate) struct Replay {
    /// The top-level xid.
    pub(crate) xid: u32,
    /// The LSN of the commit record: the `final_lsn` of the Begin replayed.
    pub(crate) commit_lsn: u64,
    /// The end of the commit record: what acknowledging the transaction confirms.
    pub(crate) end_lsn: u64,
    /// Microseconds since 2000-01-01 UTC.
    pub(crate) commit_ts: i64,
    source: Source,
    aborted: Vec<u32>,
}

impl Replay {
    /// Puts the next held message (tag first, without its xid, as protocol 1 sends it)
    /// into `buf`; `false` once every message was read.
    pub(crate) fn next_into(&mut self, buf: &mut Vec<u8>) -> Result<bool, StreamError> {
        loop {
            let mut head = [0u8; RECORD_HEAD];
            match &mut self.source {
                Source::Memory(v, at) => {
                    let Some(h) = v.get(*at..*at + RECORD_HEAD) else {
                        return Ok(false);
                    };
                    head.copy_from_slice(h);
                    let len = u32::from_be_bytes([head[4], head[5], head[6], head[7]]) as usize;
                    let start = *at + RECORD_HEAD;
                    let body = v
                        .get(start..start + len)
                        .ok_or_else(|| malformed(b'c', "a held message was cut short"))?;
                    buf.clear();
                    buf.extend_from_slice(body);
                    *at = start + len;
                }
                Source::File(r) => {
                    match r.read_exact(&mut head) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
                        Err(e) => return Err(StreamError::Spill(e)),
                    }
                    let len = u32::from_be_bytes([head[4], head[5], head[6], head[7]]) as usize;
                    buf.clear();
                    buf.resize(len, 0);
                    r.read_exact(buf).map_err(StreamError::Spill)?;
                }
            }
            let sub = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
            if !self.aborted.contains(&sub) {
                return Ok(true);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Protocol 2 stream messages laid out as the walsender writes them.

    pub(crate) fn start(xid: u32, first: bool) -> Vec<u8> {
        let mut b = vec![b'S'];
        b.extend(xid.to_be_bytes());
        b.push(u8::from(first));
        b
    }

    pub(crate) fn stop() -> Vec<u8> {
        vec![b'E']
    }

    pub(crate) fn commit(xid: u32, commit_lsn: u64, end_lsn: u64, ts: i64) -> Vec<u8> {
        let mut b = vec![b'c'];
        b.extend(xid.to_be_bytes());
        b.push(0);
        b.extend(commit_lsn.to_be_bytes());
        b.extend(end_lsn.to_be_bytes());
        b.extend(ts.to_be_bytes());
        b
    }

    pub(crate) fn abort(xid: u32, subxid: u32) -> Vec<u8> {
        let mut b = vec![b'A'];
        b.extend(xid.to_be_bytes());
        b.extend(subxid.to_be_bytes());
        b
    }

    /// A protocol 1 message as streamed: the xid put after its tag.
    pub(crate) fn streamed(subxid: u32, msg: &[u8]) -> Vec<u8> {
        let mut b = vec![msg[0]];
        b.extend(subxid.to_be_bytes());
        b.extend(&msg[1..]);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use crate::capture::pgoutput::fixtures as p1;
    use crate::config::DEFAULT_STREAM_MEMORY;

    fn streams(budget: usize) -> Streams {
        Streams::new(budget, std::env::temp_dir())
    }

    fn ins(id: &str) -> Vec<u8> {
        p1::insert(1, &[Some(Some(id))])
    }

    fn taken(s: &mut Streams, m: &[u8]) {
        assert!(
            matches!(s.feed(m).unwrap(), Fed::Taken),
            "{:?}",
            m[0] as char
        );
    }

    fn replay(s: &mut Streams, m: &[u8]) -> (Replay, Vec<Vec<u8>>) {
        let Fed::Commit(mut r) = s.feed(m).unwrap() else {
            panic!("no replay");
        };
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while r.next_into(&mut buf).unwrap() {
            out.push(buf.clone());
        }
        (r, out)
    }

    #[test]
    fn interleaved_transactions_replay_each_in_order() {
        let mut s = streams(DEFAULT_STREAM_MEMORY);
        let rel = p1::relation(1, "s", "t", b'd', &[(true, "a", 23)]);
        taken(&mut s, &start(10, true));
        taken(&mut s, &streamed(10, &rel));
        taken(&mut s, &streamed(10, &ins("1")));
        taken(&mut s, &stop());
        taken(&mut s, &start(20, true));
        taken(&mut s, &streamed(20, &rel));
        taken(&mut s, &streamed(20, &ins("100")));
        taken(&mut s, &stop());
        taken(&mut s, &start(10, false));
        taken(&mut s, &streamed(10, &ins("2")));
        taken(&mut s, &stop());
        assert_eq!(s.open(), 2);
        // A non-streamed transaction between blocks is decoded as today.
        assert!(matches!(s.feed(&p1::begin(5, 6, 30)).unwrap(), Fed::Pass));
        assert!(matches!(s.feed(&ins("9")).unwrap(), Fed::Pass));
        let (r, msgs) = replay(&mut s, &commit(20, 500, 508, 77));
        assert_eq!(
            (r.xid, r.commit_lsn, r.end_lsn, r.commit_ts),
            (20, 500, 508, 77)
        );
        assert_eq!(msgs, vec![rel.clone(), ins("100")]);
        let (r, msgs) = replay(&mut s, &commit(10, 600, 608, 78));
        assert_eq!(r.xid, 10);
        assert_eq!(msgs, vec![rel, ins("1"), ins("2")]);
        assert_eq!(s.open(), 0);
        assert_eq!(s.in_memory(), 0);
    }

    #[test]
    fn subtransaction_abort_drops_only_its_messages() {
        let mut s = streams(DEFAULT_STREAM_MEMORY);
        taken(&mut s, &start(10, true));
        taken(&mut s, &streamed(10, &ins("1")));
        taken(&mut s, &streamed(11, &ins("2")));
        taken(&mut s, &streamed(12, &ins("3")));
        taken(&mut s, &streamed(10, &ins("4")));
        taken(&mut s, &stop());
        taken(&mut s, &abort(10, 11));
        // An abort of an unknown transaction changes nothing.
        taken(&mut s, &abort(99, 98));
        let (_, msgs) = replay(&mut s, &commit(10, 1, 2, 3));
        assert_eq!(msgs, vec![ins("1"), ins("3"), ins("4")]);
    }

    #[test]
    fn top_level_abort_drops_the_transaction() {
        let mut s = streams(DEFAULT_STREAM_MEMORY);
        taken(&mut s, &start(10, true));
        taken(&mut s, &streamed(10, &ins("1")));
        taken(&mut s, &stop());
        taken(&mut s, &start(20, true));
        taken(&mut s, &streamed(20, &ins("5")));
        taken(&mut s, &stop());
        taken(&mut s, &abort(10, 10));
        assert_eq!(s.open(), 1);
        // A commit of a transaction nothing is held of replays nothing.
        let (_, msgs) = replay(&mut s, &commit(10, 1, 2, 3));
        assert!(msgs.is_empty());
        let (_, msgs) = replay(&mut s, &commit(20, 4, 5, 6));
        assert_eq!(msgs, vec![ins("5")]);
        assert_eq!(s.in_memory(), 0);
    }

    #[test]
    fn a_first_segment_again_restarts_the_transaction() {
        let mut s = streams(DEFAULT_STREAM_MEMORY);
        taken(&mut s, &start(10, true));
        taken(&mut s, &streamed(10, &ins("1")));
        taken(&mut s, &stop());
        taken(&mut s, &start(10, true));
        taken(&mut s, &streamed(10, &ins("1")));
        taken(&mut s, &streamed(10, &ins("2")));
        taken(&mut s, &stop());
        let (_, msgs) = replay(&mut s, &commit(10, 1, 2, 3));
        assert_eq!(msgs, vec![ins("1"), ins("2")]);
    }

    #[test]
    fn a_new_session_forgets_what_was_held() {
        let mut s = streams(DEFAULT_STREAM_MEMORY);
        taken(&mut s, &start(10, true));
        taken(&mut s, &streamed(10, &ins("1")));
        s.reset();
        assert_eq!((s.open(), s.in_memory()), (0, 0));
        // The block was cut by the reconnect: a new start is not nested.
        taken(&mut s, &start(10, true));
        taken(&mut s, &stop());
    }

    #[test]
    fn past_the_budget_the_largest_spills_and_replays_in_order() {
        let one = RECORD_HEAD + ins("0").len();
        // Room for three records in memory.
        let mut s = streams(3 * one + 1);
        taken(&mut s, &start(10, true));
        for i in 0..3 {
            taken(&mut s, &streamed(10, &ins(&i.to_string())));
        }
        taken(&mut s, &stop());
        taken(&mut s, &start(20, true));
        taken(&mut s, &streamed(20, &ins("7")));
        taken(&mut s, &stop());
        assert_eq!(
            s.spills(),
            1,
            "four records exceed the budget: xid 10 spilled"
        );
        assert_eq!(s.in_memory(), one);
        taken(&mut s, &start(10, false));
        for i in 3..1000 {
            taken(&mut s, &streamed(10 + (i % 2), &ins(&(i % 10).to_string())));
        }
        taken(&mut s, &stop());
        assert_eq!(s.spills(), 1, "a spilled transaction grows in its file");
        assert_eq!(s.in_memory(), one);
        taken(&mut s, &abort(10, 11));
        let (_, msgs) = replay(&mut s, &commit(10, 1, 2, 3));
        let want: Vec<Vec<u8>> = (0..1000)
            .filter(|i| *i < 3 || i % 2 == 0)
            .map(|i| ins(&(i % 10).to_string()))
            .collect();
        assert_eq!(msgs, want);
        let (_, msgs) = replay(&mut s, &commit(20, 4, 5, 6));
        assert_eq!(msgs, vec![ins("7")]);
        assert_eq!(s.in_memory(), 0);
    }

    #[test]
    fn a_spill_file_leaves_no_name_and_is_the_owners_alone() {
        use std::io::{Read, Seek, Write};
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("freshen-spill-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut f = spill_file(&dir).unwrap();
        f.write_all(b"raw row").unwrap();
        f.rewind().unwrap();
        let mut back = String::new();
        f.read_to_string(&mut back).unwrap();
        assert_eq!(back, "raw row");
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no name left");
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_zero_budget_spills_everything() {
        let mut s = streams(0);
        taken(&mut s, &start(10, true));
        taken(&mut s, &streamed(10, &ins("1")));
        taken(&mut s, &streamed(10, &ins("2")));
        taken(&mut s, &stop());
        assert_eq!((s.spills(), s.in_memory()), (1, 0));
        let (_, msgs) = replay(&mut s, &commit(10, 1, 2, 3));
        assert_eq!(msgs, vec![ins("1"), ins("2")]);
    }

    #[test]
    fn malformed_stream_messages_are_errors() {
        let bad = |s: &mut Streams, m: &[u8], says: &str| {
            let e = s.feed(m).expect_err("malformed").to_string();
            assert!(e.contains(says), "{e}");
        };
        let mut s = streams(DEFAULT_STREAM_MEMORY);
        bad(&mut s, &[b'S', 0, 0], "truncated before the xid");
        bad(&mut s, &[b'S', 0, 0, 0, 1], "first-segment flag");
        bad(&mut s, &stop(), "without a stream start");
        bad(&mut s, &commit(1, 2, 3, 4)[..20], "end LSN");
        bad(&mut s, &[b'A', 0, 0, 0, 1, 0], "subtransaction xid");
        let mut long = abort(1, 2);
        long.push(0);
        bad(&mut s, &long, "expected 8");
        taken(&mut s, &start(10, true));
        bad(&mut s, &start(11, true), "inside the open block of xid 10");
        bad(&mut s, &commit(10, 1, 2, 3), "inside the open stream block");
        bad(&mut s, &abort(10, 10), "inside the open stream block");
        bad(&mut s, &[b'I', 0, 0], "xid of a streamed change");
        // Still in the block: a good message is held.
        taken(&mut s, &streamed(10, &ins("1")));
    }

    /// Feeds protocol 1 messages: Begin and Commit as the replication client hands them
    /// over (parsed), the rest as raw messages.
    fn feed_p1(a: &mut crate::capture::assemble::Assembler, msgs: &[Vec<u8>]) -> Vec<Output> {
        let mut out = Vec::new();
        for m in msgs {
            match crate::capture::pgoutput::decode(m).unwrap() {
                Message::Begin {
                    final_lsn,
                    commit_ts,
                    xid,
                } => a.begin(final_lsn, xid, commit_ts),
                Message::Commit { end_lsn, .. } => {
                    a.commit(end_lsn);
                }
                _ => out.extend(a.change(m)),
            }
        }
        out.extend(a.take());
        out
    }

    fn assembler() -> crate::capture::assemble::Assembler {
        crate::capture::assemble::Assembler::new(
            crate::capture::rows::Relations::new(None),
            crate::capture::xid::XidClock::new(1000),
            4,
        )
    }

    use crate::capture::assemble::Output;
    use crate::capture::pgoutput::Message;

    #[test]
    fn a_replayed_transaction_assembles_as_protocol_1_sends_it() {
        let rel = p1::relation(1, "public", "t", b'd', &[(true, "id", 23)]);
        let mut mark = vec![b'M', 1];
        mark.extend(700u64.to_be_bytes());
        mark.extend(b"freshen.watermark\0");
        mark.extend(2i32.to_be_bytes());
        mark.extend(b"w1");
        let body: Vec<Vec<u8>> = std::iter::once(rel.clone())
            .chain((0..6).map(|i| ins(&i.to_string())))
            .chain([mark.clone(), p1::delete(1, b'K', &[Some(Some("3"))])])
            .collect();
        let mut whole = vec![p1::begin(900, 55, 42)];
        whole.extend(body.iter().cloned());
        whole.push(p1::commit(900, 908, 55));
        let want = feed_p1(&mut assembler(), &whole);

        let mut s = streams(0);
        let mut a = assembler();
        let mut got = Vec::new();
        for (i, m) in body.iter().enumerate() {
            if i % 3 == 0 {
                taken(&mut s, &start(42, i == 0));
            }
            taken(&mut s, &streamed(42, m));
            if i % 3 == 2 {
                taken(&mut s, &stop());
            }
        }
        assert_eq!(body.len() % 3, 0, "the last block was stopped");
        let Fed::Commit(mut r) = s.feed(&commit(42, 900, 908, 55)).unwrap() else {
            panic!("no replay");
        };
        a.begin(r.commit_lsn, r.xid, r.commit_ts);
        let mut buf = Vec::new();
        while r.next_into(&mut buf).unwrap() {
            got.extend(a.change(&buf));
        }
        a.commit(r.end_lsn);
        got.extend(a.take());

        let view = |o: &[Output]| {
            o.iter()
                .map(|b| {
                    (
                        b.events.clone(),
                        b.marks.clone(),
                        b.commit_end,
                        b.committed_through,
                        b.skipped.len(),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(view(&got), view(&want));
        assert_eq!(got.len(), 2, "batches of four");
        assert_eq!(
            got[1].marks.len(),
            1,
            "the streamed logical message is kept"
        );
        assert_eq!(got[1].commit_end, Some(908));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_never_panic(msgs in proptest::collection::vec(
            proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40), 0..30)) {
            let mut s = streams(64);
            for m in &msgs {
                if let Ok(Fed::Commit(mut r)) = s.feed(m) {
                    let mut buf = Vec::new();
                    while let Ok(true) = r.next_into(&mut buf) {}
                }
            }
        }
    }
}
