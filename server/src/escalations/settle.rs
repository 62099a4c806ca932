//! Settling an `unknown`: one person, or two agreeing people for an irreversible tool (see
//! the invariants in [`super`]).

use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::store::{
    Escalation, KeyState, Resolution, RunStatus, SETTLED_RULE, SettleOutcome, Step, Transition,
};
use countersign_core::{Person, StepStatus, StoreError};
use serde_json::{Map, json};

use super::access::{ActError, Acted, Action, MAX_REFERENCE_LEN, two_people};
use super::reconcile::reconciled;
use crate::AppState;
use crate::compensation::{fail_run, left_after_end};

/// Settles an unknown (see the module doc: one or two people).
pub(super) async fn settle(
    state: &AppState,
    person: &Person,
    esc: &Escalation,
    step: &Step,
    action: &Action,
    reason: &str,
) -> Result<Acted, ActError> {
    let (outcome, reference) = match action {
        Action::Happened(r) => {
            let r = r.trim();
            if r.is_empty() || r.chars().count() > MAX_REFERENCE_LEN {
                return Err(ActError::NoReference);
            }
            ("happened", r.to_string())
        }
        _ => ("not_happened", String::new()),
    };
    let me = person.actor();
    let mut confirmed_by = None;
    if two_people(step) {
        match &esc.first_by {
            None => {
                return if state
                    .store
                    .record_first_settlement(esc, &me, outcome, &reference, reason)
                    .await?
                {
                    Ok(Acted::FirstRecorded)
                } else {
                    Err(ActError::Raced)
                };
            }
            Some(first) if *first == me => return Err(ActError::SameSettler),
            Some(first) => {
                if esc.first_outcome.as_deref() != Some(outcome)
                    || esc.first_reference.as_deref().unwrap_or("") != reference
                {
                    return if state
                        .store
                        .withdraw_first_settlement(esc, first, &me, reason)
                        .await?
                    {
                        Err(ActError::Disagrees)
                    } else {
                        Err(ActError::Raced)
                    };
                }
                confirmed_by = Some(first.clone());
            }
        }
    }
    let t = settle_transition(esc, step, &me, outcome, &reference, reason, confirmed_by);
    let resolution = if outcome == "happened" {
        Resolution::Settled
    } else {
        Resolution::NotHappened
    };
    let to = t.to;
    match state
        .store
        .settle_escalated(esc, &t, &me, resolution, reason)
        .await?
    {
        SettleOutcome::Settled => {}
        SettleOutcome::StepMoved => {
            reconciled(state, step).await?;
            return Err(ActError::NotApplicable(
                "the step is no longer unknown: reconciliation settled it",
            ));
        }
        SettleOutcome::AlreadyClosed => return Err(ActError::Closed),
    }
    if let Some(to) = to {
        after_settled(state, step, to).await?;
    }
    state.store.clear_lease(&step.id).await?;
    Ok(Acted::Settled)
}

/// The settled step's transition out of `unknown`, with its audited record naming the people
/// and the reference.
fn settle_transition(
    esc: &Escalation,
    step: &Step,
    me: &str,
    outcome: &str,
    reference: &str,
    reason: &str,
    confirmed_by: Option<String>,
) -> Transition {
    let mut detail = Map::new();
    detail.insert("escalation_id".into(), json!(esc.id));
    detail.insert("outcome".into(), json!(outcome));
    detail.insert("reference".into(), json!(reference));
    detail.insert("reason".into(), json!(reason));
    detail.insert("idem_key".into(), json!(step.idem_key));
    detail.insert("was".into(), json!("unknown"));
    if let Some(first) = &confirmed_by {
        detail.insert("first_by".into(), json!(first));
    }
    let (to, key, stored) = if outcome == "happened" {
        let answer = json!({"settled_by": "people", "ref": reference});
        let stored = json!({"error": false, "answer": answer}).to_string();
        (StepStatus::Done, KeyState::Done, stored)
    } else {
        let answer = json!({"status": "failed", "step_id": step.id, "code": "escalation.not_happened",
            "message": "people confirmed the target never got the call", "retryable": false});
        let stored = json!({"error": true, "answer": answer}).to_string();
        (StepStatus::Failed, KeyState::Failed, stored)
    };
    Transition {
        step_id: step.id.clone(),
        from: vec![StepStatus::Unknown],
        to: Some(to),
        rule: Some(SETTLED_RULE.to_string()),
        outcome: Some(stored.clone()),
        key: Some((key, Some(stored))),
        records: vec![(
            AuditEvent::Reconciled,
            NewAuditRecord {
                event: Some(AuditEvent::Reconciled),
                run_id: Some(step.run_id.clone()),
                step_id: Some(step.id.clone()),
                tool: Some(step.tool.clone()),
                actor: Some(me.to_string()),
                rule: Some(SETTLED_RULE.to_string()),
                detail,
                tenant: None,
            },
        )],
        ..Transition::default()
    }
}

/// What follows a settled step in a planned run: in an active run, done when every step is,
/// failed (and compensated) when it never happened; in a run that ended meanwhile, a write
/// that did happen is left to a person ([`left_after_end`]).
async fn after_settled(state: &AppState, step: &Step, to: StepStatus) -> Result<(), StoreError> {
    let run = state.store.get_run(&step.run_id).await?;
    if !run.planned {
        return Ok(());
    }
    if run.status != RunStatus::Active {
        if to == StepStatus::Done {
            left_after_end(state, &run, step).await?;
        }
        return Ok(());
    }
    let after = state.store.get_step(&step.id).await?;
    if to == StepStatus::Failed {
        let answer = crate::pipeline::stored_outcome(&after);
        return fail_run(state, &run.id, &after, &answer).await;
    }
    let steps = state.store.steps_for_run(&run.id).await?;
    if steps.iter().all(|s| s.status == StepStatus::Done) {
        state.store.finish_run(&run.id, RunStatus::Done, "").await?;
    }
    Ok(())
}
