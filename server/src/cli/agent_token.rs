//! `countersign agent-token …`: create (the token shown once), bind to a party and an
//! origin, list and revoke agent credentials.

use clap::Subcommand;
use countersign::StartError;
use countersign_core::Store;
use countersign_core::approvals::is_person;
use countersign_core::bundle::Bundle;
use countersign_core::registry::{RoleName, Span};
use countersign_core::store::NewAgent;

use crate::{CliError, who};

#[derive(Debug, Subcommand)]
pub(crate) enum AgentTokenCommand {
    /// Create a credential and print its token once (only its hash is stored). With
    /// --oauth-issuer and --oauth-client, register that OAuth client instead: the agent then
    /// presents access tokens from that authorization server (no token is printed).
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
        /// The authorization server (exactly as in agent_oauth_issuers) whose client this is.
        #[arg(long, requires = "oauth_client")]
        oauth_issuer: Option<String>,
        /// The client id (the access token's `client_id`) to register.
        #[arg(long, requires = "oauth_issuer")]
        oauth_client: Option<String>,
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

/// `--origin`'s text as a task origin.
fn parse_origin(text: &str) -> Result<countersign_core::policy::TaskOrigin, CliError> {
    countersign_core::policy::TaskOrigin::parse(text).ok_or_else(|| {
        CliError::Refused(format!(
            "--origin {text:?}: one of user, schedule, monitor, external"
        ))
    })
}

pub(crate) async fn agent_token_command(
    store: &Store,
    command: AgentTokenCommand,
) -> Result<(), CliError> {
    match command {
        AgentTokenCommand::Create {
            name,
            role,
            tenant,
            expires,
            by,
            acts_for,
            origin,
            oauth_issuer,
            oauth_client,
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
            let new = NewAgent {
                name,
                role,
                tenant,
                created_by: creator,
                expires_at,
                acts_for,
                origin,
            };
            if let (Some(issuer), Some(client)) = (oauth_issuer, oauth_client) {
                let cred = store
                    .register_oauth_agent(&new, &issuer, &client)
                    .await
                    .map_err(|e| CliError::Refused(e.to_string()))?;
                println!(
                    "registered OAuth client {client:?} of {issuer} as agent credential {} ({}, \
                     role {}, tenant {})",
                    cred.id, cred.name, cred.role, cred.tenant
                );
                return Ok(());
            }
            let (cred, token) = store
                .create_agent(&new)
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
                countersign_core::StoreError::Conflict(why) => CliError::Refused(why),
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
            let oauth: std::collections::HashMap<String, (String, String)> = store
                .oauth_registrations()
                .await
                .map_err(StartError::Database)?
                .into_iter()
                .map(|(id, issuer, client)| (id, (issuer, client)))
                .collect();
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
                        .or_else(|| oauth.get(&a.id).map(|(i, c)| format!(" oauth={c}@{i}")))
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
                    countersign_core::StoreError::Conflict(why) => CliError::Refused(why),
                    other => CliError::Start(StartError::Database(other)),
                })?;
            println!("revoked {} ({})", cred.id, cred.name);
            Ok(())
        }
    }
}
