//! The pgoutput wire format (protocol version 1; protocol 2's stream messages and the
//! xid they put in front of a streamed change are taken apart by `streamed.rs` first),
//! decoded without allocation where
//! possible and without a panic on any input: every read is bounds-checked and a
//! malformed message is an error, never a crash.
//!
//! Reference: PostgreSQL's "Logical Replication Message Formats".

use std::fmt;

/// A malformed or unsupported pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The message tag, when one was read.
    pub tag: Option<u8>,
    /// What was wrong.
    pub reason: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tag {
            Some(t) if t.is_ascii_graphic() => {
                write!(
                    f,
                    "malformed pgoutput message '{}': {}",
                    t as char, self.reason
                )
            }
            Some(t) => write!(f, "malformed pgoutput message 0x{t:02x}: {}", self.reason),
            None => write!(f, "malformed pgoutput message: {}", self.reason),
        }
    }
}

impl std::error::Error for DecodeError {}

/// One column value of a tuple, as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Datum<'a> {
    /// SQL NULL (also every non-key column of a key-only old image).
    Null,
    /// An unchanged TOASTed value that was not sent.
    Unchanged,
    /// The value in the type's text output form.
    Text(&'a [u8]),
    /// The value in the type's binary form (only with the `binary` option).
    Binary(&'a [u8]),
}

/// The column values of one row image.
pub(crate) type Tuple<'a> = Vec<Datum<'a>>;

/// A column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RelationColumn {
    /// Part of the replica identity key.
    pub(crate) key: bool,
    pub(crate) name: String,
    pub(crate) type_oid: u32,
    pub(crate) type_modifier: i32,
}

/// A table's description, sent before its first change in a session and again after
/// it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    pub(crate) oid: u32,
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// `d` default (primary key), `n` nothing, `f` full, `i` index.
    pub(crate) replica_identity: u8,
    pub(crate) columns: Vec<RelationColumn>,
}

/// The former row image an UPDATE or DELETE carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OldImage<'a> {
    /// `K`: only the replica identity key columns (others are NULL placeholders).
    Key(Tuple<'a>),
    /// `O`: the whole former row (REPLICA IDENTITY FULL).
    Full(Tuple<'a>),
}

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message<'a> {
    Begin {
        final_lsn: u64,
        /// Microseconds since 2000-01-01 UTC.
        commit_ts: i64,
        xid: u32,
    },
    Commit {
        flags: u8,
        commit_lsn: u64,
        end_lsn: u64,
        commit_ts: i64,
    },
    Origin {
        commit_lsn: u64,
        name: &'a str,
    },
    Relation(Relation),
    Type {
        oid: u32,
        namespace: &'a str,
        name: &'a str,
    },
    Insert {
        relation: u32,
        new: Tuple<'a>,
    },
    Update {
        relation: u32,
        old: Option<OldImage<'a>>,
        new: Tuple<'a>,
    },
    Delete {
        relation: u32,
        old: OldImage<'a>,
    },
    Truncate {
        /// Bit 1: CASCADE, bit 2: RESTART IDENTITY.
        options: u8,
        relations: Vec<u32>,
    },
    Logical {
        transactional: bool,
        lsn: u64,
        prefix: &'a str,
        content: &'a [u8],
    },
}

/// Bounds-checked reader over one message.
struct Reader<'a> {
    buf: &'a [u8],
    tag: u8,
}

