//! What `freshen check` asks of PostgreSQL: a source set up for logical replication
//! (wal_level, privilege, slot, publication, replica identities) and rebuild statements
//! that prepare with the view's key. Every finding says what to do.

pub mod depends;
pub(crate) mod identity;
pub(crate) mod toast;

use std::fmt;

use freshen::plug::{Finding, Level, Plan, ViewSpec};
use tokio_postgres::Client;
use tokio_postgres::types::{Kind, Type};

use crate::PgError;
use crate::capture::settings::{PgSourceSettings, PublicationChoice, SlotChoice};
use crate::error::ErrorKind;
use crate::{PgAdmin, Pool, TableName, quote_ident};

pub use crate::target::merge::missing_params;

/// A slot further behind than this is reported: an abandoned pipeline retains WAL.
pub const LAG_WARNING_BYTES: u64 = 1 << 30;

/// The source's findings for `plan`.
pub(crate) async fn source(s: &PgSourceSettings, plan: &Plan) -> Vec<Finding> {
    let mut out = Vec::new();
    let subject = s.url.redacted();
    let conn = match s.connection() {
        Ok(c) => c,
        Err(e) => return vec![Finding::error("source", subject, e.to_string())],
    };
    let admin = match PgAdmin::connect(&conn).await {
        Ok(a) => a,
        Err(e) => {
            return vec![Finding::error(
                "source",
                subject,
                format!("cannot connect: {e}"),
            )];
        }
    };
    out.push(match admin.wal_level().await {
        Ok(l) if l == "logical" => Finding::ok("wal_level", &subject, "logical"),
        Ok(l) => Finding::error(
            "wal_level",
            &subject,
            format!("wal_level is {l}; logical replication needs `wal_level = logical` in postgresql.conf and a restart"),
        ),
        Err(e) => Finding::error("wal_level", &subject, e.to_string()),
    });
    out.push(match admin.can_replicate().await {
        Ok(true) => Finding::ok(
            "privilege",
            &subject,
            format!("{} may replicate", conn.user),
        ),
        Ok(false) => Finding::error(
            "privilege",
            &subject,
            format!(
                "role {} lacks REPLICATION: ALTER ROLE {} WITH REPLICATION",
                conn.user,
                quote_ident(&conn.user)
            ),
        ),
        Err(e) => Finding::error("privilege", &subject, e.to_string()),
    });
    out.push(slot(&admin, &s.slot, s.slot_mode).await);
    let tables: Vec<TableName> = plan
        .tables
        .iter()
        .map(|(schema, table)| TableName::new(schema, table))
        .collect();
    if let Some(f) = publication(&admin, s, &tables).await {
        out.push(f);
    }
    let patterns = s.patterns();
    out.extend(selection(&admin, s, &patterns).await);
    let mut published = tables.clone();
    match admin.published_by(&patterns).await {
        Ok(more) => published.extend(more.into_iter().filter(|t| !tables.contains(t))),
        Err(e) => out.push(Finding::error("tables", &subject, e.to_string())),
    }
    out.extend(publication_safety(&admin, s, &tables, &published).await);
    out.extend(crate::check::identity::findings(&admin, plan).await);
    if plan.changefeed {
        out.extend(partial_updates(&admin, &tables).await);
    }
    out
}

