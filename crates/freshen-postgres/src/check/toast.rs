//! Which tables need `REPLICA IDENTITY FULL` for an UPDATE to carry the whole row: for
//! `freshen check` when a changefeed publishes whole rows.
//!
//! Under the default replica identity, an UPDATE that leaves a large (TOASTed) value
//! unchanged does not send it. The changefeed fills such values from the row's last
//! event in its log; it has none for a row not changed since the changefeed started
//! (until a snapshot reads it) or whose events retention deleted, and then the event
//! says `"partial":true`. A table whose replica identity is FULL always sends whole
//! rows; a table without columns that can be stored out of line never leaves one out.
//!
//! [`PgAdmin::partial_updates`](crate::PgAdmin::partial_updates) runs
//! [`TOASTABLE_COLUMNS_SQL`] and passes the rows to [`needs_full_identity`] (pure).

use crate::quote_ident;

/// Lists, for the tables named in `$1` (a `text[]` of `schema.table`), the replica
/// identity (`relreplident`: `d` default, `n` nothing, `f` full, `i` index) and the
/// columns whose storage lets PostgreSQL move them out of line (every storage but
/// `plain`). Columns: `schema text`, `table text`, `identity text`, `columns text[]`.
pub const TOASTABLE_COLUMNS_SQL: &str = "\
SELECT n.nspname::text AS schema, c.relname::text AS table, c.relreplident::text AS identity, \
       coalesce(array_agg(a.attname::text ORDER BY a.attnum) \
                FILTER (WHERE a.attstorage <> 'p'), '{}') AS columns \
FROM pg_class c \
JOIN pg_namespace n ON n.oid = c.relnamespace \
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
WHERE n.nspname || '.' || c.relname = ANY($1::text[]) \
GROUP BY n.nspname, c.relname, c.relreplident \
ORDER BY 1, 2";

/// One row of [`TOASTABLE_COLUMNS_SQL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableStorage {
    /// The table's schema.
    pub schema: String,
    /// The table's name.
    pub table: String,
    /// `relreplident`: `d`, `n`, `f` or `i`.
    pub identity: String,
    /// Columns that may be stored out of line (TOAST).
    pub toastable: Vec<String>,
}

/// A table whose changefeed events can be partial, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityAdvice {
    /// `schema.table`.
    pub table: String,
    /// The columns an UPDATE may leave out.
    pub columns: Vec<String>,
    /// The statement that fixes it.
    pub fix: String,
}

impl std::fmt::Display for IdentityAdvice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: an UPDATE that leaves {} unchanged does not send {}; the changefeed fills \
             them from the row's last event, and marks the event \"partial\" when it has \
             none. For whole rows always: {}",
            self.table,
            self.columns.join(", "),
            if self.columns.len() == 1 {
                "it"
            } else {
                "them"
            },
            self.fix
        )
    }
}

/// The tables (of `tables`, rows of [`TOASTABLE_COLUMNS_SQL`]) that need
/// `REPLICA IDENTITY FULL` for every changefeed event to carry the whole row.
///
/// ```
/// use freshen_postgres::{TableStorage, needs_full_identity};
/// let docs = TableStorage {
///     schema: "public".into(),
///     table: "docs".into(),
///     identity: "d".into(),
///     toastable: vec!["body".into()],
/// };
/// let advice = needs_full_identity(&[docs]);
/// assert_eq!(advice[0].fix, "ALTER TABLE \"public\".\"docs\" REPLICA IDENTITY FULL;");
/// ```
pub fn needs_full_identity(tables: &[TableStorage]) -> Vec<IdentityAdvice> {
    tables
        .iter()
        .filter(|t| t.identity != "f" && !t.toastable.is_empty())
        .map(|t| IdentityAdvice {
            table: format!("{}.{}", t.schema, t.table),
            columns: t.toastable.clone(),
            fix: format!(
                "ALTER TABLE {}.{} REPLICA IDENTITY FULL;",
                quote_ident(&t.schema),
                quote_ident(&t.table)
            ),
        })
        .collect()
}

impl crate::PgAdmin {
    /// The tables of `tables` whose UPDATEs can leave unchanged large values out.
    pub async fn partial_updates(
        &self,
        tables: &[crate::TableName],
    ) -> Result<Vec<IdentityAdvice>, crate::PgError> {
        let names: Vec<String> = tables.iter().map(ToString::to_string).collect();
        let client = crate::pool::client(self.pool()).await?;
        let rows = client
            .query(TOASTABLE_COLUMNS_SQL, &[&names])
            .await
            .map_err(|e| crate::PgError::sql("cannot read the tables' storage", e))?;
        let storage: Vec<TableStorage> = rows
            .iter()
            .map(|r| TableStorage {
                schema: r.get(0),
                table: r.get(1),
                identity: r.get(2),
                toastable: r.get(3),
            })
            .collect();
        Ok(needs_full_identity(&storage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(identity: &str, toastable: &[&str]) -> TableStorage {
        TableStorage {
            schema: "s".into(),
            table: "we\"ird".into(),
            identity: identity.into(),
            toastable: toastable.iter().map(|c| (*c).to_owned()).collect(),
        }
    }

    #[test]
    fn only_tables_that_can_leave_values_out() {
        assert!(needs_full_identity(&[t("f", &["body"]), t("d", &[])]).is_empty());
        let a = needs_full_identity(&[t("d", &["body", "doc"]), t("i", &["x"])]);
        assert_eq!(a.len(), 2);
        assert_eq!(
            a[0].fix,
            r#"ALTER TABLE "s"."we""ird" REPLICA IDENTITY FULL;"#
        );
        assert!(a[0].to_string().contains("body, doc"));
    }
}
