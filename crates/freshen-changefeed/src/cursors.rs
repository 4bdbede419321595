//! Per-table cursors: one reader follows several tables in one stream and resumes each
//! from its own position (`?cursors=orders:120,items:95`). Pure: parsing, which event a
//! reader still wants, and the positions after a read.
//!
//! A cursor is a log `sequence`, like `from_seq`, but it holds for its table only: the
//! reader wants the table's events after it. One scan from the lowest cursor serves them
//! all; an event of a table is delivered only past that table's cursor. Everything a read
//! examined up to sequence `s` was delivered for every named table, so after the read each
//! cursor is `max(cursor, s)`: a table moves on even when none of its events came.

use crate::Filter;
use crate::filter::Selection;
use crate::record::{self, RecordRef};

/// At most this many tables in one `cursors` list: every event is matched against each.
pub(crate) const MAX_TABLES: usize = 64;

/// The tables a reader follows, each with its own position, and the rest of its filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cursors {
    /// The key prefix and operations of the request, and the named tables.
    filter: Filter,
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// As the reader wrote it (`orders` or `public.orders`): the responses use it too.
    name: String,
    /// Its table's events after this sequence are wanted.
    after: u64,
}

impl Entry {
    /// The bare table name and the schema, if written.
    fn parts(&self) -> (Option<&str>, &str) {
        match self.name.split_once('.') {
            Some((schema, table)) => (Some(schema), table),
            None => (None, &self.name),
        }
    }

    fn matches(&self, r: &RecordRef<'_>) -> bool {
        match self.parts() {
            (Some(schema), table) => schema == r.schema && table == r.table,
            (None, table) => table == r.table,
        }
    }
}

impl Cursors {
    /// Parses `orders:120,public.items:95` (a table, or `schema.table`, a colon, the
    /// last sequence the reader has of that table; `0` reads it from the start). `base`
    /// holds the request's other filters. Lists every problem at once.
    pub(crate) fn parse(list: &str, base: Filter) -> Result<Cursors, String> {
        let mut problems = Vec::new();
        let mut entries: Vec<Entry> = Vec::new();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((name, seq)) = item.rsplit_once(':') else {
                problems.push(format!(
                    "{item:?} has no sequence: write TABLE:SEQUENCE ({item}:0 reads it from the start)"
                ));
                continue;
            };
            let name = name.trim();
            if name.is_empty() || name.starts_with('.') || name.ends_with('.') {
                problems.push(format!(
                    "{item:?}: expected a table or schema.table before ':'"
                ));
                continue;
            }
            if name.chars().any(char::is_control) {
                problems.push(format!("{item:?}: a table name has no control characters"));
                continue;
            }
            let Ok(after) = seq.trim().parse::<u64>() else {
                problems.push(format!(
                    "{item:?}: {:?} is not a sequence (a non-negative integer)",
                    seq.trim()
                ));
                continue;
            };
            let entry = Entry {
                name: name.to_owned(),
                after,
            };
            if let Some(other) = entries.iter().find(|e| same_table(e, &entry)) {
                problems.push(format!(
                    "{name:?} and {:?} name the same table: give each table once",
                    other.name
                ));
                continue;
            }
            entries.push(entry);
        }
        if entries.is_empty() && problems.is_empty() {
            problems.push("name at least one table, as TABLE:SEQUENCE".to_owned());
        }
        if entries.len() > MAX_TABLES {
            problems.push(format!(
                "{} tables: at most {MAX_TABLES} in one list",
                entries.len()
            ));
        }
        if !problems.is_empty() {
            return Err(format!("cursors: {}", problems.join("; ")));
        }
        let filter = entries.iter().fold(base, |f, e| f.table(e.name.clone()));
        Ok(Cursors { filter, entries })
    }

    /// Takes the positions of `other` (a stream's `Last-Event-ID`) for the tables both
    /// name; the others keep theirs.
    pub(crate) fn resume_from(&mut self, other: &Cursors) {
        for e in &mut self.entries {
            if let Some(o) = other.entries.iter().find(|o| o.name == e.name) {
                e.after = o.after;
            }
        }
    }

    /// Every table resumes after `seq` (a stream's plain-number `Last-Event-ID`).
    pub(crate) fn resume_all(&mut self, seq: u64) {
        for e in &mut self.entries {
            e.after = seq;
        }
    }

    /// Where one scan for all of them starts: the lowest cursor.
    pub(crate) fn start(&self) -> u64 {
        self.entries.iter().map(|e| e.after).min().unwrap_or(0)
    }

    /// After a read that examined every event up to `through`: each cursor moves there
    /// unless it is ahead already.
    pub(crate) fn advance(&mut self, through: u64) {
        for e in &mut self.entries {
            e.after = e.after.max(through);
        }
    }

    /// The tables whose events after their cursor may have been deleted before this
    /// reader read them (every sequence below `front` was): `(name, cursor)` each.
    pub(crate) fn gaps(&self, front: u64) -> Vec<(&str, u64)> {
        self.entries
            .iter()
            .filter(|e| e.after + 1 < front)
            .map(|e| (e.name.as_str(), e.after))
            .collect()
    }

    /// `{"orders":130,"items":130}`: each table's cursor.
    pub(crate) fn write_json(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            record::json_str(&e.name, out);
            out.push(b':');
            record::push_u64(out, e.after);
        }
        out.push(b'}');
    }

    /// `orders:130,items:95`, each cursor at least `through`: the list to resume with
    /// after every event up to `through` was delivered.
    pub(crate) fn write_list(&self, through: u64, out: &mut Vec<u8>) {
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(e.name.as_bytes());
            out.push(b':');
            record::push_u64(out, e.after.max(through));
        }
    }
}

