//! Reading a table's existing rows in primary-key chunks, for snapshots interleaved with
//! the replication stream (DBLog): watermarks written into the WAL, keyset-paginated
//! chunk SELECTs, and the transaction snapshot each chunk was read under.
//!
//! A chunk is `WHERE (pk) > (last key) ORDER BY pk LIMIT n`, the last key bound as
//! parameters, in a REPEATABLE READ READ ONLY transaction. No lock beyond the SELECT's
//! own is taken. Values come from each type's output function (`format('%s', c)`),
//! the text pgoutput sends, and are mapped to [`freshen::Value`] exactly as streamed
//! rows are, so a row read here and the same row streamed encode alike.

pub(crate) mod chunks;
pub(crate) mod driver;
pub(crate) mod resume;
pub(crate) mod sink;
pub(crate) mod window;

use std::sync::Arc;

use deadpool_postgres::Pool;
use freshen::{Columns, Op, Row, RowEvent};
use tokio_postgres::IsolationLevel;

use crate::capture::pgoutput::Datum;
use crate::error::ErrorKind;
use crate::pool::client;
use crate::quote::quote_ident;
use crate::{Lsn, PgError, TableName};

/// The prefix of the logical decoding messages freshen writes as watermarks.
pub use freshen::plug::WATERMARK_PREFIX;

/// Which transactions a snapshot sees: PostgreSQL's `pg_current_snapshot()`, with full
/// (epoch-extended) transaction ids as the replication source reports them in
/// [`freshen::Tx::id`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XidSnapshot {
    /// Every transaction below this had ended when the snapshot was taken.
    pub xmin: u64,
    /// No transaction at or above this had ended.
    pub xmax: u64,
    /// Transactions between `xmin` and `xmax` still running then, sorted.
    pub xip: Vec<u64>,
}

impl XidSnapshot {
    /// Whether the snapshot sees what committed transaction `xid` wrote.
    pub fn sees(&self, xid: u64) -> bool {
        xid < self.xmin || (xid < self.xmax && self.xip.binary_search(&xid).is_err())
    }
}

pub use freshen_codec::{SnapshotProgress, SnapshotState};

/// Resolves the tables a snapshot request names against `known`
/// ([`freshen::plug::resolve_tables`]).
pub fn resolve_tables(known: &[TableName], names: &[String]) -> Result<Vec<TableName>, String> {
    let known: Vec<(String, String)> = known
        .iter()
        .map(|t| (t.schema.clone(), t.name.clone()))
        .collect();
    Ok(freshen::plug::resolve_tables(&known, names)?
        .into_iter()
        .map(|(schema, table)| TableName::new(schema, table))
        .collect())
}

/// One chunk of a table's rows.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// The rows, in primary-key order, as `Insert` events with `pk_names` set.
    pub rows: Vec<RowEvent>,
    /// The primary-key values of the last row, as text: where the next chunk starts.
    /// `None` when the chunk is empty.
    pub last_key: Option<Vec<String>>,
    /// The snapshot the rows were read under.
    pub snapshot: XidSnapshot,
}

#[derive(Debug)]
struct Column {
    name: Box<str>,
    type_oid: u32,
}

/// Reads one table's rows in primary-key chunks. Built from the catalog once per table.
#[derive(Debug, Clone)]
pub struct TableReader {
    pool: Pool,
    table: TableName,
    columns: Columns,
    types: Arc<[u32]>,
    pk_names: Columns,
    /// Where the primary-key columns are among `columns`.
    pk_positions: Arc<[usize]>,
    first_sql: Arc<str>,
    after_sql: Arc<str>,
}

