//! QUERY events: transaction control (BEGIN/COMMIT) and DDL, classified from the
//! statement text the server logged.

use super::DecodeError;
use super::cursor::Cursor;

/// A QUERY event's default database and statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryEvent<'a> {
    /// The session's default database (qualifies unqualified table names).
    pub database: &'a str,
    /// The statement, as logged.
    pub statement: &'a str,
}

impl<'a> QueryEvent<'a> {
    /// Decodes a QUERY event body (after the header, without checksum).
    pub fn decode(body: &'a [u8]) -> Result<QueryEvent<'a>, DecodeError> {
        let mut c = Cursor::new(body);
        c.u32("query: thread id")?;
        c.u32("query: execution time")?;
        let db_len = usize::from(c.u8("query: database length")?);
        c.u16("query: error code")?;
        let vars = usize::from(c.u16("query: status variables length")?);
        c.take(vars, "query: status variables")?;
        let db = c.take(db_len, "query: database")?;
        c.u8("query: database terminator")?;
        let q = c.rest();
        Ok(QueryEvent {
            database: std::str::from_utf8(db).unwrap_or(""),
            statement: std::str::from_utf8(q).unwrap_or(""),
        })
    }
}

/// A table a statement names: `(database, table)`, the database from the session when
/// the statement does not qualify it.
pub type TableRef = (String, String);

/// What a logged statement does, as far as a change stream cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement {
    /// `BEGIN` (or `START TRANSACTION`, `XA START`): a transaction's rows follow.
    Begin,
    /// `COMMIT` (or `XA COMMIT`, or `XA END`/`PREPARE` for XA): the transaction ended.
    Commit,
    /// `ROLLBACK`: the transaction ended without effect (non-transactional tables).
    Rollback,
    /// `TRUNCATE [TABLE] t`.
    Truncate(TableRef),
    /// A schema change: what it is and the tables it names.
    Ddl(DdlKind, Vec<TableRef>),
    /// Anything else (grants, `FLUSH`, `SAVEPOINT`, …).
    Other,
}

/// The kind of a schema change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DdlKind {
    /// `CREATE TABLE`.
    CreateTable,
    /// `ALTER TABLE` (columns added, dropped, retyped; keys; engine …).
    AlterTable,
    /// `DROP TABLE`.
    DropTable,
    /// `RENAME TABLE` (each pair's old and new name are both listed).
    RenameTable,
    /// `CREATE INDEX` / `DROP INDEX … ON t`.
    Index,
    /// `DROP DATABASE` / `DROP SCHEMA` (the table name is empty).
    DropDatabase,
    /// Another schema statement (`CREATE VIEW`, `ALTER DATABASE`, …).
    Other,
}

impl DdlKind {
    /// Lower-case words: `alter table`, `drop table`, ….
    pub fn as_str(self) -> &'static str {
        match self {
            DdlKind::CreateTable => "create table",
            DdlKind::AlterTable => "alter table",
            DdlKind::DropTable => "drop table",
            DdlKind::RenameTable => "rename table",
            DdlKind::Index => "index",
            DdlKind::DropDatabase => "drop database",
            DdlKind::Other => "other ddl",
        }
    }

    /// Whether rows of the tables it names may have vanished or changed meaning (a
    /// drop, a rename, an ALTER): the views over them need a sweep.
    pub fn is_destructive(self) -> bool {
        matches!(
            self,
            DdlKind::AlterTable | DdlKind::DropTable | DdlKind::RenameTable | DdlKind::DropDatabase
        )
    }
}

