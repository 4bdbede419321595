//! The cheapest replica identity that carries what a table's views need, for
//! `freshen check`.
//!
//! A view keyed by columns of a watched table must learn, for an UPDATE that changes
//! them and for a DELETE, the key the row had: only then is the scope the row left
//! rebuilt. What the old row carries is the table's `REPLICA IDENTITY`, and each costs
//! WAL on the source and work in the walsender that decodes it (`cargo run --release -p
//! freshen-bench -- replica-identity`, BENCHMARKS.md):
//!
//! - `DEFAULT` logs the old primary key, only when it changes (and on DELETE). Enough
//!   when the view's key is part of the primary key, or when the key is declared fixed
//!   (`fixed_key = true`: no UPDATE changes it and rows are not deleted);
//! - `USING INDEX` logs the old columns of a unique index, only when they change (and on
//!   DELETE): a unique index over (primary key…, key column) carries the old key for
//!   the cost of one more index. It needs every column `NOT NULL` and a plain
//!   (non-partial, non-expression, immediate) unique index;
//! - `FULL` logs the whole old row on every UPDATE and DELETE: what is left without a
//!   primary key or with a nullable key column.
//!
//! [`recommend`] decides (pure); [`PgAdmin::identity_facts`](crate::PgAdmin::identity_facts)
//! reads what it decides from.

use freshen::plug::{Finding, Plan, Watched};

use crate::{PgError, ReplicaIdentity, TableIdentity, TableName, quote_ident};

/// What FULL costs over DEFAULT on the update workload of `freshen-bench
/// replica-identity` (narrow rows, 80 % value updates, 20 % key moves): quoted by
/// `check` when a table's FULL is more than its views need.
pub const FULL_COST: &str = "measured by freshen-bench replica-identity on one-row UPDATEs \
     (80 % value updates, 20 % key moves): FULL logged 26 % more WAL per transaction than \
     DEFAULT and cost the walsender 1.28x its CPU per row; USING INDEX (id, device) 12 % and \
     1.03x";

/// A unique index of a table, as a candidate replica identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniqueIndex {
    /// The index's name (in the table's schema).
    pub name: String,
    /// Its key columns, in order (INCLUDE columns left out).
    pub columns: Vec<String>,
    /// Whether PostgreSQL accepts it for `REPLICA IDENTITY USING INDEX`: unique,
    /// immediate, valid, not partial, no expressions, every column `NOT NULL`.
    pub usable: bool,
}

/// What the catalog says of a table, for choosing its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityFacts {
    /// The current identity, its columns and the primary key.
    pub current: TableIdentity,
    /// The table's unique indexes (the primary key's included).
    pub unique_indexes: Vec<UniqueIndex>,
    /// Columns declared `NOT NULL`.
    pub not_null: Vec<String>,
}

/// What one view reads from a table's changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewNeed {
    /// The view.
    pub view: String,
    /// The columns its key is read from.
    pub key: Vec<String>,
    /// Declared: no UPDATE changes the key columns and rows are not deleted.
    pub fixed_key: bool,
}

/// An identity to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// `REPLICA IDENTITY DEFAULT` (the primary key).
    Default,
    /// `REPLICA IDENTITY USING INDEX index`.
    UsingIndex {
        /// The index's name.
        index: String,
        /// Its columns.
        columns: Vec<String>,
        /// The statement creating it, when it does not exist yet.
        create: Option<String>,
    },
    /// `REPLICA IDENTITY FULL`.
    Full,
}

impl Choice {
    /// Cheapest first: what each logs of an UPDATE that keeps the key is nothing, nothing
    /// and the whole row.
    fn cost(&self) -> u8 {
        match self {
            Choice::Default => 0,
            Choice::UsingIndex { .. } => 1,
            Choice::Full => 2,
        }
    }
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Choice::Default => f.write_str("DEFAULT"),
            Choice::UsingIndex { columns, .. } => {
                write!(f, "USING INDEX on ({})", columns.join(", "))
            }
            Choice::Full => f.write_str("FULL"),
        }
    }
}

