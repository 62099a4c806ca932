//! A passkey signature as a request carries it, and the relying party it is checked for:
//! shared by the decision endpoints and the passkey pages.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use countersign_core::Person;
use countersign_core::ToolName;
use countersign_core::approvals::GateRules;
use countersign_core::approvals::Verdict;
use countersign_core::batch::{BatchError, BatchGrant};
use countersign_core::signing::decide::{Issued, Submission};
use countersign_core::signing::webauthn::{Assertion, RelyingParty, b64, unb64};
use countersign_core::store::Step;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::pipeline::gate_rules;
use crate::registry::Loaded;

/// How long a browser may take over a ceremony (the WebAuthn `timeout`).
pub const CEREMONY_TIMEOUT_MS: i64 = 120_000;

/// An issued challenge as the page's script reads it.
pub fn issued_json(rp: &RelyingParty, issued: &Issued) -> Value {
    json!({
        "nonce": issued.nonce,
        "challenge": b64(&issued.challenge),
        "approval_expires_at": issued.approval_expires_at,
        "allow_credentials": issued.credential_ids,
        "rp_id": rp.id,
        "timeout_ms": CEREMONY_TIMEOUT_MS,
        "user_verification": "required",
    })
}

/// The gate rules of a step under the registry `loaded` (`None`: its tool is not there).
pub fn rules_under(loaded: &Loaded) -> impl Fn(&Step) -> Option<GateRules> + '_ {
    move |step: &Step| {
        let tool = ToolName::parse(&step.tool)
            .ok()
            .and_then(|n| loaded.bundle.registry.tool(&n))?;
        let inputs: Value = serde_json::from_str(&step.inputs).unwrap_or(Value::Null);
        Some(gate_rules(tool, &inputs))
    }
}

/// The one challenge a batch over `grant` signs (the ordered (id, inputs hash) pairs of its
/// steps that `person` may approve, as they are now, and its expiry), issued to `person`; or
/// the answer refusing it (a grant out of bounds, no relying party, no registry).
pub async fn issue_batch(
    state: &AppState,
    person: &Person,
    grant: &BatchGrant,
) -> Result<Value, Response> {
    let refuse = |status: StatusCode, code: &str, message: &str| {
        (status, Json(json!({"error": message, "code": code}))).into_response()
    };
    let Some(rp) = relying_party(state) else {
        return Err(refuse(
            StatusCode::CONFLICT,
            "no_rp",
            "passkeys need this server's public URL to be a host name",
        ));
    };
    let unavailable = |e: countersign_core::StoreError| {
        tracing::error!(error = %e, "batch challenge: store failed");
        refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the database did not answer",
        )
    };
    let Some(loaded) = state.registry.current() else {
        return Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_registry",
            "no registry in force",
        ));
    };
    let signed = match state
        .store
        .batch_signed(grant, &person.decider(), &rules_under(&loaded))
        .await
    {
        Ok(s) => s,
        Err(BatchError::Store(e)) => return Err(unavailable(e)),
        Err(e) => return Err(refuse(StatusCode::BAD_REQUEST, "batch", &e.to_string())),
    };
    let issued = state
        .store
        .issue_decision_challenge(
            &grant.tenant,
            &person.approver(),
            &signed,
            Verdict::Approved,
            grant.expires_at,
        )
        .await
        .map_err(unavailable)?;
    let mut out = issued_json(&rp, &issued);
    out["signed"] = signed.to_json();
    Ok(out)
}

/// The relying party signatures are checked for: from the public URL (a loopback address
/// stands for `localhost`); `None` when passkeys cannot work there.
pub fn relying_party(state: &AppState) -> Option<RelyingParty> {
    state.config.relying_party()
}

/// A signature as the browser sends it (base64url fields).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SignatureBody {
    /// The nonce the challenge was issued with.
    #[serde(default)]
    pub nonce: String,
    /// `rawId`.
    #[serde(default)]
    pub credential_id: String,
    /// `response.authenticatorData`.
    #[serde(default)]
    pub authenticator_data: String,
    /// `response.clientDataJSON`.
    #[serde(default)]
    pub client_data_json: String,
    /// `response.signature`.
    #[serde(default)]
    pub signature: String,
}

impl SignatureBody {
    /// The submission, or `None` when no signature was sent (all fields empty). A malformed
    /// one is a submission whose assertion cannot verify (refused, audited).
    pub fn submission(&self) -> Option<Submission> {
        if self.nonce.is_empty() && self.signature.is_empty() {
            return None;
        }
        let b = |t: &str| unb64(t, "signature field").unwrap_or_default();
        Some(Submission {
            nonce: self.nonce.clone(),
            assertion: Assertion {
                credential_id: b(&self.credential_id),
                authenticator_data: b(&self.authenticator_data),
                client_data_json: b(&self.client_data_json),
                signature: b(&self.signature),
            },
        })
    }
}
