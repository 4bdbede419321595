//! Throwaway real servers for freshen's tests and benchmarks.
//!
//! Tests that claim a database's behaviour run against the real thing, started by the
//! test and stopped when it ends. This crate starts them quickly and cleans up after
//! them. Tests and benchmarks use it as a dev-dependency; the `freshen` binary uses
//! [`PgServer`] for `freshen demo`, whose throwaway database is exactly this one.
//!
//! - [`PgServer`]: a PostgreSQL cluster in a temporary directory, `wal_level=logical`,
//!   on a free loopback port with its own socket directory, tuned for speed (no fsync).
//!   Stop, kill and start it again for fault tests; dropping it stops it and removes
//!   its directory.
//!
//! - [`MariaDbServer`]: a MariaDB server in a temporary directory with the row-based
//!   binlog freshen reads (`binlog_format=ROW`, full row images and metadata, CRC32
//!   checksums), on a free loopback port with its own socket. Stop, kill and start it
//!   again like [`PgServer`].
//!
//! A missing server binary is an error that names the package to install, never a
//! silent skip.
//!
//! ```no_run
//! let pg = freshen_testenv::PgServer::start().expect("PostgreSQL for tests");
//! println!("connect to {}", pg.url());
//! pg.psql("CREATE TABLE t (id int PRIMARY KEY)").unwrap();
//! ```
//!
//! Broker modules (`kafka`, `pulsar`) go beside `postgres` and share [`support`].
//! [`refresher`] holds what tests of every source share: a refresher running on a task
//! and polling with a deadline. [`child`] runs part of a test in a process of its own,
//! for crash tests that kill it with SIGKILL.

mod broker;
pub mod browser;
pub mod child;
mod error;
mod kafka;
mod mariadb;
mod postgres;
mod pulsar;
pub mod reference;
pub mod refresher;
pub mod support;

pub use error::TestEnvError;
pub use kafka::{KafkaFlavor, KafkaServer};
pub use mariadb::{MariaDbServer, MariaDbServerBuilder};
pub use postgres::{PgServer, PgServerBuilder, Shutdown};
pub use pulsar::PulsarServer;
