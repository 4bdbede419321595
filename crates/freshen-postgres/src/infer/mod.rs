//! What a view rebuilt by `query` must watch, inferred from PostgreSQL: the tables the
//! query reads (its generic plan, through views, partitions and functions, as `check`
//! finds them), the equalities its plan shows ([`plan`]), and the catalog's foreign
//! keys, turned into watch entries by [`entries`] (pure). The file's own `watch`
//! entries and `static` tables win: only the tables neither names are inferred.

pub mod entries;
pub mod plan;

use freshen::plug::{Finding, Inferred, Starter, ViewSpec, Watched};
use tokio_postgres::Client;

use crate::check::depends;
use crate::{PgError, TableName, quote_ident};
use entries::{ForeignKey, Question};

/// The watch entries `view`'s query needs beyond those the file gives, with advice for
/// each (an index for a fan-out statement's lookup); or every reason it cannot.
pub async fn infer(client: &Client, view: &ViewSpec) -> Result<Inferred, Vec<String>> {
    let name = &view.name;
    let Some(q) = &view.query else {
        return Err(vec![format!(
            "view `{name}`: watch entries are inferred for a view rebuilt by `query`; write `watch` for `rebuild` statements"
        )]);
    };
    let fail = |what: &str, e: PgError| vec![format!("view `{name}`: {what}: {e}")];
    let relations = depends::relations(client, &q.query)
        .await
        .map_err(|e| fail("cannot tell which tables the query reads", e))?;
    let covered = |t: &TableName| {
        view.watch
            .iter()
            .any(|w| w.schema == t.schema && w.table == t.name)
            || view
                .static_tables
                .iter()
                .any(|(s, n)| *s == t.schema && *n == t.name)
    };
    let uncovered: Vec<TableName> = relations
        .reads
        .iter()
        .filter(|t| !covered(t))
        .cloned()
        .collect();
    if uncovered.is_empty() && view.direct().next().is_some() {
        return Ok(Inferred::default());
    }
    if !relations.opaque_functions.is_empty() {
        return Err(relations
            .opaque_functions
            .iter()
            .map(|f| {
                format!(
                    "view `{name}`: the query calls {f}, whose body PostgreSQL does not track (PL/pgSQL, or SQL not written BEGIN ATOMIC … END): the tables it reads cannot be inferred. Write the view's `watch` entries by hand (with `static` for tables whose changes may be ignored), or rewrite {f} as a SQL-standard function (BEGIN ATOMIC … END)"
                )
            })
            .collect());
    }
    let (plan, columns, params) = depends::generic_plan(client, &q.query)
        .await
        .map_err(|e| fail("cannot explain the query", e))?;
    let shape = plan::shape(&plan);
    let mut scans = Vec::new();
    for (alias, schema, relation) in &shape.scans {
        let root = depends::root(client, schema, relation)
            .await
            .map_err(|e| fail("cannot read a relation of the query", e))?;
        if let Some(t) = root {
            scans.push((alias.clone(), t));
        }
    }
    let foreign_keys = foreign_keys(client, &relations.reads)
        .await
        .map_err(|e| fail("cannot read the foreign keys", e))?;
    // The file's key where it gives one, else every parameter is a key part.
    let arity = if view.arity() > 0 {
        view.arity()
    } else {
        params.max(1)
    };
    let answer = entries::infer(&Question {
        view: name,
        shape: &shape,
        scans: &scans,
        arity,
        columns: &columns,
        uncovered: &uncovered,
        foreign_keys: &foreign_keys,
    })?;
    let mut advice = Vec::new();
    for e in &answer.entries {
        if let Some((table, cols)) = &e.lookup {
            advice.push(index_advice(client, name, &e.table, table, cols).await);
        }
    }
    Ok(Inferred {
        // The file's first entry that carries the key names it, where there is one.
        key: if view.direct().next().is_some() {
            Vec::new()
        } else {
            answer.key
        },
        watch: answer
            .entries
            .into_iter()
            .map(|e| Watched {
                view: name.clone(),
                schema: e.table.schema,
                table: e.table.name,
                key: e.key,
                keys: e.keys,
                fixed_key: false,
            })
            .collect(),
        advice,
    })
}

