//! Agent credentials in the database: create (hash only), list, revoke, authenticate.

use serde::Serialize;
use uuid::Uuid;

use super::{Store, StoreError, on_pool};
use crate::agents::{AgentToken, RandomnessError};

/// What is needed to create a credential.
#[derive(Debug, Clone)]
pub struct NewAgent {
    /// A human-readable name, unique among credentials that are not revoked.
    pub name: String,
    /// The registry role the agent acts in.
    pub role: String,
    /// The tenant it is confined to.
    pub tenant: String,
    /// Who created it (recorded; approvals may refuse this person for four eyes).
    pub created_by: String,
    /// Expiry, Unix ms; `None` never expires.
    pub expires_at: Option<i64>,
}

/// A stored credential (never the token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct AgentCredential {
    /// Credential id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Role.
    pub role: String,
    /// Tenant.
    pub tenant: String,
    /// Creator.
    pub created_by: String,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms, if it expires.
    pub expires_at: Option<i64>,
    /// Unix ms, if revoked.
    pub revoked_at: Option<i64>,
}

/// Why a presented token was refused. The client only ever sees "unauthorized".
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// Not shaped like a token, or no credential has its hash.
    #[error("unknown token")]
    Unknown,
    /// The credential was revoked.
    #[error("revoked credential {0}")]
    Revoked(String),
    /// The credential expired.
    #[error("expired credential {0}")]
    Expired(String),
}

/// Errors creating a credential.
#[derive(Debug, thiserror::Error)]
pub enum CreateAgentError {
    /// No randomness.
    #[error(transparent)]
    Random(#[from] RandomnessError),
    /// A field was empty, or the name is taken.
    #[error("{0}")]
    Invalid(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

const COLUMNS: &str = "id, name, role, tenant, created_by, created_at, expires_at, revoked_at";

impl Store {
    /// Creates a credential and returns it with its token, which is not stored and cannot be
    /// recovered: show it once.
    pub async fn create_agent(
        &self,
        new: &NewAgent,
    ) -> Result<(AgentCredential, AgentToken), CreateAgentError> {
        for (field, value) in [
            ("name", &new.name),
            ("role", &new.role),
            ("tenant", &new.tenant),
            ("created_by", &new.created_by),
        ] {
            if value.trim().is_empty() {
                return Err(CreateAgentError::Invalid(format!(
                    "{field} must not be empty"
                )));
            }
        }
        if self.find_active_agent_by_name(&new.name).await?.is_some() {
            return Err(CreateAgentError::Invalid(format!(
                "an active credential is already named {:?}",
                new.name
            )));
        }
        let token = AgentToken::generate()?;
        let id = Uuid::new_v4().to_string();
        let now = self.clock.now_ms();
        on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO agent_credentials
                   (id, name, role, tenant, token_hash, created_by, created_at, expires_at, revoked_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL)",
            )
            .bind(&id)
            .bind(&new.name)
            .bind(&new.role)
            .bind(&new.tenant)
            .bind(token.hash())
            .bind(&new.created_by)
            .bind(now)
            .bind(new.expires_at)
            .execute(p)
            .await
            .map_err(StoreError::from)?
            .rows_affected()
        });
        Ok((self.get_agent(&id).await?, token))
    }

    /// One credential by id.
    pub async fn get_agent(&self, id: &str) -> Result<AgentCredential, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM agent_credentials WHERE id = $1");
        let row: AgentCredential = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(id).fetch_one(p).await?
        });
        Ok(row)
    }

    async fn find_active_agent_by_name(
        &self,
        name: &str,
    ) -> Result<Option<AgentCredential>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM agent_credentials WHERE name = $1 AND revoked_at IS NULL"
        );
        let row: Option<AgentCredential> = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(name).fetch_optional(p).await?
        });
        Ok(row)
    }

    /// Every credential, newest first.
    pub async fn list_agents(&self) -> Result<Vec<AgentCredential>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM agent_credentials ORDER BY created_at DESC, id");
        let rows: Vec<AgentCredential> =
            on_pool!(self, |p| { sqlx::query_as(&sql).fetch_all(p).await? });
        Ok(rows)
    }

    /// Revokes the credential with this id, or the active one with this name. Revoking twice
    /// is harmless; the first revocation time is kept.
    pub async fn revoke_agent(&self, id_or_name: &str) -> Result<AgentCredential, StoreError> {
        let id = match self.find_active_agent_by_name(id_or_name).await? {
            Some(a) => a.id,
            None => id_or_name.to_string(),
        };
        let now = self.clock.now_ms();
        on_pool!(self, |p| {
            sqlx::query(
                "UPDATE agent_credentials SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2",
            )
            .bind(now)
            .bind(&id)
            .execute(p)
            .await?
            .rows_affected()
        });
        self.get_agent(&id).await
    }

    /// Checks a presented token: the credential if it is known, not revoked and not expired
    /// at the store clock's now.
    pub async fn authenticate_agent(
        &self,
        token: &AgentToken,
    ) -> Result<Result<AgentCredential, AuthError>, StoreError> {
        if !token.is_well_formed() {
            return Ok(Err(AuthError::Unknown));
        }
        let sql = format!("SELECT {COLUMNS} FROM agent_credentials WHERE token_hash = $1");
        let hash = token.hash();
        let row: Option<AgentCredential> = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(&hash).fetch_optional(p).await?
        });
        let Some(cred) = row else {
            return Ok(Err(AuthError::Unknown));
        };
        if cred.revoked_at.is_some() {
            return Ok(Err(AuthError::Revoked(cred.id)));
        }
        if cred.expires_at.is_some_and(|t| t <= self.clock.now_ms()) {
            return Ok(Err(AuthError::Expired(cred.id)));
        }
        Ok(Ok(cred))
    }
}
