//! Agent credentials in the database: create (hash only), list, revoke, authenticate.
//!
//! Invariants:
//! * Only the token's SHA-256 is stored; the token itself is returned once by
//!   [`Store::create_agent`] and never written anywhere.
//! * Creating, revoking and restoring a credential are audited (`operational`, rules
//!   `agent.created`, `agent.revoked` and `agent.restored`, naming who did it, the credential's id, name, role and tenant, never its
//!   token or hash), each in the same transaction as its row: no credential exists or ends
//!   without its record. Revoking an already revoked credential changes and records nothing.

use serde::Serialize;
use serde_json::{Map, json};
use uuid::Uuid;

use sqlx::{FromRow, Row};

use super::standing::write_audited;
use super::standing::{
    CONTEXT_COLUMNS, CONTEXT_CTE, CONTEXT_GRANTS_JOIN, ContextRow, ContextSql, context_from_rows,
};
use super::{CallContext, Pool, Store, StoreError, on_pool};
use crate::agents::{AgentToken, RandomnessError};
use crate::audit::{AuditEvent, NewAuditRecord};
use crate::policy::TaskOrigin;

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
    /// The party its calls are made for (an operator's binding), if any.
    pub acts_for: Option<String>,
    /// Where its tasks come from (policy's `task_origin`), as the operator declares it.
    pub origin: TaskOrigin,
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
    /// The party its calls are made for, if an operator bound one.
    pub acts_for: Option<String>,
    /// Where its tasks come from (`user`, `schedule`, `monitor`, `external`).
    pub origin: String,
    /// For an execution credential: the one run whose steps it may run.
    pub run_id: Option<String>,
}

/// What [`Store::authenticate_for_call`] also reads: the context of a call the token is
/// expected to make (from an earlier call of the same MCP session).
#[derive(Debug, Clone, Copy)]
pub struct ContextHint<'a> {
    /// The agent the token was last seen to be.
    pub agent_id: &'a str,
    /// That agent's run for this session.
    pub run_id: &'a str,
    /// The switch the call checks (the emergency stop).
    pub switch: &'a str,
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

pub(super) const COLUMNS: &str = "id, name, role, tenant, created_by, created_at, expires_at, revoked_at, acts_for, origin, run_id";

fn taken(name: &str) -> CreateAgentError {
    CreateAgentError::Invalid(format!("an active credential is already named {name:?}"))
}

impl Store {
    /// Creates a credential and returns it with its token, which is not stored and cannot be
    /// recovered: show it once.
    pub async fn create_agent(
        &self,
        new: &NewAgent,
    ) -> Result<(AgentCredential, AgentToken), CreateAgentError> {
        self.insert_agent(new, None, None).await
    }

