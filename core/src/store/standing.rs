//! Standing authorizations in the database (table `standing_authorizations`, migration 0008):
//! grant, list, revoke, and the grants a party holds now — the ones the policy engine is
//! handed for a call made for that party.
//!
//! Invariants (fail closed):
//! * [`Store::standing_for`] returns only grants of exactly that tenant, held by exactly that
//!   party, not revoked, and with `now < expires_at`; a row whose conditions do not parse is
//!   left out (it covers nothing). Whether a grant covers a call (tool, conditions, bounds) is
//!   the policy engine's decision ([`crate::policy`]), which checks party and expiry again and
//!   never lets a grant lift a deny or a floor.
//! * A grant is never edited. Granting inserts a row; revoking stamps `revoked_*` once (a
//!   revoked grant cannot be revoked again or revived; a new grant needs a new id). Each change
//!   commits in one transaction with its `operational` audit record (rule `standing.granted`
//!   or `standing.revoked`), so no grant exists or ends without its record.
//! * A grant must name a tenant, a party, a tool, who grants it and why, and expire in the
//!   future: an already-expired or unbounded grant is refused.

use serde::Serialize;
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::{Pool, RunStatus, Store, StoreError, on_pool};
use crate::audit::{AuditEvent, NewAuditRecord};
use crate::policy::{AuthorizationCondition, StandingAuthorization};

/// Rule of the audit record of a grant.
pub const GRANTED_RULE: &str = "standing.granted";
/// Rule of the audit record of a revocation.
pub const REVOKED_RULE: &str = "standing.revoked";

/// What is needed to grant a standing authorization.
#[derive(Debug, Clone)]
pub struct NewStanding {
    /// Its id; `None` makes one up (`SA-` + a UUID).
    pub id: Option<String>,
    /// The tenant it belongs to (only calls of this tenant see it).
    pub tenant: String,
    /// The party that holds it: the person the agent's calls are made for.
    pub party: String,
    /// The one tool it covers.
    pub tool: String,
    /// What must hold for it to cover a call; all of them.
    pub conditions: Vec<AuthorizationCondition>,
    /// Unix ms; from this instant on it covers nothing.
    pub expires_at: i64,
    /// Why (recorded).
    pub reason: String,
    /// Who grants it (recorded).
    pub granted_by: String,
}

/// A stored standing authorization.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Standing {
    /// Id.
    pub id: String,
    /// Tenant.
    pub tenant: String,
    /// The party that holds it.
    pub party: String,
    /// The tool it covers.
    pub tool: String,
    /// Its conditions; `None` when the stored text does not parse (then it covers nothing).
    pub conditions: Option<Vec<AuthorizationCondition>>,
    /// Unix ms.
    pub expires_at: i64,
    /// Why it was granted.
    pub reason: String,
    /// Who granted it.
    pub granted_by: String,
    /// Unix ms.
    pub granted_at: i64,
    /// Unix ms, if revoked.
    pub revoked_at: Option<i64>,
    /// Who revoked it.
    pub revoked_by: Option<String>,
    /// Why it was revoked.
    pub revoke_reason: Option<String>,
}

/// What [`Store::call_context`] reads for a call as it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct CallContext {
    /// The run's status now.
    pub run_status: RunStatus,
    /// Whether the switch asked about (the emergency stop) is set.
    pub switch_set: bool,
    /// The party the agent's calls are made for, when it is bound to one.
    pub party: Option<String>,
    /// The grants that party (or the agent itself, unbound) holds now.
    pub grants: Vec<StandingAuthorization>,
}

/// Where a grant stands at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandingState {
    /// It may cover calls.
    Active,
    /// Past its expiry.
    Expired,
    /// Revoked.
    Revoked,
    /// Its stored conditions do not parse: it covers nothing.
    Unreadable,
}

impl StandingState {
    /// Lowercase text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Expired => "expired",
            Self::Revoked => "revoked",
            Self::Unreadable => "unreadable",
        }
    }
}

impl Standing {
    /// Its state at `now_ms`.
    pub fn state(&self, now_ms: i64) -> StandingState {
        if self.revoked_at.is_some() {
            StandingState::Revoked
        } else if self.conditions.is_none() {
            StandingState::Unreadable
        } else if now_ms >= self.expires_at {
            StandingState::Expired
        } else {
            StandingState::Active
        }
    }

    /// The grant as the policy engine reads it; `None` when its conditions do not parse or
    /// its expiry is not a representable instant.
    pub fn to_policy(&self) -> Option<StandingAuthorization> {
        Some(StandingAuthorization {
            id: self.id.clone(),
            principal: self.party.clone(),
            tool: self.tool.clone(),
            conditions: self.conditions.clone()?,
            expires_at: chrono::DateTime::from_timestamp_millis(self.expires_at)?,
        })
    }
}

