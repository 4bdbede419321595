//! Where rebuilds run: SQL
//! rebuilds with the visibility rule, query-mode rebuilds (a plain query's batch filter
//! written around it) and their set-based merge (in
//! one database or across two), fan-out and enumeration statements, and key parts as
//! typed parameters.

pub(crate) mod across;
pub(crate) mod enumerate;
pub(crate) mod fanout;
pub(crate) mod keyed;
pub(crate) mod merge;
pub(crate) mod params;
pub(crate) mod query;
pub(crate) mod rebuild;
pub(crate) mod whole;
