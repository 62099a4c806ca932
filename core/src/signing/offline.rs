//! Verifying every signed approval from audit records alone (an export, or the database's
//! records read in chain order): no database, no registry, no server key.
//!
//! Invariants:
//! * Everything is read from the hashed record text (`record`: its chain, seq, event, rule,
//!   actor and detail), never from the unhashed columns beside it. That text is only as good
//!   as the chain it sits in: callers verify the chain first (`audit verify-signatures` does).
//! * A signature counts only against a key whose registration record (`passkey.registered`,
//!   carrying the COSE key and the RP id) comes earlier in the same chain, names the same
//!   person as the approval's actor, and was not removed or revoked before it.
//! * The challenge is re-derived from the record (what was signed, verdict, actor, expiry,
//!   nonce) and must equal the one the client data carries; the step and inputs hash the
//!   record names must be (in) what was signed; the client data's type, origin (the one the
//!   key was registered on, never cross-origin), the RP id hash, user presence and user
//!   verification flags, and the ES256 signature are checked as at decision time.
//! * The first record that fails is named (chain and seq); nothing after it is trusted.

use std::collections::HashMap;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::challenge::{ChallengeParts, Signed, challenge};
use super::webauthn::{Assertion, client_challenge, unb64, verify_signature, verifying_key};
use crate::audit::AuditRecord;
use crate::store::{PASSKEY_REGISTERED_RULE, PASSKEY_REMOVED_RULE, PASSKEY_REVOKED_RULE};

/// What a clean pass found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignatureReport {
    /// Signed decisions verified.
    pub signatures: usize,
    /// Passkey registrations read.
    pub registrations: usize,
}

/// The first record whose signature (or key record) does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record {chain}#{seq}: {why}")]
pub struct SignatureFailure {
    /// Its chain.
    pub chain: String,
    /// Its seq.
    pub seq: i64,
    /// Why.
    pub why: String,
}

/// A registered key as its audit record tells it.
struct KeyRecord {
    owner: String,
    cose_key: Vec<u8>,
    rp_id: String,
    origin: String,
    ended: bool,
}

/// Checks every signed decision in `records` (any chains, each in seq order).
pub fn verify_signatures(records: &[AuditRecord]) -> Result<SignatureReport, SignatureFailure> {
    let mut keys: HashMap<(String, String), KeyRecord> = HashMap::new();
    let mut report = SignatureReport::default();
    for r in records {
        let body: Value = serde_json::from_str(&r.record).map_err(|e| SignatureFailure {
            chain: r.chain.clone(),
            seq: r.seq,
            why: format!("unreadable: {e}"),
        })?;
        let text = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or_default();
        // The chain and position the hash covers, not the columns beside it.
        let chain = text("chain").to_string();
        let seq = body.get("seq").and_then(Value::as_i64).unwrap_or(r.seq);
        let fail = |why: String| SignatureFailure {
            chain: chain.clone(),
            seq,
            why,
        };
        let detail = body.get("detail").cloned().unwrap_or(Value::Null);
        let dtext = |k: &str| detail.get(k).and_then(Value::as_str).unwrap_or_default();
        let operational = text("event") == "operational";
        match text("rule") {
            PASSKEY_REGISTERED_RULE if operational => {
                let cose_key = unb64(dtext("cose_key"), "cose key")
                    .map_err(|e| fail(format!("passkey registration: {e}")))?;
                verifying_key(&cose_key).map_err(|e| fail(format!("passkey registration: {e}")))?;
                keys.insert(
                    (chain.clone(), dtext("credential_id").to_string()),
                    KeyRecord {
                        owner: format!("person:{}#{}", dtext("iss"), dtext("sub")),
                        cose_key,
                        rp_id: dtext("rp_id").to_string(),
                        origin: dtext("origin").to_string(),
                        ended: false,
                    },
                );
                report.registrations += 1;
                continue;
            }
            PASSKEY_REMOVED_RULE | PASSKEY_REVOKED_RULE if operational => {
                if let Some(k) = keys.get_mut(&(chain.clone(), dtext("credential_id").into())) {
                    k.ended = true;
                }
                continue;
            }
            _ => {}
        }
        let Some(sig) = detail.get("signature").filter(|s| s.is_object()) else {
            continue;
        };
        if !matches!(text("event"), "approved" | "rejected") {
            continue;
        }
        check_one(&body, sig, &chain, &keys).map_err(fail)?;
        report.signatures += 1;
    }
    Ok(report)
}

