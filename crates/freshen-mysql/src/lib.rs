//! MySQL and MariaDB for freshen.

pub mod binlog;
