//! What an approver signs: the challenge a WebAuthn assertion must carry for one decision.
//!
//! Invariants:
//! * The challenge is SHA-256 of the canonical JSON (RFC 8785) of exactly: what is decided
//!   (one step's id and canonical inputs hash, or a batch's ordered list of such pairs), the
//!   verdict, the approver (`person:ISS#SUB`), the approval's expiry (Unix ms) and a server
//!   nonce. A change to any of them changes the challenge, so an assertion made for one
//!   payment (amount, payee, IBAN — all inside the inputs hash) is never one for another.
//! * Nothing else goes in: anyone holding the audit record can re-derive it offline.
//! * A batch's challenge covers its pairs in the order the approver saw them; a step proves
//!   its place by its pair appearing in that list.

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::canonical::{CanonicalError, CanonicalJson};

/// What one signature decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signed {
    /// One gated step.
    Step {
        /// The step.
        step_id: String,
        /// Its canonical inputs hash (`sha256:…`).
        inputs_hash: String,
    },
    /// A bounded batch: (step id, inputs hash) pairs in the order shown.
    Batch(Vec<(String, String)>),
}

impl Signed {
    /// Whether `step_id` with `inputs_hash` is (in) what was signed.
    pub fn covers(&self, step_id: &str, inputs_hash: &str) -> bool {
        match self {
            Self::Step {
                step_id: s,
                inputs_hash: h,
            } => s == step_id && h == inputs_hash,
            Self::Batch(pairs) => pairs.iter().any(|(s, h)| s == step_id && h == inputs_hash),
        }
    }

    /// The JSON form recorded in audit records (and hashed into the challenge).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Self::Step {
                step_id,
                inputs_hash,
            } => json!({"step_id": step_id, "inputs_hash": inputs_hash}),
            Self::Batch(pairs) => json!({
                "batch": pairs
                    .iter()
                    .map(|(s, h)| json!([s, h]))
                    .collect::<Vec<_>>(),
            }),
        }
    }

    /// Reads [`Signed::to_json`]'s form back; `None` when it is not one.
    pub fn from_json(value: &serde_json::Value) -> Option<Self> {
        if let Some(pairs) = value.get("batch") {
            let pairs = pairs
                .as_array()?
                .iter()
                .map(|p| {
                    let p = p.as_array()?;
                    match p.as_slice() {
                        [s, h] => Some((s.as_str()?.to_string(), h.as_str()?.to_string())),
                        _ => None,
                    }
                })
                .collect::<Option<Vec<_>>>()?;
            return (!pairs.is_empty()).then_some(Self::Batch(pairs));
        }
        Some(Self::Step {
            step_id: value.get("step_id")?.as_str()?.to_string(),
            inputs_hash: value.get("inputs_hash")?.as_str()?.to_string(),
        })
    }
}

/// The latest instant (Unix ms) a challenge can bind: the largest integer JSON numbers carry
/// exactly (2^53 − 1), far beyond any real expiry.
pub const MAX_INSTANT: i64 = (1 << 53) - 1;

/// Everything the challenge binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChallengeParts<'a> {
    /// What is decided.
    pub signed: &'a Signed,
    /// The verdict (`approved` / `rejected`).
    pub verdict: &'a str,
    /// The approver, `person:ISS#SUB`.
    pub approver: &'a str,
    /// The latest instant the approval counts (Unix ms).
    pub approval_expires_at: i64,
    /// The server's single-use nonce.
    pub nonce: &'a str,
}

/// The 32 bytes a WebAuthn assertion for `parts` must sign as its challenge.
///
/// # Errors
/// The parts have no canonical form (an expiry beyond ±(2^53−1), which JSON numbers cannot
/// carry exactly): there is no challenge, and callers refuse (never a constant stand-in).
pub fn challenge(parts: &ChallengeParts<'_>) -> Result<[u8; 32], CanonicalError> {
    let value = json!({
        "v": 1,
        "signed": parts.signed.to_json(),
        "verdict": parts.verdict,
        "approver": parts.approver,
        "approval_expires_at": parts.approval_expires_at,
        "nonce": parts.nonce,
    });
    let text = CanonicalJson::from_value(&value)?.into_string();
    Ok(Sha256::digest(text.as_bytes()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step() -> Signed {
        Signed::Step {
            step_id: "s1".into(),
            inputs_hash: "sha256:aa".into(),
        }
    }

    #[test]
    fn any_change_to_what_is_signed_changes_the_challenge() {
        let signed = step();
        let base = ChallengeParts {
            signed: &signed,
            verdict: "approved",
            approver: "person:https://idp#ana",
            approval_expires_at: 1_000,
            nonce: "n1",
        };
        let c0 = challenge(&base).unwrap();
        assert_eq!(c0, challenge(&base.clone()).unwrap(), "deterministic");
        let other_inputs = Signed::Step {
            step_id: "s1".into(),
            inputs_hash: "sha256:ab".into(),
        };
        let other_step = Signed::Step {
            step_id: "s2".into(),
            inputs_hash: "sha256:aa".into(),
        };
        let variants = [
            ChallengeParts {
                signed: &other_inputs,
                ..base.clone()
            },
            ChallengeParts {
                signed: &other_step,
                ..base.clone()
            },
            ChallengeParts {
                verdict: "rejected",
                ..base.clone()
            },
            ChallengeParts {
                approver: "person:https://idp#ben",
                ..base.clone()
            },
            ChallengeParts {
                approval_expires_at: 1_001,
                ..base.clone()
            },
            ChallengeParts {
                nonce: "n2",
                ..base.clone()
            },
        ];
        for v in &variants {
            assert_ne!(challenge(v).unwrap(), c0, "{v:?}");
        }
    }

    #[test]
    fn a_batch_binds_its_pairs_and_their_order() {
        let ab = Signed::Batch(vec![
            ("s1".into(), "sha256:aa".into()),
            ("s2".into(), "sha256:bb".into()),
        ]);
        let ba = Signed::Batch(vec![
            ("s2".into(), "sha256:bb".into()),
            ("s1".into(), "sha256:aa".into()),
        ]);
        let parts = |signed| ChallengeParts {
            signed,
            verdict: "approved",
            approver: "person:i#a",
            approval_expires_at: 5,
            nonce: "n",
        };
        assert_ne!(
            challenge(&parts(&ab)).unwrap(),
            challenge(&parts(&ba)).unwrap()
        );
        assert!(ab.covers("s2", "sha256:bb"));
        assert!(!ab.covers("s2", "sha256:aa"));
        assert_eq!(Signed::from_json(&ab.to_json()), Some(ab.clone()));
        assert_eq!(Signed::from_json(&step().to_json()), Some(step()));
        assert_eq!(Signed::from_json(&json!({"batch": []})), None);
    }

    #[test]
    fn an_expiry_json_cannot_carry_exactly_has_no_challenge() {
        let signed = step();
        let parts = ChallengeParts {
            signed: &signed,
            verdict: "approved",
            approver: "person:i#a",
            approval_expires_at: i64::MAX,
            nonce: "n",
        };
        assert!(challenge(&parts).is_err());
    }
}