/// Classifies `sql`, qualifying unqualified names with `database`.
pub fn classify(sql: &str, database: &str) -> Statement {
    let mut t = Tokens::new(sql);
    let Some(first) = t.word() else {
        return Statement::Other;
    };
    match first.as_str() {
        "BEGIN" => Statement::Begin,
        "START" => match t.word().as_deref() {
            Some("TRANSACTION") => Statement::Begin,
            _ => Statement::Other,
        },
        "COMMIT" => Statement::Commit,
        "ROLLBACK" => match t.word().as_deref() {
            Some("TO") => Statement::Other, // ROLLBACK TO SAVEPOINT
            _ => Statement::Rollback,
        },
        "XA" => match t.word().as_deref() {
            Some("START" | "BEGIN") => Statement::Begin,
            Some("COMMIT") => Statement::Commit,
            Some("ROLLBACK") => Statement::Rollback,
            _ => Statement::Other,
        },
        "TRUNCATE" => {
            t.skip_word("TABLE");
            match t.table(database) {
                Some(r) => Statement::Truncate(r),
                None => Statement::Other,
            }
        }
        "CREATE" => create(&mut t, database),
        "ALTER" => {
            t.skip_words(&["ONLINE", "OFFLINE", "IGNORE"]);
            match t.word().as_deref() {
                Some("TABLE") => {
                    Statement::Ddl(DdlKind::AlterTable, t.table(database).into_iter().collect())
                }
                Some("DATABASE" | "SCHEMA") => Statement::Ddl(DdlKind::Other, Vec::new()),
                Some(_) => Statement::Ddl(DdlKind::Other, Vec::new()),
                None => Statement::Other,
            }
        }
        "DROP" => drop(&mut t, database),
        "RENAME" => match t.word().as_deref() {
            Some("TABLE" | "TABLES") => {
                let mut tables = Vec::new();
                while let Some(from) = t.table(database) {
                    tables.push(from);
                    if !t.skip_word("TO") {
                        break;
                    }
                    if let Some(to) = t.table(database) {
                        tables.push(to);
                    }
                    if !t.punct(',') {
                        break;
                    }
                }
                Statement::Ddl(DdlKind::RenameTable, tables)
            }
            _ => Statement::Other,
        },
        _ => Statement::Other,
    }
}

fn create(t: &mut Tokens<'_>, database: &str) -> Statement {
    t.skip_words(&[
        "OR",
        "REPLACE",
        "TEMPORARY",
        "UNIQUE",
        "FULLTEXT",
        "SPATIAL",
        "ONLINE",
    ]);
    match t.word().as_deref() {
        Some("TABLE") => {
            t.if_not_exists();
            Statement::Ddl(
                DdlKind::CreateTable,
                t.table(database).into_iter().collect(),
            )
        }
        Some("INDEX") => {
            t.if_not_exists();
            let _ = t.ident();
            if t.skip_word("ON") {
                Statement::Ddl(DdlKind::Index, t.table(database).into_iter().collect())
            } else {
                Statement::Ddl(DdlKind::Index, Vec::new())
            }
        }
        Some("USER" | "ROLE" | "SERVER") => Statement::Other,
        Some(_) => Statement::Ddl(DdlKind::Other, Vec::new()),
        None => Statement::Other,
    }
}

fn drop(t: &mut Tokens<'_>, database: &str) -> Statement {
    let temporary = t.skip_word("TEMPORARY");
    match t.word().as_deref() {
        Some("TABLE" | "TABLES") if !temporary => {
            t.if_exists();
            let mut tables = Vec::new();
            while let Some(r) = t.table(database) {
                tables.push(r);
                if !t.punct(',') {
                    break;
                }
            }
            Statement::Ddl(DdlKind::DropTable, tables)
        }
        Some("DATABASE" | "SCHEMA") => {
            t.if_exists();
            match t.ident() {
                Some(db) => Statement::Ddl(DdlKind::DropDatabase, vec![(db, String::new())]),
                None => Statement::Other,
            }
        }
        Some("INDEX") => {
            t.if_exists();
            let _ = t.ident();
            if t.skip_word("ON") {
                Statement::Ddl(DdlKind::Index, t.table(database).into_iter().collect())
            } else {
                Statement::Ddl(DdlKind::Index, Vec::new())
            }
        }
        Some("USER" | "ROLE" | "SERVER") | None => Statement::Other,
        Some(_) if temporary => Statement::Other,
        Some(_) => Statement::Ddl(DdlKind::Other, Vec::new()),
    }
}