/// What each pattern entry of `[source] tables` selects now, and whether the
/// publication does (or can be made to) follow it as tables appear.
async fn selection(
    admin: &PgAdmin,
    s: &PgSourceSettings,
    patterns: &[crate::TablePattern],
) -> Vec<Finding> {
    let mut out = Vec::new();
    if patterns.is_empty() {
        return out;
    }
    for p in patterns {
        let subject = format!("tables {:?}", p.to_string());
        match admin.selected_tables(std::slice::from_ref(p)).await {
            Ok(now) if now.is_empty() => out.push(Finding::warning(
                "tables",
                subject,
                "selects no table now (tables created later are discovered)",
            )),
            Ok(now) => out.push(Finding::ok(
                "tables",
                subject,
                format!(
                    "selects {} table(s) now: {}; tables created later are discovered",
                    now.len(),
                    now.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
            Err(e) => out.push(Finding::error("tables", subject, e.to_string())),
        }
    }
    let name = &s.publication;
    let exists = match admin.publication(name).await {
        Ok(p) => p.is_some(),
        Err(e) => {
            out.push(Finding::error("publication", name, e.to_string()));
            return out;
        }
    };
    if exists {
        match admin.unpublished_patterns(name, patterns).await {
            Ok(fixes) if fixes.is_empty() => out.push(Finding::ok(
                "publication",
                name,
                "follows the patterns: tables created later are published from their first row",
            )),
            Ok(fixes) => out.push(Finding::error("publication", name, fixes.join("; "))),
            Err(e) => out.push(Finding::error("publication", name, e.to_string())),
        }
    } else if s.publication_mode == PublicationChoice::Create {
        match admin.is_superuser().await {
            Ok(true) => {}
            Ok(false) => out.push(Finding::error(
                "privilege",
                name,
                format!(
                    "[source] tables patterns need a publication FOR {}, which only a superuser may create: have one create it (CREATE PUBLICATION {} FOR {} WITH (publish_via_partition_root = true)) and set publication_mode = \"existing\", or list the tables by name",
                    if patterns.contains(&crate::TablePattern::All) { "ALL TABLES" } else { "TABLES IN SCHEMA" },
                    quote_ident(name),
                    if patterns.contains(&crate::TablePattern::All) {
                        "ALL TABLES".to_owned()
                    } else {
                        let mut schemas: Vec<String> = patterns
                            .iter()
                            .filter_map(|p| p.schema_name().map(quote_ident))
                            .collect();
                        schemas.dedup();
                        format!("TABLES IN SCHEMA {}", schemas.join(", "))
                    }
                ),
            )),
            Err(e) => out.push(Finding::error("privilege", name, e.to_string())),
        }
    }
    out
}

async fn slot(admin: &PgAdmin, slot: &str, mode: SlotChoice) -> Finding {
    match admin.slot(slot).await {
        Ok(None) => match mode {
            SlotChoice::Existing => Finding::error(
                "slot",
                slot,
                "does not exist and slot_mode = \"existing\": create it, or use slot_mode = \"create\"",
            ),
            SlotChoice::Temporary => Finding::ok("slot", slot, "temporary: created per session"),
            SlotChoice::Create => Finding::ok("slot", slot, "will be created"),
        },
        Ok(Some(info)) if info.is_lost() => Finding::error(
            "slot",
            slot,
            "was invalidated by the server (wal_status = lost): drop it with `freshen drop`, run again, and let the reconcile sweep rebuild",
        ),
        Ok(Some(info)) => {
            let lag = info.lag_bytes.unwrap_or(0);
            if info.active {
                Finding::warning(
                    "slot",
                    slot,
                    format!(
                        "is in use by process {} — another freshen may be running on it",
                        info.active_pid.map_or("?".into(), |p| p.to_string())
                    ),
                )
            } else if lag > LAG_WARNING_BYTES {
                Finding::warning(
                    "slot",
                    slot,
                    format!(
                        "exists, is idle and retains {} MiB of WAL: start `freshen run`, or `freshen drop` it if the pipeline is abandoned",
                        lag >> 20
                    ),
                )
            } else {
                Finding::ok("slot", slot, format!("exists, {lag} bytes behind"))
            }
        }
        Err(e) => Finding::error("slot", slot, e.to_string()),
    }
}

fn quoted_list(tables: &[TableName]) -> String {
    tables
        .iter()
        .map(TableName::quoted)
        .collect::<Vec<_>>()
        .join(", ")
}

async fn publication(
    admin: &PgAdmin,
    s: &PgSourceSettings,
    tables: &[TableName],
) -> Option<Finding> {
    let name = &s.publication;
    Some(match admin.publication(name).await {
        Ok(None) if s.publication_mode == PublicationChoice::Existing => Finding::error(
            "publication",
            name,
            format!(
                "does not exist and publication_mode = \"existing\": CREATE PUBLICATION {} FOR TABLE {}",
                quote_ident(name),
                quoted_list(tables)
            ),
        ),
        Ok(None) => Finding::ok(
            "publication",
            name,
            "will be created for the watched tables",
        ),
        Ok(Some(_)) => match admin.coverage(name, tables).await {
            Ok(Some(c)) if c.is_complete() => Finding::ok(
                "publication",
                name,
                "covers every watched table and operation",
            ),
            Ok(Some(c))
                if c.missing_operations.is_empty()
                    && s.publication_mode == PublicationChoice::Create
                    && admin.publication_is_ours(name).await.unwrap_or(false) =>
            {
                Finding::ok(
                    "publication",
                    name,
                    format!(
                        "will be extended with {} (freshen created it)",
                        c.missing_tables
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            }
            Ok(Some(c)) => {
                let mut what = Vec::new();
                if !c.missing_tables.is_empty() {
                    what.push(format!(
                        "lacks {}: ALTER PUBLICATION {} ADD TABLE {}",
                        c.missing_tables
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", "),
                        quote_ident(name),
                        quoted_list(&c.missing_tables)
                    ));
                }
                if !c.missing_operations.is_empty() {
                    what.push(format!(
                        "does not publish {}",
                        c.missing_operations.join(", ")
                    ));
                }
                Finding::error("publication", name, what.join("; "))
            }
            Ok(None) => return None,
            Err(e) => Finding::error("publication", name, e.to_string()),
        },
        Err(e) => Finding::error("publication", name, e.to_string()),
    })
}

/// Tables whose changefeed events can lack an unchanged large value: under a replica
/// identity other than FULL an UPDATE does not send a TOASTed column it left alone, and
/// the changefeed fills it from the row's last image only when it has one.
async fn partial_updates(admin: &PgAdmin, tables: &[TableName]) -> Vec<Finding> {
    let advice = match admin.partial_updates(tables).await {
        Ok(a) => a,
        Err(e) => {
            return vec![Finding::error(
                "changefeed",
                "replica identity",
                e.to_string(),
            )];
        }
    };
    if advice.is_empty() {
        return vec![Finding::ok(
            "changefeed",
            "replica identity",
            "every captured table sends whole rows (or has no out-of-line columns)",
        )];
    }
    advice
        .into_iter()
        .map(|a| {
            Finding::warning(
                "changefeed",
                &a.table,
                format!(
                    "an UPDATE that leaves {} alone does not send them: the changefeed fills them from the row's last image, and marks the event \"partial\" when it has none; to always send whole rows: {}",
                    a.columns.join(", "),
                    a.fix
                ),
            )
        })
        .collect()
}

/// What a view asks of its rebuild statements, for [`statements`].
#[derive(Debug, Clone, Copy)]
pub struct StatementShape<'a> {
    /// The view's name, for the findings' subjects.
    pub view: &'a str,
    /// Parts of the view's key.
    pub arity: usize,
    /// The key's columns as the first watch names them (for the message).
    pub key_columns: &'a [String],
    /// Whether keys are passed as arrays of parts (`rebuild_batch`).
    pub batch: bool,
}

/// Prepares every rebuild statement and the reconcile query of a view on the target,
/// checking parameters and columns against the view's key.
pub async fn statements(
    pool: &Pool,
    shape: StatementShape<'_>,
    rebuild: &[String],
    reconcile: Option<&str>,
) -> Vec<Finding> {
    let view = shape.view;
    let arity = shape.arity;
    let client = match crate::pool::client(pool).await {
        Ok(c) => c,
        Err(e) => {
            return vec![Finding::error(
                "target",
                view,
                format!("cannot connect: {e}"),
            )];
        }
    };
    let mut out = Vec::new();
    for (i, sql) in rebuild.iter().enumerate() {
        let subject = format!("view {view} rebuild[{i}]");
        out.push(match client.prepare(sql).await {
            Err(e) => Finding::error("statement", subject, format!("does not prepare: {}", db_message(&e))),
            Ok(stmt) => {
                let params = stmt.params();
                let non_array: Vec<String> = params
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| !matches!(t.kind(), Kind::Array(_)))
                    .map(|(n, t)| format!("${} is {}", n + 1, t.name()))
                    .collect();
                if params.len() != arity {
                    Finding::error(
                        "statement",
                        subject,
                        format!(
                            "takes {} parameter(s) but the view's key has {arity} part(s) ({}): use $1..${arity}",
                            params.len(),
                            shape.key_columns.join(", ")
                        ),
                    )
                } else if shape.batch && !non_array.is_empty() {
                    Finding::error(
                        "statement",
                        subject,
                        format!(
                            "with rebuild_batch each parameter is an array of key parts (e.g. `= ANY($1)`), but {}",
                            non_array.join(", ")
                        ),
                    )
                } else {
                    Finding::ok("statement", subject, format!("prepares with {arity} parameter(s)"))
                }
            }
        });
    }
    if let Some(keys) = reconcile {
        let subject = format!("view {view} reconcile.keys");
        out.push(match client.prepare(keys).await {
            Err(e) => Finding::error(
                "statement",
                subject,
                format!("does not prepare: {}", db_message(&e)),
            ),
            Ok(stmt) if !stmt.params().is_empty() => {
                Finding::error("statement", subject, "must not take parameters")
            }
            Ok(stmt) if stmt.columns().len() != arity => Finding::error(
                "statement",
                subject,
                format!(
                    "returns {} column(s) but the view's key has {arity} part(s)",
                    stmt.columns().len()
                ),
            ),
            Ok(_) => Finding::ok(
                "statement",
                subject,
                format!("lists keys of {arity} part(s)"),
            ),
        });
    }
    out
}

/// The server's own message for a SQL error (tokio-postgres' Display is just "db error").
pub fn db_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut m = db.message().to_string();
            if let Some(hint) = db.hint() {
                m.push_str(&format!(" (hint: {hint})"));
            }
            m
        }
        None => e.to_string(),
    }
}

