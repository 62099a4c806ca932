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
//! * Gates of several tools ticked together, more than [`MAX_BATCH_STEPS`] or one ticked
//!   twice are refused whole (nothing decided). Only gates the person may see count towards
//!   "one tool": a step of another tenant or tool is answered as missing, step by step.
//! * The result page answers the POST itself: reloading it posts again, which decides nothing
//!   twice (a decided step is no longer waiting) but records the attempt.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use countersign_core::approvals::Verdict;
use countersign_core::batch::{BatchGrant, MAX_BATCH_STEPS, StepResult};
use countersign_core::{Person, StepStatus, ToolName};
use serde_json::Value;

use super::super::approvals::{self, Decided, Refusal, batch_as, outside_text};
use super::super::signature::{SignatureBody, issue_batch};
use super::{row, utc};
use crate::AppState;
use crate::auth::pages::{escape, page};
use crate::auth::{Approver, RequireRole};
use crate::http::admin::{coded_redirect, field, fields};
use countersign_core::signing::decide::Submission;

/// What happened to one ticked gate.
struct Line {
    what: String,
    result: Result<&'static str, String>,
}

fn back(code: &str) -> Response {
    coded_redirect("/inbox", None, Some(code))
}

/// `POST /inbox/batch` (form: `step` for every ticked gate, `verdict` = `approved` | `rejected`,
/// `reason`).
pub async fn batch_form(
    State(state): State<AppState>,
    approver: RequireRole<Approver>,
    body: Bytes,
) -> Response {
    let person = approver.0;
    let form = fields(&body);
    let value = |name: &str| field(&form, name).trim();
    let steps: Vec<String> = form
        .iter()
        .filter(|(k, _)| k == "step")
        .map(|(_, v)| v.clone())
        .collect();
    let reason = value("reason").to_string();
    if steps.is_empty() {
        return back("batch_empty");
    }
    let distinct: std::collections::BTreeSet<&String> = steps.iter().collect();
    if steps.len() > MAX_BATCH_STEPS || distinct.len() != steps.len() {
        return back("batch_refused");
    }
    if reason.is_empty() {
        return back("reason");
    }
    let Some(verdict) = approvals::parse_verdict(value("verdict")) else {
        return back("verdict");
    };
    let gates = match visible_gates(&state, &person, &steps).await {
        Ok(g) => g,
        Err(code) => return back(code),
    };
    let signature = SignatureBody {
        nonce: value("nonce").to_string(),
        credential_id: value("credential_id").to_string(),
        authenticator_data: value("authenticator_data").to_string(),
        client_data_json: value("client_data_json").to_string(),
        signature: value("signature").to_string(),
    };
    let signed_expiry = value("batch_expires_at").parse::<i64>().ok();
    let lines = match verdict {
        Verdict::Approved => {
            let signed = signature.submission().map(|s| (s, signed_expiry));
            approve(&state, &person, &steps, &gates, &reason, signed).await
        }
        Verdict::Rejected => Ok(reject(&state, &person, &steps, &gates, &reason).await),
    };
    match lines {
        Ok(lines) => result_page(&lines, verdict, state.auth.demo()),
        Err(code) => back(code),
    }
}

/// The ticked gates this person may see, by step id, described — all of one tool; or the
/// code to refuse the batch with (none visible, several tools, the database failed).
async fn visible_gates(
    state: &AppState,
    person: &Person,
    steps: &[String],
) -> Result<Gates, &'static str> {
    let now = state.store.clock().now_ms();
    let mut gates = Gates::default();
    for id in steps {
        let step = match state.store.get_step(id).await {
            Ok(s) => s,
            Err(countersign_core::StoreError::NotFound) => continue,
            Err(_) => return Err("unavailable"),
        };
        if !approvals::visible(state, person, &step)
            .await
            .map_err(|_| "unavailable")?
        {
            continue;
        }
        let inputs: Value = serde_json::from_str(&step.inputs).unwrap_or(Value::Null);
        let r = row(&step, &inputs, now);
        let mut parts = vec![r.tool];
        parts.extend(r.target);
        parts.extend(r.amount);
        let what = format!(
            "{} (waiting since {})",
            parts.join(", "),
            utc(step.updated_at)
        );
        gates.earliest = Some(
            gates
                .earliest
                .map_or(step.created_at, |e: i64| e.min(step.created_at)),
        );
        gates.tools.insert(step.tool.clone());
        gates.what.insert(id.clone(), what);
    }
    match gates.tools.len() {
        0 => Err("not_found"),
        1 => Ok(gates),
        _ => Err("batch_tools"),
    }
}

/// What [`visible_gates`] found.
#[derive(Default)]
struct Gates {
    /// Each visible gate, described before anything is decided.
    what: std::collections::BTreeMap<String, String>,
    /// Their tools (one, once checked).
    tools: std::collections::BTreeSet<String>,
    /// The earliest proposal among them (Unix ms).
    earliest: Option<i64>,
}

impl Gates {
    fn describe(&self, step_id: &str) -> String {
        self.what
            .get(step_id)
            .cloned()
            .unwrap_or_else(|| "a gate that is not yours to decide".into())
    }
}

