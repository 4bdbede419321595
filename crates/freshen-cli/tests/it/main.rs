//! freshen-cli's integration tests, one binary: each module was a test binary of its own,
//! and every binary linked the whole dependency tree again (minutes on two cores).
//! `tests/support/` stays where it was, so a test file of its own still finds it.

#[path = "../support/mod.rs"]
mod support;

mod cli_admin;
#[cfg(feature = "kafka")]
mod cli_canary;
mod cli_changefeed;
mod cli_check;
mod cli_demo;
mod cli_failover;
mod cli_faults;
mod cli_habits;
mod cli_health;
mod cli_http;
mod cli_identity;
mod cli_incremental;
mod cli_infer;
mod cli_init;
mod cli_joins;
#[cfg(feature = "kafka")]
mod cli_kafka;
#[cfg(feature = "mysql")]
mod cli_mysql;
#[cfg(feature = "mysql")]
mod cli_mysql_incremental;
#[cfg(feature = "kafka")]
mod cli_outbox;
mod cli_page;
mod cli_privileges;
#[cfg(feature = "pulsar")]
mod cli_pulsar;
mod cli_query;
mod cli_query_target;
mod cli_reload;
mod cli_run;
#[cfg(feature = "kafka")]
mod cli_scale;
mod cli_schema;
mod cli_secrets;
mod cli_sets;
mod cli_shapes;
mod cli_standby;
mod cli_standby_source;
mod deploy;
mod deploy_kubernetes;
mod deploy_prometheus;
