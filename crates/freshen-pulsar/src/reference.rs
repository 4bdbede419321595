//! The `[source]` keys of `kind = "pulsar"` (`freshen_pulsar::PulsarSourceConfig`).

use freshen::reference::{Documented, Omitted::*, Range::*, Table, key};

const SOURCE: Table = Table {
    header: "[source] kind = \"pulsar\"",
    about: "Change messages (TiCDC's canal-json, or Debezium JSON) from a Pulsar topic, through a failover subscription: standbys wait. Needs a `[target]`.",
    keys: &[
        key(
            "url",
            "string",
            Required("\"pulsar://broker:6650\""),
            Any,
            "Service URL, `pulsar://host:port` (several hosts: `pulsar://a:6650,b:6650`).",
        ),
        key(
            "topic",
            "string",
            Required("\"cdc\""),
            Any,
            "`persistent://tenant/namespace/name`, or a short name for `persistent://public/default/<name>`; one partition of a partitioned topic is `…/<name>-partition-<n>` (one source per partition).",
        ),
        key(
            "subscription",
            "string",
            Required("\"freshen\""),
            Any,
            "Subscription name; instances sharing it share one failover subscription.",
        ),
        key(
            "consumer_name",
            "string",
            Derived("`freshen-<random>`", "\"freshen-a\""),
            Any,
            "This consumer's name; the broker picks the active consumer of a failover subscription by name order.",
        ),
        key(
            "format",
            "string",
            Is("\"canal-json\""),
            OneOf(&["canal-json", "debezium"]),
            "Wire format of the messages.",
        ),
        key(
            "max_batch",
            "integer",
            Is("1000"),
            Int(1, 1_000_000),
            "Most messages in one batch.",
        ),
        key(
            "batch_linger_ms",
            "integer",
            Is("10"),
            Int(0, 60_000),
            "How long a batch waits for more messages after its first, in ms.",
        ),
        key(
            "receiver_queue",
            "integer",
            Is("1000"),
            Int(2, 1_000_000),
            "Messages the broker may push ahead of processing (flow permits).",
        ),
        key(
            "token",
            "string",
            Unset("\"eyJhbGciOiJIUzI1NiJ9.e30.x\""),
            Any,
            "Authentication token (JWT), sent as Pulsar's `token` method; never logged.",
        ),
    ],
};

impl Documented for crate::PulsarSourceConfig {
    const REFERENCE: &'static [Table] = &[SOURCE];
}

#[cfg(test)]
mod tests {
    use freshen_testenv::reference::{fields, same_keys};

    use super::*;

    #[test]
    fn every_key_the_parser_accepts_is_documented_and_no_other() {
        same_keys(&SOURCE, fields::<crate::PulsarSourceConfig>());
    }
}
