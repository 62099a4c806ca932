//! Steps, their idempotency keys and their transitions.
//!
//! Invariants:
//! * A write's identity in its run is (run, tool, inputs hash): the `dedupe` column is unique,
//!   so however many callers race to open the same write, one step (one seq, one key) exists.
//! * `idem_key = sha256(run_id, seq, canonical inputs)` is derived here, never taken from a
//!   caller, and is unique across all steps.
//! * A key is reserved (a row in `idempotency`) before any adapter runs; only the reserver
//!   executes. A stored key whose inputs hash differs from the caller's is a mismatch.
//! * A transition names the statuses it may leave; if the step moved meanwhile nothing is
//!   written. The status change, the key's state and the audit records commit together.

use serde::Serialize;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{Pool, Store, StoreError, on_pool};
use crate::audit::{AuditEvent, AuditRecord, NewAuditRecord, hold_head};
use crate::canonical::CanonicalJson;
use crate::keys::{IdemKey, InputsHash};
use crate::model::{Effect, StepStatus};

/// [reads] The INSERT of a prepared step's row as prepared, its position the run's next;
/// returns the position. Binds: see [`prepared_insert`].
pub(crate) const PREPARED_INSERT_SQL: &str = "INSERT INTO steps (id, run_id, seq, role, tool,
        effect, inputs, inputs_hash, idem_key, status, attempts, reason, evidence, observed,
        trace_id, not_before, created_at, updated_at, agent_id)
     VALUES ($1, $2, (SELECT COALESCE(MAX(seq), 0) + 1 FROM steps WHERE run_id = $2), $3, $4,
        $5, $6, $7, $8, $9, 0, $10, $11, $12, $13, $14, $15, $15, $16)
     RETURNING CAST(seq AS BIGINT)";

/// Binds a prepared [`Step`] to [`PREPARED_INSERT_SQL`].
macro_rules! prepared_insert {
    ($q:expr, $step:expr) => {{
        let step: &$crate::store::Step = $step;
        $q.bind(&step.id)
            .bind(&step.run_id)
            .bind(&step.role)
            .bind(&step.tool)
            .bind(step.effect.as_str())
            .bind(&step.inputs)
            .bind(&step.inputs_hash)
            .bind(&step.idem_key)
            .bind(step.status.as_str())
            .bind(&step.reason)
            .bind(&step.evidence)
            .bind(&step.observed)
            .bind(&step.trace_id)
            .bind(step.not_before)
            .bind(step.created_at)
            .bind(&step.agent_id)
    }};
}
pub(crate) use prepared_insert;

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
const RUN_DONE: &str = "NOT EXISTS (SELECT 1 FROM steps o
    WHERE o.run_id = steps.run_id AND o.status <> 'done') AS run_done";

