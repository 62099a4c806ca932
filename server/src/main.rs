//! The `countersign` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use countersign::audit::{AuditCliError, AuditCommand};
use countersign::config::Config;
use countersign::{Application, StartError, telemetry};
use countersign_core::approvals::is_person;
use countersign_core::bundle::{Bundle, BundleSources};
use countersign_core::registry::{RoleName, Span};
use countersign_core::store::{
    ApproveOutcome, BundleImport, Change, NewAgent, Proposal, ProposalError, StopScope,
};
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
    Serve {
        /// On an empty database, play the finance demo at start: one paid run, one payment
        /// waiting in the inbox, one refused injection attempt (same as config `demo = true`).
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
enum AgentTokenCommand {
    /// Create a credential and print its token once (only its hash is stored).
    Create {
        /// A name for the agent, unique among active credentials.
        #[arg(long)]
        name: String,
        /// The registry role it acts in (must exist in the registry in force).
        #[arg(long)]
        role: String,
        /// The tenant it is confined to.
        #[arg(long, default_value = "default")]
        tenant: String,
        /// Lifetime such as 30d, 12h or 90m; without it the token does not expire.
        #[arg(long)]
        expires: Option<String>,
        /// Who is creating it (recorded); defaults to $USER. Four eyes needs a person here,
        /// named person:ISS#SUB (their OIDC issuer and subject). This person can never
        /// approve the agent's gated steps.
        #[arg(long)]
        by: Option<String>,
        /// The party the agent's calls are made for (checked by standing authorizations;
        /// that party can never approve the agent's gated steps).
        #[arg(long)]
        acts_for: Option<String>,
        /// Where the agent's tasks come from: user, schedule, monitor or external (e.g. an
        /// agent that reads inbound e-mail). Policy sees it; the agent cannot change it.
        #[arg(long, default_value = "user")]
        origin: String,
    },
    /// Set who a credential acts for and where its tasks come from (audited, agent.bound).
    Bind {
        /// Credential id, or the name of an active credential.
        id_or_name: String,
        /// The party its calls are made for.
        #[arg(long, conflicts_with = "unbind")]
        acts_for: Option<String>,
        /// Remove the party binding.
        #[arg(long)]
        unbind: bool,
        /// user, schedule, monitor or external; unchanged when left out.
        #[arg(long)]
        origin: Option<String>,
        /// Who is changing it (recorded in the audit); defaults to $USER.
        #[arg(long)]
        by: Option<String>,
    },
    /// List credentials (never their tokens).
    List,
    /// Revoke a credential by id or name; its token is refused from the next request on.
    Revoke {
        /// Credential id, or the name of an active credential.
        id_or_name: String,
        /// Who is revoking it (recorded in the audit); defaults to $USER.
        #[arg(long)]
        by: Option<String>,
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
    /// Import a registry file or folder (refused if invalid). On an empty database it is
    /// stored as version 1 at once; on any other it is filed as a proposal that a second admin
    /// approves (`registry approve`, or the admin page) before it is in force.
    Import {
        /// A registry YAML file, or a folder with *.yaml, *.cedar and *.cedarschema files.
        path: PathBuf,
        /// Who is importing (recorded with the version or proposal); defaults to $USER.
        #[arg(long)]
        by: Option<String>,
        /// Why (recorded with the proposal).
        #[arg(long, default_value = "imported with countersign registry import")]
        note: String,
    },
    /// List registry proposals, newest first, with their changes.
    Proposals {
        /// How many to show.
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
    /// Approve a proposal: its changes become the next version, in force at once. Refused for
    /// its own proposer and when the registry changed since (superseded).
    Approve {
        /// The proposal id.
        id: String,
        /// Who approves (recorded; must differ from the proposer).
        #[arg(long)]
        by: String,
        /// Why (recorded).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Reject a proposal: nothing changes.
    Reject {
        /// The proposal id.
        id: String,
        /// Who rejects (recorded).
        #[arg(long)]
        by: String,
        /// Why (required, recorded).
        #[arg(long)]
        reason: String,
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
            Command::Serve { demo } => {
                let mut config = config;
                config.demo |= demo;
                // The demo's scripted approver signs in through the demo sign-in.
                config.demo_sign_in |= config.demo;
                let app = Application::build(config, clock).await?;
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
                let n = countersign::auth::end_sessions(&store, iss, sub, tenant.as_deref(), &who)
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

fn validate_registry(path: &std::path::Path) -> ExitCode {
    let loaded = BundleSources::read(path).and_then(Bundle::load);
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

/// How a proposal refusal reads on the command line.
fn proposal_refused(e: ProposalError) -> CliError {
    match e {
        ProposalError::Store(e) => StartError::Database(e).into(),
        other => CliError::Refused(other.to_string()),
    }
}

/// A `--by` as proposals record people: `iss#sub` (a `person:` prefix is dropped, so the
/// CLI and the admin page name one person alike).
fn cli_identity(by: &str) -> Result<String, CliError> {
    let by = by.trim();
    let by = by.strip_prefix("person:").unwrap_or(by);
    if by.is_empty() {
        return Err(CliError::Refused("--by must name who decides".into()));
    }
    Ok(by.to_string())
}

fn print_changes(p: &Proposal) {
    for change in &p.changes {
        match change {
            Change::Bundle(b) => {
                println!("    ~ the whole bundle (sha256 {})", b.sha256);
                for line in b.summary.lines() {
                    println!("      {line}");
                }
            }
            other => println!("    {other}"),
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

async fn registry_command(store: &Store, command: RegistryCommand) -> Result<(), CliError> {
    match command {
        RegistryCommand::Validate { .. } => Ok(()), // handled before the configuration loads
        RegistryCommand::Import { path, by, note } => {
            let by = cli_identity(&who(by))?;
            let sources =
                BundleSources::read(&path).map_err(|e| CliError::Refused(e.to_string()))?;
            match store
                .import_or_propose(&sources, &by, &note)
                .await
                .map_err(proposal_refused)?
            {
                BundleImport::Applied(version) => {
                    println!("imported {} as registry version {version}", path.display());
                }
                BundleImport::Unchanged(version) => {
                    println!("registry unchanged: version {version} is identical");
                }
                BundleImport::Proposed(p) => {
                    println!(
                        "proposed {} against registry version {}: proposal {}\n\
                         nothing changes until a second admin approves it \
                         (countersign registry approve {} --by NAME, or the admin page)",
                        path.display(),
                        p.base_version,
                        p.id,
                        p.id
                    );
                    print_changes(&p);
                }
            }
            Ok(())
        }
        RegistryCommand::Proposals { limit } => {
            for p in store
                .list_proposals(limit)
                .await
                .map_err(StartError::Database)?
            {
                println!(
                    "proposal {} {} by {} against version {}: {}",
                    p.id,
                    p.status.as_str(),
                    p.proposer,
                    p.base_version,
                    p.note
                );
                print_changes(&p);
            }
            Ok(())
        }
        RegistryCommand::Approve { id, by, reason } => {
            let by = cli_identity(&by)?;
            match store
                // The operator's CLI runs with the database's own access: platform-wide.
                .approve_proposal(&id, &by, &reason, true)
                .await
                .map_err(proposal_refused)?
            {
                ApproveOutcome::Applied { version } => {
                    println!("approved: registry version {version} is in force");
                    Ok(())
                }
                ApproveOutcome::Superseded { current } => Err(CliError::Refused(format!(
                    "superseded: the registry changed since it was proposed (now version {}); \
                     import again",
                    current.map_or("none".into(), |v| v.to_string())
                ))),
                ApproveOutcome::OwnProposal => Err(CliError::Refused(
                    "you proposed it: a second admin must approve it".into(),
                )),
                ApproveOutcome::NotPlatform => Err(CliError::Refused(
                    "applying a registry change needs the platform admin role".into(),
                )),
                ApproveOutcome::NotPending(status) => Err(CliError::Refused(format!(
                    "proposal {id} is {} already",
                    status.as_str()
                ))),
            }
        }
        RegistryCommand::Reject { id, by, reason } => {
            let by = cli_identity(&by)?;
            if reason.trim().is_empty() {
                return Err(CliError::Refused("--reason must say why".into()));
            }
            match store
                .reject_proposal(&id, &by, &reason)
                .await
                .map_err(proposal_refused)?
            {
                Ok(_) => {
                    println!("rejected: the registry is unchanged");
                    Ok(())
                }
                Err(status) => Err(CliError::Refused(format!(
                    "proposal {id} is {} already",
                    status.as_str()
                ))),
            }
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

/// `--origin`'s text as a task origin.
fn parse_origin(text: &str) -> Result<countersign_core::policy::TaskOrigin, CliError> {
    countersign_core::policy::TaskOrigin::parse(text).ok_or_else(|| {
        CliError::Refused(format!(
            "--origin {text:?}: one of user, schedule, monitor, external"
        ))
    })
}

fn who(by: Option<String>) -> String {
    by.or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "cli".to_string())
}

async fn agent_token_command(store: &Store, command: AgentTokenCommand) -> Result<(), CliError> {
    match command {
        AgentTokenCommand::Create {
            name,
            role,
            tenant,
            expires,
            by,
            acts_for,
            origin,
        } => {
            let creator = who(by);
            let origin = parse_origin(&origin)?;
            if creator.starts_with("person:") && !is_person(&creator) {
                return Err(CliError::Refused(format!(
                    "--by {creator:?}: a person is named person:ISS#SUB (the OIDC issuer and \
                     subject)"
                )));
            }
            if let Some((version, sources)) =
                store.current_bundle().await.map_err(StartError::Database)?
            {
                let bundle = Bundle::load(sources).map_err(|e| CliError::Refused(e.to_string()))?;
                let Some(role_name) = RoleName::parse(&role)
                    .ok()
                    .filter(|r| bundle.registry.role(r).is_some())
                else {
                    return Err(CliError::Refused(format!(
                        "--role {role:?} is not a role in registry version {version}"
                    )));
                };
                let four_eyes: Vec<&str> = bundle
                    .registry
                    .tools_for_role(&role_name)
                    .filter(|t| t.approval.as_ref().is_some_and(|a| a.four_eyes))
                    .map(|t| t.name.as_str())
                    .collect();
                if !four_eyes.is_empty() && !is_person(&creator) {
                    eprintln!(
                        "warning: the creator {creator:?} is not a person (person:ISS#SUB), so \
                         four eyes cannot be checked and nobody can approve this agent's calls \
                         of {}; pass --by person:ISS#SUB or create it from the admin page",
                        four_eyes.join(", ")
                    );
                }
            } else {
                return Err(CliError::Refused(
                    "the database holds no registry yet; import one first (countersign registry import)"
                        .into(),
                ));
            }
            let expires_at = match expires {
                None => None,
                Some(text) => {
                    let span = Span::parse(&text)
                        .map_err(|e| CliError::Refused(format!("--expires {text:?}: {e}")))?;
                    Some(store.clock().now_ms() + span.to_chrono().num_milliseconds())
                }
            };
            let (cred, token) = store
                .create_agent(&NewAgent {
                    name,
                    role,
                    tenant,
                    created_by: creator,
                    expires_at,
                    acts_for,
                    origin,
                })
                .await
                .map_err(|e| CliError::Refused(e.to_string()))?;
            eprintln!(
                "created agent credential {} ({}, role {}, tenant {}); the token is shown once:",
                cred.id, cred.name, cred.role, cred.tenant
            );
            println!("{}", token.reveal());
            Ok(())
        }
        AgentTokenCommand::Bind {
            id_or_name,
            acts_for,
            unbind,
            origin,
            by,
        } => {
            let current = store.find_agent(&id_or_name).await.map_err(|e| match e {
                countersign_core::StoreError::NotFound => CliError::Refused(format!(
                    "no credential with id or active name {id_or_name:?}"
                )),
                other => CliError::Start(StartError::Database(other)),
            })?;
            let acts_for = match (acts_for, unbind) {
                (Some(party), _) => Some(party),
                (None, true) => None,
                (None, false) => current.acts_for.clone(),
            };
            let origin = match origin {
                Some(text) => parse_origin(&text)?,
                None => parse_origin(&current.origin)?,
            };
            let cred = store
                .bind_agent(&current.id, acts_for.as_deref(), origin, &who(by))
                .await
                .map_err(|e| CliError::Refused(e.to_string()))?;
            println!(
                "{} ({}) acts for {} with origin {}",
                cred.id,
                cred.name,
                cred.acts_for.as_deref().unwrap_or("nobody"),
                cred.origin
            );
            Ok(())
        }
        AgentTokenCommand::List => {
            let now = store.clock().now_ms();
            for a in store.list_agents().await.map_err(StartError::Database)? {
                let state = match (a.revoked_at, a.expires_at) {
                    (Some(_), _) => "revoked",
                    (None, Some(t)) if t <= now => "expired",
                    (None, _) => "active",
                };
                println!(
                    "{}  {:<24} {:<22} tenant={} {} created_by={} acts_for={} origin={}{}",
                    a.id,
                    a.name,
                    a.role,
                    a.tenant,
                    state,
                    a.created_by,
                    a.acts_for.as_deref().unwrap_or("-"),
                    a.origin,
                    a.run_id
                        .as_deref()
                        .map(|r| format!(" run={r}"))
                        .unwrap_or_default()
                );
            }
            Ok(())
        }
        AgentTokenCommand::Revoke { id_or_name, by } => {
            let cred = store
                .revoke_agent(&id_or_name, &who(by))
                .await
                .map_err(|e| match e {
                    countersign_core::StoreError::NotFound => CliError::Refused(format!(
                        "no credential with id or active name {id_or_name:?}"
                    )),
                    other => CliError::Start(StartError::Database(other)),
                })?;
            println!("revoked {} ({})", cred.id, cred.name);
            Ok(())
        }
    }
}

async fn standing_command(store: &Store, command: StandingCommand) -> Result<(), CliError> {
    use countersign_core::policy::AuthorizationCondition as Condition;
    use countersign_core::store::{NewStanding, StandingError};
    let refused = |e: StandingError| match e {
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
        StandingCommand::Revoke { id, reason, by } => {
            let g = store
                .revoke_standing(&id, &who(by), &reason)
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
