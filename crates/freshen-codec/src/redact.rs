//! Column redaction (PII): what a row image looks like once it leaves freshen.
//!
//! Pure and synchronous: the changefeed applies it where it builds records (so its store
//! never holds a clear value) and the sinks where they encode events. Rebuilds never
//! see it: they read the database, not the events.
//!
//! Only values are rewritten. NULL stays NULL (whether a value is missing is not what
//! is hidden) and an unchanged value stays unchanged (the changefeed fills it from the
//! row's last image, which was redacted when it was stored).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use freshen::{Row, RowEvent, Value};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::seal::SealKey;

/// The character masks are made of.
pub const MASK_CHAR: char = '*';

/// The mask length when a `mask` rule gives neither `length` nor `keep`.
pub const DEFAULT_MASK_LENGTH: usize = 8;

/// A key for `hash` rules. Its bytes never appear in `Debug` output or logs.
#[derive(Clone)]
pub struct HashKey(Arc<[u8]>);

impl HashKey {
    /// A key from its bytes (freshen reads them from an environment variable).
    pub fn new(bytes: impl Into<Arc<[u8]>>) -> HashKey {
        HashKey(bytes.into())
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HashKey(<redacted>)")
    }
}

/// How a `mask` rule hides a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mask {
    /// Always this many mask characters: the value's length is hidden too.
    Fixed(usize),
    /// Every character but the last `n` masked (a value of `n` characters or fewer is
    /// masked whole, so a short value never shows through).
    KeepLast(usize),
}

/// What a rule does to a column's values.
#[derive(Debug, Clone)]
pub enum Action {
    /// The column is left out of every row image.
    Drop,
    /// The value is replaced by mask characters.
    Mask(Mask),
    /// The value becomes the lower-case hex HMAC-SHA-256 of its text under the key:
    /// equal values hash equally (joinable), and without the key nobody can test a
    /// guess.
    Hash(HashKey),
    /// The value keeps its first `n` characters (bytes: its first `n` bytes).
    Truncate(usize),
}

impl Action {
    /// The action's name as the configuration writes it.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Drop => "drop",
            Action::Mask(_) => "mask",
            Action::Hash(_) => "hash",
            Action::Truncate(_) => "truncate",
        }
    }
}

/// One column of one table, and what is done to it.
#[derive(Debug, Clone)]
pub struct RedactRule {
    /// The schema (PostgreSQL) or database (MySQL), or `None` for the table in any.
    pub schema: Option<String>,
    /// The table's name.
    pub table: String,
    /// The column's name.
    pub column: String,
    /// What is done to its values.
    pub action: Action,
}

impl RedactRule {
    /// A rule for `table` written as `schema.table` or `table` (any schema).
    pub fn new(table: &str, column: impl Into<String>, action: Action) -> RedactRule {
        let (schema, table) = match table.split_once('.') {
            Some((s, t)) => (Some(s.to_owned()), t.to_owned()),
            None => (None, table.to_owned()),
        };
        RedactRule {
            schema,
            table,
            column: column.into(),
            action,
        }
    }

    fn matches(&self, schema: &str, table: &str) -> bool {
        self.table == table && self.schema.as_deref().is_none_or(|s| s == schema)
    }
}

/// Every redaction rule, applied to the row images of the events that leave freshen.
///
/// Cloning is cheap (the rules are shared, and so are the counts of what they did:
/// every clone counts into the same [`counts`](Self::counts)).
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    rules: Arc<[RedactRule]>,
    /// Values each rule redacted, by rule index.
    counts: Arc<[AtomicU64]>,
}

impl Redactor {
    /// A redactor applying `rules` (a column named by several rules gets the first).
    pub fn new(rules: Vec<RedactRule>) -> Redactor {
        Redactor {
            counts: rules.iter().map(|_| AtomicU64::new(0)).collect(),
            rules: rules.into(),
        }
    }