/// Why a grant or revocation was refused.
#[derive(Debug, thiserror::Error)]
pub enum StandingError {
    /// A field is empty, the expiry is not in the future, or the id is taken.
    #[error("{0}")]
    Invalid(String),
    /// No grant has that id.
    #[error("no standing authorization {0}")]
    NotFound(String),
    /// It was revoked already.
    #[error("standing authorization {0} is already revoked")]
    AlreadyRevoked(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

type Row = (
    String,
    String,
    String,
    String,
    String,
    i64,
    String,
    String,
    i64,
    Option<i64>,
    Option<String>,
    Option<String>,
);

const COLUMNS: &str = "id, tenant, party, tool, conditions, expires_at, reason, granted_by, \
                       granted_at, revoked_at, revoked_by, revoke_reason";

fn from_row(r: Row) -> Standing {
    Standing {
        id: r.0,
        tenant: r.1,
        party: r.2,
        tool: r.3,
        conditions: serde_json::from_str(&r.4).ok(),
        expires_at: r.5,
        reason: r.6,
        granted_by: r.7,
        granted_at: r.8,
        revoked_at: r.9,
        revoked_by: r.10,
        revoke_reason: r.11,
    }
}

/// One row of a call's context query: the run's status (NULL: no such run), whether the
/// switch is set, the bound party, then one grant's columns (all NULL when none joined).
pub(crate) type ContextRow = (
    Option<String>,
    bool,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<String>,
);

/// The [`CallContext`] of a context query's rows; `None` when the run does not exist. Grants
/// are filtered in code exactly as [`Store::standing_for`] filters them (tenant, the party held
/// by — the bound party, else the agent itself —, live at `now_ms`, readable conditions).
pub(crate) fn context_from_rows(
    run_id: &str,
    rows: Vec<ContextRow>,
    tenant: &str,
    agent_id: &str,
    now_ms: i64,
) -> Result<Option<CallContext>, StoreError> {
    let Some((Some(status), switch_set, party)) =
        rows.first().map(|r| (r.0.clone(), r.1, r.2.clone()))
    else {
        return Ok(None);
    };
    let run_status = RunStatus::parse(&status)
        .ok_or_else(|| StoreError::Conflict(format!("run {run_id}: unknown status {status}")))?;
    let held_by = party.clone().unwrap_or_else(|| agent_id.to_string());
    let mut grants = Vec::new();
    for r in rows {
        // A run with no grants joins one row of NULLs.
        let (
            Some(id),
            Some(g_tenant),
            Some(g_party),
            Some(tool),
            Some(conditions),
            Some(expires_at),
            Some(reason),
            Some(granted_by),
            Some(granted_at),
        ) = (r.3, r.4, r.5, r.6, r.7, r.8, r.9, r.10, r.11)
        else {
            continue;
        };
        grants.push(from_row((
            id, g_tenant, g_party, tool, conditions, expires_at, reason, granted_by, granted_at,
            r.12, r.13, r.14,
        )));
    }
    let grants = grants
        .into_iter()
        // INVARIANT: re-checked in code, whatever the query matched.
        .filter(|s| s.tenant == tenant && s.party == held_by)
        .filter(|s| s.state(now_ms) == StandingState::Active)
        .filter_map(|s| s.to_policy())
        .collect();
    Ok(Some(CallContext {
        run_status,
        switch_set,
        party,
        grants,
    }))
}

/// The select list and joins of a call's context query, shared by [`Store::call_context`] and
/// the credential check that fetches it with the authentication: `$2` run, `$3` switch, `$4`
/// agent id, `$5` now; `{tenant}` filled in per use. The party is the credential's own
/// `acts_for` (an operator's binding), read only when the credential is of the tenant.
pub(crate) const CONTEXT_CTE: &str = "p AS (SELECT acts_for AS party FROM agent_credentials
       WHERE id = {agent} AND tenant = {tenant} AND acts_for IS NOT NULL)";
// Aliased: the credential check selects the credential's own columns beside these.
pub(crate) const CONTEXT_COLUMNS: &str = "r.status AS run_status,
       {switch_set} AS switch_set,
       (SELECT party FROM p) AS bound_party,
       s.id AS g_id, s.tenant AS g_tenant, s.party AS g_party, s.tool AS g_tool,
       s.conditions AS g_conditions, s.expires_at AS g_expires_at, s.reason AS g_reason,
       s.granted_by AS g_granted_by, s.granted_at AS g_granted_at,
       s.revoked_at AS g_revoked_at, s.revoked_by AS g_revoked_by,
       s.revoke_reason AS g_revoke_reason";
pub(crate) const CONTEXT_GRANTS_JOIN: &str = "LEFT JOIN standing_authorizations s
         ON s.tenant = {tenant} AND s.party = COALESCE((SELECT party FROM p), {agent})
        AND s.revoked_at IS NULL AND s.expires_at > {now}";

/// Where a context query (built from the `CONTEXT_*` pieces) takes each value: a parameter
/// (`"$3"`) or a subquery.
pub(crate) struct ContextSql {
    pub(crate) tenant: &'static str,
    pub(crate) switch: &'static str,
    pub(crate) agent: &'static str,
    pub(crate) now: &'static str,
}

impl ContextSql {
    /// The numbering [`Store::call_context`] and the credential check share: switch `$3`,
    /// agent `$4`, now `$5`; the tenant as given.
    pub(crate) fn numbered(tenant: &'static str) -> Self {
        Self {
            tenant,
            switch: "$3",
            agent: "$4",
            now: "$5",
        }
    }

