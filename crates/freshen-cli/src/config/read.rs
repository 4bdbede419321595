//! Typed reads from a span-keeping TOML tree, recording every problem with its line.

use std::ops::Range;
use std::time::Duration;

use serde::de::{DeserializeOwned, IntoDeserializer};
use toml_edit::{Item, TableLike, Value};

use super::problems::{Problems, suggest};

/// A value and the line it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spanned<T> {
    pub(crate) value: T,
    pub(crate) line: Option<usize>,
}

/// A table (header or inline) and where it is.
#[derive(Clone, Copy)]
pub(crate) struct Tbl<'a> {
    pub(crate) t: &'a dyn TableLike,
    pub(crate) path: &'a str,
    /// Byte offset where the table starts.
    pub(crate) span: Option<usize>,
}

type Env<'e> = &'e dyn Fn(&str) -> Option<String>;

pub(crate) struct Reader<'s, 'e> {
    pub(crate) p: Problems<'s>,
    env: Env<'e>,
    /// `check --offline`: an unset variable is not a problem; the value that uses it is
    /// kept as written and not judged (`run` will judge it).
    lenient: bool,
    /// Unset variables met in lenient mode: (line, name, where used).
    pub(crate) unset: Vec<(Option<usize>, String, String)>,
}

fn type_name(item: &Item) -> &'static str {
    match item {
        Item::None => "nothing",
        Item::Table(_) => "a table",
        Item::ArrayOfTables(_) => "an array of tables",
        Item::Value(v) => match v {
            Value::String(_) => "a string",
            Value::Integer(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Boolean(_) => "a boolean",
            Value::Datetime(_) => "a date-time",
            Value::Array(_) => "an array",
            Value::InlineTable(_) => "an inline table",
        },
    }
}

