//! What a generic plan (`EXPLAIN (VERBOSE, FORMAT JSON)`) says about a query's joins,
//! read without a SQL parser: PostgreSQL has already resolved views, inlined functions
//! and aliases (VERBOSE makes every alias unique and qualifies every column), so the
//! plan's conditions are the query's own equalities, in one spelling. Pure: it reads a
//! `serde_json::Value`.

use serde_json::Value;

/// A column of one range-table entry: `alias.column` as the plan prints it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ColRef {
    /// The alias (unique within the plan).
    pub alias: String,
    /// The column.
    pub column: String,
}

/// What the inference needs from a plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    /// Scans: (alias, schema, relation), in plan order.
    pub scans: Vec<(String, String, String)>,
    /// `x.a = y.b` conditions (joins, filters, index conditions).
    pub equalities: Vec<(ColRef, ColRef)>,
    /// `x.a = ANY ($k)` (or `= $k`): the column bound to key part `k` (1-based).
    pub params: Vec<(ColRef, usize)>,
    /// Conditions that are not such equalities, with the aliases they mention: the
    /// joins the inference could not follow, for its messages.
    pub other: Vec<(Vec<String>, String)>,
    /// The top node's output, one per returned column: the column it is, if it is one.
    pub output: Vec<Option<ColRef>>,
    /// Where the plan applies each condition on a key parameter (`$k`), in plan order:
    /// on a scan of a table (the filter reached the table) or above one (a subquery's
    /// aggregate, window or `DISTINCT ON` kept it out).
    pub sites: Vec<ParamSite>,
}

/// A plan node applying a condition on key parameter `$part`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSite {
    /// The key part (1-based).
    pub part: usize,
    /// The node's type as the plan names it (`Seq Scan`, `Subquery Scan`, …).
    pub node: String,
    /// Whether the node reads a table or an index: the condition is applied where the
    /// rows are read, so a batch reads only its keys' rows (given an index).
    pub on_scan: bool,
}

impl Shape {
    /// The first node that applies a condition on a key parameter above the tables,
    /// if any: a batch then computes more than its keys' rows (the whole query, for a
    /// filter above a whole-table aggregate) and filters afterwards.
    pub fn filtered_above(&self) -> Option<&ParamSite> {
        self.sites.iter().find(|s| !s.on_scan)
    }
}

/// Reads `plan` (the JSON `EXPLAIN (VERBOSE, FORMAT JSON)` prints).
pub fn shape(plan: &Value) -> Shape {
    let mut out = Shape::default();
    let top = plan
        .as_array()
        .and_then(|a| a.first())
        .and_then(|p| p.get("Plan"));
    if let Some(top) = top {
        out.output = top
            .get("Output")
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .map(|i| i.as_str().and_then(|s| colref(strip(s))))
                    .collect()
            })
            .unwrap_or_default();
    }
    walk(plan, &mut out);
    // With one relation in the query PostgreSQL prints its columns bare (`cid`, not
    // `items.cid`) in some nodes' output: they are that relation's.
    if let [(alias, _, _)] = out.scans.as_slice() {
        let alias = alias.clone();
        let items = top
            .and_then(|t| t.get("Output"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (o, item) in out.output.iter_mut().zip(&items) {
            if o.is_none()
                && let Some((column, rest)) = item.as_str().and_then(|s| ident(strip(s)))
                && rest.is_empty()
            {
                *o = Some(ColRef {
                    alias: alias.clone(),
                    column,
                });
            }
        }
    }
    out
}

/// The output positions of the columns a plan's top aggregate groups by, when every
/// `GROUP BY` item is one of its output columns (a `SELECT DISTINCT` hashes all of
/// them): the key its rows have by construction. `None` for anything else (no
/// grouping, grouping sets, a grouped expression the query does not return).
pub fn grouped_by(plan: &Value) -> Option<Vec<usize>> {
    let mut node = plan.as_array()?.first()?.get("Plan")?;
    // Wrappers that keep the grouping's rows as they are.
    while matches!(
        node.get("Node Type").and_then(Value::as_str),
        Some("Sort" | "Incremental Sort" | "Result" | "Gather" | "Gather Merge")
    ) {
        node = node.get("Plans")?.as_array()?.first()?;
    }
    if node.get("Node Type").and_then(Value::as_str) != Some("Aggregate") {
        return None;
    }
    let groups = node.get("Group Key")?.as_array()?;
    let output: Vec<&str> = node
        .get("Output")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let scans = shape(plan).scans;
    // With one relation, some nodes print its columns bare and others qualified.
    let bare = |s: &str| -> String {
        match scans.as_slice() {
            [(alias, _, _)] => s
                .strip_prefix(alias.as_str())
                .and_then(|r| r.strip_prefix('.'))
                .unwrap_or(s)
                .to_owned(),
            _ => s.to_owned(),
        }
    };
    let mut out = Vec::new();
    for g in groups {
        let g = bare(g.as_str()?);
        let at = output.iter().position(|o| bare(o) == g)?;
        if !out.contains(&at) {
            out.push(at);
        }
    }
    (!out.is_empty()).then_some(out)
}

fn walk(v: &Value, out: &mut Shape) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
        Value::Object(o) => {
            let node = o.get("Node Type").and_then(Value::as_str).unwrap_or("");
            let on_scan = o.contains_key("Relation Name") || o.contains_key("Index Name");
            if let (Some(rel), Some(alias)) = (
                o.get("Relation Name").and_then(Value::as_str),
                o.get("Alias").and_then(Value::as_str),
            ) {
                let schema = o.get("Schema").and_then(Value::as_str).unwrap_or("public");
                let scan = (alias.to_owned(), schema.to_owned(), rel.to_owned());
                if !out.scans.contains(&scan) {
                    out.scans.push(scan);
                }
            }
            for (name, value) in o {
                if let Some(text) = value.as_str()
                    && (name.ends_with("Cond") || name.ends_with("Filter"))
                {
                    for part in conditions(text, out) {
                        let site = ParamSite {
                            part,
                            node: node.to_owned(),
                            on_scan,
                        };
                        if !out.sites.contains(&site) {
                            out.sites.push(site);
                        }
                    }
                }
            }
            for child in o.values() {
                if child.is_object() || child.is_array() {
                    walk(child, out);
                }
            }
        }
        _ => {}
    }
}

