//! One polled table: its description from `information_schema`, the keyset statements
//! that page through it by `(cursor, primary key)`, and a page read as row events.
//!
//! Values map to [`freshen::Value`] as the binlog source decodes them (integers as
//! integers, unsigned above `i64` as text, DECIMAL and temporal types as the server
//! prints them — sessions are in UTC —, binary strings as bytes), so a key reads the
//! same whichever MySQL source produced it. Positions are read as the server's text
//! (`CAST(… AS CHAR)`, binary strings as `HEX(…)`) and bound back through a cast to the
//! column's type, so every comparison is the column's own (numeric, temporal, its
//! collation) — never a comparison of strings where the column is not one.

use std::sync::Arc;

use freshen::cursor::Position;
use freshen::poller::Read;
use freshen::{Columns, Op, Row, RowEvent};
use mysql_async::prelude::Queryable;

use crate::MySqlError;
use crate::error::ErrorKind;

/// `` `a` ``, backticks doubled inside.
pub(crate) fn quote(s: &str) -> String {
    format!("`{}`", s.replace('`', "``"))
}

/// A polled table's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName {
    /// The database.
    pub database: String,
    /// The table.
    pub table: String,
}

impl TableName {
    /// `database.table`.
    pub fn new(database: impl Into<String>, table: impl Into<String>) -> TableName {
        TableName {
            database: database.into(),
            table: table.into(),
        }
    }

    /// `` `database`.`table` ``.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote(&self.database), quote(&self.table))
    }

    /// Parses `database.table` (or `table` in `default`); backticks around a part keep
    /// it as written.
    pub fn parse(s: &str, default: Option<&str>) -> Result<TableName, String> {
        let (db, t) = naming(default).parse(s)?;
        Ok(TableName::new(db, t))
    }
}

/// MySQL's rules for a table name in the file: backticks keep a part as written (case
/// is kept either way), an unqualified table is in `default` (the URL's database) or
/// must be qualified.
pub(crate) fn naming(default: Option<&str>) -> freshen::plug::Naming {
    freshen::plug::Naming {
        quote: '`',
        fold_unquoted: false,
        default_schema: default.map(str::to_owned),
        schema_word: "database",
    }
}

/// The rules for the tables of the server at `url`: an unqualified table is in its
/// database. A URL still holding an unset `${VAR}` (a file read offline) cannot say
/// which: an unqualified name is then taken as written, in no database, and judged
/// when `run` reads the file with the variable set.
pub(crate) fn url_naming(url: &str) -> freshen::plug::Naming {
    match url_database(url) {
        Some(db) => naming(Some(&db)),
        None if url.contains("${") => naming(Some("")),
        None => naming(None),
    }
}

/// The database a MySQL URL names, if any.
pub(crate) fn url_database(url: &str) -> Option<String> {
    mysql_async::Opts::from_url(url)
        .ok()?
        .db_name()
        .map(str::to_owned)
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.database, self.table)
    }
}

/// How a column's values become [`freshen::Value`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An integer (YEAR too).
    Int { unsigned: bool },
    /// FLOAT, DOUBLE.
    Float,
    /// Text as the server prints it; `cast`: selected through `CAST(… AS CHAR)`
    /// (DECIMAL, temporal types) rather than as the value itself.
    Text { cast: bool },
    /// A JSON document (MySQL's JSON type; MariaDB's JSON is LONGTEXT: text).
    Json,
    /// Raw bytes: binary strings, BIT, spatial types.
    Bytes,
}

/// A column's [`Kind`] from `information_schema.COLUMNS` (`DATA_TYPE`, `COLUMN_TYPE`).
pub(crate) fn kind_of(data_type: &str, column_type: &str) -> Kind {
    let unsigned = column_type.to_ascii_lowercase().contains("unsigned");
    match data_type.to_ascii_lowercase().as_str() {
        "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" | "year" => {
            Kind::Int { unsigned }
        }
        "float" | "double" | "real" => Kind::Float,
        "decimal" | "numeric" | "date" | "datetime" | "timestamp" | "time" => {
            Kind::Text { cast: true }
        }
        "json" => Kind::Json,
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" | "bit"
        | "geometry" | "point" | "linestring" | "polygon" | "multipoint" | "multilinestring"
        | "multipolygon" | "geometrycollection" => Kind::Bytes,
        _ => Kind::Text { cast: false },
    }
}