/// Publication safety and the privileges to create or extend the publication.
/// `published`: every table the publication publishes (`tables`, and what pattern
/// entries publish as a whole), each of which must replicate UPDATE and DELETE.
async fn publication_safety(
    admin: &PgAdmin,
    s: &PgSourceSettings,
    tables: &[TableName],
    published: &[TableName],
) -> Vec<Finding> {
    let name = &s.publication;
    let client = match admin.pool().get().await {
        Ok(c) => c,
        Err(e) => return vec![Finding::error("publication", name, e.to_string())],
    };
    let mut out = Vec::new();
    match unpublishable(&client, published).await {
        Ok(bad) if bad.is_empty() => out.push(Finding::ok(
            "publication",
            name,
            "every published table can replicate UPDATE and DELETE",
        )),
        Ok(bad) => {
            for b in bad {
                out.push(Finding::error(
                    "publication",
                    b.table.to_string(),
                    format!("freshen refuses to publish it: {b}"),
                ));
            }
        }
        Err(e) => out.push(Finding::error("publication", name, e.to_string())),
    }
    // Creating the publication, or adding tables to it, needs ownership of the tables.
    let to_add: Vec<TableName> = match admin.coverage(name, tables).await {
        Ok(None) if s.publication_mode == PublicationChoice::Create => tables.to_vec(),
        Ok(Some(c)) => c.missing_tables,
        _ => Vec::new(),
    };
    if !to_add.is_empty() {
        match publication_privileges(&client, &to_add).await {
            Ok(lacks) => {
                for l in lacks {
                    out.push(Finding::error("privilege", name, l));
                }
            }
            Err(e) => out.push(Finding::error("privilege", name, e.to_string())),
        }
    }
    out
}

