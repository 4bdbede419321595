//! `Retry`: what a failure says about retrying it — the one retry directive every crate
//! speaks.
//!
//! A rebuild can fail because of the key (its SQL raised for this key's data) or because
//! of the way to the database (an outage, an overload, a conflict, a timeout). Only the
//! first is evidence against the key: counting an outage toward quarantine would turn a
//! one-second restart into keys dropped for good. So adapters classify their errors from
//! codes (SQLSTATE, MySQL error numbers) into this enum and the refresher acts on it:
//!
//! | directive | retried | counts toward `poison_after` | the view meanwhile             |
//! |-----------|---------|------------------------------|--------------------------------|
//! | `Key`     | backoff | yes                          | goes on with other keys        |
//! | `Path`    | backoff | no                           | probes with one rebuild at once, reports itself stalled |
//! | `Fix`     | backoff | no                           | as `Path`, and says a person must act |

use std::fmt;

/// What a failure says about retrying it: a key, its path or its configuration (see the variants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Retry {
    /// The key's own data made the work fail (a constraint, a division by zero, a RAISE):
    /// retry with backoff; repeated failures quarantine the key.
    Key,
    /// The way to the database failed (connection refused or lost, server shutting down,
    /// too many connections, serialization failure, deadlock, timeout): retry with
    /// backoff and never quarantine — an outage delays rebuilds, it never drops them.
    Path,
    /// Retrying cannot succeed until a person changes something (a missing table or
    /// column, a privilege, the configuration); retried with backoff so that the fix is
    /// picked up without a restart, never quarantined.
    Fix,
}

impl Retry {
    /// Whether a failure of this kind counts toward quarantine.
    pub fn blames_key(self) -> bool {
        self == Retry::Key
    }

    /// The directive's name, as logs and metrics spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Retry::Key => "key",
            Retry::Path => "path",
            Retry::Fix => "fix",
        }
    }
}

impl fmt::Display for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