    /// Each rule with the number of values it redacted so far, one per row image
    /// (before and after count apart); NULL and unchanged values, which are never
    /// rewritten, do not count. An event that leaves by two outputs (the
    /// changefeed and a sink) counts once for each.
    pub fn counts(&self) -> Vec<(&RedactRule, u64)> {
        self.rules
            .iter()
            .zip(self.counts.iter())
            .map(|(r, n)| (r, n.load(Relaxed)))
            .collect()
    }

    /// Whether there is no rule at all.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules.
    pub fn rules(&self) -> &[RedactRule] {
        &self.rules
    }

    /// `event` with its row images redacted, or `None` when no rule names its table
    /// (then it leaves as it is).
    pub fn apply(&self, event: &RowEvent) -> Option<RowEvent> {
        let rules = self.rules_for(&event.schema, &event.table);
        if rules.is_empty() {
            return None;
        }
        let mut out = event.clone();
        out.new = event
            .new
            .as_ref()
            .map(|r| redact_row(&rules, r, &self.counts));
        out.old = event
            .old
            .as_ref()
            .map(|r| redact_row(&rules, r, &self.counts));
        Some(out)
    }

    /// `events` redacted, borrowed when no rule names any of their tables.
    pub fn apply_all<'a>(&self, events: &'a [RowEvent]) -> Cow<'a, [RowEvent]> {
        if self.is_empty()
            || !events
                .iter()
                .any(|e| !self.rules_for(&e.schema, &e.table).is_empty())
        {
            return Cow::Borrowed(events);
        }
        Cow::Owned(
            events
                .iter()
                .map(|e| self.apply(e).unwrap_or_else(|| e.clone()))
                .collect(),
        )
    }

    /// `event` redacted, borrowed when no rule names its table.
    pub fn apply_one<'a>(&self, event: &'a RowEvent) -> Cow<'a, RowEvent> {
        match self.apply(event) {
            Some(e) => Cow::Owned(e),
            None => Cow::Borrowed(event),
        }
    }

    /// The rule that redacts `column` of `schema.table`, if one does (the first that
    /// names it, as [`apply`](Self::apply) uses).
    pub fn rule(&self, schema: &str, table: &str, column: &str) -> Option<&RedactRule> {
        self.rules
            .iter()
            .find(|r| r.matches(schema, table) && r.column == column)
    }

    /// `position` — the values of `columns` of `schema.table`, as text (a snapshot's
    /// resume key) — sealed when a rule hides any of those columns (see the `seal`
    /// module: keyed by the first `hash` rule among them, else by a key of this
    /// process); `None` when no rule does.
    pub fn seal_position(
        &self,
        schema: &str,
        table: &str,
        columns: &[&str],
        position: &[String],
    ) -> Option<String> {
        let key = self.seal_key(schema, table, columns)?;
        Some(crate::seal::seal(key, schema, table, columns, position))
    }

    /// The position a token from [`seal_position`](Self::seal_position) holds, or
    /// `None` when these rules cannot open it (another hash key, a rule changed, or a
    /// key of an earlier process).
    pub fn open_position(
        &self,
        schema: &str,
        table: &str,
        columns: &[&str],
        token: &str,
    ) -> Option<Vec<String>> {
        let key = self.seal_key(schema, table, columns)?;
        crate::seal::open(key, schema, table, columns, token)
    }

    /// The key positions over `columns` of the table are sealed under, when a rule
    /// hides one of them.
    fn seal_key(&self, schema: &str, table: &str, columns: &[&str]) -> Option<SealKey> {
        let rules = self.rules_for(schema, table);
        let covering: Vec<&RedactRule> = columns
            .iter()
            .filter_map(|c| rules.iter().find(|(_, r)| r.column == *c).map(|(_, r)| *r))
            .collect();
        // The first `hash` rule's key, in column order: a restart with it opens the token.
        let secret = covering.iter().find_map(|r| match &r.action {
            Action::Hash(k) => Some(k.bytes()),
            _ => None,
        });
        (!covering.is_empty()).then(|| SealKey::for_secret(secret))
    }

    /// The rules naming the table, each with its index.
    fn rules_for(&self, schema: &str, table: &str) -> Vec<(usize, &RedactRule)> {
        self.rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.matches(schema, table))
            .collect()
    }
}

