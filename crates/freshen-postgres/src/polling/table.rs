//! One polled table: its description from the catalog, the keyset statements that page
//! through it by `(cursor, primary key)`, and a page read as row events.
//!
//! Values come back as each type's output text (`format('%s', c)`) and map to
//! [`freshen::Value`] exactly as streamed and snapshot rows do, so keys compare equal
//! whichever PostgreSQL source produced them. Positions are bound back as text through
//! each type's input function (`$n::text::type`), so any cursor and key type pages.

use std::sync::Arc;

use freshen::cursor::Position;
use freshen::poller::Read;
use freshen::{Columns, Op, Row, RowEvent};
use tokio_postgres::types::ToSql;

use crate::capture::pgoutput::Datum;
use crate::error::ErrorKind;
use crate::quote::quote_ident;
use crate::{PgError, TableName};

/// The catalog's description of a polled table.
#[derive(Debug, Clone)]
pub(crate) struct Described {
    pub(crate) table: TableName,
    pub(crate) columns: Columns,
    pub(crate) types: Arc<[u32]>,
    pub(crate) pk_names: Columns,
    /// The cursor column then the primary key's, with their types (`format_type`).
    pub(crate) position: Vec<(String, String)>,
    /// Whether the cursor column may hold NULL (such rows are never read).
    pub(crate) cursor_nullable: bool,
    /// Whether an index starts with the cursor column.
    pub(crate) cursor_indexed: bool,
}

/// Reads `table`'s description; a missing table, cursor column or primary key is an
/// error naming it.
pub(crate) async fn describe(
    c: &tokio_postgres::Client,
    table: &TableName,
    cursor: &str,
) -> Result<Described, PgError> {
    let rows = c
        .query(
            "SELECT a.attname::text, a.atttypid, format_type(a.atttypid, NULL), \
                    COALESCE(array_position(i.indkey::int2[], a.attnum) \
                             - array_lower(i.indkey::int2[], 1) + 1, 0), \
                    a.attnotnull, \
                    EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = a.attrelid \
                              AND x.indkey[0] = a.attnum) \
               FROM pg_attribute a \
               LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary \
              WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 \
                AND NOT a.attisdropped \
              ORDER BY a.attnum",
            &[&table.quoted()],
        )
        .await
        .map_err(|e| PgError::sql(format!("cannot describe {table}"), e))?;
    let mut columns: Vec<Box<str>> = Vec::with_capacity(rows.len());
    let mut types = Vec::with_capacity(rows.len());
    let mut pk: Vec<(i32, String, String)> = Vec::new();
    let mut found = None;
    for r in &rows {
        let name: String = r.get(0);
        let ty: String = r.get(2);
        let pos: i32 = r.get(3);
        if pos > 0 {
            pk.push((pos, name.clone(), ty.clone()));
        }
        if name == cursor {
            found = Some((ty, !r.get::<_, bool>(4), r.get::<_, bool>(5)));
        }
        columns.push(name.into());
        types.push(r.get::<_, u32>(1));
    }
    let Some((cursor_type, cursor_nullable, cursor_indexed)) = found else {
        return Err(PgError::new(
            ErrorKind::Config,
            format!("{table} has no column {cursor:?} to use as its cursor"),
        ));
    };
    if pk.is_empty() {
        return Err(PgError::new(
            ErrorKind::Config,
            format!(
                "{table} has no primary key: rows with equal cursor values are told apart by it"
            ),
        ));
    }
    pk.sort_by_key(|p| p.0);
    let mut position = vec![(cursor.to_string(), cursor_type)];
    position.extend(pk.iter().map(|(_, n, t)| (n.clone(), t.clone())));
    Ok(Described {
        table: table.clone(),
        columns: columns.into(),
        types: types.into(),
        pk_names: pk.iter().map(|(_, n, _)| Box::from(n.as_str())).collect(),
        position,
        cursor_nullable,
        cursor_indexed,
    })
}

/// The four keyset statements of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Statements {
    /// New rows from the start: `$1` limit.
    pub(crate) first: String,
    /// New rows after a position: `$1..$k` position, `$k+1` limit.
    pub(crate) after: String,
    /// Re-read from the start: `$1..$k` upper bound, `$k+1` limit, `$k+2` oldest
    /// writer, `$k+3` the snapshot's xmax.
    pub(crate) reread_first: String,
    /// Re-read after a position: `$1..$k` lower, `$k+1..$2k` upper bound, `$2k+1`
    /// limit, `$2k+2` oldest writer, `$2k+3` the snapshot's xmax.
    pub(crate) reread_after: String,
}

