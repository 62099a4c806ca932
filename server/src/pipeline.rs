//! The call pipeline (DESIGN §5): one code path from a proposed tool call to its outcome.
//!
//! listing → schema → canonicalise, hash, resolve or open the step (its key derived here) →
//! policy (decided again every time) → gate → key reservation → adapter → outcome, with the
//! step's status, the key's stored result and the audit records committed together.
//!
//! Invariants:
//! * A tool the caller's role does not list does not exist for it ([`Answer::UnknownTool`],
//!   the same for a tool that exists nowhere).
//! * No adapter runs unless the arguments fit the closed schema, policy allows the call, and —
//!   where approval is required — an approval bound to exactly these inputs hash is valid now.
//! * A write runs at most once per key: the key is reserved (unique row) before the adapter
//!   is called, and every later identical call gets the stored outcome. Keys are derived by
//!   Countersign; a key a client supplies is ignored.
//! * A timed-out irreversible call becomes `unknown` and is never retried blind.
//! * Every outcome appends audit records before the caller hears it; if recording fails the
//!   call fails closed. Agents never see internal errors, only "internal error".

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::policy::{
    ApprovalState, Principal, PrincipalKind, Request, ResourceFact, TaskOrigin,
};
use countersign_core::redact::{HASH_PREFIX, RedactionKey};
use countersign_core::registry::Tool;
use countersign_core::store::{
    AgentCredential, AuthError, CallContext, KeyClaim, KeyState, NewRun, NewStep, Run, RunGuard,
    RunStatus, Step, StepDuties, Transition,
};
use countersign_core::{
    CanonicalJson, Decision, Effect, Gate, InputsHash, RoleName, Rule, StepStatus, StoreError,
};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::adapters::{AdapterError, Invocation};
pub use crate::provenance::{Provenance, traceparent_trace_id};
use crate::registry::Loaded;

/// The same step (key) asked for with other inputs.
pub const IDEMPOTENCY_MISMATCH: &str = "idempotency.mismatch";
/// `_meta.step_id` names no step of this run and tool.
pub const STEP_UNKNOWN: &str = "step.unknown";
/// A direct write named a planned run: its writes run through its plan only.
pub const PLANNED_RUN: &str = "run.planned";
/// The gate's window closed before anyone approved.
pub const APPROVAL_EXPIRED: &str = "approval.expired";
/// An irreversible call got no answer in time: reconcile, never retry.
pub const TARGET_TIMEOUT: &str = "target.timeout";
/// The target did not complete the call.
pub const TARGET_FAILED: &str = "target.failed";
/// A step the emergency stop kept from starting.
pub const STOP_RULE: &str = "emergency.stop";
/// A planned step's agent credential was revoked before the step started.
pub const AGENT_REVOKED: &str = "agent.revoked";
/// A planned step's agent credential expired before the step started.
pub const AGENT_EXPIRED: &str = "agent.expired";
/// A planned step of a tool that asks for review was not reviewed for these inputs.
pub const REVIEW_REQUIRED: &str = "review.required";
/// A planned step's credential is not of its role (or of its run): nothing swaps a role in.
pub const CREDENTIAL_ROLE: &str = "agent.role_mismatch";

/// How long one adapter call may take before it counts as timed out.
pub const ADAPTER_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a caller waits for an identical call already in flight before it is told so.
pub const IN_FLIGHT_WAIT: Duration = Duration::from_secs(30);
/// Executions of one step, at most (retryable failures only).
pub const MAX_ATTEMPTS: i64 = 4;

/// Who is calling: an authenticated agent, and its MCP session if it has one.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The credential the request authenticated with.
    pub credential: AgentCredential,
    /// The MCP session id, when the transport has one.
    pub session: Option<String>,
    /// The executor worker running a planned step on the credential's behalf, if any.
    pub executor: Option<String>,
    /// What the `/mcp` guard read with the authentication, if anything.
    pub admission: Option<crate::mcp::guard::Admission>,
}

/// One proposed call.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// Tool name as the caller gave it.
    pub tool: String,
    /// Arguments as given.
    pub arguments: Map<String, Value>,
    /// `_meta.run_id`: used only when the caller's credential owns that run.
    pub run_id: Option<String>,
    /// `_meta.step_id`: the step this call means (its state is reported; different inputs
    /// are refused as `idempotency.mismatch`).
    pub step_id: Option<String>,
    /// What the agent says about itself (`_meta.model`, `_meta.prompt_revision`) and the
    /// W3C `traceparent` it sent, if any.
    pub provenance: Provenance,
}

/// What the caller hears.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The tool does not exist for this role.
    UnknownTool,
    /// A tool result: `error` = refused or failed; `structured` = the structured content.
    Result {
        /// Whether the result is an error result.
        error: bool,
        /// Structured content.
        structured: Value,
    },
}

/// An internal failure; the caller only ever hears "internal error".
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Internal(String);

impl From<StoreError> for Internal {
    fn from(e: StoreError) -> Self {
        Internal(format!("store: {e}"))
    }
}

fn ok(structured: Value) -> Answer {
    Answer::Result {
        error: false,
        structured,
    }
}

fn err(structured: Value) -> Answer {
    Answer::Result {
        error: true,
        structured,
    }
}

/// Everything one call works with.
struct Ctx<'a> {
    state: &'a AppState,
    caller: &'a Caller,
    loaded: &'a Loaded,
    tool: &'a Tool,
    /// This attempt's id: the owner of the key it reserves (never shared by two attempts).
    trace_id: String,
    /// The action's trace id, shared by every record from proposal to outcome and sent to
    /// the target: the client's `traceparent` trace id, the planned step's, or new.
    trace: String,
    /// What the caller declared about itself.
    provenance: Provenance,
    /// Set when this call's closing transition moved the step to `done` and ended the
    /// executor's lease with it ([`execute_claimed_in`]).
    closed_done: Option<&'a AtomicBool>,
}

impl Ctx<'_> {
    fn actor(&self) -> String {
        let c = &self.caller.credential;
        match &self.caller.executor {
            Some(w) => format!(
                "executor:{w} agent:{} role:{} tenant:{}",
                c.id, c.role, c.tenant
            ),
            None => format!("agent:{} role:{} tenant:{}", c.id, c.role, c.tenant),
        }
    }

    fn record(
        &self,
        event: AuditEvent,
        step: Option<&Step>,
        rule: Option<&str>,
        detail: Map<String, Value>,
    ) -> (AuditEvent, NewAuditRecord) {
        let mut detail = detail;
        detail
            .entry("trace_id")
            .or_insert_with(|| json!(self.trace));
        (
            event,
            NewAuditRecord {
                event: Some(event),
                run_id: step.map(|s| s.run_id.clone()),
                step_id: step.map(|s| s.id.clone()),
                tool: Some(self.tool.name.as_str().to_string()),
                actor: Some(self.actor()),
                rule: rule.map(str::to_string),
                detail,
            },
        )
    }

    async fn append(&self, record: (AuditEvent, NewAuditRecord)) -> Result<(), Internal> {
        self.state.store.append_audit(&record.1).await?;
        Ok(())
    }

    /// [`Ctx::transition`] without reading the step back: `true` when it moved.
    async fn moved(&self, t: Transition) -> Result<bool, Internal> {
        Ok(self.state.store.move_step(&t).await?)
    }

    /// Moves `step` (from one of `from`) with `records`; `None` when it had moved already.
    async fn transition(&self, t: Transition) -> Result<Option<Step>, Internal> {
        Ok(self.state.store.transition(&t).await?.map(|(s, _)| s))
    }
}

