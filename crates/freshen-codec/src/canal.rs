//! canal-json: the flat-message JSON of Alibaba Canal, as TiCDC and Canal write it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use freshen::{Columns, Op, Row, RowEvent, Value};
use serde::Deserialize;

use crate::canal_types::ColType;
use crate::columns::{TableCache, TableRef};
use crate::json::{Pairs, Scalar, Str};
use crate::{Control, DecodeError, Decoded};
use freshen::clip;

type Image<'a> = Pairs<'a, Scalar<'a>>;

/// One canal-json message. Unknown fields are ignored: producers add their own.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(default, borrow)]
    database: Option<Str<'a>>,
    #[serde(default, borrow)]
    table: Option<Str<'a>>,
    #[serde(default, borrow, rename = "pkNames")]
    pk_names: Option<Vec<Str<'a>>>,
    #[serde(borrow, rename = "type")]
    kind: Str<'a>,
    #[serde(default, rename = "isDdl")]
    is_ddl: Option<bool>,
    #[serde(default, borrow)]
    es: Option<Scalar<'a>>,
    #[serde(default, borrow)]
    sql: Option<Str<'a>>,
    #[serde(default, borrow, rename = "sqlType")]
    sql_type: Option<Pairs<'a, Scalar<'a>>>,
    #[serde(default, borrow, rename = "mysqlType")]
    mysql_type: Option<Pairs<'a, Scalar<'a>>>,
    #[serde(default, borrow)]
    data: Option<Vec<Image<'a>>>,
    #[serde(default, borrow)]
    old: Option<Vec<Image<'a>>>,
    #[serde(default, borrow, rename = "_tidb")]
    tidb: Option<Tidb<'a>>,
}

/// TiCDC's extension block (`enable-tidb-extension=true`).
#[derive(Deserialize)]
struct Tidb<'a> {
    #[serde(default, borrow, rename = "watermarkTs")]
    watermark_ts: Option<Scalar<'a>>,
    /// A row too large for the topic, sent as its handle key only.
    #[serde(default, rename = "onlyHandleKey")]
    only_handle_key: Option<bool>,
    /// Where TiCDC stored a large row instead (claim-check).
    #[serde(default, borrow, rename = "claimCheckLocation")]
    claim_check_location: Option<Str<'a>>,
}

/// What the stream left out, and the producer setting that avoids it (see [`Gap`]).
const KEY_ONLY: &str = "TiCDC sent only the handle key of a row too large for the topic \
    (large-message-handle-option=handle-key-only); raise the changefeed's max-message-bytes \
    and the topic's max.message.bytes to receive whole rows";
const CLAIM_CHECK: &str = "TiCDC stored the row in claim-check storage and sent only its key \
    (large-message-handle-option=claim-check), which freshen does not read; raise the \
    changefeed's max-message-bytes and the topic's max.message.bytes to receive whole rows";
const PARTIAL_IMAGE: &str = "the row image lacks a primary-key or declared column \
    (MySQL binlog_row_image=MINIMAL or NOBLOB); set binlog_row_image=FULL on the MySQL \
    server Canal reads";
const STATEMENT: &str = "a statement instead of rows (MySQL binlog_format=STATEMENT or \
    MIXED); set binlog_format=ROW on the MySQL server Canal reads";
const PARTITION: &str = "a partition was truncated, dropped or exchanged: its rows changed \
    without row events (no producer setting carries them; the sweep is the remedy)";

