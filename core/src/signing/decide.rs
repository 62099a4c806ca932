//! Signed decisions: issuing the challenge an approver's passkey signs, and verifying the
//! assertion before the decision counts.
//!
//! Invariants:
//! * A gate whose tool requires a signature is approved only with a [`VerifiedSignature`]
//!   covering that step's id and current inputs hash, the verdict, the approver and an expiry
//!   no earlier than the approval's (checked again in [`Store::decide_step_within`]); such a
//!   value is only made here, after every check passed. Rejections never need one.
//! * The challenge is re-derived from the step(s) as they are now, never taken from the
//!   request or the nonce: an assertion made for another gate, other inputs, another verdict,
//!   approver or expiry does not verify.
//! * The nonce is taken (once) before the signature is checked, so a replayed assertion is
//!   refused even when everything else about it is right.
//! * Every refusal of a signature is audited (`refused`, rule `signature.*`) before it is
//!   answered; a second signature by a person who already signed the step is refused too.

use serde_json::{Map, json};

use super::challenge::{ChallengeParts, Signed, challenge};
use super::verified::{SignatureRefusal, VerifiedSignature};
use super::webauthn::{Assertion, RelyingParty, b64, verify_assertion};
use crate::approvals::{Approval, Approver, DecideError, Decider, GateRules, Verdict};
use crate::batch::{BatchError, BatchGrant};
use crate::secret::Secret;
use crate::store::{NonceTaken, Store, StoreError};

/// The nonce purpose of an approval signature.
pub const APPROVE_PURPOSE: &str = "approve";
/// The nonce purpose of a passkey registration.
pub const REGISTER_PURPOSE: &str = "register";
/// How long an issued challenge may be signed and sent back.
pub const NONCE_TTL_MS: i64 = 5 * 60 * 1000;

/// What the browser sends with a signed decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The nonce the challenge was issued with.
    pub nonce: String,
    /// The assertion.
    pub assertion: Assertion,
}

/// What a signature must sign, besides the nonce: for whom and what.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The tenant the nonce and the passkey belong to.
    pub tenant: &'a str,
    /// The approver.
    pub approver: &'a Approver,
    /// The step(s) as they are now.
    pub signed: &'a Signed,
    /// The verdict.
    pub verdict: Verdict,
    /// The latest instant the approval counts (Unix ms).
    pub approval_expires_at: i64,
}

/// A challenge issued for a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The nonce (sent back with the assertion).
    pub nonce: String,
    /// The bytes to sign.
    pub challenge: [u8; 32],
    /// The approval expiry the challenge binds.
    pub approval_expires_at: i64,
    /// The person's active credential ids (base64url), for `allowCredentials`.
    pub credential_ids: Vec<String>,
}

impl Store {
    /// Issues the challenge `approver` signs to give `verdict` on `signed`, for an approval
    /// ending at `approval_expires_at`.
    pub async fn issue_decision_challenge(
        &self,
        tenant: &str,
        approver: &Approver,
        signed: &Signed,
        verdict: Verdict,
        approval_expires_at: i64,
    ) -> Result<Issued, StoreError> {
        let payload = json!({
            "signed": signed.to_json(), "verdict": verdict.as_str(),
            "approval_expires_at": approval_expires_at,
        });
        let nonce = self
            .issue_nonce(tenant, approver, APPROVE_PURPOSE, &payload, NONCE_TTL_MS)
            .await?;
        let actor = approver.actor();
        let challenge = challenge(&ChallengeParts {
            signed,
            verdict: verdict.as_str(),
            approver: &actor,
            approval_expires_at,
            nonce: &nonce,
        })
        .map_err(|e| StoreError::Conflict(format!("no signing challenge: {e}")))?;
        let credential_ids = self
            .passkeys_of(tenant, approver)
            .await?
            .into_iter()
            .filter(|k| k.revoked_at.is_none())
            .map(|k| k.credential_id)
            .collect();
        Ok(Issued {
            nonce,
            challenge,
            approval_expires_at,
            credential_ids,
        })
    }