/// A table (or a partition of a watched partitioned table) whose UPDATE and DELETE
/// would fail once a publication publishes them: PostgreSQL refuses them for a table
/// whose replica identity is NOTHING, or DEFAULT without a primary key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpublishable {
    /// The watched table.
    pub table: TableName,
    /// The partition that lacks the identity, when it is one of `table`'s.
    pub partition: Option<TableName>,
    /// Why, and the exact statement that fixes it.
    pub fix: String,
}

impl fmt::Display for Unpublishable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.partition {
            Some(p) => write!(f, "{} (partition {p}): {}", self.table, self.fix),
            None => write!(f, "{}: {}", self.table, self.fix),
        }
    }
}

/// Every leaf of each table's partition tree (the table itself when not partitioned)
/// whose replica identity cannot carry UPDATE and DELETE. A missing table is an error.
pub async fn unpublishable(
    client: &Client,
    tables: &[TableName],
) -> Result<Vec<Unpublishable>, PgError> {
    const SQL: &str = "SELECT n.nspname::text, c.relname::text, c.relreplident::text, \
        EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary), \
        EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident), \
        c.oid = $1::text::regclass \
        FROM (SELECT relid FROM pg_partition_tree($1::text::regclass) \
              UNION SELECT $1::text::regclass) t \
        JOIN pg_class c ON c.oid = t.relid \
        JOIN pg_namespace n ON n.oid = c.relnamespace \
        WHERE c.relkind = 'r'";
    let mut out = Vec::new();
    for table in tables {
        let rows = client.query(SQL, &[&table.quoted()]).await.map_err(|e| {
            match e.code().map(|c| c.code()) {
                Some("42P01") => {
                    PgError::new(ErrorKind::Setup, format!("table {table} does not exist"))
                }
                _ => PgError::sql(format!("cannot read the replica identity of {table}"), e),
            }
        })?;
        for r in rows {
            let leaf = TableName::new(r.get::<_, String>(0), r.get::<_, String>(1));
            let identity: String = r.get(2);
            let (has_pk, has_index, itself) = (
                r.get::<_, bool>(3),
                r.get::<_, bool>(4),
                r.get::<_, bool>(5),
            );
            let why = match identity.as_str() {
                "n" => "has REPLICA IDENTITY NOTHING",
                "d" if !has_pk => "has no primary key (REPLICA IDENTITY DEFAULT)",
                "i" if !has_index => "has REPLICA IDENTITY USING INDEX but no such index",
                _ => continue,
            };
            let fix = format!(
                "{why}: once published, the application's UPDATE and DELETE on it fail \
                 (\"cannot update table … because it does not have a replica identity\"). \
                 Run: ALTER TABLE {} REPLICA IDENTITY FULL (or add a primary key)",
                leaf.quoted()
            );
            out.push(Unpublishable {
                table: table.clone(),
                partition: (!itself).then_some(leaf),
                fix,
            });
        }
    }
    Ok(out)
}

/// One error for [`unpublishable`] tables, refusing to publish them.
pub fn refuse_to_publish(publication: &str, tables: &[Unpublishable]) -> PgError {
    PgError::new(
        ErrorKind::Setup,
        format!(
            "refusing to {} publication {} with UPDATE and DELETE of tables that cannot replicate them: {}",
            "create or use",
            quote_ident(publication),
            tables
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ),
    )
}

/// Whether each table is partitioned (`relkind = 'p'`); a missing table is not.
pub async fn partitioned(client: &Client, tables: &[TableName]) -> Result<Vec<bool>, PgError> {
    let mut out = Vec::with_capacity(tables.len());
    for t in tables {
        let row = client
            .query_opt(
                "SELECT c.relkind = 'p' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&t.schema, &t.name],
            )
            .await
            .map_err(|e| PgError::sql(format!("cannot read table {t}"), e))?;
        out.push(row.is_some_and(|r| r.get(0)));
    }
    Ok(out)
}

/// A column of a table: its name and type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Column name.
    pub name: String,
    /// Its type.
    pub ty: TypeInfo,
}

/// A type as `check` compares it: the name PostgreSQL prints and its category
/// (`pg_type.typcategory`: `N` numeric, `S` string, `D` date/time, `U` user, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeInfo {
    /// `format_type` of the type.
    pub name: String,
    /// Its OID.
    pub oid: u32,
    /// `typcategory`.
    pub category: char,
}