/// The grant the inbox makes of the ticked `steps`: exactly them, proposed up to now, ending
/// with the tool's own approval expiry — or, for a signed batch, at the expiry its signature
/// binds (`signed_expiry`, never later than the tool's).
fn grant_for(
    state: &AppState,
    person: &Person,
    steps: &[String],
    gates: &Gates,
    reason: &str,
    signed_expiry: Option<i64>,
) -> Result<BatchGrant, &'static str> {
    let Some(tenant) = person.tenant.clone() else {
        return Err("not_found");
    };
    let Some(loaded) = state.registry.current() else {
        return Err("unavailable");
    };
    let Some(tool) = gates.tools.iter().next().cloned() else {
        return Err("not_found");
    };
    // The tool's own approval expiry bounds the batch (the store also caps each approval at
    // its step's gate expiry).
    let Some(expiry) = ToolName::parse(&tool)
        .ok()
        .and_then(|n| loaded.bundle.registry.tool(&n))
        .map(|t| t.approval_expiry().to_chrono().num_milliseconds())
    else {
        return Err("not_found");
    };
    let now = state.store.clock().now_ms();
    let longest = now.saturating_add(expiry);
    Ok(BatchGrant {
        tool,
        step_ids: steps.to_vec(),
        max_count: u32::try_from(steps.len()).unwrap_or(u32::MAX),
        proposed_from: gates.earliest.unwrap_or(now),
        proposed_to: now,
        expires_at: signed_expiry.map_or(longest, |e| e.min(longest)),
        tenant,
        reason: reason.to_string(),
    })
}

async fn approve(
    state: &AppState,
    person: &Person,
    steps: &[String],
    gates: &Gates,
    reason: &str,
    signed: Option<(Submission, Option<i64>)>,
) -> Result<Vec<Line>, &'static str> {
    let expiry = signed.as_ref().and_then(|(_, e)| *e);
    let grant = grant_for(state, person, steps, gates, reason, expiry)?;
    // A gate whose tool requires a signature counts only when the page's one signature over
    // the batch covers it; without one, it is refused individually and keeps waiting.
    let submission = signed.map(|(s, _)| s);
    let outcome = match batch_as(state, person, &grant, submission.as_ref()).await {
        Ok(o) => o,
        Err((StatusCode::SERVICE_UNAVAILABLE, _)) => return Err("unavailable"),
        // The one signature over the batch was refused (recorded with its rule).
        Err((StatusCode::FORBIDDEN, _)) => return Err("batch_signature"),
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
            what: gates.describe(step_id),
            result,
        });
    }
    Ok(lines)
}

async fn reject(
    state: &AppState,
    person: &Person,
    steps: &[String],
    gates: &Gates,
    reason: &str,
) -> Vec<Line> {
    let mut lines = Vec::with_capacity(steps.len());
    for step_id in steps {
        let what = gates.describe(step_id);
        let result =
            match approvals::decide_as(state, person, step_id, Verdict::Rejected, reason, None)
                .await
            {
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

fn result_page(lines: &[Line], verdict: Verdict, demo: bool) -> Response {
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
    page(StatusCode::OK, "Batch decision", &body, demo)
}

/// `POST /inbox/batch/challenge` (JSON `{"steps": [...]}`, the ticked gates in the form's
/// order): the one challenge the page's passkey signs to approve them together, for exactly
/// the grant [`batch_form`] will make of them (its expiry is sent back with the form), or
/// `{"signature": false}` when their tool requires none.
pub async fn batch_challenge(
    State(state): State<AppState>,
    approver: RequireRole<Approver>,
    axum::Json(body): axum::Json<ChallengeBody>,
) -> Response {
    use axum::response::IntoResponse;
    let person = approver.0;
    let refuse = |status: StatusCode, code: &str| {
        (status, axum::Json(serde_json::json!({"error": code}))).into_response()
    };
    let gates = match visible_gates(&state, &person, &body.steps).await {
        Ok(g) => g,
        Err(code) => return refuse(StatusCode::CONFLICT, code),
    };
    let needs = state.registry.current().is_some_and(|loaded| {
        gates
            .tools
            .iter()
            .filter_map(|t| ToolName::parse(t).ok())
            .filter_map(|n| loaded.bundle.registry.tool(&n))
            .any(|t| t.approval.as_ref().is_some_and(|a| a.signature_required))
    });
    if !needs {
        return axum::Json(serde_json::json!({"signature": false})).into_response();
    }
    let grant = match grant_for(&state, &person, &body.steps, &gates, "", None) {
        Ok(g) => g,
        Err(code) => return refuse(StatusCode::CONFLICT, code),
    };
    match issue_batch(&state, &person, &grant).await {
        Ok(mut out) => {
            out["signature"] = serde_json::json!(true);
            out["expires_at"] = serde_json::json!(grant.expires_at);
            axum::Json(out).into_response()
        }
        Err(resp) => resp,
    }
}

/// The body of [`batch_challenge`].
#[derive(Debug, serde::Deserialize)]
pub struct ChallengeBody {
    /// The ticked gates, in the form's order.
    pub steps: Vec<String>,
}