    /// `sql` with the pieces' placeholders filled.
    pub(crate) fn fill(&self, sql: &str) -> String {
        sql.replace(
            "{switch_set}",
            &super::stops::switch_set_sql(self.switch, self.tenant),
        )
        .replace("{tenant}", self.tenant)
        .replace("{switch}", self.switch)
        .replace("{agent}", self.agent)
        .replace("{now}", self.now)
    }
}

fn record(
    rule: &str,
    actor: &str,
    s: &Standing,
    extra: &[(&str, Value)],
) -> Result<NewAuditRecord, StoreError> {
    let mut detail = Map::new();
    detail.insert("kind".into(), json!("standing_authorization"));
    detail.insert("id".into(), json!(s.id));
    detail.insert("tenant".into(), json!(s.tenant));
    detail.insert("party".into(), json!(s.party));
    detail.insert(
        "conditions".into(),
        serde_json::to_value(&s.conditions).map_err(|e| StoreError::Conflict(e.to_string()))?,
    );
    detail.insert("expires_at".into(), json!(s.expires_at));
    for (k, v) in extra {
        detail.insert((*k).to_string(), v.clone());
    }
    Ok(NewAuditRecord {
        event: Some(AuditEvent::Operational),
        run_id: None,
        step_id: None,
        tool: Some(s.tool.clone()),
        actor: Some(actor.to_string()),
        rule: Some(rule.to_string()),
        detail,
        tenant: Some(s.tenant.clone()),
    })
}

/// Runs `$query` (one row's INSERT or UPDATE) and, when it touched exactly one row, appends
/// `$audit` in the same transaction: the chain's lock first (lock order), then the row.
/// Evaluates to `true` when written; `false` (rolled back) when the row was not touched.
macro_rules! write_audited {
    ($store:expr, $audit:expr, $now:expr, $query:expr) => {{ write_audited!($store, $audit, AuditEvent::Operational, $now, $query) }};
    ($store:expr, $audit:expr, $event:expr, $now:expr, $query:expr) => {{
        let chain = $store.chain_for(&[&$audit]).await?;
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr) => {{
                let mut tx = $pool.begin_with($begin).await.map_err(StoreError::from)?;
                let mut head: Option<crate::audit::ChainHead> = None;
                // The chain's head first (lock order), then the row.
                let held: Result<(), StoreError> = async {
                    crate::store::audit_append::hold_head!(&mut *tx, $lock, &mut head, &chain);
                    Ok(())
                }
                .await;
                held?;
                let n = $query
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::from)?
                    .rows_affected();
                if n != 1 {
                    tx.rollback().await.map_err(StoreError::from)?;
                    false
                } else {
                    let appended: Result<(), StoreError> = async {
                        let h = crate::store::audit_append::hold_head!(
                            &mut *tx, $lock, &mut head, &chain
                        );
                        let sealed =
                            crate::store::audit_append::seal_next!(h, &$audit, $event, $now);
                        crate::store::audit_append::InsertRecords::insert_records(
                            &mut *tx,
                            std::slice::from_ref(&sealed),
                        )
                        .await?;
                        Ok(())
                    }
                    .await;
                    appended?;
                    tx.commit().await.map_err(StoreError::from)?;
                    true
                }
            }};
        }
        match &$store.pool {
            Pool::Sqlite(p) => run_in!(p, "BEGIN IMMEDIATE", false),
            Pool::Postgres(p) => run_in!(p, "BEGIN", true),
        }
    }};
}