/// The columns of `table`, in order; an error when it does not exist.
pub async fn columns(client: &Client, table: &TableName) -> Result<Vec<Column>, PgError> {
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.atttypid, t.typcategory::text \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&table.quoted()],
        )
        .await
        .map_err(|e| match e.code().map(|c| c.code()) {
            Some("42P01") => PgError::new(ErrorKind::Setup, format!("table {table} does not exist")),
            _ => PgError::sql(format!("cannot read the columns of {table}"), e),
        })?;
    Ok(rows
        .iter()
        .map(|r| Column {
            name: r.get(0),
            ty: TypeInfo {
                name: r.get(1),
                oid: r.get(2),
                category: r.get::<_, String>(3).chars().next().unwrap_or('U'),
            },
        })
        .collect())
}

/// The category and printed name of a parameter or result type.
pub async fn type_info(client: &Client, ty: &Type) -> Result<TypeInfo, PgError> {
    let row = client
        .query_one(
            "SELECT format_type($1, NULL), typcategory::text FROM pg_type WHERE oid = $1",
            &[&ty.oid()],
        )
        .await
        .map_err(|e| PgError::sql("cannot read a type", e))?;
    Ok(TypeInfo {
        name: row.get(0),
        oid: ty.oid(),
        category: row.get::<_, String>(1).chars().next().unwrap_or('U'),
    })
}

/// Whether a key part read as `column` (its text form) parses as a value of `param`:
/// `None` when it does; otherwise why not. Text parameters take anything; within one
/// category the server's input function decides, so only crossing categories (a text
/// key bound to a bigint) is refused.
pub fn key_fits(column: &TypeInfo, param: &TypeInfo) -> Option<String> {
    if column.oid == param.oid || param.category == 'S' || column.category == param.category {
        return None;
    }
    Some(format!(
        "a {} key is bound to a {} parameter: its values would be rejected at run time",
        column.name, param.name
    ))
}

/// The closest of `candidates` to `name` (for "did you mean"), if any is close.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (distance(name, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// What the role lacks to create a publication for `tables` (CREATE on the database,
/// ownership of every table); empty when nothing. A superuser lacks nothing.
/// (REPLICATION is [`PgAdmin::can_replicate`](crate::PgAdmin::can_replicate).)
pub async fn publication_privileges(
    client: &Client,
    tables: &[TableName],
) -> Result<Vec<String>, PgError> {
    let row = client
        .query_one(
            "SELECT current_user::text, r.rolsuper, r.rolreplication, \
                    has_database_privilege(current_database(), 'CREATE'), current_database()::text \
             FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await
        .map_err(|e| PgError::sql("cannot read the role's privileges", e))?;
    let (user, superuser, replication, create, db): (String, bool, bool, bool, String) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    if superuser {
        return Ok(Vec::new());
    }
    let _ = replication;
    let mut out = Vec::new();
    if !create {
        out.push(format!(
            "role {user} may not create a publication in database {db}: GRANT CREATE ON DATABASE {} TO {}",
            quote_ident(&db),
            quote_ident(&user)
        ));
    }
    for t in tables {
        let owner = client
            .query_opt(
                "SELECT pg_has_role(c.relowner, 'USAGE'), pg_get_userbyid(c.relowner)::text \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&t.schema, &t.name],
            )
            .await
            .map_err(|e| PgError::sql(format!("cannot read the owner of {t}"), e))?;
        if let Some(r) = owner
            && !r.get::<_, bool>(0)
        {
            let owner: String = r.get(1);
            out.push(format!(
                "role {user} does not own {t} (owner: {owner}), so it cannot add it to a publication: \
                 create the publication as {owner} (CREATE PUBLICATION … FOR TABLE {}) and set \
                 publication_mode = \"existing\", or GRANT {} TO {}",
                t.quoted(),
                quote_ident(&owner),
                quote_ident(&user)
            ));
        }
    }
    Ok(out)
}

/// A view as the checks below read it: its tables parsed, borrowed from the
/// [`ViewSpec`] (a `query` is its one rebuild statement).
#[derive(Debug, Clone)]
struct Checked<'a> {
    /// The view's name.
    pub name: &'a str,
    /// Its watched tables.
    pub watch: Vec<CheckedWatch<'a>>,
    /// The rebuild statements.
    pub rebuild: Vec<&'a str>,
    /// Whether the rebuild statements take arrays of keys (`rebuild_batch`).
    pub batch: bool,
    /// Tables the view reads without watching them, on purpose.
    pub static_tables: Vec<TableName>,
    /// Whether it has a reconcile sweep.
    pub reconcile: bool,
}

/// A watched table of a [`Checked`] view.
#[derive(Debug, Clone)]
struct CheckedWatch<'a> {
    /// The table.
    pub table: TableName,
    /// Its key columns (`$1..$n`).
    pub key: &'a [String],
    /// The fan-out statement, for an entry that maps its rows to the view's keys.
    pub keys: Option<&'a str>,
}