/// How a position column's text is bound back: a cast to the column's type, so the
/// comparison is the column's own. `Err` for types a keyset cannot page by safely.
pub(crate) fn bind_of(
    data_type: &str,
    column_type: &str,
    precision: Option<u64>,
    scale: Option<u64>,
    fsp: Option<u64>,
) -> Result<String, String> {
    let unsigned = column_type.to_ascii_lowercase().contains("unsigned");
    let fsp = fsp.unwrap_or(0).min(6);
    Ok(match data_type.to_ascii_lowercase().as_str() {
        "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" | "year" => {
            if unsigned {
                "CAST(? AS UNSIGNED)".into()
            } else {
                "CAST(? AS SIGNED)".into()
            }
        }
        "decimal" | "numeric" => format!(
            "CAST(? AS DECIMAL({}, {}))",
            precision.unwrap_or(65).min(65),
            scale.unwrap_or(0).min(30)
        ),
        "date" => "CAST(? AS DATE)".into(),
        "datetime" | "timestamp" => format!("CAST(? AS DATETIME({fsp}))"),
        "time" => format!("CAST(? AS TIME({fsp}))"),
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => {
            "UNHEX(?)".into()
        }
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => "?".into(),
        // Floats print inexactly, ENUM and SET sort by index but compare as text, the
        // rest do not order: none can say where a page ended.
        other => {
            return Err(format!(
                "type {other} cannot position a page (use an integer, DECIMAL, temporal, string or binary column)"
            ));
        }
    })
}

/// A polled table as described by the server.
#[derive(Debug, Clone)]
pub(crate) struct Described {
    pub(crate) table: TableName,
    pub(crate) columns: Columns,
    pub(crate) kinds: Arc<[Kind]>,
    pub(crate) pk_names: Columns,
    /// The cursor column then the primary key's: name, the SELECT expression of its
    /// text, and how that text is bound back.
    pub(crate) position: Vec<(String, String, String)>,
    /// Whether the cursor column may hold NULL (such rows are never read).
    pub(crate) cursor_nullable: bool,
    /// Whether an index starts with the cursor column.
    pub(crate) cursor_indexed: bool,
}

impl Described {
    /// The position's column names.
    pub(crate) fn position_columns(&self) -> Vec<String> {
        self.position.iter().map(|(c, ..)| c.clone()).collect()
    }
}

