//! The key stream's records: what a capture instance publishes for each dirtied scope
//! key, how it is written as bytes, and which partition owns it (pure, no I/O).
//!
//! A record's value is
//!
//! ```text
//! "fk1"                         magic and version
//! u8 flags                      bit 0: txid present, bit 1: position present
//! u64 txid, u64 position        big-endian, each only when its flag is set
//! u16 view length, view bytes   UTF-8
//! u16 parts, then per part      u8 0 (NULL) | u8 1, u32 length, UTF-8 bytes
//! ```
//!
//! or, for a change the capture instance cannot turn into keys (a TRUNCATE, a row gap),
//! a *gap record* (flag bit 2 alone): the view, then the schema, the table and the reason
//! (u16 length and UTF-8 bytes each). A gap record goes to every partition, so that
//! every worker's view sweeps (each rebuilding the keys it owns).
//!
//! Its Kafka key is the view and the key's parts (`view NUL parts…`, the same bytes the
//! partition is hashed from), for tools that read the topic; freshen never reads it.
//!
//! The partition is chosen explicitly, not by the producer's partitioner: the worker
//! must compute the same owner for a key when it fences its rebuilds
//! ([`partition_of`]), and librdkafka's partitioner is a client setting that a
//! `properties` entry could change on one side only. The hash is FNV-1a (64 bit) of the
//! Kafka key's bytes; it is part of the stream's format and never changes within
//! version `fk1`.

use std::fmt;

use freshen::Key;

const MAGIC: &[u8; 3] = b"fk1";
const HAS_TXID: u8 = 1;
const HAS_POSITION: u8 = 2;
const IS_GAP: u8 = 4;

/// What one key stream record says: a key to rebuild, or a gap to sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamRecord {
    /// A dirtied scope key.
    Key(KeyRecord),
    /// Rows of a table changed in a way that gives no key (a TRUNCATE): the view sweeps.
    Gap {
        /// The view.
        view: String,
        /// The table and why.
        gap: freshen::Gap,
    },
}

impl StreamRecord {
    /// Reads a record's value, key or gap.
    pub fn decode(bytes: &[u8]) -> Result<StreamRecord, KeyDecodeError> {
        if bytes.len() > 3 && bytes[..3] == MAGIC[..] && bytes[3] == IS_GAP {
            let mut r = Reader(&bytes[4..]);
            let mut text = || -> Result<String, KeyDecodeError> {
                let n = usize::from(r.u16()?);
                Ok(r.text(n)?.to_owned())
            };
            let (view, schema, table, reason) = (text()?, text()?, text()?, text()?);
            if !r.0.is_empty() {
                return Err(KeyDecodeError("trailing bytes"));
            }
            return Ok(StreamRecord::Gap {
                view,
                gap: freshen::Gap::new(schema, table, reason),
            });
        }
        KeyRecord::decode(bytes).map(StreamRecord::Key)
    }

    /// Appends a gap record's value for `view` to `out` (texts cut at 65535 bytes).
    pub fn encode_gap(view: &str, gap: &freshen::Gap, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        out.push(IS_GAP);
        for t in [view, &gap.schema, &gap.table, &gap.reason] {
            let mut end = t.len().min(usize::from(u16::MAX));
            while !t.is_char_boundary(end) {
                end -= 1;
            }
            out.extend_from_slice(&(end as u16).to_be_bytes());
            out.extend_from_slice(&t.as_bytes()[..end]);
        }
    }
}

/// One dirtied scope key, as the key stream carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// The view the key belongs to (its configured name).
    pub view: String,
    /// The scope key.
    pub key: Key,
    /// The transaction whose change dirtied the key (PostgreSQL `xid8`): the worker's
    /// rebuild must see it (the visibility guard).
    pub txid: Option<u64>,
    /// The change's position in the source (PostgreSQL: the commit's LSN).
    pub position: Option<u64>,
}

/// Why bytes are not a key record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDecodeError(&'static str);

impl fmt::Display for KeyDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a freshen key record: {}", self.0)
    }
}

impl std::error::Error for KeyDecodeError {}

