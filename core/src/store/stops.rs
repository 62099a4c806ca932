//! Switches (the emergency stop) for the whole platform or one tenant, and the credentials a
//! stop revoked, kept so that lifting it can restore them — explicitly, one audited record
//! each.
//!
//! Invariants:
//! * A switch is one row of `switches`: the bare name (`emergency_stop`) holds it for every
//!   tenant, `name:tenant` ([`tenant_switch`]) for that tenant only. Every check of a switch
//!   in SQL reads both rows through [`switch_set_sql`] with the tenant of the run or
//!   credential at hand; a tenant it cannot tell (NULL) sees only the platform row.
//! * A stop revocation is recorded only for a credential the stop itself revoked (it was live
//!   when the stop came), with the `revoked_at` the stop wrote. Restoring needs that exact
//!   `revoked_at` still in place, the credential unexpired and not an execution credential
//!   (its run ended with the stop), its name free among live credentials, and no stop still
//!   covering it (the platform's or its tenant's): anything else is left revoked and
//!   reported, never forced. Revoking such a credential again by hand forgets its stop
//!   revocations: a person's revocation is never undone by a lift.

use super::{Store, StoreError, on_pool};

/// The row of switch `name` that holds it for `tenant` only.
pub fn tenant_switch(name: &str, tenant: &str) -> String {
    format!("{name}:{tenant}")
}

/// SQL that is true while switch `name` is set for every tenant or for `tenant`; both are SQL
/// expressions (a parameter, a column, a subquery).
pub(crate) fn switch_set_sql(name: &str, tenant: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM switches
                  WHERE name = {name} OR name = CAST({name} AS TEXT) || ':' || {tenant})"
    )
}

/// Who a stop covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopScope {
    /// Every tenant (a platform admin's, or the operator's CLI).
    Platform,
    /// One tenant (its admin's).
    Tenant(String),
}

impl StopScope {
    /// The row of switch `name` this scope sets.
    pub fn switch(&self, name: &str) -> String {
        match self {
            Self::Platform => name.to_string(),
            Self::Tenant(t) => tenant_switch(name, t),
        }
    }

    /// Whether a run or credential of `tenant` falls under it.
    pub fn covers(&self, tenant: &str) -> bool {
        match self {
            Self::Platform => true,
            Self::Tenant(t) => t == tenant,
        }
    }
}

impl Store {
    /// Records that the stop held by switch row `switch` revoked credential `agent_id`, whose
    /// `revoked_at` it set to `revoked_at`.
    pub async fn record_stop_revocation(
        &self,
        switch: &str,
        agent_id: &str,
        revoked_at: i64,
    ) -> Result<(), StoreError> {
        on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO stop_revocations (tenant, switch, agent_id, revoked_at)
                 VALUES ((SELECT tenant FROM agent_credentials WHERE id = $2), $1, $2, $3)
                 ON CONFLICT (tenant, switch, agent_id)
                 DO UPDATE SET revoked_at = excluded.revoked_at",
            )
            .bind(switch)
            .bind(agent_id)
            .bind(revoked_at)
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(())
    }

    /// The ids of the credentials the stop of switch row `switch` revoked (recorded), oldest
    /// first.
    pub async fn stop_revocations(&self, switch: &str) -> Result<Vec<String>, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar(
                "SELECT agent_id FROM stop_revocations WHERE switch = $1
                  ORDER BY revoked_at, agent_id",
            )
            .bind(switch)
            .fetch_all(p)
            .await?
        }))
    }

    /// Forgets that the stop of switch row `switch` revoked `agent_id` (once it is lifted:
    /// restored or left revoked).
    pub async fn forget_stop_revocation(
        &self,
        switch: &str,
        agent_id: &str,
    ) -> Result<(), StoreError> {
        on_pool!(self, |p| {
            sqlx::query("DELETE FROM stop_revocations WHERE switch = $1 AND agent_id = $2")
                .bind(switch)
                .bind(agent_id)
                .execute(p)
                .await?
                .rows_affected()
        });
        Ok(())
    }

    /// Forgets every stop revocation of `agent_id` (a person revoked it for good); returns how
    /// many there were.
    pub async fn forget_agent_stop_revocations(&self, agent_id: &str) -> Result<u64, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query("DELETE FROM stop_revocations WHERE agent_id = $1")
                .bind(agent_id)
                .execute(p)
                .await?
                .rows_affected()
        }))
    }

    /// Every switch row set now: (row name, value, set by, set at).
    pub async fn switches(&self) -> Result<Vec<(String, String, String, i64)>, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as("SELECT name, value, set_by, set_at FROM switches ORDER BY name")
                .fetch_all(p)
                .await?
        }))
    }
}
