//! A step as stored and as it moves: the step row, a new step, its idempotency key's states and
//! record, and a transition with the guard, key claim and records it commits with.

use super::StoreError;
use crate::audit::{AuditEvent, NewAuditRecord};
use crate::canonical::CanonicalJson;
use crate::keys::InputsHash;
use crate::model::{Effect, StepStatus};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// A stored step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    /// Step id (UUID text).
    pub id: String,
    /// Its run.
    pub run_id: String,
    /// Position in the run, from 1.
    pub seq: i64,
    /// The role that proposed it.
    pub role: String,
    /// Registry tool.
    pub tool: String,
    /// Effect class at proposal.
    pub effect: Effect,
    /// Canonical inputs (RFC 8785 text).
    pub inputs: String,
    /// `sha256:` of the canonical inputs.
    pub inputs_hash: String,
    /// The derived idempotency key.
    pub idem_key: String,
    /// Lifecycle status.
    pub status: StepStatus,
    /// Executions started.
    pub attempts: i64,
    /// Last policy decision.
    pub decision: Option<String>,
    /// The rule behind it.
    pub rule: Option<String>,
    /// Approval reference (the approval row id).
    pub approval: Option<String>,
    /// Outcome JSON text (result or error).
    pub outcome: Option<String>,
    /// The proposer's reason.
    pub reason: String,
    /// Evidence ids, JSON array text.
    pub evidence: String,
    /// Observed state the step relies on, JSON text.
    pub observed: Option<String>,
    /// Trace id.
    pub trace_id: Option<String>,
    /// Not executed before (Unix ms).
    pub not_before: i64,
    /// When its gate stops accepting approvals (Unix ms).
    pub expires_at: Option<i64>,
    /// Proposing agent credential.
    pub agent_id: Option<String>,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
}

#[derive(sqlx::FromRow)]
pub(crate) struct StepRow {
    id: String,
    run_id: String,
    seq: i64,
    role: String,
    tool: String,
    effect: String,
    inputs: String,
    inputs_hash: String,
    idem_key: String,
    status: String,
    attempts: i64,
    decision: Option<String>,
    rule: Option<String>,
    approval: Option<String>,
    outcome: Option<String>,
    reason: String,
    evidence: String,
    observed: Option<String>,
    trace_id: Option<String>,
    not_before: i64,
    expires_at: Option<i64>,
    agent_id: Option<String>,
    created_at: i64,
    updated_at: i64,
}

impl TryFrom<StepRow> for Step {
    type Error = StoreError;
    fn try_from(r: StepRow) -> Result<Self, StoreError> {
        let bad = |what: &str, v: &str| StoreError::Conflict(format!("unknown step {what} {v:?}"));
        Ok(Step {
            effect: Effect::parse(&r.effect).ok_or_else(|| bad("effect", &r.effect))?,
            status: StepStatus::parse(&r.status).ok_or_else(|| bad("status", &r.status))?,
            id: r.id,
            run_id: r.run_id,
            seq: r.seq,
            role: r.role,
            tool: r.tool,
            inputs: r.inputs,
            inputs_hash: r.inputs_hash,
            idem_key: r.idem_key,
            attempts: r.attempts,
            decision: r.decision,
            rule: r.rule,
            approval: r.approval,
            outcome: r.outcome,
            reason: r.reason,
            evidence: r.evidence,
            observed: r.observed,
            trace_id: r.trace_id,
            not_before: r.not_before,
            expires_at: r.expires_at,
            agent_id: r.agent_id,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

/// Whether every step of the `steps` row's run is done, as a column `run_done`.
pub(crate) const RUN_DONE: &str = "NOT EXISTS (SELECT 1 FROM steps o
    WHERE o.run_id = steps.run_id AND o.status <> 'done') AS run_done";

/// A step row with its [`RUN_DONE`] column.
#[derive(sqlx::FromRow)]
pub(crate) struct StepAndRunDone {
    #[sqlx(flatten)]
    pub(crate) step: StepRow,
    pub(crate) run_done: bool,
}

pub(crate) const STEP_COLUMNS: &str = "id, run_id, CAST(seq AS BIGINT) AS seq, role, tool, effect, inputs, \
     inputs_hash, idem_key, status, CAST(attempts AS BIGINT) AS attempts, decision, rule, approval, \
     outcome, reason, evidence, observed, trace_id, not_before, expires_at, agent_id, created_at, \
     updated_at";

/// What is needed to open a step.
#[derive(Debug, Clone)]
pub struct NewStep {
    /// The run it belongs to.
    pub run_id: String,
    /// Proposing role.
    pub role: String,
    /// Registry tool.
    pub tool: String,
    /// Effect class (reads are never deduplicated: they run every time).
    pub effect: Effect,
    /// Canonical inputs.
    pub inputs: CanonicalJson,
    /// Proposing agent credential.
    pub agent_id: Option<String>,
    /// Why (the proposer's words).
    pub reason: String,
    /// Evidence ids.
    pub evidence: Vec<String>,
    /// Observed state, JSON text.
    pub observed: Option<String>,
    /// Trace id.
    pub trace_id: String,
    /// Initial status.
    pub status: StepStatus,
}

/// The identity of a write in its run.
pub(crate) fn dedupe_of(run_id: &str, tool: &str, inputs_hash: &InputsHash) -> String {
    let mut h = Sha256::new();
    for part in [run_id, tool, &inputs_hash.to_string()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut out = String::from("dedupe:");
    for b in digest.iter() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The state of a key in the key-to-result table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    /// Reserved; its call is running.
    InFlight,
    /// Completed; `result` holds the outcome.
    Done,
    /// Failed without effect; may be taken over for a retry.
    Failed,
    /// Sent, no answer: reconcile by asking the target.
    Unknown,
}

impl KeyState {
    /// Stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "in_flight" => Self::InFlight,
            "done" => Self::Done,
            "failed" => Self::Failed,
            "unknown" => Self::Unknown,
            _ => return None,
        })
    }
}

/// A row of the key-to-result table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// The key.
    pub idem_key: String,
    /// The step it belongs to.
    pub step_id: String,
    /// The inputs it was reserved for.
    pub inputs_hash: String,
    /// Where its call stands.
    pub state: KeyState,
    /// Stored outcome JSON text.
    pub result: Option<String>,
    /// Who reserved it (a trace id).
    pub owner: String,
    /// Unix ms.
    pub updated_at: i64,
}

