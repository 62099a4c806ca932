//! Countersign's own run tools (provider `countersign`): plans as data and their review.
//!
//! * `plan.submit` validates every step (the tool exists and is not a run tool, a worker role
//!   lists it, the arguments fit its closed schema, the records they name belong to the
//!   submitter's tenant) and refuses the whole plan with per-step reasons if any step fails;
//!   otherwise it opens a planned run whose steps the executor workers run in order. Nothing
//!   is executed at submission.
//! * `run.status` / `run.cancel` act only on runs the calling agent submitted.
//! * `plan.submit` also mints one execution credential per role its steps run in (the steps
//!   run on it, never on the planner's) and records each step's duties: whether a model
//!   reviewer must approve it first (`review: required` in the registry). The run is sealed
//!   as planned only then.
//! * `step.list`, `step.approve`, `step.reject`: a model reviewer's verdict. An approval names
//!   the inputs hash it approves and is recorded only for a step that waits for review, by a
//!   credential that did not plan it ([`countersign_core::Store::review_step`]); it never
//!   replaces a person's gate. A rejection refuses the step and flags the run for re-planning.
//! * `step.list` shows a caller only steps that are theirs to see: of runs it planned, assigned
//!   to it, or — for a reviewer (a role that lists `step.approve`) — of its tenant's planned
//!   runs it did not plan itself.
//!
//! These tools reach this module only through the gateway pipeline, so listing, schema,
//! policy, keys and audit apply to them like to any other tool.

use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::registry::Tool;
use countersign_core::store::{NewRun, NewStep, ReviewError, RunStatus, Step, Transition};
use countersign_core::{CanonicalJson, RoleName, StepStatus, StoreError, ToolName};
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::adapters::{AdapterError, Invocation};
use crate::pipeline::Caller;

/// The provider name of the run tools.
pub use crate::adapters::OWN_PROVIDER as PROVIDER;

fn rejected(code: &str, message: impl Into<String>) -> AdapterError {
    AdapterError::Rejected {
        code: code.into(),
        message: message.into(),
    }
}

fn store_err(e: StoreError) -> AdapterError {
    AdapterError::Unavailable(format!("store: {e}"))
}

/// Runs one run-tool operation for `caller`.
pub async fn invoke(
    state: &AppState,
    caller: &Caller,
    call: &Invocation,
) -> Result<Value, AdapterError> {
    let args = &call.arguments;
    match call.operation.as_str() {
        "plan.submit" => submit(state, caller, args, &call.trace_id).await,
        "run.status" => status(state, caller, text(args, "run_id")?).await,
        "run.cancel" => cancel(state, caller, text(args, "run_id")?, text(args, "reason")?).await,
        "step.list" => list(state, caller, args).await,
        "step.approve" => review(state, caller, args, true).await,
        "step.reject" => review(state, caller, args, false).await,
        other => Err(rejected(
            "unknown_operation",
            format!("no operation {other}"),
        )),
    }
}

fn text<'a>(args: &'a Value, name: &str) -> Result<&'a str, AdapterError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| rejected("bad_request", format!("missing {name}")))
}

/// The role a planned step of `tool` runs in: a `worker.*` role listing it (first by name),
/// else any other role listing it except `planner` and `reviewer`.
fn worker_role(tool: &Tool) -> Option<RoleName> {
    let mut roles: Vec<&RoleName> = tool
        .roles
        .iter()
        .filter(|r| !matches!(r.as_str(), "planner" | "reviewer"))
        .collect();
    roles.sort_by_key(|r| (!r.as_str().starts_with("worker."), r.as_str().to_string()));
    roles.first().map(|r| (*r).clone())
}

struct Planned {
    tool: String,
    role: String,
    review_required: bool,
    effect: countersign_core::Effect,
    inputs: CanonicalJson,
    reason: String,
    evidence: Vec<String>,
    observed: Option<String>,
}

