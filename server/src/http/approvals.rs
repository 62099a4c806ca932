//! The approval API the inbox calls: pending gates a signed-in approver may decide, and the
//! decision itself.
//!
//! Invariants:
//! * Only a signed-in person with the `approver` role reaches these handlers
//!   ([`RequireRole`]); state-changing requests also pass the CSRF origin check in front.
//! * A person sees and decides only steps of their own tenant whose tool lists one of their
//!   roles as approver; any other step answers 404, as if it did not exist.
//! * The rules (approver roles, four eyes, second approver, step-up) come from the registry in
//!   force and the step's own inputs, never from the request.
//! * Every decision, from the JSON API or the inbox's HTML form, goes through [`decide_as`].
//! * A batch (`POST /api/gates/batch`) goes through [`Store::approve_batch`]: bounded by tool,
//!   listed step ids, count, proposal window and its own expiry; each step in bounds gets its
//!   own approval through the same per-step checks, every other step is refused individually
//!   and keeps waiting. A step of another tenant, or one this person may not see, answers
//!   `not_found`, as the single-step API does.
//!
//! [`Store::approve_batch`]: countersign_core::Store::approve_batch

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use countersign_core::approvals::{DecideError, Verdict};
use countersign_core::batch::{BatchError, BatchGrant, BatchOutcome, Outside, StepResult};
use countersign_core::signing::decide::Submission;
use countersign_core::store::Step;
use countersign_core::{Person, StepStatus, StoreError, ToolName};
use serde::Deserialize;
use serde_json::{Value, json};

use super::signature::{SignatureBody, relying_party, rules_under};
use crate::AppState;
use crate::auth::{Approver, RequireRole};
use crate::pipeline::gate_rules;

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

/// The step if `person` may see it: their tenant, a tool they approve.
pub async fn visible(state: &AppState, person: &Person, step: &Step) -> Result<bool, StoreError> {
    let Some(loaded) = state.registry.current() else {
        return Ok(false);
    };
    let Some(tool) = ToolName::parse(&step.tool)
        .ok()
        .and_then(|n| loaded.bundle.registry.tool(&n))
    else {
        return Ok(false);
    };
    let run = state.store.get_run(&step.run_id).await?;
    Ok(person.tenant.as_deref() == Some(run.tenant.as_str()) && approves(person, tool, step))
}

/// Whether `person` holds one of the approver roles `tool`'s rules name for `step`'s inputs
/// (the tenant is checked by the caller).
pub fn approves(person: &Person, tool: &countersign_core::registry::Tool, step: &Step) -> bool {
    let inputs: Value = serde_json::from_str(&step.inputs).unwrap_or(Value::Null);
    gate_rules(tool, &inputs)
        .approver_roles
        .iter()
        .any(|r| person.roles.iter().any(|have| have.as_str() == r))
}

/// How many waiting steps a list (`GET /api/gates`, the inbox) looks at.
pub const LIST_LIMIT: i64 = 500;

/// The steps waiting for `person`, oldest first: one query for their tenant's gates
/// ([`countersign_core::Store::waiting_for_tenant`], no lookup per gate), then the role check
/// [`visible`] applies ([`approves`]), against the registry in force. A person without a
/// tenant, or no registry in force, sees none (fails closed).
pub async fn waiting_for(
    state: &AppState,
    person: &Person,
) -> Result<Vec<(Step, Value)>, StoreError> {
    let Some(tenant) = person.tenant.as_deref().filter(|t| !t.is_empty()) else {
        return Ok(Vec::new());
    };
    let Some(loaded) = state.registry.current() else {
        return Ok(Vec::new());
    };
    // The tools whose gates this person's roles may decide (approver roles do not depend on
    // a call's inputs), filtered in the query before its limit.
    let tools: Vec<String> = loaded
        .bundle
        .registry
        .tools()
        .filter(|tool| {
            gate_rules(tool, &Value::Null)
                .approver_roles
                .iter()
                .any(|r| person.roles.iter().any(|have| have.as_str() == r))
        })
        .map(|tool| tool.name.to_string())
        .collect();
    let steps = state
        .store
        .waiting_for_tenant(tenant, &tools, LIST_LIMIT)
        .await?;
    Ok(steps
        .into_iter()
        .filter(|step| {
            ToolName::parse(&step.tool)
                .ok()
                .and_then(|n| loaded.bundle.registry.tool(&n))
                .is_some_and(|tool| approves(person, tool, step))
        })
        .map(|step| {
            let inputs = serde_json::from_str::<Value>(&step.inputs).unwrap_or(Value::Null);
            (step, inputs)
        })
        .collect())
}

