//! `[[redact]]`: column redaction (PII), one entry per table and column, applied to
//! every output — the changefeed (values, before/after images, snapshots) and every
//! sink (events and snapshot rows) — and never to rebuilds, which read the database.

use freshen::plug::Naming;
use freshen_codec::{DEFAULT_MASK_LENGTH, HashKey, Mask, RedactAction, RedactRule, Redactor};

use super::read::{Reader, Tbl};

/// The keys of a `[[redact]]` entry.
pub(crate) const KEYS: &[&str] = &["table", "column", "action", "length", "keep", "key_env"];

/// The actions, as `action` names them.
pub(crate) const ACTIONS: &[&str] = &["drop", "mask", "hash", "truncate"];

/// The longest `length` or `keep`: longer masks and truncations protect nothing more.
pub(crate) const MAX_LENGTH: i64 = 65_536;

/// The shortest hash key: a short key lets anyone who guesses it test guesses of the
/// values, which is what keying the hash prevents.
pub(crate) const MIN_KEY_BYTES: usize = 16;

/// Reads every `[[redact]]` entry, reporting every problem with its line; each rule
/// comes with the line of its entry (same order), for warnings about it. Table names
/// are read by the source's `naming` (unquoted parts folded, quotes removed), except
/// that an unqualified name keeps meaning that table in any schema; two entries for
/// one column of one table — however each is spelt — are a problem naming both lines.
pub(super) fn read(
    r: &mut Reader<'_, '_>,
    root: Tbl<'_>,
    naming: &Naming,
) -> (Redactor, Vec<Option<usize>>) {
    let Some(entries) = r.tables(root, "redact") else {
        return (Redactor::default(), Vec::new());
    };
    let mut rules: Vec<RedactRule> = Vec::new();
    let mut lines: Vec<Option<usize>> = Vec::new();
    for (t, path) in &entries {
        let t = Tbl { path, ..*t };
        r.known_keys(t, KEYS);
        let line = r.line(t.span.map(|s| s..s));
        let table = r.string(t, "table");
        if table.is_none() && t.t.get("table").is_none() {
            r.missing(
                t,
                "table",
                "the table, \"schema.table\" or \"table\" (any schema)",
            );
        }
        let column = r.string(t, "column");
        if column.is_none() && t.t.get("column").is_none() {
            r.missing(t, "column", "the column whose values are redacted");
        }
        let action = r.choice(t, "action", ACTIONS);
        if action.is_none() && t.t.get("action").is_none() {
            r.missing(t, "action", "\"drop\", \"mask\", \"hash\" or \"truncate\"");
        }
        let length = r.int(t, "length", 1..=MAX_LENGTH);
        let keep = r.int(t, "keep", 0..=MAX_LENGTH);
        let key_env = r.string(t, "key_env");
        for part in [&table, &column].into_iter().flatten() {
            if part.value.trim().is_empty() {
                r.p.at_line(
                    part.line,
                    format!("`{path}`: table and column must not be empty"),
                );
            }
        }
        let Some(action) = action else { continue };
        // Parameters that do not apply to the action are mistakes: say so rather than
        // redact differently from what the file seems to ask.
        let applies: &[&str] = match action.value.as_str() {
            "mask" => &["length", "keep"],
            "hash" => &["key_env"],
            "truncate" => &["length"],
            _ => &[],
        };
        for key in ["length", "keep", "key_env"] {
            if let Some(item) = t.t.get(key)
                && !applies.contains(&key)
            {
                r.p.at(
                    item.span(),
                    format!("`{path}.{key}` does not apply to action `{}`", action.value),
                );
            }
        }
        let problems = r.p.list.len();
        let act = match action.value.as_str() {
            "drop" => Some(RedactAction::Drop),
            "mask" => match (&length, &keep) {
                (Some(_), Some(k)) => {
                    r.p.at_line(
                        k.line,
                        format!("`{path}`: a mask has either `length` (always that many `*`) or `keep` (the last N characters shown), not both"),
                    );
                    None
                }
                (Some(n), None) => Some(RedactAction::Mask(Mask::Fixed(n.value as usize))),
                (None, Some(k)) => Some(RedactAction::Mask(Mask::KeepLast(k.value as usize))),
                (None, None) => Some(RedactAction::Mask(Mask::Fixed(DEFAULT_MASK_LENGTH))),
            },
            "truncate" => match &length {
                Some(n) => Some(RedactAction::Truncate(n.value as usize)),
                None => {
                    if t.t.get("length").is_none() {
                        r.missing(t, "length", "how many characters `truncate` keeps");
                    }
                    None
                }
            },
            _ => hash_key(r, t, path, key_env.as_ref(), line).map(RedactAction::Hash),
        };
        let (Some(table), Some(column), Some(act)) = (table, column, act) else {
            continue;
        };
        let (schema, name) = match resolve(naming, &table.value) {
            Ok(t) => t,
            Err(e) => {
                r.p.at_line(table.line.or(line), format!("`{path}.table`: {e}"));
                continue;
            }
        };
        if r.p.list.len() != problems {
            continue;
        }
        let rule = RedactRule {
            schema,
            table: name,
            column: column.value,
            action: act,
        };
        if let Some((first, first_line)) = rules
            .iter()
            .zip(&lines)
            .find(|(other, _)| overlap(other, &rule))
        {
            r.p.at_line(
                line,
                format!(
                    "`{path}`: column `{}` of {} is already redacted by the entry on line {} ({}): a column takes one rule",
                    rule.column,
                    written(&rule),
                    first_line.map_or_else(|| "?".to_owned(), |l| l.to_string()),
                    written(first),
                ),
            );
            continue;
        }
        rules.push(rule);
        lines.push(line);
    }
    (Redactor::new(rules), lines)
}