/// `plan.submit`: `trace` (the submission's trace id) follows every step it opens, from its
/// proposal to its outcome.
async fn submit(
    state: &AppState,
    caller: &Caller,
    args: &Value,
    trace: &str,
) -> Result<Value, AdapterError> {
    let Some(loaded) = state.registry.current() else {
        return Err(AdapterError::Unavailable("no registry in force".into()));
    };
    let registry = &loaded.bundle.registry;
    let task = text(args, "task")?;
    let steps = args
        .get("steps")
        .and_then(Value::as_array)
        .ok_or_else(|| rejected("bad_request", "missing steps"))?;
    let tenant = caller.credential.tenant.as_str();
    let mut problems: Vec<String> = Vec::new();
    let mut planned = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let seq = i + 1;
        let name = step.get("tool").and_then(Value::as_str).unwrap_or_default();
        let tool = ToolName::parse(name).ok().and_then(|n| registry.tool(&n));
        let Some(tool) = tool else {
            problems.push(format!("step {seq}: no tool {name:?}"));
            continue;
        };
        if tool.handler.provider.as_str() == PROVIDER {
            problems.push(format!(
                "step {seq}: {name} is a run tool and cannot be planned"
            ));
            continue;
        }
        let Some(role) = worker_role(tool) else {
            problems.push(format!("step {seq}: no worker role lists {name}"));
            continue;
        };
        let arguments = step.get("arguments").cloned().unwrap_or(json!({}));
        if let Err(errors) = registry.validate(&tool.name, &arguments) {
            for e in errors {
                problems.push(format!("step {seq} ({name}): {} {}", e.path, e.message));
            }
            continue;
        }
        let inputs = match CanonicalJson::from_value(&arguments) {
            Ok(c) => c,
            Err(e) => {
                problems.push(format!("step {seq} ({name}): {e}"));
                continue;
            }
        };
        // The records the arguments name must be the submitter's tenant's.
        if let Some(adapter) = loaded.adapters.get(tool.handler.provider.as_str()) {
            for (field, kind) in &tool.resources {
                // [stillon] integer ids (`reservation_id`) are resource ids too.
                let Some(id) = arguments.get(field).and_then(crate::pipeline::resource_id) else {
                    continue;
                };
                match adapter.facts(kind, &id).await {
                    Ok(Some(fact)) if fact.tenant != tenant => {
                        problems.push(format!("step {seq} ({name}): tenant.mismatch on {field}"));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        // The cause goes to the log; the planner learns only that it failed.
                        tracing::info!(step = seq, tool = %name, error = %e, "plan: a resource check failed");
                        problems.push(format!(
                            "step {seq} ({name}): {field}: the target could not be asked; try again"
                        ));
                    }
                }
            }
        }
        planned.push(Planned {
            tool: tool.name.as_str().to_string(),
            role: role.as_str().to_string(),
            review_required: tool.review_required,
            effect: tool.effect,
            inputs,
            reason: step
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            evidence: step
                .get("evidence")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            observed: step.get("observed").map(Value::to_string),
        });
    }
    if !problems.is_empty() {
        return Err(rejected(
            "plan.invalid",
            format!("the plan was refused as a whole: {}", problems.join("; ")),
        ));
    }
    let run = state
        .store
        .create_run(&NewRun {
            tenant: tenant.to_string(),
            principal: format!("agent:{}", caller.credential.id),
            agent_id: Some(caller.credential.id.clone()),
            task: task.to_string(),
            // The operator's word on where this agent's tasks come from; never the model's.
            origin: caller.credential.origin.clone(),
            // Sealed as planned once every step and its duties are written (below): no
            // executor claims a step before its review and credential are recorded.
            planned: false,
        })
        .await
        .map_err(store_err)?;
    // [duties] One execution credential per role the plan's steps run in, minted for this
    // run only (audited in its trail): no step runs on the planner's credential.
    let mut executors: std::collections::BTreeMap<String, String> = Default::default();
    for p in &planned {
        if executors.contains_key(&p.role) {
            continue;
        }
        let cred = state
            .store
            .mint_execution(&run, &p.role, &caller.credential)
            .await
            .map_err(|e| match e {
                countersign_core::store::CreateAgentError::Store(e) => store_err(e),
                other => AdapterError::Unavailable(format!("execution credential: {other}")),
            })?;
        executors.insert(p.role.clone(), cred.id);
    }
    let mut out = Vec::new();
    for p in planned {
        let (step, opened) = state
            .store
            .open_step(&NewStep {
                run_id: run.id.clone(),
                role: p.role.clone(),
                tool: p.tool.clone(),
                effect: p.effect,
                inputs: p.inputs,
                agent_id: Some(caller.credential.id.clone()),
                reason: p.reason.clone(),
                evidence: p.evidence.clone(),
                observed: p.observed,
                trace_id: trace.to_string(),
                status: StepStatus::Pending,
            })
            .await
            .map_err(store_err)?;
        let assignee = executors.get(&p.role).cloned();
        // A write the plan repeats is one step (deduplicated): its duties are written once.
        if opened {
            state
                .store
                .set_step_duties(&step.id, p.review_required, assignee.as_deref())
                .await
                .map_err(store_err)?;
        }
        let mut detail = Map::new();
        detail.insert("reason".into(), json!(p.reason));
        detail.insert("assignee".into(), json!(assignee));
        detail.insert("review_required".into(), json!(p.review_required));
        detail.insert("evidence".into(), json!(p.evidence));
        detail.insert("inputs_hash".into(), json!(step.inputs_hash));
        detail.insert("role".into(), json!(p.role));
        detail.insert("trace_id".into(), json!(trace));
        state
            .store
            .append_audit(&NewAuditRecord {
                event: Some(AuditEvent::Proposed),
                run_id: Some(run.id.clone()),
                step_id: Some(step.id.clone()),
                tool: Some(p.tool.clone()),
                actor: Some(format!("agent:{} role:planner", caller.credential.id)),
                rule: None,
                detail,
                tenant: None,
            })
            .await
            .map_err(store_err)?;
        out.push(
            json!({"step_id": step.id, "seq": step.seq, "tool": step.tool,
                        "status": step.status.as_str(), "role": p.role,
                        "inputs_hash": step.inputs_hash,
                        "review_required": p.review_required}),
        );
    }
    state.store.seal_plan(&run.id).await.map_err(store_err)?;
    Ok(json!({"run_id": run.id, "status": "active", "steps": out}))
}

