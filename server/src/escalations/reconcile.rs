//! What reconciliation does about escalations: opens one for an `unknown` it cannot settle,
//! closes it when the target answers after all.

use countersign_core::store::{EscalationKind, Resolution, Step};
use countersign_core::{StepStatus, StoreError};
use serde_json::{Map, json};

use crate::AppState;

/// Opens an `unknown` escalation for `step` when reconciliation could not settle it and it
/// has been `unknown` since before `before` (Unix ms). Cheap when one is open already.
pub async fn escalate_unknown(
    state: &AppState,
    step: &Step,
    before: i64,
) -> Result<(), StoreError> {
    if step.status != StepStatus::Unknown || step.updated_at >= before {
        return Ok(());
    }
    if state
        .store
        .open_escalation_of_step(&step.id, EscalationKind::Unknown)
        .await?
        .is_some()
    {
        return Ok(());
    }
    let why = "the call's outcome is unknown and the target cannot tell reconciliation whether \
               it happened; a person settles it with the target's reference";
    if state
        .store
        .open_escalation(step, EscalationKind::Unknown, why, "reconciler")
        .await?
        .is_some()
    {
        crate::notify::unknown_escalated(state, step);
    }
    Ok(())
}

/// Closes the open `unknown` escalation of `step`, which reconciliation settled.
pub async fn reconciled(state: &AppState, step: &Step) -> Result<(), StoreError> {
    if let Some(esc) = state
        .store
        .open_escalation_of_step(&step.id, EscalationKind::Unknown)
        .await?
    {
        let mut detail = Map::new();
        detail.insert("step_status".into(), json!(step.status.as_str()));
        state
            .store
            .close_escalation(
                &esc,
                "reconciler",
                Resolution::Reconciled,
                "the target answered reconciliation",
                detail,
            )
            .await?;
    }
    Ok(())
}