/// `GET /api/gates`: steps waiting for this person, oldest first ([`waiting_for`]).
pub async fn pending(State(state): State<AppState>, approver: RequireRole<Approver>) -> Response {
    let person = approver.0;
    let steps = match waiting_for(&state, &person).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "gates: listing failed");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database did not answer",
            );
        }
    };
    let out: Vec<Value> = steps
        .into_iter()
        .map(|(step, inputs)| {
            json!({
                "step_id": step.id, "run_id": step.run_id, "tool": step.tool,
                "inputs": inputs,
                "inputs_hash": step.inputs_hash, "rule": step.rule, "reason": step.reason,
                "expires_at": step.expires_at, "created_at": step.created_at,
            })
        })
        .collect();
    Json(json!({"gates": out})).into_response()
}

/// The body of a decision.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// `approved` or `rejected`.
    pub verdict: String,
    /// Why; required.
    pub reason: String,
    /// The passkey assertion, for a gate whose tool requires a signature.
    #[serde(default)]
    pub signature: Option<SignatureBody>,
}

/// A decision that went through.
#[derive(Debug)]
pub struct Decided {
    /// The approval row.
    pub approval: countersign_core::approvals::Approval,
    /// The step's status after the decision (`pending`, `needs_approval` when a second
    /// approver is still needed, `refused`).
    pub status: Option<StepStatus>,
}

/// Why a decision did not go through.
#[derive(Debug)]
pub enum Refusal {
    /// No such step for this person (or its tool is gone): answered as if it did not exist.
    NotFound,
    /// No registry in force.
    NoRegistry,
    /// The database failed.
    Unavailable,
    /// The store's checks refused it (reason, role, window, self-approval, four eyes,
    /// step-up, already decided, not waiting).
    Decide(DecideError),
}

/// The one decision path of the JSON API and the inbox form: the step must be visible to
/// `person` (tenant, approver role of its tool), and the rules come from the registry in
/// force and the step's own inputs; [`countersign_core::Store::decide_step_signed`] checks
/// the rest, the passkey signature (`submission`) of a gate that requires one included.
pub async fn decide_as(
    state: &AppState,
    person: &Person,
    step_id: &str,
    verdict: Verdict,
    reason: &str,
    submission: Option<&Submission>,
) -> Result<Decided, Refusal> {
    let step = match state.store.get_step(step_id).await {
        Ok(s) => s,
        Err(StoreError::NotFound) => return Err(Refusal::NotFound),
        Err(e) => {
            tracing::error!(error = %e, "decision: reading the step failed");
            return Err(Refusal::Unavailable);
        }
    };
    match visible(state, person, &step).await {
        Ok(true) => {}
        Ok(false) => return Err(Refusal::NotFound),
        Err(e) => {
            tracing::error!(error = %e, "decision: visibility check failed");
            return Err(Refusal::Unavailable);
        }
    }
    let Some(loaded) = state.registry.current() else {
        return Err(Refusal::NoRegistry);
    };
    let Some(tool) = ToolName::parse(&step.tool)
        .ok()
        .and_then(|n| loaded.bundle.registry.tool(&n))
    else {
        return Err(Refusal::NotFound);
    };
    let inputs: Value = serde_json::from_str(&step.inputs).unwrap_or(Value::Null);
    let rules = gate_rules(tool, &inputs);
    let rp = relying_party(state);
    match state
        .store
        .decide_step_signed(
            rp.as_ref(),
            &step.id,
            &person.decider(),
            &rules,
            verdict,
            reason,
            submission,
        )
        .await
    {
        Ok((approval, _token)) => {
            let status = state.store.get_step(&step.id).await.ok().map(|s| s.status);
            Ok(Decided { approval, status })
        }
        Err(DecideError::Store(e)) => {
            tracing::error!(error = %e, "decision: store failed");
            Err(Refusal::Unavailable)
        }
        Err(e) => Err(Refusal::Decide(e)),
    }
}