impl TableReader {
    /// Describes `table` from the catalog: its published columns (not generated, not
    /// dropped) and its primary key. A table without a primary key cannot be read in
    /// chunks and is an error.
    pub async fn new(pool: Pool, table: TableName) -> Result<TableReader, PgError> {
        let c = client(&pool).await?;
        let rows = c
            .query(
                "SELECT a.attname::text, a.atttypid, format_type(a.atttypid, NULL), \
                        COALESCE(array_position(i.indkey::int2[], a.attnum) \
                                 - array_lower(i.indkey::int2[], 1) + 1, 0) \
                   FROM pg_attribute a \
                   LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary \
                  WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 \
                    AND NOT a.attisdropped AND a.attgenerated = '' \
                  ORDER BY a.attnum",
                &[&table.quoted()],
            )
            .await
            .map_err(|e| PgError::sql(format!("cannot describe {table}"), e))?;
        if rows.is_empty() {
            return Err(PgError::new(
                ErrorKind::Config,
                format!("{table} has no columns to read"),
            ));
        }
        let mut columns = Vec::with_capacity(rows.len());
        let mut pk: Vec<(i32, usize, String)> = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            let name: String = r.get(0);
            let pos: i32 = r.get(3);
            if pos > 0 {
                pk.push((pos, i, r.get(2)));
            }
            columns.push(Column {
                name: name.into(),
                type_oid: r.get(1),
            });
        }
        if pk.is_empty() {
            return Err(PgError::new(
                ErrorKind::Config,
                format!("{table} has no primary key: a snapshot reads rows in primary-key order"),
            ));
        }
        pk.sort_by_key(|p| p.0);
        let select: Vec<String> = columns
            .iter()
            .map(|c| {
                let q = format!("t.{}", quote_ident(&c.name));
                // The output function's text (what pgoutput sends); NULL stays NULL.
                format!("CASE WHEN num_nulls({q}) = 1 THEN NULL ELSE format('%s', {q}) END")
            })
            .collect();
        let pk_cols: Vec<String> = pk
            .iter()
            .map(|(_, i, _)| format!("t.{}", quote_ident(&columns[*i].name)))
            .collect();
        // The last key comes back as the output text; the input function reads it back
        // (`$n::text::type`), so any key type pages correctly.
        let params: Vec<String> = pk
            .iter()
            .enumerate()
            .map(|(n, (_, _, ty))| format!("${}::text::{ty}", n + 1))
            .collect();
        let base = format!("SELECT {} FROM {} t", select.join(", "), table.quoted());
        let order = pk_cols.join(", ");
        let first_sql = format!("{base} ORDER BY {order} LIMIT $1");
        let after_sql = format!(
            "{base} WHERE ({order}) > ({}) ORDER BY {order} LIMIT ${}",
            params.join(", "),
            pk.len() + 1
        );
        Ok(TableReader {
            pool,
            table,
            pk_names: pk
                .iter()
                .map(|(_, i, _)| columns[*i].name.clone())
                .collect(),
            pk_positions: pk.iter().map(|(_, i, _)| *i).collect(),
            types: columns.iter().map(|c| c.type_oid).collect(),
            columns: columns.into_iter().map(|c| c.name).collect(),
            first_sql: first_sql.into(),
            after_sql: after_sql.into(),
        })
    }

    /// The table read.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The primary-key column names, in key order.
    pub fn pk_names(&self) -> &Columns {
        &self.pk_names
    }

    /// Reads up to `limit` rows after `after` (the previous chunk's
    /// [`Chunk::last_key`]; `None` for the first chunk), with the snapshot they were
    /// read under.
    pub async fn read_chunk(
        &self,
        after: Option<&[String]>,
        limit: usize,
    ) -> Result<Chunk, PgError> {
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let mut c = client(&self.pool).await?;
        let tx = c
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(|e| PgError::sql("cannot begin a snapshot chunk", e))?;
        // The first statement fixes the transaction's snapshot: the chunk reads under it.
        let s = tx
            .query_one(
                "SELECT pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text, \
                        ARRAY(SELECT x::text FROM pg_snapshot_xip(s) x) \
                   FROM pg_current_snapshot() s",
                &[],
            )
            .await
            .map_err(|e| PgError::sql("cannot read the chunk's snapshot", e))?;
        let xid = |t: &str| {
            t.parse::<u64>().map_err(|_| {
                PgError::new(ErrorKind::Server, format!("not a transaction id: {t:?}"))
            })
        };
        let mut xip = s
            .get::<_, Vec<String>>(2)
            .iter()
            .map(|t| xid(t))
            .collect::<Result<Vec<u64>, _>>()?;
        xip.sort_unstable();
        let snapshot = XidSnapshot {
            xmin: xid(s.get(0))?,
            xmax: xid(s.get(1))?,
            xip,
        };
        let rows = match after {
            None => tx.query(&*self.first_sql, &[&limit]).await,
            Some(key) => {
                if key.len() != self.pk_names.len() {
                    return Err(PgError::new(
                        ErrorKind::Config,
                        format!(
                            "{}: the resume key has {} parts, the primary key {}",
                            self.table,
                            key.len(),
                            self.pk_names.len()
                        ),
                    ));
                }
                let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                    key.iter().map(|k| k as _).collect();
                params.push(&limit);
                tx.query(&*self.after_sql, &params).await
            }
        }
        .map_err(|e| PgError::sql(format!("cannot read a chunk of {}", self.table), e))?;
        tx.commit()
            .await
            .map_err(|e| PgError::sql("cannot end a snapshot chunk", e))?;
        let schema: Arc<str> = Arc::from(self.table.schema.as_str());
        let name: Arc<str> = Arc::from(self.table.name.as_str());
        let mut last_key = None;
        let mut out = Vec::with_capacity(rows.len());
        for (n, r) in rows.iter().enumerate() {
            let values = (0..self.columns.len())
                .map(|i| {
                    let text: Option<&str> = r.get(i);
                    let d = match text {
                        None => Datum::Null,
                        Some(t) => Datum::Text(t.as_bytes()),
                    };
                    crate::capture::rows::value(self.types[i], &d)
                })
                .collect();
            if n + 1 == rows.len() {
                last_key = Some(
                    self.pk_positions
                        .iter()
                        .map(|&i| r.get::<_, Option<String>>(i).unwrap_or_default())
                        .collect(),
                );
            }
            let mut e = RowEvent::new(schema.clone(), name.clone(), Op::Insert)
                .with_new(Row::new(self.columns.clone(), values));
            e.pk_names = self.pk_names.clone();
            out.push(e);
        }
        Ok(Chunk {
            rows: out,
            last_key,
            snapshot,
        })
    }
}

/// Writes a watermark into the WAL: a logical decoding message with
/// [`WATERMARK_PREFIX`] and `content`, and returns its position. A transactional one is
/// streamed when its own transaction commits (in commit order with every other);
/// a non-transactional one at once.
pub async fn write_watermark(
    pool: &Pool,
    content: &str,
    transactional: bool,
) -> Result<Lsn, PgError> {
    let c = client(pool).await?;
    let row = c
        .query_one(
            "SELECT pg_logical_emit_message($1, $2, $3)::text",
            &[&transactional, &WATERMARK_PREFIX, &content],
        )
        .await
        .map_err(|e| PgError::sql("cannot write a snapshot watermark", e))?;
    let text: String = row.get(0);
    text.parse()
        .map_err(|e| PgError::new(ErrorKind::Server, format!("watermark position: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_sees_what_ended_before_it() {
        let s = XidSnapshot {
            xmin: 100,
            xmax: 110,
            xip: vec![102, 105],
        };
        assert!(s.sees(99));
        assert!(s.sees(101));
        assert!(!s.sees(102));
        assert!(!s.sees(105));
        assert!(s.sees(109));
        assert!(!s.sees(110));
        assert!(!s.sees(5000));
    }
}
