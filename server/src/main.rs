//! The `countersign` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use countersign::config::Config;
use countersign::{Application, telemetry};
use countersign_core::{Clock, SystemClock};

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve => {
                let app = Application::build(config, clock).await?;
                app.run_until(shutdown_signal()).await
            }
            Command::Migrate => {
                let store = countersign::connect_and_migrate(&config, clock).await?;
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