    /// Checks `submission` as `approver`'s signature of `verdict` on `signed` (as the steps
    /// are now) for an approval ending at `approval_expires_at`: nonce (once), challenge,
    /// credential, WebAuthn checks, counter. Refusals are returned, not audited (the caller
    /// knows the steps to audit them on).
    pub async fn verify_signature(
        &self,
        rp: &RelyingParty,
        expected: &Expected<'_>,
        submission: &Submission,
    ) -> Result<Result<VerifiedSignature, SignatureRefusal>, StoreError> {
        let Expected {
            tenant,
            approver,
            signed,
            verdict,
            approval_expires_at,
        } = *expected;
        match self
            .take_nonce(tenant, approver, APPROVE_PURPOSE, &submission.nonce)
            .await?
        {
            NonceTaken::Fresh(_) => {}
            NonceTaken::Used => return Ok(Err(SignatureRefusal::Replayed)),
            NonceTaken::Expired => return Ok(Err(SignatureRefusal::NonceExpired)),
            NonceTaken::Unknown => return Ok(Err(SignatureRefusal::UnknownNonce)),
        }
        let actor = approver.actor();
        // No canonical form, no challenge: nothing can have signed it (fail closed).
        let Ok(expected) = challenge(&ChallengeParts {
            signed,
            verdict: verdict.as_str(),
            approver: &actor,
            approval_expires_at,
            nonce: &submission.nonce,
        }) else {
            return Ok(Err(SignatureRefusal::Invalid));
        };
        let a = &submission.assertion;
        let credential_id = b64(&a.credential_id);
        let Some(key) = self
            .active_passkey(tenant, approver, &credential_id)
            .await?
        else {
            return Ok(Err(SignatureRefusal::Credential));
        };
        let cose_key = super::webauthn::unb64(&key.cose_key, "stored key")
            .map_err(|e| StoreError::Conflict(format!("passkey {credential_id}: {e}")))?;
        let stored = u32::try_from(key.sign_count).unwrap_or(u32::MAX);
        let presented = match verify_assertion(rp, &cose_key, stored, a, &expected) {
            Ok(n) => n,
            Err(e) => return Ok(Err(SignatureRefusal::from_webauthn(&e))),
        };
        // Always a conditional write, also when the counter stays at 0: it re-checks that the
        // key is still active (the nonce, not this, is what stops a replay).
        if !self
            .advance_sign_count(tenant, &credential_id, key.sign_count, presented.into())
            .await?
        {
            // A revocation, or another assertion of this passkey, came first.
            let revoked = self
                .active_passkey(tenant, approver, &credential_id)
                .await?
                .is_none();
            return Ok(Err(if revoked {
                SignatureRefusal::Credential
            } else {
                SignatureRefusal::Counter
            }));
        }
        let mut record = Map::new();
        record.insert("signed".into(), signed.to_json());
        record.insert("verdict".into(), json!(verdict.as_str()));
        record.insert("approval_expires_at".into(), json!(approval_expires_at));
        record.insert("nonce".into(), json!(submission.nonce));
        record.insert("credential_id".into(), json!(credential_id));
        record.insert(
            "authenticator_data".into(),
            json!(b64(&a.authenticator_data)),
        );
        record.insert("client_data_json".into(), json!(b64(&a.client_data_json)));
        record.insert("signature".into(), json!(b64(&a.signature)));
        Ok(Ok(VerifiedSignature {
            signed: signed.clone(),
            verdict: verdict.as_str(),
            approver: actor,
            approval_expires_at,
            record,
        }))
    }

    /// [`Store::decide_step`] for a gate that may require a signature: with `submission`, the
    /// signature is verified against the step as it is now ([`Store::verify_signature`]) and
    /// stored with the approval; without one, an approval of a signature-required gate is
    /// refused. Every signature refusal is audited with its rule.
    #[allow(clippy::too_many_arguments)]
    pub async fn decide_step_signed(
        &self,
        rp: Option<&RelyingParty>,
        step_id: &str,
        decider: &Decider,
        rules: &GateRules,
        verdict: Verdict,
        reason: &str,
        submission: Option<&Submission>,
    ) -> Result<(Approval, Option<Secret<String>>), DecideError> {
        let needs = rules.signature_required && verdict == Verdict::Approved;
        let Some(submission) = submission.filter(|_| needs) else {
            // Without a signature decide_step_within refuses (and audits) a required one.
            return self
                .decide_step_within(step_id, decider, rules, verdict, reason, None, None)
                .await;
        };
        let step = &self.get_step(step_id).await?;
        let refuse = |refusal: SignatureRefusal| async move {
            self.refuse_signature(step, &decider.approver, refusal, reason)
                .await?;
            Err(DecideError::Signature(refusal))
        };
        // A step this person decided already (a rejection, or a signature still standing for
        // these inputs) needs someone else's signature: refused before the nonce is spent. An
        // unsigned approval (from before the tool required signatures) has lapsed.
        let now = self.clock.now_ms();
        if self.approvals_for_step(step_id).await?.iter().any(|a| {
            a.approver_iss == decider.approver.iss
                && a.approver_sub == decider.approver.sub
                && (a.decision != Verdict::Approved.as_str()
                    || (a.expires_at > now
                        && a.inputs_hash == step.inputs_hash
                        && a.signature.is_some()))
        }) {
            return refuse(SignatureRefusal::SameSigner).await;
        }
        let Some(rp) = rp else {
            return refuse(SignatureRefusal::NoRelyingParty).await;
        };
        let Some(approval_expires_at) = step.expires_at else {
            return Err(DecideError::NotWaiting("without a gate window".into()));
        };
        let tenant = self.get_run(&step.run_id).await?.tenant;
        let signed = Signed::Step {
            step_id: step.id.clone(),
            inputs_hash: step.inputs_hash.clone(),
        };
        let expected = Expected {
            tenant: &tenant,
            approver: &decider.approver,
            signed: &signed,
            verdict,
            approval_expires_at,
        };
        let verified = match self.verify_signature(rp, &expected, submission).await? {
            Ok(v) => v,
            Err(refusal) => return refuse(refusal).await,
        };
        self.decide_step_within(
            step_id,
            decider,
            rules,
            verdict,
            reason,
            None,
            Some(&verified),
        )
        .await
    }
}

