//! A passkey signature as a request carries it, and the relying party it is checked for:
//! shared by the decision endpoints and the passkey pages.

use countersign_core::signing::decide::Submission;
use countersign_core::signing::webauthn::{Assertion, RelyingParty, unb64};
use serde::Deserialize;

use crate::AppState;

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
