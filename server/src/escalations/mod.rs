//! What a person does about an escalation (issue 36): settle an `unknown` with the target's
//! reference, approve the undo of a write, or acknowledge what Countersign cannot undo.
//!
//! Invariants (each fails closed):
//! * Who may act: a signed-in person of the escalation's tenant holding one of the escalated
//!   tool's approver roles, as its gate rules name them for the step's own inputs (the
//!   `approver` role for a tool without approval settings; a tool whose settings name no role
//!   is the tenant admins'). A tool gone from the registry, or no registry in force: nobody.
//! * Nobody acts on work they are accountable for: the run's principal is refused, and the
//!   person who created, or is the party of, the proposing credential or the run's is refused
//!   and the attempt audited ([`Store::refuse_accountable`]), as an approval of its gate
//!   would be.
//! * A reason is required for every action; a tool with a step-up window needs a recent
//!   sign-in for every action, as a decision on its gate would.
//! * Only an `unknown` escalation is settled, only while its step is still `unknown` (one whose
//!   step reconciliation settled meanwhile is closed as reconciled, not settled); an `unknown`
//!   is never acknowledged away. Settling says either "it happened" with the target's
//!   reference (the step becomes `done`, its key `done`: it never runs again) or "it never
//!   happened" (the step `failed`, an active planned run failed and compensated as after any
//!   failure; the key may be used by a fresh call).
//! * For an irreversible tool two distinct people settle: the first person's outcome and
//!   reference are recorded (audited) and the step stays `unknown`; it moves only when a
//!   different person submits the same outcome and reference. A second person who disagrees
//!   withdraws the first settlement (audited): two people must then agree from the start.
//! * An undo runs the compensating tool at most once at a time per escalation
//!   ([`Store::claim_undo`], audited) through the pipeline: a new step of the run, or the
//!   failed compensation itself run again (audited) when its key allows another try and its
//!   attempts are not spent. It runs on a fresh execution credential of the run's role (the
//!   run's own ended with it), minted once claimed and revoked when the undo ends; when its
//!   gate waits for a person, this person's approval is recorded through
//!   [`Store::decide_step`] (the same checks as the inbox) before it runs. An undo that did
//!   not get to run (its approval refused, an error before it ran, refused or cancelled before
//!   the target took it, stranded in a run nobody runs) is cancelled and its claim freed
//!   (audited); one the target took and that did not end `done` keeps the claim, and the
//!   escalation stays open for a person to acknowledge. An escalation is not acknowledged
//!   while its undo runs, nor closed over an undo started meanwhile.
//! * Every action is an audit record in the same transaction as the state it changes.
//!
//! [`Store::claim_undo`]: countersign_core::Store::claim_undo
//! [`Store::decide_step`]: countersign_core::Store::decide_step
//! [`Store::refuse_accountable`]: countersign_core::Store::refuse_accountable

mod access;
mod reconcile;
mod settle;
mod undo;

pub use access::{ActError, Acted, Action, MAX_REFERENCE_LEN, may_act, two_people, visible};
pub use reconcile::{escalate_unknown, reconciled};
pub use undo::UNDO_RERUN_RULE;

use countersign_core::approvals::names_person;
use countersign_core::store::{Escalation, EscalationKind, Resolution};
use countersign_core::{Person, StepStatus};
use serde_json::{Map, json};

use crate::AppState;
use access::step_up;
use settle::settle;
use undo::{free_stranded_undo, undo};

/// `person` acts on escalation `id` with `reason`.
pub async fn act(
    state: &AppState,
    person: &Person,
    id: &str,
    action: &Action,
    reason: &str,
) -> Result<Acted, ActError> {
    let (esc, step, rules) = visible(state, person, id).await?;
    if esc.closed_at.is_some() {
        return Err(ActError::Closed);
    }
    // Reconciliation settled the step after the escalation opened (and its close was lost):
    // closed now, as reconciled.
    if esc.kind() == EscalationKind::Unknown && step.status != StepStatus::Unknown {
        reconciled(state, &step).await?;
        return Err(ActError::NotApplicable(
            "the step is no longer unknown: reconciliation settled it",
        ));
    }
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(ActError::NoReason);
    }
    step_up(state, person, &rules)?;
    let run = state.store.get_run(&esc.run_id).await?;
    if names_person(&run.principal, &person.approver()) {
        return Err(ActError::OwnRun);
    }
    if let Some(refusal) = state
        .store
        .refuse_accountable(&step, &run, &person.approver(), reason)
        .await?
    {
        return Err(ActError::Accountable(refusal));
    }
    match (esc.kind(), action) {
        (EscalationKind::Unknown, Action::Happened(_) | Action::NotHappened) => {
            settle(state, person, &esc, &step, action, reason).await
        }
        (EscalationKind::Unknown, _) => Err(ActError::NotApplicable(
            "an unknown outcome is settled, not undone or acknowledged: say what happened at \
             the target",
        )),
        (_, Action::Happened(_) | Action::NotHappened) => Err(ActError::NotApplicable(
            "only an unknown outcome is settled",
        )),
        (EscalationKind::Undo, Action::Undo) => {
            undo(state, person, &esc, &step, &run, reason).await
        }
        (EscalationKind::Manual, Action::Undo) => Err(ActError::NotApplicable(
            "nothing here can undo this effect: acknowledge it once it is handled",
        )),
        (EscalationKind::Undo | EscalationKind::Manual, Action::Acknowledge) => {
            acknowledge(state, person, &esc, reason).await
        }
    }
}

/// Closes `esc` as handled outside Countersign — never while its undo is in flight (one
/// stranded before it ran is cancelled and freed first), and only if no undo started
/// meanwhile.
async fn acknowledge(
    state: &AppState,
    person: &Person,
    esc: &Escalation,
    reason: &str,
) -> Result<Acted, ActError> {
    let esc = free_stranded_undo(state, esc, &person.actor()).await?;
    if let Some(undo) = &esc.undo_step
        && state.store.get_step(undo).await?.status == StepStatus::Running
    {
        return Err(ActError::NotApplicable(
            "the undo is still running: wait for it to end, then acknowledge what is left",
        ));
    }
    let mut detail = Map::new();
    detail.insert("reason".into(), json!(reason));
    if state
        .store
        .close_escalation(
            &esc,
            &person.actor(),
            Resolution::Acknowledged,
            reason,
            detail,
        )
        .await?
    {
        return Ok(Acted::Acknowledged);
    }
    Err(
        if state
            .store
            .get_escalation(&esc.id)
            .await?
            .closed_at
            .is_some()
        {
            ActError::Closed
        } else {
            ActError::Raced
        },
    )
}
