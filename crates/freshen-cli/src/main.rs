//! `freshen`: keep derived tables fresh from change-data-capture, driven by a TOML file.
//!
//! This file only parses arguments, starts the runtime and maps outcomes to exit codes:
//! 0 success, 1 failure (a mismatch, a failed check, a fatal error), 2 a bad configuration.

use std::process::ExitCode;

use clap::Parser;
use freshen_cli::args::{Args, Command, ConfigCommand};
use freshen_cli::config::{self, LogFormat};
use freshen_cli::{check, demo, drop, logging, status};

async fn dispatch(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::Run { file, role } => freshen_cli::run::run(&file.config, role).await,
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
            url_env,
            output,
        } => {
            let request = freshen_cli::init::Request {
                name,
                into,
                query,
                from_matview,
                key,
                create,
                url_env,
            };
            match freshen_cli::init::starting_file(&request, &|line| eprintln!("{line}")).await {
                Ok(written) => {
                    for done in &written.created {
                        eprintln!("done: {done}");
                    }
                    match output {
                        Some(path) => {
                            freshen_cli::init::write_new(&path, &written.file)?;
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
        Command::Demo {
            duration,
            writers,
            keep,
            listen,
        } => {
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
            println!("freshen {}", freshen_cli::args::version());
            Ok(ExitCode::SUCCESS)
        }
        Command::Snapshot { file, sink, tables } => {
            let cfg = match config::load_offline(&file.config) {
                Ok(c) => c,
                Err(e) => {
                    eprint!("{e}");
                    return Ok(ExitCode::from(2));
                }
            };
            let out = match sink {
                Some(n) => freshen_cli::snapshot::run_sink(&cfg, n, &tables).await?,
                None => freshen_cli::snapshot::run(&cfg, &tables).await?,
            };
            println!("{out}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Config {
            command: ConfigCommand::Reference,
        } => {
            freshen_cli::reference::print();
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            freshen_cli::args::completions(shell);
            Ok(ExitCode::SUCCESS)
        }
        Command::Help { command } => Ok(freshen_cli::args::help(command.as_deref())),
        Command::Drop { file } => {
            let cfg = match config::load(&file.config) {
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

fn main() -> ExitCode {
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