/// Decodes canal-json messages (TiCDC's `protocol=canal-json`, Canal's flat messages)
/// into row events.
///
/// - `INSERT`, `UPDATE`, `DELETE`: one [`RowEvent`] per entry of `data`, in order.
///   `schema` is `database`, `pk_names` is `pkNames`, `commit_ts` is `es` (ms).
///   No [`Tx`](freshen::Tx): canal-json carries no transaction id (TiCDC's
///   `_tidb.commitTs` orders commits but is not an id a rebuild could check).
/// - `UPDATE`: `data` is the new row; `old` is the former one, whole (TiCDC) or only the
///   changed columns (Canal) — it is merged over `data`, so the old image is always whole.
/// - `DELETE`: the row is in `data` (TiCDC, Canal) or, with some producers, in `old`;
///   either is taken.
/// - `TRUNCATE` (a DDL), and `ERASE` (TiCDC's and Canal's `DROP TABLE`: every row is
///   gone): one [`Op::Truncate`] event for the table (it triggers a sweep).
/// - An `ALTER` that truncates, drops or exchanges a partition (TiCDC sends
///   `TRUNCATE PARTITION` that way): a [`Decoded::Gap`] for the table, so its views
///   sweep without the changefeed hearing that the whole table was emptied.
/// - Other DDL (`CREATE`, `ALTER`, `QUERY` with `isDdl` true, `RENAME`, `CINDEX`,
///   `DINDEX`): a [`Control::Ddl`]. A `QUERY` with `isDdl` false is Canal's rows-query
///   (the SQL text behind row events that follow): a [`Control::Other`], not a schema
///   change. `TIDB_WATERMARK`, Canal's `GTID`/`XACOMMIT`/`XAROLLBACK`/`MHEARTBEAT`: a
///   [`Decoded::Control`] without rows.
/// - Messages that change rows without carrying them whole decode to a
///   [`Decoded::Gap`] naming the producer setting to change: TiCDC key-only messages
///   (`_tidb.onlyHandleKey`, `_tidb.claimCheckLocation`), Canal partial row images
///   (`binlog_row_image=MINIMAL`: a `data` row without a `pkNames` column or a column
///   that `mysqlType`/`sqlType` declares), and statement-form DML (`data` null, the SQL
///   in `sql`). Why not a refusal: on a broker a refused message either stops the
///   consumer at an offset that is still there after the fix, or is skipped and its
///   doorbell lost; a sweep of the table's views is always correct, and its report says
///   what to change.
/// - A column named twice in a row image (`data` or `old`): [`DecodeError::Malformed`].
/// - Any other `type`: [`DecodeError::UnknownType`].
///
/// Values are typed by `mysqlType`/`sqlType`: see the table in the crate docs.
/// The decoder keeps a small cache of table and column names, so reuse one per stream.
///
/// ```
/// use freshen::{Op, Value};
/// use freshen_codec::CanalJson;
/// let msg = br#"{"database":"demo","table":"readings","pkNames":["id"],"type":"UPDATE",
///   "es":1786358942713,"mysqlType":{"id":"int","device":"varchar"},
///   "data":[{"id":"1","device":"dev-b"}],"old":[{"device":"dev-a"}]}"#;
/// let events = CanalJson::new().decode(msg).unwrap().into_events();
/// assert_eq!(events[0].op, Op::Update);
/// let old = events[0].old.as_ref().unwrap();
/// assert_eq!(old.get("id"), Some(&Value::Int(1)));  // merged from `data`
/// assert_eq!(old.get("device"), Some(&Value::text("dev-a")));
/// ```
#[derive(Debug, Default)]
pub struct CanalJson {
    cache: TableCache,
}

impl CanalJson {
    /// A decoder with an empty name cache.
    pub fn new() -> CanalJson {
        CanalJson::default()
    }

    /// Decodes one message. Never panics, whatever the bytes.
    pub fn decode(&mut self, message: &[u8]) -> Result<Decoded, DecodeError> {
        let msg: Message<'_> = serde_json::from_slice(message)?;
        let kind = msg.kind.as_str();
        let op = match kind {
            "INSERT" => Op::Insert,
            "UPDATE" => Op::Update,
            "DELETE" => Op::Delete,
            "TRUNCATE" | "ERASE" => return Ok(self.truncate(&msg)),
            "QUERY" if msg.is_ddl == Some(false) => {
                return Ok(Decoded::Control(Control::Other {
                    kind: "QUERY".to_owned(),
                }));
            }
            "ALTER" if changes_partition_rows(msg.sql.as_ref().map_or("", Str::as_str)) => {
                return Ok(gap(&msg, PARTITION));
            }
            "CREATE" | "ALTER" | "QUERY" | "RENAME" | "CINDEX" | "DINDEX" => {
                return Ok(Decoded::Control(ddl(&msg)));
            }
            "TIDB_WATERMARK" => {
                let ts = msg
                    .tidb
                    .as_ref()
                    .and_then(|t| t.watermark_ts.as_ref())
                    .and_then(Scalar::as_u64)
                    .unwrap_or(0);
                return Ok(Decoded::Control(Control::Watermark { ts }));
            }
            "GTID" | "XACOMMIT" | "XAROLLBACK" | "MHEARTBEAT" => {
                return Ok(Decoded::Control(Control::Other {
                    kind: kind.to_owned(),
                }));
            }
            other => return Err(DecodeError::unknown_type(other)),
        };
        if let Some(tidb) = &msg.tidb {
            if tidb.claim_check_location.is_some() {
                return Ok(gap(&msg, CLAIM_CHECK));
            }
            if tidb.only_handle_key == Some(true) {
                return Ok(gap(&msg, KEY_ONLY));
            }
        }
        let no_rows = msg.data.as_ref().is_none_or(Vec::is_empty)
            && msg.old.as_ref().is_none_or(Vec::is_empty);
        if no_rows
            && msg
                .sql
                .as_ref()
                .is_some_and(|s| !s.as_str().trim().is_empty())
        {
            return Ok(gap(&msg, STATEMENT));
        }
        self.rows(&msg, op)
    }

