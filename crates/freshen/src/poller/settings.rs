//! What every polling source's `[source]` table says alike, decided once: which tables
//! to poll with which cursor, interval and page size, and what is wrong with the
//! settings. Pure: each database's crate reads its table with its own serde type (its
//! defaults, and how it writes a table name, differ) and lends the values here.

use std::fmt;
use std::time::Duration;

use super::PolledTable;

/// The most rows a page may hold.
const MAX_PAGE: usize = 100_000;
/// The longest poll interval and lookback.
const MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// A polling source's settings as its `[source]` table wrote them, `T` a table's name
/// in the database's form.
#[derive(Debug, Clone)]
pub struct PollSettings<'a, T> {
    /// The cursor column of every table without its own.
    pub cursor: Option<&'a str>,
    /// Time between polls of a table once caught up.
    pub poll_interval: Duration,
    /// Rows per page.
    pub page_size: usize,
    /// How long a read position is held before it may be stored.
    pub lookback: Duration,
    /// Keys this source's rows in the cursor table.
    pub name: &'a str,
    /// The longest name the database's cursor table (and lock) takes.
    pub name_max: usize,
    /// What is wrong with the cursor table's name, if anything (the whole message
    /// after `store_table: `).
    pub store_table: Option<String>,
    /// `[source.tables."NAME"]`: the tables the file names itself, with their own
    /// settings, in the file's order.
    pub tables: Vec<OwnTable<'a, T>>,
    /// How the database writes a table name in the file (`schema.table`), for
    /// messages.
    pub form: &'static str,
}

/// One `[source.tables."NAME"]` table.
#[derive(Debug, Clone)]
pub struct OwnTable<'a, T> {
    /// The name as written.
    pub name: &'a str,
    /// The name parsed, or what is wrong with it (the whole message after `tables: `).
    pub table: Result<T, String>,
    /// Its cursor column.
    pub cursor: Option<&'a str>,
    /// Its poll interval.
    pub poll_interval: Option<Duration>,
    /// Its page size.
    pub page_size: Option<usize>,
}

impl<T: Clone + PartialEq + fmt::Display> PollSettings<'_, T> {
    /// The tables the file names itself, those whose names parse.
    pub fn own_tables(&self) -> Vec<T> {
        self.tables
            .iter()
            .filter_map(|t| t.table.as_ref().ok().cloned())
            .collect()
    }

    /// What to poll: `planned` (the views' tables), then the file's own tables not
    /// among them, each with its own settings over the defaults. A table without a
    /// cursor column is an error naming every such table.
    pub fn polled(&self, planned: Vec<T>) -> Result<Vec<PolledTable<T>>, String> {
        let mut names = planned;
        for t in self.own_tables() {
            if !names.contains(&t) {
                names.push(t);
            }
        }
        let mut missing = Vec::new();
        let mut out = Vec::new();
        for table in names {
            let own = self
                .tables
                .iter()
                .find(|o| o.table.as_ref().is_ok_and(|t| *t == table));
            match own.and_then(|o| o.cursor).or(self.cursor) {
                Some(cursor) => out.push(PolledTable {
                    cursor: cursor.to_owned(),
                    poll_interval: own
                        .and_then(|o| o.poll_interval)
                        .unwrap_or(self.poll_interval),
                    page_size: own.and_then(|o| o.page_size).unwrap_or(self.page_size),
                    table,
                }),
                None => missing.push(table.to_string()),
            }
        }
        if missing.is_empty() {
            Ok(out)
        } else {
            Err(format!(
                "no cursor column for {}: set `cursor = \"…\"` in [source] or per table in [source.tables.\"{}\"]",
                missing.join(", "),
                self.form
            ))
        }
    }

    /// Every problem of the settings, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let interval = |field: &str, d: Duration, p: &mut Vec<String>| {
            if d.is_zero() || d > MAX_INTERVAL {
                p.push(format!("{field}: must be between 1ms and 1h"));
            }
        };
        let page = |field: &str, n: usize, p: &mut Vec<String>| {
            if n == 0 || n > MAX_PAGE {
                p.push(format!("{field}: must be between 1 and {MAX_PAGE}"));
            }
        };
        interval("poll_interval", self.poll_interval, &mut p);
        page("page_size", self.page_size, &mut p);
        if self.lookback > MAX_INTERVAL {
            p.push("lookback: must be at most 1h".into());
        }
        if self.name.is_empty() || self.name.len() > self.name_max {
            p.push(format!("name: must be 1 to {} characters", self.name_max));
        }
        if let Some(e) = &self.store_table {
            p.push(format!("store_table: {e}"));
        }
        if self.cursor == Some("") {
            p.push("cursor: must name a column".into());
        }
        for t in &self.tables {
            let name = t.name;
            if let Err(e) = &t.table {
                p.push(format!("tables: {e}"));
            }
            if let Some(d) = t.poll_interval {
                interval(&format!("tables.{name}.poll_interval"), d, &mut p);
            }
            if let Some(n) = t.page_size {
                page(&format!("tables.{name}.page_size"), n, &mut p);
            }
            if t.cursor == Some("") {
                p.push(format!("tables.{name}.cursor: must name a column"));
            }
        }
        p
    }
}