/// How the current identity compares with the cheapest sufficient one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It carries what the views need, at the cheapest cost.
    Fits,
    /// It does not carry the old key columns `columns` that views `views` need.
    Missing {
        /// Views that miss the old key.
        views: Vec<String>,
        /// Columns whose old values are not carried.
        columns: Vec<String>,
    },
    /// It carries what is needed, at more cost than [`Recommendation::choice`].
    MoreThanNeeded,
}

/// The answer of [`recommend`] for one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recommendation {
    /// The table.
    pub table: TableName,
    /// Its identity now.
    pub current: ReplicaIdentity,
    /// The cheapest identity that carries what the views need.
    pub choice: Choice,
    /// How the current one compares.
    pub verdict: Verdict,
    /// Why [`choice`](Self::choice) is the cheapest, in a sentence.
    pub reason: String,
    /// What to run to get there (empty when [`Verdict::Fits`]).
    pub statements: Vec<String>,
}

fn covers(have: &[String], want: &[String]) -> bool {
    want.iter().all(|w| have.contains(w))
}

/// Whether `columns` begin with every one of `key` (in any order).
fn leads_with(columns: &[String], key: &[String]) -> bool {
    columns.len() >= key.len() && covers(&columns[..key.len()], key)
}

/// A name for an index on `table` over `columns` within PostgreSQL's 63 bytes (the
/// table's part shortened first).
fn index_name(table: &str, columns: &[String]) -> String {
    const MAX: usize = 63;
    let suffix = format!("_{}_identity", columns.join("_"));
    let fit = |s: &str, room: usize| -> String {
        let mut out = String::new();
        for ch in s.chars() {
            if out.len() + ch.len_utf8() > room {
                break;
            }
            out.push(ch);
        }
        out
    };
    if suffix.len() < MAX {
        format!("{}{suffix}", fit(table, MAX - suffix.len()))
    } else {
        format!(
            "{}_identity",
            fit(&format!("{table}{suffix}"), MAX - "_identity".len())
        )
    }
}