/// Reads `table`'s description; a missing table, cursor column or primary key, or a
/// position column of a type that cannot page, is an error naming it.
pub(crate) async fn describe(
    c: &mut mysql_async::Conn,
    table: &TableName,
    cursor: &str,
) -> Result<Described, MySqlError> {
    type Col = (
        String,
        String,
        String,
        String,
        Option<u64>,
        Option<u64>,
        Option<u64>,
    );
    let cols: Vec<Col> = c
        .exec(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, \
                    NUMERIC_SCALE, DATETIME_PRECISION \
               FROM information_schema.COLUMNS \
              WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (&table.database, &table.table),
        )
        .await
        .map_err(|e| MySqlError::driver(format!("cannot describe {table}"), e))?;
    if cols.is_empty() {
        return Err(MySqlError::new(
            ErrorKind::Config,
            format!("table {table} does not exist (or the user may not see it)"),
        ));
    }
    let pk: Vec<String> = c
        .exec(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS \
              WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND INDEX_NAME = 'PRIMARY' \
              ORDER BY SEQ_IN_INDEX",
            (&table.database, &table.table),
        )
        .await
        .map_err(|e| MySqlError::driver(format!("cannot read the primary key of {table}"), e))?;
    let leading: Vec<String> = c
        .exec(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS \
              WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND SEQ_IN_INDEX = 1",
            (&table.database, &table.table),
        )
        .await
        .map_err(|e| MySqlError::driver(format!("cannot read the indexes of {table}"), e))?;
    let Some(cur) = cols.iter().find(|c| c.0 == cursor) else {
        return Err(MySqlError::new(
            ErrorKind::Config,
            format!("{table} has no column {cursor:?} to use as its cursor"),
        ));
    };
    if pk.is_empty() {
        return Err(MySqlError::new(
            ErrorKind::Config,
            format!(
                "{table} has no primary key: rows with equal cursor values are told apart by it"
            ),
        ));
    }
    let mut position = Vec::new();
    for name in std::iter::once(cursor).chain(pk.iter().map(String::as_str)) {
        let Some(col) = cols.iter().find(|c| c.0 == name) else {
            continue;
        };
        let bind = bind_of(&col.1, &col.2, col.4, col.5, col.6)
            .map_err(|e| MySqlError::new(ErrorKind::Config, format!("{table}.{name}: {e}")))?;
        let q = format!("t.{}", quote(name));
        let text = if bind == "UNHEX(?)" {
            format!("HEX({q})")
        } else {
            format!("CAST({q} AS CHAR)")
        };
        position.push((name.to_string(), text, bind));
    }
    Ok(Described {
        table: table.clone(),
        columns: cols.iter().map(|c| Box::from(c.0.as_str())).collect(),
        kinds: cols.iter().map(|c| kind_of(&c.1, &c.2)).collect(),
        pk_names: pk.iter().map(|n| Box::from(n.as_str())).collect(),
        position,
        cursor_nullable: cur.3.eq_ignore_ascii_case("YES"),
        cursor_indexed: leading.iter().any(|n| n == cursor),
    })
}

/// The four keyset statements of a table (`?` parameters, values never in the text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Statements {
    /// New rows from the start: limit.
    pub(crate) first: String,
    /// New rows after a position: the cursor, the position, limit.
    pub(crate) after: String,
    /// Re-read from the start: the cursor, the upper bound, limit.
    pub(crate) reread_first: String,
    /// Re-read after a position: the cursor, the lower bound, the cursor, the upper
    /// bound, limit.
    pub(crate) reread_after: String,
}

/// Builds the statements: identifiers quoted, every value a parameter.
pub(crate) fn statements(d: &Described) -> Statements {
    let sel: Vec<String> = d
        .columns
        .iter()
        .zip(d.kinds.iter())
        .map(|(c, k)| {
            let q = format!("t.{}", quote(c));
            match k {
                Kind::Text { cast: true } => format!("CAST({q} AS CHAR)"),
                _ => q,
            }
        })
        .chain(d.position.iter().map(|(_, text, _)| text.clone()))
        .collect();
    let cols: Vec<String> = d
        .position
        .iter()
        .map(|(c, ..)| format!("t.{}", quote(c)))
        .collect();
    let binds: Vec<&str> = d.position.iter().map(|(.., b)| b.as_str()).collect();
    let order = cols.join(", ");
    let cursor = &cols[0];
    let all = binds.join(", ");
    let base = format!("SELECT {} FROM {} t", sel.join(", "), d.table.quoted());
    // The redundant range on the cursor alone lets an index on it bound the scan.
    let after = format!("{cursor} >= {} AND ({order}) > ({all})", binds[0]);
    let upto = format!("{cursor} <= {} AND ({order}) <= ({all})", binds[0]);
    Statements {
        first: format!("{base} WHERE {cursor} IS NOT NULL ORDER BY {order} LIMIT ?"),
        after: format!("{base} WHERE {after} ORDER BY {order} LIMIT ?"),
        reread_first: format!("{base} WHERE {upto} ORDER BY {order} LIMIT ?"),
        reread_after: format!("{base} WHERE {after} AND {upto} ORDER BY {order} LIMIT ?"),
    }
}

/// `position` once per bound column: the cursor's value, then each part.
fn bound(position: &Position) -> Vec<mysql_async::Value> {
    let mut out = Vec::with_capacity(position.len() + 1);
    out.extend(
        position
            .first()
            .map(|v| mysql_async::Value::from(v.as_str())),
    );
    out.extend(
        position
            .iter()
            .map(|v| mysql_async::Value::from(v.as_str())),
    );
    out
}