    /// [`Store::create_agent`], optionally as the execution credential of run `run_id`, or
    /// for the OAuth client `oauth` (issuer, client id) of an authorization server.
    pub(crate) async fn insert_agent(
        &self,
        new: &NewAgent,
        run_id: Option<&str>,
        oauth: Option<(&str, &str)>,
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
        if let Err(e) = crate::audit::chain_of_tenant(Some(&new.tenant)) {
            return Err(CreateAgentError::Invalid(StoreError::from(e).to_string()));
        }
        if new.acts_for.as_deref().is_some_and(|p| p.trim().is_empty()) {
            return Err(CreateAgentError::Invalid(
                "acts_for must name a party (or be left out)".into(),
            ));
        }
        if self
            .find_active_agent_by_name(&new.name, Some(&new.tenant))
            .await?
            .is_some()
        {
            return Err(taken(&new.name));
        }
        let token = AgentToken::generate()?;
        let id = Uuid::new_v4().to_string();
        let now = self.clock.now_ms();
        let mut audit = record(
            CREATED_RULE,
            &new.created_by,
            &id,
            &new.name,
            &new.role,
            &new.tenant,
            new.expires_at,
        );
        audit.detail.insert("acts_for".into(), json!(new.acts_for));
        audit
            .detail
            .insert("origin".into(), json!(new.origin.as_str()));
        if let Some(run) = run_id {
            // Minted by Countersign at `plan.submit`, not by a person: the record says so,
            // and names whose accountability the credential carries.
            audit.actor = Some(MINTED_BY.to_string());
            audit.run_id = Some(run.to_string());
            audit.detail.insert("execution_for_run".into(), json!(run));
            audit
                .detail
                .insert("created_by".into(), json!(new.created_by));
        }
        if let Some((issuer, client)) = oauth {
            audit.detail.insert("oauth_issuer".into(), json!(issuer));
            audit.detail.insert("oauth_client".into(), json!(client));
        }
        let (oauth_issuer, oauth_client) = oauth.unzip();
        let inserted: Result<bool, StoreError> = async {
            Ok(write_audited!(
                self,
                audit,
                now,
                sqlx::query(
                    "INSERT INTO agent_credentials
                       (id, name, role, tenant, token_hash, created_by, created_at, expires_at,
                        revoked_at, acts_for, origin, run_id, oauth_issuer, oauth_client)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9, $10, $11, $12, $13)",
                )
                .bind(&id)
                .bind(&new.name)
                .bind(&new.role)
                .bind(&new.tenant)
                .bind(token.hash())
                .bind(&new.created_by)
                .bind(now)
                .bind(new.expires_at)
                .bind(&new.acts_for)
                .bind(new.origin.as_str())
                .bind(run_id)
                .bind(oauth_issuer)
                .bind(oauth_client)
            ))
        }
        .await;
        match inserted {
            Ok(true) => {}
            Ok(false) => {
                return Err(CreateAgentError::Store(StoreError::Conflict(
                    "the credential was not stored".into(),
                )));
            }
            // Another creation took the name meanwhile (the index holds it; a unique
            // violation arrives as a conflict).
            Err(e @ StoreError::Conflict(_)) => {
                let active = self
                    .find_active_agent_by_name(&new.name, Some(&new.tenant))
                    .await?;
                return Err(match active {
                    Some(_) => taken(&new.name),
                    None => CreateAgentError::Store(e),
                });
            }
            Err(e) => return Err(CreateAgentError::Store(e)),
        }
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

