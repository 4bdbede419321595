//! What a view rebuilt by `query` must watch, inferred from PostgreSQL: the tables the
//! query reads (its generic plan, through views, partitions and functions, as `check`
//! finds them), the equalities its plan shows ([`plan`]), and the catalog's foreign
//! keys, turned into watch entries by [`entries`] (pure). The file's own `watch`
//! entries and `static` tables win: only the tables neither names are inferred.

pub mod entries;
pub mod plan;

use freshen::plug::{Finding, Inferred, SourceFix, Starter, ViewSpec, Watched};
use tokio_postgres::Client;

use crate::check::depends;
use crate::target::keyed;
use crate::{PgError, TableName, quote_ident};
use entries::{ForeignKey, Question};

/// The watch entries `view`'s query needs beyond those the file gives, with advice for
/// each (an index for a fan-out statement's lookup); or every reason it cannot.
///
/// A plain query (no `$n`: the SELECT of a materialized view) is keyed first: its key
/// is the view's `key` or the target's primary key, its batch filter is written around
/// it (`target::keyed`), and the plan must show the filter reaching
/// the tables (else every batch would compute the whole query): that is checked even
/// when the file gives every watch entry.
pub async fn infer(client: &Client, view: &ViewSpec) -> Result<Inferred, Vec<String>> {
    let name = &view.name;
    let Some(q) = &view.query else {
        return Err(vec![format!(
            "view `{name}`: watch entries are inferred for a view rebuilt by `query`; write `watch` for `rebuild` statements"
        )]);
    };
    let fail = |what: &str, e: PgError| vec![format!("view `{name}`: {what}: {e}")];
    let plain = freshen::plug::is_plain_query(&q.query);
    let mut advice = Vec::new();
    let (key, query) = if plain {
        let into = TableName::new(&q.into.0, &q.into.1);
        let key = plain_key(client, view, &into).await?;
        advice.push(Finding::ok(
            "key",
            format!("view {name}"),
            format!(
                "({}), {}; freshen writes the batch filter around the query",
                key.names.join(", "),
                key.from
            ),
        ));
        let query = keyed::keyed(&q.query, &key.names);
        (key.names, query)
    } else {
        (Vec::new(), q.query.clone())
    };
    let relations = depends::relations(client, &query)
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
    let complete = uncovered.is_empty() && view.direct().next().is_some();
    if complete && !plain {
        return Ok(Inferred::default());
    }
    if !relations.opaque_functions.is_empty() && !complete {
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
    let (plan, columns, params) = depends::generic_plan(client, &query)
        .await
        .map_err(|e| fail("cannot explain the query", e))?;
    let shape = plan::shape(&plan);
    if let Some(site) = shape.filtered_above() {
        let message = filtered_above(name, site, plain);
        if plain {
            return Err(vec![message]);
        }
        advice.push(Finding::warning("query", format!("view {name}"), message));
    }
    if complete {
        return Ok(Inferred {
            key,
            watch: Vec::new(),
            advice,
        });
    }
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
    // A plain query's key, else the file's key where it gives one, else every parameter
    // is a key part.
    let arity = if !key.is_empty() {
        key.len()
    } else if view.arity() > 0 {
        view.arity()
    } else {
        params.max(1)
    };
    if plain {
        let computed: Vec<String> = key
            .iter()
            .enumerate()
            .filter(|(i, _)| !shape.params.iter().any(|(_, k)| *k == i + 1))
            .map(|(_, k)| {
                format!(
                    "view `{name}`: the key column `{k}` is computed by an expression, not read from a table column, so freshen cannot trace which rows' changes move a key. Write the view's `watch` entries by hand (a `keys` statement may compute the key from the changed row's columns, e.g. {{ table = \"…\", key = [\"<column>\"], keys = \"SELECT <the expression over $1>\" }}, so that its old and new values are both mapped), or keep the key in a column of its table and group by that column"
                )
            })
            .collect();
        if !computed.is_empty() {
            return Err(computed);
        }
    }
    let answer = entries::infer(&Question {
        view: name,
        shape: &shape,
        scans: &scans,
        arity,
        columns: &columns,
        key: &key,
        uncovered: &uncovered,
        foreign_keys: &foreign_keys,
    })?;
    for e in &answer.entries {
        if let Some((table, cols)) = &e.lookup {
            advice.push(index_advice(client, name, &e.table, table, cols).await);
        }
    }
    Ok(Inferred {
        // A plain query's key is always the target's; otherwise the file's first entry
        // that carries the key names it, where there is one.
        key: if plain {
            key
        } else if view.direct().next().is_some() {
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

/// A plain query's key, and where it came from.
struct PlainKey {
    names: Vec<String>,
    from: String,
}

/// The key of a view rebuilt by a plain query: the file's `key`, else the target's
/// primary key (or its one unique index), checked against the query's columns.
async fn plain_key(
    client: &Client,
    view: &ViewSpec,
    into: &TableName,
) -> Result<PlainKey, Vec<String>> {
    let name = &view.name;
    let q = view.query.as_ref().map_or("", |q| q.query.as_str());
    let stmt = client.prepare(keyed::trim(q)).await.map_err(|e| {
        vec![format!(
            "view `{name}`: the query does not prepare: {}",
            crate::error::describe(&e)
        )]
    })?;
    let returned: Vec<String> = stmt.columns().iter().map(|c| c.name().to_owned()).collect();
    let key = if !view.key_names.is_empty() {
        PlainKey {
            names: view.key_names.clone(),
            from: "the view's `key`".to_owned(),
        }
    } else {
        match target_key(client, into).await {
            Ok(Some((names, index))) => PlainKey {
                names,
                from: format!("{into}'s {index}"),
            },
            Ok(None) => {
                let guess = query_key(client, q).await.unwrap_or_default();
                // A target not created yet (`freshen init` writes its CREATE TABLE): the
                // key its rows have by construction.
                if !guess.is_empty() && !exists(client, into).await {
                    return Ok(PlainKey {
                        names: guess,
                        from: format!(
                            "the query's GROUP BY or DISTINCT ({into} does not exist yet)"
                        ),
                    });
                }
                let hint = if guess.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (the query groups by ({}): `key = [{}]`)",
                        guess.join(", "),
                        guess
                            .iter()
                            .map(|k| format!("\"{k}\""))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                return Err(vec![format!(
                    "view `{name}`: {into} has no primary key (or unique index) to take the view's key from: add one (ALTER TABLE {} ADD PRIMARY KEY (…)), or give the view's `key`{hint}",
                    into.quoted()
                )]);
            }
            Err(e) => {
                return Err(vec![format!(
                    "view `{name}`: cannot read the key of {into}: {e}"
                )]);
            }
        }
    };
    let missing: Vec<&String> = key.names.iter().filter(|k| !returned.contains(k)).collect();
    if !missing.is_empty() {
        return Err(missing
            .iter()
            .map(|k| {
                format!(
                    "view `{name}`: the query does not return the key column `{k}` ({}): return it, named `{k}` (… AS {})",
                    key.from,
                    quote_ident(k)
                )
            })
            .collect());
    }
    Ok(key)
}

/// Whether `table` exists.
async fn exists(client: &Client, table: &TableName) -> bool {
    client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table.quoted()])
        .await
        .is_ok_and(|r| r.get(0))
}

/// `into`'s primary key, or its only unique index (not partial, no expressions), with
/// what it is; `None` when it has neither (or does not exist).
async fn target_key(
    client: &Client,
    into: &TableName,
) -> Result<Option<(Vec<String>, String)>, PgError> {
    let indexes = crate::target::query::indexes(client, into).await?;
    if let Some(pk) = indexes.iter().find(|i| i.primary) {
        return Ok(Some((pk.key.clone(), "primary key".to_owned())));
    }
    let unique: Vec<_> = indexes
        .iter()
        .filter(|i| i.plain_unique && i.key_count == i.key.len())
        .collect();
    Ok(match unique.as_slice() {
        [one] => Some((one.key.clone(), format!("unique index {}", one.name))),
        _ => None,
    })
}

/// The key a plain query's rows have by construction, from its plan: its `GROUP BY`
/// columns (those it returns), or every column of a `SELECT DISTINCT`. Empty when the
/// plan shows neither.
pub async fn query_key(client: &Client, query: &str) -> Result<Vec<String>, PgError> {
    let (plan, columns, _) = depends::generic_plan(client, keyed::trim(query)).await?;
    Ok(plan::grouped_by(&plan)
        .and_then(|groups| {
            groups
                .iter()
                .map(|g| columns.get(*g).cloned())
                .collect::<Option<Vec<String>>>()
        })
        .unwrap_or_default())
}

/// Why a key filter left above the tables is refused (a plain query) or warned of.
fn filtered_above(view: &str, site: &plan::ParamSite, plain: bool) -> String {
    let why = match site.node.as_str() {
        "Subquery Scan" => {
            "a subquery it cannot enter: one that picks rows across keys (DISTINCT ON or a window whose PARTITION BY leaves out the key), limits its rows (LIMIT, OFFSET), or calls a set-returning or volatile function in its SELECT list"
        }
        "Aggregate" | "Group" | "WindowAgg" => {
            "an aggregate or window result: the key is computed from rows, not read from a table"
        }
        "ProjectSet" => "a set-returning function: the key comes from it, not from a table",
        _ => "a node that computes it rather than reading it from a table",
    };
    let cost = "every batch of keys would compute the whole query and keep its keys' rows";
    if plain {
        format!(
            "view `{view}`: the key filter freshen writes around the query (`… WHERE key = ANY($1)`) cannot reach the tables: PostgreSQL applies it above {why} ({} node); {cost}. Make the key a column the query reads from a table and groups by, or write the batch filter yourself where it can be used (`WHERE <table>.<column> = ANY($1)`)",
            site.node
        )
    } else {
        format!(
            "view `{view}`: the query applies ${} above {why} ({} node): {cost}. Move the condition to where the table is read",
            site.part, site.node
        )
    }
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
/// publication `run` creates for the tables it watches, each only if missing; `fixes`:
/// what the watched tables' replica identities lack, which the file must say.
pub async fn starter(
    client: &Client,
    view: &ViewSpec,
    inferred: &Inferred,
    url_var: &str,
    fixes: Vec<SourceFix>,
) -> Result<Starter, Vec<String>> {
    let name = &view.name;
    let Some(q) = &view.query else {
        return Err(vec![format!(
            "view `{name}`: a starting file is written for a query"
        )]);
    };
    let fail = |what: &str, e: &dyn std::fmt::Display| vec![format!("view `{name}`: {what}: {e}")];
    let stmt = client
        .prepare(keyed::trim(&q.query))
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
    let mut create = vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({primary}))",
        into.quoted(),
        columns.join(", ")
    )];
    if !tables.is_empty() {
        create.push(format!(
            "CREATE PUBLICATION {slot} FOR TABLE {} WITH (publish_via_partition_root = true)",
            tables.join(", ")
        ));
    }
    let mut notes = vec![
        "`freshen run` creates the publication for the watched tables if missing (it needs CREATE on the database and ownership of each table) and the replication slot.".to_string(),
    ];
    if freshen::plug::is_plain_query(&q.query) {
        // Without a reconcile sweep, only a replica identity that carries the old key
        // makes the table stay complete: the note says which holds.
        let then = if fixes.is_empty() {
            "no `reconcile` needed".to_owned()
        } else {
            let tables: Vec<&str> = fixes.iter().map(|f| f.table.as_str()).collect();
            format!(
                "no `reconcile` needed once the replica identity of {} carries the key (see above)",
                tables.join(", ")
            )
        };
        notes.push(format!(
            "The first `freshen run` builds {into} whole from the query while it is empty (one INSERT … SELECT, in a snapshot taken after the slot), then keeps it fresh key by key: {then}."
        ));
    }
    notes.push(
        "Then `freshen check -c` this file: wal_level, privileges, each table's replica identity, indexes."
            .to_string(),
    );
    Ok(Starter {
        source: format!(
            "[source]\nkind = \"postgres\"\nurl = \"${{{url_var}}}\"\nslot = \"{slot}\"\npublication = \"{slot}\"\n"
        ),
        create,
        notes,
        fixes,
    })
}

/// A materialized view's defining SELECT and the columns of its unique index (the key
/// `REFRESH … CONCURRENTLY` needs; the smallest, if several), for `freshen init
/// --from-matview`.
pub async fn matview(client: &Client, name: &str) -> Result<freshen::plug::Imported, Vec<String>> {
    let fail = |what: &str, e: &dyn std::fmt::Display| vec![format!("{name}: {what}: {e}")];
    let row = client
        .query_opt(
            "SELECT c.oid, n.nspname::text, c.relname::text, pg_get_viewdef(c.oid, true) \
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE c.oid = to_regclass($1) AND c.relkind = 'm'",
            &[&name],
        )
        .await
        .map_err(|e| fail("cannot read the catalog", &e))?
        .ok_or_else(|| {
            vec![format!(
                "{name}: no such materialized view (write it as schema.name, as psql's \\dm lists it)"
            )]
        })?;
    let oid: u32 = row.get(0);
    let (schema, relname, def): (String, String, String) = (row.get(1), row.get(2), row.get(3));
    let keys = client
        .query(
            "SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY k(n, o) \
                          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o) \
               FROM pg_index i \
              WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL \
              ORDER BY i.indnatts, i.indexrelid",
            &[&oid],
        )
        .await
        .map_err(|e| fail("cannot read its indexes", &e))?;
    let Some(key) = keys.first().map(|r| r.get::<_, Vec<String>>(0)) else {
        return Err(vec![format!(
            "{name}: the materialized view has no unique index on plain columns, so its key is not known (REFRESH … CONCURRENTLY needs one too): create one, or give --key"
        )]);
    };
    Ok(freshen::plug::Imported {
        schema,
        name: relname,
        query: keyed::trim(&def).to_owned(),
        key,
    })
}

/// For `freshen init --fix-identity`: each of `statements` on its own, in order (an
/// index built `CONCURRENTLY` cannot run in a transaction); what ran, or the statement
/// that failed, why, and what ran before it (not undone: there is no transaction).
pub async fn run_each(client: &Client, statements: &[String]) -> Result<Vec<String>, Vec<String>> {
    let mut done = Vec::new();
    for sql in statements {
        client.batch_execute(sql).await.map_err(|e| {
            vec![format!(
                "{sql}: {} (ran before it: {})",
                crate::error::describe(&e),
                if done.is_empty() {
                    "nothing".to_owned()
                } else {
                    done.join(" ")
                }
            )]
        })?;
        done.push(sql.clone());
    }
    Ok(done)
}

/// Runs a starting file's statements in one transaction: the table only if missing,
/// the publication only if no publication of that name exists. Returns what was done.
pub async fn create(
    client: &mut Client,
    statements: &[String],
) -> Result<Vec<String>, Vec<String>> {
    let fail = |what: &str, e: &dyn std::fmt::Display| vec![format!("{what}: {e}")];
    let tx = client
        .transaction()
        .await
        .map_err(|e| fail("cannot begin", &crate::error::describe(&e)))?;
    let mut done = Vec::new();
    for sql in statements {
        if let Some(rest) = sql.strip_prefix("CREATE PUBLICATION ") {
            let publication = rest.split_whitespace().next().unwrap_or_default();
            let exists: bool = tx
                .query_one(
                    "SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)",
                    &[&publication],
                )
                .await
                .map_err(|e| fail("cannot read the publications", &crate::error::describe(&e)))?
                .get(0);
            if exists {
                done.push(format!("publication {publication} exists: left as it is"));
                continue;
            }
        }
        tx.batch_execute(sql)
            .await
            .map_err(|e| fail(sql, &crate::error::describe(&e)))?;
        done.push(sql.clone());
    }
    tx.commit()
        .await
        .map_err(|e| fail("cannot commit", &crate::error::describe(&e)))?;
    Ok(done)
}
