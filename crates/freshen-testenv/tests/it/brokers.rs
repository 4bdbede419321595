//! The throwaway brokers start on a free loopback port, speak their protocol, stop.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use freshen_testenv::{KafkaFlavor, KafkaServer, PulsarServer};

/// Sends a Kafka ApiVersions (v0) request and returns the correlation id of the answer.
fn kafka_api_versions(port: u16) -> i32 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let client = b"testenv";
    let mut body = Vec::new();
    body.extend_from_slice(&18i16.to_be_bytes()); // ApiVersions
    body.extend_from_slice(&0i16.to_be_bytes()); // version 0
    body.extend_from_slice(&4242i32.to_be_bytes()); // correlation id
    body.extend_from_slice(&(client.len() as i16).to_be_bytes());
    body.extend_from_slice(client);
    s.write_all(&(body.len() as i32).to_be_bytes()).unwrap();
    s.write_all(&body).unwrap();
    let mut head = [0u8; 8];
    s.read_exact(&mut head).unwrap();
    i32::from_be_bytes(head[4..8].try_into().unwrap())
}

#[test]
fn kafka_brokers_answer_and_stop() {
    for flavor in KafkaFlavor::ALL {
        let mut kafka = KafkaServer::start_flavor(flavor).expect("start the broker");
        assert_eq!(kafka.flavor(), flavor);
        assert_eq!(kafka.bootstrap(), format!("127.0.0.1:{}", kafka.port()));
        assert_eq!(
            kafka_api_versions(kafka.port()),
            4242,
            "{flavor} speaks Kafka"
        );
        let dir = kafka.dir().to_path_buf();
        assert!(dir.is_dir());
        kafka.kill();
        assert!(!kafka.is_running());
        assert!(
            TcpStream::connect(("127.0.0.1", kafka.port())).is_err(),
            "{flavor} stopped"
        );
        drop(kafka);
        assert!(!dir.exists(), "the directory is removed");
    }
}

#[test]
fn two_kafka_brokers_run_side_by_side() {
    let a = KafkaServer::start().unwrap();
    let b = KafkaServer::start().unwrap();
    assert_ne!(a.port(), b.port());
    assert_eq!(kafka_api_versions(a.port()), 4242);
    assert_eq!(kafka_api_versions(b.port()), 4242);
}

#[test]
fn pulsar_broker_answers_connect_and_stops() {
    let mut pulsar = PulsarServer::start().expect("start pulsar-lite");
    let _second = PulsarServer::start().expect("a second one beside it (no fixed metrics port)");
    assert_eq!(
        pulsar.url(),
        format!("pulsar://127.0.0.1:{}", pulsar.port())
    );
    let mut s = TcpStream::connect(("127.0.0.1", pulsar.port())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // BaseCommand { type: CONNECT, connect: { client_version: "t", protocol_version: 6 } }
    let cmd = [0x08, 0x02, 0x12, 0x05, 0x0a, 0x01, b't', 0x20, 0x06];
    let mut frame = Vec::new();
    frame.extend_from_slice(&(4 + cmd.len() as u32).to_be_bytes());
    frame.extend_from_slice(&(cmd.len() as u32).to_be_bytes());
    frame.extend_from_slice(&cmd);
    s.write_all(&frame).unwrap();
    let mut head = [0u8; 10];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head[8..10], &[0x08, 0x03], "a CONNECTED answer");
    pulsar.restart().expect("restart on the same port");
    assert!(pulsar.is_running());
    assert!(TcpStream::connect(("127.0.0.1", pulsar.port())).is_ok());
    pulsar.kill();
    assert!(!pulsar.is_running());
}

#[test]
fn kafka_broker_restarts_on_its_port() {
    let mut kafka = KafkaServer::start().unwrap();
    let port = kafka.port();
    kafka.restart().expect("restart");
    assert_eq!(kafka.port(), port);
    assert_eq!(kafka_api_versions(port), 4242);
}
