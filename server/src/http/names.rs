//! What a person reads instead of ids (issue 36): an audit actor such as
//! `executor:local:19408:0 agent:0eb25196-… role:worker.finance tenant:acme` becomes
//! `worker 0 on local for invoice-bot (worker.finance)`; a person `person:ISS#SUB` becomes their
//! display name where Countersign knows it (the demo people; otherwise the subject).
//!
//! Invariants:
//! * Display only: filters and links keep the exact recorded actor; the id stays one click
//!   away (the raw text is shown beside or in a title).
//! * A tenant's pages name only that tenant's agents: an id of another tenant's agent (which
//!   no record of this tenant should hold) is shown shortened, never with its name.

use std::collections::HashMap;

use countersign_core::{Store, StoreError};

use crate::auth::demo_names;

/// Names for one tenant's pages.
#[derive(Debug, Default, Clone)]
pub struct Names {
    /// Agent id → (name, role), this tenant's credentials.
    agents: HashMap<String, (String, String)>,
}

/// The first 8 characters of an id, for when no name is known.
fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

impl Names {
    /// The names of `tenant`'s agents.
    pub async fn load(store: &Store, tenant: &str) -> Result<Self, StoreError> {
        Ok(Self {
            agents: store
                .list_agents()
                .await?
                .into_iter()
                .filter(|a| a.tenant == tenant)
                .map(|a| (a.id, (a.name, a.role)))
                .collect(),
        })
    }

    /// The agent credential `id`, as people name it: `invoice-bot (worker.finance)`.
    pub fn agent(&self, id: &str, role: Option<&str>) -> String {
        match (self.agents.get(id), role) {
            (Some((name, role)), _) => format!("{name} ({role})"),
            (None, Some(role)) => format!("agent {} ({role})", short(id)),
            (None, None) => format!("agent {}", short(id)),
        }
    }

    /// The recorded actor of `tenant`'s agent named `name` (its direct calls; `agent:ID
    /// role:R tenant:T`), if this tenant has exactly one agent of that name.
    pub fn agent_actor(&self, name: &str, tenant: &str) -> Option<String> {
        let mut found = self.agents.iter().filter(|(_, (n, _))| n == name);
        match (found.next(), found.next()) {
            (Some((id, (_, role))), None) => {
                Some(format!("agent:{id} role:{role} tenant:{tenant}"))
            }
            _ => None,
        }
    }

    /// `actor` (as recorded) in words.
    pub fn actor(&self, actor: &str) -> String {
        let token = |prefix: &str| {
            actor
                .split_whitespace()
                .find_map(|t| t.strip_prefix(prefix))
        };
        if let Some(person) = token("person:") {
            return person_name(person);
        }
        let agent = token("agent:").map(|id| self.agent(id, token("role:")));
        match (token("executor:"), agent) {
            (Some(worker), Some(agent)) => format!("{} for {agent}", worker_name(worker)),
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

/// `ISS#SUB` as the person's display name where known (the demo people), else the subject.
fn person_name(person: &str) -> String {
    let (iss, sub) = person.rsplit_once('#').unwrap_or(("", person));
    demo_names(iss, sub).map_or_else(|| sub.to_string(), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_read_as_names() {
        let names = Names {
            agents: HashMap::from([(
                "0eb25196-6f9a-4c1e-9a57-9b2f3c1d0e11".to_string(),
                ("invoice-bot".to_string(), "worker.finance".to_string()),
            )]),
        };
        assert_eq!(
            names.actor("executor:local:19408:0 agent:0eb25196-6f9a-4c1e-9a57-9b2f3c1d0e11 role:worker.finance tenant:acme"),
            "worker 0 on local for invoice-bot (worker.finance)"
        );
        assert_eq!(
            names.actor(
                "agent:0eb25196-6f9a-4c1e-9a57-9b2f3c1d0e11 role:worker.finance tenant:acme"
            ),
            "invoice-bot (worker.finance)"
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
        assert_eq!(
            names.actor("config:COUNTERSIGN_REGISTRY"),
            "config:COUNTERSIGN_REGISTRY"
        );
    }
}