/// A step row with its [`RUN_DONE`] column.
#[derive(sqlx::FromRow)]
struct StepAndRunDone {
    #[sqlx(flatten)]
    step: StepRow,
    run_done: bool,
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
fn dedupe_of(run_id: &str, tool: &str, inputs_hash: &InputsHash) -> String {
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
struct KeyRow {
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
    /// Answer at COMMIT, before the batch's WAL flush is confirmed (group commit on Postgres;
    /// see [`crate::store`]'s committer). Only for an executor's closing transition after its
    /// effect: the worker starts no effect before a later barrier (which flushes the WAL past
    /// this commit), and a crash that loses the unflushed commit leaves the step `running`
    /// with its key `in_flight`, which the reconciler settles by key — the state a crash just
    /// before this COMMIT leaves. Never for an answer a caller outside this process sees.
    pub answer_at_commit: bool,
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

impl Store {
    /// [reads] A read's step as it will be stored, without writing it: a read has no effect
    /// to guard, so its row is written with its outcome ([`Transition::insert`]) or, on a path
    /// that parks or refuses it first, by [`Store::insert_prepared`]. Its key comes from its own
    /// id ([`IdemKey::for_read`]); its position is taken when the row is written (`seq` 0 here).
    pub fn prepare_read(&self, new: &NewStep) -> Result<Step, StoreError> {
        if new.effect != Effect::Read {
            return Err(StoreError::Conflict(format!(
                "{} is not a read: its step opens before it runs",
                new.tool
            )));
        }
        let evidence = serde_json::to_string(&new.evidence)
            .map_err(|e| StoreError::Conflict(format!("evidence: {e}")))?;
        let now = self.clock.now_ms();
        let id = Uuid::new_v4().to_string();
        let key = IdemKey::for_read(&id, &new.inputs);
        Ok(Step {
            id,
            run_id: new.run_id.clone(),
            seq: 0,
            role: new.role.clone(),
            tool: new.tool.clone(),
            effect: new.effect,
            inputs: new.inputs.as_str().to_string(),
            inputs_hash: InputsHash::of(&new.inputs).to_string(),
            idem_key: key.to_string(),
            status: new.status,
            attempts: 0,
            decision: None,
            rule: None,
            approval: None,
            outcome: None,
            reason: new.reason.clone(),
            evidence,
            observed: new.observed.clone(),
            trace_id: Some(new.trace_id.clone()),
            not_before: 0,
            expires_at: None,
            agent_id: new.agent_id.clone(),
            created_at: now,
            updated_at: now,
        })
    }

    /// Writes a [`Store::prepare_read`] step's row as prepared; the step with its position.
    pub async fn insert_prepared(&self, step: &Step) -> Result<Step, StoreError> {
        let seq: i64 = on_pool!(self, |p| {
            prepared_insert!(sqlx::query_scalar(PREPARED_INSERT_SQL), step)
                .fetch_one(p)
                .await?
        });
        Ok(Step {
            seq,
            ..step.clone()
        })
    }

    /// Opens a step, or for a write returns the identical one already open in its run
    /// (`false` = it existed).
    pub async fn open_step(&self, new: &NewStep) -> Result<(Step, bool), StoreError> {
        let inputs_hash = InputsHash::of(&new.inputs);
        let dedupe = match new.effect {
            Effect::Read => None,
            Effect::Write | Effect::Irreversible => {
                Some(dedupe_of(&new.run_id, &new.tool, &inputs_hash))
            }
        };
        if let Some(d) = &dedupe
            && let Some(step) = self.step_by_dedupe(d).await?
        {
            return Ok((step, false));
        }
        let evidence = serde_json::to_string(&new.evidence)
            .map_err(|e| StoreError::Conflict(format!("evidence: {e}")))?;
        for _ in 0..32 {
            let now = self.clock.now_ms();
            let id = Uuid::new_v4().to_string();
            // [reads] A read has no effect and its key guards nothing: it is derived from
            // the step's own id, so the row opens in one statement that takes the next
            // position itself. A write's key is derived from its position (the run's order),
            // which is read first.
            let read = dedupe.is_none();
            let seq: i64 = if read {
                0
            } else {
                on_pool!(self, |p| {
                    sqlx::query_scalar(
                        "SELECT CAST(COALESCE(MAX(seq), 0) + 1 AS BIGINT) FROM steps WHERE run_id = $1",
                    )
                    .bind(&new.run_id)
                    .fetch_one(p)
                    .await?
                })
            };
            let key = if read {
                IdemKey::for_read(&id, &new.inputs)
            } else {
                IdemKey::derive(&new.run_id, seq.max(0) as u64, &new.inputs)
            };
            let insert =
                "INSERT INTO steps (id, run_id, seq, role, tool, effect, inputs, inputs_hash,
                    idem_key, status, attempts, reason, evidence, observed, trace_id,
                    not_before, created_at, updated_at, dedupe, agent_id)
                 VALUES ($1, $2, CASE WHEN $3 > 0 THEN $3 ELSE
                        (SELECT COALESCE(MAX(seq), 0) + 1 FROM steps WHERE run_id = $2) END,
                    $4, $5, $6, $7, $8, $9, $10, 0, $11, $12, $13, $14, 0, $15, $15, $16, $17)
                 ON CONFLICT DO NOTHING
                 RETURNING CAST(seq AS BIGINT)";
            macro_rules! bound {
                ($q:expr) => {
                    $q.bind(&id)
                        .bind(&new.run_id)
                        .bind(seq)
                        .bind(&new.role)
                        .bind(&new.tool)
                        .bind(new.effect.as_str())
                        .bind(new.inputs.as_str())
                        .bind(inputs_hash.to_string())
                        .bind(key.to_string())
                        .bind(new.status.as_str())
                        .bind(&new.reason)
                        .bind(&evidence)
                        .bind(&new.observed)
                        .bind(&new.trace_id)
                        .bind(now)
                        .bind(&dedupe)
                        .bind(&new.agent_id)
                };
            }
            let taken: Option<i64> = match (&self.pool, &self.lazy) {
                // A read's opening row need not reach disk before its outcome does: its
                // closing transition commits synchronously, and WAL order makes this row
                // durable with it. A crash before that loses a row with no effect and no
                // record. So it commits on a connection that does not wait for the WAL flush.
                (Pool::Postgres(_), Some(lazy)) if read => {
                    bound!(sqlx::query_scalar(insert))
                        .fetch_optional(lazy)
                        .await?
                }
                (Pool::Postgres(p), _) => {
                    bound!(sqlx::query_scalar(insert)).fetch_optional(p).await?
                }
                (Pool::Sqlite(p), _) => {
                    bound!(sqlx::query_scalar(insert)).fetch_optional(p).await?
                }
            };
            if let Some(seq) = taken {
                let step = Step {
                    id,
                    run_id: new.run_id.clone(),
                    seq,
                    role: new.role.clone(),
                    tool: new.tool.clone(),
                    effect: new.effect,
                    inputs: new.inputs.as_str().to_string(),
                    inputs_hash: inputs_hash.to_string(),
                    idem_key: key.to_string(),
                    status: new.status,
                    attempts: 0,
                    decision: None,
                    rule: None,
                    approval: None,
                    outcome: None,
                    reason: new.reason.clone(),
                    evidence,
                    observed: new.observed.clone(),
                    trace_id: Some(new.trace_id.clone()),
                    not_before: 0,
                    expires_at: None,
                    agent_id: new.agent_id.clone(),
                    created_at: now,
                    updated_at: now,
                };
                return Ok((step, true));
            }
            if let Some(d) = &dedupe
                && let Some(step) = self.step_by_dedupe(d).await?
            {
                return Ok((step, false));
            }
            // Another step took this seq: try the next one.
        }
        Err(StoreError::Conflict(
            "could not find a free step position".into(),
        ))
    }

    async fn step_by_dedupe(&self, dedupe: &str) -> Result<Option<Step>, StoreError> {
        let sql = format!("SELECT {STEP_COLUMNS} FROM steps WHERE dedupe = $1");
        let row: Option<StepRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(dedupe).fetch_optional(p).await?
        });
        row.map(Step::try_from).transpose()
    }

