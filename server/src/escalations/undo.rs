//! Approving the undo of a write: the compensating tool run once per claim, on a credential
//! minted for it (see the invariants in [`super`]).

use countersign_core::approvals::Verdict;
use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::registry::Tool;
use countersign_core::store::{Escalation, KeyState, Resolution, Run, RunStatus, Step, Transition};
use countersign_core::{Person, StepStatus, StoreError, ToolName};
use serde_json::{Map, Value, json};

use super::access::{ActError, Acted, holds, step_up};
use crate::AppState;
use crate::compensation::{
    cancel_for_escalation, compensation_args, compensator, execute_compensation, open_compensation,
};
use crate::pipeline::gate_rules;

/// The audit rule of a failed compensation run again by a person's undo.
pub const UNDO_RERUN_RULE: &str = "escalation.undo_rerun";

/// `esc` with an undo that is stranded — its step still `pending` or `needs_approval` in a run
/// that has ended, which no worker will run — cancelled and its claim freed (audited, by
/// `me`); as it was otherwise.
pub(super) async fn free_stranded_undo(
    state: &AppState,
    esc: &Escalation,
    me: &str,
) -> Result<Escalation, StoreError> {
    let Some(id) = &esc.undo_step else {
        return Ok(esc.clone());
    };
    let undo = state.store.get_step(id).await?;
    let run = state.store.get_run(&undo.run_id).await?;
    if run.status == RunStatus::Active
        || !matches!(undo.status, StepStatus::Pending | StepStatus::NeedsApproval)
    {
        return Ok(esc.clone());
    }
    if let Some(comp) = ToolName::parse(&undo.tool)
        .ok()
        .and_then(|n| state.registry.current()?.bundle.registry.tool(&n).cloned())
    {
        let undone = state.store.get_step(&esc.step_id).await?;
        cancel_unrun(state, &undone, id, &comp).await;
    }
    if state.store.get_step(id).await?.status == StepStatus::Cancelled {
        state
            .store
            .release_undo(esc, id, me, "its step was stranded before it ran")
            .await?;
    }
    state.store.get_escalation(&esc.id).await
}

