//! Binlog positions: file and offset, MariaDB GTID lists, MySQL GTID sets — parsed,
//! advanced transaction by transaction, and printed in the servers' own text forms.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// A position in one server's binlog files: `binlog.000042:1234`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FilePos {
    /// The binlog file name (`binlog.000042`).
    pub file: String,
    /// Byte offset in it (4 is the first event).
    pub pos: u64,
}

impl FilePos {
    /// `file:pos`.
    pub fn new(file: impl Into<String>, pos: u64) -> FilePos {
        FilePos {
            file: file.into(),
            pos,
        }
    }

    /// The file's sequence number (`binlog.000042` → 42), when it ends in digits.
    pub fn file_index(&self) -> Option<u32> {
        file_index(&self.file)
    }

    /// An order-preserving number for this position within one server's binlogs:
    /// `file index << 32 | offset`. Offsets stay below 4 GiB (the event header's
    /// 32-bit position field).
    pub fn token(&self) -> Option<u64> {
        Some((u64::from(self.file_index()?) << 32) | (self.pos & 0xffff_ffff))
    }
}

/// `binlog.000042` → 42.
pub(crate) fn file_index(file: &str) -> Option<u32> {
    let (_, digits) = file.rsplit_once('.')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

impl fmt::Display for FilePos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

impl FromStr for FilePos {
    type Err = String;

    fn from_str(s: &str) -> Result<FilePos, String> {
        let (file, pos) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?} is not a file:position (binlog.000001:4)"))?;
        let pos: u64 = pos
            .parse()
            .map_err(|_| format!("{s:?}: the position after ':' is not a number"))?;
        if file.is_empty() || pos < 4 {
            return Err(format!(
                "{s:?}: a binlog position names a file and an offset of at least 4"
            ));
        }
        Ok(FilePos::new(file, pos))
    }
}

/// MariaDB's GTID position: the last `domain-server-sequence` per replication domain,
/// as `@@gtid_binlog_pos` and `@slave_connect_state` spell it (`0-1-42,1-2-7`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct MariaGtidList {
    /// `(domain, server, sequence)`, one per domain, sorted by domain.
    entries: Vec<(u32, u32, u64)>,
}

impl MariaGtidList {
    /// Records transaction `domain-server-seq` as seen.
    pub fn advance(&mut self, domain: u32, server: u32, seq: u64) {
        match self.entries.binary_search_by_key(&domain, |e| e.0) {
            Ok(i) => self.entries[i] = (domain, server, seq),
            Err(i) => self.entries.insert(i, (domain, server, seq)),
        }
    }

    /// Whether no domain has been seen.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The sequence number seen last in `domain`.
    pub fn seq(&self, domain: u32) -> Option<u64> {
        self.entries
            .binary_search_by_key(&domain, |e| e.0)
            .ok()
            .map(|i| self.entries[i].2)
    }
}

impl fmt::Display for MariaGtidList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (d, s, n)) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}-{s}-{n}")?;
        }
        Ok(())
    }
}

impl FromStr for MariaGtidList {
    type Err = String;

    fn from_str(s: &str) -> Result<MariaGtidList, String> {
        let mut list = MariaGtidList::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut it = part.split('-');
            let bad = || format!("{part:?} is not a MariaDB GTID (domain-server-sequence)");
            let d = it.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?;
            let sv = it.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?;
            let n = it.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?;
            if it.next().is_some() {
                return Err(bad());
            }
            if list.seq(d).is_some() {
                return Err(format!("{s:?} names domain {d} twice"));
            }
            list.advance(d, sv, n);
        }
        Ok(list)
    }
}

/// MySQL's GTID set: per source UUID, the transaction numbers executed, as
/// `@@gtid_executed` spells it (`3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct MySqlGtidSet {
    /// UUID → sorted, disjoint, non-adjacent inclusive intervals.
    sets: BTreeMap<[u8; 16], Vec<(u64, u64)>>,
}

