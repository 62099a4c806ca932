//! The approval inbox's server side: the data behind the dashboard's inbox pages
//! ([`countersign_app::inbox`]) and the HTML form endpoint that records a decision.
//!
//! Invariants:
//! * Only a signed-in approver gets gate data (the app's server functions check the role
//!   before asking [`InboxBackend`]); a gate is visible exactly when
//!   [`approvals::visible`] says so (tenant, the tool's approver roles), the same check the
//!   JSON API uses. The list is the JSON API's ([`approvals::waiting_for`]): the person's
//!   tenant's gates in one query, the same role check; a person without a tenant sees none.
//! * `POST /inbox/{id}/decision` needs the `approver` role, passes the CSRF origin check in
//!   front of the router, and decides through [`approvals::decide_as`], the one decision path
//!   (reason required, four eyes, self-approval, step-up, second approver). It answers with a
//!   redirect carrying a fixed code, never free text.

mod batch;
mod signing;
pub use batch::{batch_challenge, batch_form};

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use countersign_app::inbox::{
    BoxFuture, GateDetail, GateRow, HistoryRow, Inbox, InboxSource, expires_text, format_amount,
    pretty_canonical,
};
use countersign_core::approvals::{DecideError, Verdict};
use countersign_core::signing::verified::SignatureRefusal;
use countersign_core::store::Step;
use countersign_core::{Person, StepStatus, StoreError, ToolName};
use serde::Deserialize;
use serde_json::Value;

use super::approvals::{self, Decided, Refusal};
use super::names::Names;
use super::signature::SignatureBody;
use crate::AppState;
use crate::auth::{Approver, RequireRole};
use crate::pipeline::gate_rules;

/// The store-backed [`InboxSource`].
pub struct InboxBackend(pub AppState);

/// The context value the router provides to the dashboard.
pub fn context(state: &AppState) -> Inbox {
    Inbox(Arc::new(InboxBackend(state.clone())))
}

pub(crate) fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || "unknown time".into(),
        |t| t.format("%Y-%m-%d %H:%M UTC").to_string(),
    )
}

/// What the call acts on: the first `*_id` input, e.g. `invoice INV-1`.
pub(crate) fn target(inputs: &Value) -> Option<String> {
    let map = inputs.as_object()?;
    let preferred = [
        "invoice_id",
        "supplier_id",
        "vendor_id",
        "order_id",
        "po_id",
    ];
    let key = preferred
        .iter()
        .find(|k| map.get(**k).is_some_and(Value::is_string))
        .map(|k| (*k).to_string())
        .or_else(|| {
            map.iter()
                .find(|(k, v)| k.ends_with("_id") && v.is_string())
                .map(|(k, _)| k.clone())
        })?;
    let value = map.get(&key)?.as_str()?;
    // Countersign's own ids (a run, a step) are UUIDs: shortened to their last 8 hex digits,
    // random in every version (a step id's first ones are its time: version 7), the whole one
    // stays in the record.
    let value = if is_uuid(value) { &value[28..] } else { value };
    Some(format!(
        "{} {value}",
        key.trim_end_matches("_id").replace('_', " ")
    ))
}

/// Whether `s` is a UUID in its hyphenated text form.
fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn row(step: &Step, inputs: &Value, now: i64) -> GateRow {
    let currency = inputs.get("currency").and_then(Value::as_str);
    let amount = inputs
        .get("amount")
        .and_then(Value::as_f64)
        .and_then(|a| format_amount(a, currency));
    // Exact minor units from the amount's decimal text, for the batch total.
    let amount_minor = match (inputs.get("amount"), currency) {
        (Some(Value::Number(n)), Some(c)) => {
            countersign_core::policy::money::to_minor_units(n, c).ok()
        }
        _ => None,
    };
    GateRow {
        step_id: step.id.clone(),
        tool: step.tool.clone(),
        amount,
        amount_minor,
        exponent: currency
            .and_then(countersign_core::policy::money::minor_exponent)
            .unwrap_or(2),
        currency: currency.map(str::to_string),
        target: target(inputs),
        expires: expires_text(step.expires_at, now),
        waiting_since: utc(step.updated_at),
    }
}