/// Runs the undo of `step` once (see the module doc). The credential minted for it ends with
/// it, whatever happened.
pub(super) async fn undo(
    state: &AppState,
    person: &Person,
    esc: &Escalation,
    step: &Step,
    run: &Run,
    reason: &str,
) -> Result<Acted, ActError> {
    let me = person.actor();
    let esc = free_stranded_undo(state, esc, &me).await?;
    if let Some(ran) = &esc.undo_step {
        return Err(ActError::UndoRan(ran.clone()));
    }
    let Some(comp) = compensator(state, step) else {
        return Err(ActError::NotApplicable(
            "the registry names no compensating tool for this step any more",
        ));
    };
    // A compensating tool with a `reason` input gets this person's words, so each attempt is
    // a step of its own; one without is the same step as the failed compensation, run again.
    let why = format!(
        "Compensating step {} ({}): {} approved the undo at {}",
        step.seq,
        step.tool,
        person.name,
        state.store.clock().now().format("%Y-%m-%d %H:%M:%S UTC")
    );
    let args = compensation_args(state, step, &why, &comp).map_err(ActError::Undo)?;
    // What the undo's own gate would ask of this person, checked before anything is opened.
    if comp.approval.is_some() {
        let rules = gate_rules(&comp, &args);
        if !holds(person, &rules) {
            return Err(ActError::NotApplicable(
                "you hold none of the undo tool's approver roles",
            ));
        }
        step_up(state, person, &rules)?;
        if rules.approvals_needed > 1 {
            return Err(ActError::NotApplicable(
                "the undo needs two approvers, which this page cannot gather: acknowledge it \
                 and undo it by hand",
            ));
        }
    }
    let (comp_step, opened) = open_compensation(state, step, &comp, &args, None)
        .await
        .map_err(ActError::Undo)?;
    let id = comp_step.id.clone();
    if !opened {
        match comp_step.status {
            StepStatus::Done => {
                // The undo happened already.
                let mut detail = Map::new();
                detail.insert("compensation_step".into(), json!(id));
                state
                    .store
                    .close_escalation(&esc, &me, Resolution::Undone, reason, detail)
                    .await?;
                return Ok(Acted::Undone);
            }
            StepStatus::Failed | StepStatus::Cancelled
                if comp_step.attempts < crate::pipeline::MAX_ATTEMPTS => {}
            StepStatus::Failed
            | StepStatus::Cancelled
            | StepStatus::Pending
            | StepStatus::Running
            | StepStatus::NeedsApproval
            | StepStatus::Unknown
            | StepStatus::Refused
            | StepStatus::Expired => return Err(ActError::UndoRan(id)),
        }
    }
    if !state.store.claim_undo(&esc, &id, &me, reason).await? {
        let now = state.store.get_escalation(&esc.id).await?;
        // Another person's undo claimed it first: a step opened here is cancelled unless it
        // is that very step, which is theirs to run.
        if opened && now.undo_step.as_deref() != Some(id.as_str()) {
            cancel_unrun(state, step, &id, &comp).await;
        }
        return Err(match now.undo_step {
            Some(ran) if now.closed_at.is_none() => ActError::UndoRan(ran),
            _ => ActError::Closed,
        });
    }
    // Claimed: from here on this person's undo owns the step and the credential minted for it.
    let minted = match undo_credential(state, run, step).await {
        Ok(m) => m,
        Err(e) => {
            abandon(state, &esc, step, &id, &comp, &me, &e.to_string()).await?;
            return Err(e);
        }
    };
    let result = undo_claimed(
        state,
        person,
        &esc,
        step,
        (&comp_step, opened),
        &comp,
        &args,
        minted.as_deref(),
        reason,
    )
    .await;
    // [duties] The undo's credential ends with it (only this one: another undo of the run may
    // be running on its own).
    if let Some(minted) = &minted
        && let Err(e) = state.store.revoke_agent(minted, "escalation").await
    {
        tracing::warn!(agent = %minted, error = %e, "escalation: ending the undo's credential failed");
    }
    result
}

/// The credential the undo runs on: for a planned run, a fresh execution credential of the
/// step's role (the run's own were revoked once its compensations ran), minted only while
/// the run's planner credential is valid; `None` for a run of direct calls.
async fn undo_credential(
    state: &AppState,
    run: &Run,
    step: &Step,
) -> Result<Option<String>, ActError> {
    let Some(planner_id) = run.agent_id.as_deref().filter(|_| run.planned) else {
        return Ok(None);
    };
    let planner = state.store.get_agent(planner_id).await?;
    let Ok(planner) = state.store.check_credential(planner) else {
        return Err(ActError::NotApplicable(
            "the run's planner credential is revoked or expired, so nothing more runs for this \
             run: undo it by hand and acknowledge",
        ));
    };
    let minted = state
        .store
        .mint_execution(run, &step.role, &planner)
        .await
        .map_err(|e| ActError::Undo(e.to_string()))?;
    Ok(Some(minted.id))
}

