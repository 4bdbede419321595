//! How a view's keys are shown outside the process — `/status`, `/healthz`, the admin
//! API, log lines: a key part read from a column that a `[[redact]]` rule hides is shown
//! as that rule shows the column's values in the changefeed and the sinks (hashed,
//! masked, truncated; a dropped column masked), never in clear. Rebuilds still get the
//! clear key: they read the database. Pure.

use freshen::{Key, Value};
use freshen_codec::{DEFAULT_MASK_LENGTH, Mask, RedactAction, Redactor, redact_value};

use crate::config::View;

/// A view's key parts and how each is shown.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyDisplay {
    /// By key part: the action that hides it, if any.
    parts: Vec<Option<RedactAction>>,
}

impl KeyDisplay {
    /// How `view`'s keys are shown under `redact`: a part is hidden when a rule covers
    /// the column it is read from in any table the view watches directly. (A fan-out's
    /// keys come from its statement, whose columns freshen does not know.)
    pub(crate) fn new(view: &View, redact: &Redactor) -> KeyDisplay {
        let width = view.direct().map(|w| w.key.len()).max().unwrap_or(0);
        let parts = (0..width)
            .map(|i| {
                view.direct().find_map(|w| {
                    let column = w.key.get(i)?;
                    redact
                        .rule(&w.schema, &w.table, column)
                        .map(|r| r.action.clone())
                })
            })
            .collect();
        KeyDisplay { parts }
    }

    /// Whether any part is hidden.
    pub(crate) fn hides(&self) -> bool {
        self.parts.iter().any(Option::is_some)
    }

    /// `key` as it may be shown.
    pub(crate) fn show(&self, key: &Key) -> Key {
        if !self.hides() {
            return key.clone();
        }
        let parts: Vec<Option<String>> = key
            .parts()
            .enumerate()
            .map(
                |(i, part)| match (part, self.parts.get(i).and_then(Option::as_ref)) {
                    (Some(text), Some(action)) => Some(hidden(action, text)),
                    (part, _) => part.map(str::to_owned),
                },
            )
            .collect();
        Key::from_parts(parts)
    }
}

/// One hidden part as its rule shows the column's values (a dropped column has none to
/// show: masked).
fn hidden(action: &RedactAction, text: &str) -> String {
    let masked = RedactAction::Mask(Mask::Fixed(DEFAULT_MASK_LENGTH));
    let action = match action {
        RedactAction::Drop => &masked,
        a => a,
    };
    redact_value(action, &Value::text(text))
        .to_text()
        .map(|t| t.into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use freshen_codec::{HashKey, RedactRule, hmac_hex};

    use super::*;
    use crate::config::Watch;

    fn watch(table: &str, key: &[&str], keys: Option<&str>) -> Watch {
        Watch {
            schema: "public".into(),
            table: table.into(),
            key: key.iter().map(|k| (*k).to_owned()).collect(),
            keys: keys.map(str::to_owned),
            fixed_key: false,
            line: None,
        }
    }

    fn view(watch: Vec<Watch>) -> View {
        crate::scope::tests::view_with(watch)
    }

    fn key() -> HashKey {
        HashKey::new(b"a key of sixteen bytes or more".to_vec())
    }

    #[test]
    fn a_hidden_part_is_shown_as_its_rule_shows_it() {
        let redact = Redactor::new(vec![
            RedactRule::new("people", "email", RedactAction::Hash(key())),
            RedactRule::new("public.visits", "ssn", RedactAction::Drop),
        ]);
        let v = view(vec![
            watch("people", &["email", "region"], None),
            watch("visits", &["person", "ssn"], None),
        ]);
        let d = KeyDisplay::new(&v, &redact);
        assert!(d.hides());
        let k = Key::from_parts([Some("ann@example.com"), Some("eu")]);
        assert_eq!(
            d.show(&k),
            Key::from_parts([
                Some(hmac_hex(&key(), "ann@example.com")),
                Some("********".into())
            ]),
            "the first part hashed as the changefeed hashes it; the second masked"
        );
        let nulls = Key::from_parts([None::<&str>, Some("eu")]);
        assert_eq!(d.show(&nulls).parts().next(), Some(None), "NULL stays NULL");
    }

    #[test]
    fn keys_of_views_no_rule_touches_are_shown_as_they_are() {
        let redact = Redactor::new(vec![RedactRule::new(
            "people",
            "email",
            RedactAction::Hash(key()),
        )]);
        for v in [
            view(vec![watch("people", &["region"], None)]),
            view(vec![watch("orders", &["email"], None)]),
            // A fan-out's parent key is not the view's key.
            view(vec![watch("people", &["email"], Some("SELECT 1"))]),
        ] {
            let d = KeyDisplay::new(&v, &redact);
            assert!(!d.hides());
            let k = Key::from("x@y");
            assert_eq!(d.show(&k), k);
        }
        assert!(!KeyDisplay::default().hides());
    }
}