/// The cheapest replica identity for `facts`' table that carries what `needs` ask, and
/// how the current one compares. `whole_rows`: a changefeed publishes this table's rows,
/// and FULL is how it gets every column of an UPDATE (so FULL is not called excess).
pub fn recommend(facts: &IdentityFacts, needs: &[ViewNeed], whole_rows: bool) -> Recommendation {
    let cur = &facts.current;
    let pk = &cur.primary_key;
    // The old columns some view needs: its key, unless the primary key carries it or the
    // key is declared fixed.
    let mut needed: Vec<String> = Vec::new();
    for n in needs {
        if n.fixed_key || (!pk.is_empty() && covers(pk, &n.key)) {
            continue;
        }
        for c in &n.key {
            if !needed.contains(c) {
                needed.push(c.clone());
            }
        }
    }
    let usable = || facts.unique_indexes.iter().filter(|i| i.usable);
    let (choice, reason) = if needed.is_empty() {
        if !pk.is_empty() {
            (
                Choice::Default,
                "no view needs an old key beyond the primary key".to_owned(),
            )
        } else if let Some(i) = usable().min_by_key(|i| i.columns.len()) {
            (
                Choice::UsingIndex {
                    index: i.name.clone(),
                    columns: i.columns.clone(),
                    create: None,
                },
                "no view needs an old key, but UPDATE and DELETE need an identity and the \
                 table has no primary key"
                    .to_owned(),
            )
        } else {
            (
                Choice::Full,
                "the table has no primary key and no unique index usable as identity".to_owned(),
            )
        }
    } else {
        let current_index = (cur.identity == ReplicaIdentity::Index
            && covers(&cur.key_columns, &needed))
        .then(|| {
            usable()
                .find(|i| i.columns == cur.key_columns)
                .map(|i| i.name.clone())
        })
        .flatten();
        // Among the indexes that carry the old key, the narrowest one leading with it: it
        // is also the index a rebuild finds a key's rows through.
        let existing = current_index.or_else(|| {
            usable()
                .filter(|i| covers(&i.columns, &needed))
                .min_by_key(|i| (!leads_with(&i.columns, &needed), i.columns.len()))
                .map(|i| i.name.clone())
        });
        let keys = needed.join(", ");
        if let Some(name) = existing {
            let columns = usable()
                .find(|i| i.name == name)
                .map(|i| i.columns.clone())
                .unwrap_or_default();
            (
                Choice::UsingIndex {
                    index: name,
                    columns,
                    create: None,
                },
                format!("the unique index carries the old {keys} only when it changes"),
            )
        } else if !pk.is_empty() && covers(&facts.not_null, &needed) {
            // The key first, then the primary key: unique because of the primary key, and
            // leading with the key, so the one index is both the identity and the index a
            // rebuild looks a key's rows up by (FULL needs that lookup index besides).
            let mut columns = needed.clone();
            columns.extend(pk.iter().filter(|c| !needed.contains(c)).cloned());
            let index = index_name(&cur.table.name, &columns);
            let create = format!(
                "CREATE UNIQUE INDEX CONCURRENTLY {} ON {} ({});",
                quote_ident(&index),
                cur.table.quoted(),
                columns
                    .iter()
                    .map(|c| quote_ident(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            (
                Choice::UsingIndex {
                    index,
                    columns,
                    create: Some(create),
                },
                format!(
                    "a unique index over {keys} and the primary key carries the old {keys} \
                     only when it changes, and leading with {keys} it is also the index \
                     rebuilds find a key's rows through (no second index on {keys})"
                ),
            )
        } else if pk.is_empty() {
            (
                Choice::Full,
                format!(
                    "the old {keys} is needed and the table has no primary key to index it with"
                ),
            )
        } else {
            let nullable: Vec<&str> = needed
                .iter()
                .filter(|c| !facts.not_null.contains(c))
                .map(String::as_str)
                .collect();
            (
                Choice::Full,
                format!(
                    "the old {keys} is needed and {} may be NULL, which an identity index \
                     does not allow (SET NOT NULL would make USING INDEX possible)",
                    nullable.join(", ")
                ),
            )
        }
    };
    // What the identity must carry now: every key a view reads that is not declared
    // fixed. A key the primary key covers needs nothing more under DEFAULT, but an
    // identity index that leaves it out does not carry it (a DELETE logs the index's
    // columns, not the primary key's).
    let mut wanted: Vec<String> = Vec::new();
    for c in needs.iter().filter(|n| !n.fixed_key).flat_map(|n| &n.key) {
        if !wanted.contains(c) {
            wanted.push(c.clone());
        }
    }
    let carried = match cur.identity {
        ReplicaIdentity::Full => true,
        ReplicaIdentity::Default | ReplicaIdentity::Index => {
            !cur.key_columns.is_empty() && covers(&cur.key_columns, &wanted)
        }
        ReplicaIdentity::Nothing => false,
    };
    let current_cost = match cur.identity {
        ReplicaIdentity::Default => 0,
        ReplicaIdentity::Index => 1,
        ReplicaIdentity::Full | ReplicaIdentity::Nothing => 2,
    };
    let verdict = if !carried {
        let missing: Vec<String> = if cur.key_columns.is_empty() {
            needed.clone()
        } else {
            wanted
                .iter()
                .filter(|c| !cur.key_columns.contains(c))
                .cloned()
                .collect()
        };
        // The views short of an old key: those whose key is missing, else (nothing is
        // carried at all) every view of the table.
        let short: Vec<String> = needs
            .iter()
            .filter(|n| !n.fixed_key && n.key.iter().any(|k| missing.contains(k)))
            .map(|n| n.view.clone())
            .collect();
        Verdict::Missing {
            views: if short.is_empty() {
                needs.iter().map(|n| n.view.clone()).collect()
            } else {
                short
            },
            columns: missing,
        }
    } else if current_cost > choice.cost() && !(whole_rows && cur.identity == ReplicaIdentity::Full)
    {
        Verdict::MoreThanNeeded
    } else {
        Verdict::Fits
    };
    // An index of the name freshen would create, over the same columns, that PostgreSQL
    // cannot use: what a failed `CREATE INDEX CONCURRENTLY` leaves behind (invalid). It
    // is dropped first, or the create would stop on "already exists".
    let leftover = match &choice {
        Choice::UsingIndex {
            index,
            columns,
            create: Some(_),
        } => facts
            .unique_indexes
            .iter()
            .any(|i| i.name == *index && i.columns == *columns && !i.usable),
        _ => false,
    };
    let statements = match (&verdict, &choice) {
        (Verdict::Fits, _) => Vec::new(),
        (_, Choice::Default) => vec![format!(
            "ALTER TABLE {} REPLICA IDENTITY DEFAULT;",
            cur.table.quoted()
        )],
        (_, Choice::UsingIndex { index, create, .. }) => leftover
            .then(|| {
                format!(
                    "DROP INDEX CONCURRENTLY IF EXISTS {}.{};",
                    quote_ident(&cur.table.schema),
                    quote_ident(index)
                )
            })
            .into_iter()
            .chain(create.iter().cloned())
            .chain([format!(
                "ALTER TABLE {} REPLICA IDENTITY USING INDEX {};",
                cur.table.quoted(),
                quote_ident(index)
            )])
            .collect(),
        (_, Choice::Full) => vec![format!(
            "ALTER TABLE {} REPLICA IDENTITY FULL;",
            cur.table.quoted()
        )],
    };
    Recommendation {
        table: cur.table.clone(),
        current: cur.identity,
        choice,
        verdict,
        reason,
        statements,
    }
}

/// A table's unique indexes: name, key columns in order, and whether PostgreSQL accepts
/// it as a replica identity. `$1` schema, `$2` table.
const UNIQUE_INDEXES_SQL: &str = "\
SELECT ic.relname::text, \
       ARRAY(SELECT a.attname::text \
             FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n) \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE k.n <= i.indnkeyatts ORDER BY k.n), \
       i.indimmediate AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL \
         AND NOT EXISTS (SELECT 1 FROM unnest(i.indkey::int2[]) k(attnum) \
                         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                         WHERE NOT a.attnotnull) \
FROM pg_index i \
JOIN pg_class ic ON ic.oid = i.indexrelid \
JOIN pg_class c ON c.oid = i.indrelid \
JOIN pg_namespace n ON n.oid = c.relnamespace \
WHERE n.nspname = $1 AND c.relname = $2 AND i.indisunique \
ORDER BY ic.relname";

/// A table's `NOT NULL` columns. `$1` schema, `$2` table.
const NOT_NULL_SQL: &str = "\
SELECT a.attname::text FROM pg_attribute a \
JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped \
  AND a.attnotnull ORDER BY a.attnum";

impl crate::PgAdmin {
    /// What [`recommend`] decides from, for `table`; an error when it does not exist.
    pub async fn identity_facts(&self, table: &TableName) -> Result<IdentityFacts, PgError> {
        let current = self.replica_identity(table).await?;
        let client = crate::pool::client(self.pool()).await?;
        let indexes = client
            .query(UNIQUE_INDEXES_SQL, &[&table.schema, &table.name])
            .await
            .map_err(|e| PgError::sql("cannot read the table's unique indexes", e))?;
        let not_null = client
            .query(NOT_NULL_SQL, &[&table.schema, &table.name])
            .await
            .map_err(|e| PgError::sql("cannot read the table's columns", e))?;
        Ok(IdentityFacts {
            current,
            unique_indexes: indexes
                .iter()
                .map(|r| UniqueIndex {
                    name: r.get(0),
                    columns: r.get(1),
                    usable: r.get(2),
                })
                .collect(),
            not_null: not_null.iter().map(|r| r.get(0)).collect(),
        })
    }
}

/// `REPLICA IDENTITY DEFAULT (id)`, `… USING INDEX (id, device)`, `… FULL`.
fn describe(current: &TableIdentity) -> String {
    match current.identity {
        ReplicaIdentity::Default | ReplicaIdentity::Index if !current.key_columns.is_empty() => {
            format!(
                "REPLICA IDENTITY {} ({})",
                current.identity,
                current.key_columns.join(", ")
            )
        }
        ReplicaIdentity::Default => "REPLICA IDENTITY DEFAULT without a primary key".to_owned(),
        other => format!("REPLICA IDENTITY {other}"),
    }
}

/// One table's replica identity against what its views need: the cheapest identity
/// that carries it ([`recommend`]) and the words `check` reports it in, `run` warns with
/// and `init` writes into a starting file — one wording, made by [`advise`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableAdvice {
    /// The cheapest identity, how the current one compares, the statements.
    pub recommendation: Recommendation,
    /// What `check` reports (its level, the table, the advice).
    pub finding: Finding,
}

impl TableAdvice {
    /// Whether the identity loses what a view needs: an old key of a DELETE or of an
    /// UPDATE that moves a row to another key (or, under `NOTHING`, every old row). The
    /// statements then fix it.
    pub fn loses_changes(&self) -> bool {
        matches!(self.recommendation.verdict, Verdict::Missing { .. })
    }
}

/// The needs of each table `watched` reads, tables in their first entry's order.
fn needs_by_table(watched: &[Watched]) -> Vec<(TableName, Vec<ViewNeed>)> {
    let mut tables: Vec<(TableName, Vec<ViewNeed>)> = Vec::new();
    for w in watched {
        let table = TableName::new(&w.schema, &w.table);
        let need = ViewNeed {
            view: w.view.clone(),
            key: w.key.clone(),
            fixed_key: w.fixed_key,
        };
        match tables.iter_mut().find(|(t, _)| *t == table) {
            Some((_, needs)) => needs.push(need),
            None => tables.push((table, vec![need])),
        }
    }
    tables
}

/// [`advise`] for each table `watched` reads, from the catalog; a table whose catalog
/// cannot be read is an error finding instead. `whole_rows`: a changefeed publishes the
/// tables' rows.
pub(crate) async fn advise_watched(
    admin: &crate::PgAdmin,
    watched: &[Watched],
    whole_rows: bool,
) -> Vec<Result<TableAdvice, Finding>> {
    let mut out = Vec::new();
    for (table, needs) in needs_by_table(watched) {
        out.push(match admin.identity_facts(&table).await {
            Ok(facts) => Ok(advise(&facts, &needs, whole_rows)),
            Err(e) => Err(Finding::error(CHECK, table.to_string(), e.to_string())),
        });
    }
    out
}

/// One finding per watched table: whether its identity carries the old key columns its
/// views need, and the cheapest one that does.
pub(crate) async fn findings(admin: &crate::PgAdmin, plan: &Plan) -> Vec<Finding> {
    advise_watched(admin, &plan.watched, plan.changefeed)
        .await
        .into_iter()
        .map(|a| a.map_or_else(|error| error, |a| a.finding))
        .collect()
}

const CHECK: &str = "replica_identity";

/// [`recommend`] for one table, put in the words every command uses (pure): `check`'s
/// finding, `run`'s warning and `init`'s note are this text.
pub fn advise(facts: &IdentityFacts, needs: &[ViewNeed], whole_rows: bool) -> TableAdvice {
    let recommendation = recommend(facts, needs, whole_rows);
    TableAdvice {
        finding: finding(facts, needs, &recommendation),
        recommendation,
    }
}

/// The finding for one table: `r` ([`recommend`]'s answer) put in words.
fn finding(facts: &IdentityFacts, needs: &[ViewNeed], r: &Recommendation) -> Finding {
    let subject = r.table.to_string();
    let current = describe(&facts.current);
    let all_views = needs
        .iter()
        .map(|n| n.view.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let run = r.statements.join(" ");
    match &r.verdict {
        Verdict::Fits if r.choice.cost() < 2 && facts.current.identity == ReplicaIdentity::Full => {
            Finding::ok(
                CHECK,
                subject,
                format!(
                    "{current}: more than view(s) {all_views} need ({} would do: {}), kept for the changefeed's whole rows",
                    r.choice, r.reason
                ),
            )
        }
        Verdict::Fits => Finding::ok(
            CHECK,
            subject,
            format!(
                "{current} is the cheapest that carries what view(s) {all_views} need: {}",
                r.reason
            ),
        ),
        Verdict::MoreThanNeeded => {
            let cost = if facts.current.identity == ReplicaIdentity::Full {
                format!(" ({FULL_COST})")
            } else {
                " (it logs old key columns no view reads on key changes and deletes)".to_owned()
            };
            Finding::ok(
                CHECK,
                subject,
                format!(
                    "{current} is more than view(s) {all_views} need{cost}: {} carries it, as {}. To switch: {run}",
                    r.choice, r.reason
                ),
            )
        }
        Verdict::Missing { views, columns } if columns.is_empty() => Finding::warning(
            CHECK,
            subject,
            format!(
                "view(s) {}: under {current} an UPDATE or DELETE carries no old row (and fails on a published table). Cheapest that works: {} ({}). Run: {run}",
                views.join(", "),
                r.choice,
                r.reason
            ),
        ),
        Verdict::Missing { views, columns } => {
            let cols = columns.join(", ");
            let full = if r.choice == Choice::Full {
                String::new()
            } else {
                format!(" FULL would also do, at more cost: {FULL_COST}.")
            };
            Finding::warning(
                CHECK,
                subject,
                format!(
                    "view(s) {} need the old {cols} of an UPDATE that changes it and of a DELETE; {current} does not carry it, so the scope a row left is rebuilt only by a reconcile sweep. Cheapest that does: {} ({}). Run: {run}{full} If no UPDATE changes {cols} and rows are never deleted, say so instead: `fixed_key = true` on the watch entry.",
                    views.join(", "),
                    r.choice,
                    r.reason
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn facts(
        identity: ReplicaIdentity,
        identity_cols: &[&str],
        pk: &[&str],
        indexes: &[(&str, &[&str], bool)],
        not_null: &[&str],
    ) -> IdentityFacts {
        IdentityFacts {
            current: TableIdentity {
                table: TableName::new("public", "readings"),
                identity,
                key_columns: strs(identity_cols),
                primary_key: strs(pk),
            },
            unique_indexes: indexes
                .iter()
                .map(|(n, c, u)| UniqueIndex {
                    name: (*n).into(),
                    columns: strs(c),
                    usable: *u,
                })
                .collect(),
            not_null: strs(not_null),
        }
    }

    fn need(view: &str, key: &[&str], fixed_key: bool) -> ViewNeed {
        ViewNeed {
            view: view.into(),
            key: strs(key),
            fixed_key,
        }
    }

    /// (case, facts, needs, whole_rows, expected choice, expected verdict).
    type Case<'a> = (
        &'a str,
        IdentityFacts,
        Vec<ViewNeed>,
        bool,
        &'a str,
        &'a str,
    );

    /// The verdict's name, for a compact table.
    fn verdict(v: &Verdict) -> &'static str {
        match v {
            Verdict::Fits => "fits",
            Verdict::Missing { .. } => "missing",
            Verdict::MoreThanNeeded => "more",
        }
    }

    #[test]
    fn the_cheapest_identity_that_carries_what_the_views_need() {
        use ReplicaIdentity::{Default as D, Full as F, Index as I, Nothing as N};
        let pk_only: &[(&str, &[&str], bool)] = &[("readings_pkey", &["id"], true)];
        let with_key: &[(&str, &[&str], bool)] = &[
            ("readings_pkey", &["id"], true),
            ("readings_id_device", &["id", "device"], true),
        ];
        let nullable_key: &[(&str, &[&str], bool)] = &[
            ("readings_pkey", &["id"], true),
            ("readings_id_device", &["id", "device"], false),
        ];
        let all = &["id", "device", "value"][..];
        let no_device = &["id", "value"][..];
        // (case, facts, needs, whole_rows, expected choice, expected verdict)
        let cases: Vec<Case<'_>> = vec![
            (
                "key in the primary key: DEFAULT fits",
                facts(D, &["id"], &["id"], pk_only, all),
                vec![need("v", &["id"], false)],
                false,
                "DEFAULT",
                "fits",
            ),
            (
                "key part of a composite primary key: DEFAULT fits",
                facts(D, &["device", "ts"], &["device", "ts"], &[], all),
                vec![need("v", &["device"], false)],
                false,
                "DEFAULT",
                "fits",
            ),
            (
                "fixed key: DEFAULT fits",
                facts(D, &["id"], &["id"], pk_only, all),
                vec![need("v", &["device"], true)],
                false,
                "DEFAULT",
                "fits",
            ),
            (
                "key that changes, no index yet: create one leading with the key",
                facts(D, &["id"], &["id"], pk_only, all),
                vec![need("v", &["device"], false)],
                false,
                "USING INDEX on (device, id)",
                "missing",
            ),
            (
                "two indexes carry the key: the one leading with it, the rebuild's too",
                facts(
                    D,
                    &["id"],
                    &["id"],
                    &[
                        ("readings_pkey", &["id"], true),
                        ("readings_id_device", &["id", "device"], true),
                        ("readings_device_id", &["device", "id"], true),
                    ],
                    all,
                ),
                vec![need("v", &["device"], false)],
                false,
                "USING INDEX on (device, id)",
                "missing",
            ),
            (
                "key that changes, index exists: use it",
                facts(D, &["id"], &["id"], with_key, all),
                vec![need("v", &["device"], false)],
                false,
                "USING INDEX on (id, device)",
                "missing",
            ),
            (
                "already USING INDEX on (id, device): fits",
                facts(I, &["id", "device"], &["id"], with_key, all),
                vec![need("v", &["device"], false)],
                false,
                "USING INDEX on (id, device)",
                "fits",
            ),
            (
                "FULL where DEFAULT suffices: more than needed",
                facts(F, &[], &["id"], pk_only, all),
                vec![need("v", &["id"], false), need("w", &["device"], true)],
                false,
                "DEFAULT",
                "more",
            ),
            (
                "FULL where USING INDEX suffices: more than needed",
                facts(F, &[], &["id"], pk_only, all),
                vec![need("v", &["device"], false)],
                false,
                "USING INDEX on (device, id)",
                "more",
            ),
            (
                "FULL with a changefeed publishing whole rows: fits",
                facts(F, &[], &["id"], pk_only, all),
                vec![need("v", &["id"], false)],
                true,
                "DEFAULT",
                "fits",
            ),
            (
                "USING INDEX where DEFAULT suffices: more than needed",
                facts(I, &["id", "device"], &["id"], with_key, all),
                vec![need("v", &["id"], false)],
                false,
                "DEFAULT",
                "more",
            ),
            (
                "nullable key column: FULL",
                facts(D, &["id"], &["id"], nullable_key, no_device),
                vec![need("v", &["device"], false)],
                false,
                "FULL",
                "missing",
            ),
            (
                "FULL where only FULL works: fits",
                facts(F, &[], &["id"], nullable_key, no_device),
                vec![need("v", &["device"], false)],
                false,
                "FULL",
                "fits",
            ),
            (
                "no primary key, old key needed: FULL",
                facts(D, &[], &[], &[], all),
                vec![need("v", &["device"], false)],
                false,
                "FULL",
                "missing",
            ),
            (
                "no primary key, fixed key, a usable unique index: USING it",
                facts(D, &[], &[], &[("readings_code", &["code"], true)], all),
                vec![need("v", &["device"], true)],
                false,
                "USING INDEX on (code)",
                "missing",
            ),
            (
                "an identity index without the primary key a view is keyed by: DEFAULT",
                facts(
                    I,
                    &["code"],
                    &["id"],
                    &[
                        ("readings_pkey", &["id"], true),
                        ("readings_code", &["code"], true),
                    ],
                    all,
                ),
                vec![need("v", &["id"], false)],
                false,
                "DEFAULT",
                "missing",
            ),
            (
                "NOTHING: never carries",
                facts(N, &[], &["id"], pk_only, all),
                vec![need("v", &["id"], false)],
                false,
                "DEFAULT",
                "missing",
            ),
            (
                "two views, keys device and site: one index over both",
                facts(D, &["id"], &["id"], pk_only, &["id", "device", "site"]),
                vec![need("v", &["device"], false), need("w", &["site"], false)],
                false,
                "USING INDEX on (device, site, id)",
                "missing",
            ),
            (
                "an identity index short of a second view's key",
                facts(
                    I,
                    &["id", "device"],
                    &["id"],
                    with_key,
                    &["id", "device", "site"],
                ),
                vec![need("v", &["device"], false), need("w", &["site"], false)],
                false,
                "USING INDEX on (device, site, id)",
                "missing",
            ),
        ];
        for (case, f, needs, whole, choice, want) in cases {
            let r = recommend(&f, &needs, whole);
            assert_eq!(r.choice.to_string(), choice, "{case}");
            assert_eq!(verdict(&r.verdict), want, "{case}");
            assert_eq!(r.statements.is_empty(), want == "fits", "{case}");
        }
    }

    #[test]
    fn statements_create_the_index_then_switch_to_it() {
        let f = facts(
            ReplicaIdentity::Default,
            &["id"],
            &["id"],
            &[("readings_pkey", &["id"], true)],
            &["id", "device"],
        );
        let r = recommend(&f, &[need("v", &["device"], false)], false);
        assert_eq!(
            r.statements,
            vec![
                "CREATE UNIQUE INDEX CONCURRENTLY \"readings_device_id_identity\" ON \"public\".\"readings\" (\"device\", \"id\");".to_owned(),
                "ALTER TABLE \"public\".\"readings\" REPLICA IDENTITY USING INDEX \"readings_device_id_identity\";".to_owned(),
            ]
        );
        assert_eq!(
            r.verdict,
            Verdict::Missing {
                views: vec!["v".into()],
                columns: vec!["device".into()],
            }
        );
        // A failed CONCURRENTLY build left the index invalid: dropped, then built again.
        let f = facts(
            ReplicaIdentity::Default,
            &["id"],
            &["id"],
            &[
                ("readings_pkey", &["id"], true),
                ("readings_device_id_identity", &["device", "id"], false),
            ],
            &["id", "device"],
        );
        let r = recommend(&f, &[need("v", &["device"], false)], false);
        assert_eq!(
            r.statements[0],
            "DROP INDEX CONCURRENTLY IF EXISTS \"public\".\"readings_device_id_identity\";"
        );
        assert_eq!(r.statements.len(), 3, "{:?}", r.statements);
        let full = facts(ReplicaIdentity::Full, &[], &["id"], &[], &["id"]);
        let r = recommend(&full, &[need("v", &["id"], false)], false);
        assert_eq!(
            r.statements,
            vec!["ALTER TABLE \"public\".\"readings\" REPLICA IDENTITY DEFAULT;".to_owned()]
        );
    }

    #[test]
    fn the_advice_is_a_warning_with_the_statements_only_when_changes_are_lost() {
        let pk_only: &[(&str, &[&str], bool)] = &[("items_pkey", &["id"], true)];
        let lossy = facts(
            ReplicaIdentity::Default,
            &["id"],
            &["id"],
            pk_only,
            &["id", "cid"],
        );
        let a = advise(&lossy, &[need("ct", &["cid"], false)], false);
        assert!(a.loses_changes());
        assert_eq!(a.finding.level, freshen::plug::Level::Warning);
        assert_eq!(a.finding.subject, "public.readings");
        for s in &a.recommendation.statements {
            assert!(
                a.finding.message.contains(s.as_str()),
                "{}",
                a.finding.message
            );
        }
        assert!(
            a.finding.message.starts_with(
                "view(s) ct need the old cid of an UPDATE that changes it and of a DELETE"
            ),
            "{}",
            a.finding.message
        );
        // The key declared fixed: nothing is lost, nothing to run.
        let a = advise(&lossy, &[need("ct", &["cid"], true)], false);
        assert!(!a.loses_changes());
        assert_eq!(a.finding.level, freshen::plug::Level::Ok);
        assert!(a.recommendation.statements.is_empty());
        // More than needed is said (check), but loses nothing (run and init stay quiet).
        let full = facts(ReplicaIdentity::Full, &[], &["id"], pk_only, &["id", "cid"]);
        let a = advise(&full, &[need("ct", &["cid"], false)], false);
        assert!(!a.loses_changes());
        assert!(!a.recommendation.statements.is_empty());
    }

    #[test]
    fn index_names_fit_postgres_limit() {
        let long = "t".repeat(60);
        let name = index_name(&long, &strs(&["id", "device"]));
        assert_eq!(name.len(), 63, "{name}");
        assert!(name.ends_with("_id_device_identity"), "{name}");
        let many: Vec<String> = (0..20).map(|i| format!("column_{i}")).collect();
        let name = index_name("readings", &many);
        assert!(name.len() <= 63 && name.ends_with("_identity"), "{name}");
        assert_eq!(
            index_name("readings", &strs(&["id"])),
            "readings_id_identity"
        );
    }
}