/// The keys of a polled table's own settings (`[source.tables."schema.table"]`), the
/// same for every polling kind: each defaults to the `[source]` key of its name.
pub const TABLE_REFERENCE: [crate::reference::Key; 3] = {
    use crate::reference::{HOUR_MS, Omitted::Derived, Range::*, key};
    [
        key(
            "cursor",
            "string",
            Derived("`[source] cursor`", "\"id\""),
            Any,
            "Its cursor column.",
        ),
        key(
            "poll_interval",
            "duration",
            Derived("`[source] poll_interval`", "\"5s\""),
            Millis(1, HOUR_MS),
            "Its poll interval.",
        ),
        key(
            "page_size",
            "integer",
            Derived("`[source] page_size`", "500"),
            Int(1, 100_000),
            "Its page size.",
        ),
    ]
};

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PollSettings<'static, String> {
        PollSettings {
            cursor: None,
            poll_interval: Duration::from_secs(1),
            page_size: 1000,
            lookback: Duration::from_secs(5),
            name: "freshen",
            name_max: 63,
            store_table: None,
            tables: Vec::new(),
            form: "schema.table",
        }
    }

    fn own(name: &'static str) -> OwnTable<'static, String> {
        OwnTable {
            name,
            table: Ok(name.to_owned()),
            cursor: None,
            poll_interval: None,
            page_size: None,
        }
    }

    #[test]
    fn every_polled_table_needs_a_cursor_and_its_own_settings_override_the_defaults() {
        let mut s = settings();
        s.tables.push(OwnTable {
            cursor: Some("id"),
            page_size: Some(10),
            ..own("app.events")
        });
        s.tables.push(own("app.orders"));
        let e = s.polled(vec!["app.orders".into()]).unwrap_err();
        assert!(e.contains("app.orders") && !e.contains("app.events"), "{e}");
        assert!(e.contains("[source.tables.\"schema.table\"]"), "{e}");
        s.cursor = Some("updated_at");
        let p = s.polled(vec!["app.orders".into()]).unwrap();
        let got: Vec<(&str, &str, usize)> = p
            .iter()
            .map(|t| (t.table.as_str(), t.cursor.as_str(), t.page_size))
            .collect();
        assert_eq!(
            got,
            [("app.orders", "updated_at", 1000), ("app.events", "id", 10)],
            "the planned tables first, each once"
        );
        assert_eq!(p[1].poll_interval, Duration::from_secs(1));
    }

    #[test]
    fn problems_name_their_key_in_order() {
        let mut s = settings();
        s.page_size = 0;
        s.poll_interval = Duration::ZERO;
        s.lookback = Duration::from_secs(7200);
        s.name = "";
        s.store_table = Some("not a table name".into());
        s.cursor = Some("");
        s.tables.push(OwnTable {
            table: Err("\"a.b.c\" is not a table name".into()),
            poll_interval: Some(Duration::from_secs(7200)),
            page_size: Some(MAX_PAGE + 1),
            cursor: Some(""),
            ..own("a.b.c")
        });
        let p = s.problems();
        assert_eq!(
            p,
            [
                "poll_interval: must be between 1ms and 1h",
                "page_size: must be between 1 and 100000",
                "lookback: must be at most 1h",
                "name: must be 1 to 63 characters",
                "store_table: not a table name",
                "cursor: must name a column",
                "tables: \"a.b.c\" is not a table name",
                "tables.a.b.c.poll_interval: must be between 1ms and 1h",
                "tables.a.b.c.page_size: must be between 1 and 100000",
                "tables.a.b.c.cursor: must name a column",
            ]
        );
        assert!(settings().problems().is_empty());
    }
}