/// Builds the statements: identifiers quoted, every value a parameter.
pub(crate) fn statements(d: &Described) -> Statements {
    let k = d.position.len();
    let sel: Vec<String> = d
        .columns
        .iter()
        .map(|c| {
            let q = format!("t.{}", quote_ident(c));
            format!("CASE WHEN num_nulls({q}) = 1 THEN NULL ELSE format('%s', {q}) END")
        })
        .chain(
            d.position
                .iter()
                .map(|(c, _)| format!("format('%s', t.{})", quote_ident(c))),
        )
        .collect();
    let cols: Vec<String> = d
        .position
        .iter()
        .map(|(c, _)| format!("t.{}", quote_ident(c)))
        .collect();
    let order = cols.join(", ");
    let cursor = &cols[0];
    let params = |from: usize| -> (String, String) {
        let all: Vec<String> = d
            .position
            .iter()
            .enumerate()
            .map(|(i, (_, ty))| format!("${}::text::{ty}", from + i))
            .collect();
        (all[0].clone(), all.join(", "))
    };
    let base = format!("SELECT {} FROM {} t", sel.join(", "), d.table.quoted());
    // The redundant range on the cursor alone lets an index on it bound the scan.
    let after = |from: usize| {
        let (c, all) = params(from);
        format!("{cursor} >= {c} AND ({order}) > ({all})")
    };
    let upto = |from: usize| {
        let (c, all) = params(from);
        format!("{cursor} <= {c} AND ({order}) <= ({all})")
    };
    // The row's writer as a full transaction id, the closest at or below the snapshot's
    // xmax (the 32-bit `xmin` wraps; see `cursor::full_xid`).
    let writer = |n: usize| {
        format!(
            "(${n}::int8 - (((${n}::int8 - t.xmin::text::int8) % 4294967296 + 4294967296) % 4294967296))"
        )
    };
    Statements {
        first: format!("{base} WHERE {cursor} IS NOT NULL ORDER BY {order} LIMIT $1"),
        after: format!(
            "{base} WHERE {} ORDER BY {order} LIMIT ${}",
            after(1),
            k + 1
        ),
        reread_first: format!(
            "{base} WHERE {} AND {} >= ${} ORDER BY {order} LIMIT ${}",
            upto(1),
            writer(k + 3),
            k + 2,
            k + 1
        ),
        reread_after: format!(
            "{base} WHERE {} AND {} AND {} >= ${} ORDER BY {order} LIMIT ${}",
            after(1),
            upto(k + 1),
            writer(2 * k + 3),
            2 * k + 2,
            2 * k + 1
        ),
    }
}

/// Reads one page of at most `limit` rows in `tx`, each with its position.
pub(crate) async fn read_page(
    tx: &deadpool_postgres::Transaction<'_>,
    d: &Described,
    sql: &Statements,
    read: Read<'_>,
    limit: usize,
) -> Result<Vec<(RowEvent, Position)>, PgError> {
    let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let mut params: Vec<&(dyn ToSql + Sync)> = Vec::new();
    let (writers, xmax);
    let statement = match read {
        Read::New(None) => {
            params.push(&limit);
            &sql.first
        }
        Read::New(Some(after)) => {
            params.extend(after.iter().map(|v| v as &(dyn ToSql + Sync)));
            params.push(&limit);
            &sql.after
        }
        Read::Again {
            range,
            from,
            snapshot,
        } => {
            writers = int(range.writers_from);
            xmax = int(snapshot.xmax);
            let start = from.or(range.after.as_ref());
            if let Some(after) = start {
                params.extend(after.iter().map(|v| v as &(dyn ToSql + Sync)));
            }
            params.extend(range.upto.iter().map(|v| v as &(dyn ToSql + Sync)));
            params.extend([&limit as &(dyn ToSql + Sync), &writers, &xmax]);
            if start.is_some() {
                &sql.reread_after
            } else {
                &sql.reread_first
            }
        }
    };
    // Prepared once per connection: a poll of a quiet table is then a bind and an
    // execute, not a parse and plan.
    let statement = tx
        .prepare_cached(statement)
        .await
        .map_err(|e| PgError::sql(format!("cannot prepare the page query of {}", d.table), e))?;
    let rows = tx
        .query(&statement, &params)
        .await
        .map_err(|e| PgError::sql(format!("cannot read a page of {}", d.table), e))?;
    let schema: Arc<str> = Arc::from(d.table.schema.as_str());
    let name: Arc<str> = Arc::from(d.table.name.as_str());
    let n = d.columns.len();
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let values = (0..n)
            .map(|i| {
                let text: Option<&str> = r.get(i);
                let datum = text.map_or(Datum::Null, |t| Datum::Text(t.as_bytes()));
                crate::capture::rows::value(d.types[i], &datum)
            })
            .collect();
        let position: Position = (n..n + d.position.len())
            .map(|i| r.get::<_, String>(i))
            .collect();
        // Whether the row is new or changed cannot be told from a poll: an update
        // without a former image says "the row is now this".
        let mut e = RowEvent::new(schema.clone(), name.clone(), Op::Update)
            .with_new(Row::new(d.columns.clone(), values));
        e.pk_names = d.pk_names.clone();
        out.push((e, position));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described() -> Described {
        Described {
            table: TableName::new("app", "my \"t\""),
            columns: vec![Box::from("id"), Box::from("updated_at"), Box::from("v")].into(),
            types: vec![23, 1184, 25].into(),
            pk_names: vec![Box::from("id")].into(),
            position: vec![
                ("updated_at".into(), "timestamp with time zone".into()),
                ("id".into(), "integer".into()),
            ],
            cursor_nullable: false,
            cursor_indexed: true,
        }
    }

    #[test]
    fn statements_quote_identifiers_and_bind_every_value() {
        let s = statements(&described());
        assert!(
            s.first.contains(r#"FROM "app"."my ""t""" t"#),
            "{}",
            s.first
        );
        assert!(
            s.first
                .ends_with(r#"ORDER BY t."updated_at", t."id" LIMIT $1"#)
        );
        assert!(
            s.after.contains(
                r#"(t."updated_at", t."id") > ($1::text::timestamp with time zone, $2::text::integer)"#
            ),
            "{}",
            s.after
        );
        assert!(s.after.ends_with("LIMIT $3"));
        assert!(s.reread_first.contains(
            r#"(t."updated_at", t."id") <= ($1::text::timestamp with time zone, $2::text::integer)"#
        ));
        assert!(s.reread_first.contains(">= $4") && s.reread_first.ends_with("LIMIT $3"));
        assert!(s.reread_first.contains("$5::int8 - t.xmin::text::int8"));
        assert!(
            s.reread_after
                .contains(r#"<= ($3::text::timestamp with time zone, $4::text::integer)"#)
        );
        assert!(s.reread_after.contains(">= $6") && s.reread_after.ends_with("LIMIT $5"));
        assert!(s.reread_after.contains("$7::int8"));
    }
}
