//! `countersign registry …`: validate, import (version 1 on an empty database, a proposal
//! otherwise), list, approve and reject proposals, export, history.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use countersign::StartError;
use countersign_core::Store;
use countersign_core::bundle::{Bundle, BundleSources};
use countersign_core::store::{ApproveOutcome, BundleImport, Change, Proposal, ProposalError};

use countersign::preview::{Preview, PreviewError, Window};

use crate::{CliError, who};

#[derive(Debug, Subcommand)]
pub(crate) enum RegistryCommand {
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
    /// Replay the calls recorded in the last N days through PATH and through the version in
    /// force, and report what PATH would decide differently (per transition, tool and rule,
    /// with example audit records). Only reads: nothing is executed.
    Preview {
        /// A registry YAML file, or a folder with *.yaml, *.cedar and *.cedarschema files.
        path: PathBuf,
        /// The window, in days back from now (1 to 366).
        #[arg(long, default_value_t = countersign::preview::DEFAULT_DAYS, conflicts_with = "from")]
        days: i64,
        /// Instead of --days: the calls recorded since this date (YYYY-MM-DD, UTC).
        #[arg(long, value_name = "DATE")]
        from: Option<chrono::NaiveDate>,
        /// Only this tenant's calls (default: every tenant's).
        #[arg(long)]
        tenant: Option<String>,
        /// Print the report as JSON (`replayed`, `changed`, `transitions`, …).
        #[arg(long)]
        json: bool,
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

pub(crate) fn validate_registry(path: &std::path::Path) -> ExitCode {
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

/// A preview as the command prints it.
fn print_preview(path: &std::path::Path, p: &Preview) {
    let r = &p.report;
    println!(
        "{} against registry version {}: {} call(s) of the last {} day(s) ({}) replayed, \
         {} would be decided differently{}",
        path.display(),
        p.base_version,
        r.replayed,
        p.days,
        p.tenant
            .as_deref()
            .map_or("every tenant".into(), |t| format!("tenant {t}")),
        r.changed,
        if r.approximate > 0 {
            format!(
                " ({} replayed without all their recorded facts)",
                r.approximate
            )
        } else {
            String::new()
        }
    );
    if r.rule_changed > 0 {
        println!("  {} keep their outcome under another rule", r.rule_changed);
    }
    for (transition, n) in &r.transitions {
        println!("  {transition}: {n}");
    }
    for (title, table) in [("by tool", &r.by_tool), ("by rule", &r.by_rule)] {
        if table.is_empty() {
            continue;
        }
        println!("  {title}:");
        for (name, counts) in table {
            let counts: Vec<String> = counts.iter().map(|(t, n)| format!("{t} {n}")).collect();
            println!("    {name}: {}", counts.join(", "));
        }
    }
    for (transition, examples) in &r.examples {
        println!("  examples of {transition}:");
        for e in examples {
            let record = e.record.as_ref().map_or(String::new(), |(chain, seq)| {
                format!(" audit {chain}#{seq}")
            });
            println!("    step {} {}{record}", e.step_id, e.tool);
        }
    }
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

pub(crate) async fn registry_command(
    store: &Store,
    command: RegistryCommand,
) -> Result<(), CliError> {
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
        RegistryCommand::Preview {
            path,
            days,
            from,
            tenant,
            json,
        } => {
            let sources =
                BundleSources::read(&path).map_err(|e| CliError::Refused(e.to_string()))?;
            let window = match from {
                Some(date) => Window::Since(
                    date.and_time(chrono::NaiveTime::MIN)
                        .and_utc()
                        .timestamp_millis(),
                ),
                None => Window::Days(days),
            };
            let preview = countersign::preview::preview(store, tenant.as_deref(), sources, window)
                .await
                .map_err(|e| match e {
                    PreviewError::Store(e) => StartError::Database(e).into(),
                    other => CliError::Refused(other.to_string()),
                })?;
            if json {
                let text = serde_json::to_string_pretty(&preview)
                    .map_err(|e| CliError::Refused(e.to_string()))?;
                println!("{text}");
            } else {
                print_preview(&path, &preview);
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