    /// The active credential named `name` in `tenant`, or in any tenant (`None`): names are
    /// unique among a tenant's active credentials, so a name active in several tenants is
    /// refused as ambiguous rather than answered with one of them.
    async fn find_active_agent_by_name(
        &self,
        name: &str,
        tenant: Option<&str>,
    ) -> Result<Option<AgentCredential>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM agent_credentials
              WHERE name = $1 AND revoked_at IS NULL AND ($2 IS NULL OR tenant = $2)
              ORDER BY tenant LIMIT 2"
        );
        let rows: Vec<AgentCredential> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(name)
                .bind(tenant)
                .fetch_all(p)
                .await?
        });
        super::at_most_one(rows, || {
            format!("an active credential named {name:?} exists in several tenants; name it by id")
        })
    }

    /// `tenant`'s credentials (execution credentials included), newest first.
    pub async fn agents_of(&self, tenant: &str) -> Result<Vec<AgentCredential>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM agent_credentials WHERE tenant = $1 ORDER BY created_at DESC, id"
        );
        let rows: Vec<AgentCredential> = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(tenant).fetch_all(p).await?
        });
        Ok(rows)
    }

    /// Every credential, newest first.
    pub async fn list_agents(&self) -> Result<Vec<AgentCredential>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM agent_credentials ORDER BY created_at DESC, id");
        let rows: Vec<AgentCredential> =
            on_pool!(self, |p| { sqlx::query_as(&sql).fetch_all(p).await? });
        Ok(rows)
    }

    /// Revokes the credential with this id, else the active one with this name, as `by`, with
    /// its audit record in the same transaction. Revoking twice is harmless: the first
    /// revocation time and record are kept — except that revoking a credential an emergency
    /// stop revoked makes it the person's revocation: lifting the stop will not restore it
    /// (its stop revocations are forgotten, and that is audited).
    pub async fn revoke_agent(
        &self,
        id_or_name: &str,
        by: &str,
    ) -> Result<AgentCredential, StoreError> {
        let cred = self.find_agent(id_or_name).await?;
        if cred.revoked_at.is_some() {
            if self.forget_agent_stop_revocations(&cred.id).await? > 0 {
                let mut audit = record(
                    REVOKED_RULE,
                    by,
                    &cred.id,
                    &cred.name,
                    &cred.role,
                    &cred.tenant,
                    cred.expires_at,
                );
                audit.detail.insert(
                    "kept_revoked".into(),
                    json!("no longer restored with its stop"),
                );
                self.append_audit(&audit).await?;
            }
            return Ok(cred);
        }
        let now = self.clock.now_ms();
        let audit = record(
            REVOKED_RULE,
            by,
            &cred.id,
            &cred.name,
            &cred.role,
            &cred.tenant,
            cred.expires_at,
        );
        // Only an unrevoked row is touched: a concurrent revocation writes the one record.
        write_audited!(
            self,
            audit,
            now,
            sqlx::query(
                "UPDATE agent_credentials SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
            )
            .bind(now)
            .bind(&cred.id)
        );
        self.get_agent(&cred.id).await
    }

    /// Restores credential `id`, revoked by the stop of switch row `switch`, as `by`, with its
    /// audit record (rule `agent.restored`) in the same transaction. `Ok(false)`, nothing
    /// written, unless the stop's own revocation is still the one in place (same
    /// `revoked_at`), the credential is unexpired and not an execution credential, and no
    /// live credential has taken its name since (see `stops.rs`).
    pub async fn restore_agent(
        &self,
        switch: &str,
        id: &str,
        by: &str,
    ) -> Result<bool, StoreError> {
        let cred = match self.get_agent(id).await {
            Ok(c) => c,
            Err(StoreError::NotFound) => return Ok(false),
            Err(e) => return Err(e),
        };
        let now = self.clock.now_ms();
        let mut audit = record(
            RESTORED_RULE,
            by,
            &cred.id,
            &cred.name,
            &cred.role,
            &cred.tenant,
            cred.expires_at,
        );
        audit.detail.insert("stop".into(), json!(switch));
        // Never while a stop still covers it (the platform's, or its tenant's).
        let base = switch.split(':').next().unwrap_or(switch);
        let sql = format!(
            "UPDATE agent_credentials SET revoked_at = NULL
              WHERE id = $1 AND run_id IS NULL
                AND (expires_at IS NULL OR expires_at > $2)
                AND revoked_at = (SELECT revoked_at FROM stop_revocations
                                   WHERE switch = $3 AND agent_id = $1)
                AND NOT {}",
            super::stops::switch_set_sql("$4", "agent_credentials.tenant")
        );
        let restored: Result<bool, StoreError> = async {
            Ok(write_audited!(
                self,
                audit,
                now,
                sqlx::query(&sql)
                    .bind(&cred.id)
                    .bind(now)
                    .bind(switch)
                    .bind(base)
            ))
        }
        .await;
        match restored {
            // A live credential holds its name now (the one-active-name index).
            Err(StoreError::Conflict(_)) => Ok(false),
            other => other,
        }
    }

    /// Sets who `id_or_name`'s calls are made for (`acts_for`; `None` unbinds) and where its
    /// tasks come from (`origin`), as operator `by`, with its audit record (rule
    /// `agent.bound`, old and new values) in the same transaction. Refused for a revoked
    /// credential, an execution credential (it takes its run's binding when minted) and an
    /// empty party. Setting what is already set records nothing.
    pub async fn bind_agent(
        &self,
        id_or_name: &str,
        acts_for: Option<&str>,
        origin: TaskOrigin,
        by: &str,
    ) -> Result<AgentCredential, CreateAgentError> {
        if acts_for.is_some_and(|p| p.trim().is_empty()) {
            return Err(CreateAgentError::Invalid(
                "acts_for must name a party (or be left out to unbind)".into(),
            ));
        }
        if by.trim().is_empty() {
            return Err(CreateAgentError::Invalid("by must not be empty".into()));
        }
        let cred = self.find_agent(id_or_name).await?;
        if cred.revoked_at.is_some() {
            return Err(CreateAgentError::Invalid(format!(
                "credential {:?} is revoked",
                cred.name
            )));
        }
        if cred.run_id.is_some() {
            return Err(CreateAgentError::Invalid(format!(
                "credential {:?} is an execution credential: it acts for its run's party",
                cred.name
            )));
        }
        if cred.acts_for.as_deref() == acts_for && cred.origin == origin.as_str() {
            return Ok(cred);
        }
        let now = self.clock.now_ms();
        let mut audit = record(
            BOUND_RULE,
            by,
            &cred.id,
            &cred.name,
            &cred.role,
            &cred.tenant,
            cred.expires_at,
        );
        audit.detail.insert("acts_for".into(), json!(acts_for));
        audit.detail.insert("origin".into(), json!(origin.as_str()));
        audit
            .detail
            .insert("was_acts_for".into(), json!(cred.acts_for));
        audit.detail.insert("was_origin".into(), json!(cred.origin));
        // Only the row as read is changed: a concurrent change makes this one a no-op.
        let written = write_audited!(
            self,
            audit,
            now,
            sqlx::query(
                "UPDATE agent_credentials SET acts_for = $1, origin = $2
                  WHERE id = $3 AND revoked_at IS NULL AND origin = $4
                    AND COALESCE(acts_for, '') = COALESCE($5, '')",
            )
            .bind(acts_for)
            .bind(origin.as_str())
            .bind(&cred.id)
            .bind(&cred.origin)
            .bind(&cred.acts_for)
        );
        if !written {
            return Err(CreateAgentError::Invalid(format!(
                "credential {:?} changed meanwhile; read it again",
                cred.name
            )));
        }
        Ok(self.get_agent(&cred.id).await?)
    }

    /// The credential with this id, else the active one with this name.
    pub async fn find_agent(&self, id_or_name: &str) -> Result<AgentCredential, StoreError> {
        // An id first: a name that happens to spell another credential's id never wins.
        match self.get_agent(id_or_name).await {
            Ok(a) => Ok(a),
            Err(StoreError::NotFound) => self
                .find_active_agent_by_name(id_or_name, None)
                .await?
                .ok_or(StoreError::NotFound),
            Err(e) => Err(e),
        }
    }

    /// [`Store::authenticate_agent`] and, in the same statement, the [`CallContext`] of the call
    /// `hint` expects this token to make (its agent's run; see [`Store::call_context`]). The
    /// context is answered only when the token turns out to be `hint.agent_id`'s and the run
    /// exists; the credential is checked exactly as [`Store::authenticate_agent`] checks it.
    pub async fn authenticate_for_call(
        &self,
        token: &AgentToken,
        hint: &ContextHint<'_>,
    ) -> Result<(Result<AgentCredential, AuthError>, Option<CallContext>), StoreError> {
        if !token.is_well_formed() {
            return Ok((Err(AuthError::Unknown), None));
        }
        let now = self.clock.now_ms();
        let sql = ContextSql::numbered("(SELECT tenant FROM c)").fill(&format!(
            "WITH c AS (SELECT {COLUMNS} FROM agent_credentials WHERE token_hash = $1),
                      {CONTEXT_CTE}
                 SELECT c.id, c.name, c.role, c.tenant, c.created_by, c.created_at,
                        c.expires_at, c.revoked_at, c.acts_for, c.origin, c.run_id,
                        {CONTEXT_COLUMNS}
                   FROM c LEFT JOIN runs r ON r.id = $2 {CONTEXT_GRANTS_JOIN}
                  ORDER BY s.granted_at, s.id"
        ));
        let hash = token.hash();
        macro_rules! decode {
            ($rows:expr) => {{
                let mut cred: Option<AgentCredential> = None;
                let mut ctx: Vec<ContextRow> = Vec::new();
                for r in $rows {
                    if cred.is_none() {
                        cred = Some(AgentCredential::from_row(&r)?);
                    }
                    ctx.push((
                        r.try_get(11)?,
                        r.try_get(12)?,
                        r.try_get(13)?,
                        r.try_get(14)?,
                        r.try_get(15)?,
                        r.try_get(16)?,
                        r.try_get(17)?,
                        r.try_get(18)?,
                        r.try_get(19)?,
                        r.try_get(20)?,
                        r.try_get(21)?,
                        r.try_get(22)?,
                        r.try_get(23)?,
                        r.try_get(24)?,
                        r.try_get(25)?,
                    ));
                }
                (cred, ctx)
            }};
        }
        let (cred, rows) = on_pool!(self, |p| {
            let rows = sqlx::query(&sql)
                .bind(&hash)
                .bind(hint.run_id)
                .bind(hint.switch)
                .bind(hint.agent_id)
                .bind(now)
                .fetch_all(p)
                .await?;
            decode!(rows)
        });
        let Some(cred) = cred else {
            return Ok((Err(AuthError::Unknown), None));
        };
        let checked = self.check_credential(cred);
        let context = match &checked {
            Ok(c) if c.id == hint.agent_id => {
                context_from_rows(hint.run_id, rows, &c.tenant, &c.id, now)?
            }
            _ => None,
        };
        Ok((checked, context))
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
        Ok(self.check_credential(cred))
    }

    /// A known credential, unless revoked or expired at the store clock's now (the check every
    /// `/mcp` request and every planned step of the agent passes).
    pub fn check_credential(&self, cred: AgentCredential) -> Result<AgentCredential, AuthError> {
        if cred.revoked_at.is_some() {
            return Err(AuthError::Revoked(cred.id));
        }
        if cred.expires_at.is_some_and(|t| t <= self.clock.now_ms()) {
            return Err(AuthError::Expired(cred.id));
        }
        Ok(cred)
    }
}

