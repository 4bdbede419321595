//! How a database spells a table name in a configuration file: `table` or
//! `schema.table`, a part quoted where it needs to be. Each source says its own rules
//! ([`SourcePlug::naming`](super::SourcePlug::naming)): PostgreSQL folds unquoted parts
//! to lower case and puts an unqualified table in `public`; MySQL keeps case, quotes
//! with backticks and puts an unqualified table in the connection's database.

/// A database's rules for table names, and [`parse`](Naming::parse) by them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Naming {
    /// The quote around a part that needs it; doubled inside a quoted part, it stands
    /// for itself.
    pub quote: char,
    /// Whether an unquoted part folds to lower case.
    pub fold_unquoted: bool,
    /// Where an unqualified table is; `None`: a name must say.
    pub default_schema: Option<String>,
    /// What the first part is called in messages (`schema`, `database`).
    pub schema_word: &'static str,
}

impl Naming {
    /// The shapes a name may take, for messages: `"schema.table" or "table"`.
    pub fn shapes(&self) -> String {
        let word = self.schema_word;
        match self.default_schema {
            Some(_) => format!("\"{word}.table\" or \"table\""),
            None => format!("\"{word}.table\""),
        }
    }

    /// `(schema, table)` of a name as written, or why it is not one.
    ///
    /// ```
    /// use freshen::plug::Naming;
    /// let pg = Naming { quote: '"', fold_unquoted: true, default_schema: Some("public".into()), schema_word: "schema" };
    /// assert_eq!(pg.parse("Orders").unwrap(), ("public".into(), "orders".into()));
    /// assert_eq!(pg.parse(r#"app."Orders""#).unwrap(), ("app".into(), "Orders".into()));
    /// let my = Naming { quote: '`', fold_unquoted: false, default_schema: None, schema_word: "database" };
    /// assert_eq!(my.parse("app.Orders").unwrap(), ("app".into(), "Orders".into()));
    /// assert!(my.parse("Orders").is_err());
    /// ```
    pub fn parse(&self, written: &str) -> Result<(String, String), String> {
        let q = self.quote;
        let mut parts: Vec<(String, bool)> = Vec::new();
        let mut cur = String::new();
        let (mut quoted, mut was_quoted) = (false, false);
        let mut chars = written.trim().chars().peekable();
        while let Some(c) = chars.next() {
            match (c, quoted) {
                (c, false) if c == q => {
                    quoted = true;
                    was_quoted = true;
                }
                (c, true) if c == q && chars.peek() == Some(&q) => {
                    chars.next();
                    cur.push(q);
                }
                (c, true) if c == q => quoted = false,
                ('.', false) => {
                    parts.push((std::mem::take(&mut cur), was_quoted));
                    was_quoted = false;
                }
                (c, _) => cur.push(c),
            }
        }
        if quoted {
            return Err(format!("unclosed quote in table name {written:?}"));
        }
        parts.push((cur, was_quoted));
        let mut parts: Vec<String> = parts
            .into_iter()
            .map(|(p, quoted)| match quoted {
                true => p,
                false if self.fold_unquoted => p.trim().to_lowercase(),
                false => p.trim().to_owned(),
            })
            .collect();
        let unqualified = parts.len() == 1;
        if parts.iter().any(String::is_empty)
            || parts.len() > 2
            || (unqualified && self.default_schema.is_none())
        {
            let word = self.schema_word;
            return Err(match self.default_schema {
                Some(_) => {
                    format!("invalid table name {written:?} (expected table or {word}.table)")
                }
                None => format!("invalid table name {written:?} (expected {word}.table)"),
            });
        }
        let table = parts.pop().unwrap_or_default();
        let schema = match parts.pop() {
            Some(s) => s,
            None => self.default_schema.clone().unwrap_or_default(),
        };
        Ok((schema, table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg() -> Naming {
        Naming {
            quote: '"',
            fold_unquoted: true,
            default_schema: Some("public".into()),
            schema_word: "schema",
        }
    }

    fn mysql(db: Option<&str>) -> Naming {
        Naming {
            quote: '`',
            fold_unquoted: false,
            default_schema: db.map(str::to_owned),
            schema_word: "database",
        }
    }

    fn ok(n: &Naming, s: &str) -> (String, String) {
        n.parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn unquoted_parts_fold_where_the_database_folds_them() {
        assert_eq!(ok(&pg(), "S.T"), ("s".into(), "t".into()));
        assert_eq!(ok(&pg(), "t"), ("public".into(), "t".into()));
        assert_eq!(
            ok(&pg(), r#""My Schema"."a.b""#),
            ("My Schema".into(), "a.b".into())
        );
        assert_eq!(
            ok(&pg(), r#""say ""hi""""#),
            ("public".into(), r#"say "hi""#.into())
        );
        assert_eq!(
            ok(&mysql(None), "App.Events"),
            ("App".into(), "Events".into())
        );
        assert_eq!(
            ok(&mysql(None), "`App`.`Ev``ents`"),
            ("App".into(), "Ev`ents".into())
        );
        assert_eq!(ok(&mysql(None), "`a.b`.c"), ("a.b".into(), "c".into()));
        assert_eq!(
            ok(&mysql(Some("app")), "events"),
            ("app".into(), "events".into())
        );
    }

    #[test]
    fn what_is_not_a_table_name_says_what_is_expected() {
        assert_eq!(
            pg().parse("a.b.c").unwrap_err(),
            "invalid table name \"a.b.c\" (expected table or schema.table)"
        );
        assert_eq!(
            pg().parse("\"open").unwrap_err(),
            "unclosed quote in table name \"\\\"open\""
        );
        assert_eq!(
            mysql(None).parse("a.b.c").unwrap_err(),
            "invalid table name \"a.b.c\" (expected database.table)"
        );
        assert_eq!(
            mysql(None).parse("events").unwrap_err(),
            "invalid table name \"events\" (expected database.table)"
        );
        assert_eq!(
            mysql(Some("app")).parse("a..b").unwrap_err(),
            "invalid table name \"a..b\" (expected table or database.table)"
        );
        assert!(pg().parse("").is_err());
        assert!(pg().parse("s.").is_err());
    }
}