pub(crate) use write_audited;

impl Store {
    /// Grants a standing authorization (refused if a field is empty, it expires at or before
    /// now, or its id is taken), with its audit record in the same transaction.
    pub async fn grant_standing(&self, new: &NewStanding) -> Result<Standing, StandingError> {
        match self.insert_standing(new).await? {
            Some(s) => Ok(s),
            None => Err(StandingError::Invalid(format!(
                "a standing authorization with id {:?} exists",
                new.id.as_deref().unwrap_or_default()
            ))),
        }
    }

    /// Grants `new` unless a grant with its id exists (revoked or not): for seeding demo
    /// data. Returns whether it was inserted (and audited).
    pub async fn seed_standing(&self, new: &NewStanding) -> Result<bool, StandingError> {
        Ok(self.insert_standing(new).await?.is_some())
    }

    async fn insert_standing(&self, new: &NewStanding) -> Result<Option<Standing>, StandingError> {
        for (field, value) in [
            ("tenant", &new.tenant),
            ("party", &new.party),
            ("tool", &new.tool),
            ("reason", &new.reason),
            ("granted_by", &new.granted_by),
        ] {
            if value.trim().is_empty() {
                return Err(StandingError::Invalid(format!("{field} must not be empty")));
            }
        }
        let now = self.clock.now_ms();
        if new.expires_at <= now {
            return Err(StandingError::Invalid(
                "a standing authorization must expire in the future".into(),
            ));
        }
        let id = match &new.id {
            Some(id) if id.trim().is_empty() => {
                return Err(StandingError::Invalid("id must not be empty".into()));
            }
            Some(id) => id.clone(),
            None => format!("SA-{}", Uuid::new_v4()),
        };
        let conditions = serde_json::to_string(&new.conditions)
            .map_err(|e| StandingError::Invalid(e.to_string()))?;
        let stored = Standing {
            id,
            tenant: new.tenant.clone(),
            party: new.party.clone(),
            tool: new.tool.clone(),
            conditions: Some(new.conditions.clone()),
            expires_at: new.expires_at,
            reason: new.reason.clone(),
            granted_by: new.granted_by.clone(),
            granted_at: now,
            revoked_at: None,
            revoked_by: None,
            revoke_reason: None,
        };
        let audit = record(
            GRANTED_RULE,
            &new.granted_by,
            &stored,
            &[("reason", json!(new.reason))],
        )?;
        let inserted = write_audited!(
            self,
            audit,
            now,
            sqlx::query(
                "INSERT INTO standing_authorizations
                       (id, tenant, party, tool, conditions, expires_at, reason, granted_by,
                        granted_at, revoked_at, revoked_by, revoke_reason)
                     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, NULL, NULL, NULL
                      WHERE NOT EXISTS (SELECT 1 FROM standing_authorizations WHERE id = $1)
                     ON CONFLICT DO NOTHING",
            )
            .bind(&stored.id)
            .bind(&stored.tenant)
            .bind(&stored.party)
            .bind(&stored.tool)
            .bind(&conditions)
            .bind(stored.expires_at)
            .bind(&stored.reason)
            .bind(&stored.granted_by)
            .bind(now)
        );
        Ok(inserted.then_some(stored))
    }

    /// Revokes grant `id` (of `tenant`, when given: an id two tenants hold needs it) as `by`,
    /// with its audit record in the same transaction. From then on it covers nothing.
    pub async fn revoke_standing(
        &self,
        id: &str,
        tenant: Option<&str>,
        by: &str,
        reason: &str,
    ) -> Result<Standing, StandingError> {
        if by.trim().is_empty() || reason.trim().is_empty() {
            return Err(StandingError::Invalid(
                "a revocation needs who and why".into(),
            ));
        }
        let Some(current) = self.find_standing(id, tenant).await? else {
            return Err(StandingError::NotFound(id.to_string()));
        };
        if current.revoked_at.is_some() {
            return Err(StandingError::AlreadyRevoked(id.to_string()));
        }
        let now = self.clock.now_ms();
        let audit = record(
            REVOKED_RULE,
            by,
            &current,
            &[
                ("reason", json!(reason)),
                ("granted_by", json!(current.granted_by)),
            ],
        )?;
        let revoked = write_audited!(
            self,
            audit,
            now,
            sqlx::query(
                "UPDATE standing_authorizations
                        SET revoked_at = $1, revoked_by = $2, revoke_reason = $3
                      WHERE tenant = $5 AND id = $4 AND revoked_at IS NULL",
            )
            .bind(now)
            .bind(by)
            .bind(reason)
            .bind(id)
            .bind(&current.tenant)
        );
        if !revoked {
            // Revoked by someone else in between.
            return Err(StandingError::AlreadyRevoked(id.to_string()));
        }
        self.find_standing(id, Some(&current.tenant))
            .await?
            .ok_or_else(|| StandingError::NotFound(id.to_string()))
    }