impl KeyRecord {
    /// Appends the record's value to `out`. Fails when the view name or the key has more
    /// parts or bytes than the format holds (65535 bytes of view, 65535 parts, 4 GiB a
    /// part) — never for a key a database produces.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), KeyDecodeError> {
        out.extend_from_slice(MAGIC);
        let mut flags = 0;
        if self.txid.is_some() {
            flags |= HAS_TXID;
        }
        if self.position.is_some() {
            flags |= HAS_POSITION;
        }
        out.push(flags);
        if let Some(t) = self.txid {
            out.extend_from_slice(&t.to_be_bytes());
        }
        if let Some(p) = self.position {
            out.extend_from_slice(&p.to_be_bytes());
        }
        let view = u16::try_from(self.view.len()).map_err(|_| KeyDecodeError("view too long"))?;
        out.extend_from_slice(&view.to_be_bytes());
        out.extend_from_slice(self.view.as_bytes());
        encode_parts(&self.key, out)
    }

    /// Reads a record's value.
    pub fn decode(bytes: &[u8]) -> Result<KeyRecord, KeyDecodeError> {
        let mut r = Reader(bytes);
        if r.take(3)? != MAGIC {
            return Err(KeyDecodeError("unknown magic or version"));
        }
        let flags = r.u8()?;
        if flags & !(HAS_TXID | HAS_POSITION) != 0 {
            return Err(KeyDecodeError("unknown flags"));
        }
        let txid = (flags & HAS_TXID != 0).then(|| r.u64()).transpose()?;
        let position = (flags & HAS_POSITION != 0).then(|| r.u64()).transpose()?;
        let n = usize::from(r.u16()?);
        let view = r.text(n)?.to_owned();
        let parts = usize::from(r.u16()?);
        if parts == 0 {
            return Err(KeyDecodeError("a key has at least one part"));
        }
        let mut values: Vec<Option<&str>> = Vec::with_capacity(parts);
        for _ in 0..parts {
            match r.u8()? {
                0 => values.push(None),
                1 => {
                    let len = r.u32()? as usize;
                    values.push(Some(r.text(len)?));
                }
                _ => return Err(KeyDecodeError("unknown part tag")),
            }
        }
        if !r.0.is_empty() {
            return Err(KeyDecodeError("trailing bytes"));
        }
        Ok(KeyRecord {
            view,
            key: Key::from_parts(values),
            txid,
            position,
        })
    }

    /// The record's Kafka key: the view, NUL, the key's parts (as the value encodes them).
    pub fn kafka_key(&self) -> Vec<u8> {
        routing_bytes(&self.view, &self.key)
    }
}

fn encode_parts(key: &Key, out: &mut Vec<u8>) -> Result<(), KeyDecodeError> {
    let parts: Vec<Option<&str>> = key.parts().collect();
    let n = u16::try_from(parts.len()).map_err(|_| KeyDecodeError("too many key parts"))?;
    out.extend_from_slice(&n.to_be_bytes());
    for p in parts {
        match p {
            None => out.push(0),
            Some(s) => {
                let len =
                    u32::try_from(s.len()).map_err(|_| KeyDecodeError("key part too long"))?;
                out.push(1);
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(s.as_bytes());
            }
        }
    }
    Ok(())
}

fn routing_bytes(view: &str, key: &Key) -> Vec<u8> {
    let mut b = Vec::with_capacity(view.len() + 16);
    b.extend_from_slice(view.as_bytes());
    b.push(0);
    // A key too large to encode still routes: by its lossy prefix, consistently.
    let _ = encode_parts(key, &mut b);
    b
}

/// The partition (of `partitions`) that owns `key` of `view`. Capture and workers agree
/// on it whatever their client settings; it changes only with the partition count.
pub fn partition_of(view: &str, key: &Key, partitions: i32) -> i32 {
    let n = u64::try_from(partitions.max(1)).unwrap_or(1);
    // Below `partitions`, which is an i32.
    i32::try_from(fnv1a(&routing_bytes(view, key)) % n).unwrap_or(0)
}