/// [`undo`] once claimed: put the step on its credential, run it (approving its gate as
/// `person`), and close the escalation when it is done.
#[allow(clippy::too_many_arguments)]
async fn undo_claimed(
    state: &AppState,
    person: &Person,
    esc: &Escalation,
    step: &Step,
    (comp_step, opened): (&Step, bool),
    comp: &Tool,
    args: &Value,
    assignee: Option<&str>,
    reason: &str,
) -> Result<Acted, ActError> {
    let me = person.actor();
    let id = comp_step.id.clone();
    if let Some(assignee) = assignee {
        state.store.assign_step(&id, assignee).await?;
    }
    let comp_step = if opened {
        comp_step.clone()
    } else {
        let mut detail = Map::new();
        detail.insert("reason".into(), json!(reason));
        detail.insert("escalation_id".into(), json!(esc.id));
        let again = state
            .store
            .transition(&Transition {
                step_id: id.clone(),
                from: vec![StepStatus::Failed, StepStatus::Cancelled],
                to: Some(StepStatus::Pending),
                records: vec![(
                    AuditEvent::Operational,
                    NewAuditRecord {
                        event: Some(AuditEvent::Operational),
                        run_id: Some(step.run_id.clone()),
                        step_id: Some(id.clone()),
                        tool: Some(comp.name.as_str().to_string()),
                        actor: Some(me.clone()),
                        rule: Some(UNDO_RERUN_RULE.into()),
                        detail,
                        tenant: None,
                    },
                )],
                ..Transition::default()
            })
            .await?;
        match again {
            Some(_) => state.store.get_step(&id).await?,
            None => {
                abandon(
                    state,
                    esc,
                    step,
                    &id,
                    comp,
                    &me,
                    "it was not failed or cancelled",
                )
                .await?;
                return Err(ActError::UndoRan(id));
            }
        }
    };
    let mut status = match execute_compensation(state, comp_step).await {
        Ok(s) => s,
        Err(e) => {
            abandon(state, esc, step, &id, comp, &me, &e).await?;
            return Err(ActError::Undo(e));
        }
    };
    if status == StepStatus::NeedsApproval {
        let rules = gate_rules(comp, args);
        if let Err(e) = state
            .store
            .decide_step(&id, &person.decider(), &rules, Verdict::Approved, reason)
            .await
        {
            abandon(state, esc, step, &id, comp, &me, &e.to_string()).await?;
            return Err(ActError::Decide(e));
        }
        let approved = state.store.get_step(&id).await?;
        status = match execute_compensation(state, approved).await {
            Ok(s) => s,
            Err(e) => {
                abandon(state, esc, step, &id, comp, &me, &e).await?;
                return Err(ActError::Undo(e));
            }
        };
    }
    if status != StepStatus::Done {
        tracing::info!(step = %id, status = status.as_str(), "escalation: the undo ran and did not end done");
        // Refused, cancelled or expired before the target took it (its key absent or open to
        // another try): freed, so that it may be asked again.
        let never_sent = matches!(
            status,
            StepStatus::Refused | StepStatus::Cancelled | StepStatus::Expired
        ) && match state.store.get_step(&id).await {
            Ok(after) => match state.store.get_key(&after.idem_key).await? {
                None => true,
                Some(k) => k.state == KeyState::Failed,
            },
            Err(e) => return Err(e.into()),
        };
        if never_sent {
            state
                .store
                .release_undo(
                    esc,
                    &id,
                    &me,
                    &format!("it ended {} before it ran", status.as_str()),
                )
                .await?;
        }
        return Ok(Acted::UndoEnded(status));
    }
    let mut detail = Map::new();
    detail.insert("compensation_step".into(), json!(id));
    detail.insert("reason".into(), json!(reason));
    let claimed = state.store.get_escalation(&esc.id).await?;
    state
        .store
        .close_escalation(&claimed, &me, Resolution::Undone, reason, detail)
        .await?;
    Ok(Acted::Undone)
}

/// The undo's step `id` did not get to run (`why`): cancelled, and, once it is, the claim freed.
async fn abandon(
    state: &AppState,
    esc: &Escalation,
    step: &Step,
    id: &str,
    comp: &Tool,
    me: &str,
    why: &str,
) -> Result<(), StoreError> {
    cancel_unrun(state, step, id, comp).await;
    if state.store.get_step(id).await?.status == StepStatus::Cancelled {
        state.store.release_undo(esc, id, me, why).await?;
    }
    Ok(())
}

/// Cancels compensation step `id` that never ran (best effort: logged when it cannot).
async fn cancel_unrun(state: &AppState, step: &Step, id: &str, comp: &Tool) {
    if let Err(e) = cancel_for_escalation(state, step, id, comp, "escalation").await {
        tracing::warn!(step = %id, error = %e, "escalation: cancelling an unrun undo failed");
    }
}