/// A run the caller submitted (others do not exist for it).
async fn own_run(
    state: &AppState,
    caller: &Caller,
    run_id: &str,
) -> Result<countersign_core::store::Run, AdapterError> {
    match state.store.get_run(run_id).await {
        Ok(run) if run.agent_id.as_deref() == Some(caller.credential.id.as_str()) => Ok(run),
        Ok(_) | Err(StoreError::NotFound) => Err(rejected("not_found", "no such run")),
        Err(e) => Err(store_err(e)),
    }
}

fn step_view(step: &Step) -> Value {
    let outcome = step
        .outcome
        .as_deref()
        .and_then(|o| serde_json::from_str::<Value>(o).ok())
        .and_then(|o| o.get("answer").cloned());
    json!({"step_id": step.id, "seq": step.seq, "tool": step.tool,
           "status": step.status.as_str(), "rule": step.rule, "outcome": outcome})
}

async fn status(state: &AppState, caller: &Caller, run_id: &str) -> Result<Value, AdapterError> {
    let run = own_run(state, caller, run_id).await?;
    let steps = state
        .store
        .steps_for_run(&run.id)
        .await
        .map_err(store_err)?;
    Ok(
        json!({"run_id": run.id, "status": run.status.as_str(), "replan": run.replan,
              "reason": run.reason, "steps": steps.iter().map(step_view).collect::<Vec<_>>()}),
    )
}

