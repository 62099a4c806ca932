//! Ending sessions from outside the browser that holds them: an admin (page or CLI) ending a
//! person's sessions, and the identity provider's back-channel logout.
//!
//! Invariants:
//! * A session ends by deleting its row: effective at the person's next request, and a
//!   request in flight cannot write it back ([`Store::session_save`] only updates).
//! * Every ending is one audit record (`operational`, rule `sessions.ended`): who ended them,
//!   whom, and how many, also when none matched.

use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::{Person, Store, StoreError};

use super::oidc::IdpSession;
use super::session::{IDP, PERSON};

/// The audit rule of ending a person's sessions.
pub const SESSIONS_ENDED_RULE: &str = "sessions.ended";

/// Which sessions to end: a person's (optionally only those signed in for one tenant), or
/// those of one provider session (`sid`).
#[derive(Debug, Clone, Default)]
pub struct Which<'a> {
    /// The issuer.
    pub iss: &'a str,
    /// The person, when named.
    pub sub: Option<&'a str>,
    /// Only sessions signed in for this tenant (a tenant admin's reach).
    pub tenant: Option<&'a str>,
    /// The provider's session id, when named.
    pub sid: Option<&'a str>,
    /// Only sessions signed in at or before this instant (ms; a back-channel logout token's
    /// `iat`: replaying it later ends no session begun since).
    pub signed_in_by: Option<i64>,
}

impl Which<'_> {
    fn matches(&self, person: &Person, idp: Option<&IdpSession>) -> bool {
        let sid = idp.and_then(|i| i.sid.as_deref());
        let signed_in = idp.map_or(person.auth_time, |i| i.signed_in_at);
        person.iss == self.iss
            && self.signed_in_by.is_none_or(|by| signed_in <= by)
            && self.sub.is_none_or(|s| person.sub == s)
            && match (self.sid, sid) {
                (None, _) => true,
                (Some(want), Some(have)) => want == have,
                // A session that recorded no provider session id: only the person can say.
                (Some(_), None) => self.sub.is_some(),
            }
            && self
                .tenant
                .is_none_or(|t| person.tenant.as_deref() == Some(t))
    }

    fn named(&self) -> String {
        match (self.sub, self.sid) {
            (Some(sub), _) => format!("{}#{sub}", self.iss),
            (None, Some(sid)) => format!("{} session {sid}", self.iss),
            (None, None) => self.iss.to_string(),
        }
    }
}

/// Ends every live session `which` names, as `by`; returns how many ended. `which` must
/// name a person or a provider session: a bare issuer ends nothing. A failure part way is
/// still audited, with the count ended before it.
pub async fn end_sessions(store: &Store, which: &Which<'_>, by: &str) -> Result<usize, StoreError> {
    let mut ended = 0;
    let result = delete_matching(store, which, &mut ended).await;
    audit(store, which, by, ended).await?;
    result.map(|()| ended)
}

async fn delete_matching(
    store: &Store,
    which: &Which<'_>,
    ended: &mut usize,
) -> Result<(), StoreError> {
    if which.sub.is_some() || which.sid.is_some() {
        for (id, data) in store.sessions_all().await? {
            let Ok(value) = serde_json::from_slice::<serde_json::Value>(&data) else {
                continue;
            };
            let Some(person) = value
                .get(PERSON)
                .cloned()
                .and_then(|p| serde_json::from_value::<Person>(p).ok())
            else {
                continue; // nobody's
            };
            let idp = value
                .get(IDP)
                .cloned()
                .and_then(|i| serde_json::from_value::<IdpSession>(i).ok());
            if which.matches(&person, idp.as_ref()) {
                store.session_delete(&id).await?;
                *ended += 1;
            }
        }
    }
    Ok(())
}

async fn audit(store: &Store, which: &Which<'_>, by: &str, ended: usize) -> Result<(), StoreError> {
    let mut detail = serde_json::Map::new();
    detail.insert("kind".into(), serde_json::json!("sessions_ended"));
    detail.insert("person".into(), serde_json::json!(which.named()));
    detail.insert("tenant".into(), serde_json::json!(which.tenant));
    detail.insert("ended".into(), serde_json::json!(ended));
    store
        .append_audit(&NewAuditRecord {
            event: Some(AuditEvent::Operational),
            run_id: None,
            step_id: None,
            tool: None,
            actor: Some(by.to_string()),
            rule: Some(SESSIONS_ENDED_RULE.into()),
            detail,
            tenant: which.tenant.map(str::to_string),
        })
        .await?;
    Ok(())
}
