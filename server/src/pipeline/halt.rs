//! The emergency stop and the run's status: when a step may not start, and what it becomes.

use super::answer::Answer;
use super::answer::Internal;
use super::answer::err;
use super::answer::outcome_text;
use super::caller::COMPENSATOR;
use super::ctx::Ctx;
use countersign_core::StepStatus;
use countersign_core::audit::AuditEvent;
use countersign_core::store::{RunGuard, RunStatus, Step, Transition};
use serde_json::{Map, json};

/// The switch the emergency stop sets (the bare name: every tenant; `name:tenant`: one);
/// no step of a run it covers starts.
pub const EMERGENCY_STOP: &str = "emergency_stop";

/// Why a step of `run_id` may not start now: the conditions of [`halt_guard`], read now —
/// the emergency stop (unless the tool is one of Countersign's own run tools) or a run that is
/// not active (failed is fine for compensations).
pub(super) async fn halted(ctx: &Ctx<'_>, run_id: &str) -> Result<Option<String>, Internal> {
    let (status, stopped) = ctx
        .state
        .store
        .run_status_and_switch(run_id, EMERGENCY_STOP)
        .await?;
    Ok(halt_rule(&halt_guard(ctx, run_id), status, stopped))
}

/// The rule that keeps a step of a run in `status` from starting under `guard`, with the
/// emergency stop `stopped` or not; `None` when it may start.
pub(super) fn halt_rule(guard: &RunGuard, status: RunStatus, stopped: bool) -> Option<String> {
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
pub(super) async fn write_prepared(
    ctx: &Ctx<'_>,
    step: Step,
    written: bool,
) -> Result<Step, Internal> {
    if written {
        return Ok(step);
    }
    Ok(ctx.state.store.insert_prepared(&step).await?)
}

/// When a step may start or commit: in an active run (or a failed one, for compensations),
/// with the emergency stop off (unless the tool is one of Countersign's own run tools).
pub(super) fn halt_guard(ctx: &Ctx<'_>, run_id: &str) -> RunGuard {
    let own_tool = ctx.tool.handler.provider.as_str() == crate::runs::PROVIDER;
    RunGuard {
        run_id: run_id.to_string(),
        allow_failed: ctx.caller.executor.as_deref() == Some(COMPENSATOR),
        unless_switch: (!own_tool).then(|| EMERGENCY_STOP.to_string()),
    }
}

/// [reads] A read whose closing write found its run cancelled or stopped (while it was in
/// flight, or before it started): its result is withheld and the step recorded as cancelled.
pub(super) async fn withheld(ctx: &Ctx<'_>, step: &Step) -> Result<Answer, Internal> {
    let rule = halted(ctx, &step.run_id)
        .await?
        .unwrap_or_else(|| "run.cancelled".to_string());
    cancel_halted(ctx, step, rule).await
}

/// Records `step` as `cancelled` by `rule` (a stop or a run no longer active).
pub(super) async fn cancel_halted(
    ctx: &Ctx<'_>,
    step: &Step,
    rule: String,
) -> Result<Answer, Internal> {
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

/// A step the emergency stop kept from starting.
pub const STOP_RULE: &str = "emergency.stop";
