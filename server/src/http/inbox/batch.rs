//! `POST /inbox/batch`: the inbox's batch decision (issue 36) — several waiting gates of one
//! tool, ticked in the list, approved or rejected with one reason.
//!
//! Invariants (each fails closed):
//! * Approver role and same-origin form only (the router's CSRF layer and [`RequireRole`]).
//! * An approval goes through the JSON API's bounded batch ([`approvals::batch_as`]): one
//!   tool, exactly the ticked steps, at most that many, proposed up to now, approvals ending
//!   no later than the tool's own approval expiry; each step through the same per-step checks
//!   (role, step-up, duties, four eyes). A rejection is each step's own decision
//!   ([`approvals::decide_as`]). A step refused for any reason keeps waiting, and the result
//!   page says why, step by step.
//! * Gates of several tools ticked together are refused whole (nothing decided).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use countersign_core::approvals::Verdict;
use countersign_core::batch::{BatchGrant, StepResult};
use countersign_core::{Person, StepStatus, ToolName};
use serde_json::Value;

use super::super::approvals::{self, Decided, Refusal, batch_as, outside_text};
use super::{row, utc};
use crate::AppState;
use crate::auth::pages::{escape, page};
use crate::auth::{Approver, RequireRole};

/// How long a batch's approvals last when the tool names no approval expiry.
const DEFAULT_EXPIRY_MS: i64 = 72 * 3_600_000;

/// What happened to one ticked gate.
struct Line {
    what: String,
    result: Result<&'static str, String>,
}

fn back(code: &str) -> Response {
    Redirect::to(&format!("/inbox?error={code}")).into_response()
}

/// `POST /inbox/batch` (form: `step` for every ticked gate, `verdict` = `approved` | `rejected`,
/// `reason`).
pub async fn batch_form(
    State(state): State<AppState>,
    approver: RequireRole<Approver>,
    body: Bytes,
) -> Response {
    let person = approver.0;
    let form: Vec<(String, String)> = url::form_urlencoded::parse(&body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.trim())
    };
    let steps: Vec<String> = form
        .iter()
        .filter(|(k, _)| k == "step")
        .map(|(_, v)| v.clone())
        .collect();
    let reason = field("reason").to_string();
    if steps.is_empty() {
        return back("batch_empty");
    }
    if reason.is_empty() {
        return back("reason");
    }
    let Some(verdict) = approvals::parse_verdict(field("verdict")) else {
        return back("verdict");
    };
    let lines = match verdict {
        Verdict::Approved => approve(&state, &person, &steps, &reason).await,
        Verdict::Rejected => Ok(reject(&state, &person, &steps, &reason).await),
    };
    match lines {
        Ok(lines) => result_page(&lines, verdict),
        Err(code) => back(code),
    }
}

/// What a gate is, in words: tool, target and amount (or `a gate` when it is not the
/// person's to see).
async fn described(state: &AppState, person: &Person, step_id: &str) -> String {
    let now = state.store.clock().now_ms();
    match state.store.get_step(step_id).await {
        Ok(step)
            if approvals::visible(state, person, &step)
                .await
                .unwrap_or(false) =>
        {
            let inputs: Value = serde_json::from_str(&step.inputs).unwrap_or(Value::Null);
            let r = row(&step, &inputs, now);
            let mut parts = vec![r.tool];
            parts.extend(r.target);
            parts.extend(r.amount);
            format!(
                "{} (waiting since {})",
                parts.join(", "),
                utc(step.updated_at)
            )
        }
        _ => "a gate that is not yours to decide".into(),
    }
}