/// What a stream (Server-Sent Events, a WebSocket subscription) reads: every event a
/// filter matches, or the named tables each past its own cursor.
pub(crate) enum Reader {
    All(Filter),
    Tables(Cursors),
}

impl Selection for Reader {
    fn keeps(&self, r: &RecordRef<'_>) -> bool {
        match self {
            Reader::All(f) => f.keeps(r),
            Reader::Tables(c) => c.keeps(r),
        }
    }

    fn delivers(&self, seq: u64, r: &RecordRef<'_>) -> bool {
        match self {
            Reader::All(f) => f.delivers(seq, r),
            Reader::Tables(c) => c.delivers(seq, r),
        }
    }

    fn write_id(&self, seq: u64, out: &mut Vec<u8>) {
        match self {
            Reader::All(f) => f.write_id(seq, out),
            Reader::Tables(c) => c.write_id(seq, out),
        }
    }
}

/// Two entries that an event could both match: the same name, or one bare name and a
/// `schema.table` with that name.
fn same_table(a: &Entry, b: &Entry) -> bool {
    match (a.parts(), b.parts()) {
        ((Some(sa), ta), (Some(sb), tb)) => sa == sb && ta == tb,
        ((_, ta), (_, tb)) => ta == tb,
    }
}

impl Selection for Cursors {
    fn keeps(&self, r: &RecordRef<'_>) -> bool {
        self.filter.matches(r)
    }

    fn delivers(&self, seq: u64, r: &RecordRef<'_>) -> bool {
        self.filter.matches(r)
            && self
                .entries
                .iter()
                .find(|e| e.matches(r))
                .is_some_and(|e| seq > e.after)
    }