impl MySqlGtidSet {
    /// Adds transaction `sid:gno`.
    pub fn add(&mut self, sid: [u8; 16], gno: u64) {
        let iv = self.sets.entry(sid).or_default();
        let i = iv.partition_point(|&(_, end)| end.saturating_add(1) < gno);
        if i < iv.len() && iv[i].0 <= gno.saturating_add(1) {
            iv[i].0 = iv[i].0.min(gno);
            iv[i].1 = iv[i].1.max(gno);
            // Merge with the next interval when they now touch.
            if i + 1 < iv.len() && iv[i + 1].0 <= iv[i].1.saturating_add(1) {
                iv[i].1 = iv[i].1.max(iv[i + 1].1);
                iv.remove(i + 1);
            }
        } else {
            iv.insert(i, (gno, gno));
        }
    }

    /// Whether `sid:gno` is in the set.
    pub fn contains(&self, sid: &[u8; 16], gno: u64) -> bool {
        self.sets
            .get(sid)
            .is_some_and(|iv| iv.iter().any(|&(a, b)| a <= gno && gno <= b))
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// `(uuid, [(first, last)])` per source, for the GTID dump request.
    pub fn intervals(&self) -> impl Iterator<Item = (&[u8; 16], &[(u64, u64)])> {
        self.sets.iter().map(|(k, v)| (k, v.as_slice()))
    }
}

/// A UUID's 16 bytes as `8-4-4-4-12` lower-case hex.
pub(crate) fn uuid_text(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|&b| b != b'-').collect();
    if hex.len() != 32 || s.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let t = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(t, 16).ok()?;
    }
    Some(out)
}

impl fmt::Display for MySqlGtidSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (sid, iv)) in self.sets.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&uuid_text(sid))?;
            for (a, b) in iv {
                if a == b {
                    write!(f, ":{a}")?;
                } else {
                    write!(f, ":{a}-{b}")?;
                }
            }
        }
        Ok(())
    }
}

impl FromStr for MySqlGtidSet {
    type Err = String;

    fn from_str(s: &str) -> Result<MySqlGtidSet, String> {
        let mut set = MySqlGtidSet::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut it = part.split(':');
            let bad = || format!("{part:?} is not a MySQL GTID set element (uuid:1-5:7)");
            let sid = it.next().and_then(parse_uuid).ok_or_else(bad)?;
            let mut any = false;
            for range in it {
                let (a, b) = match range.split_once('-') {
                    Some((a, b)) => (a.parse::<u64>(), b.parse::<u64>()),
                    None => (range.parse(), range.parse()),
                };
                let (a, b) = (a.map_err(|_| bad())?, b.map_err(|_| bad())?);
                if a == 0 || b < a || b - a > 1 << 40 {
                    return Err(bad());
                }
                let iv = set.sets.entry(sid).or_default();
                iv.push((a, b));
                any = true;
            }
            if !any {
                return Err(bad());
            }
        }
        // Normalise: sort and merge what the text listed.
        for iv in set.sets.values_mut() {
            iv.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::with_capacity(iv.len());
            for &(a, b) in iv.iter() {
                match merged.last_mut() {
                    Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                    _ => merged.push((a, b)),
                }
            }
            *iv = merged;
        }
        Ok(set)
    }
}

/// GTID state of either flavour.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Gtids {
    /// MariaDB's per-domain list.
    MariaDb(MariaGtidList),
    /// MySQL's executed set.
    MySql(MySqlGtidSet),
}

impl fmt::Display for Gtids {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gtids::MariaDb(l) => l.fmt(f),
            Gtids::MySql(s) => s.fmt(f),
        }
    }
}

impl Gtids {
    /// Parses `s` in the form of `flavour`'s server.
    pub fn parse(s: &str, mariadb: bool) -> Result<Gtids, String> {
        if mariadb {
            s.parse().map(Gtids::MariaDb)
        } else {
            s.parse().map(Gtids::MySql)
        }
    }
}

/// A resume point: the binlog position after a transaction, and the GTID state after
/// it when the server has GTIDs. Stored durably; a restart reads on from it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Checkpoint {
    /// File and offset after the transaction.
    pub file_pos: FilePos,
    /// GTID state after the transaction, when the server has GTIDs.
    pub gtids: Option<Gtids>,
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.file_pos.fmt(f)?;
        if let Some(g) = &self.gtids {
            write!(f, " (gtid {g})")?;
        }
        Ok(())
    }
}

