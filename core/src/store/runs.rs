//! Runs: one row per agent task. Steps, approvals and audit records hang off a run.

use uuid::Uuid;

use super::run_model::{NewRun, RUN_COLUMNS, Run, RunRow, RunStatus};
use super::{Store, StoreError, on_pool};

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
        self.session_runs.put(session_key, run.clone());
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

impl Store {
    /// The `(agent id, run id)` remembered for `key` ([`Store::remember_call_hint`]).
    pub fn call_hint(&self, key: &str) -> Option<(String, String)> {
        self.call_hints.get(key)
    }

    /// Remembers that calls under `key` were `agent_id`'s, in run `run_id`.
    pub fn remember_call_hint(&self, key: &str, agent_id: &str, run_id: &str) {
        self.call_hints
            .put(key, (agent_id.to_string(), run_id.to_string()));
    }
}
