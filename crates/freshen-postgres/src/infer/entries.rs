//! From a query's plan ([`Shape`]) and the catalog's foreign keys to the watch entries
//! a careful person would write: pure, every input explicit.
//!
//! The equalities of the plan put columns into classes (`s.account_id = a.id`,
//! `a.id = ANY ($1)`: one class, the key's). A scan *carries* the key when, for each
//! key part, one of its columns is in that part's class: its table is watched with
//! those columns. Any other scan is linked to one that carries the key by the shortest
//! chain of equalities (an edge backed by a foreign key is tried first): its changes
//! reach the view's keys through that chain, which becomes the fan-out statement. A
//! table read only where the plan does not show it (a non-inlined function) is
//! mapped by a foreign key to or from a table that carries the key. Anything else is
//! refused, naming the table and the condition that could not be followed.

use std::collections::{BTreeMap, VecDeque};

use super::plan::{ColRef, Shape};
use crate::TableName;
use crate::quote::quote_ident;

/// A foreign key: `child (columns) REFERENCES parent (referenced)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignKey {
    /// The referencing table.
    pub child: TableName,
    /// Its columns.
    pub columns: Vec<String>,
    /// The referenced table.
    pub parent: TableName,
    /// Its columns, in the same order.
    pub referenced: Vec<String>,
}

/// One inferred watch entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The table.
    pub table: TableName,
    /// The changed row's columns: the view's key, or with `keys` that statement's
    /// `$1..$n`.
    pub key: Vec<String>,
    /// The fan-out statement, for a table that does not carry the key.
    pub keys: Option<String>,
    /// The table and columns the fan-out statement looks its rows up by (an index
    /// there keeps it from reading the whole table).
    pub lookup: Option<(TableName, Vec<String>)>,
}

/// What the inference is asked.
#[derive(Debug, Clone, Copy)]
pub struct Question<'a> {
    /// The view's name, for messages.
    pub view: &'a str,
    /// The query's plan, read.
    pub shape: &'a Shape,
    /// Each scan's alias and the table a user watches for it (its partition root).
    pub scans: &'a [(String, TableName)],
    /// Key parts (`$1..$n`).
    pub arity: usize,
    /// The query's output column names, in order.
    pub columns: &'a [String],
    /// The view's key as the query returns it, when it is known already (a plain
    /// query's batch filter is written on the target's key columns); empty: found from
    /// the plan's output.
    pub key: &'a [String],
    /// The tables to find entries for (read, neither watched nor static).
    pub uncovered: &'a [TableName],
    /// Foreign keys between the tables the query reads.
    pub foreign_keys: &'a [ForeignKey],
}

/// The inference's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The view's key, as the query names its output columns (`$1..$n` order).
    pub key: Vec<String>,
    /// Entries: tables that carry the key, then fan-outs.
    pub entries: Vec<Entry>,
}

/// Column classes: a union-find over the columns the plan's equalities mention.
struct Classes {
    cols: Vec<ColRef>,
    parent: Vec<usize>,
}

impl Classes {
    fn index(&mut self, c: &ColRef) -> usize {
        if let Some(i) = self.cols.iter().position(|x| x == c) {
            return i;
        }
        self.cols.push(c.clone());
        self.parent.push(self.parent.len());
        self.parent.len() - 1
    }

    fn find(&mut self, mut i: usize) -> usize {
        while self.parent[i] != i {
            self.parent[i] = self.parent[self.parent[i]];
            i = self.parent[i];
        }
        i
    }

    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.parent[b] = a;
        }
    }

    fn class_of(&mut self, c: &ColRef) -> Option<usize> {
        let i = self.cols.iter().position(|x| x == c)?;
        Some(self.find(i))
    }
}