/// FNV-1a, 64 bit: tiny, stable across platforms and releases, and spreads short keys.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], KeyDecodeError> {
        if self.0.len() < n {
            return Err(KeyDecodeError("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, KeyDecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, KeyDecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, KeyDecodeError> {
        let mut a = [0; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_be_bytes(a))
    }

    fn u64(&mut self) -> Result<u64, KeyDecodeError> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }

    fn text(&mut self, n: usize) -> Result<&'a str, KeyDecodeError> {
        std::str::from_utf8(self.take(n)?).map_err(|_| KeyDecodeError("text is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(r: &KeyRecord) -> KeyRecord {
        let mut b = Vec::new();
        r.encode_into(&mut b).unwrap();
        KeyRecord::decode(&b).unwrap()
    }

    #[test]
    fn records_roundtrip_with_and_without_positions() {
        let cases = [
            KeyRecord {
                view: "device_totals".into(),
                key: Key::from("dev-1"),
                txid: Some(7_000_000_000),
                position: Some(0x1_6B37_4D48),
            },
            KeyRecord {
                view: "v".into(),
                key: Key::from_parts([Some("eu"), None, Some("")]),
                txid: None,
                position: None,
            },
            KeyRecord {
                view: "ünï".into(),
                key: Key::from("\0looks encoded"),
                txid: Some(1),
                position: None,
            },
        ];
        for c in &cases {
            assert_eq!(&roundtrip(c), c);
        }
    }

    #[test]
    fn bad_bytes_are_errors_never_panics() {
        let mut good = Vec::new();
        KeyRecord {
            view: "v".into(),
            key: Key::from_parts([Some("a"), None]),
            txid: Some(3),
            position: Some(4),
        }
        .encode_into(&mut good)
        .unwrap();
        // Every truncation, every single-byte corruption: an error or another record.
        for n in 0..good.len() {
            assert!(KeyRecord::decode(&good[..n]).is_err(), "truncated at {n}");
        }
        for i in 0..good.len() {
            for b in [0u8, 1, 0x7f, 0xff] {
                let mut bad = good.clone();
                bad[i] = b;
                let _ = KeyRecord::decode(&bad);
            }
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(
            KeyRecord::decode(&trailing),
            Err(KeyDecodeError("trailing bytes"))
        );
        assert!(KeyRecord::decode(b"{\"json\":1}").is_err());
    }

    #[test]
    fn a_key_always_lands_in_one_partition_and_keys_spread() {
        let p = partition_of("v", &Key::from("dev-1"), 12);
        for _ in 0..3 {
            assert_eq!(partition_of("v", &Key::from("dev-1"), 12), p);
        }
        // The view is part of the identity: one key of two views may live apart.
        let mut counts = [0u32; 8];
        for i in 0..8000 {
            let part = partition_of("v", &Key::from(format!("dev-{i}")), 8);
            assert!((0..8).contains(&part));
            counts[part as usize] += 1;
        }
        for c in counts {
            assert!((800..1200).contains(&c), "uneven spread: {counts:?}");
        }
        assert_eq!(
            partition_of("v", &Key::from("x"), 0),
            0,
            "no partitions yet"
        );
    }

    #[test]
    fn the_hash_is_pinned_so_capture_and_workers_of_any_release_agree() {
        // FNV-1a's published test vectors: the format's routing depends on them.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn gap_records_roundtrip_and_keys_still_decode() {
        let gap = freshen::Gap::new("public", "readings", "TRUNCATE");
        let mut b = Vec::new();
        StreamRecord::encode_gap("totals", &gap, &mut b);
        assert_eq!(
            StreamRecord::decode(&b),
            Ok(StreamRecord::Gap {
                view: "totals".into(),
                gap
            })
        );
        for n in 0..b.len() {
            assert!(StreamRecord::decode(&b[..n]).is_err(), "truncated at {n}");
        }
        let key = KeyRecord {
            view: "v".into(),
            key: Key::from("k"),
            txid: None,
            position: Some(1),
        };
        let mut b = Vec::new();
        key.encode_into(&mut b).unwrap();
        assert_eq!(StreamRecord::decode(&b), Ok(StreamRecord::Key(key)));
        // A long reason is cut on a character boundary, never split inside one.
        let long = freshen::Gap::new("s", "t", "é".repeat(40_000));
        let mut b = Vec::new();
        StreamRecord::encode_gap("v", &long, &mut b);
        let Ok(StreamRecord::Gap { gap, .. }) = StreamRecord::decode(&b) else {
            panic!("decodes");
        };
        assert_eq!(gap.reason.len(), 65534);
    }

    #[test]
    fn the_kafka_key_separates_view_from_key() {
        let a = KeyRecord {
            view: "ab".into(),
            key: Key::from("c"),
            txid: None,
            position: None,
        };
        let b = KeyRecord {
            view: "a".into(),
            key: Key::from("bc"),
            txid: None,
            position: None,
        };
        assert_ne!(a.kafka_key(), b.kafka_key());
    }
}