/// A digest of what `item` says — keys and values, secrets included, without comments,
/// layout or key order — so a reload can tell a changed `[source]` even where the
/// settings' `Debug` form redacts the difference (a new password).
pub(crate) fn digest(root: &Item) -> u64 {
    use std::hash::{Hash, Hasher};
    fn value(v: &Value, out: &mut String) {
        match v {
            Value::String(s) => out.push_str(&format!("{:?}", s.value())),
            Value::Array(a) => {
                out.push('[');
                for e in a.iter() {
                    value(e, out);
                    out.push(',');
                }
                out.push(']');
            }
            Value::InlineTable(t) => table(t, out),
            Value::Integer(i) => out.push_str(&i.value().to_string()),
            Value::Float(f) => out.push_str(&f.value().to_string()),
            Value::Boolean(b) => out.push_str(&b.value().to_string()),
            Value::Datetime(d) => out.push_str(&d.value().to_string()),
        }
    }
    fn table(t: &dyn TableLike, out: &mut String) {
        let mut entries: Vec<(&str, &Item)> = t.iter().collect();
        entries.sort_by_key(|(k, _)| *k);
        out.push('{');
        for (k, v) in entries {
            out.push_str(&format!("{k:?}="));
            item(v, out);
            out.push(';');
        }
        out.push('}');
    }
    fn item(i: &Item, out: &mut String) {
        match i {
            Item::Value(v) => value(v, out),
            Item::Table(t) => table(t, out),
            Item::ArrayOfTables(a) => {
                for t in a.iter() {
                    table(t, out);
                }
            }
            Item::None => {}
        }
    }
    let mut text = String::new();
    item(root, &mut text);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

impl<'s, 'e> Reader<'s, 'e> {
    pub(crate) fn new(src: &'s str, env: Env<'e>) -> Reader<'s, 'e> {
        Reader {
            p: Problems::new(src),
            env,
            lenient: false,
            unset: Vec::new(),
        }
    }

    /// A reader for `check --offline`: unset variables are listed in
    /// [`unset`](Self::unset), not reported as problems.
    pub(crate) fn lenient(mut self) -> Self {
        self.lenient = true;
        self
    }

    /// A mark to compare with [`judged_since`](Self::judged_since).
    pub(crate) fn mark(&self) -> (usize, usize) {
        (self.p.list.len(), self.unset.len())
    }

    /// Whether everything read since `mark` was expanded without a problem, so that its
    /// values can be judged.
    pub(crate) fn judged_since(&self, mark: (usize, usize)) -> bool {
        self.mark() == mark
    }

    /// The value of environment variable `name`, which `path` (on `line`) names: `None`
    /// when it is unset — a problem, except offline, where it is listed in
    /// [`unset`](Self::unset).
    pub(crate) fn env_value(
        &mut self,
        name: &str,
        line: Option<usize>,
        path: &str,
    ) -> Option<String> {
        match (self.env)(name) {
            Some(v) => Some(v),
            None if self.lenient => {
                self.unset.push((line, name.to_string(), path.to_string()));
                None
            }
            None => {
                self.p.at_line(
                    line,
                    format!("environment variable `{name}` is not set (used by `{path}`)"),
                );
                None
            }
        }
    }

    pub(crate) fn line(&self, span: Option<Range<usize>>) -> Option<usize> {
        self.p.line_of(span)
    }

    /// `item` as a table, or a problem.
    pub(crate) fn as_table<'a>(&mut self, item: &'a Item, path: &'a str) -> Option<Tbl<'a>> {
        match item.as_table_like() {
            Some(t) => Some(Tbl {
                t,
                path,
                span: item.span().map(|r| r.start),
            }),
            None => {
                self.p.at(
                    item.span(),
                    format!("`{path}` must be a table, not {}", type_name(item)),
                );
                None
            }
        }
    }

    /// Reports every key of `t` not in `allowed`, suggesting the likely intended one.
    pub(crate) fn known_keys(&mut self, t: Tbl<'_>, allowed: &[&str]) {
        for (k, _) in t.t.iter() {
            if allowed.contains(&k) {
                continue;
            }
            let span = t.t.key(k).and_then(|k| k.span());
            let hint = match suggest(k, allowed) {
                Some(s) => format!("did you mean `{s}`?"),
                None => format!("expected one of: {}", allowed.join(", ")),
            };
            let place = if t.path.is_empty() {
                "at the top level".to_string()
            } else {
                format!("in `{}`", t.path)
            };
            self.p
                .at(span, format!("unknown key `{k}` {place} ({hint})"));
        }
    }

    fn get<'a>(&self, t: Tbl<'a>, key: &str) -> Option<&'a Item> {
        t.t.get(key).filter(|i| !i.is_none())
    }

    /// Records that a required key is missing.
    pub(crate) fn missing(&mut self, t: Tbl<'_>, key: &str, what: &str) {
        let at = if t.path.is_empty() {
            "the file".to_string()
        } else {
            format!("`{}`", t.path)
        };
        self.p
            .at(t.span.map(|s| s..s), format!("{at} needs `{key}` ({what})"));
    }

    fn expand(&mut self, raw: &str, span: Option<Range<usize>>, path: &str) -> String {
        let mut out = String::with_capacity(raw.len());
        let mut rest = raw;
        while let Some(i) = rest.find('$') {
            out.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                rest = tail;
            } else if let Some(body) = after.strip_prefix('{') {
                match body.find('}') {
                    Some(end) => {
                        let name = &body[..end];
                        match (self.env)(name) {
                            Some(v) => out.push_str(&v),
                            None if self.lenient => {
                                let line = self.line(span.clone());
                                self.unset.push((line, name.to_string(), path.to_string()));
                                out.push_str(&rest[i..i + 3 + end]);
                            }
                            None => self.p.at(
                                span.clone(),
                                format!(
                                    "environment variable `{name}` is not set (used by `{path}`)"
                                ),
                            ),
                        }
                        rest = &body[end + 1..];
                    }
                    None => {
                        self.p.at(
                            span.clone(),
                            format!("unclosed `${{` in `{path}` (write `$$` for a literal `$`)"),
                        );
                        out.push_str(&rest[i..]);
                        rest = "";
                    }
                }
            } else {
                out.push('$');
                rest = after;
            }
        }
        out.push_str(rest);
        out
    }

    /// An optional string, with `${VAR}` expanded from the environment.
    pub(crate) fn string(&mut self, t: Tbl<'_>, key: &str) -> Option<Spanned<String>> {
        let item = self.get(t, key)?;
        let path = join(t.path, key);
        match item.as_str() {
            Some(s) => {
                let value = self.expand(s, item.span(), &path);
                Some(Spanned {
                    value,
                    line: self.line(item.span()),
                })
            }
            None => {
                self.p.at(
                    item.span(),
                    format!("`{path}` must be a string, not {}", type_name(item)),
                );
                None
            }
        }
    }

    /// One of `choices`.
    pub(crate) fn choice(
        &mut self,
        t: Tbl<'_>,
        key: &str,
        choices: &[&str],
    ) -> Option<Spanned<String>> {
        let s = self.string(t, key)?;
        if choices.contains(&s.value.as_str()) {
            return Some(s);
        }
        let hint = suggest(&s.value, choices)
            .map(|c| format!(" (did you mean `{c}`?)"))
            .unwrap_or_default();
        self.p.at_line(
            s.line,
            format!(
                "`{}` must be one of {}, not `{}`{hint}",
                join(t.path, key),
                choices
                    .iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                s.value
            ),
        );
        None
    }

    /// An optional boolean.
    pub(crate) fn flag(&mut self, t: Tbl<'_>, key: &str) -> Option<bool> {
        let item = self.get(t, key)?;
        match item.as_bool() {
            Some(b) => Some(b),
            None => {
                let path = join(t.path, key);
                self.p.at(
                    item.span(),
                    format!("`{path}` must be true or false, not {}", type_name(item)),
                );
                None
            }
        }
    }

    /// An optional integer within `range`.
    pub(crate) fn int(
        &mut self,
        t: Tbl<'_>,
        key: &str,
        range: std::ops::RangeInclusive<i64>,
    ) -> Option<Spanned<i64>> {
        let item = self.get(t, key)?;
        let path = join(t.path, key);
        match item.as_integer() {
            Some(n) if range.contains(&n) => Some(Spanned {
                value: n,
                line: self.line(item.span()),
            }),
            Some(n) => {
                self.p.at(
                    item.span(),
                    format!(
                        "`{path}` must be between {} and {}, not {n}",
                        range.start(),
                        range.end()
                    ),
                );
                None
            }
            None => {
                self.p.at(
                    item.span(),
                    format!("`{path}` must be an integer, not {}", type_name(item)),
                );
                None
            }
        }
    }

    /// An optional duration written like `"100ms"`, `"5s"`, `"1h 30m"`, at most
    /// [`MAX_DURATION`](super::MAX_DURATION).
    pub(crate) fn duration(&mut self, t: Tbl<'_>, key: &str) -> Option<Spanned<Duration>> {
        self.duration_within(t, key, Duration::ZERO..=super::MAX_DURATION)
    }

    /// An optional duration within `range`.
    pub(crate) fn duration_within(
        &mut self,
        t: Tbl<'_>,
        key: &str,
        range: std::ops::RangeInclusive<Duration>,
    ) -> Option<Spanned<Duration>> {
        let s = self.string(t, key)?;
        let path = join(t.path, key);
        match humantime::parse_duration(s.value.trim()) {
            Ok(d) if range.contains(&d) => Some(Spanned {
                value: d,
                line: s.line,
            }),
            Ok(_) => {
                let bound = |d: &Duration| humantime::format_duration(*d).to_string();
                let message = if range.start().is_zero() {
                    format!(
                        "`{path}` must be at most {}, not `{}`",
                        bound(range.end()),
                        s.value
                    )
                } else {
                    format!(
                        "`{path}` must be between {} and {}, not `{}`",
                        bound(range.start()),
                        bound(range.end()),
                        s.value
                    )
                };
                self.p.at_line(s.line, message);
                None
            }
            Err(e) => {
                self.p.at_line(
                    s.line,
                    format!(
                        "`{path}` is not a duration (`{}`: {e}); write e.g. \"100ms\", \"5s\", \"1h\"",
                        s.value
                    ),
                );
                None
            }
        }
    }

    /// An optional array of strings.
    pub(crate) fn strings(&mut self, t: Tbl<'_>, key: &str) -> Option<Spanned<Vec<String>>> {
        let item = self.get(t, key)?;
        let path = join(t.path, key);
        let Some(arr) = item.as_array() else {
            // A single string is accepted as a one-element list.
            if item.is_str() {
                return self.string(t, key).map(|s| Spanned {
                    value: vec![s.value],
                    line: s.line,
                });
            }
            self.p.at(
                item.span(),
                format!(
                    "`{path}` must be an array of strings, not {}",
                    type_name(item)
                ),
            );
            return None;
        };
        let mut out = Vec::with_capacity(arr.len());
        let mut ok = true;
        for (i, v) in arr.iter().enumerate() {
            match v.as_str() {
                Some(s) => out.push(self.expand(s, v.span(), &format!("{path}[{i}]"))),
                None => {
                    ok = false;
                    self.p
                        .at(v.span(), format!("`{path}[{i}]` must be a string"));
                }
            }
        }
        ok.then(|| Spanned {
            value: out,
            line: self.line(item.span()),
        })
    }

    /// An optional list of tables: `[[path.key]]` sections or an array of inline tables.
    pub(crate) fn tables<'a>(&mut self, t: Tbl<'a>, key: &str) -> Option<Vec<(Tbl<'a>, String)>> {
        let item = self.get(t, key)?;
        let path = join(t.path, key);
        match item {
            Item::ArrayOfTables(a) => Some(
                a.iter()
                    .enumerate()
                    .map(|(i, tb)| {
                        (
                            Tbl {
                                t: tb,
                                path: "",
                                span: tb.span().map(|r| r.start),
                            },
                            format!("{path}[{i}]"),
                        )
                    })
                    .collect(),
            ),
            Item::Value(Value::Array(a)) => {
                let mut out = Vec::new();
                for (i, v) in a.iter().enumerate() {
                    match v.as_inline_table() {
                        Some(it) => out.push((
                            Tbl {
                                t: it,
                                path: "",
                                span: v.span().map(|r| r.start),
                            },
                            format!("{path}[{i}]"),
                        )),
                        None => self.p.at(
                            v.span(),
                            format!("`{path}[{i}]` must be a table like {{ key = value }}"),
                        ),
                    }
                }
                Some(out)
            }
            other => {
                self.p.at(
                    other.span(),
                    format!(
                        "`{path}` must be a list of tables, not {}",
                        type_name(other)
                    ),
                );
                None
            }
        }
    }

    /// An optional sub-table (`[path.key]` or an inline table).
    pub(crate) fn table<'a>(&mut self, t: Tbl<'a>, key: &str, path: &'a str) -> Option<Tbl<'a>> {
        let item = self.get(t, key)?;
        self.as_table(item, path)
    }

    fn expand_value(&mut self, v: &mut Value, path: &str) {
        match v {
            Value::String(f) => {
                let span = f.span();
                let expanded = self.expand(f.value(), span, path);
                *f = toml_edit::Formatted::new(expanded);
            }
            Value::Array(a) => {
                for (i, x) in a.iter_mut().enumerate() {
                    self.expand_value(x, &format!("{path}[{i}]"));
                }
            }
            Value::InlineTable(t) => {
                for (k, x) in t.iter_mut() {
                    let p = join(path, &k);
                    self.expand_value(x, &p);
                }
            }
            _ => {}
        }
    }

    /// Records `message`, a problem another crate's `problems()` found in the table
    /// `item` (at `path`), on the line of the field it names: messages start with the
    /// field's name, bare (`max_batch must …`) or dotted from the top
    /// (`changefeed.http.max_limit: …`). Otherwise on `fallback`, else the table's line.
    pub(crate) fn problem_in(
        &mut self,
        item: &Item,
        path: &str,
        message: &str,
        fallback: Option<usize>,
    ) {
        let first = message
            .split(|c: char| c.is_whitespace() || c == ':')
            .next()
            .unwrap_or("");
        let dotted = first
            .strip_prefix(path)
            .and_then(|f| f.strip_prefix('.'))
            .unwrap_or(first);
        let mut at = Some(item);
        let mut span = None;
        for part in dotted.split('.') {
            at = at.and_then(|i| i.get(part));
            match at.and_then(Item::span) {
                Some(s) => span = Some(s),
                None => break,
            }
        }
        let line = match span {
            Some(s) => self.line(Some(s)),
            None => fallback.or_else(|| self.line(item.span())),
        };
        self.p.at_line(line, format!("in `{path}`: {message}"));
    }

    /// A table owned by another crate's configuration type: everything but `skip` is
    /// deserialized into `T` (which rejects unknown fields itself) after `${VAR}`
    /// expansion; its problem is reported with its line.
    pub(crate) fn serde_table<T: DeserializeOwned>(
        &mut self,
        item: &Item,
        path: &str,
        skip: &[&str],
    ) -> Option<T> {
        self.serde_with(item, path, skip, T::deserialize)
    }

    /// [`serde_table`](Self::serde_table), deserialized by `de` (a registered kind's
    /// type, chosen by the table's `kind`).
    pub(crate) fn serde_with<T>(
        &mut self,
        item: &Item,
        path: &str,
        skip: &[&str],
        de: impl FnOnce(toml_edit::de::ValueDeserializer) -> Result<T, toml_edit::de::Error>,
    ) -> Option<T> {
        let mut value = item.clone().into_value().ok()?;
        let Value::InlineTable(t) = &mut value else {
            self.p.at(item.span(), format!("`{path}` must be a table"));
            return None;
        };
        for k in skip {
            t.remove(k);
        }
        let before = self.p.list.len();
        self.expand_value(&mut value, path);
        // A missing variable is the value's problem; unknown keys and wrong types are
        // still reported beside it, but the values are not judged. (Offline, an unset
        // variable is no problem: the value is kept as written; the caller sees it
        // through `judged_since` and does not judge it.)
        let expanded = self.p.list.len() == before;
        match de(value.into_deserializer()) {
            Ok(v) => expanded.then_some(v),
            Err(e) => {
                let span = e.span().or_else(|| item.span());
                self.p.at(span, format!("in `{path}`: {}", e.message()));
                None
            }
        }
    }
}
