//! A step that failed closed on revalidation, and what the agent may see of the fields.

use super::answer::Answer;
use super::answer::Internal;
use super::answer::err;
use super::answer::outcome_text;
use super::ctx::Ctx;
use super::ctx::detail;
use super::halt::withheld;
use super::outcome::Opening;
use super::outcome::closing;
use super::redact::hash_value;
use super::redact::redacted;
use countersign_core::audit::AuditEvent;
use countersign_core::store::{KeyState, Step, Transition};
use countersign_core::{Effect, StepStatus};
use serde_json::{Map, Value, json};

/// Revalidation's `{field, expected, current}` entries as the agent and the audit may see
/// them: where the field is redacted by the tool (its arguments) or by its verify tool (the
/// state read back), both values are shown as their SHA-256 digests (equal values still
/// compare equal), never in clear.
pub(super) fn hidden_fields(ctx: &Ctx<'_>, fields: &[Value]) -> Vec<Value> {
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
pub(super) async fn fail_closed(
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
