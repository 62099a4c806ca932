//! The `countersign` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use countersign::audit::{AuditCliError, AuditCommand};
use countersign::config::Config;
use countersign::{Application, StartError, telemetry};
use countersign_core::bundle::Bundle;
use countersign_core::registry::Span;
use countersign_core::store::StopScope;
use countersign_core::{Clock, Store, SystemClock};

mod cli {
    pub(crate) mod agent_token;
    pub(crate) mod registry;
}
use cli::agent_token::{AgentTokenCommand, agent_token_command};
use cli::registry::{RegistryCommand, registry_command, validate_registry};

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
    Serve {
        /// On an empty database, play the finance demo at start: one paid run, a refused
        /// injection attempt, 30 decided invoice holds, five gates waiting in the inbox and
        /// the gate advisor's drafted proposal (same as config `demo = true`).
        #[arg(long)]
        demo: bool,
    },
    /// Apply pending database migrations and exit.
    Migrate,
    /// End every dashboard session of one person (effective at their next request; audited,
    /// `sessions.ended`): someone who left, or lost a role at the identity provider.
    EndSessions {
        /// The person, as ISSUER#SUBJECT (a `person:` prefix is accepted).
        #[arg(long)]
        person: String,
        /// Only their sessions signed in for this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Who acts (recorded); defaults to cli:$USER.
        #[arg(long)]
        by: Option<String>,
    },
    /// Run executor workers and the reconciler for planned steps, without HTTP, until
    /// interrupted. Any number of these may share one Postgres database.
    Worker {
        /// How many workers in this process.
        #[arg(long, default_value_t = 1)]
        count: usize,
        /// Reconcile a `running` step untouched for this many seconds (its worker died).
        #[arg(long, default_value_t = 120)]
        stale_after: u64,
    },
    /// Emergency stop, for every tenant or one (--tenant): no step that has not started will
    /// start; every active run it covers stops and its agent credential is revoked. In-flight
    /// calls finish or are reconciled. --lift [--restore] lifts it (and restores what it
    /// revoked).
    Stop {
        /// Why (recorded in the audit trail).
        #[arg(long)]
        reason: String,
        /// Lift the stop instead (new runs and steps may execute again).
        #[arg(long)]
        lift: bool,
        /// Stop (or lift the stop of) this tenant only; without it, every tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// With --lift: restore the agent credentials this stop revoked (each one audited;
        /// without it they stay revoked).
        #[arg(long, requires = "lift")]
        restore: bool,
        /// Who acts (recorded); defaults to cli:$USER.
        #[arg(long)]
        by: Option<String>,
    },
    /// Create, list and revoke the bearer tokens agents present on /mcp.
    AgentToken {
        #[command(subcommand)]
        command: AgentTokenCommand,
    },
    /// Grant, list and revoke standing authorizations: a party (the person agents act for)
    /// lets calls of one tool run without asking, within bounds, until they expire. Every
    /// change is audited.
    Standing {
        #[command(subcommand)]
        command: StandingCommand,
    },
    /// Verify, export and checkpoint the hash-chained audit trail.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Play scenario files (scripted agents and demo approvers) against a running server on
    /// this configuration's database; print every expectation, exit 1 if any failed.
    Scenario {
        #[command(subcommand)]
        command: ScenarioCommand,
    },
    /// Validate, import and export the tool registry (with its Cedar policies).
    Registry {
        #[command(subcommand)]
        command: RegistryCommand,
    },
}

#[derive(Debug, Subcommand)]
enum ScenarioCommand {
    /// Play FILE... (examples/*/scenarios/*.yaml) against the server at --url. Scenarios that
    /// advance the clock need a test server and fail here.
    Run {
        /// Scenario files.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// The running server (its demo sign-in must be on for scenarios with people).
        #[arg(long)]
        url: String,
    },
}

