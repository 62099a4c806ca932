//! The `countersign` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use countersign::config::Config;
use countersign::{Application, StartError, telemetry};
use countersign_core::bundle::{Bundle, BundleSources};
use countersign_core::{Clock, Store, SystemClock};

/// Countersign: the control plane between AI agents and the systems they act on.
///
/// Configuration comes from a TOML file (--config, COUNTERSIGN_CONFIG, or ./countersign.toml)
/// and COUNTERSIGN_* environment variables; see the README for every key.
#[derive(Debug, Parser)]
#[command(name = "countersign", version, about, long_about)]
struct Cli {
    /// Configuration file (TOML).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the dashboard, /mcp, /healthz and /metrics (migrates the database first).
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Validate, import and export the tool registry (with its Cedar policies).
    Registry {
        #[command(subcommand)]
        command: RegistryCommand,
    },
}

#[derive(Debug, Subcommand)]
enum RegistryCommand {
    /// Check a registry file or folder; print every problem and exit 1 if there are any.
    /// Needs no database.
    Validate {
        /// A registry YAML file, or a folder with *.yaml, *.cedar and *.cedarschema files.
        path: PathBuf,
    },
    /// Store a registry file or folder as the next version (refused if invalid). Running
    /// servers pick it up within seconds.
    Import {
        /// A registry YAML file, or a folder with *.yaml, *.cedar and *.cedarschema files.
        path: PathBuf,
        /// Who is importing (recorded with the version); defaults to $USER.
        #[arg(long)]
        by: Option<String>,
    },
    /// Write the current version out: registry.yaml, policy.cedar and policy.cedarschema into
    /// DIR, or the registry YAML to stdout without --out.
    Export {
        /// Folder to write into (created if missing).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// List stored versions, newest first, with who imported them and what changed.
    History {
        /// How many versions to show.
        #[arg(long, default_value_t = 10)]
        limit: i64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Validation reads only files: it must work without (or with a broken) configuration.
    if let Command::Registry {
        command: RegistryCommand::Validate { path },
    } = &cli.command
    {
        return validate_registry(path);
    }
    let config = match Config::load(cli.config.as_deref(), std::env::vars()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("countersign: {e}");
            return ExitCode::from(2);
        }
    };
    telemetry::init(&config);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("countersign: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let result: Result<(), CliError> = runtime.block_on(async move {
        match cli.command {
            Command::Serve => {
                let app = Application::build(config, clock).await?;
                app.run_until(shutdown_signal()).await?;
                Ok(())
            }
            Command::Migrate => {
                let store = countersign::connect_and_migrate(&config, clock)
                    .await
                    .map_err(StartError::Database)?;
                println!(
                    "migrated {} database to version {}",
                    store.backend().as_str(),
                    store
                        .schema_version()
                        .await
                        .map_err(countersign::StartError::Database)?
                        .unwrap_or(0)
                );
                store.close().await;
                Ok(())
            }
            Command::Registry { command } => {
                let store = countersign::connect_and_migrate(&config, clock)
                    .await
                    .map_err(StartError::Database)?;
                let result = registry_command(&store, command).await;
                store.close().await;
                result
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("countersign: {e}");
            ExitCode::FAILURE
        }
    }
}

fn validate_registry(path: &std::path::Path) -> ExitCode {
    let loaded = BundleSources::read(path)
        .map_err(|e| e.to_string())
        .and_then(|sources| Bundle::load(sources).map_err(|e| e.to_string()));
    match loaded {
        Ok(bundle) => {
            let r = &bundle.registry;
            println!(
                "{}: valid ({} tools, {} roles, {} providers, {} policies)",
                path.display(),
                r.tools().count(),
                r.roles().count(),
                r.providers().count(),
                bundle.policy.policy_ids().len()
            );
            ExitCode::SUCCESS
        }
        Err(problems) => {
            let lines = countersign::registry::problem_lines(&problems);
            eprintln!("{}: {} problem(s)", path.display(), lines.len());
            for line in lines {
                eprintln!("  {line}");
            }
            ExitCode::FAILURE
        }
    }
}

async fn registry_command(store: &Store, command: RegistryCommand) -> Result<(), CliError> {
    match command {
        RegistryCommand::Validate { .. } => Ok(()), // handled before the configuration loads
        RegistryCommand::Import { path, by } => {
            let by = by
                .or_else(|| std::env::var("USER").ok())
                .unwrap_or_else(|| "cli".to_string());
            let sources =
                BundleSources::read(&path).map_err(|e| CliError::Refused(e.to_string()))?;
            let before = store
                .registry_version()
                .await
                .map_err(StartError::Database)?;
            let version = store
                .import_bundle(&sources, &by)
                .await
                .map_err(|e| CliError::Refused(e.to_string()))?;
            if before == Some(version) {
                println!("registry unchanged: version {version} is identical");
            } else {
                println!("imported {} as registry version {version}", path.display());
            }
            Ok(())
        }
        RegistryCommand::Export { out } => {
            let Some((version, sources)) =
                store.current_bundle().await.map_err(StartError::Database)?
            else {
                return Err(CliError::Refused(
                    "the database holds no registry yet".into(),
                ));
            };
            match out {
                None => print!("{}", sources.registry_yaml),
                Some(dir) => {
                    let write = |name: &str, text: &str| -> Result<(), CliError> {
                        std::fs::write(dir.join(name), text).map_err(|e| {
                            CliError::Refused(format!("{}: {e}", dir.join(name).display()))
                        })
                    };
                    std::fs::create_dir_all(&dir)
                        .map_err(|e| CliError::Refused(format!("{}: {e}", dir.display())))?;
                    write("registry.yaml", &sources.registry_yaml)?;
                    if !sources.policies.is_empty() {
                        write("policy.cedar", &sources.policies)?;
                    }
                    if !sources.policy_schema.is_empty() {
                        write("policy.cedarschema", &sources.policy_schema)?;
                    }
                    eprintln!("exported registry version {version} to {}", dir.display());
                }
            }
            Ok(())
        }
        RegistryCommand::History { limit } => {
            for v in store
                .registry_versions(limit)
                .await
                .map_err(StartError::Database)?
            {
                println!(
                    "version {} by {} at {} ms",
                    v.version, v.created_by, v.created_at
                );
                for line in v.diff.lines() {
                    println!("    {line}");
                }
            }
            Ok(())
        }
    }
}

/// A CLI command's failure: a start-up failure, or a refusal with its reason.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("{0}")]
    Refused(String),
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