    /// One step.
    pub async fn get_step(&self, id: &str) -> Result<Step, StoreError> {
        let sql = format!("SELECT {STEP_COLUMNS} FROM steps WHERE id = $1");
        let row: StepRow = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(id).fetch_one(p).await?
        });
        row.try_into()
    }

    /// The read step of `run_id` that `agent`'s repeat of a gated read call in `role`
    /// continues: the same agent, role, tool and inputs hash, parked at its gate with the
    /// window still open, or approved and not yet run (`pending` after its gate window
    /// opened). The newest such step; `None` otherwise (a new read is opened).
    pub async fn gated_read(
        &self,
        run_id: &str,
        agent: &str,
        role: &str,
        tool: &str,
        inputs_hash: &str,
    ) -> Result<Option<Step>, StoreError> {
        let sql = format!(
            "SELECT {STEP_COLUMNS} FROM steps
              WHERE run_id = $1 AND agent_id = $2 AND role = $3 AND tool = $4
                AND inputs_hash = $5 AND effect = 'read' AND expires_at IS NOT NULL
                AND ((status = 'needs_approval' AND expires_at > $6) OR status = 'pending')
              ORDER BY seq DESC LIMIT 1"
        );
        let now = self.clock.now_ms();
        let row: Option<StepRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(run_id)
                .bind(agent)
                .bind(role)
                .bind(tool)
                .bind(inputs_hash)
                .bind(now)
                .fetch_optional(p)
                .await?
        });
        row.map(Step::try_from).transpose()
    }

    /// One step, and whether every step of its run is done: what settling a step after its
    /// execution needs, in one read.
    pub async fn step_and_run_done(&self, id: &str) -> Result<(Step, bool), StoreError> {
        let sql = format!("SELECT {STEP_COLUMNS}, {RUN_DONE} FROM steps WHERE id = $1");
        let row: StepAndRunDone = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(id).fetch_one(p).await?
        });
        Ok((row.step.try_into()?, row.run_done))
    }

    /// A run's steps in order.
    pub async fn steps_for_run(&self, run_id: &str) -> Result<Vec<Step>, StoreError> {
        let sql = format!("SELECT {STEP_COLUMNS} FROM steps WHERE run_id = $1 ORDER BY seq");
        let rows: Vec<StepRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(run_id).fetch_all(p).await?
        });
        rows.into_iter().map(Step::try_from).collect()
    }

    /// Steps in `status`, oldest first, at most `limit`.
    pub async fn steps_in_status(
        &self,
        status: StepStatus,
        limit: i64,
    ) -> Result<Vec<Step>, StoreError> {
        let sql = format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE status = $1 ORDER BY updated_at, id LIMIT $2"
        );
        let rows: Vec<StepRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(status.as_str())
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        rows.into_iter().map(Step::try_from).collect()
    }

    /// Steps of `tools` waiting for approval in runs of `tenant`, oldest first (`updated_at`,
    /// `id`), at most `limit`: the inbox's list, one query whatever the number of gates or
    /// tenants. The tools are filtered before the limit, so gates of tools a person cannot
    /// approve never hide the ones they can. No tools: nothing.
    pub async fn waiting_for_tenant(
        &self,
        tenant: &str,
        tools: &[String],
        limit: i64,
    ) -> Result<Vec<Step>, StoreError> {
        if tools.is_empty() {
            return Ok(Vec::new());
        }
        let listed: Vec<String> = (0..tools.len()).map(|i| format!("${}", i + 3)).collect();
        let sql = format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE status = 'needs_approval' \
             AND tool IN ({}) \
             AND EXISTS (SELECT 1 FROM runs r WHERE r.id = steps.run_id AND r.tenant = $1) \
             ORDER BY updated_at, id LIMIT $2",
            listed.join(", ")
        );
        let rows: Vec<StepRow> = on_pool!(self, |p| {
            let mut q = sqlx::query_as(&sql).bind(tenant).bind(limit);
            for tool in tools {
                q = q.bind(tool);
            }
            q.fetch_all(p).await?
        });
        rows.into_iter().map(Step::try_from).collect()
    }

    /// Claims the next executable step of a planned, active run for `worker` until
    /// `lease_until`: pending, due, not leased by a live worker, and every earlier step of its
    /// run done (an unknown or failed step blocks the rest); none while switch `unless_switch`
    /// (the emergency stop) is set. Returns the claimed row as the claim wrote it (no read
    /// back). Postgres claims with `FOR UPDATE SKIP LOCKED`, so workers never wait on each
    /// other; SQLite's single writer serialises the one statement.
    ///
    /// The scan walks `steps_claim` (`not_before, created_at, seq` of pending steps) in the
    /// ORDER BY's own order and stops at the first claimable row.
    ///
    /// [durability] On Postgres the claim commits without waiting for the WAL flush: a claim
    /// lost in a crash leaves its step pending and unleased (a worker takes it again), and
    /// no effect follows the claim before a synchronous commit that makes the claim durable
    /// with it: a write is taken (`running`) in a commit that waits for the flush, and WAL
    /// order puts the claim first.
    pub async fn claim_step(
        &self,
        worker: &str,
        lease_until: i64,
        unless_switch: Option<&str>,
    ) -> Result<Option<Step>, StoreError> {
        let now = self.clock.now_ms();
        let sql = self.claim_statement();
        macro_rules! claim {
            ($p:expr) => {
                sqlx::query_as::<_, StepRow>(&sql)
                    .bind(worker)
                    .bind(lease_until)
                    .bind(now)
                    .bind(unless_switch)
                    .fetch_optional($p)
                    .await?
            };
        }
        let row: Option<StepRow> = match (&self.pool, &self.lazy) {
            (Pool::Postgres(_), Some(lazy)) => claim!(lazy),
            (Pool::Postgres(p), None) => claim!(p),
            (Pool::Sqlite(p), _) => claim!(p),
        };
        row.map(Step::try_from).transpose()
    }

    /// The statement [`Store::claim_step`] runs on this store's backend (`$1` worker, `$2`
    /// lease until, `$3` now, `$4` the switch that blocks claims), for benchmarks that compare
    /// a bare loop of it with the executor.
    pub fn claim_statement(&self) -> String {
        let lock = match self.pool {
            Pool::Sqlite(_) => "",
            Pool::Postgres(_) => "FOR UPDATE OF s SKIP LOCKED",
        };
        format!(
            "UPDATE steps SET claimed_by = $1, lease_until = $2 WHERE id = (
               SELECT s.id FROM steps s JOIN runs r ON r.id = s.run_id
               WHERE s.status = 'pending' AND r.planned AND r.status = 'active'
                 AND s.not_before <= $3 AND (s.lease_until IS NULL OR s.lease_until < $3)
                 AND NOT EXISTS (SELECT 1 FROM steps e WHERE e.run_id = s.run_id
                                 AND e.seq < s.seq AND e.status <> 'done')
                 AND NOT {switched}
                 AND NOT EXISTS (SELECT 1 FROM step_duties d WHERE d.step_id = s.id
                                 AND d.review_required
                                 AND (d.reviewed_hash IS NULL OR d.reviewed_hash <> s.inputs_hash))
               ORDER BY s.not_before, s.created_at, s.seq LIMIT 1 {lock})
             RETURNING {STEP_COLUMNS}",
            switched = super::stops::switch_set_sql("$4", "r.tenant"),
        )
    }

    /// Ends `worker`'s lease on a step (after executing it, whatever the outcome).
    ///
    /// [durability] On Postgres without waiting for the WAL flush: a release lost in a crash
    /// leaves a lease that expires by itself, and only a pending step looks at leases.
    pub async fn release_step(&self, id: &str, worker: &str) -> Result<(), StoreError> {
        let sql = "UPDATE steps SET claimed_by = NULL, lease_until = NULL
                   WHERE id = $1 AND claimed_by = $2";
        match (&self.pool, &self.lazy) {
            (Pool::Postgres(_), Some(lazy)) => {
                sqlx::query(sql).bind(id).bind(worker).execute(lazy).await?;
            }
            (Pool::Postgres(p), None) => {
                sqlx::query(sql).bind(id).bind(worker).execute(p).await?;
            }
            (Pool::Sqlite(p), _) => {
                sqlx::query(sql).bind(id).bind(worker).execute(p).await?;
            }
        }
        Ok(())
    }

    /// Ends `worker`'s lease on a step and reads what settling it needs: the step, and whether
    /// every step of its run is done ([`Store::release_step`] then
    /// [`Store::step_and_run_done`], in one statement on Postgres).
    ///
    /// [durability] As [`Store::release_step`]: the release may be lost in a crash; what is
    /// read back is committed state either way.
    pub async fn release_and_settle(
        &self,
        id: &str,
        worker: &str,
    ) -> Result<(Step, bool), StoreError> {
        // `lazy` exists on Postgres only; SQLite keeps the two statements.
        let Some(lazy) = &self.lazy else {
            self.release_step(id, worker).await?;
            return self.step_and_run_done(id).await;
        };
        // Both CASEs read the row as it was: the lease is dropped only if it is still ours.
        let sql = format!(
            "UPDATE steps SET
                 claimed_by = CASE WHEN claimed_by = $2 THEN NULL ELSE claimed_by END,
                 lease_until = CASE WHEN claimed_by = $2 THEN NULL ELSE lease_until END
             WHERE id = $1
             RETURNING {STEP_COLUMNS}, {RUN_DONE}"
        );
        let row: StepAndRunDone = sqlx::query_as(&sql)
            .bind(id)
            .bind(worker)
            .fetch_one(lazy)
            .await?;
        Ok((row.step.try_into()?, row.run_done))
    }

    /// Drops any worker's lease on a step (the reconciler, after its worker vanished).
    pub async fn clear_lease(&self, id: &str) -> Result<(), StoreError> {
        on_pool!(self, |p| {
            sqlx::query("UPDATE steps SET claimed_by = NULL, lease_until = NULL WHERE id = $1")
                .bind(id)
                .execute(p)
                .await?
                .rows_affected()
        });
        Ok(())
    }

    /// Steps whose outcome must be asked of the target: `unknown` ones, and `running` ones
    /// untouched since before `stale_before` (their worker or server died mid-call), oldest
    /// first, up to `limit` of them after `after` (`(updated_at, id)` of the last one of the
    /// page before), so a pass can walk past steps it cannot settle yet.
    pub async fn steps_to_reconcile(
        &self,
        stale_before: i64,
        after: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Vec<Step>, StoreError> {
        let sql = format!(
            "SELECT {STEP_COLUMNS} FROM steps
             WHERE (status = 'unknown' OR (status = 'running' AND updated_at < $1))
               AND ($2 IS NULL OR updated_at > $2 OR (updated_at = $2 AND id > $3))
             ORDER BY updated_at, id LIMIT $4"
        );
        let (at, id) = after.map_or((None, ""), |(at, id)| (Some(at), id));
        let rows: Vec<StepRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(stale_before)
                .bind(at)
                .bind(id)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        rows.into_iter().map(Step::try_from).collect()
    }

    /// How many steps are in `status`.
    pub async fn count_steps(&self, status: StepStatus) -> Result<i64, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar("SELECT COUNT(*) FROM steps WHERE status = $1")
                .bind(status.as_str())
                .fetch_one(p)
                .await?
        }))
    }

    /// Reserves `idem_key` for `step_id`'s call, or reports who holds it. (The pipeline
    /// reserves a step's key with the transition that takes it: [`Transition::reserve`].)
    pub async fn reserve_key(
        &self,
        idem_key: &str,
        step_id: &str,
        inputs_hash: &str,
        owner: &str,
    ) -> Result<Reservation, StoreError> {
        let now = self.clock.now_ms();
        let sql = RESERVE_SQL;
        macro_rules! reserve {
            ($p:expr) => {
                sqlx::query(sql)
                    .bind(idem_key)
                    .bind(step_id)
                    .bind(inputs_hash)
                    .bind(owner)
                    .bind(now)
                    .execute($p)
                    .await?
                    .rows_affected()
            };
        }
        // [durability] On Postgres without waiting for the WAL flush: the step was taken
        // (`running`) in a flushed commit before this, and a reservation lost in a database
        // crash leaves exactly what a crash between the two leaves — a running step without a
        // key, which the reconciler asks the target about by key. Other callers see the
        // reservation as soon as it commits, so duplicates are still refused.
        let n = match (&self.pool, &self.lazy) {
            (Pool::Postgres(_), Some(lazy)) => reserve!(lazy),
            (Pool::Postgres(p), None) => reserve!(p),
            (Pool::Sqlite(p), _) => reserve!(p),
        };
        if n == 1 {
            return Ok(Reservation::Reserved);
        }
        match self.get_key(idem_key).await? {
            Some(row) => Ok(Reservation::Existing(row)),
            None => Err(StoreError::Conflict("key raced and vanished".into())),
        }
    }

    /// Takes a key over from `from` (a failed call being retried, an unknown one being
    /// reconciled) for `owner`. `false` when it is no longer in `from`.
    pub async fn take_over_key(
        &self,
        idem_key: &str,
        from: KeyState,
        owner: &str,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now_ms();
        let n = on_pool!(self, |p| {
            sqlx::query(
                "UPDATE idempotency SET state = 'in_flight', owner = $1, updated_at = $2
                 WHERE idem_key = $3 AND state = $4",
            )
            .bind(owner)
            .bind(now)
            .bind(idem_key)
            .bind(from.as_str())
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(n == 1)
    }

    /// The key's row, if reserved.
    pub async fn get_key(&self, idem_key: &str) -> Result<Option<KeyRecord>, StoreError> {
        let row: Option<KeyRow> = on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT idem_key, step_id, inputs_hash, state, result, owner, updated_at
                 FROM idempotency WHERE idem_key = $1",
            )
            .bind(idem_key)
            .fetch_optional(p)
            .await?
        });
        row.map(KeyRecord::try_from).transpose()
    }

    /// Applies `t` in one transaction: the status change (only from `t.from`), the key's new
    /// state and the audit records. `None` when the step was not in `t.from` (nothing written).
    pub async fn transition(
        &self,
        t: &Transition,
    ) -> Result<Option<(Step, Vec<AuditRecord>)>, StoreError> {
        match self.transition_records(t).await? {
            Some((records, _)) => Ok(Some((self.get_step(&t.step_id).await?, records))),
            None => Ok(None),
        }
    }

    /// [`Store::transition`] without reading the step back: `true` when it moved.
    pub async fn move_step(&self, t: &Transition) -> Result<bool, StoreError> {
        Ok(self.transition_records(t).await?.is_some())
    }

    /// [`Store::move_step`] for a transition that takes a step and reserves its key
    /// ([`Transition::reserve`]) in the same transaction: `None` when it did not move (nothing
    /// written); otherwise whether the key was reserved now — `false` means it existed
    /// already (an earlier attempt's: [`Store::get_key`] tells where it stands).
    pub async fn start_step(&self, t: &Transition) -> Result<Option<bool>, StoreError> {
        Ok(self
            .transition_records(t)
            .await?
            .map(|(_, reserved)| reserved))
    }

    async fn transition_records(
        &self,
        t: &Transition,
    ) -> Result<Option<(Vec<AuditRecord>, bool)>, StoreError> {
        retry_collisions("step transition", || self.try_transition(t)).await
    }

    async fn try_transition(
        &self,
        t: &Transition,
    ) -> Result<Option<(Vec<AuditRecord>, bool)>, StoreError> {
        if let Some(c) = &self.committer
            && let Some(done) = c
                .submit(super::group::Work::Transition(Box::new(t.clone())))
                .await
        {
            return match done? {
                super::group::Done::Moved(moved, reserved) => Ok(moved.map(|m| (m, reserved))),
                super::group::Done::Appended(_) => Err(StoreError::Conflict(
                    "committer answered out of kind".into(),
                )),
            };
        }
        self.transition_alone(t).await
    }

    /// [`Store::transition`] in its own transaction (no committer, or it has stopped).
    pub(crate) async fn transition_alone(
        &self,
        t: &Transition,
    ) -> Result<Option<(Vec<AuditRecord>, bool)>, StoreError> {
        let now = self.clock.now_ms();
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr, $insert:path) => {{
                let mut tx = $pool.begin_with($begin).await?;
                let mut head: Option<crate::audit::ChainHead> = None;
                if !t.records.is_empty() {
                    // The append lock before any row lock (see `group`): no lock cycles.
                    hold_head!(&mut *tx, $lock, &mut head);
                }
                let moved = apply_transition!(&mut *tx, $lock, &mut head, t, now);
                if let Some(records) = &moved {
                    let reserved = reserve_with!(&mut *tx, t, now);
                    $insert(&mut *tx, records).await?;
                    tx.commit().await?;
                    moved.map(|m| (m, reserved))
                } else {
                    if t.insert.is_some() {
                        // The prepared row was written (refused by the guard): keep it.
                        tx.commit().await?;
                    } else {
                        tx.rollback().await?;
                    }
                    None
                }
            }};
        }
        Ok(match &self.pool {
            Pool::Sqlite(p) => {
                run_in!(p, "BEGIN IMMEDIATE", false, crate::audit::insert_all_sqlite)
            }
            Pool::Postgres(p) => run_in!(p, "BEGIN", true, crate::audit::insert_all_pg),
        })
    }
}