    fn write_id(&self, seq: u64, out: &mut Vec<u8>) {
        self.write_list(seq, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Encoder;
    use freshen::{Op, Row, RowEvent, Value};

    fn rec(schema: &str, table: &str, op: Op) -> Vec<u8> {
        let e = RowEvent::new(schema, table, op)
            .with_pk(["id"])
            .with_new(Row::from_pairs([("id", Value::Int(1))]));
        Encoder::default().encode(&e, 1)
    }

    fn parse(list: &str) -> Result<Cursors, String> {
        Cursors::parse(list, Filter::default())
    }

    fn text(c: &Cursors, through: u64) -> String {
        let mut out = Vec::new();
        c.write_list(through, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn parses_and_delivers_each_table_past_its_cursor() {
        let c = parse(" orders:120, public.items:95 ,").unwrap();
        assert_eq!(c.start(), 95);
        let orders = rec("public", "orders", Op::Insert);
        let items = rec("public", "items", Op::Insert);
        let other = rec("sales", "items", Op::Insert);
        let skipped = rec("public", "users", Op::Insert);
        let (o, i) = (
            RecordRef::parse(&orders).unwrap(),
            RecordRef::parse(&items).unwrap(),
        );
        assert!(!c.delivers(100, &o) && !c.delivers(120, &o) && c.delivers(121, &o));
        assert!(!c.delivers(95, &i) && c.delivers(96, &i));
        assert!(c.keeps(&o) && c.keeps(&i));
        // Another schema's `items` and an unnamed table are not followed at all.
        let (x, u) = (
            RecordRef::parse(&other).unwrap(),
            RecordRef::parse(&skipped).unwrap(),
        );
        assert!(!c.keeps(&x) && !c.delivers(500, &x));
        assert!(!c.keeps(&u) && !c.delivers(500, &u));
    }

    #[test]
    fn other_filters_still_apply() {
        let base = Filter::default().parse_ops("delete").unwrap();
        let c = Cursors::parse("orders:0", base).unwrap();
        let ins = rec("public", "orders", Op::Insert);
        assert!(!c.delivers(1, &RecordRef::parse(&ins).unwrap()));
    }

    #[test]
    fn advances_and_writes_positions() {
        let mut c = parse("orders:120,items:95").unwrap();
        assert_eq!(text(&c, 0), "orders:120,items:95");
        assert_eq!(text(&c, 100), "orders:120,items:100");
        c.advance(110);
        let mut json = Vec::new();
        c.write_json(&mut json);
        assert_eq!(json, br#"{"orders":120,"items":110}"#);
        c.advance(130);
        assert_eq!(text(&c, 0), "orders:130,items:130");
        assert_eq!(c.start(), 130);
    }

    #[test]
    fn reports_gaps_per_table() {
        let c = parse("orders:120,items:95,users:0").unwrap();
        // Everything below 96 was deleted: `items` wants 96 on, which is there.
        assert_eq!(c.gaps(96), vec![("users", 0)]);
        assert_eq!(c.gaps(100), vec![("items", 95), ("users", 0)]);
        assert!(c.gaps(1).is_empty());
    }

    #[test]
    fn resumes_from_an_id() {
        let mut c = parse("orders:1,items:2").unwrap();
        c.resume_from(&parse("items:40,users:9").unwrap());
        assert_eq!(text(&c, 0), "orders:1,items:40");
        c.resume_all(7);
        assert_eq!(text(&c, 0), "orders:7,items:7");
    }

    #[test]
    fn every_problem_at_once() {
        let e = parse("orders,items:x,:5,orders:1,public.orders:2,a.b:1,a.b:2").unwrap_err();
        for part in [
            "\"orders\" has no sequence",
            "\"x\" is not a sequence",
            "\":5\": expected a table",
            "\"public.orders\" and \"orders\" name the same table",
            "\"a.b\" and \"a.b\"",
        ] {
            assert!(e.contains(part), "{part} in {e}");
        }
        assert!(parse(" , ").unwrap_err().contains("at least one table"));
        assert!(parse("x\u{1}y:1").unwrap_err().contains("control"));
        let many: Vec<String> = (0..=MAX_TABLES).map(|i| format!("t{i}:0")).collect();
        assert!(parse(&many.join(",")).unwrap_err().contains("at most"));
        // Different schemas' tables of one name are different tables.
        assert!(parse("a.orders:1,b.orders:2").is_ok());
    }
}
