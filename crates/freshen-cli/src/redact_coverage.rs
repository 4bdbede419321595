//! Whether each `[[redact]]` rule can match anything. A rule whose table no source
//! captures, or whose column the table does not have, redacts nothing — and the column
//! it was meant for leaves freshen in clear. `check` warns about each (naming the rule's
//! line) and `run` logs the same warnings once at start. Pure: the captured tables,
//! patterns and columns are given.

use freshen_codec::RedactRule;

/// A rule that matches nothing: its line in the file and why, as one sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmatched {
    /// The line of the rule's `[[redact]]` header.
    pub line: Option<usize>,
    /// Why it matches nothing, naming the rule.
    pub message: String,
}

/// The rule's table as the file wrote it.
fn written(rule: &RedactRule) -> String {
    match &rule.schema {
        Some(s) => format!("{s}.{}", rule.table),
        None => rule.table.clone(),
    }
}

/// Whether `rule` names `(schema, table)`, as the redactor matches events.
fn names(rule: &RedactRule, schema: &str, table: &str) -> bool {
    rule.table == table && rule.schema.as_deref().is_none_or(|s| s == schema)
}

/// Whether a `[source] tables` pattern (`"all"`, `"schema.*"`, `"schema.prefix_*"`)
/// could select the rule's table: such a table may be captured once it appears.
fn pattern_may_select(rule: &RedactRule, pattern: &str) -> bool {
    if pattern == "all" {
        return true;
    }
    let Some((schema, glob)) = pattern.split_once('.') else {
        return false;
    };
    let prefix = glob.strip_suffix('*').unwrap_or(glob);
    rule.schema.as_deref().is_none_or(|s| s == schema) && rule.table.starts_with(prefix)
}

/// The rules (with `lines`, in the same order) whose table is none of `captured` (every
/// table the configuration captures: the views', the source's, the sinks') and that no
/// `patterns` entry could select.
pub(crate) fn unmatched_tables(
    rules: &[RedactRule],
    lines: &[Option<usize>],
    captured: &[(String, String)],
    patterns: &[String],
) -> Vec<Unmatched> {
    rules
        .iter()
        .enumerate()
        .filter(|(_, r)| !captured.iter().any(|(s, t)| names(r, s, t)))
        .filter(|(_, r)| !patterns.iter().any(|p| pattern_may_select(r, p)))
        .map(|(i, r)| Unmatched {
            line: lines.get(i).copied().flatten(),
            message: format!(
                "`[[redact]]` for `{}` column `{}` matches nothing: no view, sink or `[source] tables` entry captures table `{}` (names are compared as written: schema and case)",
                written(r),
                r.column,
                written(r)
            ),
        })
        .collect()
}

/// The rules (with `lines`) whose column none of the captured tables they name has;
/// `columns` gives a captured table's columns (`None`: not known, e.g. the table does
/// not exist yet — then nothing is said about it).
pub(crate) fn unmatched_columns(
    rules: &[RedactRule],
    lines: &[Option<usize>],
    captured: &[(String, String)],
    columns: impl Fn(&str, &str) -> Option<Vec<String>>,
) -> Vec<Unmatched> {
    let mut out = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        let known: Vec<(&(String, String), Vec<String>)> = captured
            .iter()
            .filter(|(s, t)| names(r, s, t))
            .filter_map(|st| columns(&st.0, &st.1).map(|c| (st, c)))
            .collect();
        if known.is_empty() || known.iter().any(|(_, c)| c.contains(&r.column)) {
            continue;
        }
        let tables: Vec<String> = known.iter().map(|((s, t), _)| format!("{s}.{t}")).collect();
        out.push(Unmatched {
            line: lines.get(i).copied().flatten(),
            message: format!(
                "`[[redact]]` for `{}` column `{}` matches nothing: {} has no column `{}` (names are compared as written, case included)",
                written(r),
                r.column,
                tables.join(", "),
                r.column
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use freshen_codec::RedactAction;

    fn rule(table: &str, column: &str) -> RedactRule {
        RedactRule::new(table, column, RedactAction::Drop)
    }

    fn captured() -> Vec<(String, String)> {
        vec![
            ("public".into(), "users".into()),
            ("public".into(), "outbox".into()),
        ]
    }

    #[test]
    fn a_rule_for_a_table_nothing_captures_is_named_with_its_line() {
        let rules = [
            rule("public.users", "email"),
            rule("users", "ssn"),
            rule("public.user", "email"),
            rule("audit.users", "email"),
        ];
        let lines = [Some(3), Some(8), Some(13), Some(18)];
        let found = unmatched_tables(&rules, &lines, &captured(), &[]);
        assert_eq!(
            found.iter().map(|u| u.line).collect::<Vec<_>>(),
            [Some(13), Some(18)],
            "{found:?}"
        );
        assert!(found[0].message.contains("`public.user`"), "{found:?}");
        assert!(found[1].message.contains("column `email`"), "{found:?}");
    }

    #[test]
    fn a_pattern_that_may_select_the_table_later_is_no_warning() {
        let rules = [
            rule("sales.orders_2026", "card"),
            rule("crm.people", "card"),
        ];
        let lines = [Some(1), Some(2)];
        let patterns = ["sales.orders_*".to_owned()];
        let found = unmatched_tables(&rules, &lines, &[], &patterns);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].line, Some(2));
        assert!(unmatched_tables(&rules, &lines, &[], &["all".to_owned()]).is_empty());
        assert_eq!(
            unmatched_tables(&rules, &lines, &[], &["sales.invoices_*".to_owned()]).len(),
            2
        );
    }

    #[test]
    fn a_column_the_table_does_not_have_is_named_unless_the_table_is_unknown() {
        let rules = [
            rule("public.users", "email"),
            rule("users", "emial"),
            rule("public.outbox", "payload"),
        ];
        let lines = [Some(1), Some(5), Some(9)];
        let columns = |s: &str, t: &str| match (s, t) {
            ("public", "users") => Some(vec!["id".to_owned(), "email".to_owned()]),
            _ => None,
        };
        let found = unmatched_columns(&rules, &lines, &captured(), columns);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].line, Some(5));
        assert!(
            found[0]
                .message
                .contains("public.users has no column `emial`"),
            "{found:?}"
        );
    }
}