impl Store {
    /// Ends run `run_id` as `status` (with `reason`) — when it is still active — and applies
    /// `cancels`, the transitions of its steps that never ran, in ONE transaction: no reader
    /// sees the run ended while one of its unstarted steps still looks runnable, nor a step
    /// cancelled under a run that still looks active. Returns whether the run was ended here
    /// and how many cancels moved their step; a cancel whose step has left its `from`
    /// statuses meanwhile writes nothing, as with [`Store::transition`].
    pub async fn end_run(
        &self,
        run_id: &str,
        status: super::RunStatus,
        reason: &str,
        cancels: &[Transition],
    ) -> Result<(bool, usize), StoreError> {
        retry_collisions("ending a run", || {
            self.try_end_run(run_id, status, reason, cancels)
        })
        .await
    }

    async fn try_end_run(
        &self,
        run_id: &str,
        status: super::RunStatus,
        reason: &str,
        cancels: &[Transition],
    ) -> Result<(bool, usize), StoreError> {
        let now = self.clock.now_ms();
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr, $insert:path) => {{
                let mut tx = $pool.begin_with($begin).await?;
                let mut head: Option<crate::audit::ChainHead> = None;
                if cancels.iter().any(|t| !t.records.is_empty()) {
                    // The append lock before any row lock (see `group`): no lock cycles.
                    hold_head!(&mut *tx, $lock, &mut head);
                }
                let ended = sqlx::query(
                    "UPDATE runs SET status = $1, reason = $2, updated_at = $3
                     WHERE id = $4 AND status = 'active'",
                )
                .bind(status.as_str())
                .bind(reason)
                .bind(now)
                .bind(run_id)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1;
                let mut moved = 0;
                let mut records = Vec::new();
                for t in cancels {
                    if let Some(sealed) = apply_transition!(&mut *tx, $lock, &mut head, t, now) {
                        moved += 1;
                        records.extend(sealed);
                    }
                }
                if !records.is_empty() {
                    $insert(&mut *tx, &records).await?;
                }
                tx.commit().await?;
                (ended, moved)
            }};
        }
        Ok(match &self.pool {
            Pool::Sqlite(p) => {
                run_in!(p, "BEGIN IMMEDIATE", false, crate::audit::insert_all_sqlite)
            }
            Pool::Postgres(p) => run_in!(p, "BEGIN", true, crate::audit::insert_all_pg),
        })
    }
}

