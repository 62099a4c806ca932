//! An identical call that already has a step: where it stands, as the caller hears it.

use super::answer::APPROVAL_EXPIRED;
use super::answer::Answer;
use super::answer::Internal;
use super::answer::err;
use super::answer::expired;
use super::answer::ok;
use super::answer::stored_outcome;
use super::answer::waiting;
use super::ctx::Ctx;
use super::ctx::detail;
use super::outcome::MAX_ATTEMPTS;
use countersign_core::StepStatus;
use countersign_core::audit::AuditEvent;
use countersign_core::store::{KeyState, Step, Transition};
use serde_json::{Map, json};
use std::time::{Duration, Instant};

/// An identical write already has a step: answer with where it stands, or `None` to carry on
/// through the pipeline (a pending step, or a failed one that may be retried).
pub(super) async fn replay(ctx: &Ctx<'_>, step: &Step) -> Result<Option<Answer>, Internal> {
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

/// Waits for the holder of `step`'s key to finish, then answers with its outcome.
pub(super) async fn await_key(ctx: &Ctx<'_>, step: &Step) -> Result<Answer, Internal> {
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

/// Another caller moved the step first: report where it ends up.
pub(super) async fn settle(ctx: &Ctx<'_>, step: &Step) -> Result<Answer, Internal> {
    let now = ctx.state.store.get_step(&step.id).await?;
    match now.status {
        StepStatus::NeedsApproval => Ok(waiting(&now)),
        StepStatus::Expired => Ok(expired(&now)),
        _ => await_key(ctx, &now).await,
    }
}

/// How long a caller waits for an identical call already in flight before it is told so.
pub const IN_FLIGHT_WAIT: Duration = Duration::from_secs(30);
