//! Stage 4: the step this call is. A planned run's writes are refused here (they run through
//! its plan); a named step must be this run's and this tool's, with these inputs; a write
//! opens its row (the key's owner, its key derived on opening) or finds the identical call's;
//! a read is prepared in memory and written with its outcome.

use super::answer::Flow;
use super::answer::Internal;
use super::answer::err;
use super::answer::waiting;
use super::ctx::Ctx;
use super::ctx::bounded;
use super::ctx::detail;
use super::key::IDEMPOTENCY_MISMATCH;
use super::replay::replay;
use std::ops::ControlFlow::{Break, Continue};

use countersign_core::audit::AuditEvent;
use countersign_core::store::{NewStep, Run, Step};
use countersign_core::{CanonicalJson, Effect, Gate, InputsHash, StepStatus, StoreError};
use serde_json::{Map, Value, json};

/// The step as this call found or made it.
pub(super) struct Opened {
    /// The step.
    pub(super) step: Step,
    /// Made by this very call (so no approval can name it yet).
    pub(super) fresh: bool,
    /// Its row exists (a prepared read's does not yet).
    pub(super) written: bool,
}

/// A planned run's writes run through its plan, in its order, by the executor (which starts
/// them with `execute_claimed_in`, never through here): a direct write naming the run would
/// add a step the plan never had, or run a planned one out of turn, outside the run's bounds
/// and settling. Reads may gather evidence there; Countersign's own run tools are not the
/// run's writes.
pub(super) async fn refuse_planned_write(ctx: &Ctx<'_>, run: &Run) -> Flow<()> {
    if !run.planned
        || ctx.tool.effect == Effect::Read
        || ctx.tool.handler.provider.as_str() == crate::runs::PROVIDER
    {
        return Ok(Continue(()));
    }
    let mut record = ctx.record(AuditEvent::Refused, None, Some(PLANNED_RUN), Map::new());
    record.1.run_id = Some(run.id.clone());
    ctx.append(record).await?;
    Ok(Break(err(json!({
        "status": "refused",
        "rule": PLANNED_RUN,
        "run_id": run.id,
        "message": "a planned run's writes run through its plan: submit a plan (plan.submit)",
    }))))
}

/// `_meta.step_id`, when given, must name a step of this run and tool proposed with exactly
/// these inputs.
pub(super) async fn check_named_step(
    ctx: &Ctx<'_>,
    run: &Run,
    step_id: Option<&str>,
    canonical: &CanonicalJson,
) -> Flow<()> {
    let Some(step_id) = step_id else {
        return Ok(Continue(()));
    };
    let inputs_hash = InputsHash::of(canonical);
    match ctx.state.store.get_step(step_id).await {
        Ok(step) if step.run_id == run.id && step.tool == ctx.tool.name.as_str() => {
            if step.inputs_hash == inputs_hash.to_string() {
                return Ok(Continue(()));
            }
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
            Ok(Break(err(json!({
                "status": "refused",
                "rule": IDEMPOTENCY_MISMATCH,
                "step_id": step.id,
                "message": "this step was proposed with other inputs",
            }))))
        }
        Ok(_) | Err(StoreError::NotFound) => {
            let record = ctx.record(
                AuditEvent::Refused,
                None,
                Some(STEP_UNKNOWN),
                detail(&[("requested_step", json!(bounded(step_id)))]),
            );
            ctx.append(record).await?;
            Ok(Break(err(json!({
                "status": "refused",
                "rule": STEP_UNKNOWN,
                "message": "no such step in this run for this tool",
            }))))
        }
        Err(e) => Err(e.into()),
    }
}

/// The step this call is: a write's row opened (or the identical call's found, answered
/// from where it stands unless it may go on); a read prepared, or a gated read's earlier
/// step continued.
pub(super) async fn open_step(
    ctx: &Ctx<'_>,
    run: &Run,
    arguments: &Value,
    canonical: &CanonicalJson,
) -> Flow<Opened> {
    let store = &ctx.state.store;
    let new_step = new_step(ctx, run, arguments, canonical);
    // [reads] A read's row is written with its outcome (or when it is parked or refused
    // first): no row is opened before it runs. A write opens its row, the key's owner.
    if ctx.tool.effect == Effect::Read {
        if let Some(step) = gated_read(ctx, run, canonical).await? {
            let now = store.clock().now_ms();
            if step.status == StepStatus::NeedsApproval
                && step.expires_at.is_some_and(|at| now < at)
            {
                return Ok(Break(waiting(&step)));
            }
            return Ok(Continue(Opened {
                step,
                fresh: false,
                written: true,
            }));
        }
        return Ok(Continue(Opened {
            step: store.prepare_read(&new_step)?,
            fresh: true,
            written: false,
        }));
    }
    let (step, created) = store.open_step(&new_step).await?;
    if !created && let Some(answer) = replay(ctx, &step).await? {
        return Ok(Break(answer));
    }
    Ok(Continue(Opened {
        step,
        fresh: created,
        written: true,
    }))
}

/// [gate] A gated read repeated in its run continues the step its first call parked (so an
/// approval of it can be used); ungated reads never look.
async fn gated_read(
    ctx: &Ctx<'_>,
    run: &Run,
    canonical: &CanonicalJson,
) -> Result<Option<Step>, Internal> {
    if ctx.tool.gate == Gate::Never {
        return Ok(None);
    }
    let credential = &ctx.caller.credential;
    let hash = InputsHash::of(canonical).to_string();
    Ok(ctx
        .state
        .store
        .gated_read(
            &run.id,
            &credential.id,
            &credential.role,
            ctx.tool.name.as_str(),
            &hash,
        )
        .await?)
}

fn new_step(ctx: &Ctx<'_>, run: &Run, arguments: &Value, canonical: &CanonicalJson) -> NewStep {
    let credential = &ctx.caller.credential;
    NewStep {
        run_id: run.id.clone(),
        role: credential.role.clone(),
        tool: ctx.tool.name.as_str().to_string(),
        effect: ctx.tool.effect,
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
    }
}

/// `_meta.step_id` names no step of this run and tool.
pub const STEP_UNKNOWN: &str = "step.unknown";

/// A direct write named a planned run: its writes run through its plan only.
pub const PLANNED_RUN: &str = "run.planned";
