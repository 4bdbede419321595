//! What `freshen check` asks of PostgreSQL: a source set up for logical replication
//! (wal_level, privilege, slot, publication, replica identities) and rebuild statements
//! that prepare with the view's key. Every finding says what to do.
//!
//! Its parts: the source's findings (`source.rs`), rebuild statements
//! ([`statements`]), a view's tables and dependencies ([`check_view`]), query-mode
//! views ([`query_view`]), and the replica identity a view needs
//! ([`recommend`](crate::recommend)). The catalog helpers they share live in the
//! crate's `catalog`, `publication` and `spelling` modules and are re-exported here.

mod columns;
pub mod depends;
pub(crate) mod identity;
mod query_view;
mod source;
mod statements;
pub(crate) mod toast;
mod view;

pub use crate::catalog::{Column, TypeInfo, columns, key_fits, partitioned, type_info};
pub use crate::error::db_message;
pub use crate::publication::{
    Unpublishable, publication_privileges, refuse_to_publish, unpublishable,
};
pub use crate::spelling::closest;
pub use freshen::plug::missing_params;
pub use query_view::{query_view, query_view_across};
pub use source::LAG_WARNING_BYTES;
pub(crate) use source::source;
pub use statements::{StatementShape, statements};
pub use view::check_view;