    /// Grant `id`, whatever its state. A grant's id is free when granted in any tenant, but
    /// the database keys grants by (tenant, id): should two tenants ever hold one id (two
    /// grants racing for it), the id names neither and is refused as ambiguous.
    pub async fn get_standing(&self, id: &str) -> Result<Option<Standing>, StoreError> {
        self.find_standing(id, None).await
    }

    /// Grant `id` of `tenant`, or of any tenant (`None`; ambiguous if two hold it).
    async fn find_standing(
        &self,
        id: &str,
        tenant: Option<&str>,
    ) -> Result<Option<Standing>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM standing_authorizations
              WHERE id = $1 AND ($2 IS NULL OR tenant = $2) LIMIT 2"
        );
        let rows: Vec<Row> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(id)
                .bind(tenant)
                .fetch_all(p)
                .await?
        });
        let row = super::at_most_one(rows, || {
            format!("standing authorization {id:?} exists in several tenants: name the tenant")
        })?;
        Ok(row.map(from_row))
    }

    /// Every grant (of `tenant`, if given), in any state, oldest first.
    pub async fn list_standing(&self, tenant: Option<&str>) -> Result<Vec<Standing>, StoreError> {
        let rows: Vec<Row> = match tenant {
            Some(t) => {
                let sql = format!(
                    "SELECT {COLUMNS} FROM standing_authorizations WHERE tenant = $1 \
                     ORDER BY granted_at, id"
                );
                on_pool!(self, |p| {
                    sqlx::query_as(&sql).bind(t).fetch_all(p).await?
                })
            }
            None => {
                let sql = format!(
                    "SELECT {COLUMNS} FROM standing_authorizations ORDER BY granted_at, id"
                );
                on_pool!(self, |p| sqlx::query_as(&sql).fetch_all(p).await?)
            }
        };
        Ok(rows.into_iter().map(from_row).collect())
    }

    /// What a call must know of the world as it starts, read in ONE statement: the run's
    /// status, whether switch `switch` is set, the party `agent_id`'s calls are made for (the
    /// credential's `acts_for`, when it is of `tenant`) and the
    /// grants that party — or, with no binding, the agent itself — holds at `now_ms`, filtered
    /// exactly as [`Store::standing_for`] filters them (see the module's invariants).
    /// [`StoreError::NotFound`] when the run does not exist.
    pub async fn call_context(
        &self,
        run_id: &str,
        switch: &str,
        tenant: &str,
        agent_id: &str,
        now_ms: i64,
    ) -> Result<CallContext, StoreError> {
        // A credential of another tenant binds nothing (the `tenant` condition).
        let sql = ContextSql::numbered("$1").fill(&format!(
            "WITH {CONTEXT_CTE} SELECT {CONTEXT_COLUMNS} FROM runs r {CONTEXT_GRANTS_JOIN}
              WHERE r.id = $2 ORDER BY s.granted_at, s.id"
        ));
        let rows: Vec<ContextRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(tenant)
                .bind(run_id)
                .bind(switch)
                .bind(agent_id)
                .bind(now_ms)
                .fetch_all(p)
                .await?
        });
        context_from_rows(run_id, rows, tenant, agent_id, now_ms)?.ok_or(StoreError::NotFound)
    }

    /// The grants `party` of `tenant` holds at `now_ms`, as the policy engine reads them:
    /// not revoked, not expired, conditions readable (see the module's invariants).
    pub async fn standing_for(
        &self,
        tenant: &str,
        party: &str,
        now_ms: i64,
    ) -> Result<Vec<StandingAuthorization>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM standing_authorizations
              WHERE tenant = $1 AND party = $2 AND revoked_at IS NULL AND expires_at > $3
              ORDER BY granted_at, id"
        );
        let rows: Vec<Row> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(tenant)
                .bind(party)
                .bind(now_ms)
                .fetch_all(p)
                .await?
        });
        Ok(rows
            .into_iter()
            .map(from_row)
            // INVARIANT: re-checked in code, whatever the query matched.
            .filter(|s| s.tenant == tenant && s.party == party)
            .filter(|s| s.state(now_ms) == StandingState::Active)
            .filter_map(|s| s.to_policy())
            .collect())
    }
}
