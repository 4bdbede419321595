//! What the catalog says about tables and types: columns, type categories, whether a
//! table is partitioned, and whether a key's type fits a statement's parameter.

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::error::ErrorKind;
use crate::{PgError, TableName};

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

/// Each table's column names, read over a connection of its own to `url` (an empty
/// list: no such table); for `check`, which holds `[[redact]]` rules to them.
pub(crate) async fn column_names(
    url: &str,
    tables: &[(String, String)],
) -> Result<Vec<((String, String), Vec<String>)>, PgError> {
    let pool = crate::connect_pool(&crate::ConnectionConfig::from_url(url)?, 1)?;
    let client = crate::pool::client(&pool).await?;
    let mut out = Vec::with_capacity(tables.len());
    for (schema, table) in tables {
        let rows = client
            .query(
                "SELECT a.attname::text FROM pg_attribute a
                 JOIN pg_class c ON c.oid = a.attrelid
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
                &[schema, table],
            )
            .await
            .map_err(|e| PgError::sql(format!("cannot read the columns of {schema}.{table}"), e))?;
        out.push((
            (schema.clone(), table.clone()),
            rows.iter().map(|r| r.get::<_, String>(0)).collect(),
        ));
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

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
