//! Scenarios as data: scripted agents and people play a YAML script against a running server
//! over its real interfaces (MCP over streamable HTTP for agents, the approval API behind the
//! demo sign-in for people), then expectations are checked on the audit trail and on the
//! demo target systems' effects — never on prose.
//!
//! A scenario file (`examples/*/scenarios/*.yaml`) has `actors` (agents with a role, people
//! by demo sign-in name), `steps` (tool calls, plan submissions, reviewer calls, human
//! decisions, fault injections, waits for a step status, clock advances) and `expect`.
//!
//! Invariants of the runner (it is a test instrument, so it fails loudly, never silently):
//! * an expectation that cannot be evaluated (unknown variable, unreadable record, store
//!   error) is a failed check, never a passed one;
//! * the cross-cutting guarantees are on by default and must be switched off explicitly:
//!   the audit chain verifies, no gated step has an effect without a recorded approval, and
//!   no idempotency key has more than one effect;
//! * agents never choose idempotency keys: the runner sends what the script says, and the
//!   gateway stamps keys (scripts may send a client key to show that it is ignored);
//! * agents behave as well-behaved MCP clients: every session opened is ended with
//!   `DELETE /mcp` when the play ends, finished or not (check `sessions closed`).

mod expect;
mod play;
mod runner;
mod script;
mod session;
mod sign;
mod values;

use countersign_core::store::NewAgent;
pub use expect::{Check, Report};
use runner::Runner;
pub use script::{IN_APP_ISSUER, Scenario, ScenarioError, Target, load, parse, write_operations};
use std::collections::BTreeMap;

/// Plays `scenario` against `target` and checks its expectations.
pub async fn run(scenario: &Scenario, target: &Target<'_>) -> Result<Report, ScenarioError> {
    let setup = |message: String| ScenarioError::Step {
        index: 0,
        what: "actors".into(),
        message,
    };
    let http = client_for(&target.url)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| setup(e.to_string()))?;
    let mut runner = Runner {
        target,
        http,
        scenario,
        tokens: BTreeMap::new(),
        sessions: BTreeMap::new(),
        vars: BTreeMap::new(),
        passkeys: BTreeMap::new(),
    };
    // Each scenario's agents are its own: names are unique among a tenant's active credentials.
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    for (name, actor) in &scenario.actors {
        match (&actor.role, &actor.person) {
            (Some(role), None) => {
                if actor.approver_role.is_some() {
                    return Err(setup(format!("actor {name}: approver_role is for people")));
                }
                let (_, token) = target
                    .store
                    .create_agent(&NewAgent {
                        name: format!("{name}-{}", &nonce[..8]),
                        role: role.clone(),
                        tenant: actor.tenant.clone().unwrap_or_else(|| "acme".into()),
                        created_by: actor
                            .created_by
                            .clone()
                            .unwrap_or_else(|| format!("scenario:{}", scenario.name)),
                        expires_at: None,
                        // The operator's binding, made as the credential is created.
                        acts_for: actor.acts_for.clone(),
                        origin: countersign_core::policy::TaskOrigin::User,
                    })
                    .await
                    .map_err(|e| setup(format!("agent {name}: {e}")))?;
                runner
                    .tokens
                    .insert(name.clone(), token.reveal().to_string());
            }
            (None, Some(_)) if actor.acts_for.is_none() && actor.created_by.is_none() => {}
            _ => {
                return Err(setup(format!(
                    "actor {name}: exactly one of role, person (acts_for and created_by are for agents)"
                )));
            }
        }
    }
    let mut played = Ok(());
    for (i, action) in scenario.steps.iter().enumerate() {
        if let Err(message) = runner.step(action).await {
            played = Err(ScenarioError::Step {
                index: i + 1,
                what: action
                    .note
                    .clone()
                    .or_else(|| action.call.clone())
                    .unwrap_or_else(|| "step".into()),
                message,
            });
            break;
        }
    }
    // A well-behaved client ends its sessions (HTTP DELETE) rather than leaving the server to
    // expire them; played or not, every agent's session is closed.
    let closed = runner.close_sessions().await;
    played?;
    let mut checks = runner.expectations().await;
    checks.push(Check {
        name: "sessions closed".into(),
        ok: closed.is_ok(),
        detail: closed.err().unwrap_or_default(),
    });
    Ok(Report {
        scenario: scenario.name.clone(),
        checks,
        vars: runner.vars,
    })
}

/// An HTTP client for the server at `url`: a server on this machine is reached directly — a
/// proxy named by the environment (`HTTP_PROXY`, say, set for package registries) is not
/// meant for it, and the demo sign-in refuses requests that came through one.
pub(crate) fn client_for(url: &str) -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder();
    if is_loopback(url) {
        builder.no_proxy()
    } else {
        builder
    }
}

/// Whether `url` names this machine: a loopback host as the configuration judges one
/// ([`crate::config::loopback_host`]), or one only a client needs to know (`localhost.`,
/// `*.localhost`, IPv4-mapped loopback) — widened here, where it only decides whether to
/// bypass a proxy, not what the server trusts.
fn is_loopback(url: &str) -> bool {
    let Ok(url) = url::Url::parse(url) else {
        return false;
    };
    crate::config::loopback_host(&url)
        || match url.host() {
            Some(url::Host::Domain(d)) => {
                let d = d.strip_suffix('.').unwrap_or(d).to_ascii_lowercase();
                d == "localhost" || d.ends_with(".localhost")
            }
            Some(url::Host::Ipv6(ip)) => ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::is_loopback;

    #[test]
    fn loopback_targets_are_named_by_their_host() {
        for url in [
            "http://localhost:3107",
            "http://localhost.:3107",
            "http://app.localhost:3107",
            "http://[::ffff:127.0.0.1]:3000/",
            "http://127.0.0.1:80",
            "http://[::1]:3000/",
        ] {
            assert!(is_loopback(url), "{url}");
        }
        for url in [
            "https://countersign.example",
            "http://localhost.example:3000",
            "http://10.0.0.5:3000",
            "not a url",
        ] {
            assert!(!is_loopback(url), "{url}");
        }
    }
}
