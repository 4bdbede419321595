//! The configuration reference's vocabulary: a table of the file, its keys, their
//! defaults and accepted values. A kind's crate describes the tables its settings type
//! reads ([`Documented`]), beside that type; the program that reads the file collects
//! them into its reference (`freshen config reference`) and holds them to its parser.

/// What a key holds when the file leaves it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Omitted {
    /// The key must be given; an example value (TOML), which the tests write.
    Required(&'static str),
    /// Nothing: the feature it sets is off; an example value (TOML).
    Unset(&'static str),
    /// This value, written as TOML: the tests check that writing it changes nothing.
    Is(&'static str),
    /// A value that depends on others, in words; an example value (TOML).
    Derived(&'static str, &'static str),
}

/// The values the parser accepts, where it checks more than the type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// Any value of the type.
    Any,
    /// An integer from `.0` to `.1`, both included.
    Int(i64, i64),
    /// A duration (`"250ms"`, `"10s"`, `"1h"`) from `.0` to `.1` milliseconds.
    Millis(u64, u64),
    /// One of these strings.
    OneOf(&'static [&'static str]),
}

/// One key of a table.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// As written in the file.
    pub name: &'static str,
    /// Its TOML type, in words.
    pub ty: &'static str,
    /// When left out.
    pub default: Omitted,
    /// What the parser accepts.
    pub range: Range,
    /// What it does.
    pub about: &'static str,
}

/// A shorthand for the tables of keys.
pub const fn key(
    name: &'static str,
    ty: &'static str,
    default: Omitted,
    range: Range,
    about: &'static str,
) -> Key {
    Key {
        name,
        ty,
        default,
        range,
        about,
    }
}

/// One table of the file (or one kind's keys of a shared table such as `[source]`).
#[derive(Debug, Clone, Copy)]
pub struct Table {
    /// Its heading, e.g. `[http]` or `[source] kind = "mysql"`.
    pub header: &'static str,
    /// What it is for.
    pub about: &'static str,
    /// Its keys, in the order the reference lists them.
    pub keys: &'static [Key],
}

/// A settings type that documents the tables it reads, for the configuration
/// reference: written once, beside the type, in its crate.
pub trait Documented {
    /// Its tables, in the order the reference lists them (the kind's own first).
    const REFERENCE: &'static [Table];
}

/// An hour, in the milliseconds of [`Range::Millis`].
pub const HOUR_MS: u64 = 3_600_000;
