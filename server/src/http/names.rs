//! What a person reads instead of ids (issue 36): an audit actor such as
//! `agent:0eb25196-… role:worker.finance tenant:acme` becomes `agent invoice-bot
//! (worker.finance)`; `executor:local:19408:0 agent:<a planned run's execution credential> …`
//! becomes `worker 0 on local, running the plan's worker.finance steps`; a person
//! `person:ISS#SUB` becomes their display name where Countersign knows it (the name their
//! identity provider gave at their last sign-in, kept in the people directory; a demo person's;
//! otherwise the subject).
//!
//! Invariants:
//! * Display only: filters and links keep the exact recorded actor; the id stays one click
//!   away (the raw text is shown beside or in a title).
//! * A tenant's pages name only that tenant's agents: an id of another tenant's agent (which
//!   no record of this tenant should hold) is shown shortened, never with its name.

use std::collections::HashMap;

use countersign_core::{Store, StoreError};

use crate::auth::demo_name;

/// One credential as people name it.
#[derive(Debug, Clone)]
struct Agent {
    name: String,
    role: String,
    /// An execution credential (minted for one planned run).
    execution: bool,
    /// Not revoked.
    active: bool,
}

/// Names for one tenant's pages.
#[derive(Debug, Default, Clone)]
pub struct Names {
    /// Agent id → the credential, this tenant's only.
    agents: HashMap<String, Agent>,
    /// `ISS#SUB` → the display name the person last signed in with, this tenant's only.
    people: HashMap<String, String>,
}

/// The first 8 characters of an id, for when no name is known.
fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

impl Names {
    /// The names of `tenant`'s agents.
    pub async fn load(store: &Store, tenant: &str) -> Result<Self, StoreError> {
        let people = store
            .people_of(tenant)
            .await?
            .into_iter()
            .map(|(iss, sub, name)| (format!("{iss}#{sub}"), name))
            .collect();
        Ok(Self {
            people,
            agents: store
                .agents_of(tenant)
                .await?
                .into_iter()
                // INVARIANT: re-checked whatever the query matched.
                .filter(|a| a.tenant == tenant)
                .map(|a| {
                    let agent = Agent {
                        execution: a.run_id.is_some(),
                        active: a.revoked_at.is_none(),
                        name: a.name,
                        role: a.role,
                    };
                    (a.id, agent)
                })
                .collect(),
        })
    }

    /// The agent credential `id`, as people name it: `agent invoice-bot (worker.finance)`, or
    /// for a planned run's execution credential `the plan's worker.finance credential`.
    pub fn agent(&self, id: &str, role: Option<&str>) -> String {
        match (self.agents.get(id), role) {
            (Some(a), _) if a.execution => format!("the plan's {} credential", a.role),
            (Some(a), _) => format!("agent {} ({})", a.name, a.role),
            (None, Some(role)) => format!("agent {} ({role})", short(id)),
            (None, None) => format!("agent {}", short(id)),
        }
    }

    /// The recorded actor of the direct calls of `tenant`'s active agent named `name`
    /// (`agent:ID role:R tenant:T`), if it has one (names are unique among active agents).
    pub fn agent_actor(&self, name: &str, tenant: &str) -> Option<String> {
        let mut found = self
            .agents
            .iter()
            .filter(|(_, a)| a.active && !a.execution && a.name == name);
        match (found.next(), found.next()) {
            (Some((id, a)), None) => Some(format!("agent:{id} role:{} tenant:{tenant}", a.role)),
            _ => None,
        }
    }

    /// `actor` (as recorded) in words.
    pub fn actor(&self, actor: &str) -> String {
        // A person is the whole rest (a CLI `--by` may hold spaces).
        if let Some(person) = actor.strip_prefix("person:") {
            return self.person(person);
        }
        let token = |prefix: &str| {
            actor
                .split_whitespace()
                .find_map(|t| t.strip_prefix(prefix))
        };
        let agent = token("agent:").map(|id| self.agent(id, token("role:")));
        match (token("executor:"), agent) {
            (Some(worker), Some(agent)) => format!("{}, for {agent}", worker_name(worker)),
            (Some(worker), None) => worker_name(worker),
            (None, Some(agent)) => agent,
            (None, None) => actor.to_string(),
        }
    }
}