/// Cancels `run_id`: the run stops and every step that has not started is cancelled; a step
/// already running finishes (or is reconciled).
pub async fn cancel_run(
    state: &AppState,
    run_id: &str,
    actor: &str,
    reason: &str,
    to: RunStatus,
) -> Result<usize, StoreError> {
    // [stop] The run's end and the cancellation of its unstarted steps are one transaction
    // (`Store::end_run`): nobody observes a failed run with a step still pending.
    let mut cancels = Vec::new();
    for step in state.store.steps_for_run(run_id).await? {
        // [stillon] A run that failed keeps its failed steps as they ended (status, rule and
        // outcome: `state.changed`, `target.failed`…); only steps that never ran are cancelled.
        if !matches!(step.status, StepStatus::Pending | StepStatus::NeedsApproval) {
            continue;
        }
        let mut detail = Map::new();
        detail.insert("reason".into(), json!(reason));
        let record = NewAuditRecord {
            event: Some(AuditEvent::Cancelled),
            run_id: Some(run_id.to_string()),
            step_id: Some(step.id.clone()),
            tool: Some(step.tool.clone()),
            actor: Some(actor.to_string()),
            rule: Some(format!("run.{}", to.as_str())),
            detail,
            tenant: None,
        };
        cancels.push(Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending, StepStatus::NeedsApproval],
            to: Some(StepStatus::Cancelled),
            rule: Some(format!("run.{}", to.as_str())),
            records: vec![(AuditEvent::Cancelled, record)],
            ..Transition::default()
        });
    }
    let (_, cancelled) = state.store.end_run(run_id, to, reason, &cancels).await?;
    Ok(cancelled)
}

async fn cancel(
    state: &AppState,
    caller: &Caller,
    run_id: &str,
    reason: &str,
) -> Result<Value, AdapterError> {
    let run = own_run(state, caller, run_id).await?;
    if run.status != RunStatus::Active {
        return Err(rejected(
            "conflict",
            format!("run is {}", run.status.as_str()),
        ));
    }
    let actor = format!("agent:{}", caller.credential.id);
    let n = cancel_run(state, &run.id, &actor, reason, RunStatus::Cancelled)
        .await
        .map_err(store_err)?;
    Ok(json!({"run_id": run.id, "status": "cancelled", "cancelled_steps": n}))
}

/// The most steps one `step.list` answers.
const LIST_MAX: i64 = 500;

async fn list(state: &AppState, caller: &Caller, args: &Value) -> Result<Value, AdapterError> {
    let Some(loaded) = state.registry.current() else {
        return Err(AdapterError::Refused("no registry in force".into()));
    };
    let limit = args
        .get("limit")
        .and_then(Value::as_i64)
        .unwrap_or(50)
        .clamp(1, LIST_MAX);
    let statuses = match args.get("status").and_then(Value::as_str) {
        Some(s) => vec![StepStatus::parse(s).ok_or_else(|| rejected("bad_request", "status"))?],
        None => vec![StepStatus::Pending, StepStatus::NeedsApproval],
    };
    let run_filter = args.get("run_id").and_then(Value::as_str);
    // A reviewer is a role that may approve steps.
    let reviewer = RoleName::parse(&caller.credential.role)
        .ok()
        .and_then(|role| {
            loaded
                .bundle
                .registry
                .tool_for_role(&role, "step.approve")
                .map(|_| ())
        })
        .is_some()
        && caller.credential.run_id.is_none();
    let mut out = Vec::new();
    for status in statuses {
        // [duties] Only the steps that are this caller's to see, filtered in the query.
        for step in state
            .store
            .listable_steps(
                status,
                &caller.credential.tenant,
                &caller.credential.id,
                reviewer,
                run_filter,
                limit,
            )
            .await
            .map_err(store_err)?
        {
            let duties = state
                .store
                .step_duties(&step.id)
                .await
                .map_err(store_err)?
                .unwrap_or_default();
            let mut view = step_view(&step);
            view["run_id"] = json!(step.run_id);
            view["inputs_hash"] = json!(step.inputs_hash);
            view["awaiting_review"] = json!(duties.awaits_review(&step.inputs_hash));
            // The inputs as the step's tool shows them: its `redact` fields hidden; withheld
            // when the tool is no longer in the registry.
            let inputs: Value = serde_json::from_str(&step.inputs).unwrap_or(Value::Null);
            let tool = countersign_core::ToolName::parse(&step.tool)
                .ok()
                .and_then(|name| loaded.bundle.registry.tool(&name).cloned());
            view["inputs"] = match &tool {
                Some(tool) => crate::pipeline::redacted(&state.shown_key, tool, &inputs),
                None => json!({"withheld": "the tool is no longer in the registry"}),
            };
            view["reason"] = json!(step.reason);
            out.push(view);
            if out.len() as i64 >= limit {
                return Ok(json!({"steps": out}));
            }
        }
    }
    Ok(json!({"steps": out}))
}

