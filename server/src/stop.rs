//! The emergency stop, for every tenant (a platform admin's, the operator's CLI) or for one
//! tenant (its admin's).
//!
//! Invariants:
//! * The switch is set before any run is stopped, so no step of a covered run starts once
//!   the stop returns: every claim, transition and call context reads the switch for every
//!   tenant and for the run's own (`countersign_core::store::StopScope`, `stops.rs`).
//! * A tenant's stop touches only that tenant's runs and credentials.
//! * Lifting never restores a credential implicitly: only when asked, each one audited
//!   (`agent.restored`), and only what this stop itself revoked.

use countersign_core::StoreError;
use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::store::{RunStatus, StopScope};
use serde_json::{Map, json};

use crate::AppState;
use crate::pipeline;

pub use crate::pipeline::EMERGENCY_STOP;

/// Turns the emergency stop on for `scope` (every tenant, or one): no step of a run it covers
/// that has not started will start; every active run it covers stops (its pending and waiting
/// steps cancelled) and its agent's credential is revoked (recorded, so that lifting the stop
/// can restore it). Runs and credentials of other tenants are untouched. In-flight calls
/// finish or are reconciled. Returns the number of runs stopped.
pub async fn emergency_stop(
    state: &AppState,
    scope: &StopScope,
    by: &str,
    reason: &str,
) -> Result<usize, StoreError> {
    let store = &state.store;
    let switch = scope.switch(EMERGENCY_STOP);
    store.set_switch(&switch, reason, by).await?;
    let mut detail = Map::new();
    detail.insert("kind".into(), json!("emergency_stop"));
    detail.insert("reason".into(), json!(reason));
    detail.insert("scope".into(), scope_json(scope));
    store
        .append_audit(&NewAuditRecord {
            event: Some(AuditEvent::Operational),
            run_id: None,
            step_id: None,
            tool: None,
            actor: Some(by.to_string()),
            rule: Some(pipeline::STOP_RULE.into()),
            detail,
            tenant: scope_tenant(scope),
        })
        .await?;
    let runs: Vec<_> = store
        .runs_in_status(RunStatus::Active)
        .await?
        .into_iter()
        .filter(|r| scope.covers(&r.tenant))
        .collect();
    for run in &runs {
        crate::runs::cancel_run(state, &run.id, by, reason, RunStatus::Stopped).await?;
        if let Some(agent) = &run.agent_id {
            revoke_for_stop(state, &switch, agent, by).await?;
        }
    }
    Ok(runs.len())
}

/// Revokes `agent` for the stop of switch row `switch`, recording the revocation only when
/// this stop made it (the credential was live).
async fn revoke_for_stop(
    state: &AppState,
    switch: &str,
    agent: &str,
    by: &str,
) -> Result<(), StoreError> {
    let store = &state.store;
    let was_live = match store.get_agent(agent).await {
        Ok(cred) => cred.revoked_at.is_none(),
        Err(StoreError::NotFound) => return Ok(()),
        Err(e) => return Err(e),
    };
    let cred = store.revoke_agent(agent, by).await?;
    if was_live
        && cred.run_id.is_none()
        && let Some(at) = cred.revoked_at
    {
        store.record_stop_revocation(switch, &cred.id, at).await?;
    }
    Ok(())
}

/// The tenant whose audit chain a stop's record joins (none for a platform-wide stop).
fn scope_tenant(scope: &StopScope) -> Option<String> {
    match scope {
        StopScope::Platform => None,
        StopScope::Tenant(t) => Some(t.clone()),
    }
}

fn scope_json(scope: &StopScope) -> serde_json::Value {
    match scope {
        StopScope::Platform => json!("platform"),
        StopScope::Tenant(t) => json!({ "tenant": t }),
    }
}

/// What lifting a stop did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lifted {
    /// Whether the stop was on.
    pub was_on: bool,
    /// The credentials restored (only when asked to).
    pub restored: Vec<String>,
    /// The credentials the stop revoked that stay revoked: not asked to restore, or no longer
    /// restorable (expired, revoked otherwise, name taken).
    pub left_revoked: Vec<String>,
}

/// Lifts the emergency stop of `scope` (audited): steps of runs it covered may execute again
/// (a platform-wide stop still holds every tenant while it is on). With `restore`, the
/// credentials this stop revoked are restored, each with its own audit record; without, they
/// stay revoked. Either way the stop's list of revocations is then forgotten.
pub async fn lift_emergency_stop(
    state: &AppState,
    scope: &StopScope,
    by: &str,
    reason: &str,
    restore: bool,
) -> Result<Lifted, StoreError> {
    let store = &state.store;
    let switch = scope.switch(EMERGENCY_STOP);
    // What this stop revoked, read before it ends: a new stop on the same switch afterwards
    // records its own revocations, which this lift neither restores nor forgets.
    let revoked = store.stop_revocations(&switch).await?;
    let was_on = store.clear_switch(&switch).await?;
    let mut lifted = Lifted {
        was_on,
        ..Lifted::default()
    };
    for id in revoked {
        if restore && store.restore_agent(&switch, &id, by).await? {
            lifted.restored.push(id.clone());
        } else {
            lifted.left_revoked.push(id.clone());
        }
        store.forget_stop_revocation(&switch, &id).await?;
    }
    let mut detail = Map::new();
    detail.insert("kind".into(), json!("emergency_stop_lifted"));
    detail.insert("reason".into(), json!(reason));
    detail.insert("was_on".into(), json!(was_on));
    detail.insert("scope".into(), scope_json(scope));
    detail.insert("restored".into(), json!(lifted.restored));
    detail.insert("left_revoked".into(), json!(lifted.left_revoked));
    store
        .append_audit(&NewAuditRecord {
            event: Some(AuditEvent::Operational),
            run_id: None,
            step_id: None,
            tool: None,
            actor: Some(by.to_string()),
            rule: Some(LIFT_RULE.into()),
            detail,
            tenant: scope_tenant(scope),
        })
        .await?;
    Ok(lifted)
}

/// The audit rule of lifting an emergency stop.
pub const LIFT_RULE: &str = "emergency.lift";