impl<'a> Reader<'a> {
    fn err(&self, reason: impl Into<String>) -> DecodeError {
        DecodeError {
            tag: Some(self.tag),
            reason: reason.into(),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(self.err(format!(
                "truncated {what}: need {n} bytes, {} left",
                self.buf.len()
            )));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    fn i16(&mut self, what: &str) -> Result<i16, DecodeError> {
        let b = self.take(2, what)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i32(&mut self, what: &str) -> Result<i32, DecodeError> {
        Ok(self.u32(what)? as i32)
    }

    fn u64(&mut self, what: &str) -> Result<u64, DecodeError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    fn i64(&mut self, what: &str) -> Result<i64, DecodeError> {
        Ok(self.u64(what)? as i64)
    }

    /// A NUL-terminated UTF-8 string.
    fn cstr(&mut self, what: &str) -> Result<&'a str, DecodeError> {
        let Some(end) = self.buf.iter().position(|&b| b == 0) else {
            return Err(self.err(format!("{what}: missing NUL terminator")));
        };
        let bytes = &self.buf[..end];
        self.buf = &self.buf[end + 1..];
        std::str::from_utf8(bytes).map_err(|_| self.err(format!("{what}: not UTF-8")))
    }

    fn tuple(&mut self) -> Result<Tuple<'a>, DecodeError> {
        let n = self.i16("tuple column count")?;
        if n < 0 {
            return Err(self.err(format!("negative column count {n}")));
        }
        // Each column takes at least one byte: a count larger than what is left is a
        // lie, and must not size an allocation.
        if n as usize > self.buf.len() {
            return Err(self.err(format!("column count {n} exceeds the message")));
        }
        let mut cols = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let d = match self.u8("column kind")? {
                b'n' => Datum::Null,
                b'u' => Datum::Unchanged,
                kind @ (b't' | b'b') => {
                    let len = self.i32("column length")?;
                    if len < 0 {
                        return Err(self.err(format!("negative column length {len}")));
                    }
                    let data = self.take(len as usize, "column value")?;
                    if kind == b't' {
                        Datum::Text(data)
                    } else {
                        Datum::Binary(data)
                    }
                }
                other => return Err(self.err(format!("unknown column kind 0x{other:02x}"))),
            };
            cols.push(d);
        }
        Ok(cols)
    }

    fn done(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.err(format!("{} trailing bytes", self.buf.len())))
        }
    }
}