/// `host:pid:n` (an executor worker) as `worker n on host`.
fn worker_name(worker: &str) -> String {
    let mut parts = worker.rsplitn(3, ':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(n), Some(_pid), Some(host)) => format!("worker {n} on {host}"),
        _ => format!("worker {worker}"),
    }
}

impl Names {
    /// `ISS#SUB` as the person's display name where known (the name they last signed in with,
    /// or a demo person's), else the subject.
    pub fn person(&self, person: &str) -> String {
        if let Some(name) = self.people.get(person) {
            return name.clone();
        }
        // An issuer is a URL without a fragment: the first `#` ends it.
        let (iss, sub) = person.split_once('#').unwrap_or(("", person));
        demo_name(iss, sub).map_or_else(|| sub.to_string(), str::to_string)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_read_as_names() {
        let agent = |name: &str, execution: bool| Agent {
            name: name.into(),
            role: "worker.finance".into(),
            execution,
            active: true,
        };
        let names = Names {
            agents: HashMap::from([
                (
                    "0eb25196-6f9a-4c1e-9a57-9b2f3c1d0e11".to_string(),
                    agent("invoice-bot", false),
                ),
                ("e1".to_string(), agent("exec:run-1:worker.finance", true)),
            ]),
            people: HashMap::from([("https://idp.example#u-7".to_string(), "Jo Park".to_string())]),
        };
        assert_eq!(
            names.actor(
                "executor:local:19408:0 agent:0eb25196-6f9a-4c1e-9a57-9b2f3c1d0e11 role:worker.finance tenant:acme"
            ),
            "worker 0 on local, for agent invoice-bot (worker.finance)"
        );
        // A planned run's steps run on its execution credential: no id shown.
        assert_eq!(
            names.actor("executor:host:a:b:4242:1 agent:e1 role:worker.finance tenant:acme"),
            "worker 1 on host:a:b, for the plan's worker.finance credential"
        );
        assert_eq!(names.actor("executor:w1"), "worker w1");
        assert_eq!(
            names.actor(
                "agent:0eb25196-6f9a-4c1e-9a57-9b2f3c1d0e11 role:worker.finance tenant:acme"
            ),
            "agent invoice-bot (worker.finance)"
        );
        assert_eq!(
            names.actor("agent:ffffffff-0000-4000-8000-000000000000 role:planner tenant:acme"),
            "agent ffffffff (planner)"
        );
        assert_eq!(
            names.actor("person:urn:countersign:demo#ana"),
            "Ana (AP clerk)"
        );
        assert_eq!(names.actor("person:https://idp.example#u-42"), "u-42");
        // A person who signed in: the name their provider gave.
        assert_eq!(names.actor("person:https://idp.example#u-7"), "Jo Park");
        assert_eq!(names.actor("person:https://other.example#u-7"), "u-7");
        assert_eq!(names.actor("person:Jane Doe"), "Jane Doe");
        assert_eq!(
            names.actor("config:COUNTERSIGN_REGISTRY"),
            "config:COUNTERSIGN_REGISTRY"
        );
        // Search: only an active, named (not execution) credential resolves.
        assert_eq!(
            names.agent_actor("invoice-bot", "acme").as_deref(),
            Some("agent:0eb25196-6f9a-4c1e-9a57-9b2f3c1d0e11 role:worker.finance tenant:acme")
        );
        assert_eq!(names.agent_actor("exec:run-1:worker.finance", "acme"), None);
        assert_eq!(names.agent_actor("nobody", "acme"), None);
    }
}