impl freshen::plug::Redact for Redactor {
    fn apply(&self, event: &RowEvent) -> Option<RowEvent> {
        Redactor::apply(self, event)
    }

    fn seal_position(
        &self,
        schema: &str,
        table: &str,
        columns: &[&str],
        position: &[String],
    ) -> Option<String> {
        Redactor::seal_position(self, schema, table, columns, position)
    }

    fn open_position(
        &self,
        schema: &str,
        table: &str,
        columns: &[&str],
        token: &str,
    ) -> Option<Vec<String>> {
        Redactor::open_position(self, schema, table, columns, token)
    }
}

/// A row image with the rules' columns redacted (dropped columns left out), each
/// redaction counted in `counts` by rule index.
fn redact_row(rules: &[(usize, &RedactRule)], row: &Row, counts: &[AtomicU64]) -> Row {
    let rule = |column: &str| rules.iter().find(|(_, r)| r.column == column);
    let count = |i: usize, value: &Value| {
        // NULL and unchanged values are left as they are: nothing was hidden.
        if !matches!(value, Value::Null | Value::Unchanged)
            && let Some(n) = counts.get(i)
        {
            n.fetch_add(1, Relaxed);
        }
    };
    let drops = |c: &str| rule(c).is_some_and(|(_, r)| matches!(r.action, Action::Drop));
    if !row.columns().iter().any(|c| drops(c)) {
        // The same columns: share the names, rewrite the values.
        let values = row
            .iter()
            .map(|(column, value)| match rule(column) {
                Some((i, r)) => {
                    count(*i, value);
                    redact_value(&r.action, value)
                }
                None => value.clone(),
            })
            .collect();
        return Row::new(row.columns().clone(), values);
    }
    let mut columns: Vec<Box<str>> = Vec::with_capacity(row.len());
    let mut values = Vec::with_capacity(row.len());
    for (column, value) in row.iter() {
        match rule(column) {
            None => {
                columns.push(column.into());
                values.push(value.clone());
            }
            Some((i, r)) => {
                count(*i, value);
                if !matches!(r.action, Action::Drop) {
                    columns.push(column.into());
                    values.push(redact_value(&r.action, value));
                }
            }
        }
    }
    Row::new(columns.into(), values)
}

/// One value redacted by `action` (`Drop` gives NULL: the row leaves the column out).
pub fn redact_value(action: &Action, value: &Value) -> Value {
    if matches!(value, Value::Null | Value::Unchanged) {
        return value.clone();
    }
    match action {
        Action::Drop => Value::Null,
        Action::Mask(Mask::Fixed(n)) => Value::Text(mask(*n).into()),
        Action::Mask(Mask::KeepLast(keep)) => {
            let text = value.to_text().unwrap_or_default();
            let len = text.chars().count();
            if len <= *keep {
                return Value::Text(mask(len).into());
            }
            let mut out = mask(len - keep);
            out.extend(text.chars().skip(len - keep));
            Value::Text(out.into())
        }
        Action::Hash(key) => {
            Value::Text(hmac_hex(key, &value.to_text().unwrap_or_default()).into())
        }
        Action::Truncate(n) => match value {
            Value::Bytes(b) => Value::Bytes(b.iter().take(*n).copied().collect()),
            // A truncated number or document is not one any more: it becomes text.
            v => Value::Text(v.to_text().unwrap_or_default().chars().take(*n).collect()),
        },
    }
}

fn mask(n: usize) -> String {
    std::iter::repeat_n(MASK_CHAR, n).collect()
}

