//! Logical replication capture: the replication reader and its socket, pgoutput
//! decoding, rows and batches, feedback to the server, stall detection, and the
//! [`PgSource`](crate::PgSource) that hands batches to freshen, configured from the
//! `[source]` table ([`PgSourceSettings`](crate::PgSourceSettings)).

pub(crate) mod assemble;
pub(crate) mod drift;
pub(crate) mod durable;
pub(crate) mod feedback;
pub(crate) mod lowat;
pub(crate) mod pgoutput;
pub(crate) mod plug;
pub(crate) mod reader;
pub(crate) mod rows;
pub(crate) mod settings;
pub(crate) mod source;
pub(crate) mod stall;
pub(crate) mod streamed;
pub(crate) mod xid;
