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

use super::runs::{RUN_COLUMNS, RunRow};
use super::standing::write_audited;
use super::standing::{
    CONTEXT_COLUMNS, CONTEXT_CTE, CONTEXT_GRANTS_JOIN, ContextRow, ContextSql, context_from_rows,
};
use super::{CallContext, Pool, Run, StepDuties, Store, StoreError, on_pool};
use crate::agents::{AgentToken, RandomnessError};
use crate::audit::{
    AuditEvent, FAILURE_PAGE, NewAuditRecord, RECENT_EVENTS_SQL, append_in_tx, parse_recent_events,
};
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

/// What [`Store::planned_call`] reads.
#[derive(Debug, Clone)]
pub struct PlannedCall {
    /// The run.
    pub run: Run,
    /// Its agent's credential as stored, if the run names one that exists.
    pub agent: Option<AgentCredential>,
    /// That agent's context for the call.
    pub context: Option<CallContext>,
    /// The run's newest audit records as `(seq, event)`, newest first, for
    /// [`Store::failures_in_a_row_from`].
    pub recent_events: Option<Vec<(i64, String)>>,
    /// Steps of the run after position `step_seq` that are not done: while any is, the run
    /// is not done when that step ends.
    pub later_open: i64,
    /// The step's duties, when it has any (its credential is then the assignee's).
    pub duties: Option<StepDuties>,
    /// The run's agent (the planner) as `(revoked_at, expires_at)`, when it exists: a step
    /// on an execution credential stops with its planner's.
    pub planner_ends: Option<(Option<i64>, Option<i64>)>,
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

/// The `step_duties` columns, in [`StepDuties`]' order.
const DUTY_COLUMNS: &str =
    "step_id, review_required, reviewed_hash, reviewed_by, reviewed_at, assignee";

const COLUMNS: &str = "id, name, role, tenant, created_by, created_at, expires_at, revoked_at, acts_for, origin, run_id";

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
        self.insert_agent(new, None).await
    }

    /// [`Store::create_agent`], optionally as the execution credential of run `run_id`.
    pub(crate) async fn insert_agent(
        &self,
        new: &NewAgent,
        run_id: Option<&str>,
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
        if new.acts_for.as_deref().is_some_and(|p| p.trim().is_empty()) {
            return Err(CreateAgentError::Invalid(
                "acts_for must name a party (or be left out)".into(),
            ));
        }
        if self.find_active_agent_by_name(&new.name).await?.is_some() {
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
        let inserted: Result<bool, StoreError> = async {
            Ok(write_audited!(
                self,
                audit,
                now,
                sqlx::query(
                    "INSERT INTO agent_credentials
                       (id, name, role, tenant, token_hash, created_by, created_at, expires_at,
                        revoked_at, acts_for, origin, run_id)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9, $10, $11)",
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
                return Err(match self.find_active_agent_by_name(&new.name).await? {
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
                .find_active_agent_by_name(id_or_name)
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

    /// What an executor reads before a planned step of run `run_id`, in ONE statement: the
    /// run, the step's duties (at position `step_seq`), the credential it runs on as stored
    /// — its assignee, else the run's agent — (not checked: see [`Store::check_credential`]),
    /// that agent's [`CallContext`] ([`Store::call_context`] with the credential's tenant
    /// and id; `None` without a credential), the run's newest audit records (the first
    /// page [`Store::failures_in_a_row`] reads) and how many of its steps after `step_seq`
    /// are not done. [`StoreError::NotFound`] when the run does not
    /// exist.
    pub async fn planned_call(
        &self,
        run_id: &str,
        step_seq: i64,
        switch: &str,
    ) -> Result<PlannedCall, StoreError> {
        let now = self.clock.now_ms();
        let sql = ContextSql {
            tenant: "(SELECT tenant FROM c)",
            switch: "$2",
            // The party and grants are the run's agent's (the planner's, read live; an
            // execution credential acts for whoever its planner acts for now).
            agent: "COALESCE((SELECT id FROM pc), (SELECT id FROM c))",
            now: "$3",
        }
        .fill(&format!(
            "WITH r AS (SELECT {RUN_COLUMNS}, {recent} AS recent_events,
                             (SELECT COUNT(*) FROM steps s WHERE s.run_id = runs.id
                                 AND s.seq > $4 AND s.status <> 'done') AS later_open
                              FROM runs WHERE id = $1),
                      d AS (SELECT {DUTY_COLUMNS} FROM step_duties
                             WHERE step_id = (SELECT id FROM steps
                                               WHERE run_id = $1 AND seq = $4)),
                      pc AS (SELECT id, revoked_at, expires_at FROM agent_credentials
                              WHERE id = (SELECT agent_id FROM r)),
                      c AS (SELECT {COLUMNS} FROM agent_credentials
                             WHERE id = COALESCE((SELECT assignee FROM d),
                                                 (SELECT agent_id FROM r))),
                      {CONTEXT_CTE}
                 SELECT r.*, c.id AS c_id, c.name AS c_name, c.role AS c_role,
                        c.tenant AS c_tenant, c.created_by AS c_created_by,
                        c.created_at AS c_created_at, c.expires_at AS c_expires_at,
                        c.revoked_at AS c_revoked_at, c.acts_for AS c_acts_for,
                        c.origin AS c_origin, c.run_id AS c_run_id, {CONTEXT_COLUMNS},
                        (SELECT step_id FROM d) AS d_step_id,
                        (SELECT review_required FROM d) AS d_review_required,
                        (SELECT reviewed_hash FROM d) AS d_reviewed_hash,
                        (SELECT reviewed_by FROM d) AS d_reviewed_by,
                        (SELECT reviewed_at FROM d) AS d_reviewed_at,
                        (SELECT assignee FROM d) AS d_assignee,
                        (SELECT id FROM pc) AS pc_id,
                        (SELECT revoked_at FROM pc) AS pc_revoked_at,
                        (SELECT expires_at FROM pc) AS pc_expires_at
                   FROM r LEFT JOIN c ON 1 = 1 {CONTEXT_GRANTS_JOIN}
                  ORDER BY s.granted_at, s.id",
            recent = RECENT_EVENTS_SQL
                .replace("{run}", "runs.id")
                .replace("{limit}", &FAILURE_PAGE.to_string()),
        ));
        macro_rules! decode {
            ($rows:expr) => {{
                let mut run: Option<RunRow> = None;
                let mut agent: Option<AgentCredential> = None;
                let mut ctx: Vec<ContextRow> = Vec::new();
                let mut recent: Option<String> = None;
                let mut later_open: i64 = 0;
                let mut duties: Option<StepDuties> = None;
                let mut planner_ends: Option<(Option<i64>, Option<i64>)> = None;
                for r in $rows {
                    if run.is_none() {
                        run = Some(RunRow::from_row(&r)?);
                        recent = r.try_get("recent_events")?;
                        later_open = r.try_get("later_open")?;
                        let planner: Option<String> = r.try_get("pc_id")?;
                        if planner.is_some() {
                            planner_ends =
                                Some((r.try_get("pc_revoked_at")?, r.try_get("pc_expires_at")?));
                        }
                        let step_id: Option<String> = r.try_get("d_step_id")?;
                        if let Some(step_id) = step_id {
                            let review: Option<bool> = r.try_get("d_review_required")?;
                            duties = Some(StepDuties {
                                step_id,
                                review_required: review.unwrap_or(true),
                                reviewed_hash: r.try_get("d_reviewed_hash")?,
                                reviewed_by: r.try_get("d_reviewed_by")?,
                                reviewed_at: r.try_get("d_reviewed_at")?,
                                assignee: r.try_get("d_assignee")?,
                            });
                        }
                        let id: Option<String> = r.try_get(14)?;
                        if let Some(id) = id {
                            agent = Some(AgentCredential {
                                id,
                                name: r.try_get(15)?,
                                role: r.try_get(16)?,
                                tenant: r.try_get(17)?,
                                created_by: r.try_get(18)?,
                                created_at: r.try_get(19)?,
                                expires_at: r.try_get(20)?,
                                revoked_at: r.try_get(21)?,
                                acts_for: r.try_get(22)?,
                                origin: r.try_get(23)?,
                                run_id: r.try_get(24)?,
                            });
                        }
                    }
                    ctx.push((
                        r.try_get(25)?,
                        r.try_get(26)?,
                        r.try_get(27)?,
                        r.try_get(28)?,
                        r.try_get(29)?,
                        r.try_get(30)?,
                        r.try_get(31)?,
                        r.try_get(32)?,
                        r.try_get(33)?,
                        r.try_get(34)?,
                        r.try_get(35)?,
                        r.try_get(36)?,
                        r.try_get(37)?,
                        r.try_get(38)?,
                        r.try_get(39)?,
                    ));
                }
                (run, agent, ctx, recent, later_open, duties, planner_ends)
            }};
        }
        let (run, agent, rows, recent, later_open, duties, planner_ends) = on_pool!(self, |p| {
            let rows = sqlx::query(&sql)
                .bind(run_id)
                .bind(switch)
                .bind(now)
                .bind(step_seq)
                .fetch_all(p)
                .await?;
            decode!(rows)
        });
        let run: Run = run.ok_or(StoreError::NotFound)?.try_into()?;
        let context = match &agent {
            Some(a) => {
                let holder = run.agent_id.as_deref().unwrap_or(a.id.as_str());
                context_from_rows(run_id, rows, &a.tenant, holder, now)?
            }
            None => None,
        };
        Ok(PlannedCall {
            run,
            agent,
            context,
            recent_events: parse_recent_events(recent.as_deref()),
            later_open,
            duties,
            planner_ends,
        })
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
    }
}