impl Store {
    /// Appends the `refused` record of a signature refused on `step`.
    pub(crate) async fn refuse_signature(
        &self,
        step: &crate::store::Step,
        approver: &Approver,
        refusal: SignatureRefusal,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.record_refused_decision(
            step,
            &approver.actor(),
            &DecideError::Signature(refusal),
            reason,
        )
        .await
    }

    /// What a batch over `grant` signs for `decider`: its listed steps of the grant's tenant
    /// that `decider` may approve (`rules_for` names approver roles they hold), in list order,
    /// each with its inputs hash as it is now. Other steps are left out (they are refused
    /// individually anyway, and nothing about them is told). The grant's bounds are checked
    /// first (size, duplicates, window, expiry).
    pub async fn batch_signed(
        &self,
        grant: &BatchGrant,
        decider: &Decider,
        rules_for: &impl Fn(&crate::store::Step) -> Option<GateRules>,
    ) -> Result<Signed, BatchError> {
        grant.check_bounds(self.clock.now_ms())?;
        let mut pairs = Vec::with_capacity(grant.step_ids.len());
        for id in &grant.step_ids {
            let step = match self.get_step(id).await {
                Ok(s) => s,
                Err(StoreError::NotFound) => continue,
                Err(e) => return Err(e.into()),
            };
            let approves = rules_for(&step).is_some_and(|r| {
                r.approver_roles
                    .iter()
                    .any(|role| decider.roles.iter().any(|have| have == role))
            });
            if approves && self.get_run(&step.run_id).await?.tenant == grant.tenant {
                pairs.push((step.id, step.inputs_hash));
            }
        }
        Ok(Signed::Batch(pairs))
    }

    /// Checks `submission` as `decider`'s one signature over `grant` (as its steps are now,
    /// [`Store::batch_signed`]); a refusal (no relying party included) is audited on the
    /// tenant's chain with its rule before it is returned. A grant out of bounds is refused
    /// whole, as [`Store::approve_batch`] refuses it.
    pub async fn verify_batch_signature(
        &self,
        rp: Option<&RelyingParty>,
        grant: &BatchGrant,
        decider: &Decider,
        rules_for: &impl Fn(&crate::store::Step) -> Option<GateRules>,
        submission: &Submission,
    ) -> Result<Result<VerifiedSignature, SignatureRefusal>, BatchError> {
        // Refused as the unsigned path refuses it, before any nonce is spent.
        if grant.reason.trim().is_empty() {
            return Err(BatchError::NoReason);
        }
        let signed = self.batch_signed(grant, decider, rules_for).await?;
        let approver = &decider.approver;
        let verdict = match rp {
            None => Err(SignatureRefusal::NoRelyingParty),
            Some(rp) => {
                let expected = Expected {
                    tenant: &grant.tenant,
                    approver,
                    signed: &signed,
                    verdict: Verdict::Approved,
                    approval_expires_at: grant.expires_at,
                };
                self.verify_signature(rp, &expected, submission).await?
            }
        };
        if let Err(refusal) = &verdict {
            let mut detail = Map::new();
            detail.insert("signed".into(), signed.to_json());
            detail.insert("reason".into(), json!(grant.reason));
            detail.insert("refusal".into(), json!(refusal.to_string()));
            self.append_audit(&crate::audit::NewAuditRecord {
                event: Some(crate::audit::AuditEvent::Refused),
                run_id: None,
                step_id: None,
                tool: Some(grant.tool.clone()),
                actor: Some(approver.actor()),
                rule: Some(refusal.rule().to_string()),
                detail,
                tenant: Some(grant.tenant.clone()),
            })
            .await?;
        }
        Ok(verdict)
    }
}
