//! Which relations a statement reads, asked of PostgreSQL rather than parsed: the
//! statement is prepared and its *generic* plan explained (`plan_cache_mode =
//! force_generic_plan`, parameters NULL: nothing is folded away, nothing runs), so every
//! table a scan touches is named, through views (the rewriter expands them) and inlined
//! SQL functions. Functions the planner cannot inline are looked up in `pg_depend`
//! (SQL-standard bodies record the tables they read). Partitions are reported as their
//! partition root, the table a user watches. Plus what the foreign keys say about how a
//! read table reaches a view's key, for a watch entry ready to paste.

use std::collections::BTreeSet;

use tokio_postgres::{Client, SimpleQueryMessage};

use crate::PgError;
use crate::TableName;
use crate::quote::quote_ident;

/// The relations a statement reads and the ones it writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Relations {
    /// Tables (partition roots) a scan reads, sorted.
    pub reads: Vec<TableName>,
    /// Tables the statement modifies (INSERT, UPDATE, DELETE targets), sorted.
    pub writes: Vec<TableName>,
    /// User functions it calls whose reads PostgreSQL cannot tell (a PL/pgSQL body, or
    /// SQL not in the SQL-standard `BEGIN ATOMIC` form), `schema.name`.
    pub opaque_functions: Vec<String>,
}

const PREPARED: &str = "freshen_depends";

/// The generic plan of `sql` (`EXPLAIN (VERBOSE, FORMAT JSON)`, parameters NULL), the
/// names of the columns it returns and its number of parameters. Runs in a read-only transaction that is rolled
/// back; the prepared statement is deallocated.
pub(crate) async fn generic_plan(
    client: &Client,
    sql: &str,
) -> Result<(serde_json::Value, Vec<String>, usize), PgError> {
    let sql = sql.trim().trim_end_matches(';').trim_end();
    let stmt = client
        .prepare(sql)
        .await
        .map_err(|e| PgError::sql("the statement does not prepare", e))?;
    let columns = stmt.columns().iter().map(|c| c.name().to_owned()).collect();
    client
        .batch_execute("BEGIN READ ONLY; SET LOCAL plan_cache_mode = force_generic_plan")
        .await
        .map_err(|e| PgError::sql("cannot begin the dependency check", e))?;
    let params = stmt.params().len();
    let explained = explain(client, sql, params).await;
    let _ = client.batch_execute("ROLLBACK").await;
    let _ = client
        .batch_execute(&format!("DEALLOCATE {PREPARED}"))
        .await;
    Ok((explained?, columns, params))
}

/// The relations `sql` reads and writes, from its generic plan. Runs in a transaction
/// that is rolled back; the prepared statement is deallocated.
pub async fn relations(client: &Client, sql: &str) -> Result<Relations, PgError> {
    let sql = sql.trim().trim_end_matches(';').trim_end();
    let params = client
        .prepare(sql)
        .await
        .map_err(|e| PgError::sql("the statement does not prepare", e))?
        .params()
        .len();
    client
        .batch_execute("BEGIN READ ONLY; SET LOCAL plan_cache_mode = force_generic_plan")
        .await
        .map_err(|e| PgError::sql("cannot begin the dependency check", e))?;
    let explained = explain(client, sql, params).await;
    let _ = client.batch_execute("ROLLBACK").await;
    let _ = client
        .batch_execute(&format!("DEALLOCATE {PREPARED}"))
        .await;
    let plan = explained?;
    let mut scans = BTreeSet::new();
    let mut writes = BTreeSet::new();
    let mut functions = BTreeSet::new();
    walk(&plan, &mut scans, &mut writes, &mut functions);
    // A function called in an expression appears in the plan only as text of its
    // output or filter: look for the catalog's user functions there by name.
    let text = plan.to_string();
    let mut opaque = BTreeSet::new();
    for (schema, name, standard) in user_functions(client).await? {
        let called = text.contains(&format!("{name}("));
        if !called && !functions.contains(&(schema.clone(), name.clone())) {
            continue;
        }
        if !standard {
            opaque.insert(format!("{schema}.{name}"));
        }
        for t in function_tables(client, &schema, &name).await? {
            scans.insert(t);
        }
    }
    let mut reads = BTreeSet::new();
    for (schema, name) in scans {
        if let Some(t) = root(client, &schema, &name).await? {
            reads.insert(t);
        }
    }
    let mut written = BTreeSet::new();
    for (schema, name) in writes {
        if let Some(t) = root(client, &schema, &name).await? {
            written.insert(t);
        }
    }
    Ok(Relations {
        reads: reads.into_iter().collect(),
        writes: written.into_iter().collect(),
        opaque_functions: opaque.into_iter().collect(),
    })
}

