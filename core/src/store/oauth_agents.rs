//! Agents that authenticate with OAuth access tokens: a credential registered for one client
//! of one authorization server.
//!
//! Invariants:
//! * A registration is an agent credential like any other (role, tenant, creator, expiry,
//!   revocation, the same `agent.created` / `agent.revoked` audit records, which name the
//!   issuer and client); it has no token of its own that anyone was shown.
//! * At most one active registration names an (issuer, client) pair across every tenant: a
//!   second is refused, and a look-up that finds two anyway refuses both (never picks one).
//! * Authentication names the exact issuer the token's signature was verified for; a revoked
//!   or expired registration is refused at the next request.

use super::agents::{AuthError, COLUMNS, CreateAgentError, NewAgent};
use super::{AgentCredential, Store, StoreError, on_pool};

/// An agent credential's OAuth client: (credential id, issuer, client id).
pub type OAuthRegistration = (String, String, String);

impl Store {
    /// Registers client `client` of authorization server `issuer` as the agent `new`
    /// describes (audited as the credential's creation).
    pub async fn register_oauth_agent(
        &self,
        new: &NewAgent,
        issuer: &str,
        client: &str,
    ) -> Result<AgentCredential, CreateAgentError> {
        if issuer.trim().is_empty() || client.trim().is_empty() {
            return Err(CreateAgentError::Invalid(
                "an OAuth registration needs an issuer and a client id".into(),
            ));
        }
        if !self.oauth_candidates(issuer, client).await?.is_empty() {
            return Err(CreateAgentError::Invalid(format!(
                "client {client:?} of {issuer} is already registered to an active credential"
            )));
        }
        let (cred, _never_shown) = self.insert_agent(new, None, Some((issuer, client))).await?;
        Ok(cred)
    }

    /// The agent registered for client `client` of `issuer`, unless revoked or expired.
    pub async fn authenticate_oauth(
        &self,
        issuer: &str,
        client: &str,
    ) -> Result<Result<AgentCredential, AuthError>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM agent_credentials
              WHERE oauth_issuer = $1 AND oauth_client = $2
              ORDER BY revoked_at IS NULL DESC, created_at DESC"
        );
        let rows: Vec<AgentCredential> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(issuer)
                .bind(client)
                .fetch_all(p)
                .await?
        });
        let active: Vec<&AgentCredential> =
            rows.iter().filter(|c| c.revoked_at.is_none()).collect();
        match (active.as_slice(), rows.first()) {
            ([one], _) => Ok(self.check_credential((*one).clone())),
            ([], Some(revoked)) => Ok(self.check_credential(revoked.clone())),
            ([], None) => Ok(Err(AuthError::Unknown)),
            // Two active registrations of one client (a race past the check in
            // `register_oauth_agent`): neither is the agent.
            _ => Ok(Err(AuthError::Unknown)),
        }
    }

    /// The active credentials registered for client `client` of `issuer`.
    async fn oauth_candidates(
        &self,
        issuer: &str,
        client: &str,
    ) -> Result<Vec<String>, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar(
                "SELECT id FROM agent_credentials
                  WHERE oauth_issuer = $1 AND oauth_client = $2 AND revoked_at IS NULL",
            )
            .bind(issuer)
            .bind(client)
            .fetch_all(p)
            .await?
        }))
    }

    /// Every credential's OAuth client, for listings.
    pub async fn oauth_registrations(&self) -> Result<Vec<OAuthRegistration>, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT id, oauth_issuer, oauth_client FROM agent_credentials
                  WHERE oauth_issuer IS NOT NULL ORDER BY created_at, id",
            )
            .fetch_all(p)
            .await?
        }))
    }
}