impl<'a> Checked<'a> {
    fn of(view: &'a ViewSpec) -> Self {
        Checked {
            name: &view.name,
            watch: view
                .watch
                .iter()
                .map(|w| CheckedWatch {
                    table: TableName::new(&w.schema, &w.table),
                    key: &w.key,
                    keys: w.keys.as_deref(),
                })
                .collect(),
            rebuild: match &view.query {
                Some(q) => vec![q.query.as_str()],
                None => view.rebuild.iter().map(String::as_str).collect(),
            },
            batch: view.rebuild_batch.is_some(),
            static_tables: view
                .static_tables
                .iter()
                .map(|(s, t)| TableName::new(s, t))
                .collect(),
            reconcile: view.reconcile.is_some(),
        }
    }
}

fn finding(level: Level, check: &'static str, subject: String, message: String) -> Finding {
    Finding::new(level, check, subject, message)
}

/// Everything PostgreSQL can tell about a view before it runs: its key columns exist
/// (with a did-you-mean), their types suit the parameters every statement binds them
/// to, its fan-out statements return its key, every relation its statements read is
/// watched or declared static (with the missing watch entry proposed), and whether it
/// has a start-up backfill.
pub async fn check_view(client: &Client, view: &ViewSpec) -> Vec<Finding> {
    let view = &Checked::of(view);
    let mut out = Vec::new();
    let name = view.name;
    if !view.reconcile {
        out.push(finding(
            Level::Warning,
            "reconcile",
            format!("view {name}"),
            "has no `reconcile`: no start-up backfill (rows that exist before the first change stay missing) and no TRUNCATE heal (a truncated watched table leaves its rows); add reconcile = { every = \"1h\", keys = \"SELECT …\" }".into(),
        ));
    }
    // Parameter types of each rebuild statement ($n of a batch statement: its element).
    let mut rebuild_params: Vec<Vec<TypeInfo>> = Vec::new();
    for sql in &view.rebuild {
        let mut types = Vec::new();
        if let Ok(stmt) = client.prepare(sql).await {
            for ty in stmt.params() {
                let ty = match ty.kind() {
                    tokio_postgres::types::Kind::Array(e) if view.batch => e.clone(),
                    _ => ty.clone(),
                };
                if let Ok(t) = type_info(client, &ty).await {
                    types.push(t);
                }
            }
        }
        rebuild_params.push(types);
    }
    let mut keyed = Vec::new();
    for w in &view.watch {
        let subject = format!("view {name} watch {}", w.table);
        let cols = match columns(client, &w.table).await {
            Ok(c) => c,
            Err(e) => {
                out.push(finding(Level::Error, "key_column", subject, e.to_string()));
                continue;
            }
        };
        let mut key_types = Vec::new();
        for k in w.key {
            match cols.iter().find(|c| c.name == *k) {
                Some(c) => key_types.push(c.ty.clone()),
                None => {
                    let hint = closest(k, cols.iter().map(|c| c.name.as_str()))
                        .map(|c| format!(" (did you mean `{c}`?)"))
                        .unwrap_or_default();
                    out.push(finding(
                        Level::Error,
                        "key_column",
                        subject.clone(),
                        format!(
                            "{} has no column `{k}`{hint}; its columns: {}",
                            w.table,
                            cols.iter()
                                .map(|c| c.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
            }
        }
        if key_types.len() != w.key.len() {
            continue;
        }
        match w.keys {
            None => {
                keyed.push(crate::check::depends::KeyedTable {
                    table: w.table.clone(),
                    key: w.key.to_vec(),
                });
                for (i, params) in rebuild_params.iter().enumerate() {
                    type_findings(
                        &mut out,
                        &subject,
                        &format!("rebuild[{i}]"),
                        w.key,
                        &key_types,
                        params,
                    );
                }
            }
            Some(sql) => {
                fanout_findings(
                    client,
                    &mut out,
                    &subject,
                    w,
                    &key_types,
                    sql,
                    &rebuild_params,
                    view.batch,
                )
                .await;
            }
        }
    }
    // Dependencies: every relation read must be watched or static.
    let watched: Vec<&TableName> = view.watch.iter().map(|w| &w.table).collect();
    let mut statements: Vec<(String, &str)> = view
        .rebuild
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("rebuild[{i}]"), *s))
        .collect();
    for w in &view.watch {
        if let Some(k) = w.keys {
            statements.push((format!("keys of {}", w.table), k));
        }
    }
    let mut found = Vec::new();
    let mut written = Vec::new();
    for (what, sql) in &statements {
        match crate::check::depends::relations(client, sql).await {
            Ok(r) => {
                written.extend(r.writes.clone());
                for f in &r.opaque_functions {
                    out.push(finding(
                        Level::Warning,
                        "depends",
                        format!("view {name} {what}"),
                        format!(
                            "calls {f}, whose body PostgreSQL does not track: the tables it reads cannot be checked. Watch them (or list them in `static`), or write it as a SQL-standard function (BEGIN ATOMIC … END) so check can see them"
                        ),
                    ));
                }
                found.push((what.clone(), r.reads));
            }
            Err(e) => out.push(finding(
                Level::Error,
                "depends",
                format!("view {name} {what}"),
                format!("cannot tell which tables it reads: {e}"),
            )),
        }
    }
    let mut reported: Vec<TableName> = Vec::new();
    for (what, reads) in found {
        let subject = format!("view {name} {what}");
        let mut missing = Vec::new();
        for t in reads {
            if watched.contains(&&t) || view.static_tables.contains(&t) || written.contains(&t) {
                continue;
            }
            missing.push(t);
        }
        if missing.is_empty() {
            out.push(finding(
                Level::Ok,
                "depends",
                subject,
                "reads only watched or static tables".into(),
            ));
            continue;
        }
        for t in missing {
            if reported.contains(&t) {
                continue;
            }
            reported.push(t.clone());
            let proposal = match crate::check::depends::propose_watch(client, &t, &keyed).await {
                Ok(Some(p)) => format!("Add to the view's watch: {p}"),
                _ => "Add a watch entry for it (with `keys` mapping its rows to the view's key)"
                    .to_string(),
            };
            out.push(finding(
                Level::Error,
                "depends",
                subject.clone(),
                format!(
                    "reads {t}, which the view neither watches nor lists as static: a change to it would leave the view stale. {proposal}; or, if it never changes (or its changes are deliberately ignored), static = [\"{t}\"]"
                ),
            ));
        }
    }
    out
}

fn type_findings(
    out: &mut Vec<Finding>,
    subject: &str,
    statement: &str,
    key: &[String],
    key_types: &[TypeInfo],
    params: &[TypeInfo],
) {
    for (j, (col, ty)) in key.iter().zip(key_types).enumerate() {
        let Some(param) = params.get(j) else { continue };
        if let Some(why) = key_fits(ty, param) {
            out.push(finding(
                Level::Error,
                "key_type",
                subject.to_owned(),
                format!(
                    "`{col}` ({}) is bound to ${} of {statement}, which PostgreSQL reads as {}: {why}; cast in the statement (${}::{}) or key on a column of that type",
                    ty.name,
                    j + 1,
                    param.name,
                    j + 1,
                    ty.name
                ),
            ));
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn fanout_findings(
    client: &Client,
    out: &mut Vec<Finding>,
    subject: &str,
    w: &CheckedWatch<'_>,
    key_types: &[TypeInfo],
    sql: &str,
    rebuild_params: &[Vec<TypeInfo>],
    batch: bool,
) {
    let stmt = match client.prepare(sql).await {
        Ok(s) => s,
        Err(e) => {
            out.push(finding(
                Level::Error,
                "fanout",
                subject.to_owned(),
                format!(
                    "the `keys` statement does not prepare: {}",
                    crate::error::describe(&e)
                ),
            ));
            return;
        }
    };
    if stmt.params().len() > w.key.len() {
        out.push(finding(
            Level::Error,
            "fanout",
            subject.to_owned(),
            format!(
                "the `keys` statement uses ${} but `key` names {} column(s) ({})",
                stmt.params().len(),
                w.key.len(),
                w.key.join(", ")
            ),
        ));
    }
    let mut params = Vec::new();
    for ty in stmt.params() {
        if let Ok(t) = type_info(client, ty).await {
            params.push(t);
        }
    }
    type_findings(
        out,
        subject,
        "the `keys` statement",
        w.key,
        key_types,
        &params,
    );
    // What it returns is bound to the rebuild statements as the view's key.
    let arity = rebuild_params.iter().map(Vec::len).max().unwrap_or(0);
    if stmt.columns().len() != arity && arity > 0 {
        out.push(finding(
            Level::Error,
            "fanout",
            subject.to_owned(),
            format!(
                "the `keys` statement returns {} column(s) but the view's key has {arity} part(s)",
                stmt.columns().len()
            ),
        ));
        return;
    }
    let names: Vec<String> = stmt.columns().iter().map(|c| c.name().to_owned()).collect();
    let mut returned = Vec::new();
    for c in stmt.columns() {
        if let Ok(t) = type_info(client, c.type_()).await {
            returned.push(t);
        }
    }
    if returned.len() == names.len() {
        for (i, params) in rebuild_params.iter().enumerate() {
            let _ = batch;
            type_findings(
                out,
                subject,
                &format!("rebuild[{i}]"),
                &names,
                &returned,
                params,
            );
        }
    }
    out.push(finding(
        Level::Ok,
        "fanout",
        subject.to_owned(),
        format!(
            "the `keys` statement maps {} to the view's key ({})",
            w.key.join(", "),
            names.join(", ")
        ),
    ));
}

/// A view rebuilt by `query`, as the checks below read it.
#[derive(Debug, Clone)]
struct CheckedQuery<'a> {
    /// The view's name.
    pub view: &'a str,
    /// The table the query's rows go into.
    pub into: TableName,
    /// The view's key columns (in the target, and `$1..$n`).
    pub key: &'a [String],
    /// The query.
    pub query: &'a str,
    /// Keys per statement.
    pub batch: usize,
    /// The watched tables that carry the view's key, with their key columns: where the
    /// query finds a batch's rows.
    pub sources: Vec<(TableName, &'a [String])>,
}

impl<'a> CheckedQuery<'a> {
    /// `None` for a view rebuilt by statements.
    fn of(view: &'a ViewSpec) -> Option<Self> {
        let q = view.query.as_ref()?;
        Some(CheckedQuery {
            view: &view.name,
            into: TableName::new(&q.into.0, &q.into.1),
            key: view.key(),
            query: &q.query,
            batch: view.rebuild_batch.unwrap_or(crate::DEFAULT_QUERY_BATCH),
            sources: view
                .direct()
                .map(|w| (TableName::new(&w.schema, &w.table), w.key.as_slice()))
                .collect(),
        })
    }
}

/// Everything PostgreSQL can tell about a query-mode view: the query prepares and takes
/// its batch as arrays, its output columns exist in the target (key columns included)
/// with types that can be written and compared, the target has a unique key, and each
/// watched table has an index leading with the key (every mismatch, each its own
/// finding).
pub async fn query_view(client: &Client, view: &ViewSpec) -> Vec<Finding> {
    let Some(spec) = &CheckedQuery::of(view) else {
        return Vec::new();
    };
    let subject = format!("view {} query", spec.view);
    let mut out = Vec::new();
    match crate::target::query::plan(client, &spec.into, spec.key, spec.query).await {
        Err(e) => out.push(Finding::error("query", subject.clone(), e.to_string())),
        Ok(Err(problems)) => {
            for p in problems {
                out.push(Finding::error("query", subject.clone(), p));
            }
        }
        Ok(Ok(_)) => out.push(Finding::ok(
            "query",
            subject.clone(),
            format!(
                "writes into {} keyed on ({}), up to {} key(s) per statement; rows whose values did not change are not rewritten",
                spec.into,
                spec.key.join(", "),
                spec.batch
            ),
        )),
    }
    out.extend(index_findings(client, spec).await);
    out
}

/// [`query_view`] for a query that runs on `source` and whose rows are written into a
/// separate `target` database: the query's output is compared with the target table
/// there, and the watched tables' indexes are looked up on the source.
pub async fn query_view_across(source: &Client, target: &Client, view: &ViewSpec) -> Vec<Finding> {
    let Some(spec) = &CheckedQuery::of(view) else {
        return Vec::new();
    };
    let subject = format!("view {} query", spec.view);
    let mut out = Vec::new();
    match crate::target::query::plan_across(source, target, &spec.into, spec.key, spec.query).await {
        Err(e) => out.push(Finding::error("query", subject.clone(), e.to_string())),
        Ok(Err(problems)) => {
            for p in problems {
                out.push(Finding::error("query", subject.clone(), p));
            }
        }
        Ok(Ok(_)) => out.push(Finding::ok(
            "query",
            subject.clone(),
            format!(
                "reads the source and writes into {} in the target database, keyed on ({}), up to {} key(s) per statement; rows whose values did not change are not rewritten",
                spec.into,
                spec.key.join(", "),
                spec.batch
            ),
        )),
    }
    out.extend(index_findings(source, spec).await);
    out
}

/// Whether each watched table has an index leading with the view's key.
async fn index_findings(client: &Client, spec: &CheckedQuery<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for (table, key) in &spec.sources {
        let subject = format!("view {} watch {table}", spec.view);
        match crate::target::query::indexes(client, table).await {
            Err(e) => out.push(Finding::error("index", subject, e.to_string())),
            Ok(found) => match found.iter().find(|i| i.leads_with(key)) {
                Some(i) => out.push(Finding::ok(
                    "index",
                    subject,
                    format!(
                        "rebuilds find a key's rows through {}{}",
                        i.name,
                        if i.clustered {
                            " (the table is clustered on it)"
                        } else if !i.include.is_empty() {
                            " (covering)"
                        } else {
                            ""
                        }
                    ),
                )),
                None => out.push(Finding::warning(
                    "index",
                    subject,
                    format!(
                        "no index leads with ({k}): every rebuild reads the whole of {table}. CREATE INDEX ON {} ({k}) — or a covering one, ({k}) INCLUDE (the columns the query reads), which answers from the index alone once vacuumed (see BENCHMARKS.md, rebuild-index)",
                        table.quoted(),
                        k = key.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ")
                    ),
                )),
            },
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn did_you_mean() {
        let cols = ["id", "account_id", "plan_id", "seats"];
        assert_eq!(closest("acount_id", cols), Some("account_id"));
        assert_eq!(closest("seat", cols), Some("seats"));
        assert_eq!(closest("plan_di", cols), Some("plan_id"));
        assert_eq!(closest("zzzzzz", cols), None);
    }

    #[test]
    fn key_types() {
        let t = |name: &str, oid, category| TypeInfo {
            name: name.into(),
            oid,
            category,
        };
        let text = t("text", 25, 'S');
        let int8 = t("bigint", 20, 'N');
        let int4 = t("integer", 23, 'N');
        assert!(
            key_fits(&text, &int8).is_some(),
            "text into bigint fails at run time"
        );
        assert!(key_fits(&int8, &text).is_none());
        assert!(key_fits(&int4, &int8).is_none());
        assert!(key_fits(&int8, &int8).is_none());
    }
}
