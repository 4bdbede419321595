//! Every supported column type, written by a real MariaDB and read back from its binlog:
//! the decoded value's text equals what the server's text protocol prints for the same
//! column (so streamed keys equal enumerated ones), and the quirks (ENUM index, SET
//! bitmask, DECIMAL, TIMESTAMP, charsets, signedness) come out as values.

use crate::support;

use freshen::{Op, Value};
use mysql_async::prelude::Queryable;
use support::*;

const TABLE: &str = "
CREATE TABLE app.types (
  id INT PRIMARY KEY,
  ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED,
  mi MEDIUMINT, mu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED,
  f FLOAT, d DOUBLE, dec1 DECIMAL(10,2), dec2 DECIMAL(30,10), dec3 DECIMAL(5,0),
  y YEAR, dt DATE, tm TIME, tm3 TIME(3), dtm DATETIME, dtm6 DATETIME(6),
  ts TIMESTAMP NULL, ts2 TIMESTAMP(2) NULL,
  c CHAR(5), vc VARCHAR(300), l1 VARCHAR(20) CHARACTER SET latin1,
  bin BINARY(3), vb VARBINARY(10), tx TEXT, bl BLOB, j JSON,
  e ENUM('red','green','blue'), s SET('a','b','c','d'), b BIT(10)
) ENGINE=InnoDB";

const ROW1: &str = "INSERT INTO app.types VALUES (1,
  -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295,
  -9223372036854775808, 18446744073709551615,
  1.5, -2.25, 12345678.90, -12345678901234567890.0123456789, 99999,
  2024, '2024-02-29', '-838:59:59', '12:34:56.789', '2024-02-29 13:14:15', '1999-12-31 23:59:59.123456',
  '2023-11-14 22:13:20', '2038-01-19 03:14:07.99',
  'ab', REPEAT('x', 300), 'café', 'a\\0b', X'00FF10', 'long text', X'DEADBEEF', '{\"k\": [1, 2]}',
  'blue', 'a,c,d', b'1010101010')";

const ROW2: &str = "INSERT INTO app.types (id, ti, tm, dec1, c, e, s) VALUES (2, 0, '00:00:01', -0.5, '', 'red', '')";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_decodes_to_the_servers_text() {
    let db = server();
    let mut c = sql(&db).await;
    exec(&mut c, TABLE).await;
    let mut src = source(config(&db, "types", &["app.types"])).await;
    exec(&mut c, ROW1).await;
    exec(&mut c, ROW2).await;
    exec(
        &mut c,
        "UPDATE app.types SET vc = 'moved', e = 'green' WHERE id = 2",
    )
    .await;
    exec(&mut c, "DELETE FROM app.types WHERE id = 2").await;
    let evs = events(&take_events(&mut src, 4, 30).await);
    assert_eq!(
        evs.iter().map(|e| e.op).collect::<Vec<_>>(),
        [Op::Insert, Op::Insert, Op::Update, Op::Delete]
    );
    assert_eq!(&*evs[0].pk_names, &[Box::<str>::from("id")][..]);

    // Typed values where the type matters.
    let r1 = evs[0].new.as_ref().unwrap();
    assert_eq!(r1.get("ti"), Some(&Value::Int(-128)));
    assert_eq!(r1.get("tu"), Some(&Value::Int(255)));
    assert_eq!(r1.get("mi"), Some(&Value::Int(-8_388_608)));
    assert_eq!(r1.get("iu"), Some(&Value::Int(4_294_967_295)));
    assert_eq!(r1.get("bu"), Some(&Value::text("18446744073709551615")));
    assert_eq!(r1.get("f"), Some(&Value::Float(1.5)));
    assert_eq!(r1.get("e"), Some(&Value::text("blue")));
    assert_eq!(r1.get("s"), Some(&Value::text("a,c,d")));
    assert_eq!(r1.get("l1"), Some(&Value::text("café")));
    assert_eq!(
        r1.get("vb"),
        Some(&Value::Bytes(vec![0, 0xff, 0x10].into()))
    );
    assert_eq!(
        r1.get("b"),
        Some(&Value::Bytes(vec![0b10, 0b1010_1010].into()))
    );
    let r2 = evs[1].new.as_ref().unwrap();
    assert_eq!(r2.get("ts"), Some(&Value::Null));
    assert_eq!(r2.get("s"), Some(&Value::text("")));
    let upd = &evs[2];
    assert_eq!(
        upd.old.as_ref().unwrap().get("e"),
        Some(&Value::text("red"))
    );
    assert_eq!(
        upd.new.as_ref().unwrap().get("e"),
        Some(&Value::text("green"))
    );
    assert_eq!(
        evs[3].old.as_ref().unwrap().get("vc"),
        Some(&Value::text("moved"))
    );

    // Every column's text equals the server's text protocol's (floats aside: their text
    // forms differ, as documented).
    let row: mysql_async::Row = c
        .query_first("SELECT * FROM app.types WHERE id = 1")
        .await
        .unwrap()
        .unwrap();
    let columns = row.columns();
    for (i, col) in columns.iter().enumerate() {
        let name = col.name_str();
        if name == "f" || name == "d" {
            continue;
        }
        let server: Option<Vec<u8>> = row.get(i);
        let ours = r1
            .get(&name)
            .unwrap_or_else(|| panic!("column {name} missing"));
        use mysql_async::consts::ColumnType as T;
        let stringish = matches!(
            col.column_type(),
            T::MYSQL_TYPE_STRING
                | T::MYSQL_TYPE_VAR_STRING
                | T::MYSQL_TYPE_VARCHAR
                | T::MYSQL_TYPE_BLOB
                | T::MYSQL_TYPE_TINY_BLOB
                | T::MYSQL_TYPE_MEDIUM_BLOB
                | T::MYSQL_TYPE_LONG_BLOB
                | T::MYSQL_TYPE_BIT
        );
        let binary = stringish && col.character_set() == 63;
        let expected = server.map(|b| {
            if binary {
                Value::Bytes(b.into()).to_text().unwrap().into_owned()
            } else {
                String::from_utf8(b).unwrap()
            }
        });
        assert_eq!(
            ours.to_text().map(|t| t.into_owned()),
            expected,
            "column {name}: binlog {ours:?}"
        );
    }
}