/// Runs `attempt` up to eight times while it collides (a conflict, or SQLite busy); any other
/// outcome is returned as it is.
pub(crate) async fn retry_collisions<T, F, Fut>(what: &str, mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut last = None;
    for _ in 0..8 {
        match attempt().await {
            Err(StoreError::Conflict(msg)) => last = Some(msg),
            Err(StoreError::Database(e)) if crate::audit::is_busy(&e) => last = Some(e.to_string()),
            other => return other,
        }
    }
    Err(StoreError::Conflict(format!(
        "{what} kept colliding: {}",
        last.unwrap_or_default()
    )))
}

/// [reads] The INSERT of a prepared step's row already moved by a transition (status,
/// attempts, decision, rule, outcome, expiry, approval), written only while the transition's
/// [`RunGuard`] holds (`$24`–`$26`, as in [`transition_sql`]).
pub(crate) static INSERT_MOVED_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    INSERT_MOVED_TEMPLATE.replace(
        "{switched}",
        &super::stops::switch_set_sql("$26", "(SELECT tenant FROM runs WHERE runs.id = $2)"),
    )
});
const INSERT_MOVED_TEMPLATE: &str = "INSERT INTO steps (id, run_id, seq, role, tool, effect,
        inputs, inputs_hash, idem_key, status, attempts, reason, evidence, observed, trace_id,
        not_before, created_at, updated_at, agent_id, decision, rule, outcome, expires_at,
        approval)
     SELECT $1, $2, (SELECT COALESCE(MAX(seq), 0) + 1 FROM steps WHERE run_id = $2), $3, $4,
        $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23
      WHERE ($24 IS NULL OR EXISTS (SELECT 1 FROM runs
                WHERE runs.id = $24 AND (runs.status = 'active' OR runs.status = $25)))
        AND ($26 IS NULL OR NOT {switched})";

