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

use countersign_core::approvals::{DecideError, GateRules, Verdict, names_person};
use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::registry::Tool;
use countersign_core::store::{
    Escalation, EscalationKind, KeyState, Resolution, Run, RunStatus, SETTLED_RULE, SettleOutcome,
    Step, Transition,
};
use countersign_core::{AppRole, Effect, Person, StepStatus, StoreError, ToolName};
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::compensation::{
    cancel_for_escalation, compensation_args, compensator, execute_compensation, fail_run,
    left_after_end, open_compensation,
};
use crate::pipeline::gate_rules;

/// The audit rule of a failed compensation run again by a person's undo.
pub const UNDO_RERUN_RULE: &str = "escalation.undo_rerun";

/// The longest reference at the target a person may record.
pub const MAX_REFERENCE_LEN: usize = 200;

/// What a person asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The call happened at the target, under this reference.
    Happened(String),
    /// The call never happened at the target.
    NotHappened,
    /// Run the undo (the compensating tool), once.
    Undo,
    /// A person takes it from here.
    Acknowledge,
}

/// What an action did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acted {
    /// The unknown is settled (the step moved, the escalation closed).
    Settled,
    /// The first of two people's settlement is recorded; a second person must confirm.
    FirstRecorded,
    /// The undo ran and is done; the escalation closed.
    Undone,
    /// The undo ran and ended otherwise (the step's status); the escalation stays open.
    UndoEnded(StepStatus),
    /// Acknowledged; the escalation closed.
    Acknowledged,
}

/// Why an action was refused (nothing written unless said).
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    /// No such escalation for this person (another tenant, a tool they do not hold).
    #[error("no such escalation")]
    NotFound,
    /// It was closed already.
    #[error("this escalation is closed already")]
    Closed,
    /// A reason is required.
    #[error("a reason is required")]
    NoReason,
    /// Settling as happened needs the target's reference.
    #[error("give the target's reference (at most {MAX_REFERENCE_LEN} characters)")]
    NoReference,
    /// The action does not apply to this escalation now.
    #[error("{0}")]
    NotApplicable(&'static str),
    /// The tool wants a recent sign-in.
    #[error("sign in again: this tool needs a sign-in within the last {0} minutes")]
    StepUp(i64),
    /// The run acts for this person.
    #[error("the run acts for you: another person must act on it")]
    OwnRun,
    /// The person is accountable for the proposal (audited).
    #[error("{0}")]
    Accountable(DecideError),
    /// The first of two settlers tried to be the second.
    #[error("you recorded the first settlement: a second, different person must confirm it")]
    SameSettler,
    /// The second settlement differed from the first, which is withdrawn (audited).
    #[error(
        "the first person recorded another outcome or reference: their settlement is \
         withdrawn, and two people must now agree on what happened"
    )]
    Disagrees,
    /// Someone else acted on it at the same moment: nothing written.
    #[error("someone else acted on this escalation at the same moment: look at it again")]
    Raced,
    /// The undo ran already for this escalation.
    #[error("the undo ran already (step {0}); acknowledge what is left")]
    UndoRan(String),
    /// The compensation could not be built or run.
    #[error("the undo could not run: {0}")]
    Undo(String),
    /// Approving the compensation's gate was refused.
    #[error("{0}")]
    Decide(DecideError),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The escalation `id` and its step, and the escalated tool's gate rules, when `person` may act
/// on it.
pub async fn visible(
    state: &AppState,
    person: &Person,
    id: &str,
) -> Result<(Escalation, Step, GateRules), ActError> {
    let esc = match state.store.get_escalation(id).await {
        Ok(e) => e,
        Err(StoreError::NotFound) => return Err(ActError::NotFound),
        Err(e) => return Err(e.into()),
    };
    let step = state.store.get_step(&esc.step_id).await?;
    let rules = may_act(state, person, &esc, &step).ok_or(ActError::NotFound)?;
    Ok((esc, step, rules))
}

/// The escalated tool's gate rules when `person` may act on `esc` (see the module doc).
pub fn may_act(
    state: &AppState,
    person: &Person,
    esc: &Escalation,
    step: &Step,
) -> Option<GateRules> {
    if person.tenant.as_deref() != Some(esc.tenant.as_str()) {
        return None;
    }
    let loaded = state.registry.current()?;
    let tool = ToolName::parse(&step.tool)
        .ok()
        .and_then(|n| loaded.bundle.registry.tool(&n))?;
    let inputs: Value = serde_json::from_str(&step.inputs).unwrap_or(Value::Null);
    let rules = gate_rules(tool, &inputs);
    holds(person, &rules).then_some(rules)
}

/// Whether `person` holds one of `rules`' approver roles (none named: the admins').
fn holds(person: &Person, rules: &GateRules) -> bool {
    if rules.approver_roles.is_empty() {
        return person.has_role(AppRole::Admin);
    }
    rules
        .approver_roles
        .iter()
        .any(|r| person.roles.iter().any(|have| have.as_str() == r))
}

/// Whether the escalated step needs two people to settle.
pub fn two_people(step: &Step) -> bool {
    step.effect == Effect::Irreversible
}

/// The step-up refusal `rules` ask of `person` now, if any.
fn step_up(state: &AppState, person: &Person, rules: &GateRules) -> Result<(), ActError> {
    let now = state.store.clock().now_ms();
    match rules.step_up_max_age_ms {
        Some(max_age) if person.auth_time_unknown || now - person.auth_time > max_age => {
            Err(ActError::StepUp(max_age / 60_000))
        }
        _ => Ok(()),
    }
}

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

/// `esc` with an undo that is stranded — its step still `pending` or `needs_approval` in a run
/// that has ended, which no worker will run — cancelled and its claim freed (audited, by
/// `me`); as it was otherwise.
async fn free_stranded_undo(
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

/// Settles an unknown (see the module doc: one or two people).
async fn settle(
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

/// Runs the undo of `step` once (see the module doc). The credential minted for it ends with
/// it, whatever happened.
async fn undo(
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