/// A tiny SQL tokenizer: words, quoted identifiers, punctuation; comments skipped.
struct Tokens<'a> {
    s: &'a str,
}

impl<'a> Tokens<'a> {
    fn new(s: &'a str) -> Tokens<'a> {
        Tokens { s }
    }

    /// Skips whitespace and comments (`/* */`, `-- `, `#`). MySQL's executable
    /// comments (`/*!50001 … */`) are read as their content.
    fn skip(&mut self) {
        loop {
            let s = self.s.trim_start();
            if let Some(rest) = s.strip_prefix("/*!") {
                let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                self.s = &rest[digits..];
                continue;
            }
            if let Some(rest) = s.strip_prefix("/*") {
                self.s = rest.find("*/").map_or("", |i| &rest[i + 2..]);
                continue;
            }
            if let Some(rest) = s.strip_prefix("*/") {
                self.s = rest;
                continue;
            }
            if s.starts_with("-- ") || s.starts_with('#') {
                self.s = s.find('\n').map_or("", |i| &s[i + 1..]);
                continue;
            }
            self.s = s;
            return;
        }
    }

    /// The next bare word, upper-cased; `None` at a quote, punctuation or the end.
    fn word(&mut self) -> Option<String> {
        self.skip();
        let n = self
            .s
            .char_indices()
            .find(|(_, c)| !(c.is_alphanumeric() || *c == '_' || *c == '$'))
            .map_or(self.s.len(), |(i, _)| i);
        if n == 0 {
            return None;
        }
        let w = self.s[..n].to_ascii_uppercase();
        self.s = &self.s[n..];
        Some(w)
    }

    fn peek_word(&mut self) -> Option<String> {
        let save = self.s;
        let w = self.word();
        self.s = save;
        w
    }

    fn skip_word(&mut self, w: &str) -> bool {
        if self.peek_word().as_deref() == Some(w) {
            self.word();
            true
        } else {
            false
        }
    }

    fn skip_words(&mut self, words: &[&str]) {
        while let Some(w) = self.peek_word() {
            if !words.contains(&w.as_str()) {
                return;
            }
            self.word();
        }
    }

    fn if_exists(&mut self) {
        let save = self.s;
        if !(self.skip_word("IF") && self.skip_word("EXISTS")) {
            self.s = save;
        }
    }

    fn if_not_exists(&mut self) {
        let save = self.s;
        if !(self.skip_word("IF") && self.skip_word("NOT") && self.skip_word("EXISTS")) {
            self.s = save;
        }
    }

    fn punct(&mut self, p: char) -> bool {
        self.skip();
        if let Some(rest) = self.s.strip_prefix(p) {
            self.s = rest;
            true
        } else {
            false
        }
    }

    /// An identifier: bare, `` `quoted` `` (doubled backticks escape) or `"quoted"`.
    fn ident(&mut self) -> Option<String> {
        self.skip();
        let q = self.s.chars().next()?;
        if q == '`' || q == '"' {
            let mut out = String::new();
            let mut chars = self.s[1..].char_indices();
            while let Some((i, c)) = chars.next() {
                if c == q {
                    if self.s[1 + i + 1..].starts_with(q) {
                        out.push(q);
                        chars.next();
                        continue;
                    }
                    self.s = &self.s[1 + i + 1..];
                    return Some(out);
                }
                out.push(c);
            }
            return None;
        }
        let n = self
            .s
            .char_indices()
            .find(|(_, c)| !(c.is_alphanumeric() || *c == '_' || *c == '$'))
            .map_or(self.s.len(), |(i, _)| i);
        if n == 0 {
            return None;
        }
        let w = self.s[..n].to_string();
        self.s = &self.s[n..];
        Some(w)
    }

    /// `table` or `db.table`.
    fn table(&mut self, database: &str) -> Option<TableRef> {
        let first = self.ident()?;
        let save = self.s;
        if self.s.starts_with('.') {
            self.s = &self.s[1..];
            if let Some(second) = self.ident() {
                return Some((first, second));
            }
            self.s = save;
        }
        Some((database.to_string(), first))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(db: &str, name: &str) -> TableRef {
        (db.into(), name.into())
    }

    #[test]
    fn transaction_control() {
        assert_eq!(classify("BEGIN", "x"), Statement::Begin);
        assert_eq!(classify("  /* c */ COMMIT", "x"), Statement::Commit);
        assert_eq!(classify("ROLLBACK", "x"), Statement::Rollback);
        assert_eq!(classify("ROLLBACK TO SAVEPOINT a", "x"), Statement::Other);
        assert_eq!(classify("XA START 'x'", "x"), Statement::Begin);
    }

    #[test]
    fn truncates() {
        assert_eq!(
            classify("TRUNCATE TABLE readings", "app"),
            Statement::Truncate(t("app", "readings"))
        );
        assert_eq!(
            classify("truncate `Other DB`.`we``ird`", "app"),
            Statement::Truncate(t("Other DB", "we`ird"))
        );
        assert_eq!(
            classify("-- x\nTRUNCATE t", "d"),
            Statement::Truncate(t("d", "t"))
        );
    }

    #[test]
    fn ddl() {
        assert_eq!(
            classify(
                "DROP TABLE IF EXISTS `a`,b.c /* generated by server */",
                "d"
            ),
            Statement::Ddl(DdlKind::DropTable, vec![t("d", "a"), t("b", "c")])
        );
        assert_eq!(
            classify("ALTER ONLINE TABLE readings DROP COLUMN device", "app"),
            Statement::Ddl(DdlKind::AlterTable, vec![t("app", "readings")])
        );
        assert_eq!(
            classify("RENAME TABLE a TO b, x.c TO x.d", "app"),
            Statement::Ddl(
                DdlKind::RenameTable,
                vec![t("app", "a"), t("app", "b"), t("x", "c"), t("x", "d")]
            )
        );
        assert_eq!(
            classify("CREATE TABLE IF NOT EXISTS t (id int)", "app"),
            Statement::Ddl(DdlKind::CreateTable, vec![t("app", "t")])
        );
        assert_eq!(
            classify("CREATE UNIQUE INDEX i ON t (a)", "app"),
            Statement::Ddl(DdlKind::Index, vec![t("app", "t")])
        );
        assert_eq!(
            classify("DROP DATABASE IF EXISTS shop", "app"),
            Statement::Ddl(DdlKind::DropDatabase, vec![t("shop", "")])
        );
        assert_eq!(classify("DROP TEMPORARY TABLE t", "app"), Statement::Other);
        assert_eq!(
            classify("/*!40101 SET NAMES utf8 */", "app"),
            Statement::Other
        );
        assert_eq!(
            classify("GRANT SELECT ON *.* TO u", "app"),
            Statement::Other
        );
        assert_eq!(classify("CREATE USER u", "app"), Statement::Other);
        assert_eq!(classify("", "app"), Statement::Other);
    }

    #[test]
    fn query_event_bodies() {
        let mut b = vec![0; 8];
        b.push(3); // db len
        b.extend_from_slice(&[0, 0]); // error code
        b.extend_from_slice(&[2, 0]); // status vars len
        b.extend_from_slice(&[9, 9]);
        b.extend_from_slice(b"app\0TRUNCATE t");
        let q = QueryEvent::decode(&b).unwrap();
        assert_eq!((q.database, q.statement), ("app", "TRUNCATE t"));
        for cut in 0..17 {
            assert!(QueryEvent::decode(&b[..cut]).is_err());
        }
    }

    #[test]
    fn never_panics_on_odd_text() {
        for s in [
            "`",
            "\"unterminated",
            "DROP TABLE `a",
            "RENAME TABLE a TO",
            "TRUNCATE .",
            "/*",
            "/*!",
            "ALTER",
        ] {
            let _ = classify(s, "d");
        }
    }
}