/// The UPDATE of a transition leaving one of `from` statuses (`$15…`); `$11`–`$13` are the
/// [`RunGuard`] (run id, its second accepted status, switch name; NULL = unchecked), `$14`
/// the worker whose lease on the step ends ([`Transition::release`]; NULL = none).
pub(crate) fn transition_sql(from: usize) -> String {
    let placeholders: Vec<String> = (0..from).map(|i| format!("${}", i + 15)).collect();
    // Both CASEs read the row as it was: the lease ends only if it is still `$14`'s.
    format!(
        "UPDATE steps SET status = COALESCE($1, status), decision = COALESCE($2, decision),
            rule = COALESCE($3, rule), outcome = COALESCE($4, outcome),
            expires_at = COALESCE($5, expires_at), approval = COALESCE($6, approval),
            attempts = attempts + $7, updated_at = $8,
            not_before = COALESCE($10, not_before),
            claimed_by = CASE WHEN claimed_by = $14 THEN NULL ELSE claimed_by END,
            lease_until = CASE WHEN claimed_by = $14 THEN NULL ELSE lease_until END
         WHERE id = $9 AND status IN ({})
           AND ($11 IS NULL OR EXISTS (SELECT 1 FROM runs
                WHERE runs.id = $11 AND (runs.status = 'active' OR runs.status = $12)))
           AND ($13 IS NULL OR NOT {})",
        if placeholders.is_empty() {
            "NULL".to_string()
        } else {
            placeholders.join(", ")
        },
        super::stops::switch_set_sql(
            "$13",
            "(SELECT tenant FROM runs WHERE runs.id = steps.run_id)"
        )
    )
}