fn detail(pairs: &[(&str, Value)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

/// At most 128 characters of caller-supplied text, for the audit record.
fn bounded(text: &str) -> String {
    text.chars().take(128).collect()
}

/// Runs one call through the pipeline, and counts it for `/metrics`.
pub async fn call(
    state: &AppState,
    caller: &Caller,
    request: CallRequest,
) -> Result<Answer, Internal> {
    let began = Instant::now();
    let tool = bounded(&request.tool);
    let answer = call_inner(state, caller, request).await;
    let (tool, decision, outcome) = match &answer {
        Err(_) => (tool, "error", "internal_error".to_string()),
        Ok(Answer::UnknownTool) => ("<unlisted>".to_string(), "refuse", "unknown_tool".into()),
        Ok(Answer::Result { error, structured }) => {
            // Only the gateway's own statuses count: a tool's result may carry a `status`.
            let status = structured
                .get("status")
                .and_then(Value::as_str)
                .filter(|s| *error || ["needs_approval", "in_flight", "unknown"].contains(s));
            let decision = match status {
                Some("denied") => "deny",
                Some("invalid") => "schema",
                Some("needs_approval") | Some("expired") => "require_approval",
                Some("refused") => "refuse",
                _ => "allow",
            };
            let outcome = match (status, error) {
                (Some(s), _) => s.to_string(),
                (None, false) => "done".to_string(),
                (None, true) => "failed".to_string(),
            };
            (tool, decision, outcome)
        }
    };
    state
        .metrics
        .observe_call(&tool, decision, &outcome, began.elapsed());
    answer
}

async fn call_inner(
    state: &AppState,
    caller: &Caller,
    request: CallRequest,
) -> Result<Answer, Internal> {
    let credential = &caller.credential;
    let actor = format!(
        "agent:{} role:{} tenant:{}",
        credential.id, credential.role, credential.tenant
    );
    // 2. The role's listing: unknown and unlisted are the same answer (and the same record).
    let loaded = state.registry.current();
    let role = RoleName::parse(&credential.role).ok();
    let tool = match (&loaded, &role) {
        (Some(l), Some(r)) => l.bundle.registry.tool_for_role(r, &request.tool),
        _ => None,
    };
    let (Some(loaded), Some(tool)) = (loaded.as_deref(), tool) else {
        let record = NewAuditRecord {
            event: Some(AuditEvent::Refused),
            run_id: None,
            step_id: None,
            tool: None,
            actor: Some(actor),
            rule: Some(Rule::TOOL_NOT_LISTED.as_str().into()),
            detail: detail(&[("requested_tool", json!(bounded(&request.tool)))]),
        };
        state.store.append_audit(&record).await?;
        return Ok(Answer::UnknownTool);
    };
    let ctx = Ctx {
        state,
        caller,
        loaded,
        tool,
        trace_id: uuid::Uuid::new_v4().to_string(),
        trace: request
            .provenance
            .trace_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        provenance: request.provenance.clone(),
        closed_done: None,
    };

    // 3. The closed schema, before anything else looks at the arguments.
    let arguments = Value::Object(request.arguments.clone());
    if let Err(errors) = loaded.bundle.registry.validate(&tool.name, &arguments) {
        return refuse_invalid(&ctx, schema_errors(&errors)).await;
    }

    // 4. Canonical form, its hash, the run and the step (whose key is derived on opening).
    let canonical = match CanonicalJson::from_value(&arguments) {
        Ok(c) => c,
        Err(e) => {
            return refuse_invalid(&ctx, vec![json!({"path": "", "message": e.to_string()})]).await;
        }
    };
    let inputs_hash = InputsHash::of(&canonical);
    let run = resolve_run(&ctx, request.run_id.as_deref()).await?;
    // A planned run's writes run through its plan, in its order, by the executor (which starts
    // them with `execute_claimed_in`, never through here): a direct write naming the run would
    // add a step the plan never had, or run a planned one out of turn, outside the run's bounds
    // and settling. Reads may gather evidence there; Countersign's own run tools are not the
    // run's writes.
    if run.planned
        && tool.effect != Effect::Read
        && tool.handler.provider.as_str() != crate::runs::PROVIDER
    {
        let mut record = ctx.record(AuditEvent::Refused, None, Some(PLANNED_RUN), Map::new());
        record.1.run_id = Some(run.id.clone());
        ctx.append(record).await?;
        return Ok(err(json!({
            "status": "refused",
            "rule": PLANNED_RUN,
            "run_id": run.id,
            "message": "a planned run's writes run through its plan: submit a plan (plan.submit)",
        })));
    }
    if let Some(step_id) = &request.step_id {
        match state.store.get_step(step_id).await {
            Ok(step) if step.run_id == run.id && step.tool == tool.name.as_str() => {
                if step.inputs_hash != inputs_hash.to_string() {
                    let record = ctx.record(
                        AuditEvent::Refused,
                        Some(&step),
                        Some(IDEMPOTENCY_MISMATCH),
                        detail(&[
                            ("inputs_hash", json!(inputs_hash.to_string())),
                            ("step_inputs_hash", json!(step.inputs_hash)),
                        ]),
                    );
                    ctx.append(record).await?;
                    return Ok(err(json!({
                        "status": "refused",
                        "rule": IDEMPOTENCY_MISMATCH,
                        "step_id": step.id,
                        "message": "this step was proposed with other inputs",
                    })));
                }
            }
            Ok(_) | Err(StoreError::NotFound) => {
                let record = ctx.record(
                    AuditEvent::Refused,
                    None,
                    Some(STEP_UNKNOWN),
                    detail(&[("requested_step", json!(bounded(step_id)))]),
                );
                ctx.append(record).await?;
                return Ok(err(json!({
                    "status": "refused",
                    "rule": STEP_UNKNOWN,
                    "message": "no such step in this run for this tool",
                })));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let new_step = NewStep {
        run_id: run.id.clone(),
        role: credential.role.clone(),
        tool: tool.name.as_str().to_string(),
        effect: tool.effect,
        inputs: canonical.clone(),
        agent_id: Some(credential.id.clone()),
        // The proposer's reason: a direct call states it in its `reason` argument.
        reason: arguments
            .get("reason")
            .and_then(Value::as_str)
            .map(|r| r.chars().take(400).collect())
            .unwrap_or_default(),
        evidence: Vec::new(),
        observed: None,
        trace_id: ctx.trace.clone(),
        status: StepStatus::Pending,
    };
    // [reads] A read's row is written with its outcome (or when it is parked or refused
    // first): no row is opened before it runs. A write opens its row, the key's owner.
    if tool.effect == Effect::Read {
        // [gate] A gated read repeated in its run continues the step its first call parked
        // (so an approval of it can be used); ungated reads never look.
        if tool.gate != Gate::Never {
            let hash = InputsHash::of(&canonical).to_string();
            if let Some(step) = state
                .store
                .gated_read(
                    &run.id,
                    &credential.id,
                    &credential.role,
                    tool.name.as_str(),
                    &hash,
                )
                .await?
            {
                if step.status == StepStatus::NeedsApproval
                    && step
                        .expires_at
                        .is_some_and(|at| state.store.clock().now_ms() < at)
                {
                    return Ok(waiting(&step));
                }
                return execute(&ctx, &run, step, false, true, &canonical).await;
            }
        }
        let step = state.store.prepare_read(&new_step)?;
        return execute(&ctx, &run, step, true, false, &canonical).await;
    }
    let (step, created) = state.store.open_step(&new_step).await?;
    if !created && let Some(answer) = replay(&ctx, &step).await? {
        return Ok(answer);
    }
    execute(&ctx, &run, step, created, true, &canonical).await
}

/// The run this call belongs to: the caller's own run named in `_meta.run_id`, else the run
/// of its MCP session (or of its direct calls when it has no session).
async fn resolve_run(ctx: &Ctx<'_>, requested: Option<&str>) -> Result<Run, Internal> {
    let credential = &ctx.caller.credential;
    if let Some(id) = requested {
        match ctx.state.store.get_run(id).await {
            Ok(run) if run.agent_id.as_deref() == Some(credential.id.as_str()) => return Ok(run),
            Ok(_) | Err(StoreError::NotFound) => {
                tracing::info!(agent = %credential.id, "ignoring _meta.run_id the caller does not own");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let mut h = Sha256::new();
    h.update(credential.id.as_bytes());
    h.update([0]);
    h.update(ctx.caller.session.as_deref().unwrap_or("direct").as_bytes());
    let session_key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let task = match &ctx.caller.session {
        Some(_) => format!("MCP session of agent {}", credential.name),
        None => format!("direct calls of agent {}", credential.name),
    };
    let run = ctx
        .state
        .store
        .session_run(
            &session_key,
            &NewRun {
                tenant: credential.tenant.clone(),
                principal: format!("agent:{}", credential.id),
                agent_id: Some(credential.id.clone()),
                task,
                // The operator's word on where this agent's tasks come from; never the model's.
                origin: credential.origin.clone(),
                planned: false,
            },
        )
        .await?;
    if let Some(key) = ctx
        .caller
        .admission
        .as_ref()
        .and_then(|a| a.hint_key.as_deref())
    {
        ctx.state
            .store
            .remember_call_hint(key, &credential.id, &run.id);
    }
    Ok(run)
}

/// An identical write already has a step: answer with where it stands, or `None` to carry on
/// through the pipeline (a pending step, or a failed one that may be retried).
async fn replay(ctx: &Ctx<'_>, step: &Step) -> Result<Option<Answer>, Internal> {
    let now = ctx.state.store.clock().now_ms();
    let answer = match step.status {
        StepStatus::Pending => return Ok(None),
        StepStatus::Failed => {
            let key = ctx.state.store.get_key(&step.idem_key).await?;
            let retryable = key.as_ref().is_none_or(|k| k.state == KeyState::Failed);
            if retryable && step.attempts < MAX_ATTEMPTS {
                return Ok(None);
            }
            stored_outcome(step)
        }
        StepStatus::NeedsApproval => {
            if step.expires_at.is_some_and(|at| now >= at) {
                let record = ctx.record(
                    AuditEvent::Expired,
                    Some(step),
                    Some(APPROVAL_EXPIRED),
                    Map::new(),
                );
                ctx.transition(Transition {
                    step_id: step.id.clone(),
                    from: vec![StepStatus::NeedsApproval],
                    to: Some(StepStatus::Expired),
                    rule: Some(APPROVAL_EXPIRED.to_string()),
                    records: vec![record],
                    ..Transition::default()
                })
                .await?;
                return Ok(Some(expired(step)));
            }
            waiting(step)
        }
        StepStatus::Running => return Ok(Some(await_key(ctx, step).await?)),
        StepStatus::Done | StepStatus::Refused | StepStatus::Unknown => stored_outcome(step),
        StepStatus::Expired => expired(step),
        StepStatus::Cancelled => err(json!({"status": "cancelled", "step_id": step.id})),
    };
    let record = ctx.record(
        AuditEvent::Proposed,
        Some(step),
        step.rule.as_deref(),
        detail(&[
            ("replay", json!(true)),
            ("status", json!(step.status.as_str())),
        ]),
    );
    ctx.append(record).await?;
    Ok(Some(answer))
}

fn waiting(step: &Step) -> Answer {
    ok(json!({
        "status": "needs_approval",
        "step_id": step.id,
        "expires_at": step.expires_at.map(rfc3339),
        "rule": step.rule,
    }))
}

fn expired(step: &Step) -> Answer {
    err(json!({"status": "expired", "step_id": step.id, "rule": APPROVAL_EXPIRED}))
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// The stored outcome of a finished step, as the caller first heard it.
pub fn stored_outcome(step: &Step) -> Answer {
    let parsed = step
        .outcome
        .as_deref()
        .and_then(|o| serde_json::from_str::<Value>(o).ok());
    match parsed {
        Some(Value::Object(mut o)) => {
            let error = o.remove("error").and_then(|e| e.as_bool()).unwrap_or(false);
            let structured = o.remove("answer").unwrap_or(Value::Null);
            Answer::Result { error, structured }
        }
        _ => match step.status {
            StepStatus::Unknown => ok(json!({"status": "unknown", "step_id": step.id})),
            _ => err(json!({"status": step.status.as_str(), "step_id": step.id,
                            "rule": step.rule})),
        },
    }
}

/// The text stored in `steps.outcome` for `answer`.
fn outcome_text(answer: &Answer) -> Option<String> {
    match answer {
        Answer::Result { error, structured } => {
            Some(json!({"error": error, "answer": structured}).to_string())
        }
        Answer::UnknownTool => None,
    }
}

/// Waits for the holder of `step`'s key to finish, then answers with its outcome.
async fn await_key(ctx: &Ctx<'_>, step: &Step) -> Result<Answer, Internal> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        let now = ctx.state.store.get_step(&step.id).await?;
        match now.status {
            StepStatus::Running | StepStatus::Pending if started.elapsed() < IN_FLIGHT_WAIT => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            StepStatus::Running | StepStatus::Pending => {
                return Ok(ok(json!({"status": "in_flight", "step_id": step.id})));
            }
            _ => return Ok(stored_outcome(&now)),
        }
    }
}

/// Resource facts for the records the arguments point at, from the tool's provider.
async fn resource_facts(ctx: &Ctx<'_>, canonical: &Value) -> Result<Vec<ResourceFact>, Internal> {
    let Some(adapter) = ctx.loaded.adapters.get(ctx.tool.handler.provider.as_str()) else {
        return Ok(Vec::new());
    };
    let mut facts = Vec::new();
    for (field, kind) in &ctx.tool.resources {
        // [stillon] ids may be integers (`reservation_id: 8472`), not only strings.
        let Some(id) = canonical.get(field).and_then(resource_id) else {
            continue;
        };
        let id = id.as_str();
        match adapter.facts(kind, id).await {
            Ok(Some(fact)) => facts.push(fact),
            Ok(None) => {}
            Err(e) => return Err(Internal(format!("resource facts for {kind} {id}: {e}"))),
        }
    }
    Ok(facts)
}

/// A resource id argument as text: a string, or an integer (`8472`).
pub fn resource_id(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

fn decision_text(d: &Decision) -> (&'static str, String) {
    match d {
        Decision::Allow => ("allow", "policy.allow".to_string()),
        Decision::AllowWithinAuthorization(id) => {
            ("allow_within_authorization", format!("authorization:{id}"))
        }
        Decision::RequireApproval(rule) => ("require_approval", rule.as_str().to_string()),
        Decision::Deny(rule) => ("deny", rule.as_str().to_string()),
    }
}

/// Steps 5–12 for a step that may run: policy, gate, key, adapter, outcome.
/// Runs `step` through policy, gate, key and adapter. `fresh`: the step was made by this
/// very call (so no approval can name it yet). `written`: its row exists; a prepared read's
/// (`false`, [`Store::prepare_read`]) is written by its closing transition, or here first
/// when it is parked or refused before it runs.
async fn execute(
    ctx: &Ctx<'_>,
    run: &Run,
    step: Step,
    fresh: bool,
    written: bool,
    canonical: &CanonicalJson,
) -> Result<Answer, Internal> {
    let store = &ctx.state.store;
    let credential = &ctx.caller.credential;

    // [stop] A step starts only in an active run and while the emergency stop is off; the
    // run's status is read now, not when the call began (a cancel may have raced it).
    // Compensations run in the run that failed (that is why they run); Countersign's own run
    // tools (plan.submit, run.status, run.cancel, reviews) start nothing, so a stop leaves
    // agents able to look and to cancel. [reads] A read's closing write checks the same
    // conditions again ([`halt_guard`]): a read that raced a cancel or a stop is answered
    // `cancelled`, its result withheld.
    // One read of the world for this call: the run's status, the stop, the party the
    // credential acts for and the grants it holds ([stillon] seed 004: ownership and the
    // ≤ 30-minute grant are checked against the traveller).
    let prefetched = ctx
        .caller
        .admission
        .as_ref()
        .and_then(|a| a.prefetched.as_ref())
        .filter(|(run_id, _)| *run_id == run.id)
        .map(|(_, context)| context.clone());
    let world = match prefetched {
        Some(world) => world,
        None => {
            store
                .call_context(
                    &run.id,
                    crate::stop::EMERGENCY_STOP,
                    &credential.tenant,
                    // An execution credential acts for whoever its run's planner acts for now.
                    match (&credential.run_id, &run.agent_id) {
                        (Some(_), Some(planner)) => planner,
                        _ => &credential.id,
                    },
                    store.clock().now_ms(),
                )
                .await?
        }
    };
    if let Some(rule) = halt_rule(
        &halt_guard(ctx, &run.id),
        world.run_status,
        world.switch_set,
    ) {
        let step = write_prepared(ctx, step, written).await?;
        return cancel_halted(ctx, &step, rule).await;
    }
    let arguments = canonical
        .to_value()
        .map_err(|e| Internal(format!("canonical arguments: {e}")))?;

    // 5. Policy, decided here whatever was decided before.
    let resources = resource_facts(ctx, &arguments).await?;
    let role = RoleName::parse(&credential.role).map_err(|e| Internal(e.to_string()))?;
    let Some(facts) = ctx.loaded.bundle.tool_facts(&role, ctx.tool.name.as_str()) else {
        return Err(Internal(format!(
            "listed tool {} has no policy facts",
            ctx.tool.name
        )));
    };
    let rules = gate_rules(ctx.tool, &arguments);
    let approval = if fresh {
        None
    } else {
        store
            .valid_approval(&step, canonical, rules.approvals_needed)
            .await?
    };
    // The run's origin, or the credential's when that is now `external` (an operator who
    // learns the agent reads inbound content says so once, for its open session runs too;
    // a planned step keeps the origin its planner had at submission); a text that is no
    // origin is read as `external`, the least trusted (fail closed).
    let origin = match (
        TaskOrigin::parse(&run.origin),
        TaskOrigin::parse(&ctx.caller.credential.origin),
    ) {
        (_, Some(TaskOrigin::External) | None) | (None, _) => TaskOrigin::External,
        (Some(origin), Some(_)) => origin,
    };
    let (acts_for, authorizations) = (world.party, world.grants);
    let report = ctx.loaded.bundle.policy.decide(&Request {
        principal: Principal {
            kind: PrincipalKind::Agent,
            id: credential.id.clone(),
            role: credential.role.clone(),
            tenant: credential.tenant.clone(),
            acts_for: acts_for.clone(),
        },
        tool: facts,
        schema_errors: Vec::new(),
        arguments: arguments.clone(),
        resources,
        task_origin: origin,
        approval: if approval.is_some() {
            ApprovalState::Approved
        } else {
            ApprovalState::None
        },
        now: store.clock().now(),
        authorizations,
    });
    if !report.errors.is_empty() {
        tracing::warn!(tool = %ctx.tool.name, errors = ?report.errors, "policy evaluation errors");
    }
    let (decision, rule) = decision_text(&report.decision);
    let decided = ctx.record(
        AuditEvent::Decided,
        Some(&step),
        Some(&rule),
        detail(&[
            ("decision", json!(decision)),
            ("inputs", audit_inputs(ctx.state, ctx.tool, &arguments)),
            ("inputs_hash", json!(step.inputs_hash)),
            ("idem_key", json!(step.idem_key)),
            ("effect", json!(ctx.tool.effect.as_str())),
            ("policy_ids", json!(report.policy_ids)),
            ("registry_version", json!(ctx.loaded.version)),
            ("task_origin", json!(origin.as_str())),
            ("declared", ctx.provenance.declared().unwrap_or(Value::Null)),
        ]),
    );
    // Only from the status this caller read (`pending`, or `failed` when `replay` found it
    // retryable): a caller holding a stale copy never moves a step another attempt has ended
    // meanwhile (a failure that may not be retried stays failed; `settle` reports it).
    let movable = vec![step.status];

    // A prepared read that is refused or parked is written now (it does not run).
    let stops_here = match &report.decision {
        Decision::Deny(_) => true,
        Decision::RequireApproval(_) => approval.is_none(),
        Decision::Allow | Decision::AllowWithinAuthorization(_) => false,
    };
    let (step, written) = if stops_here {
        (write_prepared(ctx, step, written).await?, true)
    } else {
        (step, written)
    };

    // Deny: the step is refused for good.
    if let Decision::Deny(deny) = &report.decision {
        let answer = err(json!({"status": "denied", "rule": deny.as_str(), "step_id": step.id}));
        let moved = ctx
            .moved(Transition {
                step_id: step.id.clone(),
                from: movable,
                to: Some(StepStatus::Refused),
                decision: Some(decision.into()),
                rule: Some(rule.clone()),
                outcome: outcome_text(&answer),
                records: vec![decided],
                ..Transition::default()
            })
            .await?;
        return if moved {
            Ok(answer)
        } else {
            settle(ctx, &step).await
        };
    }

    // 6. Gate: park unless an approval binds exactly these inputs. A gate's window opens
    // once per step and never reopens: past it, the step expires (fail closed).
    if let Decision::RequireApproval(gate_rule) = &report.decision
        && approval.is_none()
        && step
            .expires_at
            .is_some_and(|at| store.clock().now_ms() >= at)
    {
        let record = ctx.record(
            AuditEvent::Expired,
            Some(&step),
            Some(APPROVAL_EXPIRED),
            detail(&[("gate_rule", json!(gate_rule.as_str()))]),
        );
        ctx.transition(Transition {
            step_id: step.id.clone(),
            from: movable,
            to: Some(StepStatus::Expired),
            rule: Some(APPROVAL_EXPIRED.to_string()),
            records: vec![decided, record],
            ..Transition::default()
        })
        .await?;
        return Ok(expired(&step));
    }
    if let Decision::RequireApproval(gate_rule) = &report.decision
        && approval.is_none()
    {
        // The window opened when the step first reached its gate stays what it was: a step
        // parked again (its approval ended with a batch grant) gets no new one.
        let expires_at = step.expires_at.unwrap_or_else(|| {
            store.clock().now_ms()
                + i64::try_from(ctx.tool.approval_expiry().as_secs())
                    .unwrap_or(i64::MAX / 2_000)
                    .saturating_mul(1000)
        });
        let waiting_record = ctx.record(
            AuditEvent::WaitingApproval,
            Some(&step),
            Some(gate_rule.as_str()),
            detail(&[("expires_at", json!(expires_at))]),
        );
        let moved = ctx
            .transition(Transition {
                step_id: step.id.clone(),
                from: movable,
                to: Some(StepStatus::NeedsApproval),
                decision: Some(decision.into()),
                rule: Some(rule.clone()),
                expires_at: Some(expires_at),
                records: vec![decided, waiting_record],
                ..Transition::default()
            })
            .await?;
        return match moved {
            Some(step) => {
                // Only a run that goes on invites a person to the inbox: a gate in a failed
                // run is a compensation's, cancelled at once and escalated (its own notice).
                if run.status != RunStatus::Failed {
                    crate::notify::gate_opened(ctx.state, &step);
                }
                Ok(waiting(&step))
            }
            None => settle(ctx, &step).await,
        };
    }

    // 7. Take the step (pending|failed → running: the step row is the mutex among callers
    // and workers) and reserve its key, in one transaction: a step is never running without
    // its key (a crash after it leaves both, which the reconciler settles by key).
    let started_record = ctx.record(
        AuditEvent::Started,
        Some(&step),
        Some(&rule),
        detail(&[
            ("idem_key", json!(step.idem_key)),
            ("trace_id", json!(ctx.trace)),
            ("attempt", json!(ctx.trace_id)),
        ]),
    );
    // [reads] A read has no effect to guard and no key: it is not taken before its call;
    // its decided and started records commit with its outcome, in one transition.
    let (step, opening, reserved) = if matches!(ctx.tool.effect, Effect::Read) {
        let opening = Opening {
            decision: decision.into(),
            rule: rule.clone(),
            records: vec![decided, started_record],
            guard: halt_guard(ctx, &run.id),
            insert: (!written).then(|| Box::new(step.clone())),
        };
        (step, Some(opening), false)
    } else {
        let started = store
            .start_step(&Transition {
                step_id: step.id.clone(),
                from: movable,
                to: Some(StepStatus::Running),
                decision: Some(decision.into()),
                rule: Some(rule.clone()),
                bump_attempts: true,
                records: vec![decided, started_record],
                // [stop] The world read above may be stale: a cancel or the emergency stop
                // that landed since (policy and facts took time) keeps the step from starting.
                guard: Some(halt_guard(ctx, &run.id)),
                reserve: Some(KeyClaim {
                    idem_key: step.idem_key.clone(),
                    inputs_hash: step.inputs_hash.clone(),
                    owner: ctx.trace_id.clone(),
                }),
                ..Transition::default()
            })
            .await?;
        let Some(reserved) = started else {
            if let Some(rule) = halted(ctx, &run.id).await? {
                return cancel_halted(ctx, &step, rule).await;
            }
            return settle(ctx, &step).await;
        };
        // The row as the transition wrote it (not read back).
        let step = Step {
            status: StepStatus::Running,
            decision: Some(decision.into()),
            rule: Some(rule.clone()),
            attempts: step.attempts + 1,
            updated_at: store.clock().now_ms(),
            ..step
        };
        (step, None, reserved)
    };
    failpoint("after_start");
    // The key existed already: an earlier attempt's, which says what this one may do.
    if !matches!(ctx.tool.effect, Effect::Read) && !reserved {
        let Some(key) = store.get_key(&step.idem_key).await? else {
            return Err(Internal(format!("the key of step {} vanished", step.id)));
        };
        if let Some(answer) = existing_key(ctx, &step, &key).await? {
            return Ok(answer);
        }
    }

    // 9. The adapter, under the key, with the approval reference.
    let provider = ctx.tool.handler.provider.as_str();
    let adapter = ctx.loaded.adapters.get(provider);
    if adapter.is_none() && provider != crate::runs::PROVIDER {
        let failure = AdapterError::Refused(format!("provider {provider} is not served"));
        return finish(ctx, &step, opening, Err(failure), Duration::ZERO).await;
    }
    let invocation = Invocation {
        tool: ctx.tool.name.as_str().to_string(),
        operation: ctx.tool.handler.operation.clone(),
        arguments,
        idem_key: step.idem_key.clone(),
        approval_token: approval.as_ref().map(|a| a.id.clone()),
        trace_id: ctx.trace.clone(),
        tenant: run.tenant.clone(),
        acts_for,
        resend: step.attempts > 1,
    };
    // [revalidation] The state the step was planned on must still hold (fails closed, the
    // adapter is not called).
    if adapter.is_some()
        && let Err(failure) =
            crate::revalidate::before(ctx.loaded, ctx.tool, &step, &invocation).await
    {
        return fail_closed(ctx, &step, opening, failure, None).await;
    }
    failpoint("before_call");
    let began = Instant::now();
    let outcome = match adapter {
        Some(adapter) => {
            match tokio::time::timeout(ADAPTER_TIMEOUT, adapter.invoke(&invocation)).await {
                Ok(result) => result,
                Err(_) => Err(AdapterError::Timeout),
            }
        }
        None => crate::runs::invoke(ctx.state, ctx.caller, &invocation).await,
    };
    failpoint("after_call");
    // [revalidation] Read back: an accepted call whose effect does not show is not a success.
    if let Ok(result) = &outcome
        && adapter.is_some()
        && let Err(failure) =
            crate::revalidate::after(ctx.loaded, ctx.tool, &invocation, result).await
    {
        return fail_closed(ctx, &step, opening, failure, Some(result)).await;
    }
    finish(ctx, &step, opening, outcome, began.elapsed()).await
}

/// Why a step of `run_id` may not start now: the conditions of [`halt_guard`], read now —
/// the emergency stop (unless the tool is one of Countersign's own run tools) or a run that is
/// not active (failed is fine for compensations).
async fn halted(ctx: &Ctx<'_>, run_id: &str) -> Result<Option<String>, Internal> {
    let (status, stopped) = ctx
        .state
        .store
        .run_status_and_switch(run_id, crate::stop::EMERGENCY_STOP)
        .await?;
    Ok(halt_rule(&halt_guard(ctx, run_id), status, stopped))
}

/// The rule that keeps a step of a run in `status` from starting under `guard`, with the
/// emergency stop `stopped` or not; `None` when it may start.
fn halt_rule(guard: &RunGuard, status: RunStatus, stopped: bool) -> Option<String> {
    if stopped && guard.unless_switch.is_some() {
        return Some(STOP_RULE.to_string());
    }
    match status {
        RunStatus::Active => None,
        RunStatus::Failed if guard.allow_failed => None,
        other => Some(format!("run.{}", other.as_str())),
    }
}

/// [reads] `step` with its row written: a prepared read's is written now, as prepared.
async fn write_prepared(ctx: &Ctx<'_>, step: Step, written: bool) -> Result<Step, Internal> {
    if written {
        return Ok(step);
    }
    Ok(ctx.state.store.insert_prepared(&step).await?)
}

/// When a step may start or commit: in an active run (or a failed one, for compensations),
/// with the emergency stop off (unless the tool is one of Countersign's own run tools).
fn halt_guard(ctx: &Ctx<'_>, run_id: &str) -> RunGuard {
    let own_tool = ctx.tool.handler.provider.as_str() == crate::runs::PROVIDER;
    RunGuard {
        run_id: run_id.to_string(),
        allow_failed: ctx.caller.executor.as_deref() == Some(COMPENSATOR),
        unless_switch: (!own_tool).then(|| crate::stop::EMERGENCY_STOP.to_string()),
    }
}

/// [reads] A read whose closing write found its run cancelled or stopped (while it was in
/// flight, or before it started): its result is withheld and the step recorded as cancelled.
async fn withheld(ctx: &Ctx<'_>, step: &Step) -> Result<Answer, Internal> {
    let rule = halted(ctx, &step.run_id)
        .await?
        .unwrap_or_else(|| "run.cancelled".to_string());
    cancel_halted(ctx, step, rule).await
}

/// Records `step` as `cancelled` by `rule` (a stop or a run no longer active).
async fn cancel_halted(ctx: &Ctx<'_>, step: &Step, rule: String) -> Result<Answer, Internal> {
    let answer = err(json!({"status": "cancelled", "step_id": step.id, "rule": rule}));
    let record = ctx.record(AuditEvent::Cancelled, Some(step), Some(&rule), Map::new());
    ctx.state
        .store
        .move_step(&Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending, StepStatus::Failed],
            to: Some(StepStatus::Cancelled),
            rule: Some(rule),
            outcome: outcome_text(&answer),
            records: vec![record],
            ..Transition::default()
        })
        .await?;
    Ok(answer)
}

/// [reads] What a read's closing transition also writes: the decision and the records of
/// the opening it skipped (see step 7 of [`execute`]).
struct Opening {
    decision: String,
    rule: String,
    records: Vec<(AuditEvent, NewAuditRecord)>,
    /// The stop and run conditions the call skipped checking before it ran.
    guard: RunGuard,
    /// A prepared read's row, written by the closing transition ([`Transition::insert`]).
    insert: Option<Box<Step>>,
}

/// `t` (a transition out of `running`), or for a read the same transition out of
/// `pending|failed` carrying its opening's decision, attempt and records first.
fn closing(opening: Option<Opening>, mut t: Transition) -> Transition {
    if let Some(o) = opening {
        t.from = vec![StepStatus::Pending, StepStatus::Failed];
        t.decision = Some(o.decision);
        t.rule = t.rule.or(Some(o.rule));
        t.bump_attempts = true;
        t.guard = Some(o.guard);
        t.insert = o.insert;
        let mut records = o.records;
        records.append(&mut t.records);
        t.records = records;
    }
    t
}

/// Revalidation's `{field, expected, current}` entries as the agent and the audit may see
/// them: where the field is redacted by the tool (its arguments) or by its verify tool (the
/// state read back), both values are shown as their SHA-256 digests (equal values still
/// compare equal), never in clear.
fn hidden_fields(ctx: &Ctx<'_>, fields: &[Value]) -> Vec<Value> {
    let verify = ctx
        .tool
        .verify
        .as_ref()
        .and_then(|name| ctx.loaded.bundle.registry.tool(name));
    fields
        .iter()
        .map(|entry| {
            let Some(field) = entry.get("field").and_then(Value::as_str) else {
                return json!({"withheld": "revalidation entry without a field"});
            };
            // The entry's values placed at the field's own path, then redacted as the tool
            // and its verify tool redact: whatever a rule hides there, is hidden here.
            let hidden = |value: &Value| -> Value {
                let mut placed = value.clone();
                for segment in field.split('.').rev() {
                    let mut m = Map::new();
                    m.insert(segment.to_string(), placed);
                    placed = Value::Object(m);
                }
                let key = &ctx.state.shown_key;
                let mut shown = redacted(key, ctx.tool, &placed);
                if let Some(verify) = verify {
                    shown = redacted(key, verify, &shown);
                }
                if shown == placed {
                    return value.clone();
                }
                json!(hash_value(key, value))
            };
            let mut out = Map::new();
            out.insert("field".into(), json!(field));
            for name in ["expected", "current"] {
                out.insert(name.into(), hidden(entry.get(name).unwrap_or(&Value::Null)));
            }
            Value::Object(out)
        })
        .collect()
}

/// [revalidation] Records a step that failed closed on revalidation (`state.changed` before the
/// call or on read-back, `state.unverified` / `readback.unconfirmed` when the state could not
/// be read): `failed` with the rule, the check and the fields, its key settled so it is never
/// retried, and its run flagged for re-planning.
async fn fail_closed(
    ctx: &Ctx<'_>,
    step: &Step,
    opening: Option<Opening>,
    failure: crate::revalidate::Failure,
    result: Option<&Value>,
) -> Result<Answer, Internal> {
    let fields = hidden_fields(ctx, &failure.fields);
    let answer = err(
        json!({"status": "failed", "step_id": step.id, "rule": failure.rule,
                            "check": failure.check,
                            "message": failure.message, "fields": fields,
                            "effect_applied": result.is_some(),
                            "retryable": false, "replan": true}),
    );
    let mut d = detail(&[
        ("idem_key", json!(step.idem_key)),
        ("status", json!(StepStatus::Failed.as_str())),
        ("check", json!(failure.check)),
        ("fields", json!(fields)),
        ("effect_applied", json!(result.is_some())),
        ("replan", json!(true)),
    ]);
    if let Some(reference) = result.and_then(|r| r.get("ref")) {
        d.insert("reference".into(), reference.clone());
    }
    let record = ctx.record(AuditEvent::Failed, Some(step), Some(failure.rule), d);
    let stored = outcome_text(&answer);
    let dedupe = !matches!(ctx.tool.effect, Effect::Read);
    let read = opening.is_some();
    let moved = ctx
        .moved(closing(
            opening,
            Transition {
                step_id: step.id.clone(),
                from: vec![StepStatus::Running],
                to: Some(StepStatus::Failed),
                rule: Some(failure.rule.to_string()),
                outcome: stored.clone(),
                key: dedupe.then_some((KeyState::Done, stored)),
                records: vec![record],
                ..Transition::default()
            },
        ))
        .await?;
    if !moved && read {
        return withheld(ctx, step).await;
    }
    if !moved {
        return Err(Internal(format!(
            "step {} left running while it was revalidated",
            step.id
        )));
    }
    ctx.state.store.mark_replan(&step.run_id).await?;
    Ok(answer)
}

/// What `tool`'s gate asks of approvers for a call with `arguments`: its approver roles,
/// four eyes, step-up, and two distinct approvals when `amount` is above the tool's
/// `second_approval_above`.
pub fn gate_rules(tool: &Tool, arguments: &Value) -> countersign_core::approvals::GateRules {
    let Some(approval) = &tool.approval else {
        return countersign_core::approvals::GateRules {
            approver_roles: vec!["approver".into()],
            four_eyes: false,
            approvals_needed: 1,
            step_up_max_age_ms: None,
            party_confirms: false,
        };
    };
    let amount = arguments.get("amount").and_then(Value::as_f64);
    let threshold = approval
        .second_approval_above
        .as_ref()
        .and_then(serde_json::Number::as_f64);
    let two = matches!((amount, threshold), (Some(a), Some(t)) if a > t);
    countersign_core::approvals::GateRules {
        approver_roles: approval
            .approver_roles
            .iter()
            .map(|r| r.as_str().to_string())
            .collect(),
        four_eyes: approval.four_eyes,
        approvals_needed: if two { 2 } else { 1 },
        step_up_max_age_ms: approval
            .step_up_max_age
            .map(|s| i64::try_from(s.as_secs()).unwrap_or(i64::MAX / 1000) * 1000),
        party_confirms: approval.party_confirms,
    }
}

/// Crash-test hook (debug builds only): when `COUNTERSIGN_TEST_CRASH_AT` names this point,
/// the process aborts there, as a SIGKILL would stop it.
fn failpoint(name: &str) {
    #[cfg(debug_assertions)]
    if std::env::var("COUNTERSIGN_TEST_CRASH_AT").is_ok_and(|v| v == name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}

/// The executor name compensation steps run under (they run in the run that failed).
pub const COMPENSATOR: &str = "compensator";

/// What an executor read with its claim ([`Store::planned_call`]).
///
/// [`Store::planned_call`]: countersign_core::Store::planned_call
#[derive(Debug, Clone, Default)]
pub struct Prefetched {
    /// The credential the step runs on, as stored (its assignee, else the run's agent).
    pub agent: Option<AgentCredential>,
    /// That credential's call context.
    pub context: Option<CallContext>,
    /// The step's duties, if it has any.
    pub duties: Option<StepDuties>,
    /// The run's agent as `(revoked_at, expires_at)`, if it was read.
    pub planner_ends: Option<(Option<i64>, Option<i64>)>,
}

/// Executes a step an executor worker claimed from a planned run: the same policy, gate,
/// key and adapter path as an agent's call, on the credential of the step's role minted for
/// its run (never another role's credential with its role swapped).
pub async fn execute_claimed(
    state: &AppState,
    step: Step,
    worker: &str,
) -> Result<Answer, Internal> {
    let run = state.store.get_run(&step.run_id).await?;
    execute_claimed_in(state, run, step, worker, None, None).await
}

/// [`execute_claimed`] with the step's run as the caller read it after the claim (its status
/// is read again before the step starts) and, if it read them too ([`Store::planned_call`]),
/// the step's credential as stored, its call context and the step's duties; the credential
/// and context are used only when it is the one the duties name. `closed_done` is set when the step's closing
/// transition moved it to `done` and ended `worker`'s lease in the same write (no release
/// needs to follow).
///
/// [`Store::planned_call`]: countersign_core::Store::planned_call
pub async fn execute_claimed_in(
    state: &AppState,
    run: Run,
    step: Step,
    worker: &str,
    prefetched: Option<Prefetched>,
    closed_done: Option<&AtomicBool>,
) -> Result<Answer, Internal> {
    let store = &state.store;
    let Some(loaded) = state.registry.current() else {
        return Err(Internal("no registry in force".into()));
    };
    let prefetched = match prefetched {
        Some(p) => p,
        None => Prefetched {
            duties: store.step_duties(&step.id).await?,
            ..Prefetched::default()
        },
    };
    // [duties] The step's own credential: the execution credential minted for its run and
    // role, else (a step planned before duties existed) the run's agent.
    let agent_id = match prefetched.duties.as_ref().and_then(|d| d.assignee.clone()) {
        Some(assignee) => assignee,
        None => run
            .agent_id
            .clone()
            .ok_or_else(|| Internal(format!("planned run {} has no agent", run.id)))?,
    };
    let (agent, context) = match (prefetched.agent, prefetched.context) {
        (Some(agent), context) if agent.id == agent_id => (agent, context),
        _ => (store.get_agent(&agent_id).await?, None),
    };
    // [credentials] A planned step acts with its own credential: once that is revoked or
    // expired (its run ended, its planner's lapsed), nothing more runs on it (the same check
    // the guard makes on every request).
    let credential = match store.check_credential(agent) {
        Ok(credential) => credential,
        Err(AuthError::Expired(_)) => {
            return refuse_claimed(store, &step, worker, AGENT_EXPIRED, Map::new()).await;
        }
        Err(AuthError::Revoked(_) | AuthError::Unknown) => {
            return refuse_claimed(store, &step, worker, AGENT_REVOKED, Map::new()).await;
        }
    };
    // [credentials] A step on an execution credential stops with its planner's: a revoked
    // or expired planner's plan runs no further.
    if run.agent_id.as_deref() != Some(agent_id.as_str())
        && let Some(planner) = run.agent_id.as_deref()
    {
        let ends = match prefetched.planner_ends {
            Some(ends) => Some(ends),
            None => match store.get_agent(planner).await {
                Ok(p) => Some((p.revoked_at, p.expires_at)),
                Err(StoreError::NotFound) => None,
                Err(e) => return Err(e.into()),
            },
        };
        let now = store.clock().now_ms();
        let rule = match ends {
            None | Some((Some(_), _)) => Some(AGENT_REVOKED),
            Some((None, Some(until))) if until <= now => Some(AGENT_EXPIRED),
            Some((None, _)) => None,
        };
        if let Some(rule) = rule {
            return refuse_claimed(store, &step, worker, rule, Map::new()).await;
        }
    }
    // INVARIANT: no role is ever swapped in: the credential holds the step's role, and an
    // execution credential is its own run's.
    if credential.role != step.role
        || credential
            .run_id
            .as_deref()
            .is_some_and(|r| r != run.id.as_str())
    {
        let mut extra = Map::new();
        extra.insert("credential_role".into(), json!(credential.role));
        extra.insert("step_role".into(), json!(step.role));
        return refuse_claimed(store, &step, worker, CREDENTIAL_ROLE, extra).await;
    }
    let caller = Caller {
        credential,
        session: None,
        executor: Some(worker.to_string()),
        // The context read with the run, for this run only (`execute` checks the run id).
        admission: context.map(|context| crate::mcp::guard::Admission {
            hint_key: None,
            prefetched: Some((run.id.clone(), context)),
        }),
    };
    let role = RoleName::parse(&step.role).map_err(|e| Internal(e.to_string()))?;
    let Some(tool) = loaded.bundle.registry.tool_for_role(&role, &step.tool) else {
        // The registry changed since planning: the tool no longer exists for this role.
        let rule = Rule::TOOL_NOT_LISTED.as_str();
        return refuse_claimed(store, &step, worker, rule, Map::new()).await;
    };
    // [review] A step of a tool that asks for a model review runs only once a reviewer
    // approved exactly its inputs (the claim already skips one that waits; this also refuses
    // a step planned before its tool asked for review: it was never reviewed).
    let reviewed = prefetched
        .duties
        .as_ref()
        .is_some_and(|d| d.reviewed_hash.as_deref() == Some(step.inputs_hash.as_str()));
    let review_asked = tool.review_required
        || prefetched
            .duties
            .as_ref()
            .is_some_and(|d| d.review_required);
    if review_asked && !reviewed && worker != COMPENSATOR {
        return refuse_claimed(store, &step, worker, REVIEW_REQUIRED, Map::new()).await;
    }
    // The schema in force now, not only the one at submission: a registry that tightened a
    // tool's schema since planning refuses the planned inputs as it would a direct call.
    let stored: Value =
        serde_json::from_str(&step.inputs).map_err(|e| Internal(format!("stored inputs: {e}")))?;
    if let Err(errors) = loaded.bundle.registry.validate(&tool.name, &stored) {
        let errors = detail(&[("errors", json!(schema_errors(&errors)))]);
        return refuse_claimed(store, &step, worker, Rule::INPUT_SCHEMA.as_str(), errors).await;
    }
    let ctx = Ctx {
        state,
        caller: &caller,
        loaded: &loaded,
        tool,
        trace_id: uuid::Uuid::new_v4().to_string(),
        // The planned step's trace, from its proposal on.
        trace: step
            .trace_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        provenance: Provenance::default(),
        closed_done,
    };
    let canonical = CanonicalJson::from_canonical_text(&step.inputs)
        .map_err(|e| Internal(format!("stored inputs: {e}")))?;
    execute(&ctx, &run, step, false, true, &canonical).await
}

/// Schema errors as the caller and the audit see them: `{path, message}` each.
fn schema_errors(errors: &[countersign_core::schema::SchemaError]) -> Vec<Value> {
    errors
        .iter()
        .map(|e| json!({"path": e.path, "message": e.message}))
        .collect()
}

/// Refuses a claimed planned step before it starts (`rule`, with `extra` in its record).
async fn refuse_claimed(
    store: &countersign_core::Store,
    step: &Step,
    worker: &str,
    rule: &str,
    extra: Map<String, Value>,
) -> Result<Answer, Internal> {
    let record = NewAuditRecord {
        event: Some(AuditEvent::Refused),
        run_id: Some(step.run_id.clone()),
        step_id: Some(step.id.clone()),
        tool: Some(step.tool.clone()),
        actor: Some(format!("executor:{worker}")),
        rule: Some(rule.into()),
        detail: extra,
    };
    store
        .transition(&Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending],
            to: Some(StepStatus::Refused),
            rule: Some(rule.into()),
            records: vec![(AuditEvent::Refused, record)],
            ..Transition::default()
        })
        .await?;
    Ok(err(json!({"status": "refused", "rule": rule})))
}

/// The step's key was reserved before (an earlier attempt). `None`: this caller took it over
/// (a failed attempt that never reached the target) and goes on to call the adapter; otherwise
/// the answer, without calling it: the stored outcome, a mismatch refusal, or `unknown` for
/// the reconciler when an earlier attempt may still have reached the target.
async fn existing_key(
    ctx: &Ctx<'_>,
    step: &Step,
    key: &countersign_core::store::KeyRecord,
) -> Result<Option<Answer>, Internal> {
    let store = &ctx.state.store;
    let (to, rule, answer) = if key.inputs_hash != step.inputs_hash || key.step_id != step.id {
        let answer = err(json!({"status": "refused", "rule": IDEMPOTENCY_MISMATCH,
                                "step_id": step.id}));
        (StepStatus::Refused, Some(IDEMPOTENCY_MISMATCH), answer)
    } else if key.state == KeyState::Failed
        && store
            .take_over_key(&step.idem_key, KeyState::Failed, &ctx.trace_id)
            .await?
    {
        return Ok(None);
    } else if key.state == KeyState::Done {
        let stored = Step {
            outcome: key.result.clone(),
            status: StepStatus::Done,
            ..step.clone()
        };
        // A key is done after a success and after a failure that may not be retried: the
        // step ends as that attempt ended, never as succeeded on a stored failure.
        match stored_outcome(&stored) {
            answer @ Answer::Result { error: true, .. } => {
                (StepStatus::Failed, Some(TARGET_FAILED), answer)
            }
            answer => (StepStatus::Done, None, answer),
        }
    } else {
        let answer = ok(json!({"status": "unknown", "step_id": step.id,
            "message": "an earlier attempt may have reached the target; reconciling"}));
        (StepStatus::Unknown, Some(TARGET_TIMEOUT), answer)
    };
    let record = ctx.record(
        match to {
            StepStatus::Refused => AuditEvent::Refused,
            StepStatus::Done => AuditEvent::Succeeded,
            StepStatus::Failed => AuditEvent::Failed,
            _ => AuditEvent::Unknown,
        },
        Some(step),
        rule,
        detail(&[
            ("idem_key", json!(step.idem_key)),
            ("key_state", json!(key.state)),
        ]),
    );
    ctx.transition(Transition {
        step_id: step.id.clone(),
        from: vec![StepStatus::Running],
        to: Some(to),
        rule: rule.map(str::to_string),
        outcome: outcome_text(&answer),
        records: vec![record],
        ..Transition::default()
    })
    .await?;
    Ok(Some(answer))
}

/// Another caller moved the step first: report where it ends up.
async fn settle(ctx: &Ctx<'_>, step: &Step) -> Result<Answer, Internal> {
    let now = ctx.state.store.get_step(&step.id).await?;
    match now.status {
        StepStatus::NeedsApproval => Ok(waiting(&now)),
        StepStatus::Expired => Ok(expired(&now)),
        _ => await_key(ctx, &now).await,
    }
}

/// 10–12: records the adapter's outcome (step status, key, audit) in one transaction.
async fn finish(
    ctx: &Ctx<'_>,
    step: &Step,
    opening: Option<Opening>,
    outcome: Result<Value, AdapterError>,
    latency: Duration,
) -> Result<Answer, Internal> {
    let latency_ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
    let dedupe = !matches!(ctx.tool.effect, Effect::Read);
    let (status, key, event, rule, answer, extra) = match outcome {
        Ok(result) => {
            let shown = crate::pipeline::redacted(&ctx.state.shown_key, ctx.tool, &result);
            let reference = result.get("ref").cloned().unwrap_or(Value::Null);
            (
                StepStatus::Done,
                KeyState::Done,
                AuditEvent::Succeeded,
                None,
                ok(shown),
                vec![("reference", reference)],
            )
        }
        Err(AdapterError::Timeout) if ctx.tool.effect == Effect::Irreversible => (
            StepStatus::Unknown,
            KeyState::Unknown,
            AuditEvent::Unknown,
            Some(TARGET_TIMEOUT),
            ok(json!({"status": "unknown", "step_id": step.id,
                      "message": "no answer in time; Countersign reconciles it with the target"})),
            vec![],
        ),
        Err(e) => {
            // This attempt is counted already, or (a read) counted with its outcome.
            let attempts = step.attempts + i64::from(opening.is_some());
            let retryable = matches!(e, AdapterError::Unavailable(_) | AdapterError::Timeout)
                && attempts < MAX_ATTEMPTS;
            let code = match &e {
                AdapterError::Rejected { code, .. } => code.clone(),
                AdapterError::Unavailable(_) => "unavailable".into(),
                AdapterError::Timeout => "timeout".into(),
                AdapterError::Refused(_) => "adapter.refused".into(),
            };
            tracing::info!(tool = %ctx.tool.name, error = %e, "adapter call failed");
            let message = match &e {
                AdapterError::Rejected { message, .. } => message.clone(),
                AdapterError::Unavailable(_) | AdapterError::Timeout => {
                    "the target system did not complete the call; it may be retried".into()
                }
                AdapterError::Refused(_) => "the call could not be sent".into(),
            };
            (
                StepStatus::Failed,
                if retryable {
                    KeyState::Failed
                } else {
                    KeyState::Done
                },
                AuditEvent::Failed,
                Some(TARGET_FAILED),
                err(json!({"status": "failed", "step_id": step.id, "code": code,
                           "message": message, "retryable": retryable})),
                vec![("code", json!(code)), ("retryable", json!(retryable))],
            )
        }
    };
    let mut d = detail(&[
        ("latency_ms", json!(latency_ms)),
        ("idem_key", json!(step.idem_key)),
        ("status", json!(status.as_str())),
    ]);
    for (k, v) in extra {
        d.insert(k.into(), v);
    }
    let record = ctx.record(event, Some(step), rule, d);
    let stored = outcome_text(&answer);
    let read = opening.is_some();
    let moved = ctx
        .moved(closing(
            opening,
            Transition {
                step_id: step.id.clone(),
                from: vec![StepStatus::Running],
                to: Some(status),
                outcome: stored.clone(),
                key: dedupe.then_some((key, stored)),
                records: vec![record],
                // A worker's closing write needs no flush before it goes on: its next effect
                // waits for its own start's barrier. An agent is told only what is durable.
                answer_at_commit: ctx.caller.executor.is_some(),
                // A worker's lease ends with it (no separate release).
                release: ctx.caller.executor.clone(),
                ..Transition::default()
            },
        ))
        .await?;
    if moved
        && status == StepStatus::Done
        && let Some(flag) = ctx.closed_done
    {
        flag.store(true, Ordering::Relaxed);
    }
    if !moved && read {
        return withheld(ctx, step).await;
    }
    if !moved {
        return Err(Internal(format!(
            "step {} left running while its call was in flight",
            step.id
        )));
    }
    Ok(answer)
}

/// The inputs as the audit records them: the tool's `redact` fields replaced by keyed HMAC
/// digests (config `redaction_key`; equal values still compare equal) or dropped. Without a
/// configured key, hashed fields are keyed by this process's random key ([`redacted`]): equal
/// only within one process's records. Never the clear value.
pub fn audit_inputs(state: &AppState, tool: &Tool, arguments: &Value) -> Value {
    use countersign_core::redact::{FieldSelector, How, RedactRule, redact};
    if tool.handler.provider.as_str() == crate::runs::PROVIDER
        && tool.handler.operation == "plan.submit"
    {
        return plan_audit_inputs(state, arguments);
    }
    let Some(key) = &state.redaction else {
        return redacted(&state.shown_key, tool, arguments);
    };
    let rules: Vec<RedactRule> = tool
        .redact
        .iter()
        .filter_map(|r| {
            Some(RedactRule {
                field: FieldSelector::parse(&r.field).ok()?,
                how: match r.how {
                    countersign_core::registry::RedactHow::Hash => How::Hash,
                    countersign_core::registry::RedactHow::Drop => How::Drop,
                },
            })
        })
        .collect();
    if rules.len() != tool.redact.len() {
        // A rule that does not parse: record nothing rather than something in clear.
        return json!({"withheld": "redaction rule did not parse"});
    }
    match redact(arguments, &rules, key) {
        Ok(r) => r.value,
        Err(_) => json!({"withheld": "value could not be redacted"}),
    }
}

/// A plan's inputs for the audit record: each step's `arguments` redacted by that step's own
/// tool (an IBAN in a planned `supplier.update_iban` is hashed like in a direct call). A step
/// whose tool is not in the registry in force keeps no arguments (fail closed).
fn plan_audit_inputs(state: &AppState, arguments: &Value) -> Value {
    let mut out = arguments.clone();
    let loaded = state.registry.current();
    if let Some(steps) = out.get_mut("steps").and_then(Value::as_array_mut) {
        for step in steps {
            let tool = step
                .get("tool")
                .and_then(Value::as_str)
                .and_then(|n| countersign_core::ToolName::parse(n).ok())
                .and_then(|n| {
                    loaded
                        .as_ref()
                        .and_then(|l| l.bundle.registry.tool(&n).cloned())
                });
            let Some(obj) = step.as_object_mut() else {
                continue;
            };
            let shown = match (&tool, obj.get("arguments")) {
                (Some(t), Some(a)) if t.handler.provider.as_str() != crate::runs::PROVIDER => {
                    audit_inputs(state, t, a)
                }
                (_, None) => continue,
                _ => json!({"withheld": "no such tool to redact by"}),
            };
            obj.insert("arguments".into(), shown);
        }
    }
    out
}

/// `result` with the tool's `redact` fields hidden from the agent (hashed with `key`, the
/// server's [`AppState::shown_key`], when the rule says hash: equal values still compare
/// equal; dropped otherwise). A rule's field is
/// a bare member name (any depth) or a dotted path from the root (arrays transparent), as in
/// the audit's redaction; when two rules match one member, drop wins. A rule that does not
/// parse withholds the whole value (fail closed).
pub fn redacted(key: &RedactionKey, tool: &Tool, result: &Value) -> Value {
    use countersign_core::redact::FieldSelector;
    use countersign_core::registry::RedactHow;
    if tool.redact.is_empty() {
        return result.clone();
    }
    let Ok(rules) = tool
        .redact
        .iter()
        .map(|r| FieldSelector::parse(&r.field).map(|f| (f, r.how)))
        .collect::<Result<Vec<_>, _>>()
    else {
        return json!({"withheld": "redaction rule did not parse"});
    };
    fn walk<'a>(
        key: &RedactionKey,
        v: &'a Value,
        rules: &[(FieldSelector, RedactHow)],
        at: &mut Vec<&'a str>,
    ) -> Value {
        match v {
            Value::Object(map) => {
                let mut out = Map::new();
                for (k, v) in map {
                    at.push(k);
                    let mut hows = rules.iter().filter(|(f, _)| f.matches(at)).map(|(_, h)| *h);
                    match hows.next() {
                        None => {
                            out.insert(k.clone(), walk(key, v, rules, at));
                        }
                        Some(first) => {
                            if first == RedactHow::Hash && hows.all(|h| h == RedactHow::Hash) {
                                out.insert(k.clone(), json!(hash_value(key, v)));
                            }
                        }
                    }
                    at.pop();
                }
                Value::Object(out)
            }
            Value::Array(items) => {
                Value::Array(items.iter().map(|i| walk(key, i, rules, at)).collect())
            }
            other => other.clone(),
        }
    }
    walk(key, result, &rules, &mut Vec::new())
}

/// What an agent sees of a hashed value: `redacted:hmac-sha256:` and 128 bits of its keyed
/// digest (equal values compare equal; a dictionary of guesses needs the key). A value with
/// no canonical form shows nothing of itself.
fn hash_value(key: &RedactionKey, v: &Value) -> String {
    match key.digest(v) {
        Ok(digest) => format!(
            "redacted:{}",
            digest.get(..HASH_PREFIX.len() + 32).unwrap_or(&digest)
        ),
        Err(_) => "redacted:withheld".to_string(),
    }
}

/// Records an `input.schema` refusal, then answers with it.
async fn refuse_invalid(ctx: &Ctx<'_>, errors: Vec<Value>) -> Result<Answer, Internal> {
    let record = ctx.record(
        AuditEvent::Refused,
        None,
        Some(Rule::INPUT_SCHEMA.as_str()),
        detail(&[("errors", Value::Array(errors.clone()))]),
    );
    ctx.append(record).await?;
    Ok(err(json!({
        "status": "invalid",
        "rule": "input.schema",
        "errors": errors,
    })))
}