#[derive(sqlx::FromRow)]
pub(crate) struct KeyRow {
    idem_key: String,
    step_id: String,
    inputs_hash: String,
    state: String,
    result: Option<String>,
    owner: String,
    updated_at: i64,
}

impl TryFrom<KeyRow> for KeyRecord {
    type Error = StoreError;
    fn try_from(r: KeyRow) -> Result<Self, StoreError> {
        Ok(KeyRecord {
            state: KeyState::parse(&r.state)
                .ok_or_else(|| StoreError::Conflict(format!("unknown key state {:?}", r.state)))?,
            idem_key: r.idem_key,
            step_id: r.step_id,
            inputs_hash: r.inputs_hash,
            result: r.result,
            owner: r.owner,
            updated_at: r.updated_at,
        })
    }
}

/// The answer to [`Store::reserve_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reservation {
    /// This caller holds the key and must execute.
    Reserved,
    /// Someone reserved it before; here is where it stands.
    Existing(KeyRecord),
}

/// A step moving from one status to another, with what changes alongside.
#[derive(Debug, Clone, Default)]
pub struct Transition {
    /// The step.
    pub step_id: String,
    /// The statuses it may leave; any other current status writes nothing.
    pub from: Vec<StepStatus>,
    /// Where it goes.
    pub to: Option<StepStatus>,
    /// New decision (kept when `None`).
    pub decision: Option<String>,
    /// New rule (kept when `None`).
    pub rule: Option<String>,
    /// New outcome JSON (kept when `None`).
    pub outcome: Option<String>,
    /// New gate expiry (kept when `None`).
    pub expires_at: Option<i64>,
    /// New approval reference (kept when `None`).
    pub approval: Option<String>,
    /// Count one more execution attempt.
    pub bump_attempts: bool,
    /// New earliest execution time (kept when `None`).
    pub not_before: Option<i64>,
    /// Also set the step's key to this state and result.
    pub key: Option<(KeyState, Option<String>)>,
    /// Audit records appended in the same transaction.
    pub records: Vec<(AuditEvent, NewAuditRecord)>,
    /// Write only while the world still allows the step (checked in the same statement).
    pub guard: Option<RunGuard>,
    /// [reads] The step's row is not written yet ([`Store::prepare_read`]): this transition
    /// writes it, already moved (one INSERT, its position taken in the statement, the guard
    /// checked in it). When the guard refuses, the row is written as prepared (`pending`) and
    /// the transition reports `None`, so the caller can record why it did not run.
    pub insert: Option<Box<Step>>,
    /// Also end this worker's lease on the step (its claim), when the step is still claimed by
    /// it: an executor's closing transition, so that no separate release follows.
    pub release: Option<String>,
    /// Also reserve the step's key in the same transaction when the step moves (a write taken
    /// before its call): written `in_flight` unless the key exists already
    /// ([`Store::start_step`] says which).
    pub reserve: Option<KeyClaim>,
}

/// A key reservation made with a transition ([`Transition::reserve`]).
#[derive(Debug, Clone)]
pub struct KeyClaim {
    /// The step's idempotency key.
    pub idem_key: String,
    /// The step's inputs hash.
    pub inputs_hash: String,
    /// Who reserves it (the call's trace id).
    pub owner: String,
}

/// Conditions a [`Transition`] checks in its own UPDATE, so that a call that read the world
/// earlier cannot commit after a cancel or a stop it raced: not written (the transition
/// reports `None`) unless the run is active (or, for compensations, failed) and the switch, if
/// named, is not set.
#[derive(Debug, Clone, Default)]
pub struct RunGuard {
    /// The step's run.
    pub run_id: String,
    /// Also accept a `failed` run (compensations run in the run that failed).
    pub allow_failed: bool,
    /// A switch (e.g. the emergency stop) whose presence blocks the write.
    pub unless_switch: Option<String>,
}