/// The watch entries for `q.uncovered`, or every reason some cannot be found.
pub fn infer(q: &Question<'_>) -> Result<Answer, Vec<String>> {
    let view = q.view;
    let mut classes = Classes {
        cols: Vec::new(),
        parent: Vec::new(),
    };
    for (a, b) in &q.shape.equalities {
        let (a, b) = (classes.index(a), classes.index(b));
        classes.union(a, b);
    }
    let mut problems = Vec::new();
    // The class of each key part.
    let mut key_class = Vec::new();
    for k in 1..=q.arity {
        let mut class = None;
        for (c, _) in q.shape.params.iter().filter(|(_, p)| *p == k) {
            let i = classes.index(c);
            match class {
                None => class = Some(i),
                Some(first) => classes.union(first, i),
            }
        }
        match class {
            Some(i) => key_class.push(classes.find(i)),
            None => problems.push(format!(
                "view `{view}`: the query never compares a column with ${k} (`column = ANY(${k})`), so freshen cannot tell which column is the key's part {k}: write the condition that way, or write the view's `watch` entries by hand"
            )),
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let key_classes: Vec<usize> = key_class.iter().map(|&i| classes.find(i)).collect();
    let describe_key = {
        let parts: Vec<String> = (1..=q.arity)
            .map(|k| {
                let cols: Vec<String> = q
                    .shape
                    .params
                    .iter()
                    .filter(|(_, p)| *p == k)
                    .map(|(c, _)| format!("{}.{}", c.alias, c.column))
                    .collect();
                format!("${k} = {}", cols.join(" = "))
            })
            .collect();
        parts.join(", ")
    };

    // The view's key as the query returns it.
    let mut key = q.key.to_vec();
    for (k, class) in key_classes.iter().enumerate().filter(|_| q.key.is_empty()) {
        let found = q.shape.output.iter().enumerate().find(|(_, o)| {
            o.as_ref()
                .is_some_and(|c| classes.class_of(c) == Some(*class))
        });
        match found.and_then(|(i, _)| q.columns.get(i)) {
            Some(name) => key.push(name.clone()),
            None => problems.push(format!(
                "view `{view}`: the query does not return the key's part {} ({describe_key}) as a column of its own: return it (e.g. `SELECT a.id AS account_id, …`), named as the target's key column",
                k + 1
            )),
        }
    }

    // The columns of an alias that carry the key, in key order.
    let table_of = |alias: &str| {
        q.scans
            .iter()
            .find(|(a, _)| a == alias)
            .map(|(_, t)| t.clone())
    };
    let aliases: Vec<String> = q.scans.iter().map(|(a, _)| a.clone()).collect();
    let mut carried: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for alias in &aliases {
        let mut cols = Vec::new();
        for class in &key_classes {
            let mut best: Option<String> = None;
            for i in 0..classes.cols.len() {
                let c = classes.cols[i].clone();
                if c.alias == *alias
                    && classes.find(i) == *class
                    && best.as_ref().is_none_or(|b| c.column < *b)
                {
                    best = Some(c.column);
                }
            }
            match best {
                Some(b) => cols.push(b),
                None => break,
            }
        }
        if cols.len() == q.arity {
            carried.insert(alias.clone(), cols);
        }
    }

    if carried.is_empty() {
        problems.push(format!(
            "view `{view}`: no table the query reads carries every part of the key ({describe_key}): freshen maps a change to the view's keys through a table that holds the whole key (directly, or by a `keys` statement from a table joined to it). Write the view's `watch` entries by hand: each table with a `keys` statement returning the whole key for a changed row (e.g. {{ table = \"…\", key = [\"…\"], keys = \"SELECT … FROM … WHERE … = $1\" }}, reading a part the row carries itself from its own parameter, so that the row's old and new values are both mapped)"
        ));
        return Err(problems);
    }

    // Edges between aliases: columns in one class, one pair per column of the first.
    let mut edges: Edges = BTreeMap::new();
    for i in 0..classes.cols.len() {
        for j in 0..classes.cols.len() {
            let (a, b) = (classes.cols[i].clone(), classes.cols[j].clone());
            if a.alias == b.alias || classes.find(i) != classes.find(j) {
                continue;
            }
            let e = edges.entry((a.alias.clone(), b.alias.clone())).or_default();
            if !e.iter().any(|(x, _)| *x == a.column) {
                e.push((a.column, b.column));
            }
        }
    }
    for e in edges.values_mut() {
        e.sort();
    }
    let fk_backed = |x: &str, y: &str, cols: &[(String, String)]| {
        let (Some(tx), Some(ty)) = (table_of(x), table_of(y)) else {
            return false;
        };
        q.foreign_keys.iter().any(|fk| {
            let pairs: Vec<(&String, &String)> = fk.columns.iter().zip(&fk.referenced).collect();
            let matches = |child: &TableName, parent: &TableName, flip: bool| {
                fk.child == *child
                    && fk.parent == *parent
                    && pairs.iter().all(|(c, r)| {
                        cols.iter().any(|(a, b)| {
                            if flip {
                                (b, a) == (*c, *r)
                            } else {
                                (a, b) == (*c, *r)
                            }
                        })
                    })
            };
            matches(&tx, &ty, false) || matches(&ty, &tx, true)
        })
    };

    let mut direct: Vec<Entry> = Vec::new();
    let mut fanouts: Vec<Entry> = Vec::new();
    for table in q.uncovered {
        let mine: Vec<&String> = q
            .scans
            .iter()
            .filter(|(_, t)| t == table)
            .map(|(a, _)| a)
            .collect();
        if mine.is_empty() {
            match by_foreign_key(q, table, &carried) {
                Some(e) => push(&mut direct, &mut fanouts, e),
                None => problems.push(format!(
                    "view `{view}`: reads {table} where its plan does not show how (inside a function that is not inlined), and no foreign key links it to a table that carries the view's key ({describe_key}): write its watch entry by hand ({{ table = \"{table}\", key = [\"…\"], keys = \"SELECT <the view's key> FROM … WHERE … = $1\" }}), or list it in static = [\"{table}\"] if its changes may be ignored"
                )),
            }
            continue;
        }
        for alias in mine {
            if let Some(cols) = carried.get(alias) {
                let e = Entry {
                    table: table.clone(),
                    key: cols.clone(),
                    keys: None,
                    lookup: None,
                };
                if let Some(other) = direct.iter().find(|d| d.table == *table && d.key != e.key) {
                    problems.push(format!(
                        "view `{view}`: reads {table} more than once, carrying the key in different columns ({} and {}): freshen keeps one key per watched table; write its watch entries by hand",
                        other.key.join(", "),
                        e.key.join(", ")
                    ));
                    continue;
                }
                push(&mut direct, &mut fanouts, e);
                continue;
            }
            match path(alias, &aliases, &carried, &edges, &fk_backed) {
                Some(p) => {
                    let e = fanout(table, &p, &edges, &carried, &table_of);
                    push(&mut direct, &mut fanouts, e);
                }
                None => {
                    let conds: Vec<&str> = q
                        .shape
                        .other
                        .iter()
                        .filter(|(a, _)| a.contains(alias))
                        .map(|(_, t)| t.as_str())
                        .collect();
                    let joins = if conds.is_empty() {
                        "it is joined with no condition (a cross join, or a subquery's aggregate)"
                            .to_string()
                    } else {
                        format!(
                            "its join conditions are not equalities freshen can follow: {}",
                            conds.join("; ")
                        )
                    };
                    problems.push(format!(
                        "view `{view}`: reads {table} (as `{alias}`), but no chain of column equalities links it to the view's key ({describe_key}): {joins}. freshen cannot tell which keys a change to it affects. Write its watch entry by hand ({{ table = \"{table}\", key = [\"…\"], keys = \"SELECT <the view's key> FROM … WHERE … = $1\" }}), or list it in static = [\"{table}\"] if its changes may be ignored"
                    ));
                }
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    // The first entry that carries the key names it when the entries are pasted into
    // the file (ViewSpec::key): one whose columns are named as the query's key leads.
    direct.sort_by_key(|e| e.key != key);
    direct.extend(fanouts);
    Ok(Answer {
        key,
        entries: direct,
    })
}

fn push(direct: &mut Vec<Entry>, fanouts: &mut Vec<Entry>, e: Entry) {
    let list = if e.keys.is_none() { direct } else { fanouts };
    if !list.contains(&e) {
        list.push(e);
    }
}

/// Column pairs joining two aliases, keyed by (from, to).
type Edges = BTreeMap<(String, String), Vec<(String, String)>>;

/// Whether the columns joining two aliases follow a foreign key between their tables.
type FkBacked<'a> = &'a dyn Fn(&str, &str, &[(String, String)]) -> bool;

/// The shortest chain of aliases from `from` to one that carries the key (edges
/// backed by a foreign key tried first), `from` included.
fn path(
    from: &str,
    aliases: &[String],
    carried: &BTreeMap<String, Vec<String>>,
    edges: &Edges,
    fk_backed: FkBacked<'_>,
) -> Option<Vec<String>> {
    let mut before: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = VecDeque::from([from.to_owned()]);
    let mut seen = vec![from.to_owned()];
    while let Some(x) = queue.pop_front() {
        if carried.contains_key(&x) {
            let mut p = vec![x.clone()];
            let mut at = x;
            while let Some(b) = before.get(&at) {
                p.push(b.clone());
                at = b.clone();
            }
            p.reverse();
            return Some(p);
        }
        let mut next: Vec<(bool, &String)> = aliases
            .iter()
            .filter(|y| !seen.contains(y))
            .filter_map(|y| {
                let cols = edges.get(&(x.clone(), y.clone()))?;
                Some((!fk_backed(&x, y, cols), y))
            })
            .collect();
        next.sort();
        for (_, y) in next {
            seen.push(y.clone());
            before.insert(y.clone(), x.clone());
            queue.push_back(y.clone());
        }
    }
    None
}

/// The fan-out entry for `table` along `p` (its own alias first, one that carries the
/// key last): its rows' columns on the first edge are bound to the statement, which
/// walks the chain and returns the key.
fn fanout(
    table: &TableName,
    p: &[String],
    edges: &Edges,
    carried: &BTreeMap<String, Vec<String>>,
    table_of: &dyn Fn(&str) -> Option<TableName>,
) -> Entry {
    let first = &edges[&(p[0].clone(), p[1].clone())];
    let key: Vec<String> = first.iter().map(|(a, _)| a.clone()).collect();
    let last = &p[p.len() - 1];
    let returned = &carried[last];
    let sql = if p.len() == 2 {
        let filter: Vec<String> = first
            .iter()
            .enumerate()
            .map(|(i, (_, b))| format!("{} = ${}", ident(b), i + 1))
            .collect();
        format!(
            "SELECT {} FROM {} WHERE {}",
            returned
                .iter()
                .map(|c| ident(c))
                .collect::<Vec<_>>()
                .join(", "),
            qualified(&table_of(last).unwrap_or_else(|| table.clone())),
            filter.join(" AND ")
        )
    } else {
        let mut from = String::new();
        for (i, alias) in p[1..].iter().enumerate() {
            let t = qualified(&table_of(alias).unwrap_or_else(|| table.clone()));
            if i == 0 {
                from.push_str(&format!("{t} {}", ident(alias)));
            } else {
                let prev = &p[i];
                let on: Vec<String> = edges[&(prev.clone(), alias.clone())]
                    .iter()
                    .map(|(a, b)| {
                        format!(
                            "{}.{} = {}.{}",
                            ident(prev),
                            ident(a),
                            ident(alias),
                            ident(b)
                        )
                    })
                    .collect();
                from.push_str(&format!(
                    " JOIN {t} {} ON {}",
                    ident(alias),
                    on.join(" AND ")
                ));
            }
        }
        let filter: Vec<String> = first
            .iter()
            .enumerate()
            .map(|(i, (_, b))| format!("{}.{} = ${}", ident(&p[1]), ident(b), i + 1))
            .collect();
        format!(
            "SELECT {} FROM {from} WHERE {}",
            returned
                .iter()
                .map(|c| format!("{}.{}", ident(last), ident(c)))
                .collect::<Vec<_>>()
                .join(", "),
            filter.join(" AND ")
        )
    };
    let lookup_table = table_of(&p[1]).unwrap_or_else(|| table.clone());
    Entry {
        table: table.clone(),
        key,
        keys: Some(sql),
        lookup: Some((lookup_table, first.iter().map(|(_, b)| b.clone()).collect())),
    }
}

/// For a table the plan does not show: a foreign key from it to a table that carries
/// the key on exactly the referenced columns (it carries the key too), or from such a
/// table to it (a fan-out through the referencing table).
fn by_foreign_key(
    q: &Question<'_>,
    table: &TableName,
    carried: &BTreeMap<String, Vec<String>>,
) -> Option<Entry> {
    let carriers: Vec<(TableName, &Vec<String>)> = q
        .scans
        .iter()
        .filter_map(|(a, t)| carried.get(a).map(|c| (t.clone(), c)))
        .collect();
    for fk in q.foreign_keys {
        if fk.child == *table
            && let Some((_, cols)) = carriers.iter().find(|(t, _)| *t == fk.parent)
        {
            let mapped: Option<Vec<String>> = cols
                .iter()
                .map(|c| {
                    let i = fk.referenced.iter().position(|r| r == c)?;
                    Some(fk.columns[i].clone())
                })
                .collect();
            if let Some(key) = mapped {
                return Some(Entry {
                    table: table.clone(),
                    key,
                    keys: None,
                    lookup: None,
                });
            }
        }
        if fk.parent == *table
            && let Some((child, cols)) = carriers.iter().find(|(t, _)| *t == fk.child)
        {
            let filter: Vec<String> = fk
                .columns
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{} = ${}", ident(c), i + 1))
                .collect();
            return Some(Entry {
                table: table.clone(),
                key: fk.referenced.clone(),
                keys: Some(format!(
                    "SELECT {} FROM {} WHERE {}",
                    cols.iter().map(|c| ident(c)).collect::<Vec<_>>().join(", "),
                    qualified(child),
                    filter.join(" AND ")
                )),
                lookup: Some((child.clone(), fk.columns.clone())),
            });
        }
    }
    None
}

/// An identifier as a person writes it: bare when that reads the same, else quoted.
fn ident(s: &str) -> String {
    let bare = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if bare { s.to_owned() } else { quote_ident(s) }
}

fn qualified(t: &TableName) -> String {
    format!("{}.{}", ident(&t.schema), ident(&t.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(a: &str, col: &str) -> ColRef {
        ColRef {
            alias: a.into(),
            column: col.into(),
        }
    }

    fn t(name: &str) -> TableName {
        TableName::new("public", name)
    }

    fn fk(child: &str, col: &str, parent: &str, refd: &str) -> ForeignKey {
        ForeignKey {
            child: t(child),
            columns: vec![col.into()],
            parent: t(parent),
            referenced: vec![refd.into()],
        }
    }

    /// The entries without their lookups (asserted on their own).
    fn plain(a: &Answer) -> Vec<Entry> {
        a.entries
            .iter()
            .map(|e| Entry {
                lookup: None,
                ..e.clone()
            })
            .collect()
    }

    fn ask(
        shape: &Shape,
        scans: &[(&str, &str)],
        uncovered: &[&str],
        fks: &[ForeignKey],
    ) -> Result<Answer, Vec<String>> {
        let scans: Vec<(String, TableName)> =
            scans.iter().map(|(a, n)| (a.to_string(), t(n))).collect();
        let uncovered: Vec<TableName> = uncovered.iter().map(|n| t(n)).collect();
        let columns = vec!["account_id".to_string(), "mrr".to_string()];
        infer(&Question {
            view: "v",
            shape,
            scans: &scans,
            arity: 1,
            columns: &columns,
            key: &[],
            uncovered: &uncovered,
            foreign_keys: fks,
        })
    }

    fn mrr() -> Shape {
        Shape {
            equalities: vec![
                (c("s", "account_id"), c("a", "id")),
                (c("p", "id"), c("s", "plan_id")),
            ],
            params: vec![(c("a", "id"), 1)],
            output: vec![Some(c("a", "id")), None],
            ..Shape::default()
        }
    }

    #[test]
    fn the_issue_s_view_gets_the_entries_a_careful_person_writes() {
        let a = ask(
            &mrr(),
            &[("s", "subscriptions"), ("a", "accounts"), ("p", "plans")],
            &["accounts", "plans", "subscriptions"],
            &[fk("subscriptions", "plan_id", "plans", "id")],
        )
        .unwrap();
        assert_eq!(a.key, ["account_id"]);
        assert_eq!(
            a.entries[2].lookup,
            Some((t("subscriptions"), vec!["plan_id".to_string()]))
        );
        assert_eq!(
            plain(&a),
            [
                Entry {
                    table: t("subscriptions"),
                    key: vec!["account_id".into()],
                    keys: None,
                    lookup: None
                },
                Entry {
                    table: t("accounts"),
                    key: vec!["id".into()],
                    keys: None,
                    lookup: None
                },
                Entry {
                    table: t("plans"),
                    key: vec!["id".into()],
                    keys: Some(
                        "SELECT account_id FROM public.subscriptions WHERE plan_id = $1".into()
                    ),
                    lookup: None
                },
            ]
        );
    }

    #[test]
    fn explicit_entries_win_and_only_the_rest_is_inferred() {
        let a = ask(
            &mrr(),
            &[("s", "subscriptions"), ("a", "accounts"), ("p", "plans")],
            &["plans"],
            &[],
        )
        .unwrap();
        assert_eq!(a.entries.len(), 1);
        assert_eq!(a.entries[0].table, t("plans"));
    }

    #[test]
    fn a_longer_chain_joins_through_the_middle_tables() {
        // invoice_lines l -> invoices i -> accounts a (key).
        let shape = Shape {
            equalities: vec![
                (c("i", "account_id"), c("a", "id")),
                (c("l", "invoice_id"), c("i", "id")),
                (c("l", "product_id"), c("pr", "id")),
            ],
            params: vec![(c("a", "id"), 1)],
            output: vec![Some(c("a", "id"))],
            ..Shape::default()
        };
        let a = ask(
            &shape,
            &[
                ("a", "accounts"),
                ("i", "invoices"),
                ("l", "lines"),
                ("pr", "products"),
            ],
            &["products"],
            &[],
        )
        .unwrap();
        assert_eq!(
            plain(&a),
            [Entry {
                table: t("products"),
                key: vec!["id".into()],
                keys: Some(
                    "SELECT i.account_id FROM public.lines l JOIN public.invoices i ON l.invoice_id = i.id WHERE l.product_id = $1"
                        .into()
                ),
                lookup: None
            }]
        );
    }

    #[test]
    fn a_table_read_twice_is_watched_directly_and_through_its_join() {
        // accounts a LEFT JOIN accounts r ON r.id = a.referred_by WHERE a.id = ANY($1)
        let shape = Shape {
            equalities: vec![(c("r", "id"), c("a", "referred_by"))],
            params: vec![(c("a", "id"), 1)],
            output: vec![Some(c("a", "id"))],
            ..Shape::default()
        };
        let a = ask(
            &shape,
            &[("r", "accounts"), ("a", "accounts")],
            &["accounts"],
            &[],
        )
        .unwrap();
        assert_eq!(
            plain(&a),
            [
                Entry {
                    table: t("accounts"),
                    key: vec!["id".into()],
                    keys: None,
                    lookup: None
                },
                Entry {
                    table: t("accounts"),
                    key: vec!["id".into()],
                    keys: Some("SELECT id FROM public.accounts WHERE referred_by = $1".into()),
                    lookup: None
                },
            ]
        );
    }

    #[test]
    fn a_cross_join_is_refused_naming_the_table_and_what_to_write() {
        let shape = Shape {
            params: vec![(c("a", "id"), 1)],
            output: vec![Some(c("a", "id"))],
            other: vec![(vec!["e".into(), "a".into()], "e.at > a.created".into())],
            ..Shape::default()
        };
        let e = ask(
            &shape,
            &[("a", "accounts"), ("e", "events")],
            &["accounts", "events"],
            &[],
        )
        .unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("reads public.events (as `e`)"), "{e:?}");
        assert!(e[0].contains("e.at > a.created"), "{e:?}");
        assert!(e[0].contains("static = [\"public.events\"]"), "{e:?}");
        assert!(e[0].contains("$1 = a.id"), "{e:?}");
    }

    #[test]
    fn a_key_the_query_does_not_return_or_compare_is_refused() {
        let shape = Shape {
            params: vec![(c("a", "id"), 1)],
            output: vec![None],
            ..Shape::default()
        };
        let e = ask(&shape, &[("a", "accounts")], &["accounts"], &[]).unwrap_err();
        assert!(e[0].contains("does not return the key"), "{e:?}");
        let e = ask(&Shape::default(), &[("a", "accounts")], &["accounts"], &[]).unwrap_err();
        assert!(e[0].contains("never compares a column with $1"), "{e:?}");
    }

    #[test]
    fn a_table_read_inside_a_function_is_mapped_by_foreign_keys() {
        let a = ask(
            &mrr(),
            &[("s", "subscriptions"), ("a", "accounts"), ("p", "plans")],
            &["invoices", "refunds"],
            &[
                fk("invoices", "account_id", "accounts", "id"),
                fk("subscriptions", "refund_id", "refunds", "id"),
            ],
        )
        .unwrap();
        assert_eq!(
            plain(&a),
            [
                Entry {
                    table: t("invoices"),
                    key: vec!["account_id".into()],
                    keys: None,
                    lookup: None
                },
                Entry {
                    table: t("refunds"),
                    key: vec!["id".into()],
                    keys: Some(
                        "SELECT account_id FROM public.subscriptions WHERE refund_id = $1".into()
                    ),
                    lookup: None
                },
            ]
        );
        let e = ask(&mrr(), &[("a", "accounts")], &["audit"], &[]).unwrap_err();
        assert!(
            e[0].contains("reads public.audit where its plan does not show how"),
            "{e:?}"
        );
    }
}