/// A rule's table as read: `(schema, table)` by the source's naming, the schema `None`
/// when the name has none (that table in any schema).
fn resolve(naming: &Naming, written: &str) -> Result<(Option<String>, String), String> {
    // A default schema no name can spell (parts are never empty) marks an unqualified
    // name, which keeps its meaning: every schema's table of that name.
    let any = Naming {
        default_schema: Some(String::new()),
        ..naming.clone()
    };
    let (schema, table) = any.parse(written)?;
    Ok(((!schema.is_empty()).then_some(schema), table))
}

/// Whether two rules name the same column of a table they both cover.
fn overlap(a: &RedactRule, b: &RedactRule) -> bool {
    a.column == b.column
        && a.table == b.table
        && match (&a.schema, &b.schema) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        }
}

/// A rule's table as messages show it.
fn written(rule: &RedactRule) -> String {
    match &rule.schema {
        Some(s) => format!("`{s}.{}`", rule.table),
        None => format!("`{}` (in any schema)", rule.table),
    }
}

/// The key of a `hash` entry, read from the environment variable `key_env` names.
/// Offline (`check --offline`) an unset variable gives an empty key: the entry is
/// checked, never run.
fn hash_key(
    r: &mut Reader<'_, '_>,
    t: Tbl<'_>,
    path: &str,
    key_env: Option<&super::read::Spanned<String>>,
    line: Option<usize>,
) -> Option<HashKey> {
    let Some(name) = key_env else {
        if t.t.get("key_env").is_none() {
            r.missing(
                t,
                "key_env",
                "the environment variable holding the hash key (the key itself never goes in the file)",
            );
        }
        return None;
    };
    let before = r.p.list.len();
    let where_ = format!("{path}.key_env");
    match r.env_value(&name.value, name.line.or(line), &where_) {
        Some(key) if key.len() < MIN_KEY_BYTES => {
            r.p.at_line(
                name.line,
                format!(
                    "`{where_}`: the key in `{}` is {} bytes long; use at least {MIN_KEY_BYTES} (e.g. `openssl rand -hex 32`)",
                    name.value,
                    key.len()
                ),
            );
            None
        }
        Some(key) => Some(HashKey::new(key.into_bytes())),
        None if r.p.list.len() == before => Some(HashKey::new(Vec::new())),
        None => None,
    }
}