    fn truncate(&mut self, msg: &Message<'_>) -> Decoded {
        let (schema, table) = names(msg);
        if table.is_empty() {
            return Decoded::Control(ddl(msg));
        }
        let t = self.cache.table(schema, table);
        let mut event = RowEvent::new(t.schema(), t.name(), Op::Truncate);
        event.commit_ts = commit_ts(msg.es.as_ref());
        Decoded::Rows(vec![event])
    }

    fn rows(&mut self, msg: &Message<'_>, op: Op) -> Result<Decoded, DecodeError> {
        let data = msg.data.as_deref().unwrap_or_default();
        let old = msg.old.as_deref();
        // Where the row images are: DELETE takes `data`, else `old` (producers differ).
        let (images, before) = match op {
            Op::Delete if data.is_empty() => (old.unwrap_or_default(), None),
            Op::Update => (data, old),
            _ => (data, None),
        };
        if images.is_empty() {
            return Err(DecodeError::malformed(format!(
                "{} without rows",
                op.as_str()
            )));
        }
        if let Some(before) = before
            && before.len() != images.len()
        {
            return Err(DecodeError::malformed(format!(
                "UPDATE has {} rows in data but {} in old",
                images.len(),
                before.len()
            )));
        }
        if images.iter().any(|image| partial(msg, image)) {
            return Ok(gap(msg, PARTIAL_IMAGE));
        }
        if let Some(before) = before
            && before.iter().any(|b| names_a_column_twice(b))
        {
            return Err(DecodeError::malformed(
                "an old row names the same column twice",
            ));
        }
        let (schema, table) = names(msg);
        let mut t = self.cache.table(schema, table);
        let pk = msg.pk_names.as_deref().unwrap_or_default();
        let pk = t.pk(pk.iter().map(Str::as_str));
        let ts = commit_ts(msg.es.as_ref());
        let typer = Typer {
            mysql: msg.mysql_type.as_ref(),
            sql: msg.sql_type.as_ref(),
        };

        let mut events = Vec::with_capacity(images.len());
        for (i, image) in images.iter().enumerate() {
            let row = typer.row(&mut t, image)?;
            let mut event = RowEvent::new(t.schema(), t.name(), op);
            event.pk_names = pk.clone();
            event.commit_ts = ts;
            match op {
                Op::Insert => event.new = Some(row),
                Op::Delete => event.old = Some(row),
                _ => {
                    event.old = match before.and_then(|b| b.get(i)) {
                        Some(changed) => Some(typer.merge(&mut t, &row, changed)?),
                        None => None,
                    };
                    event.new = Some(row);
                }
            }
            events.push(event);
        }
        Ok(Decoded::Rows(events))
    }
}