/// Decodes one pgoutput message (the payload of one XLogData).
pub(crate) fn decode(data: &[u8]) -> Result<Message<'_>, DecodeError> {
    let Some((&tag, rest)) = data.split_first() else {
        return Err(DecodeError {
            tag: None,
            reason: "empty message".into(),
        });
    };
    let mut r = Reader { buf: rest, tag };
    let msg = match tag {
        b'B' => Message::Begin {
            final_lsn: r.u64("final LSN")?,
            commit_ts: r.i64("commit timestamp")?,
            xid: r.u32("xid")?,
        },
        b'C' => Message::Commit {
            flags: r.u8("flags")?,
            commit_lsn: r.u64("commit LSN")?,
            end_lsn: r.u64("end LSN")?,
            commit_ts: r.i64("commit timestamp")?,
        },
        b'O' => Message::Origin {
            commit_lsn: r.u64("origin commit LSN")?,
            name: r.cstr("origin name")?,
        },
        b'R' => {
            let oid = r.u32("relation oid")?;
            let namespace = r.cstr("namespace")?;
            let name = r.cstr("relation name")?;
            let replica_identity = r.u8("replica identity")?;
            let n = r.i16("column count")?;
            if n < 0 || n as usize > r.buf.len() {
                return Err(r.err(format!("bad column count {n}")));
            }
            let mut columns = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let flags = r.u8("column flags")?;
                columns.push(RelationColumn {
                    key: flags & 1 == 1,
                    name: r.cstr("column name")?.to_owned(),
                    type_oid: r.u32("column type")?,
                    type_modifier: r.i32("column type modifier")?,
                });
            }
            Message::Relation(Relation {
                oid,
                // An empty namespace means pg_catalog.
                namespace: if namespace.is_empty() {
                    "pg_catalog".to_owned()
                } else {
                    namespace.to_owned()
                },
                name: name.to_owned(),
                replica_identity,
                columns,
            })
        }
        b'Y' => Message::Type {
            oid: r.u32("type oid")?,
            namespace: r.cstr("type namespace")?,
            name: r.cstr("type name")?,
        },
        b'I' => {
            let relation = r.u32("relation oid")?;
            match r.u8("tuple marker")? {
                b'N' => {}
                m => return Err(r.err(format!("expected new tuple 'N', got 0x{m:02x}"))),
            }
            Message::Insert {
                relation,
                new: r.tuple()?,
            }
        }
        b'U' => {
            let relation = r.u32("relation oid")?;
            let (old, new) = match r.u8("tuple marker")? {
                b'K' => {
                    let old = OldImage::Key(r.tuple()?);
                    match r.u8("tuple marker")? {
                        b'N' => (Some(old), r.tuple()?),
                        m => return Err(r.err(format!("expected 'N' after 'K', got 0x{m:02x}"))),
                    }
                }
                b'O' => {
                    let old = OldImage::Full(r.tuple()?);
                    match r.u8("tuple marker")? {
                        b'N' => (Some(old), r.tuple()?),
                        m => return Err(r.err(format!("expected 'N' after 'O', got 0x{m:02x}"))),
                    }
                }
                b'N' => (None, r.tuple()?),
                m => return Err(r.err(format!("unknown tuple marker 0x{m:02x}"))),
            };
            Message::Update { relation, old, new }
        }
        b'D' => {
            let relation = r.u32("relation oid")?;
            let old = match r.u8("tuple marker")? {
                b'K' => OldImage::Key(r.tuple()?),
                b'O' => OldImage::Full(r.tuple()?),
                m => return Err(r.err(format!("expected 'K' or 'O', got 0x{m:02x}"))),
            };
            Message::Delete { relation, old }
        }
        b'T' => {
            let n = r.i32("relation count")?;
            if n < 0 || (n as usize).saturating_mul(4) > r.buf.len().saturating_sub(1) {
                return Err(r.err(format!("bad relation count {n}")));
            }
            let options = r.u8("truncate options")?;
            let mut relations = Vec::with_capacity(n as usize);
            for _ in 0..n {
                relations.push(r.u32("relation oid")?);
            }
            Message::Truncate { options, relations }
        }
        b'M' => {
            let flags = r.u8("message flags")?;
            let lsn = r.u64("message LSN")?;
            let prefix = r.cstr("message prefix")?;
            let len = r.i32("message length")?;
            if len < 0 {
                return Err(r.err(format!("negative message length {len}")));
            }
            Message::Logical {
                transactional: flags & 1 == 1,
                lsn,
                prefix,
                content: r.take(len as usize, "message content")?,
            }
        }
        b'S' | b'E' | b'c' | b'A' => {
            return Err(
                r.err("a stream message (protocol 2) in a session that did not ask for streaming")
            );
        }
        _ => return Err(r.err("unknown message type")),
    };
    r.done()?;
    Ok(msg)
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Builders for pgoutput byte fixtures, laid out exactly as the walsender writes them.

    pub(crate) fn begin(final_lsn: u64, commit_ts: i64, xid: u32) -> Vec<u8> {
        let mut b = vec![b'B'];
        b.extend(final_lsn.to_be_bytes());
        b.extend(commit_ts.to_be_bytes());
        b.extend(xid.to_be_bytes());
        b
    }

    pub(crate) fn commit(commit_lsn: u64, end_lsn: u64, commit_ts: i64) -> Vec<u8> {
        let mut b = vec![b'C', 0];
        b.extend(commit_lsn.to_be_bytes());
        b.extend(end_lsn.to_be_bytes());
        b.extend(commit_ts.to_be_bytes());
        b
    }

    fn cstr(b: &mut Vec<u8>, s: &str) {
        b.extend(s.as_bytes());
        b.push(0);
    }

    /// `cols`: (is key, name, type oid).
    pub(crate) fn relation(
        oid: u32,
        ns: &str,
        name: &str,
        ident: u8,
        cols: &[(bool, &str, u32)],
    ) -> Vec<u8> {
        let mut b = vec![b'R'];
        b.extend(oid.to_be_bytes());
        cstr(&mut b, ns);
        cstr(&mut b, name);
        b.push(ident);
        b.extend((cols.len() as i16).to_be_bytes());
        for (key, n, ty) in cols {
            b.push(u8::from(*key));
            cstr(&mut b, n);
            b.extend(ty.to_be_bytes());
            b.extend((-1i32).to_be_bytes());
        }
        b
    }

    /// Tuple column: `None` NULL, `Some(None)` unchanged TOAST, `Some(Some(text))`.
    pub(crate) type Col<'a> = Option<Option<&'a str>>;

    pub(crate) fn tuple(b: &mut Vec<u8>, cols: &[Col<'_>]) {
        b.extend((cols.len() as i16).to_be_bytes());
        for c in cols {
            match c {
                None => b.push(b'n'),
                Some(None) => b.push(b'u'),
                Some(Some(t)) => {
                    b.push(b't');
                    b.extend((t.len() as i32).to_be_bytes());
                    b.extend(t.as_bytes());
                }
            }
        }
    }

    pub(crate) fn insert(rel: u32, new: &[Col<'_>]) -> Vec<u8> {
        let mut b = vec![b'I'];
        b.extend(rel.to_be_bytes());
        b.push(b'N');
        tuple(&mut b, new);
        b
    }

    /// `old`: (marker `K`/`O`, columns).
    pub(crate) fn update(rel: u32, old: Option<(u8, &[Col<'_>])>, new: &[Col<'_>]) -> Vec<u8> {
        let mut b = vec![b'U'];
        b.extend(rel.to_be_bytes());
        if let Some((m, cols)) = old {
            b.push(m);
            tuple(&mut b, cols);
        }
        b.push(b'N');
        tuple(&mut b, new);
        b
    }

    pub(crate) fn delete(rel: u32, marker: u8, old: &[Col<'_>]) -> Vec<u8> {
        let mut b = vec![b'D'];
        b.extend(rel.to_be_bytes());
        b.push(marker);
        tuple(&mut b, old);
        b
    }

    pub(crate) fn truncate(options: u8, rels: &[u32]) -> Vec<u8> {
        let mut b = vec![b'T'];
        b.extend((rels.len() as i32).to_be_bytes());
        b.push(options);
        for r in rels {
            b.extend(r.to_be_bytes());
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn begin_and_commit() {
        assert_eq!(
            decode(&begin(0x1_0000_0010, 7, 42)).unwrap(),
            Message::Begin {
                final_lsn: 0x1_0000_0010,
                commit_ts: 7,
                xid: 42
            }
        );
        assert_eq!(
            decode(&commit(100, 120, 9)).unwrap(),
            Message::Commit {
                flags: 0,
                commit_lsn: 100,
                end_lsn: 120,
                commit_ts: 9
            }
        );
    }

    #[test]
    fn relation_with_key_flags_and_pg_catalog_default() {
        let bytes = relation(16384, "", "t", b'd', &[(true, "id", 23), (false, "v", 25)]);
        let Message::Relation(r) = decode(&bytes).unwrap() else {
            panic!("not a relation")
        };
        assert_eq!(r.oid, 16384);
        assert_eq!(r.namespace, "pg_catalog");
        assert_eq!(r.replica_identity, b'd');
        assert_eq!(r.columns.len(), 2);
        assert!(r.columns[0].key && !r.columns[1].key);
        assert_eq!(r.columns[1].type_oid, 25);
        assert_eq!(r.columns[1].type_modifier, -1);
    }

    #[test]
    fn insert_with_null_unchanged_and_text() {
        let bytes = insert(5, &[Some(Some("1")), None, Some(None), Some(Some(""))]);
        assert_eq!(
            decode(&bytes).unwrap(),
            Message::Insert {
                relation: 5,
                new: vec![
                    Datum::Text(b"1"),
                    Datum::Null,
                    Datum::Unchanged,
                    Datum::Text(b"")
                ]
            }
        );
    }

    #[test]
    fn the_three_update_shapes() {
        let new: &[Col<'_>] = &[Some(Some("2")), Some(Some("b"))];
        let (b1, b2, b3) = (
            update(5, None, new),
            update(5, Some((b'K', &[Some(Some("1")), None])), new),
            update(5, Some((b'O', &[Some(Some("1")), Some(Some("a"))])), new),
        );
        let plain = decode(&b1).unwrap();
        assert!(matches!(plain, Message::Update { old: None, .. }));
        let key = decode(&b2).unwrap();
        assert!(
            matches!(key, Message::Update { old: Some(OldImage::Key(ref t)), .. } if t[0] == Datum::Text(b"1"))
        );
        let full = decode(&b3).unwrap();
        assert!(
            matches!(full, Message::Update { old: Some(OldImage::Full(ref t)), .. } if t[1] == Datum::Text(b"a"))
        );
    }

    #[test]
    fn delete_and_truncate() {
        let bytes = delete(5, b'K', &[Some(Some("9"))]);
        let d = decode(&bytes).unwrap();
        assert_eq!(
            d,
            Message::Delete {
                relation: 5,
                old: OldImage::Key(vec![Datum::Text(b"9")])
            }
        );
        assert_eq!(
            decode(&truncate(3, &[5, 6])).unwrap(),
            Message::Truncate {
                options: 3,
                relations: vec![5, 6]
            }
        );
    }

    #[test]
    fn origin_type_message() {
        let mut o = vec![b'O'];
        o.extend(77u64.to_be_bytes());
        o.extend(b"node_a\0");
        assert_eq!(
            decode(&o).unwrap(),
            Message::Origin {
                commit_lsn: 77,
                name: "node_a"
            }
        );
        let mut y = vec![b'Y'];
        y.extend(16500u32.to_be_bytes());
        y.extend(b"public\0mood\0");
        assert_eq!(
            decode(&y).unwrap(),
            Message::Type {
                oid: 16500,
                namespace: "public",
                name: "mood"
            }
        );
        let mut m = vec![b'M', 1];
        m.extend(5u64.to_be_bytes());
        m.extend(b"app\0");
        m.extend(3i32.to_be_bytes());
        m.extend(b"xyz");
        assert_eq!(
            decode(&m).unwrap(),
            Message::Logical {
                transactional: true,
                lsn: 5,
                prefix: "app",
                content: b"xyz"
            }
        );
    }

    #[test]
    fn malformed_messages_are_errors() {
        assert!(decode(&[]).is_err());
        assert!(decode(b"Z").is_err());
        assert!(decode(&begin(1, 2, 3)[..10]).is_err());
        let mut extra = commit(1, 2, 3);
        extra.push(0);
        assert!(decode(&extra).unwrap_err().reason.contains("trailing"));
        let mut huge = vec![b'I', 0, 0, 0, 5, b'N'];
        huge.extend(i16::MAX.to_be_bytes());
        assert!(
            decode(&huge).is_err(),
            "a lying column count must not allocate"
        );
        let mut neg = vec![b'I', 0, 0, 0, 5, b'N', 0, 1, b't'];
        neg.extend((-5i32).to_be_bytes());
        assert!(decode(&neg).is_err());
        let mut bad_t = vec![b'T'];
        bad_t.extend(i32::MAX.to_be_bytes());
        bad_t.push(0);
        assert!(decode(&bad_t).is_err());
        assert!(
            decode(b"S\0\0\0\x01\x01")
                .unwrap_err()
                .reason
                .contains("protocol 2")
        );
        let e = decode(b"Z").unwrap_err();
        assert!(e.to_string().contains("'Z'"));
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn never_panics_on_corrupted_fixtures(
            which in 0usize..6,
            pos in any::<usize>(),
            byte in any::<u8>(),
            cut in any::<usize>(),
        ) {
            let mut bytes = match which {
                0 => relation(1, "s", "t", b'f', &[(true, "a", 23), (false, "b", 25)]),
                1 => insert(1, &[Some(Some("1")), None]),
                2 => update(1, Some((b'O', &[Some(Some("1")), Some(None)])), &[Some(Some("2")), None]),
                3 => delete(1, b'K', &[Some(Some("1"))]),
                4 => truncate(0, &[1, 2, 3]),
                _ => commit(1, 2, 3),
            };
            let i = pos % bytes.len();
            bytes[i] = byte;
            bytes.truncate(cut % (bytes.len() + 1));
            let _ = decode(&bytes);
        }
    }
}