/// Foreign keys from or to any of `tables`.
async fn foreign_keys(client: &Client, tables: &[TableName]) -> Result<Vec<ForeignKey>, PgError> {
    let names: Vec<String> = tables.iter().map(TableName::quoted).collect();
    let rows = client
        .query(
            "SELECT cn.nspname::text, cl.relname::text, \
                    ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, o) \
                          JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.o), \
                    pn.nspname::text, pl.relname::text, \
                    ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(n, o) \
                          JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n ORDER BY k.o) \
             FROM pg_constraint c \
             JOIN pg_class cl ON cl.oid = c.conrelid JOIN pg_namespace cn ON cn.oid = cl.relnamespace \
             JOIN pg_class pl ON pl.oid = c.confrelid JOIN pg_namespace pn ON pn.oid = pl.relnamespace \
             WHERE c.contype = 'f' AND c.conparentid = 0 \
               AND (c.conrelid = ANY($1::text[]::regclass[]) OR c.confrelid = ANY($1::text[]::regclass[])) \
             ORDER BY c.conname",
            &[&names],
        )
        .await
        .map_err(|e| PgError::sql("cannot read foreign keys", e))?;
    Ok(rows
        .iter()
        .map(|r| ForeignKey {
            child: TableName::new(r.get::<_, String>(0), r.get::<_, String>(1)),
            columns: r.get(2),
            parent: TableName::new(r.get::<_, String>(3), r.get::<_, String>(4)),
            referenced: r.get(5),
        })
        .collect())
}

/// Whether the fan-out statement of `watched` finds its rows in `table` by an index
/// leading with `cols`.
async fn index_advice(
    client: &Client,
    view: &str,
    watched: &TableName,
    table: &TableName,
    cols: &[String],
) -> Finding {
    let subject = format!("view {view} watch {watched}");
    match crate::target::query::indexes(client, table).await {
        Err(e) => Finding::error("index", subject, e.to_string()),
        Ok(found) => match found.iter().find(|i| i.leads_with(cols)) {
            Some(i) => Finding::ok(
                "index",
                subject,
                format!(
                    "the inferred `keys` statement finds {table}'s rows through {}",
                    i.name
                ),
            ),
            None => Finding::warning(
                "index",
                subject,
                format!(
                    "no index of {table} leads with ({k}): each change to {watched} makes the inferred `keys` statement read the whole of {table}. CREATE INDEX ON {} ({k})",
                    table.quoted(),
                    k = cols
                        .iter()
                        .map(|c| quote_ident(c))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
        },
    }
}

/// What a starting file for `view` (its entries `inferred`) needs besides the view:
/// the `[source]` table reading its URL from `url_var`, the `CREATE TABLE` of its
/// target (the query's columns with their types, the key as primary key) and the
/// publication `run` creates for the tables it watches.
pub async fn starter(
    client: &Client,
    view: &ViewSpec,
    inferred: &Inferred,
    url_var: &str,
) -> Result<Starter, Vec<String>> {
    let name = &view.name;
    let Some(q) = &view.query else {
        return Err(vec![format!(
            "view `{name}`: a starting file is written for a query"
        )]);
    };
    let fail = |what: &str, e: &dyn std::fmt::Display| vec![format!("view `{name}`: {what}: {e}")];
    let stmt = client
        .prepare(&q.query)
        .await
        .map_err(|e| fail("the query does not prepare", &crate::error::describe(&e)))?;
    let key = view.key();
    let mut columns = Vec::new();
    for c in stmt.columns() {
        let ty: String = client
            .query_one("SELECT format_type($1::oid, NULL)", &[&c.type_().oid()])
            .await
            .map_err(|e| fail("cannot name a column's type", &e))?
            .get(0);
        let not_null = if key.iter().any(|k| k == c.name()) {
            " NOT NULL"
        } else {
            ""
        };
        columns.push(format!("{} {ty}{not_null}", quote_ident(c.name())));
    }
    let into = TableName::new(&q.into.0, &q.into.1);
    let primary = key
        .iter()
        .map(|k| quote_ident(k))
        .collect::<Vec<_>>()
        .join(", ");
    let mut tables: Vec<String> = Vec::new();
    for w in &inferred.watch {
        let t = TableName::new(&w.schema, &w.table).quoted();
        if !tables.contains(&t) {
            tables.push(t);
        }
    }
    let slot = "freshen";
    Ok(Starter {
        source: format!(
            "[source]\nkind = \"postgres\"\nurl = \"${{{url_var}}}\"\nslot = \"{slot}\"\npublication = \"{slot}\"\n"
        ),
        notes: vec![
            format!(
                "The target table (create it first):\nCREATE TABLE {} ({}, PRIMARY KEY ({primary}));",
                into.quoted(),
                columns.join(", ")
            ),
            format!(
                "`freshen run` creates the publication for the watched tables if missing (it needs CREATE on the database and ownership of each table); to create it yourself:\nCREATE PUBLICATION {slot} FOR TABLE {} WITH (publish_via_partition_root = true);",
                tables.join(", ")
            ),
            "Then `freshen check -c` this file: wal_level, privileges, each table's replica identity, indexes.".to_string(),
        ],
    })
}
