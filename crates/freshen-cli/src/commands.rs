//! The `freshen` commands, dispatched: parse the arguments, start the runtime, map
//! outcomes to exit codes: 0 success, 1 failure (a mismatch, a failed check, a fatal
//! error), 2 a bad configuration.

use std::process::ExitCode;

use crate::args::{Args, Command, ConfigCommand};
use crate::config::{self, LogFormat};
use crate::{check, drop, logging, status};
use clap::Parser;

async fn dispatch(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::Run { file, role } => crate::run::run(&file.config, role).await,
        Command::Check {
            file,
            json,
            offline,
            deny_warnings,
        } => {
            let report = check::check(&file.config, offline).await;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(if report.ok && !(deny_warnings && report.warnings() > 0) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Init {
            name,
            into,
            query,
            from_matview,
            key,
            create,
            fix_identity,
            url_env,
            output,
        } => {
            let request = crate::init::Request {
                name,
                into,
                query,
                from_matview,
                key,
                create,
                fix_identity,
                url_env,
            };
            // Refused before anything runs: `--create` and `--fix-identity` change the
            // database, and the file would then be the one thing missing.
            if let Some(path) = output.as_ref().filter(|p| p.exists()) {
                eprintln!(
                    "{} exists: freshen init never writes over a file (name another with -o)",
                    path.display()
                );
                return Ok(ExitCode::FAILURE);
            }
            match crate::init::starting_file(&request, &|line| eprintln!("{line}")).await {
                Ok(written) => {
                    for done in &written.created {
                        eprintln!("done: {done}");
                    }
                    match output {
                        Some(path) => {
                            crate::init::write_new(&path, &written.file)?;
                            eprintln!(
                                "wrote {}; next: freshen check -c {0}, then freshen run -c {0}",
                                path.display()
                            );
                        }
                        None => print!("{}", written.file),
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(problems) => {
                    for p in problems {
                        eprintln!("{p}");
                    }
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        #[cfg(feature = "demo")]
        Command::Demo {
            duration,
            writers,
            keep,
            listen,
        } => {
            use crate::demo;
            let ok = demo::run(demo::DemoOptions {
                duration,
                writers: writers.max(1),
                keep,
                listen,
            })
            .await?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        // The demo starts its own PostgreSQL (the test environment's server), which an
        // embedder's build leaves out.
        #[cfg(not(feature = "demo"))]
        Command::Demo { .. } => {
            eprintln!(
                "freshen: `demo` is not built into this freshen: build it with `--features demo` (a default feature)"
            );
            Ok(ExitCode::FAILURE)
        }
        Command::Status { instance, json } => {
            let s = status::fetch(&instance.base_url()?).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", status::render(&s));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Health { instance } => {
            let url = instance.base_url()?;
            let (code, body) = status::get(&url, "/healthz").await?;
            if code == 200 {
                return Ok(ExitCode::SUCCESS);
            }
            eprintln!("{url}/healthz answered {code}: {}", body.trim_end());
            Ok(ExitCode::FAILURE)
        }
        Command::Version => {
            println!("freshen {}", crate::args::version());
            Ok(ExitCode::SUCCESS)
        }
        Command::Snapshot { file, sink, tables } => {
            let cfg = match config::load_offline(&file.config, crate::kinds::builtin()) {
                Ok(c) => c,
                Err(e) => {
                    eprint!("{e}");
                    return Ok(ExitCode::from(2));
                }
            };
            let out = match sink {
                Some(n) => crate::snapshot::run_sink(&cfg, n, &tables).await?,
                None => crate::snapshot::run(&cfg, &tables).await?,
            };
            println!("{out}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Config {
            command: ConfigCommand::Reference,
        } => {
            crate::reference::print();
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            crate::args::completions(shell);
            Ok(ExitCode::SUCCESS)
        }
        Command::Help { command } => Ok(crate::args::help(command.as_deref())),
        Command::Drop { file } => {
            let cfg = match config::load(&file.config, crate::kinds::builtin()) {
                Ok(c) => c,
                Err(e) => {
                    eprint!("{e}");
                    return Ok(ExitCode::from(2));
                }
            };
            for line in drop::drop_pipeline(&cfg).await? {
                println!("{line}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The `freshen` binary: parses the arguments, starts the runtime, runs the command and
/// maps its outcome to an exit code.
pub fn main() -> ExitCode {
    let args = Args::parse();
    match args.command {
        Command::Run { .. } => {}
        // The demo prints its own progress; logs only say what goes wrong.
        Command::Demo { .. } => logging::init(LogFormat::Text, "warn"),
        _ => logging::init(LogFormat::Text, "info"),
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("freshen: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(dispatch(args)) {
        Ok(code) => code,
        Err(e) => {
            // Errors from libraries may quote what they were given: no secrets.
            eprintln!("freshen: {}", freshen::redact_text(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}
