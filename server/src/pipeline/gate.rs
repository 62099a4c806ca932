//! Stage 6: deny and gate. A denied step is refused for good. A step that needs approval is
//! parked unless an approval binds exactly these inputs; a gate's window opens once per step
//! and never reopens: past it, the step expires (fail closed).

use super::answer::APPROVAL_EXPIRED;
use super::answer::Flow;
use super::answer::err;
use super::answer::expired;
use super::answer::outcome_text;
use super::answer::waiting;
use super::ctx::Ctx;
use super::ctx::detail;
use super::policy::Decided;
use super::replay::settle;
use std::ops::ControlFlow::{Break, Continue};

use countersign_core::audit::AuditEvent;
use countersign_core::store::{Run, RunStatus, Step, Transition};
use countersign_core::{Decision, StepStatus};
use serde_json::json;

/// Refuses a denied step, expires or parks a gated one without its approval; otherwise hands
/// the decision on.
pub(super) async fn refuse_or_park(
    ctx: &Ctx<'_>,
    run: &Run,
    step: &Step,
    decided: Decided,
) -> Flow<Decided> {
    match &decided.decision {
        Decision::Deny(_) => refuse(ctx, step, decided).await,
        Decision::RequireApproval(gate_rule) if decided.approval.is_none() => {
            let gate_rule = gate_rule.as_str().to_string();
            let now = ctx.state.store.clock().now_ms();
            if step.expires_at.is_some_and(|at| now >= at) {
                expire(ctx, step, decided, &gate_rule).await
            } else {
                park(ctx, run, step, decided, &gate_rule).await
            }
        }
        _ => Ok(Continue(decided)),
    }
}

async fn refuse(ctx: &Ctx<'_>, step: &Step, decided: Decided) -> Flow<Decided> {
    let answer = err(json!({"status": "denied", "rule": decided.rule, "step_id": step.id}));
    let moved = ctx
        .moved(Transition {
            step_id: step.id.clone(),
            from: decided.movable,
            to: Some(StepStatus::Refused),
            decision: Some(decided.name.into()),
            rule: Some(decided.rule),
            outcome: outcome_text(&answer),
            records: vec![decided.record],
            ..Transition::default()
        })
        .await?;
    Ok(Break(if moved {
        answer
    } else {
        settle(ctx, step).await?
    }))
}

async fn expire(ctx: &Ctx<'_>, step: &Step, decided: Decided, gate_rule: &str) -> Flow<Decided> {
    let record = ctx.record(
        AuditEvent::Expired,
        Some(step),
        Some(APPROVAL_EXPIRED),
        detail(&[("gate_rule", json!(gate_rule))]),
    );
    ctx.transition(Transition {
        step_id: step.id.clone(),
        from: decided.movable,
        to: Some(StepStatus::Expired),
        rule: Some(APPROVAL_EXPIRED.to_string()),
        records: vec![decided.record, record],
        ..Transition::default()
    })
    .await?;
    Ok(Break(expired(step)))
}

async fn park(
    ctx: &Ctx<'_>,
    run: &Run,
    step: &Step,
    decided: Decided,
    gate_rule: &str,
) -> Flow<Decided> {
    // The window opened when the step first reached its gate stays what it was: a step
    // parked again (its approval ended with a batch grant) gets no new one.
    let expires_at = step.expires_at.unwrap_or_else(|| {
        ctx.state.store.clock().now_ms()
            + i64::try_from(ctx.tool.approval_expiry().as_secs())
                .unwrap_or(i64::MAX / 2_000)
                .saturating_mul(1000)
    });
    let waiting_record = ctx.record(
        AuditEvent::WaitingApproval,
        Some(step),
        Some(gate_rule),
        detail(&[("expires_at", json!(expires_at))]),
    );
    let moved = ctx
        .transition(Transition {
            step_id: step.id.clone(),
            from: decided.movable,
            to: Some(StepStatus::NeedsApproval),
            decision: Some(decided.name.into()),
            rule: Some(decided.rule),
            expires_at: Some(expires_at),
            records: vec![decided.record, waiting_record],
            ..Transition::default()
        })
        .await?;
    Ok(Break(match moved {
        Some(step) => {
            // Only a run that goes on invites a person to the inbox: a gate in a failed run
            // is a compensation's, cancelled at once and escalated (its own notice).
            if run.status != RunStatus::Failed {
                crate::notify::gate_opened(ctx.state, &step);
            }
            waiting(&step)
        }
        None => settle(ctx, step).await?,
    }))
}
