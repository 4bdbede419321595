//! Shared helpers for the Pulsar integration tests.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use freshen::Key;
use freshen_pulsar::PulsarProducer;
use freshen_testenv::PulsarServer;

pub use freshen_testenv::refresher::{DEADLINE, Running, until};

/// Starts pulsar-lite; fails with the install hint when it is missing.
pub fn broker() -> PulsarServer {
    PulsarServer::start().unwrap_or_else(|e| panic!("pulsar-lite: {e}"))
}

pub fn topic(name: &str) -> String {
    format!("persistent://public/default/{name}")
}

pub async fn producer(pulsar: &PulsarServer, name: &str) -> PulsarProducer {
    PulsarProducer::connect(&pulsar.url(), &topic(name))
        .await
        .expect("a producer")
}

/// A TiCDC canal-json INSERT of one `demo.readings` row.
pub fn ticdc_insert(id: i64, device: &str, value: i64) -> Vec<u8> {
    format!(
        r#"{{"id":0,"database":"demo","table":"readings","pkNames":["id"],"isDdl":false,"type":"INSERT","es":1786358942713,"ts":1786358944991,"sql":"","sqlType":{{"id":4,"device":12,"value":4}},"mysqlType":{{"id":"int","device":"varchar","value":"int"}},"old":null,"data":[{{"id":"{id}","device":"{device}","value":"{value}"}}]}}"#
    )
    .into_bytes()
}

/// A TiCDC canal-json UPDATE of row `id` on `device`.
pub fn ticdc_update(id: i64, device: &str, value: i64) -> Vec<u8> {
    format!(
        r#"{{"id":0,"database":"demo","table":"readings","pkNames":["id"],"isDdl":false,"type":"UPDATE","es":1786358942713,"ts":1786358944991,"sql":"","sqlType":{{"id":4,"device":12,"value":4}},"mysqlType":{{"id":"int","device":"varchar","value":"int"}},"old":[{{"id":"{id}","device":"{device}","value":"0"}}],"data":[{{"id":"{id}","device":"{device}","value":"{value}"}}]}}"#
    )
    .into_bytes()
}

/// A TiCDC canal-json UPDATE of a row too large for the topic, sent with its handle key
/// only (`large-message-handle-option=handle-key-only`).
pub fn ticdc_key_only(id: i64) -> Vec<u8> {
    format!(
        r#"{{"id":0,"database":"demo","table":"readings","pkNames":["id"],"isDdl":false,"type":"UPDATE","es":1786358942713,"ts":1786358944991,"sql":"","sqlType":{{"id":4}},"mysqlType":{{"id":"int"}},"old":[{{"id":"{id}"}}],"data":[{{"id":"{id}"}}],"_tidb":{{"commitTs":434919270523076621,"onlyHandleKey":true}}}}"#
    )
    .into_bytes()
}

pub fn ticdc_ddl() -> Vec<u8> {
    br#"{"id":0,"database":"demo","table":"readings","pkNames":null,"isDdl":true,"type":"CREATE","es":1786358942713,"ts":1786358943021,"sql":"CREATE TABLE readings (id INT PRIMARY KEY, device VARCHAR(64), value INT)","sqlType":null,"mysqlType":null,"data":null,"old":null}"#.to_vec()
}

pub fn ticdc_watermark() -> Vec<u8> {
    br#"{"id":0,"database":"","table":"","pkNames":null,"isDdl":false,"type":"TIDB_WATERMARK","es":1659085352032,"ts":1659085354502,"sql":"","sqlType":null,"mysqlType":null,"data":null,"old":null,"_tidb":{"watermarkTs":434919270523076621}}"#.to_vec()
}

/// Keys rebuilt so far.
#[derive(Clone, Default)]
pub struct Rebuilt(Arc<Mutex<Vec<Key>>>);

impl Rebuilt {
    pub fn push(&self, k: Key) {
        self.0.lock().unwrap().push(k);
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    pub fn distinct(&self) -> BTreeSet<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|k| k.to_string())
            .collect()
    }
}