/// User functions (outside the system schemas): schema, name, and whether the body is
/// SQL-standard (its dependencies recorded). C and internal functions read no tables.
async fn user_functions(client: &Client) -> Result<Vec<(String, String, bool)>, PgError> {
    let rows = client
        .query(
            "SELECT n.nspname::text, p.proname::text, p.prosqlbody IS NOT NULL \
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             JOIN pg_language l ON l.oid = p.prolang \
             WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') \
               AND n.nspname NOT LIKE 'pg_toast%' AND l.lanname NOT IN ('c', 'internal')",
            &[],
        )
        .await
        .map_err(|e| PgError::sql("cannot list functions", e))?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

async fn explain(client: &Client, sql: &str, params: usize) -> Result<serde_json::Value, PgError> {
    client
        .batch_execute(&format!("PREPARE {PREPARED} AS {sql}"))
        .await
        .map_err(|e| PgError::sql("the statement does not prepare", e))?;
    let args = if params == 0 {
        String::new()
    } else {
        format!("({})", vec!["NULL"; params].join(", "))
    };
    let messages = client
        .simple_query(&format!(
            "EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE {PREPARED}{args}"
        ))
        .await
        .map_err(|e| PgError::sql("cannot explain the statement", e))?;
    let text: String = messages
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .collect();
    serde_json::from_str(&text).map_err(|e| {
        PgError::new(
            crate::ErrorKind::Setup,
            format!("cannot read the statement's plan: {e}"),
        )
    })
}

/// Collects (schema, relation) of scans and of modified tables, and (schema, function)
/// of function scans, from a plan in JSON.
fn walk(
    v: &serde_json::Value,
    scans: &mut BTreeSet<(String, String)>,
    writes: &mut BTreeSet<(String, String)>,
    functions: &mut BTreeSet<(String, String)>,
) {
    match v {
        serde_json::Value::Array(items) => {
            for i in items {
                walk(i, scans, writes, functions);
            }
        }
        serde_json::Value::Object(o) => {
            let schema = o.get("Schema").and_then(|s| s.as_str()).unwrap_or("public");
            let modify = o.get("Node Type").and_then(|s| s.as_str()) == Some("ModifyTable");
            if let Some(rel) = o.get("Relation Name").and_then(|s| s.as_str()) {
                let entry = (schema.to_owned(), rel.to_owned());
                if modify {
                    writes.insert(entry);
                } else {
                    scans.insert(entry);
                }
            }
            if let Some(f) = o.get("Function Name").and_then(|s| s.as_str()) {
                functions.insert((schema.to_owned(), f.to_owned()));
            }
            for child in o.values() {
                walk(child, scans, writes, functions);
            }
        }
        _ => {}
    }
}

/// Tables a function's SQL-standard body depends on (`pg_depend`).
async fn function_tables(
    client: &Client,
    schema: &str,
    name: &str,
) -> Result<Vec<(String, String)>, PgError> {
    let rows = client
        .query(
            "SELECT DISTINCT cn.nspname::text, c.relname::text \
             FROM pg_proc p JOIN pg_namespace pn ON pn.oid = p.pronamespace \
             JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid \
                             AND d.refclassid = 'pg_class'::regclass \
             JOIN pg_class c ON c.oid = d.refobjid AND c.relkind IN ('r', 'p', 'v', 'm', 'f') \
             JOIN pg_namespace cn ON cn.oid = c.relnamespace \
             WHERE pn.nspname = $1 AND p.proname = $2",
            &[&schema, &name],
        )
        .await
        .map_err(|e| PgError::sql("cannot read a function's dependencies", e))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The table a user watches for relation `schema.name`: its partition root; `None` for
/// system catalogs.
pub(crate) async fn root(
    client: &Client,
    schema: &str,
    name: &str,
) -> Result<Option<TableName>, PgError> {
    if schema == "pg_catalog" || schema == "information_schema" {
        return Ok(None);
    }
    let row = client
        .query_opt(
            "SELECT rn.nspname::text, rc.relname::text \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_class rc ON rc.oid = coalesce(pg_partition_root(c.oid), c.oid) \
             JOIN pg_namespace rn ON rn.oid = rc.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&schema, &name],
        )
        .await
        .map_err(|e| PgError::sql("cannot read a relation", e))?;
    Ok(row.map(|r| TableName::new(r.get::<_, String>(0), r.get::<_, String>(1))))
}

/// A watched table that carries the view's key: where a fan-out can find keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedTable {
    /// The table.
    pub table: TableName,
    /// Its columns that form the view's key, in `$1..$n` order.
    pub key: Vec<String>,
}

/// A watch entry for `table`, as a line of TOML ready to paste, inferred from the
/// schema: a watched table's foreign key references it (then a `keys` statement maps
/// its rows through that table), or it carries a key's columns itself. `None` when no
/// such path exists.
pub async fn propose_watch(
    client: &Client,
    table: &TableName,
    keyed: &[KeyedTable],
) -> Result<Option<String>, PgError> {
    let rows = client
        .query(
            "SELECT cn.nspname::text, cl.relname::text, \
                    ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, o) \
                          JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.o), \
                    ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(n, o) \
                          JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n ORDER BY k.o) \
             FROM pg_constraint c JOIN pg_class cl ON cl.oid = c.conrelid \
             JOIN pg_namespace cn ON cn.oid = cl.relnamespace \
             WHERE c.contype = 'f' AND c.confrelid = $1::text::regclass",
            &[&table.quoted()],
        )
        .await
        .map_err(|e| PgError::sql(format!("cannot read the foreign keys to {table}"), e))?;
    for r in rows {
        let child = TableName::new(r.get::<_, String>(0), r.get::<_, String>(1));
        let (fk, referenced): (Vec<String>, Vec<String>) = (r.get(2), r.get(3));
        let Some(k) = keyed.iter().find(|k| k.table == child) else {
            continue;
        };
        let select = k
            .key
            .iter()
            .map(|c| ident(c))
            .collect::<Vec<_>>()
            .join(", ");
        let filter = fk
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{} = ${}", ident(c), i + 1))
            .collect::<Vec<_>>()
            .join(" AND ");
        return Ok(Some(format!(
            "{{ table = \"{table}\", key = [{}], keys = \"SELECT {select} FROM {} WHERE {filter}\" }}",
            toml_list(&referenced),
            qualified(&child)
        )));
    }
    // A table that carries a key's columns itself (not as its own primary key: an
    // `id` of plans is not an account's `id`).
    let columns: Vec<String> = crate::catalog::columns(client, table)
        .await?
        .into_iter()
        .map(|c| c.name)
        .collect();
    let primary: Vec<String> = client
        .query(
            "SELECT a.attname::text FROM pg_index i \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = $1::text::regclass AND i.indisprimary",
            &[&table.quoted()],
        )
        .await
        .map_err(|e| PgError::sql(format!("cannot read the primary key of {table}"), e))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for k in keyed {
        let carried = k.key.iter().all(|c| columns.contains(c));
        let own_key = k.key.iter().all(|c| primary.contains(c));
        if carried && !own_key {
            return Ok(Some(format!(
                "{{ table = \"{table}\", key = [{}] }}",
                toml_list(&k.key)
            )));
        }
    }
    Ok(None)
}

fn toml_list(items: &[String]) -> String {
    items
        .iter()
        .map(|c| format!("\"{}\"", c.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An identifier as a person writes it: bare when that reads the same, else quoted
/// (escaped for the TOML string it goes in).
fn ident(s: &str) -> String {
    let bare = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if bare {
        s.to_owned()
    } else {
        quote_ident(s).replace('\\', "\\\\").replace('"', "\\\"")
    }
}

fn qualified(t: &TableName) -> String {
    format!("{}.{}", ident(&t.schema), ident(&t.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_name_their_scans_and_targets() {
        let plan: serde_json::Value = serde_json::from_str(
            r#"[{"Plan": {"Node Type": "ModifyTable", "Relation Name": "mrr", "Schema": "public",
                "Plans": [{"Node Type": "Hash Join", "Plans": [
                    {"Node Type": "Seq Scan", "Relation Name": "plans", "Schema": "public"},
                    {"Node Type": "Index Scan", "Relation Name": "subs", "Schema": "app"},
                    {"Node Type": "Function Scan", "Function Name": "f", "Schema": "public"}]}]}}]"#,
        )
        .unwrap();
        let (mut s, mut w, mut f) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        walk(&plan, &mut s, &mut w, &mut f);
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            s.into_iter().collect::<Vec<_>>(),
            [pair("app", "subs"), pair("public", "plans")]
        );
        assert_eq!(w.into_iter().collect::<Vec<_>>(), [pair("public", "mrr")]);
        assert_eq!(f.into_iter().collect::<Vec<_>>(), [pair("public", "f")]);
    }

    #[test]
    fn identifiers_are_quoted_only_when_needed() {
        assert_eq!(ident("plan_id"), "plan_id");
        assert_eq!(ident("Plan"), "\\\"Plan\\\"");
    }
}