async fn review(
    state: &AppState,
    caller: &Caller,
    args: &Value,
    approve: bool,
) -> Result<Value, AdapterError> {
    let step_id = text(args, "step_id")?;
    let reason = text(args, "reason")?;
    let step = match state.store.get_step(step_id).await {
        Ok(s) => s,
        Err(StoreError::NotFound) => return Err(rejected("not_found", "no such step")),
        Err(e) => return Err(store_err(e)),
    };
    let run = state.store.get_run(&step.run_id).await.map_err(store_err)?;
    if run.tenant != caller.credential.tenant || !run.planned {
        return Err(rejected("not_found", "no such step"));
    }
    if approve {
        // [duties] Bound to the inputs the reviewer names, never by the planner's credential.
        let inputs_hash = text(args, "inputs_hash")?;
        return match state
            .store
            .review_step(&step.id, inputs_hash, &caller.credential, reason)
            .await
        {
            Ok(duties) => Ok(json!({"step_id": step.id, "review": "approved",
                                    "status": step.status.as_str(),
                                    "inputs_hash": duties.reviewed_hash})),
            Err(ReviewError::NotFound) => Err(rejected("not_found", "no such step")),
            Err(e @ ReviewError::OwnPlan) => Err(rejected("review.own_plan", e.to_string())),
            Err(e @ ReviewError::InputsChanged) => {
                Err(rejected("review.inputs_changed", e.to_string()))
            }
            Err(e @ ReviewError::NotWaiting(_)) => Err(rejected("conflict", e.to_string())),
            Err(ReviewError::Store(e)) => Err(store_err(e)),
        };
    }
    let actor = format!(
        "agent:{} role:{}",
        caller.credential.id, caller.credential.role
    );
    let mut detail = Map::new();
    detail.insert("review".into(), json!("reject"));
    detail.insert("reason".into(), json!(reason));
    detail.insert("inputs_hash".into(), json!(step.inputs_hash));
    let record = NewAuditRecord {
        event: Some(AuditEvent::Validated),
        run_id: Some(step.run_id.clone()),
        step_id: Some(step.id.clone()),
        tool: Some(step.tool.clone()),
        actor: Some(actor),
        rule: Some("review.rejected".into()),
        detail,
        tenant: None,
    };
    // Stopping is always safe, but never by the credential that planned the step.
    if run.agent_id.as_deref() == Some(caller.credential.id.as_str()) {
        return Err(rejected(
            "review.own_plan",
            "a step is never reviewed by the credential that planned it",
        ));
    }
    let moved = state
        .store
        .transition(&Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending, StepStatus::NeedsApproval],
            to: Some(StepStatus::Refused),
            rule: Some("review.rejected".into()),
            records: vec![(AuditEvent::Validated, record)],
            ..Transition::default()
        })
        .await
        .map_err(store_err)?;
    if moved.is_none() {
        return Err(rejected(
            "conflict",
            format!("step is {}, no longer reviewable", step.status.as_str()),
        ));
    }
    state.store.mark_replan(&run.id).await.map_err(store_err)?;
    Ok(json!({"step_id": step.id, "review": "rejected", "status": "refused"}))
}