/// Whether a row image lacks a primary-key column or a column the message declares a
/// type for: a MINIMAL (or NOBLOB) binlog row image, which carries only what changed.
fn partial(msg: &Message<'_>, image: &Image<'_>) -> bool {
    let pk = msg.pk_names.as_deref().unwrap_or_default();
    if pk.iter().any(|c| image.get_at(0, c.as_str()).is_none()) {
        return true;
    }
    // Producers write a message's maps in one column order: the hint finds each at once.
    let declared = msg.mysql_type.as_ref().or(msg.sql_type.as_ref());
    declared.is_some_and(|d| {
        d.0.iter()
            .enumerate()
            .any(|(i, (k, _))| image.get_at(i, k.as_str()).is_none())
    })
}

fn names_a_column_twice(image: &Image<'_>) -> bool {
    let names: Vec<&str> = image.0.iter().map(|(k, _)| k.as_str()).collect();
    crate::columns::has_duplicate(&names)
}

/// Whether an `ALTER TABLE` statement removes or swaps a partition's rows (TRUNCATE,
/// DROP or EXCHANGE PARTITION). Read from the text, so a quoted identifier spelled that
/// way is a false alarm: one extra sweep, never a missed one.
fn changes_partition_rows(sql: &str) -> bool {
    let words: Vec<String> = sql
        .split(|c: char| c.is_ascii_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_uppercase)
        .collect();
    words
        .windows(2)
        .any(|w| matches!(w[0].as_str(), "TRUNCATE" | "DROP" | "EXCHANGE") && w[1] == "PARTITION")
}

fn gap(msg: &Message<'_>, reason: &str) -> Decoded {
    let (schema, table) = names(msg);
    Decoded::Gap(freshen::Gap::new(schema, table, reason))
}

/// Types the values of one message's rows.
struct Typer<'m, 'a> {
    mysql: Option<&'m Pairs<'a, Scalar<'a>>>,
    sql: Option<&'m Pairs<'a, Scalar<'a>>>,
}

impl Typer<'_, '_> {
    fn col_type(&self, i: usize, name: &str) -> ColType {
        ColType::of(
            self.mysql.and_then(|m| m.get_at(i, name)),
            self.sql.and_then(|s| s.get_at(i, name)),
        )
    }

    fn row(&self, t: &mut TableRef<'_>, image: &Image<'_>) -> Result<Row, DecodeError> {
        let columns = t.columns(image.0.iter().map(|(k, _)| k.as_str()))?;
        let values = image
            .0
            .iter()
            .enumerate()
            .map(|(i, (k, v))| self.col_type(i, k.as_str()).convert(v))
            .collect();
        Ok(Row::new(columns, values))
    }

    /// The whole former row: `new` with the columns `changed` names set to their
    /// former values (Canal's `old` holds only the columns an UPDATE changed).
    fn merge(
        &self,
        t: &mut TableRef<'_>,
        new: &Row,
        changed: &Image<'_>,
    ) -> Result<Row, DecodeError> {
        let extra: Vec<&str> = changed
            .0
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| new.get(k).is_none())
            .collect();
        let columns: Columns = if extra.is_empty() {
            new.columns().clone()
        } else {
            let names = new
                .columns()
                .iter()
                .map(|c| &**c)
                .chain(extra.iter().copied());
            t.columns(names.collect::<Vec<_>>().into_iter())?
        };
        let mut values: Vec<Value> = new.values().to_vec();
        values.resize(columns.len(), Value::Null);
        let mut old = Row::new(columns, values);
        for (i, (k, v)) in changed.0.iter().enumerate() {
            let value = self.col_type(i, k.as_str()).convert(v);
            old.set(k.as_str(), value);
        }
        Ok(old)
    }
}

fn names<'m>(msg: &'m Message<'_>) -> (&'m str, &'m str) {
    (
        msg.database.as_ref().map_or("", Str::as_str),
        msg.table.as_ref().map_or("", Str::as_str),
    )
}

fn ddl(msg: &Message<'_>) -> Control {
    let (schema, table) = names(msg);
    Control::Ddl {
        schema: schema.to_owned(),
        table: table.to_owned(),
        kind: clip(msg.kind.as_str(), 64).to_owned(),
        sql: msg.sql.as_ref().map_or("", Str::as_str).to_owned(),
    }
}

/// `es`, milliseconds since the Unix epoch; `None` when absent or out of range.
pub(crate) fn commit_ts(ms: Option<&Scalar<'_>>) -> Option<SystemTime> {
    let ms = ms?.as_u64()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}
