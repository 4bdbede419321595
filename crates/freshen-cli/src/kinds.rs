//! The kinds this binary knows: one registration line each, and nothing else of theirs.
//!
//! Everything about a kind — its keys and defaults, validation, `check`, start-up,
//! `drop` — lives in its crate, behind the core's plug traits
//! ([`freshen::plug::SourcePlug`], [`TargetPlug`](freshen::plug::TargetPlug),
//! [`SinkPlug`](freshen::plug::SinkPlug)). To add one: implement the trait in its crate
//! and add its line here. A line with a cargo feature registers the kind either way: a
//! build without the feature knows its names and says which feature adds it.

use std::sync::OnceLock;

use crate::registry::{Kind, Kinds, Registry, source, target};

/// A registration line: the names a kind answers to, optionally the cargo feature of
/// `freshen-cli` that builds it in, and how it is made (not compiled without the
/// feature).
macro_rules! kind {
    ($names:expr, $make:expr) => {
        Kind::built($names, $make)
    };
    ($names:expr, feature = $feature:literal, $make:expr) => {{
        #[cfg(feature = $feature)]
        let kind = Kind::featured($names, $feature, $make);
        #[cfg(not(feature = $feature))]
        let kind = Kind::left_out($names, $feature);
        kind
    }};
}

/// Every kind this binary registers, in the order messages list them.
#[rustfmt::skip]
pub fn builtin() -> &'static Kinds {
    static KINDS: OnceLock<Kinds> = OnceLock::new();
    KINDS.get_or_init(|| Kinds {
        sources: Registry::new(vec![
            kind!(&["postgres"], source::<freshen_postgres::PgSourceSettings>(true)),
            kind!(&["postgres-incremental"], source::<freshen_postgres::PgIncrementalSettings>(true)),
            kind!(&["mysql"], feature = "mysql", source::<freshen_mysql::MySqlSourceConfig>(true)),
            kind!(&["mysql-incremental"], feature = "mysql", source::<freshen_mysql::MySqlIncrementalSettings>(true)),
            kind!(&["kafka"], feature = "kafka", source::<freshen_kafka::KafkaSourceConfig>(false)),
            kind!(&["pulsar"], feature = "pulsar", source::<freshen_pulsar::PulsarSourceConfig>(false)),
        ]),
        targets: Registry::new(vec![
            kind!(&["postgres", "postgresql"], target::<freshen_postgres::PgTarget>()),
            kind!(&["mysql", "mariadb"], feature = "mysql", target::<freshen_mysql::MySqlTarget>()),
        ]),
        sinks: Registry::new(vec![
            kind!(&["kafka"], feature = "kafka", crate::registry::sink::<freshen_kafka::KafkaSinkConfig>()),
            kind!(&["kafka-outbox"], feature = "kafka", crate::registry::sink::<freshen_kafka::KafkaOutboxConfig>()),
        ]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_opened_by_its_scheme() {
        let t = builtin()
            .open_target("postgres://u@localhost/app")
            .expect("a PostgreSQL URL");
        assert_eq!(t.name(), "PostgreSQL");
        let t = builtin()
            .open_target("postgresql://u@localhost/app")
            .expect("either spelling");
        assert_eq!(t.name(), "PostgreSQL");
    }

    #[test]
    fn an_unknown_scheme_names_every_kind_and_hides_the_password() {
        let p = builtin()
            .open_target("redis://u:hunter2@localhost/0")
            .unwrap_err();
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with(
                "must be a postgres:// (or postgresql://) or mysql:// (or mariadb://) URL"
            ) || p[0].starts_with("must be a postgres:// (or postgresql://) URL"),
            "{p:?}"
        );
        assert!(!p[0].contains("hunter2"), "{p:?}");
    }

    #[test]
    fn a_kind_left_out_of_the_build_names_its_feature() {
        let r = builtin().open_target("mysql://u@localhost/app");
        if cfg!(feature = "mysql") {
            assert_eq!(r.expect("a MySQL URL").name(), "MySQL/MariaDB");
        } else {
            assert_eq!(
                r.unwrap_err(),
                [
                    "a mysql:// target is not built into this freshen: build it with `--features mysql`"
                ]
            );
        }
    }
}
