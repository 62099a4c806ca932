//! The escalations page's server side: the rows behind [`countersign_app::escalations`] and the
//! form endpoint `POST /escalations/{id}` that acts on one.
//!
//! Invariants:
//! * Rows and actions use the same visibility ([`escalations::may_act`]): the person's tenant,
//!   the escalated tool's approver roles (or, for a tool that names none, the tenant's
//!   admins). Anything else answers as missing.
//! * The endpoint needs a signed-in person with the approver or admin role and a same-origin
//!   form (the CSRF layer in front, and [`cross_origin`] again here); every action goes
//!   through [`escalations::act`], which checks the rest. It answers with a redirect carrying
//!   a fixed code, never free text.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use countersign_app::escalations::{EscalationRow, EscalationSource, Escalations};
use countersign_app::inbox::{BoxFuture, format_amount};
use countersign_core::store::Escalation;
use countersign_core::{AppRole, Person, StoreError};
use serde_json::Value;

use super::admin::{coded_redirect, cross_origin, field, fields};
use super::inbox::{target, utc};
use super::names::Names;
use crate::AppState;
use crate::auth::CurrentUser;
use crate::escalations::{self, ActError, Acted, Action};

/// How many open escalations the page lists.
pub const LIST_LIMIT: i64 = 200;

/// The page.
const PAGE: &str = "/escalations";

/// The store-backed [`EscalationSource`].
pub struct EscalationBackend(pub AppState);

/// The context value the router provides to the dashboard.
pub fn context(state: &AppState) -> Escalations {
    Escalations(Arc::new(EscalationBackend(state.clone())))
}

impl EscalationSource for EscalationBackend {
    fn open<'a>(&'a self, person: &'a Person) -> BoxFuture<'a, Result<Vec<EscalationRow>, String>> {
        Box::pin(async move {
            rows(&self.0, person).await.map_err(|e| {
                tracing::error!(error = %e, "escalations: listing failed");
                "the database did not answer".to_string()
            })
        })
    }
}

/// What the call acts on and its amount, in words.
fn what(inputs: &Value) -> String {
    let amount = inputs
        .get("amount")
        .and_then(Value::as_f64)
        .and_then(|a| format_amount(a, inputs.get("currency").and_then(Value::as_str)));
    match (target(inputs), amount) {
        (Some(t), Some(a)) => format!("{t}, {a}"),
        (Some(t), None) => t,
        (None, Some(a)) => a,
        (None, None) => "see the run".into(),
    }
}

async fn rows(state: &AppState, person: &Person) -> Result<Vec<EscalationRow>, StoreError> {
    let Some(tenant) = person.tenant.as_deref() else {
        return Ok(Vec::new());
    };
    let open = state.store.open_escalations(tenant, LIST_LIMIT).await?;
    if open.is_empty() {
        return Ok(Vec::new());
    }
    let names = Names::load(&state.store, tenant).await?;
    let mut out = Vec::with_capacity(open.len());
    for esc in open {
        let step = state.store.get_step(&esc.step_id).await?;
        if escalations::may_act(state, person, &esc, &step).is_none()
            // Reconciliation settled it (its close is made when someone acts on it).
            || (esc.kind() == countersign_core::store::EscalationKind::Unknown
                && step.status != countersign_core::StepStatus::Unknown)
        {
            continue;
        }
        let run = state.store.get_run(&esc.run_id).await?;
        let inputs: Value = serde_json::from_str(&step.inputs).unwrap_or(Value::Null);
        out.push(EscalationRow {
            first: first_text(&esc, &names),
            undo: esc.undo_step.as_ref().map(|_| {
                format!(
                    "{} started the undo; it runs once (see the run).",
                    esc.undo_by
                        .as_deref()
                        .map_or_else(|| "Someone".to_string(), |b| names.actor(b))
                )
            }),
            id: esc.id.clone(),
            kind: esc.kind.clone(),
            tool: step.tool.clone(),
            what: what(&inputs),
            run_task: run.task,
            run_id: run.id,
            seq: step.seq,
            effect: step.effect.as_str().into(),
            reason: esc.reason.clone(),
            opened: utc(esc.opened_at),
            two_people: escalations::two_people(&step),
        });
    }
    Ok(out)
}

/// The first of two settlements, in words.
fn first_text(esc: &Escalation, names: &Names) -> Option<String> {
    let by = names.actor(esc.first_by.as_deref()?);
    Some(match esc.first_outcome.as_deref() {
        Some("happened") => format!(
            "{by} settled it as happened, reference {}; a second person must confirm the same.",
            esc.first_reference.as_deref().unwrap_or("")
        ),
        _ => format!("{by} settled it as never happened; a second person must confirm the same."),
    })
}

/// `POST /escalations/{id}` (form: `action` = `happened` | `not_happened` | `undo` |
/// `acknowledge`, `reference`, `reason`).
pub async fn act_form(
    State(state): State<AppState>,
    CurrentUser(person): CurrentUser,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    if let Some(refused) = cross_origin(&state, &headers) {
        return refused;
    }
    if !(person.has_role(AppRole::Approver) || person.has_role(AppRole::Admin)) {
        return coded_redirect(PAGE, None, Some("not_found"));
    }
    let form = fields(&body);
    let action = match field(&form, "action").trim() {
        "happened" => Action::Happened(field(&form, "reference").to_string()),
        "not_happened" => Action::NotHappened,
        "undo" => Action::Undo,
        "acknowledge" => Action::Acknowledge,
        _ => return coded_redirect(PAGE, None, Some("action")),
    };
    let reason = field(&form, "reason").to_string();
    // Its own task: a browser that goes away mid-action does not cut an undo or a settlement
    // short between its steps.
    let acting =
        tokio::spawn(async move { escalations::act(&state, &person, &id, &action, &reason).await });
    let Ok(result) = acting.await else {
        return coded_redirect(PAGE, None, Some("unavailable"));
    };
    match result {
        Ok(acted) => coded_redirect(PAGE, Some(done_code(&acted)), None),
        Err(e) => {
            if let ActError::Store(e) = &e {
                tracing::error!(error = %e, "escalation action: store failed");
            }
            coded_redirect(PAGE, None, Some(error_code(&e)))
        }
    }
}

/// The notice code of what an action did.
pub fn done_code(acted: &Acted) -> &'static str {
    match acted {
        Acted::Settled => "settled",
        Acted::FirstRecorded => "first",
        Acted::Undone => "undone",
        Acted::UndoEnded(_) => "undo_ended",
        Acted::Acknowledged => "acknowledged",
    }
}

/// The error code of a refusal.
pub fn error_code(e: &ActError) -> &'static str {
    match e {
        ActError::NotFound => "not_found",
        ActError::Closed => "closed",
        ActError::NoReason => "reason",
        ActError::NoReference => "reference",
        ActError::NotApplicable(_) => "action",
        ActError::StepUp(_) => "step_up",
        ActError::OwnRun => "own_run",
        ActError::Accountable(_) => "accountable",
        ActError::Raced => "raced",
        ActError::SameSettler => "same_settler",
        ActError::Disagrees => "disagrees",
        ActError::UndoRan(_) => "undo_ran",
        ActError::Undo(_) => "undo_failed",
        ActError::Decide(_) => "decide",
        ActError::Store(_) => "unavailable",
    }
}