/// `POST /api/steps/{id}/decision`: approve or reject a waiting step.
pub async fn decide(
    State(state): State<AppState>,
    approver: RequireRole<Approver>,
    Path(step_id): Path<String>,
    Json(body): Json<DecisionBody>,
) -> Response {
    let person = approver.0;
    let Some(verdict) = parse_verdict(&body.verdict) else {
        return error(
            StatusCode::BAD_REQUEST,
            "verdict must be approved or rejected",
        );
    };
    let submission = body.signature.as_ref().and_then(SignatureBody::submission);
    match decide_as(
        &state,
        &person,
        &step_id,
        verdict,
        &body.reason,
        submission.as_ref(),
    )
    .await
    {
        Ok(done) => Json(json!({
            "step_id": step_id, "decision": done.approval.decision,
            "status": done.status.map(|s| s.as_str()).unwrap_or("unknown"),
            "approval_id": done.approval.id,
        }))
        .into_response(),
        Err(Refusal::NotFound) => error(StatusCode::NOT_FOUND, "no such step"),
        Err(Refusal::NoRegistry) => error(StatusCode::SERVICE_UNAVAILABLE, "no registry in force"),
        Err(Refusal::Unavailable | Refusal::Decide(DecideError::Store(_))) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the database did not answer",
        ),
        Err(Refusal::Decide(e @ DecideError::StepUpRequired { .. })) => {
            error(StatusCode::UNAUTHORIZED, e.to_string())
        }
        Err(Refusal::Decide(DecideError::Signature(r))) => (
            StatusCode::FORBIDDEN,
            Json(json!({"error": r.to_string(), "rule": r.rule()})),
        )
            .into_response(),
        Err(Refusal::Decide(
            e @ (DecideError::NotAnApprover
            | DecideError::SelfApproval
            | DecideError::FourEyes
            | DecideError::CreatorApproval { .. }
            | DecideError::ActsForApproval { .. }
            | DecideError::NotTheParty { .. }),
        )) => error(StatusCode::FORBIDDEN, e.to_string()),
        Err(Refusal::Decide(e)) => error(StatusCode::CONFLICT, e.to_string()),
    }
}

/// `approved` / `rejected` → the verdict; anything else `None`.
pub fn parse_verdict(text: &str) -> Option<Verdict> {
    match text {
        "approved" => Some(Verdict::Approved),
        "rejected" => Some(Verdict::Rejected),
        _ => None,
    }
}

/// The body of a batch approval.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    /// The one tool the batch covers.
    pub tool: String,
    /// The target set: exactly these steps.
    pub step_ids: Vec<String>,
    /// At most this many approvals (in list order).
    pub max_count: u32,
    /// Only steps proposed at or after this instant (Unix ms)…
    pub proposed_from: i64,
    /// …and at or before this one (Unix ms).
    pub proposed_to: i64,
    /// The grant's own expiry (Unix ms); its approvals end here at the latest.
    pub expires_at: i64,
    /// Why; required, recorded on every approval.
    pub reason: String,
    /// One passkey assertion over the batch's challenge
    /// (`POST /api/gates/batch/challenge`), for tools that require a signature.
    #[serde(default)]
    pub signature: Option<SignatureBody>,
}

impl BatchBody {
    /// The grant these bounds make for `tenant`.
    pub fn into_grant(self, tenant: String) -> BatchGrant {
        BatchGrant {
            tool: self.tool,
            step_ids: self.step_ids,
            max_count: self.max_count,
            proposed_from: self.proposed_from,
            proposed_to: self.proposed_to,
            expires_at: self.expires_at,
            tenant,
            reason: self.reason,
        }
    }
}

