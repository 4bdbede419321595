//! What a publication may hold and who may create it: tables whose UPDATE and DELETE
//! would fail once published, and the privileges creating or extending one needs.
//! Read by slot and publication administration and by `freshen check`.

use std::fmt;

use tokio_postgres::Client;

use crate::error::ErrorKind;
use crate::{PgError, TableName, quote_ident};

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
