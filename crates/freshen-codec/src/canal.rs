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
}

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
/// - `TRUNCATE` (a DDL): one [`Op::Truncate`] event for the table (it triggers a sweep).
/// - Other DDL (`CREATE`, `ALTER`, `ERASE`, `QUERY`, `RENAME`, `CINDEX`, `DINDEX`),
///   `TIDB_WATERMARK`, Canal's `GTID`/`XACOMMIT`/`XAROLLBACK`/`MHEARTBEAT`: a
///   [`Decoded::Control`] without rows.
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
            "TRUNCATE" => return Ok(self.truncate(&msg)),
            "CREATE" | "ALTER" | "ERASE" | "QUERY" | "RENAME" | "CINDEX" | "DINDEX" => {
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
        self.rows(&msg, op).map(Decoded::Rows)
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

    fn rows(&mut self, msg: &Message<'_>, op: Op) -> Result<Vec<RowEvent>, DecodeError> {
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
        Ok(events)
    }
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