/// The actor of an execution credential's `agent.created` record.
pub const MINTED_BY: &str = "countersign:plan.submit";
/// The audit rule of a credential's creation.
pub const CREATED_RULE: &str = "agent.created";
/// The audit rule of a credential's revocation.
pub const REVOKED_RULE: &str = "agent.revoked";
/// The audit rule of a change of who a credential acts for, or of its tasks' origin.
pub const BOUND_RULE: &str = "agent.bound";
/// The audit rule of a credential an emergency stop revoked, restored as its stop is lifted.
pub const RESTORED_RULE: &str = "agent.restored";

/// The audit record of a credential change (never its token or hash).
fn record(
    rule: &str,
    actor: &str,
    id: &str,
    name: &str,
    role: &str,
    tenant: &str,
    expires_at: Option<i64>,
) -> NewAuditRecord {
    let mut detail = Map::new();
    detail.insert("kind".into(), json!("agent_credential"));
    detail.insert("id".into(), json!(id));
    detail.insert("name".into(), json!(name));
    detail.insert("role".into(), json!(role));
    detail.insert("tenant".into(), json!(tenant));
    detail.insert("expires_at".into(), json!(expires_at));
    NewAuditRecord {
        event: Some(AuditEvent::Operational),
        run_id: None,
        step_id: None,
        tool: None,
        actor: Some(actor.to_string()),
        rule: Some(rule.to_string()),
        detail,
        tenant: Some(tenant.to_string()),
    }
}