/// Splits a condition into its top-level AND terms and files each; returns the key
/// parts (`$k`) the condition mentions anywhere.
fn conditions(text: &str, out: &mut Shape) -> Vec<usize> {
    let parts = mentioned_params(text);
    for term in split_and(parens(text)) {
        let term = parens(term);
        if let Some((l, r)) = split_top(term, " = ") {
            let (l, r) = (strip(l), strip(r));
            match (colref(l), colref(r), param(l), param(r)) {
                (Some(a), Some(b), _, _) => {
                    let pair = (a, b);
                    if !out.equalities.contains(&pair) {
                        out.equalities.push(pair);
                    }
                    continue;
                }
                (Some(c), None, _, Some(k)) | (None, Some(c), Some(k), _) => {
                    if !out.params.contains(&(c.clone(), k)) {
                        out.params.push((c, k));
                    }
                    continue;
                }
                _ => {}
            }
        }
        let aliases = mentioned(term);
        if !aliases.is_empty() && !out.other.iter().any(|(_, t)| t == term) {
            out.other.push((aliases, term.to_owned()));
        }
    }
    parts
}

/// The parameters (`$k`, k > 0) a condition's text mentions outside quotes.
fn mentioned_params(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut quoted: Option<char> = None;
    for (i, c) in text.char_indices() {
        match (quoted, c) {
            (Some(q), c) if c == q => quoted = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quoted = Some(c),
            (None, '$') => {
                let digits: String = text[i + 1..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                if let Ok(k) = digits.parse::<usize>()
                    && k > 0
                    && !out.contains(&k)
                {
                    out.push(k);
                }
            }
            _ => {}
        }
    }
    out
}

/// `s` without enclosing parentheses.
fn parens(mut s: &str) -> &str {
    loop {
        let t = s.trim();
        if t.starts_with('(') && t.ends_with(')') && closing(t, 0) == Some(t.len() - 1) {
            s = &t[1..t.len() - 1];
            continue;
        }
        return t;
    }
}

/// An operand without enclosing parentheses and trailing casts (`(x)::bigint`).
fn strip(mut s: &str) -> &str {
    loop {
        let t = s.trim();
        if let Some(i) = last_top(t, "::") {
            s = &t[..i];
            continue;
        }
        if t.starts_with('(') && t.ends_with(')') && closing(t, 0) == Some(t.len() - 1) {
            s = &t[1..t.len() - 1];
            continue;
        }
        return t;
    }
}

/// Index of the parenthesis closing the one at `open`.
fn closing(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut quoted: Option<char> = None;
    for (i, c) in s.char_indices().skip_while(|(i, _)| *i < open) {
        match (quoted, c) {
            (Some(q), c) if c == q => quoted = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quoted = Some(c),
            (None, '(') => depth += 1,
            (None, ')') => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Byte offsets of `pat` outside parentheses and quotes.
fn top_level(s: &str, pat: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut quoted: Option<u8> = None;
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match quoted {
            Some(q) if c == q => quoted = None,
            Some(_) => {}
            None => match c {
                b'"' | b'\'' => quoted = Some(c),
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                _ if depth == 0 && bytes[i..].starts_with(pat.as_bytes()) => {
                    out.push(i);
                    i += pat.len();
                    continue;
                }
                _ => {}
            },
        }
        i += 1;
    }
    out
}

fn last_top(s: &str, pat: &str) -> Option<usize> {
    top_level(s, pat).last().copied()
}

fn split_top<'a>(s: &'a str, pat: &str) -> Option<(&'a str, &'a str)> {
    match top_level(s, pat).as_slice() {
        [i] => Some((&s[..*i], &s[i + pat.len()..])),
        _ => None,
    }
}

fn split_and(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in top_level(s, " AND ") {
        out.push(&s[start..i]);
        start = i + " AND ".len();
    }
    out.push(&s[start..]);
    out
}

/// One identifier at the start of `s` (bare or double-quoted), and the rest.
fn ident(s: &str) -> Option<(String, &str)> {
    if let Some(rest) = s.strip_prefix('"') {
        let mut name = String::new();
        let mut chars = rest.char_indices();
        while let Some((i, c)) = chars.next() {
            if c == '"' {
                if rest[i + 1..].starts_with('"') {
                    name.push('"');
                    chars.next();
                } else {
                    return Some((name, &rest[i + 1..]));
                }
            } else {
                name.push(c);
            }
        }
        return None;
    }
    let end = s
        .char_indices()
        .find(|(_, c)| !(c.is_alphanumeric() || *c == '_' || *c == '$'))
        .map_or(s.len(), |(i, _)| i);
    let name = &s[..end];
    (!name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit() || c == '$'))
        .then(|| (name.to_owned(), &s[end..]))
}

/// `alias.column`, and nothing else.
fn colref(s: &str) -> Option<ColRef> {
    let (alias, rest) = ident(s)?;
    let (column, rest) = ident(rest.strip_prefix('.')?)?;
    rest.is_empty().then_some(ColRef { alias, column })
}

/// `ANY ($k)` or `$k`: the key part `k`.
fn param(s: &str) -> Option<usize> {
    let s = s.strip_prefix("ANY ").map_or(s, strip);
    let k: usize = s.strip_prefix('$')?.parse().ok()?;
    (k > 0).then_some(k)
}

/// Aliases a condition mentions (`alias.` before a column).
fn mentioned(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        if let Some((name, after)) = ident(rest)
            && after.starts_with('.')
        {
            if !out.contains(&name) {
                out.push(name);
            }
            rest = after;
            continue;
        }
        let mut chars = rest.chars();
        chars.next();
        rest = chars.as_str();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(alias: &str, column: &str) -> ColRef {
        ColRef {
            alias: alias.into(),
            column: column.into(),
        }
    }

    #[test]
    fn a_join_plan_gives_its_scans_equalities_key_and_output() {
        let plan: Value = serde_json::from_str(
            r#"[{"Plan": {"Node Type": "Aggregate",
                "Output": ["a.id", "(COALESCE(sum((s.seats * p.price)), '0'::numeric))::bigint"],
                "Plans": [{"Node Type": "Hash Join", "Hash Cond": "(s.account_id = a.id)",
                  "Plans": [
                    {"Node Type": "Seq Scan", "Relation Name": "subscriptions", "Schema": "public", "Alias": "s"},
                    {"Node Type": "Bitmap Heap Scan", "Relation Name": "accounts", "Schema": "public", "Alias": "a",
                     "Recheck Cond": "(a.id = ANY ($1))"},
                    {"Node Type": "Index Scan", "Relation Name": "plans", "Schema": "public", "Alias": "p",
                     "Index Cond": "(p.id = s.plan_id)", "Filter": "((p.code)::text = (s.\"Code\")::text)"}]}]}}]"#,
        )
        .unwrap();
        let s = shape(&plan);
        assert_eq!(
            s.scans,
            [
                ("s".into(), "public".into(), "subscriptions".into()),
                ("a".into(), "public".into(), "accounts".into()),
                ("p".into(), "public".into(), "plans".into())
            ]
        );
        assert_eq!(
            s.equalities,
            [
                (c("s", "account_id"), c("a", "id")),
                (c("p", "code"), c("s", "Code")),
                (c("p", "id"), c("s", "plan_id"))
            ]
        );
        assert_eq!(s.params, [(c("a", "id"), 1)]);
        assert_eq!(s.output, [Some(c("a", "id")), None]);
        assert!(s.other.is_empty(), "{:?}", s.other);
    }

    #[test]
    fn and_terms_split_and_the_rest_is_kept_for_messages() {
        let mut s = Shape::default();
        conditions(
            "((e.at > a.created) AND (e.kind = 'x'::text) AND (a.id = $2) AND (x.\"A b\" = y.c))",
            &mut s,
        );
        assert_eq!(s.params, [(c("a", "id"), 2)]);
        assert_eq!(s.equalities, [(c("x", "A b"), c("y", "c"))]);
        assert_eq!(
            s.other,
            [
                (
                    vec!["e".to_string(), "a".to_string()],
                    "e.at > a.created".to_string()
                ),
                (vec!["e".to_string()], "e.kind = 'x'::text".to_string())
            ]
        );
    }

    #[test]
    fn a_single_table_plan_qualifies_its_bare_output() {
        let plan: Value = serde_json::from_str(
            r#"[{"Plan": {"Node Type": "Aggregate", "Output": ["cid", "count(*)"],
                "Group Key": ["items.cid"],
                "Plans": [{"Node Type": "Seq Scan", "Relation Name": "items", "Schema": "public",
                  "Alias": "items", "Output": ["id", "cid", "v"], "Filter": "(items.cid = ANY ($1))"}]}}]"#,
        )
        .unwrap();
        let s = shape(&plan);
        assert_eq!(s.output, [Some(c("items", "cid")), None]);
        assert_eq!(s.params, [(c("items", "cid"), 1)]);
        assert_eq!(
            s.sites,
            [ParamSite {
                part: 1,
                node: "Seq Scan".into(),
                on_scan: true
            }]
        );
        assert!(s.filtered_above().is_none());
        assert_eq!(grouped_by(&plan), Some(vec![0]));
    }

    #[test]
    fn a_filter_left_above_a_subquery_is_found() {
        let plan: Value = serde_json::from_str(
            r#"[{"Plan": {"Node Type": "Subquery Scan", "Alias": "freshen_q",
                "Output": ["freshen_q.cid", "freshen_q.v"], "Filter": "(freshen_q.cid = ANY ($1))",
                "Plans": [{"Node Type": "Unique", "Output": ["items.cid", "items.v"],
                  "Plans": [{"Node Type": "Seq Scan", "Relation Name": "items", "Schema": "public",
                    "Alias": "items", "Output": ["items.cid", "items.v"]}]}]}}]"#,
        )
        .unwrap();
        let s = shape(&plan);
        let above = s.filtered_above().expect("above the scan");
        assert_eq!((above.part, above.node.as_str()), (1, "Subquery Scan"));
        assert_eq!(grouped_by(&plan), None);
    }

    #[test]
    fn grouping_keys_map_to_output_positions() {
        let plan: Value = serde_json::from_str(
            r#"[{"Plan": {"Node Type": "Sort", "Plans": [{"Node Type": "Aggregate",
                "Output": ["count(*)", "a.region", "a.id"], "Group Key": ["a.id", "a.region"],
                "Plans": [{"Node Type": "Hash Join", "Plans": [
                  {"Node Type": "Seq Scan", "Relation Name": "accounts", "Schema": "public", "Alias": "a"},
                  {"Node Type": "Seq Scan", "Relation Name": "subs", "Schema": "public", "Alias": "s"}]}]}]}}]"#,
        )
        .unwrap();
        assert_eq!(grouped_by(&plan), Some(vec![2, 1]));
        let by_expression: Value = serde_json::from_str(
            r#"[{"Plan": {"Node Type": "Aggregate", "Output": ["(a.id + 1)", "count(*)"],
                "Group Key": ["a.id"], "Plans": []}}]"#,
        )
        .unwrap();
        assert_eq!(grouped_by(&by_expression), None);
    }

    #[test]
    fn odd_text_is_never_a_panic() {
        let mut s = Shape::default();
        for t in [
            "$",
            "$$1",
            "'$1'",
            "",
            "(",
            ")",
            "((",
            "a.",
            ".b",
            "\"",
            "= ANY ($0)",
            "x = ANY (",
            "$",
            "a.b = $x",
        ] {
            conditions(t, &mut s);
        }
        assert!(s.params.is_empty() && s.equalities.is_empty(), "{s:?}");
    }
}
