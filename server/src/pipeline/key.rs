//! Stage 7: take the step and reserve its key. A write moves from the status the caller read
//! (`pending`, or `failed` when it may be retried) to `running`
//! (the step row is the mutex among callers and workers) and reserves its key in the same
//! transaction: a step is never running without its key (a crash after it leaves both, which
//! the reconciler settles by key). A key that existed already is an earlier attempt's, which
//! says what this one may do. [reads] A read has no effect to guard and no key: it is not
//! taken before its call; its decided and started records are folded into its outcome's
//! (`outcome::folded`).

use super::answer::Flow;
use super::answer::Internal;
use super::answer::{Answer, err, ok, outcome_text, stored_outcome};
use super::ctx::Ctx;
use super::ctx::detail;
use super::failpoint::failpoint;
use super::halt::cancel_halted;
use super::halt::halt_guard;
use super::halt::halted;
use super::outcome::Opening;
use super::outcome::{TARGET_FAILED, TARGET_TIMEOUT};
use super::replay::settle;
use countersign_core::store::KeyState;
use std::ops::ControlFlow::{Break, Continue};

use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::store::{KeyClaim, Run, Step, Transition};
use countersign_core::{Effect, StepStatus};
use serde_json::json;

/// The same step (key) asked for with other inputs.
pub const IDEMPOTENCY_MISMATCH: &str = "idempotency.mismatch";

/// What the step's start carries of policy's decision.
pub(super) struct Start {
    /// The decision's name.
    pub(super) name: &'static str,
    /// Its rule.
    pub(super) rule: String,
    /// The `decided` record.
    pub(super) record: (AuditEvent, NewAuditRecord),
    /// The statuses the step may move from.
    pub(super) movable: Vec<StepStatus>,
}

/// The step as taken: running under its key (a write), or with what its closing transition
/// will write first (a read's [`Opening`]).
pub(super) struct Taken {
    /// The step.
    pub(super) step: Step,
    /// A read's opening; `None` for a write.
    pub(super) opening: Option<Opening>,
}

/// Takes `step` for this attempt (see the module doc); `written`: its row exists.
pub(super) async fn take(
    ctx: &Ctx<'_>,
    run: &Run,
    step: Step,
    start: Start,
    written: bool,
) -> Flow<Taken> {
    let store = &ctx.state.store;
    let started_record = ctx.record(
        AuditEvent::Started,
        Some(&step),
        Some(&start.rule),
        detail(&[
            ("idem_key", json!(step.idem_key)),
            ("trace_id", json!(ctx.trace)),
            ("attempt", json!(ctx.trace_id)),
        ]),
    );
    if matches!(ctx.tool.effect, Effect::Read) {
        let opening = Opening {
            decision: start.name.into(),
            rule: start.rule,
            records: vec![start.record, started_record],
            guard: halt_guard(ctx, &run.id),
            insert: (!written).then(|| Box::new(step.clone())),
        };
        failpoint("after_start");
        return Ok(Continue(Taken {
            step,
            opening: Some(opening),
        }));
    }
    let started = store
        .start_step(&Transition {
            step_id: step.id.clone(),
            from: start.movable,
            to: Some(StepStatus::Running),
            decision: Some(start.name.into()),
            rule: Some(start.rule.clone()),
            bump_attempts: true,
            records: vec![start.record, started_record],
            // [stop] The world read before policy may be stale: a cancel or the emergency
            // stop that landed since (policy and facts took time) keeps the step from starting.
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
            return Ok(Break(cancel_halted(ctx, &step, rule).await?));
        }
        return Ok(Break(settle(ctx, &step).await?));
    };
    // The row as the transition wrote it (not read back).
    let step = Step {
        status: StepStatus::Running,
        decision: Some(start.name.into()),
        rule: Some(start.rule),
        attempts: step.attempts + 1,
        updated_at: store.clock().now_ms(),
        ..step
    };
    failpoint("after_start");
    if !reserved {
        let Some(key) = store.get_key(&step.idem_key).await? else {
            return Err(Internal(format!("the key of step {} vanished", step.id)));
        };
        if let Some(answer) = existing_key(ctx, &step, &key).await? {
            return Ok(Break(answer));
        }
    }
    Ok(Continue(Taken {
        step,
        opening: None,
    }))
}

/// The step's key was reserved before (an earlier attempt). `None`: this caller took it over
/// (a failed attempt that never reached the target) and goes on to call the adapter; otherwise
/// the answer, without calling it: the stored outcome, a mismatch refusal, or `unknown` for
/// the reconciler when an earlier attempt may still have reached the target.
pub(super) async fn existing_key(
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