#[derive(Debug, Subcommand)]
enum StandingCommand {
    /// Grant one: calls of --tool made for --party (in --tenant) run without a person's
    /// approval when every condition holds and policy would only have asked. It never lifts a
    /// deny, a floor, or an irreversible tool's gate.
    Grant {
        /// The party that holds it: the person agents act for (e.g. user-123).
        #[arg(long)]
        party: String,
        /// The one tool it covers (must be in the registry in force, and not irreversible).
        #[arg(long)]
        tool: String,
        /// The tenant it belongs to.
        #[arg(long, default_value = "default")]
        tenant: String,
        /// Until when: a lifetime such as 30d or 12h, or an RFC 3339 instant. Required.
        #[arg(long)]
        expires: String,
        /// Why (recorded in the audit trail).
        #[arg(long)]
        reason: String,
        /// Condition: every record the call points at is owned by the party.
        #[arg(long)]
        owns_resource: bool,
        /// Condition: `requested_time` is within this many minutes of the record's start.
        #[arg(long, value_name = "MINUTES")]
        max_shift_minutes: Option<u32>,
        /// Condition: `amount` is between 0 and this many minor units (needs --currency).
        #[arg(long, value_name = "MINOR_UNITS")]
        max_amount_minor: Option<i64>,
        /// Condition: `currency` is exactly this code (ISO 4217, e.g. EUR).
        #[arg(long, value_name = "CODE")]
        currency: Option<String>,
        /// Condition: the call carries no argument outside this comma-separated list.
        #[arg(long, value_name = "NAMES", value_delimiter = ',')]
        only_arguments: Option<Vec<String>>,
        /// Allow a grant with no condition at all (it covers every call of the tool).
        #[arg(long)]
        unconditional: bool,
        /// Its id (default: SA- and a random UUID).
        #[arg(long)]
        id: Option<String>,
        /// Who grants it (recorded); defaults to $USER.
        #[arg(long)]
        by: Option<String>,
    },
    /// List grants (of --tenant) with their state: active, expired, revoked.
    List {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Revoke a grant by id: from the next call on it covers nothing.
    Revoke {
        /// The grant's id.
        id: String,
        /// Why (recorded in the audit trail).
        #[arg(long)]
        reason: String,
        /// Who revokes it (recorded); defaults to $USER.
        #[arg(long)]
        by: Option<String>,
        /// The grant's tenant (needed only if two tenants hold grants of this id).
        #[arg(long)]
        tenant: Option<String>,
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
            Command::Serve { demo } => {
                let mut config = config;
                config.demo |= demo;
                // The demo's scripted approver signs in through the demo sign-in.
                config.demo_sign_in |= config.demo;
                // The demo plays a month of history on an empty database: its server starts
                // that far behind and catches up as the history plays.
                let demo_clock = if config.demo {
                    let store = countersign::connect_and_migrate(&config, clock.clone())
                        .await
                        .map_err(StartError::Database)?;
                    let found = countersign::demo::clock_for(&store).await;
                    store.close().await;
                    found.map_err(StartError::Database)?
                } else {
                    None
                };
                let app = match demo_clock {
                    Some(demo) => {
                        let shared: Arc<dyn Clock> = Arc::new(demo.clone());
                        Application::build(config, shared)
                            .await?
                            .with_clock_hand(Arc::new(demo))
                    }
                    None => Application::build(config, clock).await?,
                };
                app.run_until(shutdown_signal()).await?;
                Ok(())
            }
            Command::Worker { count, stale_after } => {
                let state = countersign::headless_state(config, clock).await?;
                let watcher = state
                    .registry
                    .spawn_watcher(state.store.clone(), countersign::REGISTRY_POLL);
                let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
                let timings = countersign::executor::Timings {
                    stale_after: std::time::Duration::from_secs(stale_after),
                    escalate_unknown_after: std::time::Duration::from_secs(
                        state.config.escalate_unknown_after_seconds,
                    ),
                    ..countersign::executor::Timings::default()
                };
                let tasks = countersign::spawn_background(&state, count, timings, stop_rx);
                println!(
                    "countersign worker: {count} executor worker(s) and the reconciler running"
                );
                shutdown_signal().await;
                let _ = stop_tx.send(true);
                for task in tasks {
                    let _ = task.await;
                }
                watcher.abort();
                state.store.close().await;
                Ok(())
            }
            Command::Scenario {
                command: ScenarioCommand::Run { files, url },
            } => {
                let store = countersign::connect_and_migrate(&config, clock)
                    .await
                    .map_err(StartError::Database)?;
                let url = url.trim_end_matches('/').to_string();
                let mut failed = 0usize;
                for file in &files {
                    let target = countersign::scenario::Target {
                        url: url.clone(),
                        origin: None,
                        store: store.clone(),
                        advance: None,
                    };
                    let played = match countersign::scenario::load(file) {
                        Ok(s) => countersign::scenario::run(&s, &target).await,
                        Err(e) => Err(e),
                    };
                    match played {
                        Ok(report) => {
                            for c in &report.checks {
                                let mark = if c.ok { "ok  " } else { "FAIL" };
                                println!("{mark} {}: {} {}", file.display(), c.name, c.detail);
                            }
                            failed += report.failures().len();
                        }
                        Err(e) => {
                            println!("FAIL {}: {e}", file.display());
                            failed += 1;
                        }
                    }
                }
                store.close().await;
                if failed > 0 {
                    return Err(CliError::Refused(format!(
                        "{failed} scenario check(s) failed"
                    )));
                }
                Ok(())
            }
            Command::Stop {
                reason,
                lift,
                tenant,
                restore,
                by,
            } => {
                let scope = match tenant.map(|t| t.trim().to_string()) {
                    None => StopScope::Platform,
                    Some(t) if t.is_empty() => {
                        return Err(CliError::Refused("--tenant must name a tenant".into()));
                    }
                    Some(t) => StopScope::Tenant(t),
                };
                let state = countersign::headless_state(config, clock).await?;
                let who = by.unwrap_or_else(|| {
                    format!(
                        "cli:{}",
                        std::env::var("USER").unwrap_or_else(|_| "operator".into())
                    )
                });
                let result = if lift {
                    countersign::stop::lift_emergency_stop(&state, &scope, &who, &reason, restore)
                        .await
                        .map(|l| print_lifted(&scope, &l))
                } else {
                    countersign::stop::emergency_stop(&state, &scope, &who, &reason)
                        .await
                        .map(|n| {
                            println!(
                                "emergency stop on ({}): {n} active run(s) stopped, their agent \
                                 credentials revoked",
                                scope_text(&scope)
                            )
                        })
                };
                state.store.close().await;
                result.map_err(|e| StartError::Database(e).into())
            }
            Command::EndSessions { person, tenant, by } => {
                let person = person.trim();
                let Some((iss, sub)) = person
                    .strip_prefix("person:")
                    .unwrap_or(person)
                    .split_once('#')
                    .filter(|(iss, sub)| !iss.is_empty() && !sub.is_empty())
                else {
                    return Err(CliError::Refused("--person must be ISSUER#SUBJECT".into()));
                };
                let store = countersign::connect_and_migrate(&config, clock)
                    .await
                    .map_err(StartError::Database)?;
                let who = by.unwrap_or_else(|| {
                    format!(
                        "cli:{}",
                        std::env::var("USER").unwrap_or_else(|_| "operator".into())
                    )
                });
                let which = countersign::auth::sessions::Which {
                    iss,
                    sub: Some(sub),
                    tenant: tenant.as_deref(),
                    sid: None,
                    signed_in_by: None,
                };
                let n = countersign::auth::sessions::end_sessions(&store, &which, &who)
                    .await
                    .map_err(StartError::Database)?;
                println!("ended {n} session(s) of {iss}#{sub}");
                store.close().await;
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
            Command::Audit { command } => countersign::audit::run_command(&config, clock, command)
                .await
                .map_err(|e| match e {
                    AuditCliError::Start(s) => CliError::Start(s),
                    AuditCliError::Refused(r) => CliError::Refused(r),
                }),
            Command::AgentToken { command } => {
                let store = countersign::connect_and_migrate(&config, clock)
                    .await
                    .map_err(StartError::Database)?;
                let result = agent_token_command(&store, command).await;
                store.close().await;
                result
            }
            Command::Standing { command } => {
                let store = countersign::connect_and_migrate(&config, clock)
                    .await
                    .map_err(StartError::Database)?;
                let result = standing_command(&store, command).await;
                store.close().await;
                result
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

fn scope_text(scope: &StopScope) -> String {
    match scope {
        StopScope::Platform => "every tenant".into(),
        StopScope::Tenant(t) => format!("tenant {t}"),
    }
}

fn print_lifted(scope: &StopScope, lifted: &countersign::stop::Lifted) {
    if !lifted.was_on {
        println!("emergency stop ({}) was not on", scope_text(scope));
    } else {
        println!("emergency stop ({}) lifted", scope_text(scope));
    }
    for id in &lifted.restored {
        println!("restored agent credential {id}");
    }
    for id in &lifted.left_revoked {
        println!("agent credential {id} stays revoked");
    }
}

fn who(by: Option<String>) -> String {
    by.or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "cli".to_string())
}

async fn standing_command(store: &Store, command: StandingCommand) -> Result<(), CliError> {
    use countersign_core::policy::AuthorizationCondition as Condition;
    use countersign_core::store::{NewStanding, StandingError};
    let refused = |e: StandingError| match e {
        // An id two tenants hold: the operator names the tenant.
        StandingError::Store(countersign_core::StoreError::Conflict(why)) => {
            CliError::Refused(format!("{why} (--tenant T)"))
        }
        StandingError::Store(e) => CliError::Start(StartError::Database(e)),
        other => CliError::Refused(other.to_string()),
    };
    match command {
        StandingCommand::Grant {
            party,
            tool,
            tenant,
            expires,
            reason,
            owns_resource,
            max_shift_minutes,
            max_amount_minor,
            currency,
            only_arguments,
            unconditional,
            id,
            by,
        } => {
            let Some((version, sources)) =
                store.current_bundle().await.map_err(StartError::Database)?
            else {
                return Err(CliError::Refused(
                    "the database holds no registry yet; import one first (countersign registry import)"
                        .into(),
                ));
            };
            let bundle = Bundle::load(sources).map_err(|e| CliError::Refused(e.to_string()))?;
            let Some(found) = countersign_core::ToolName::parse(&tool)
                .ok()
                .and_then(|n| bundle.registry.tool(&n))
            else {
                return Err(CliError::Refused(format!(
                    "--tool {tool:?} is not a tool in registry version {version}"
                )));
            };
            if found.effect == countersign_core::Effect::Irreversible {
                return Err(CliError::Refused(format!(
                    "{tool} is irreversible: a person approves every call, a standing \
                     authorization would never cover one"
                )));
            }
            let mut conditions = Vec::new();
            if owns_resource {
                conditions.push(Condition::OwnsResource);
            }
            if let Some(m) = max_shift_minutes {
                conditions.push(Condition::MaxShiftMinutes(m));
            }
            if let Some(m) = max_amount_minor {
                if m < 0 {
                    return Err(CliError::Refused(
                        "--max-amount-minor must not be negative".into(),
                    ));
                }
                conditions.push(Condition::MaxAmountMinor(m));
            }
            match currency.as_deref().map(str::trim) {
                Some(c) if c.len() == 3 && c.chars().all(|ch| ch.is_ascii_uppercase()) => {
                    conditions.push(Condition::Currency(c.to_string()));
                }
                Some(c) => {
                    return Err(CliError::Refused(format!(
                        "--currency {c:?}: expected a three-letter ISO 4217 code such as EUR"
                    )));
                }
                None if max_amount_minor.is_some() => {
                    return Err(CliError::Refused(
                        "--max-amount-minor needs --currency: an amount bound means nothing \
                         without its currency"
                            .into(),
                    ));
                }
                None => {}
            }
            if let Some(names) = only_arguments {
                let known = found
                    .input_schema
                    .get("properties")
                    .and_then(serde_json::Value::as_object);
                let names: Vec<String> = names
                    .into_iter()
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty())
                    .collect();
                if let Some(bad) = names
                    .iter()
                    .find(|n| !known.is_some_and(|k| k.contains_key(n.as_str())))
                {
                    return Err(CliError::Refused(format!(
                        "--only-arguments: {tool} has no argument {bad:?}"
                    )));
                }
                conditions.push(Condition::OnlyArguments(names));
            }
            if conditions.is_empty() && !unconditional {
                return Err(CliError::Refused(
                    "a grant without conditions covers every call of the tool: give at least one \
                     condition, or --unconditional"
                        .into(),
                ));
            }
            let expires_at = match chrono::DateTime::parse_from_rfc3339(&expires) {
                Ok(t) => t.timestamp_millis(),
                Err(_) => {
                    let span = Span::parse(&expires).map_err(|e| {
                        CliError::Refused(format!(
                            "--expires {expires:?}: not an RFC 3339 instant, and {e}"
                        ))
                    })?;
                    store.clock().now_ms() + span.to_chrono().num_milliseconds()
                }
            };
            let granted = store
                .grant_standing(&NewStanding {
                    id,
                    tenant,
                    party,
                    tool,
                    conditions,
                    expires_at,
                    reason,
                    granted_by: who(by),
                })
                .await
                .map_err(refused)?;
            println!("{}", granted.id);
            eprintln!(
                "granted {} to {} (tenant {}) for {} until {}",
                granted.id,
                granted.party,
                granted.tenant,
                granted.tool,
                instant(granted.expires_at)
            );
            Ok(())
        }
        StandingCommand::List { tenant } => {
            let now = store.clock().now_ms();
            for g in store
                .list_standing(tenant.as_deref())
                .await
                .map_err(StartError::Database)?
            {
                let conditions = g
                    .conditions
                    .as_ref()
                    .and_then(|c| serde_json::to_string(c).ok())
                    .unwrap_or_else(|| "(unreadable)".into());
                println!(
                    "{}  {:<10} tenant={} party={} tool={} expires={} conditions={} granted_by={}",
                    g.id,
                    g.state(now).as_str(),
                    g.tenant,
                    g.party,
                    g.tool,
                    instant(g.expires_at),
                    conditions,
                    g.granted_by
                );
            }
            Ok(())
        }
        StandingCommand::Revoke {
            id,
            reason,
            by,
            tenant,
        } => {
            let g = store
                .revoke_standing(&id, tenant.as_deref(), &who(by), &reason)
                .await
                .map_err(refused)?;
            println!("revoked {} ({} for {})", g.id, g.tool, g.party);
            Ok(())
        }
    }
}

/// Unix ms as RFC 3339 (UTC), or the number when out of range.
fn instant(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
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