/// `POST /api/gates/batch`: approve many waiting steps of one tool at once, within bounds.
/// Answers 200 with one result per listed step (`approved`, or `refused` with a reason code);
/// 400 for a malformed batch and 409 for an expired one (nothing written).
pub async fn batch(
    State(state): State<AppState>,
    approver: RequireRole<Approver>,
    Json(body): Json<BatchBody>,
) -> Response {
    let person = approver.0;
    let Some(tenant) = person.tenant.clone() else {
        return error(StatusCode::FORBIDDEN, "your sign-in names no tenant");
    };
    let submission = body.signature.as_ref().and_then(SignatureBody::submission);
    let grant = body.into_grant(tenant);
    let outcome = match batch_as(&state, &person, &grant, submission.as_ref()).await {
        Ok(o) => o,
        Err((status, message)) => return error(status, message),
    };
    let results: Vec<Value> = outcome
        .results
        .iter()
        .map(|(step_id, r)| match r {
            StepResult::Approved {
                approval_id,
                status,
            } => json!({
                "step_id": step_id, "result": "approved", "status": status.as_str(),
                "approval_id": approval_id,
            }),
            // Another tenant's step does not exist for this person.
            StepResult::Outside(Outside::OtherTenant | Outside::NotFound) => json!({
                "step_id": step_id, "result": "refused", "reason": "not_found",
                "message": "no such step",
            }),
            StepResult::Outside(o) => json!({
                "step_id": step_id, "result": "refused", "reason": o.code(),
                "message": outside_text(o, &grant),
            }),
            StepResult::Decide { code, message } => json!({
                "step_id": step_id, "result": "refused", "reason": code, "message": message,
            }),
        })
        .collect();
    Json(json!({
        "batch_id": outcome.batch_id,
        "approved": outcome.approved(),
        "results": results,
    }))
    .into_response()
}

/// Applies `grant` for `person` (the JSON API and the inbox's batch form): each step in bounds
/// through the per-step checks; or why the whole batch was refused (nothing written but the
/// audited refusal of a bad signature). With `submission`, its one signature over the batch
/// is verified first and then covers each signature-required step it signs.
pub async fn batch_as(
    state: &AppState,
    person: &Person,
    grant: &BatchGrant,
    submission: Option<&Submission>,
) -> Result<BatchOutcome, (StatusCode, String)> {
    let Some(loaded) = state.registry.current() else {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            "no registry in force".into(),
        ));
    };
    let rules_for = rules_under(&loaded);
    let verified = match submission {
        None => None,
        Some(sub) => {
            let rp = relying_party(state);
            match state
                .store
                .verify_batch_signature(rp.as_ref(), grant, &person.decider(), &rules_for, sub)
                .await
            {
                Ok(Ok(v)) => Some(v),
                Ok(Err(refusal)) => return Err((StatusCode::FORBIDDEN, refusal.to_string())),
                Err(BatchError::Store(e)) => {
                    tracing::error!(error = %e, "batch approval: signature check failed");
                    return Err((
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the database did not answer".into(),
                    ));
                }
                Err(e @ BatchError::Expired) => return Err((StatusCode::CONFLICT, e.to_string())),
                Err(e) => return Err((StatusCode::BAD_REQUEST, e.to_string())),
            }
        }
    };
    match state
        .store
        .approve_batch(grant, &person.decider(), rules_for, verified.as_ref())
        .await
    {
        Ok(o) => Ok(o),
        Err(BatchError::Store(e)) => {
            tracing::error!(error = %e, "batch approval: store failed");
            Err((
                StatusCode::SERVICE_UNAVAILABLE,
                "the database did not answer".into(),
            ))
        }
        Err(e @ BatchError::Expired) => Err((StatusCode::CONFLICT, e.to_string())),
        Err(e) => Err((StatusCode::BAD_REQUEST, e.to_string())),
    }
}

/// Why a listed step was outside `grant`, for people.
pub fn outside_text(o: &Outside, grant: &BatchGrant) -> String {
    match o {
        Outside::NotFound | Outside::OtherTenant => "no such step".into(),
        Outside::OtherTool => format!("not a call of {}", grant.tool),
        Outside::NotWaiting(status) => format!("step is {status}, not waiting for approval"),
        Outside::OutsideWindow => "proposed outside the batch's window".into(),
        Outside::OverCount => format!(
            "the batch approves at most {} steps; this one needs its own approval",
            grant.max_count
        ),
    }
}
