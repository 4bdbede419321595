//! `Error`: the one error type of this crate.

use std::fmt;

/// What went wrong talking to Kafka or setting up a client.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid; every problem found, one sentence each. Permanent.
    Config(Vec<String>),
    /// The Kafka client failed (creating it, subscribing, committing). Whether a retry
    /// helps depends on the cause: see [`Error::retry`].
    Client(rdkafka::error::KafkaError),
    /// A record could not be delivered (after the producer's own retries, up to
    /// `delivery_timeout_ms`). The batch it belonged to was not acknowledged.
    Delivery {
        /// The topic it was for.
        topic: String,
        /// Why.
        error: rdkafka::error::KafkaError,
    },
    /// The source a sink reads from failed for good.
    Source(freshen::SourceError),
}

impl Error {
    /// Whether trying again later may succeed ([`Retry::Path`](freshen::Retry): a broker
    /// down, a timeout), as opposed to a configuration or authorization problem that
    /// needs a person ([`Retry::Fix`](freshen::Retry)).
    pub fn retry(&self) -> freshen::Retry {
        match self {
            Error::Config(_) | Error::Source(_) => freshen::Retry::Fix,
            Error::Client(e) | Error::Delivery { error: e, .. } if needs_a_person(e) => {
                freshen::Retry::Fix
            }
            Error::Client(_) | Error::Delivery { .. } => freshen::Retry::Path,
        }
    }
}

/// Errors no retry can fix: the configuration or the credentials are wrong.
pub(crate) fn needs_a_person(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::Fatal
                | C::InvalidConfig
                | C::InvalidSessionTimeout
                | C::Authentication
                | C::TopicAuthorizationFailed
                | C::GroupAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::SaslAuthenticationFailed
                | C::UnsupportedFeature
        )
    )
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(problems) => {
                write!(f, "invalid Kafka configuration:")?;
                for p in problems {
                    write!(f, "\n  - {p}")?;
                }
                Ok(())
            }
            Error::Client(e) => write!(f, "Kafka client error: {e}"),
            Error::Delivery { topic, error } => {
                write!(f, "could not deliver a record to topic {topic:?}: {error}")
            }
            Error::Source(e) => write!(f, "the sink's source failed: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Config(_) => None,
            Error::Client(e) | Error::Delivery { error: e, .. } => Some(e),
            Error::Source(e) => Some(e),
        }
    }
}

impl From<rdkafka::error::KafkaError> for Error {
    fn from(e: rdkafka::error::KafkaError) -> Error {
        Error::Client(e)
    }
}
