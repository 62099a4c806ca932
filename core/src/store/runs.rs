//! Runs: one row per agent task. Steps, approvals and audit records hang off a run.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Store, StoreError, on_pool};

/// The lifecycle of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Steps may still be proposed or executed.
    Active,
    /// Every step reached a final state successfully.
    Done,
    /// A step failed and the run stopped.
    Failed,
    /// Cancelled by its agent or a person.
    Cancelled,
    /// Halted by the emergency stop.
    Stopped,
}

impl RunStatus {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Stopped => "stopped",
        }
    }

    /// Parses the stored text.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "active" => Self::Active,
            "done" => Self::Done,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            "stopped" => Self::Stopped,
            _ => return None,
        })
    }
}

/// What is needed to open a run.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// The tenant every step of the run is confined to.
    pub tenant: String,
    /// Who the run acts for (never its approver).
    pub principal: String,
    /// The agent credential that opened it, if an agent did.
    pub agent_id: Option<String>,
    /// The task, as the agent or person stated it.
    pub task: String,
    /// Where the task came from (`user`, `schedule`, `monitor`, `external`).
    pub origin: String,
    /// A plan the executor runs step by step (`plan.submit`), not an agent's direct calls.
    pub planned: bool,
}

/// A stored run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Run {
    /// Run id (UUID text).
    pub id: String,
    /// Tenant.
    pub tenant: String,
    /// Who the run acts for.
    pub principal: String,
    /// Opening agent credential.
    pub agent_id: Option<String>,
    /// Task text.
    pub task: String,
    /// Lifecycle status.
    pub status: RunStatus,
    /// Set when a step failed closed on changed state and the plan must be redone.
    pub replan: bool,
    /// Where the task came from (`user`, `schedule`, `monitor`, `external`).
    pub origin: String,
    /// Executed by the executor workers, step by step.
    pub planned: bool,
    /// Why it stopped, if it did.
    pub reason: String,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
}

#[derive(sqlx::FromRow)]
pub(super) struct RunRow {
    id: String,
    tenant: String,
    principal: String,
    agent_id: Option<String>,
    task: String,
    status: String,
    replan: bool,
    origin: String,
    planned: bool,
    reason: String,
    created_at: i64,
    updated_at: i64,
}