async fn approve(
    state: &AppState,
    person: &Person,
    steps: &[String],
    reason: &str,
) -> Result<Vec<Line>, &'static str> {
    let Some(tenant) = person.tenant.clone() else {
        return Err("not_found");
    };
    let Some(loaded) = state.registry.current() else {
        return Err("unavailable");
    };
    // The one tool: every ticked gate's (a gate that cannot be read counts as none).
    let mut tools = std::collections::BTreeSet::new();
    for id in steps {
        if let Ok(step) = state.store.get_step(id).await {
            tools.insert(step.tool);
        }
    }
    let mut tools = tools.into_iter();
    let (Some(tool), None) = (tools.next(), tools.next()) else {
        return Err("batch_tools");
    };
    let expiry = ToolName::parse(&tool)
        .ok()
        .and_then(|n| loaded.bundle.registry.tool(&n))
        .and_then(|t| t.approval.as_ref())
        .map_or(DEFAULT_EXPIRY_MS, |a| {
            i64::try_from(a.expires.as_secs()).unwrap_or(i64::MAX / 1000) * 1000
        });
    let now = state.store.clock().now_ms();
    let grant = BatchGrant {
        tool,
        step_ids: steps.to_vec(),
        max_count: u32::try_from(steps.len()).unwrap_or(u32::MAX),
        proposed_from: 0,
        proposed_to: now,
        expires_at: now.saturating_add(expiry),
        tenant,
        reason: reason.to_string(),
    };
    let outcome = match batch_as(state, person, &grant).await {
        Ok(o) => o,
        Err((StatusCode::SERVICE_UNAVAILABLE, _)) => return Err("unavailable"),
        Err(_) => return Err("batch_refused"),
    };
    let mut lines = Vec::with_capacity(outcome.results.len());
    for (step_id, result) in &outcome.results {
        let result = match result {
            StepResult::Approved {
                status: StepStatus::NeedsApproval,
                ..
            } => Ok("approved by you; it needs a second approver before it runs"),
            StepResult::Approved { .. } => Ok("approved"),
            StepResult::Outside(o) => Err(outside_text(o, &grant)),
            StepResult::Decide { message, .. } => Err(message.clone()),
        };
        lines.push(Line {
            what: described(state, person, step_id).await,
            result,
        });
    }
    Ok(lines)
}

async fn reject(state: &AppState, person: &Person, steps: &[String], reason: &str) -> Vec<Line> {
    let mut lines = Vec::with_capacity(steps.len());
    for step_id in steps {
        let what = described(state, person, step_id).await;
        let result =
            match approvals::decide_as(state, person, step_id, Verdict::Rejected, reason).await {
                Ok(Decided { .. }) => Ok("rejected: it will never run"),
                Err(Refusal::NotFound) => Err("no such gate waiting for you".to_string()),
                Err(Refusal::NoRegistry | Refusal::Unavailable) => {
                    Err("the database did not answer; try again".to_string())
                }
                Err(Refusal::Decide(e)) => Err(e.to_string()),
            };
        lines.push(Line { what, result });
    }
    lines
}

fn result_page(lines: &[Line], verdict: Verdict) -> Response {
    let (done, refused): (Vec<&Line>, Vec<&Line>) = lines.iter().partition(|l| l.result.is_ok());
    let item = |l: &Line| {
        let (class, text) = match &l.result {
            Ok(t) => ("batch-done", (*t).to_string()),
            Err(why) => ("batch-refused", format!("not decided: {why}")),
        };
        format!(
            "<li data-testid=\"{class}\"><span class=\"font-medium\">{}</span> — {}</li>",
            escape(&l.what),
            escape(&text)
        )
    };
    let list = |ls: &[&Line]| ls.iter().map(|l| item(l)).collect::<String>();
    let verb = match verdict {
        Verdict::Approved => "approved",
        Verdict::Rejected => "rejected",
    };
    let body = format!(
        "<p role=\"status\">{} of {} gate(s) {verb}; {} not decided, still waiting.</p>\
         <h2 class=\"text-lg font-semibold\">Decided</h2><ul class=\"list-disc pl-5\">{}</ul>\
         <h2 class=\"text-lg font-semibold\">Not decided</h2><ul class=\"list-disc pl-5\">{}</ul>\
         <p><a class=\"underline\" href=\"/inbox\">Back to the inbox</a></p>",
        done.len(),
        lines.len(),
        refused.len(),
        list(&done),
        list(&refused)
    );
    page(StatusCode::OK, "Batch decision", &body, false)
}