/// Lower-case hex HMAC-SHA-256 of `text` under `key`.
pub fn hmac_hex(key: &HashKey, text: &str) -> String {
    // HMAC takes a key of any length (a long one is hashed first): no error can happen.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key.0).unwrap_or_else(|_| {
        unreachable!("HMAC accepts keys of every length");
    });
    mac.update(text.as_bytes());
    crate::hex::encode(&mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use freshen::Op;

    fn key(k: &str) -> HashKey {
        HashKey::new(k.as_bytes().to_vec())
    }

    /// A position is sealed under the first `hash` rule's key among its columns (so a
    /// restart with that key opens it), and under this process's key where only other
    /// rules cover them.
    #[test]
    fn the_first_hash_rule_over_a_position_gives_its_key() {
        let k = "a key of sixteen bytes or more";
        let r = Redactor::new(vec![
            RedactRule::new("t", "a", Action::Drop),
            RedactRule::new("t", "b", Action::Hash(key(k))),
        ]);
        assert!(r.seal_key("public", "t", &["a"]) == Some(SealKey::Process));
        assert!(
            r.seal_key("public", "t", &["a", "b"]) == Some(SealKey::for_secret(Some(k.as_bytes())))
        );
        assert!(r.seal_key("public", "t", &["c"]).is_none());
    }

    fn event(email: &str) -> RowEvent {
        RowEvent::new("public", "users", Op::Update)
            .with_pk(["id"])
            .with_new(Row::from_pairs([
                ("id", Value::Int(1)),
                ("email", Value::text(email)),
                ("card", Value::text("4111111111111111")),
                ("ssn", Value::text("123-45-6789")),
                ("note", Value::text("a long note")),
                ("other", Value::Null),
            ]))
            .with_old(Row::from_pairs([
                ("id", Value::Int(1)),
                ("email", Value::text(email)),
                ("ssn", Value::Unchanged),
            ]))
    }

    fn redactor(k: &str) -> Redactor {
        Redactor::new(vec![
            RedactRule::new("public.users", "email", Action::Hash(key(k))),
            RedactRule::new("users", "card", Action::Mask(Mask::KeepLast(4))),
            RedactRule::new("users", "ssn", Action::Drop),
            RedactRule::new("users", "note", Action::Truncate(3)),
            RedactRule::new("users", "other", Action::Mask(Mask::Fixed(8))),
        ])
    }

    #[test]
    fn every_action_rewrites_both_images() {
        let e = redactor("k1").apply(&event("ann@example.com")).unwrap();
        let new = e.new.unwrap();
        let cols: Vec<&str> = new.columns().iter().map(|c| &**c).collect();
        assert_eq!(cols, ["id", "email", "card", "note", "other"]);
        assert_eq!(new.get("id"), Some(&Value::Int(1)));
        assert_eq!(
            new.get("email"),
            Some(&Value::text(hmac_hex(&key("k1"), "ann@example.com")))
        );
        assert_eq!(new.get("card"), Some(&Value::text("************1111")));
        assert_eq!(new.get("note"), Some(&Value::text("a l")));
        assert_eq!(new.get("other"), Some(&Value::Null), "NULL stays NULL");
        let old = e.old.unwrap();
        assert_eq!(old.get("email"), new.get("email"));
        assert_eq!(old.get("ssn"), None, "dropped from the old image too");
    }

    #[test]
    fn each_rule_counts_the_values_it_redacted_in_every_clone() {
        let r = redactor("k1");
        let shared = r.clone();
        shared.apply(&event("ann@example.com")).unwrap();
        let mut other = event("bob@example.com");
        other.table = "accounts".into();
        assert!(r.apply(&other).is_none(), "another table: nothing counted");
        let counts: Vec<(&str, &str, u64)> = r
            .counts()
            .into_iter()
            .map(|(rule, n)| (rule.column.as_str(), rule.action.name(), n))
            .collect();
        assert_eq!(
            counts,
            [
                ("email", "hash", 2),
                ("card", "mask", 1),
                ("ssn", "drop", 1),
                ("note", "truncate", 1),
                ("other", "mask", 0),
            ],
            "before and after images count apart; NULL and unchanged values do not"
        );
    }

    #[test]
    fn hash_is_stable_keyed_and_joinable() {
        let a = hmac_hex(&key("k1"), "ann@example.com");
        assert_eq!(a.len(), 64);
        assert_eq!(a, hmac_hex(&key("k1"), "ann@example.com"));
        assert_ne!(a, hmac_hex(&key("k2"), "ann@example.com"));
        assert_ne!(a, hmac_hex(&key("k1"), "bob@example.com"));
        // RFC 4231 test case 2.
        assert_eq!(
            hmac_hex(&key("Jefe"), "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn masks_hide_short_values_and_lengths() {
        let keep = Action::Mask(Mask::KeepLast(4));
        assert_eq!(redact_value(&keep, &Value::text("abc")), Value::text("***"));
        assert_eq!(
            redact_value(&keep, &Value::text("ünïcode")),
            Value::text("***code")
        );
        let fixed = Action::Mask(Mask::Fixed(5));
        assert_eq!(
            redact_value(&fixed, &Value::text("x")),
            Value::text("*****")
        );
        assert_eq!(
            redact_value(&fixed, &Value::Int(12345678)),
            Value::text("*****")
        );
        assert_eq!(redact_value(&fixed, &Value::Unchanged), Value::Unchanged);
    }

    #[test]
    fn truncate_counts_characters_and_bytes() {
        let t = Action::Truncate(2);
        assert_eq!(redact_value(&t, &Value::text("éàü")), Value::text("éà"));
        assert_eq!(
            redact_value(&t, &Value::Bytes(vec![1, 2, 3].into())),
            Value::Bytes(vec![1, 2].into())
        );
        assert_eq!(redact_value(&t, &Value::Int(12345)), Value::text("12"));
    }

    #[test]
    fn other_tables_and_schemas_are_left_alone() {
        let r = redactor("k");
        let mut e = event("x@y");
        e.schema = "audit".into();
        // `users` rules without a schema still apply; the `public.users` one does not.
        let out = r.apply(&e).unwrap();
        assert_eq!(out.new.unwrap().get("email"), Some(&Value::text("x@y")));
        let other = RowEvent::new("public", "orders", Op::Insert)
            .with_new(Row::from_pairs([("email", "x@y")]));
        assert!(r.apply(&other).is_none());
        let events = [other];
        assert!(matches!(r.apply_all(&events), Cow::Borrowed(_)));
    }

    #[test]
    fn positions_are_sealed_only_over_redacted_columns() {
        let r = redactor("a key of sixteen bytes or more");
        let clear = vec!["7".to_owned(), "ann@example.com".to_owned()];
        assert_eq!(
            r.seal_position("public", "users", &["id"], &clear[..1]),
            None
        );
        assert_eq!(
            r.seal_position("public", "orders", &["email"], &clear[1..]),
            None
        );
        let t = r
            .seal_position("public", "users", &["id", "email"], &clear)
            .unwrap();
        assert!(!t.contains("ann"), "{t}");
        assert_eq!(
            r.open_position("public", "users", &["id", "email"], &t),
            Some(clear.clone())
        );
        // The hash rule's key seals it: another process with the same key opens it,
        // a changed key does not.
        let again = redactor("a key of sixteen bytes or more");
        assert_eq!(
            again.open_position("public", "users", &["id", "email"], &t),
            Some(clear)
        );
        let rotated = redactor("another key, sixteen bytes long");
        assert_eq!(
            rotated.open_position("public", "users", &["id", "email"], &t),
            None
        );
    }

    #[test]
    fn the_key_is_never_in_debug_output() {
        let text = format!("{:?}", redactor("sekrit-key"));
        assert!(!text.contains("sekrit"), "{text}");
    }
}
