//! `freshen`: keep derived tables fresh from change-data-capture, driven by a TOML file.
//!
//! Everything is in the library ([`freshen_cli::main`]), so tests drive it in-process.

fn main() -> std::process::ExitCode {
    freshen_cli::main()
}
