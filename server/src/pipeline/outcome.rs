//! Stages 10–12: the adapter's outcome (step status, key, audit) in one transaction.

use super::answer::Answer;
use super::answer::Internal;
use super::answer::err;
use super::answer::ok;
use super::answer::outcome_text;
use super::ctx::Ctx;
use super::ctx::detail;
use super::halt::withheld;
use super::redact::redacted;
use crate::adapters::AdapterError;
use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::store::{KeyState, RunGuard, Step, Transition};
use countersign_core::{Effect, StepStatus};
use serde_json::{Value, json};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// [reads] What a read's closing transition also writes: the decision and the records of
/// the opening it skipped (stage 7, `key::take`).
pub(super) struct Opening {
    pub(super) decision: String,
    pub(super) rule: String,
    pub(super) records: Vec<(AuditEvent, NewAuditRecord)>,
    /// The stop and run conditions the call skipped checking before it ran.
    pub(super) guard: RunGuard,
    /// A prepared read's row, written by the closing transition ([`Transition::insert`]).
    pub(super) insert: Option<Box<Step>>,
}

/// `t` (a transition out of `running`), or for a read the same transition out of
/// `pending|failed` carrying its opening's decision and attempt, its records folded into one
/// ([`folded`]).
pub(super) fn closing(opening: Option<Opening>, mut t: Transition) -> Transition {
    if let Some(o) = opening {
        t.from = vec![StepStatus::Pending, StepStatus::Failed];
        t.decision = Some(o.decision);
        t.rule = t.rule.or(Some(o.rule));
        t.bump_attempts = true;
        t.guard = Some(o.guard);
        t.insert = o.insert;
        t.records = folded(o.records, std::mem::take(&mut t.records));
    }
    t
}

pub use countersign_core::audit::members::{DECISION_RULE, FOLDED};

/// Whether stored record text `record` is a read's one record standing for an `event` record
/// too ([`FOLDED`]).
pub fn folds(record: &str, event: AuditEvent) -> bool {
    // Most records fold nothing: parse only those that name the member.
    record.contains(&format!("\"{FOLDED}\":"))
        && serde_json::from_str::<Value>(record).is_ok_and(|v| {
            v.get("detail")
                .and_then(|d| d.get(FOLDED))
                .and_then(Value::as_array)
                .is_some_and(|events| events.iter().any(|e| e == event.as_str()))
        })
}

/// [reads] A read's records as one: its outcome's record (`succeeded` or `failed`), carrying
/// every member of the records its opening skipped writing (`decided`: the decision, the
/// inputs, their hash, the policy; `started`: the key and the attempt), the outcome's own
/// members winning, and [`FOLDED`] naming those events in order. A read has no effect to
/// guard, so nothing happens between its decision and its outcome that a separate record
/// would show; one record is one row and one index entry set instead of three (issue 34).
/// Anything but one outcome record is kept as it was (the opening's records first).
fn folded(
    opening: Vec<(AuditEvent, NewAuditRecord)>,
    mut outcome: Vec<(AuditEvent, NewAuditRecord)>,
) -> Vec<(AuditEvent, NewAuditRecord)> {
    if outcome.len() != 1 || opening.is_empty() {
        let mut records = opening;
        records.append(&mut outcome);
        return records;
    }
    let Some((event, mut last)) = outcome.pop() else {
        return opening;
    };
    let mut detail = serde_json::Map::new();
    let mut events = Vec::with_capacity(opening.len());
    let mut decision_rule = None;
    for (e, r) in opening {
        events.push(e.as_str());
        if e == AuditEvent::Decided {
            decision_rule = r.rule;
        }
        detail.extend(r.detail);
    }
    detail.extend(std::mem::take(&mut last.detail));
    detail.insert(FOLDED.into(), json!(events));
    match (&last.rule, decision_rule) {
        (None, rule) => last.rule = rule,
        (Some(own), Some(rule)) if *own != rule => {
            detail.insert(DECISION_RULE.into(), json!(rule));
        }
        _ => {}
    }
    last.detail = detail;
    vec![(event, last)]
}

/// What an adapter's outcome makes of the step, its key, its record and the answer.
struct Settled {
    status: StepStatus,
    key: KeyState,
    event: AuditEvent,
    rule: Option<&'static str>,
    answer: Answer,
    extra: Vec<(&'static str, Value)>,
}

/// Stage 10, the outcome's meaning: a success (its result shown as the tool redacts it); a
/// timed-out irreversible call `unknown` (reconciled, never retried blind); any other failure
/// `failed`, retryable while attempts remain when the target was unavailable or slow.
fn settled(
    ctx: &Ctx<'_>,
    step: &Step,
    attempts: i64,
    outcome: Result<Value, AdapterError>,
) -> Settled {
    match outcome {
        Ok(result) => Settled {
            status: StepStatus::Done,
            key: KeyState::Done,
            event: AuditEvent::Succeeded,
            rule: None,
            answer: ok(redacted(&ctx.state.shown_key, ctx.tool, &result)),
            extra: vec![(
                "reference",
                result.get("ref").cloned().unwrap_or(Value::Null),
            )],
        },
        Err(AdapterError::Timeout) if ctx.tool.effect == Effect::Irreversible => Settled {
            status: StepStatus::Unknown,
            key: KeyState::Unknown,
            event: AuditEvent::Unknown,
            rule: Some(TARGET_TIMEOUT),
            answer: ok(json!({"status": "unknown", "step_id": step.id,
                      "message": "no answer in time; Countersign reconciles it with the target"})),
            extra: vec![],
        },
        Err(e) => {
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
            Settled {
                status: StepStatus::Failed,
                key: if retryable {
                    KeyState::Failed
                } else {
                    KeyState::Done
                },
                event: AuditEvent::Failed,
                rule: Some(TARGET_FAILED),
                answer: err(json!({"status": "failed", "step_id": step.id, "code": code,
                           "message": message, "retryable": retryable})),
                extra: vec![("code", json!(code)), ("retryable", json!(retryable))],
            }
        }
    }
}

/// 11–12: records the adapter's outcome (step status, key, audit) in one transaction.
pub(super) async fn finish(
    ctx: &Ctx<'_>,
    step: &Step,
    opening: Option<Opening>,
    outcome: Result<Value, AdapterError>,
    latency: Duration,
) -> Result<Answer, Internal> {
    let latency_ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
    let dedupe = !matches!(ctx.tool.effect, Effect::Read);
    // This attempt is counted already, or (a read) counted with its outcome.
    let attempts = step.attempts + i64::from(opening.is_some());
    let Settled {
        status,
        key,
        event,
        rule,
        answer,
        extra,
    } = settled(ctx, step, attempts, outcome);
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

/// Executions of one step, at most (retryable failures only).
pub const MAX_ATTEMPTS: i64 = 4;

/// An irreversible call got no answer in time: reconcile, never retry.
pub const TARGET_TIMEOUT: &str = "target.timeout";

/// The target did not complete the call.
pub const TARGET_FAILED: &str = "target.failed";
