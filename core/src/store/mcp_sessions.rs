//! MCP sessions as rows, so that every replica serves every session (the server's
//! `mcp::sessions` keeps an in-process cache in front of them).
//!
//! Invariants:
//! * A session is read, touched and ended only within its tenant and only for the agent
//!   credential that opened it: every statement names both, so a session id guessed or
//!   copied by another agent reads as absent and cannot be ended.
//! * A session is live while it has not ended and was touched within the idle limit the
//!   caller passes; only live sessions are restored and counted against the per-agent cap.
//! * Ending is final, and so is idling out: a touch reopens neither.

use super::{Store, StoreError, on_pool};

impl Store {
    /// Records session `id`, opened now by agent credential `agent_id` of `tenant` with the
    /// client's `initialize` parameters `params` (JSON).
    pub async fn mcp_session_open(
        &self,
        tenant: &str,
        id: &str,
        agent_id: &str,
        params: &str,
    ) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO mcp_sessions (tenant, id, agent_id, params, opened_at, seen_at)
                 VALUES ($1, $2, $3, $4, $5, $5)",
            )
            .bind(tenant)
            .bind(id)
            .bind(agent_id)
            .bind(params)
            .bind(now)
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(())
    }

    /// Notes that a request touched session `id` of `tenant` now, if `agent_id` opened it
    /// and it is live (not ended, touched within `idle_ms`); returns its `initialize`
    /// parameters then, `None` otherwise (unknown, another agent's, ended or idle: it stays
    /// so).
    pub async fn mcp_session_touch(
        &self,
        tenant: &str,
        id: &str,
        agent_id: &str,
        idle_ms: i64,
    ) -> Result<Option<String>, StoreError> {
        let now = self.clock.now_ms();
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar(
                "UPDATE mcp_sessions SET seen_at = $4
                  WHERE tenant = $1 AND id = $2 AND agent_id = $3
                    AND ended_at IS NULL AND seen_at > $5
                 RETURNING params",
            )
            .bind(tenant)
            .bind(id)
            .bind(agent_id)
            .bind(now)
            .bind(now - idle_ms)
            .fetch_optional(p)
            .await?
        }))
    }

    /// Ends session `id` of `agent_id` in `tenant` now. Returns whether this call ended it
    /// (false: unknown, another agent's, or ended already).
    pub async fn mcp_session_end(
        &self,
        tenant: &str,
        id: &str,
        agent_id: &str,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now_ms();
        let n = on_pool!(self, |p| {
            sqlx::query(
                "UPDATE mcp_sessions SET ended_at = $4
                  WHERE tenant = $1 AND id = $2 AND agent_id = $3 AND ended_at IS NULL",
            )
            .bind(tenant)
            .bind(id)
            .bind(agent_id)
            .bind(now)
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(n == 1)
    }

    /// How many live sessions (not ended, touched within `idle_ms`) agent credential
    /// `agent_id` of `tenant` holds, on every replica.
    pub async fn mcp_sessions_live(
        &self,
        tenant: &str,
        agent_id: &str,
        idle_ms: i64,
    ) -> Result<usize, StoreError> {
        let since = self.clock.now_ms() - idle_ms;
        let n: i64 = on_pool!(self, |p| {
            sqlx::query_scalar(
                "SELECT COUNT(*) FROM mcp_sessions
                  WHERE tenant = $1 AND agent_id = $2 AND ended_at IS NULL AND seen_at > $3",
            )
            .bind(tenant)
            .bind(agent_id)
            .bind(since)
            .fetch_one(p)
            .await?
        });
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// The sessions that ended at or after `since` (ms), with when, oldest first: what each
    /// replica polls to close its copies of sessions ended elsewhere.
    pub async fn mcp_sessions_ended_since(
        &self,
        since: i64,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT id, ended_at FROM mcp_sessions
                  WHERE ended_at IS NOT NULL AND ended_at >= $1 ORDER BY ended_at",
            )
            .bind(since)
            .fetch_all(p)
            .await?
        }))
    }

    /// Deletes the rows of sessions untouched since `before` (ms), ended or not: they can no
    /// longer be restored nor counted. Returns how many.
    pub async fn mcp_sessions_forget(&self, before: i64) -> Result<u64, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query("DELETE FROM mcp_sessions WHERE seen_at < $1")
                .bind(before)
                .execute(p)
                .await?
                .rows_affected()
        }))
    }
}