impl InboxBackend {
    async fn list(&self, person: &Person) -> Result<Vec<GateRow>, StoreError> {
        let now = self.0.store.clock().now_ms();
        // The same list as `GET /api/gates`: one query for the tenant's gates, the role check
        // `approvals::visible` applies.
        Ok(approvals::waiting_for(&self.0, person)
            .await?
            .iter()
            .map(|(step, inputs)| row(step, inputs, now))
            .collect())
    }

    async fn detail(
        &self,
        person: &Person,
        step_id: &str,
    ) -> Result<Option<GateDetail>, StoreError> {
        let state = &self.0;
        let step = match state.store.get_step(step_id).await {
            Ok(s) => s,
            Err(StoreError::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !approvals::visible(state, person, &step).await? {
            return Ok(None);
        }
        let Some(loaded) = state.registry.current() else {
            return Ok(None);
        };
        let Some(tool) = ToolName::parse(&step.tool)
            .ok()
            .and_then(|n| loaded.bundle.registry.tool(&n))
        else {
            return Ok(None);
        };
        let now = state.store.clock().now_ms();
        let inputs: Value = serde_json::from_str(&step.inputs).unwrap_or(Value::Null);
        let rules = gate_rules(tool, &inputs);
        // The approvals the gate counts, as it counts them (signed ones only where the tool
        // requires signatures), read once for the count and the signature list.
        let counted: Vec<_> = state
            .store
            .approvals_for_step(&step.id)
            .await?
            .into_iter()
            .filter(|a| {
                a.decision == "approved"
                    && a.inputs_hash == step.inputs_hash
                    && a.expires_at > now
                    && (!rules.signature_required || a.signature.is_some())
            })
            .collect();
        let given = counted.len();
        let evidence = serde_json::from_str::<Vec<Value>>(&step.evidence)
            .unwrap_or_default()
            .into_iter()
            .map(|v| match v {
                Value::String(s) => s,
                other => other.to_string(),
            })
            .collect();
        let names = Names::load(&state.store, person.tenant.as_deref().unwrap_or_default()).await?;
        let signature = signing::signature_needs(
            state, person, &step, tool, &rules, &inputs, &counted, &names,
        )
        .await?;
        let history = state
            .store
            .audit_for_step(&step.run_id, &step.id, HISTORY_LIMIT)
            .await?
            .into_iter()
            .map(|r| HistoryRow {
                event: r.event,
                at: utc(r.at),
                actor: r
                    .actor
                    .as_deref()
                    .map_or_else(|| "—".into(), |a| names.actor(a)),
                actor_id: r.actor,
            })
            .collect();
        Ok(Some(GateDetail {
            row: row(&step, &inputs, now),
            run_id: step.run_id.clone(),
            status: step.status.as_str().to_string(),
            inputs: pretty_canonical(&step.inputs),
            inputs_hash: step.inputs_hash.clone(),
            reason: step.reason.clone(),
            evidence,
            rule: step.rule.clone(),
            effect: step.effect.as_str().to_string(),
            compensate: tool.compensate.as_ref().map(ToString::to_string),
            approvals_needed: rules.approvals_needed,
            approvals_given: u32::try_from(given).unwrap_or(u32::MAX),
            four_eyes: rules.four_eyes,
            step_up_minutes: rules.step_up_max_age_ms.map(|ms| ms / 60_000),
            history,
            signature,
        }))
    }
}

/// The most records a gate's history shows (a step has a handful; a bound, not a page).
const HISTORY_LIMIT: i64 = 200;

impl InboxSource for InboxBackend {
    fn gates<'a>(&'a self, person: &'a Person) -> BoxFuture<'a, Result<Vec<GateRow>, String>> {
        Box::pin(async move {
            self.list(person).await.map_err(|e| {
                tracing::error!(error = %e, "inbox: listing failed");
                "the database did not answer".to_string()
            })
        })
    }

    fn gate<'a>(
        &'a self,
        person: &'a Person,
        step_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<GateDetail>, String>> {
        Box::pin(async move {
            self.detail(person, step_id).await.map_err(|e| {
                tracing::error!(error = %e, "inbox: reading a gate failed");
                "the database did not answer".to_string()
            })
        })
    }
}

/// The decision form's fields.
#[derive(Debug, Deserialize)]
pub struct DecisionForm {
    /// `approved` or `rejected`.
    #[serde(default)]
    verdict: String,
    /// Why; required.
    #[serde(default)]
    reason: String,
    /// The passkey assertion the page's script adds for a gate that requires a signature
    /// (all empty otherwise).
    #[serde(flatten)]
    signature: SignatureBody,
}

fn encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// `POST /inbox/{id}/decision` (HTML form): decides, then redirects to the inbox with
/// `?done=` or back to the gate with `?error=`.
pub async fn decide_form(
    State(state): State<AppState>,
    approver: RequireRole<Approver>,
    Path(step_id): Path<String>,
    Form(form): Form<DecisionForm>,
) -> Response {
    let person = approver.0;
    let back = |code: &str| {
        Redirect::to(&format!("/inbox/{}?error={code}", encode(&step_id))).into_response()
    };
    let Some(verdict) = approvals::parse_verdict(&form.verdict) else {
        return back("verdict");
    };
    let submission = form.signature.submission();
    match approvals::decide_as(
        &state,
        &person,
        &step_id,
        verdict,
        &form.reason,
        submission.as_ref(),
    )
    .await
    {
        Ok(Decided { status, .. }) => {
            let done = match (verdict, status) {
                (Verdict::Rejected, _) => "rejected",
                (Verdict::Approved, Some(StepStatus::NeedsApproval)) => "recorded",
                (Verdict::Approved, _) => "approved",
            };
            tracing::info!(step = %step_id, sub = %person.sub, done, "inbox decision");
            Redirect::to(&format!("/inbox?done={done}")).into_response()
        }
        Err(Refusal::NotFound) => back("not_found"),
        Err(Refusal::NoRegistry | Refusal::Unavailable) => back("unavailable"),
        Err(Refusal::Decide(e)) => back(match e {
            DecideError::NoReason => "reason",
            DecideError::StepUpRequired { .. } => "step_up",
            DecideError::CreatorApproval { .. } => "creator",
            DecideError::ActsForApproval { .. } => "acts_for",
            DecideError::FourEyes => "four_eyes",
            DecideError::FourEyesUnknownCreator { .. } => "four_eyes_unknown",
            DecideError::SelfApproval => "self",
            DecideError::NotAnApprover => "not_approver",
            DecideError::NotTheParty { .. } => "not_party",
            DecideError::AlreadyDecided => "already",
            DecideError::Expired => "expired",
            DecideError::NotWaiting(_) => "not_waiting",
            DecideError::Signature(r) => signature_code(r),
            DecideError::Store(_) => "unavailable",
        }),
    }
}

/// The page's code for a refused signature.
pub(crate) fn signature_code(r: SignatureRefusal) -> &'static str {
    match r {
        SignatureRefusal::Missing => "signature_missing",
        SignatureRefusal::UnknownNonce
        | SignatureRefusal::Replayed
        | SignatureRefusal::NonceExpired => "signature_again",
        SignatureRefusal::Challenge | SignatureRefusal::Invalid => "signature_invalid",
        SignatureRefusal::Credential => "signature_credential",
        SignatureRefusal::UserVerification => "signature_uv",
        SignatureRefusal::Counter => "signature_counter",
        SignatureRefusal::SameSigner => "signature_same",
        SignatureRefusal::NoRelyingParty => "signature_no_rp",
    }
}

#[cfg(test)]
mod tests {
    use super::target;
    use serde_json::json;

    #[test]
    fn a_uuid_in_a_label_is_shortened_to_its_random_end() {
        // Two version 7 step ids of one millisecond share their first digits (the time).
        let a = "019af1c2-7d3e-7a01-8b2c-4d5e6f708192";
        let b = "019af1c2-7d3e-7a01-8b2c-4d5e6f70aabb";
        let label = |id: &str| target(&json!({ "step_id": id })).unwrap();
        assert_eq!(label(a), "step 6f708192");
        assert_ne!(label(a), label(b));
        assert_eq!(
            target(&json!({ "invoice_id": "INV-1" })).as_deref(),
            Some("invoice INV-1")
        );
    }
}
