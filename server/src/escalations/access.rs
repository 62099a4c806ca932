//! Who may act on an escalation, what they may ask, and why it is refused: the vocabulary the
//! actions ([`super::settle`], [`super::undo`]) share.

use countersign_core::approvals::{DecideError, GateRules};
use countersign_core::store::{Escalation, Step};
use countersign_core::{AppRole, Effect, Person, StepStatus, StoreError, ToolName};
use serde_json::Value;

use crate::AppState;
use crate::pipeline::gate_rules;

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
pub(super) fn holds(person: &Person, rules: &GateRules) -> bool {
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
pub(super) fn step_up(
    state: &AppState,
    person: &Person,
    rules: &GateRules,
) -> Result<(), ActError> {
    let now = state.store.clock().now_ms();
    match rules.step_up_max_age_ms {
        Some(max_age) if person.auth_time_unknown || now - person.auth_time > max_age => {
            Err(ActError::StepUp(max_age / 60_000))
        }
        _ => Ok(()),
    }
}
