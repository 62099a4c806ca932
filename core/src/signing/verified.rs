//! What a verified signature is, and why one is refused: the types the decision path
//! ([`crate::approvals`]) checks, below it so that it need not import the verifier.
//!
//! Invariants:
//! * A [`VerifiedSignature`] is made only by the verifier in [`super::decide`] (its fields are
//!   private to [`crate::signing`]), after nonce, challenge, credential, WebAuthn and counter
//!   checks all passed.
//! * Each [`SignatureRefusal`] has its own audit rule.

use serde_json::{Map, Value};

use super::challenge::Signed;
use super::webauthn::WebauthnError;

/// Why a signature was refused (each its own audit rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureRefusal {
    /// The gate requires a signature and none came.
    #[error("this gate needs your passkey's signature: approve it in the inbox")]
    Missing,
    /// No such nonce was issued to this person.
    #[error("the signing challenge is unknown: start the approval again")]
    UnknownNonce,
    /// The nonce was used before.
    #[error("this signature was used already")]
    Replayed,
    /// The nonce expired.
    #[error("the signing challenge expired: start the approval again")]
    NonceExpired,
    /// The assertion signed another challenge.
    #[error("the signature is for another gate, verdict, approver or expiry")]
    Challenge,
    /// The credential is not one of this person's active passkeys.
    #[error("the signing passkey is not one of yours, or it was revoked")]
    Credential,
    /// The authenticator did not verify the user.
    #[error("the passkey did not verify you (PIN or biometrics required)")]
    UserVerification,
    /// The sign counter did not increase.
    #[error("the passkey's counter went backwards: it may have been cloned")]
    Counter,
    /// Anything else about the assertion (origin, site, signature, form).
    #[error("the signature does not verify")]
    Invalid,
    /// The person signed this step already; another signatory must give the next signature.
    #[error("you signed this step already: the second signature must come from someone else")]
    SameSigner,
    /// The server cannot sign-check: its public URL is not a WebAuthn origin.
    #[error("passkeys need a public URL with a host name (not an IP address)")]
    NoRelyingParty,
}

impl SignatureRefusal {
    /// The audit rule.
    pub fn rule(self) -> &'static str {
        match self {
            Self::Missing => "signature.missing",
            Self::UnknownNonce => "signature.nonce",
            Self::Replayed => "signature.replay",
            Self::NonceExpired => "signature.nonce_expired",
            Self::Challenge => "signature.challenge",
            Self::Credential => "signature.credential",
            Self::UserVerification => "signature.user_verification",
            Self::Counter => "signature.counter",
            Self::Invalid => "signature.invalid",
            Self::SameSigner => "signature.same_signer",
            Self::NoRelyingParty => "signature.no_rp",
        }
    }

    pub(super) fn from_webauthn(e: &WebauthnError) -> Self {
        match e {
            WebauthnError::Challenge => Self::Challenge,
            WebauthnError::UserVerification => Self::UserVerification,
            WebauthnError::Counter { .. } => Self::Counter,
            WebauthnError::Malformed(_)
            | WebauthnError::WrongType(_)
            | WebauthnError::Origin(_)
            | WebauthnError::RpId
            | WebauthnError::UserPresence
            | WebauthnError::UnsupportedKey
            | WebauthnError::BadSignature => Self::Invalid,
        }
    }
}

/// A signature that passed every check, for one decision. Only
/// [`crate::Store::verify_signature`] makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedSignature {
    pub(super) signed: Signed,
    pub(super) verdict: &'static str,
    pub(super) approver: String,
    pub(super) approval_expires_at: i64,
    pub(super) record: Map<String, Value>,
}

impl VerifiedSignature {
    /// Whether it signs `verdict` by `approver` on `step_id` with `inputs_hash`, for an
    /// approval ending no later than `expires_at`.
    pub fn covers(
        &self,
        step_id: &str,
        inputs_hash: &str,
        verdict: &str,
        approver: &str,
        expires_at: i64,
    ) -> bool {
        self.signed.covers(step_id, inputs_hash)
            && self.verdict == verdict
            && self.approver == approver
            && expires_at <= self.approval_expires_at
    }

    /// What the approval row and its audit record store: the full assertion and what it signs.
    pub fn record(&self) -> &Map<String, Value> {
        &self.record
    }

    /// The signing passkey's credential id (base64url).
    pub fn credential_id(&self) -> Option<&str> {
        self.record.get("credential_id").and_then(Value::as_str)
    }
}