/// Applies transition `$t` inside open transaction `$tx` at time `$now`: the status change
/// (only from `t.from`), the key and the records (sealed at `$head`, an
/// `&mut Option<ChainHead>` taken with `hold_head!` when first needed). Evaluates to
/// `Some(records)`, or `None` when the step was not in `t.from` (nothing written). The
/// records are sealed, not yet inserted: the caller inserts them before its COMMIT.
macro_rules! apply_transition {
    ($tx:expr, $lock:expr, $head:expr, $t:expr, $now:expr) => {{
        let t: &$crate::store::Transition = $t;
        let now: i64 = $now;
        let n: u64 = match &t.insert {
            Some(step) => {
                let step: &$crate::store::Step = step;
                let n = sqlx::query($crate::store::steps::INSERT_MOVED_SQL.as_str())
                    .bind(&step.id)
                    .bind(&step.run_id)
                    .bind(&step.role)
                    .bind(&step.tool)
                    .bind(step.effect.as_str())
                    .bind(&step.inputs)
                    .bind(&step.inputs_hash)
                    .bind(&step.idem_key)
                    .bind(t.to.unwrap_or(step.status).as_str())
                    .bind(i64::from(t.bump_attempts))
                    .bind(&step.reason)
                    .bind(&step.evidence)
                    .bind(&step.observed)
                    .bind(&step.trace_id)
                    .bind(t.not_before.unwrap_or(step.not_before))
                    .bind(step.created_at)
                    .bind(now)
                    .bind(&step.agent_id)
                    .bind(&t.decision)
                    .bind(&t.rule)
                    .bind(&t.outcome)
                    .bind(t.expires_at)
                    .bind(&t.approval)
                    .bind(t.guard.as_ref().map(|g| g.run_id.as_str()))
                    .bind(
                        t.guard
                            .as_ref()
                            .and_then(|g| g.allow_failed.then_some("failed")),
                    )
                    .bind(t.guard.as_ref().and_then(|g| g.unless_switch.as_deref()))
                    .execute(&mut *$tx)
                    .await?
                    .rows_affected();
                if n != 1 {
                    // Refused by the guard: the row as prepared, for the caller to record.
                    $crate::store::steps::prepared_insert!(
                        sqlx::query($crate::store::steps::PREPARED_INSERT_SQL),
                        step
                    )
                    .execute(&mut *$tx)
                    .await?;
                }
                n
            }
            None => {
                let sql = $crate::store::steps::transition_sql(t.from.len());
                let mut q = sqlx::query(&sql)
                    .bind(t.to.map(|s| s.as_str()))
                    .bind(&t.decision)
                    .bind(&t.rule)
                    .bind(&t.outcome)
                    .bind(t.expires_at)
                    .bind(&t.approval)
                    .bind(i64::from(t.bump_attempts))
                    .bind(now)
                    .bind(&t.step_id)
                    .bind(t.not_before)
                    .bind(t.guard.as_ref().map(|g| g.run_id.as_str()))
                    .bind(
                        t.guard
                            .as_ref()
                            .and_then(|g| g.allow_failed.then_some("failed")),
                    )
                    .bind(t.guard.as_ref().and_then(|g| g.unless_switch.as_deref()))
                    .bind(t.release.as_deref());
                for f in &t.from {
                    q = q.bind(f.as_str());
                }
                q.execute(&mut *$tx).await?.rows_affected()
            }
        };
        if n != 1 {
            None
        } else {
            if let Some((state, result)) = &t.key {
                sqlx::query(
                    "UPDATE idempotency SET state = $1, result = COALESCE($2, result),
                        updated_at = $3
                     WHERE step_id = $4",
                )
                .bind(state.as_str())
                .bind(result)
                .bind(now)
                .bind(&t.step_id)
                .execute(&mut *$tx)
                .await?;
            }
            Some($crate::store::steps::seal_records!(
                $tx, $lock, $head, t, now
            ))
        }
    }};
}
pub(crate) use apply_transition;