impl TryFrom<RunRow> for Run {
    type Error = StoreError;
    fn try_from(r: RunRow) -> Result<Self, StoreError> {
        let status = RunStatus::parse(&r.status)
            .ok_or_else(|| StoreError::Conflict(format!("unknown run status {:?}", r.status)))?;
        Ok(Run {
            id: r.id,
            tenant: r.tenant,
            principal: r.principal,
            agent_id: r.agent_id,
            task: r.task,
            status,
            replan: r.replan,
            origin: r.origin,
            planned: r.planned,
            reason: r.reason,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

pub(super) const RUN_COLUMNS: &str = "id, tenant, principal, agent_id, task, status, replan, origin, planned, reason, created_at, updated_at";

impl Store {
    /// Opens a new active run.
    pub async fn create_run(&self, new: &NewRun) -> Result<Run, StoreError> {
        let id = Uuid::new_v4().to_string();
        let now = self.clock.now_ms();
        on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO runs (id, tenant, principal, agent_id, task, status, replan, origin, created_at, updated_at, planned)
                 VALUES ($1, $2, $3, $4, $5, $6, FALSE, $7, $8, $8, $9)",
            )
            .bind(&id)
            .bind(&new.tenant)
            .bind(&new.principal)
            .bind(&new.agent_id)
            .bind(&new.task)
            .bind(RunStatus::Active.as_str())
            .bind(&new.origin)
            .bind(now)
            .bind(new.planned)
            .execute(p)
            .await?
            .rows_affected()
        });
        self.get_run(&id).await
    }

    /// The run opened for `session_key` (an agent's MCP session), opening it on first use.
    /// Racing first calls of one session get the same run. The mapping never changes once
    /// made, so it is remembered in memory: the run returned may carry a stale `status`,
    /// `replan`, `reason` and `updated_at` — callers that act on those re-read the run.
    pub async fn session_run(&self, session_key: &str, new: &NewRun) -> Result<Run, StoreError> {
        if let Some(run) = self.session_runs.get(session_key) {
            return Ok(run);
        }
        let run = self.session_run_from_db(session_key, new).await?;
        self.session_runs.put(session_key, &run);
        Ok(run)
    }

    async fn session_run_from_db(
        &self,
        session_key: &str,
        new: &NewRun,
    ) -> Result<Run, StoreError> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE session_key = $1");
        let existing: Option<RunRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(session_key)
                .fetch_optional(p)
                .await?
        });
        if let Some(row) = existing {
            return row.try_into();
        }
        let id = Uuid::new_v4().to_string();
        let now = self.clock.now_ms();
        on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO runs (id, tenant, principal, agent_id, task, status, replan, origin, created_at, updated_at, session_key)
                 VALUES ($1, $2, $3, $4, $5, $6, FALSE, $7, $8, $8, $9)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&id)
            .bind(&new.tenant)
            .bind(&new.principal)
            .bind(&new.agent_id)
            .bind(&new.task)
            .bind(RunStatus::Active.as_str())
            .bind(&new.origin)
            .bind(now)
            .bind(session_key)
            .execute(p)
            .await?
            .rows_affected()
        });
        let row: RunRow = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(session_key).fetch_one(p).await?
        });
        row.try_into()
    }

    /// A run's current status and whether switch `name` is set (for every tenant or for the
    /// run's), in one round trip.
    pub async fn run_status_and_switch(
        &self,
        run_id: &str,
        name: &str,
    ) -> Result<(RunStatus, bool), StoreError> {
        let sql = format!(
            "SELECT status, {} FROM runs WHERE id = $1",
            super::stops::switch_set_sql("$2", "runs.tenant")
        );
        let (status, set): (String, bool) = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(run_id)
                .bind(name)
                .fetch_one(p)
                .await?
        });
        let status = RunStatus::parse(&status).ok_or_else(|| {
            StoreError::Conflict(format!("run {run_id}: unknown status {status}"))
        })?;
        Ok((status, set))
    }

    /// Reads one run.
    pub async fn get_run(&self, id: &str) -> Result<Run, StoreError> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1");
        let row: RunRow = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(id).fetch_one(p).await?
        });
        row.try_into()
    }

    /// The newest runs of a tenant, newest first.
    pub async fn list_runs(&self, tenant: &str, limit: i64) -> Result<Vec<Run>, StoreError> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE tenant = $1 ORDER BY created_at DESC, id LIMIT $2"
        );
        let rows: Vec<RunRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(tenant)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        rows.into_iter().map(Run::try_from).collect()
    }

    /// Moves an active run to `status` with `reason`; `false` if it was not active.
    pub async fn finish_run(
        &self,
        id: &str,
        status: RunStatus,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now_ms();
        let n = on_pool!(self, |p| {
            sqlx::query(
                "UPDATE runs SET status = $1, reason = $2, updated_at = $3
                 WHERE id = $4 AND status = 'active'",
            )
            .bind(status.as_str())
            .bind(reason)
            .bind(now)
            .bind(id)
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(n == 1)
    }

    /// Sets a process-wide switch (the emergency stop) to `value`, recording who set it.
    pub async fn set_switch(&self, name: &str, value: &str, by: &str) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO switches (name, value, set_by, set_at) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value,
                     set_by = excluded.set_by, set_at = excluded.set_at",
            )
            .bind(name)
            .bind(value)
            .bind(by)
            .bind(now)
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(())
    }

    /// Clears a switch.
    pub async fn clear_switch(&self, name: &str) -> Result<bool, StoreError> {
        let n = on_pool!(self, |p| {
            sqlx::query("DELETE FROM switches WHERE name = $1")
                .bind(name)
                .execute(p)
                .await?
                .rows_affected()
        });
        Ok(n == 1)
    }

    /// A switch's value, if set.
    pub async fn switch(&self, name: &str) -> Result<Option<String>, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar("SELECT value FROM switches WHERE name = $1")
                .bind(name)
                .fetch_optional(p)
                .await?
        }))
    }

    /// Flags a run for re-planning (a step failed closed on changed state or was rejected).
    pub async fn mark_replan(&self, id: &str) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        on_pool!(self, |p| {
            sqlx::query("UPDATE runs SET replan = TRUE, updated_at = $1 WHERE id = $2")
                .bind(now)
                .bind(id)
                .execute(p)
                .await?
                .rows_affected()
        });
        Ok(())
    }

    /// Runs in `status`, oldest first.
    pub async fn runs_in_status(&self, status: RunStatus) -> Result<Vec<Run>, StoreError> {
        let sql =
            format!("SELECT {RUN_COLUMNS} FROM runs WHERE status = $1 ORDER BY created_at, id");
        let rows: Vec<RunRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(status.as_str())
                .fetch_all(p)
                .await?
        });
        rows.into_iter().map(Run::try_from).collect()
    }

    /// Moves a run to `status`.
    pub async fn set_run_status(&self, id: &str, status: RunStatus) -> Result<Run, StoreError> {
        let now = self.clock.now_ms();
        let n = on_pool!(self, |p| {
            sqlx::query("UPDATE runs SET status = $1, updated_at = $2 WHERE id = $3")
                .bind(status.as_str())
                .bind(now)
                .bind(id)
                .execute(p)
                .await?
                .rows_affected()
        });
        if n == 0 {
            return Err(StoreError::NotFound);
        }
        self.get_run(id).await
    }
}

/// The remembered session → run mappings of [`Store::session_run`] (a session key names at
/// most one run for ever, so an entry is never wrong, only possibly stale in its mutable
/// fields). Bounded: past [`SessionRuns::MAX`] entries it starts afresh.
#[derive(Clone, Default)]
pub(crate) struct SessionRuns(
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Run>>>,
);

impl SessionRuns {
    const MAX: usize = 50_000;

    fn get(&self, key: &str) -> Option<Run> {
        self.0.lock().ok()?.get(key).cloned()
    }

    fn put(&self, key: &str, run: &Run) {
        if let Ok(mut map) = self.0.lock() {
            if map.len() >= Self::MAX {
                map.clear();
            }
            map.insert(key.to_string(), run.clone());
        }
    }
}

/// [`Store::call_hint`]: which agent and run an MCP session's calls were last seen to be,
/// keyed by what the `/mcp` guard can compute before it authenticates. Bounded like
/// [`SessionRuns`]. A hint only chooses what is read with the authentication; it grants
/// nothing (the read context is used only when the credential and the run it resolves match).
#[derive(Clone, Default)]
pub(crate) struct CallHints(
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, (String, String)>>>,
);

impl CallHints {
    const MAX: usize = 50_000;
}

impl Store {
    /// The `(agent id, run id)` remembered for `key` ([`Store::remember_call_hint`]).
    pub fn call_hint(&self, key: &str) -> Option<(String, String)> {
        self.call_hints.0.lock().ok()?.get(key).cloned()
    }

    /// Remembers that calls under `key` were `agent_id`'s, in run `run_id`.
    pub fn remember_call_hint(&self, key: &str, agent_id: &str, run_id: &str) {
        if let Ok(mut map) = self.call_hints.0.lock() {
            if map.len() >= CallHints::MAX {
                map.clear();
            }
            map.insert(key.to_string(), (agent_id.to_string(), run_id.to_string()));
        }
    }
}