/// Where a source starts when no checkpoint is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The server's current position (nothing before it is replayed). The default.
    Current,
    /// A binlog file and offset.
    FilePos(FilePos),
    /// A GTID position (MariaDB list or MySQL set; the server's flavour decides).
    Gtid(String),
}

impl FromStr for Start {
    type Err = String;

    /// `current`, `binlog.000001:4`, or a GTID position (`0-1-42`, `uuid:1-5`).
    fn from_str(s: &str) -> Result<Start, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("current") {
            return Ok(Start::Current);
        }
        if s.parse::<MariaGtidList>().is_ok_and(|l| !l.is_empty())
            || s.parse::<MySqlGtidSet>().is_ok_and(|g| !g.is_empty())
        {
            return Ok(Start::Gtid(s.to_string()));
        }
        s.parse::<FilePos>().map(Start::FilePos).map_err(|_| {
            format!(
                "start {s:?} is not \"current\", a file:position (binlog.000001:4) or a GTID \
                 position (0-1-42 on MariaDB, uuid:1-42 on MySQL)"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_positions() {
        let p: FilePos = "binlog.000042:1234".parse().unwrap();
        assert_eq!(p.file_index(), Some(42));
        assert_eq!(p.token(), Some((42 << 32) | 1234));
        assert!(
            FilePos::new("binlog.000042", 99).token() < FilePos::new("binlog.000043", 4).token()
        );
        assert!("binlog.000001".parse::<FilePos>().is_err());
        assert!("binlog.000001:2".parse::<FilePos>().is_err());
        assert_eq!(FilePos::new("weird", 4).file_index(), None);
    }

    #[test]
    fn mariadb_gtid_lists() {
        let mut l: MariaGtidList = "1-2-7, 0-1-42".parse().unwrap();
        assert_eq!(l.to_string(), "0-1-42,1-2-7");
        l.advance(0, 3, 43);
        l.advance(5, 1, 1);
        assert_eq!(l.to_string(), "0-3-43,1-2-7,5-1-1");
        assert!("0-1".parse::<MariaGtidList>().is_err());
        assert!("0-1-2,0-1-3".parse::<MariaGtidList>().is_err());
        assert!("".parse::<MariaGtidList>().unwrap().is_empty());
    }

    #[test]
    fn mysql_gtid_sets() {
        let u = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let mut s: MySqlGtidSet = format!("{u}:1-5:7").parse().unwrap();
        assert!(s.contains(&parse_uuid(u).unwrap(), 7));
        assert!(!s.contains(&parse_uuid(u).unwrap(), 6));
        s.add(parse_uuid(u).unwrap(), 6);
        assert_eq!(s.to_string(), format!("{u}:1-7"));
        s.add(parse_uuid(u).unwrap(), 9);
        s.add(parse_uuid(u).unwrap(), 8);
        assert_eq!(s.to_string(), format!("{u}:1-9"));
        s.add(parse_uuid(u).unwrap(), 20);
        assert_eq!(s.to_string(), format!("{u}:1-9:20"));
        assert!("nope:1".parse::<MySqlGtidSet>().is_err());
        assert!(format!("{u}:0").parse::<MySqlGtidSet>().is_err());
        assert!(u.parse::<MySqlGtidSet>().is_err());
        let merged: MySqlGtidSet = format!("{u}:5-9:1-4").parse().unwrap();
        assert_eq!(merged.to_string(), format!("{u}:1-9"));
    }

    #[test]
    fn starts() {
        assert_eq!("current".parse::<Start>().unwrap(), Start::Current);
        assert_eq!(
            "binlog.000001:4".parse::<Start>().unwrap(),
            Start::FilePos(FilePos::new("binlog.000001", 4))
        );
        assert_eq!(
            "0-1-9".parse::<Start>().unwrap(),
            Start::Gtid("0-1-9".into())
        );
        assert!("yesterday".parse::<Start>().is_err());
    }
}