/// The INSERT of a key reserved with its step's transition ([`Transition::reserve`]); a key
/// that exists is left as it is.
pub(crate) const RESERVE_SQL: &str = "INSERT INTO idempotency (idem_key, step_id, inputs_hash,
        state, result, owner, created_at, updated_at)
     VALUES ($1, $2, $3, 'in_flight', NULL, $4, $5, $5)
     ON CONFLICT (idem_key) DO NOTHING";

/// Inside open transaction `$tx`, after transition `$t` moved its step: reserves its key if it
/// asks to ([`Transition::reserve`]). Evaluates to whether a key was reserved now (`false`
/// without a claim or when the key existed).
macro_rules! reserve_with {
    ($tx:expr, $t:expr, $now:expr) => {{
        let t: &$crate::store::Transition = $t;
        match &t.reserve {
            Some(k) => {
                sqlx::query($crate::store::steps::RESERVE_SQL)
                    .bind(&k.idem_key)
                    .bind(&t.step_id)
                    .bind(&k.inputs_hash)
                    .bind(&k.owner)
                    .bind($now)
                    .execute(&mut *$tx)
                    .await?
                    .rows_affected()
                    == 1
            }
            None => false,
        }
    }};
}
pub(crate) use reserve_with;

/// Seals a moved transition `$t`'s records at the chain head `$head` (taken with `hold_head!`
/// when first needed), in order, at time `$now`; evaluates to the sealed records (not yet
/// inserted).
macro_rules! seal_records {
    ($tx:expr, $lock:expr, $head:expr, $t:expr, $now:expr) => {{
        let t: &$crate::store::Transition = $t;
        let mut records = Vec::with_capacity(t.records.len());
        for (event, new) in &t.records {
            let head = $crate::audit::hold_head!($tx, $lock, $head);
            records.push($crate::audit::seal_next!(head, new, *event, $now));
        }
        records
    }};
}
pub(crate) use seal_records;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedupe_separates_runs_tools_and_inputs() {
        let a = InputsHash::of(&CanonicalJson::from_value(&serde_json::json!({"x": 1})).unwrap());
        let b = InputsHash::of(&CanonicalJson::from_value(&serde_json::json!({"x": 2})).unwrap());
        let base = dedupe_of("r1", "t", &a);
        assert_eq!(base, dedupe_of("r1", "t", &a));
        assert_ne!(base, dedupe_of("r2", "t", &a));
        assert_ne!(base, dedupe_of("r1", "u", &a));
        assert_ne!(base, dedupe_of("r1", "t", &b));
    }
}