/// Reads one page of at most `limit` rows in `tx`, each with its position.
pub(crate) async fn read_page(
    tx: &mut mysql_async::Transaction<'_>,
    d: &Described,
    sql: &Statements,
    read: Read<'_>,
    limit: usize,
) -> Result<Vec<(RowEvent, Position)>, MySqlError> {
    let limit = mysql_async::Value::from(u64::try_from(limit.max(1)).unwrap_or(u64::MAX));
    let mut params: Vec<mysql_async::Value> = Vec::new();
    let statement = match read {
        Read::New(None) => &sql.first,
        Read::New(Some(after)) => {
            params.extend(bound(after));
            &sql.after
        }
        Read::Again { range, from, .. } => {
            let start = from.or(range.after.as_ref());
            if let Some(after) = start {
                params.extend(bound(after));
            }
            params.extend(bound(&range.upto));
            if start.is_some() {
                &sql.reread_after
            } else {
                &sql.reread_first
            }
        }
    };
    params.push(limit);
    // Prepared once per connection (the driver's statement cache): a poll of a quiet
    // table is then an execute, not a parse and plan.
    let rows: Vec<mysql_async::Row> = tx
        .exec(statement.as_str(), params)
        .await
        .map_err(|e| MySqlError::driver(format!("cannot read a page of {}", d.table), e))?;
    let schema: Arc<str> = Arc::from(d.table.database.as_str());
    let name: Arc<str> = Arc::from(d.table.table.as_str());
    let n = d.columns.len();
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let values = (0..n)
            .map(|i| value(r.as_ref(i).unwrap_or(&mysql_async::Value::NULL), d.kinds[i]))
            .collect();
        let position: Position = (n..n + d.position.len())
            .map(|i| match r.as_ref(i) {
                Some(mysql_async::Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(other) => other.as_sql(true).trim_matches('\'').to_string(),
                None => String::new(),
            })
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

/// One value of the binary protocol as the binlog source would give it.
pub(crate) fn value(v: &mysql_async::Value, kind: Kind) -> freshen::Value {
    use mysql_async::Value as V;
    match (v, kind) {
        (V::NULL, _) => freshen::Value::Null,
        (V::Int(i), _) => freshen::Value::Int(*i),
        (V::UInt(u), _) => match i64::try_from(*u) {
            Ok(i) => freshen::Value::Int(i),
            Err(_) => freshen::Value::Text(u.to_string().into()),
        },
        (V::Float(f), _) => freshen::Value::Float(f64::from(*f)),
        (V::Double(f), _) => freshen::Value::Float(*f),
        (V::Bytes(b), Kind::Bytes) => freshen::Value::Bytes(b.clone().into()),
        (V::Bytes(b), Kind::Json) => match std::str::from_utf8(b) {
            Ok(s) => freshen::Value::Json(s.into()),
            Err(_) => freshen::Value::Bytes(b.clone().into()),
        },
        (V::Bytes(b), Kind::Int { .. }) => {
            let s = String::from_utf8_lossy(b);
            s.parse::<i64>()
                .map_or_else(|_| freshen::Value::Text(s.into()), freshen::Value::Int)
        }
        (V::Bytes(b), _) => match std::str::from_utf8(b) {
            Ok(s) => freshen::Value::Text(s.into()),
            Err(_) => freshen::Value::Bytes(b.clone().into()),
        },
        // Temporal values are selected as text (`CAST(… AS CHAR)`); these arms are for
        // a driver that decodes them anyway.
        (other, _) => freshen::Value::Text(other.as_sql(true).trim_matches('\'').into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described() -> Described {
        Described {
            table: TableName::new("app", "my`t"),
            columns: vec![Box::from("id"), Box::from("updated_at"), Box::from("v")].into(),
            kinds: vec![
                Kind::Int { unsigned: false },
                Kind::Text { cast: true },
                Kind::Bytes,
            ]
            .into(),
            pk_names: vec![Box::from("id")].into(),
            position: vec![
                (
                    "updated_at".into(),
                    "CAST(t.`updated_at` AS CHAR)".into(),
                    "CAST(? AS DATETIME(6))".into(),
                ),
                (
                    "id".into(),
                    "CAST(t.`id` AS CHAR)".into(),
                    "CAST(? AS SIGNED)".into(),
                ),
            ],
            cursor_nullable: false,
            cursor_indexed: true,
        }
    }

    #[test]
    fn statements_quote_identifiers_and_bind_every_value_through_its_type() {
        let s = statements(&described());
        assert!(s.first.contains("FROM `app`.`my``t` t"), "{}", s.first);
        assert!(s.first.starts_with(
            "SELECT t.`id`, CAST(t.`updated_at` AS CHAR), t.`v`, CAST(t.`updated_at` AS CHAR), CAST(t.`id` AS CHAR) FROM"
        ));
        assert!(s.first.ends_with("ORDER BY t.`updated_at`, t.`id` LIMIT ?"));
        assert!(
            s.after.contains(
                "t.`updated_at` >= CAST(? AS DATETIME(6)) AND (t.`updated_at`, t.`id`) > (CAST(? AS DATETIME(6)), CAST(? AS SIGNED))"
            ),
            "{}",
            s.after
        );
        assert_eq!(s.reread_after.matches('?').count(), 7, "{}", s.reread_after);
        assert_eq!(s.reread_first.matches('?').count(), 4);
        assert_eq!(s.after.matches('?').count(), 4);
    }

    #[test]
    fn types_map_as_the_binlog_decodes_them_and_unpageable_ones_are_refused() {
        assert_eq!(
            kind_of("bigint", "bigint(20) unsigned"),
            Kind::Int { unsigned: true }
        );
        assert_eq!(
            kind_of("datetime", "datetime(3)"),
            Kind::Text { cast: true }
        );
        assert_eq!(kind_of("varbinary", "varbinary(16)"), Kind::Bytes);
        assert_eq!(
            kind_of("varchar", "varchar(10)"),
            Kind::Text { cast: false }
        );
        assert_eq!(
            value(
                &mysql_async::Value::UInt(u64::MAX),
                Kind::Int { unsigned: true }
            ),
            freshen::Value::text("18446744073709551615")
        );
        assert_eq!(
            value(
                &mysql_async::Value::Bytes(b"12.50".to_vec()),
                Kind::Text { cast: true }
            ),
            freshen::Value::text("12.50")
        );
        assert_eq!(
            value(&mysql_async::Value::Bytes(vec![0, 1]), Kind::Bytes),
            freshen::Value::Bytes(vec![0, 1].into())
        );
        assert_eq!(
            bind_of("decimal", "decimal(10,2)", Some(10), Some(2), None).unwrap(),
            "CAST(? AS DECIMAL(10, 2))"
        );
        assert_eq!(
            bind_of("timestamp", "timestamp(3)", None, None, Some(3)).unwrap(),
            "CAST(? AS DATETIME(3))"
        );
        assert_eq!(
            bind_of("int", "int(10) unsigned", None, None, None).unwrap(),
            "CAST(? AS UNSIGNED)"
        );
        for refused in ["float", "double", "enum", "set", "json", "bit"] {
            assert!(
                bind_of(refused, refused, None, None, None).is_err(),
                "{refused}"
            );
        }
    }

    #[test]
    fn table_names_parse_with_a_default_database() {
        assert_eq!(
            TableName::parse("app.events", None).unwrap(),
            TableName::new("app", "events")
        );
        assert_eq!(
            TableName::parse("events", Some("app")).unwrap(),
            TableName::new("app", "events")
        );
        assert_eq!(
            TableName::parse("a.b.c", None).unwrap_err(),
            "invalid table name \"a.b.c\" (expected database.table)"
        );
        assert_eq!(
            TableName::parse("`App`.`Ev``ents`", None).unwrap(),
            TableName::new("App", "Ev`ents")
        );
        assert!(TableName::parse("events", None).is_err());
    }
}