/// One signed decision record against the keys registered before it.
fn check_one(
    body: &Value,
    sig: &Value,
    chain: &str,
    keys: &HashMap<(String, String), KeyRecord>,
) -> Result<(), String> {
    let field = |k: &str| {
        sig.get(k)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("signature without {k}"))
    };
    let signed = sig
        .get("signed")
        .and_then(Signed::from_json)
        .ok_or("signature without what it signs")?;
    let step_id = body.get("step_id").and_then(Value::as_str).unwrap_or("");
    let inputs_hash = body
        .pointer("/detail/inputs_hash")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !signed.covers(step_id, inputs_hash) {
        return Err(format!(
            "step {step_id} with inputs {inputs_hash} is not what the signature signs"
        ));
    }
    let verdict = match (field("verdict")?, body.get("event").and_then(Value::as_str)) {
        ("approved", Some("approved")) => "approved",
        ("rejected", Some("rejected")) => "rejected",
        (v, e) => return Err(format!("signed verdict {v} on a record of {e:?}")),
    };
    let actor = body.get("actor").and_then(Value::as_str).unwrap_or("");
    let expires = sig
        .get("approval_expires_at")
        .and_then(Value::as_i64)
        .ok_or("signature without approval_expires_at")?;
    let expected = challenge(&ChallengeParts {
        signed: &signed,
        verdict,
        approver: actor,
        approval_expires_at: expires,
        nonce: field("nonce")?,
    })
    .map_err(|e| format!("no challenge can be derived: {e}"))?;
    let b = |k: &str| unb64(field(k)?, "signature field").map_err(|e| format!("{k}: {e}"));
    let assertion = Assertion {
        credential_id: b("credential_id")?,
        authenticator_data: b("authenticator_data")?,
        client_data_json: b("client_data_json")?,
        signature: b("signature")?,
    };
    let presented = client_challenge(&assertion.client_data_json).map_err(|e| e.to_string())?;
    if presented != expected {
        return Err("the signed challenge is not this record's (inputs, step, verdict, approver, expiry or nonce differ)".into());
    }
    let cd: Value = serde_json::from_slice(&assertion.client_data_json)
        .map_err(|_| "client data is not JSON".to_string())?;
    if cd.get("type").and_then(Value::as_str) != Some("webauthn.get") {
        return Err("client data is not an assertion".into());
    }
    let origin = cd.get("origin").and_then(Value::as_str).unwrap_or_default();
    let cross = cd.get("crossOrigin") == Some(&Value::Bool(true));
    let key = keys
        .get(&(chain.to_string(), field("credential_id")?.to_string()))
        .ok_or_else(|| {
            format!(
                "no registration of passkey {} earlier in this chain",
                field("credential_id").unwrap_or_default()
            )
        })?;
    if key.owner != actor {
        return Err(format!("passkey registered by {}, not {actor}", key.owner));
    }
    if key.ended {
        return Err("passkey was removed or revoked before this signature".into());
    }
    if cross || origin != key.origin {
        return Err(format!(
            "signed on {origin}, not on {} where the passkey was registered",
            key.origin
        ));
    }
    let auth = &assertion.authenticator_data;
    let rp_hash: [u8; 32] = Sha256::digest(key.rp_id.as_bytes()).into();
    if auth.len() < 37 || auth[..32] != rp_hash {
        return Err(format!("signed for another site than {}", key.rp_id));
    }
    if auth[32] & 0x05 != 0x05 {
        return Err("user presence or verification flag absent".into());
    }
    verify_signature(&key.cose_key, &assertion).map_err(|e| e.to_string())
}

/// Records read per round trip when checking a stored chain.
const PAGE: i64 = 5_000;

impl crate::store::Store {
    /// [`verify_signatures`] over the stored chains (every chain, or only `chain`), each read
    /// in seq order.
    pub async fn verify_stored_signatures(
        &self,
        chain: Option<&str>,
    ) -> Result<Result<SignatureReport, SignatureFailure>, crate::store::StoreError> {
        let chains = match chain {
            Some(c) => vec![c.to_string()],
            None => self.audit_chain_names().await?,
        };
        let mut total = SignatureReport::default();
        for chain in chains {
            let mut records = Vec::new();
            let mut from = 1;
            loop {
                let page = self.audit_records(&chain, from, PAGE).await?;
                let Some(last) = page.last() else { break };
                from = last.seq + 1;
                let full = i64::try_from(page.len()).unwrap_or(i64::MAX) == PAGE;
                records.extend(page);
                if !full {
                    break;
                }
            }
            match verify_signatures(&records) {
                Ok(r) => {
                    total.signatures += r.signatures;
                    total.registrations += r.registrations;
                }
                Err(f) => return Ok(Err(f)),
            }
        }
        Ok(Ok(total))
    }
}
