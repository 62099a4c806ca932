//! Approvals of gated steps: a person's decision bound to one step's exact inputs.
//!
//! Invariants:
//! * An approval binds step id, inputs hash, approver (`iss` + `sub`), decision time and
//!   expiry. It authorises the step only while the inputs about to run, the step's stored
//!   canonical text and its stored hash all hash to the bound one, and the clock is before the
//!   expiry; anything else is no approval (fail closed). It is looked up by step id, so it
//!   never authorises another step, even one with identical inputs.
//! * Approvals are recorded only for a step at `needs_approval` with its gate window open
//!   (`expires_at` set, which nothing clears): a step that never reached a gate has none, and
//!   [`Store::valid_approval`] does not read them for it.
//! * Batch approvals ([`crate::batch`]) go through the same per-step decision.
//! * The approver is never the principal the run acts for, holds one of the tool's approver
//!   roles, and signed in recently enough when the tool asks for step-up.
//! * The approver is never accountable for the proposal, whatever the tool's `four_eyes`
//!   says: an approval is refused when the approver created the credential of the agent that
//!   proposed the step or of the run's agent (`approval.creator`), or when either credential
//!   acts for the approver (`approval.acts_for`). Each such refusal is audited (`refused`,
//!   with its rule) before it is answered. A person is matched in every form an identity
//!   takes here (`person:ISS#SUB`, `ISS#SUB`, the bare `SUB`): a match refuses (fail closed).
//!   Rejections stay open to them: stopping is always safe.
//! * A gate whose tool says `party_confirms` is the party's own confirmation, not a
//!   countersignature: only the party a proposing credential acts for may approve it
//!   (`approval.not_party`, audited, otherwise — also when no party is bound); its creator
//!   still may not.
//! * Four eyes (approvals only; anyone allowed may reject): the proposing agent's credential
//!   must name a person as its creator (`person:ISS#SUB`) and that person is not the
//!   approver. A credential whose creator is not a person (a CLI user name, a scenario) cannot
//!   be checked, so its steps cannot be approved under four eyes (fail closed).
//! * Above the tool's threshold two distinct people must approve: the step stays at
//!   `needs_approval` after the first, and the gate counts only approvals bound to the current
//!   inputs hash.
//! * A step leaves `needs_approval` only through [`Store::decide_step`]: approved → `pending`
//!   (the gate lets it through on its next execution), rejected → `refused`, never to run.
//! * One decision per person per step: a person decides a step again only when their earlier
//!   decision was an approval that lapsed (expired, e.g. with its batch, or bound to other
//!   inputs); the lapsed row is replaced, its audit record stays.
//! * A decision is stored in the same transaction as the step's audited transition, under the
//!   audit chain's append lock ([`Store::record_decision`]): no approval row exists without its
//!   record, and concurrent decisions on one step each count every earlier one.
//! * A tool that requires signatures ([`GateRules::signature_required`]) is approved only with a
//!   [`VerifiedSignature`] that covers this step, its inputs, the verdict, the approver and
//!   the approval's expiry (`signature.missing` / `signature.challenge` otherwise, audited);
//!   only signed approvals count towards its gate, here and at execution; an unsigned approval
//!   of the same person has lapsed; and the signing passkey must still be active when the
//!   decision is written, under the append lock a revocation takes too.
//! * The token is shown once to the caller; only its SHA-256 is stored.

use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use crate::audit::{AuditEvent, NewAuditRecord, hash_text};
use crate::model::StepStatus;
use crate::secret::Secret;
use crate::signing::verified::{SignatureRefusal, VerifiedSignature};
use crate::store::audit_append::{insert_all_pg, insert_all_sqlite};
use crate::store::{Pool, Step, Store, StoreError, Transition};

mod valid;

/// A person's decision on a gated step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Run it, exactly as shown.
    Approved,
    /// Never run it.
    Rejected,
}

impl Verdict {
    /// Stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approved => "approved",
            Self::Rejected => "rejected",
        }
    }
}

/// What a tool's gate asks of its approvers (from the registry, and the call's amount).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateRules {
    /// Roles that may decide; empty = nobody can (fail closed).
    pub approver_roles: Vec<String>,
    /// The person who created the proposing credential may not approve.
    pub four_eyes: bool,
    /// Distinct approvals needed (1, or 2 above the tool's threshold).
    pub approvals_needed: u32,
    /// The approver must have signed in within this many ms.
    pub step_up_max_age_ms: Option<i64>,
    /// Only the party the proposing agent acts for may approve (their own confirmation);
    /// otherwise that party never may (a countersignature).
    pub party_confirms: bool,
    /// Each approval is a passkey signature over the gate's exact inputs
    /// ([`crate::signing`]); rejections never need one.
    pub signature_required: bool,
}

/// The person deciding, as the session knows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decider {
    /// Their identity.
    pub approver: Approver,
    /// Their application roles (`approver`, `manager`, …).
    pub roles: Vec<String>,
    /// When they signed in (Unix ms).
    pub auth_time: i64,
    /// Their provider did not say when it authenticated them: never fresh for a step-up.
    pub auth_time_unknown: bool,
}

/// Who decides: an authenticated person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approver {
    /// OIDC issuer.
    pub iss: String,
    /// OIDC subject.
    pub sub: String,
}

impl Approver {
    /// How this person acts in audit records and credentials: `person:ISS#SUB`.
    pub fn actor(&self) -> String {
        format!("person:{}#{}", self.iss, self.sub)
    }
}

/// A stored approval.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, Serialize)]
pub struct Approval {
    /// Approval id.
    pub id: String,
    /// The step.
    pub step_id: String,
    /// The inputs it binds.
    pub inputs_hash: String,
    /// `approved` or `rejected`.
    pub decision: String,
    /// Approver issuer.
    pub approver_iss: String,
    /// Approver subject.
    pub approver_sub: String,
    /// The approver's reason.
    pub reason: String,
    /// SHA-256 of the token.
    pub token_hash: String,
    /// Unix ms.
    pub decided_at: i64,
    /// Unix ms.
    pub expires_at: i64,
    /// The passkey assertion of a signed approval (JSON), `None` when unsigned.
    pub signature: Option<String>,
}

/// Why a decision was refused.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The step is not waiting for a person (already decided, executed, expired…).
    #[error("step is {0}, not waiting for approval")]
    NotWaiting(String),
    /// The gate's time ran out.
    #[error("the approval window closed")]
    Expired,
    /// The approver is the person the run acts for.
    #[error("the run's principal cannot approve its own step")]
    SelfApproval,
    /// A reason is required.
    #[error("a reason is required")]
    NoReason,
    /// The person holds none of the tool's approver roles.
    #[error("you hold none of this tool's approver roles")]
    NotAnApprover,
    /// The person created the credential of the agent that proposed the step (or of the
    /// run's agent): they are accountable for the proposal and cannot countersign it.
    #[error(
        "you created credential {name:?}, whose agent proposed this step: another approver \
         must countersign it (you may still reject it)"
    )]
    CreatorApproval {
        /// The credential's name.
        name: String,
    },
    /// The gate asks the party the agent acts for to confirm, and this person is not them.
    #[error(
        "only the person this agent acts for may confirm this step{}",
        party.as_deref().map(|p| format!(" ({p})")).unwrap_or_else(|| ", and it acts for nobody".into())
    )]
    NotTheParty {
        /// The bound party, if any.
        party: Option<String>,
    },
    /// The proposing agent (or the run's agent) acts for this person.
    #[error(
        "credential {name:?} acts for you: a step made on your behalf needs another \
         approver (you may still reject it)"
    )]
    ActsForApproval {
        /// The credential's name.
        name: String,
    },
    /// The person created the credential of the agent that proposed the step.
    #[error("four eyes: the creator of the proposing agent's credential cannot approve")]
    FourEyes,
    /// Four eyes cannot be checked: the proposing agent's credential was not created by a
    /// signed-in person (a CLI user name, a scenario), so nobody can be told apart from its
    /// creator. Fails closed until the credential is re-created by a person.
    #[error(
        "four eyes: credential {name:?} was created by {created_by:?}, not by a signed-in \
         person, so its creator cannot be told apart from you; re-create it from the admin \
         page or with `countersign agent-token create --by person:ISS#SUB`"
    )]
    FourEyesUnknownCreator {
        /// The credential's name.
        name: String,
        /// What it records as its creator.
        created_by: String,
    },
    /// The same person already decided this step.
    #[error("you already decided this step; a second approval must come from someone else")]
    AlreadyDecided,
    /// The tool wants a recent sign-in.
    #[error("sign in again: this tool needs a sign-in within the last {max_age_minutes} minutes")]
    StepUpRequired {
        /// The tool's step-up window.
        max_age_minutes: i64,
    },
    /// The gate's signature was missing or refused.
    #[error("{0}")]
    Signature(SignatureRefusal),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What [`Store::record_decision`] did.
enum Recorded {
    /// Stored, and the step moved.
    Moved,
    /// This person had decided the step already: nothing written.
    AlreadyDecided,
    /// The step was no longer at `needs_approval`: nothing written.
    NotMoved,
    /// The signing passkey was revoked before the decision could be written: nothing written.
    KeyEnded,
}

const COLUMNS: &str = "id, step_id, inputs_hash, decision, approver_iss, approver_sub, reason, \
     token_hash, decided_at, expires_at, signature";

/// The audit rule of an approval refused to the proposing credential's creator.
pub const CREATOR_RULE: &str = "approval.creator";
/// The audit rule of an approval refused to the party the proposing credential acts for.
pub const ACTS_FOR_RULE: &str = "approval.acts_for";
/// The audit rule of a party's confirmation refused to someone else.
pub const NOT_PARTY_RULE: &str = "approval.not_party";

impl DecideError {
    /// The audit rule of a refusal that is recorded (the accountable-approver ones).
    pub fn audited_rule(&self) -> Option<&'static str> {
        match self {
            Self::CreatorApproval { .. } => Some(CREATOR_RULE),
            Self::ActsForApproval { .. } => Some(ACTS_FOR_RULE),
            Self::NotTheParty { .. } => Some(NOT_PARTY_RULE),
            Self::Signature(r) => Some(r.rule()),
            Self::NotWaiting(_)
            | Self::Expired
            | Self::SelfApproval
            | Self::NoReason
            | Self::NotAnApprover
            | Self::FourEyes
            | Self::FourEyesUnknownCreator { .. }
            | Self::AlreadyDecided
            | Self::StepUpRequired { .. }
            | Self::Store(_) => None,
        }
    }
}

impl Store {
    /// Records `approver`'s verdict on `step_id` (which must be at `needs_approval`, within
    /// its window, for a run not acting for the approver) and moves the step on. Returns the
    /// approval and, when approved, the token (shown once).
    pub async fn decide_step(
        &self,
        step_id: &str,
        decider: &Decider,
        rules: &GateRules,
        verdict: Verdict,
        reason: &str,
    ) -> Result<(Approval, Option<Secret<String>>), DecideError> {
        self.decide_step_within(step_id, decider, rules, verdict, reason, None, None)
            .await
    }

    /// [`Store::decide_step`], optionally as part of a batch: the approval then expires no
    /// later than the batch grant, and its audit record names the batch. An approval of a
    /// signature-required gate needs `signature`, covering this step's inputs, the verdict, the
    /// approver and the approval's expiry (refused and audited otherwise); it is stored with
    /// the approval and in its audit record.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn decide_step_within(
        &self,
        step_id: &str,
        decider: &Decider,
        rules: &GateRules,
        verdict: Verdict,
        reason: &str,
        batch: Option<(&str, i64)>,
        signature: Option<&VerifiedSignature>,
    ) -> Result<(Approval, Option<Secret<String>>), DecideError> {
        let approver = &decider.approver;
        let given_signature = signature.is_some();
        if reason.trim().is_empty() {
            return Err(DecideError::NoReason);
        }
        if !rules
            .approver_roles
            .iter()
            .any(|r| decider.roles.iter().any(|have| have == r))
        {
            return Err(DecideError::NotAnApprover);
        }
        let step = self.get_step(step_id).await?;
        if step.status != StepStatus::NeedsApproval {
            return Err(DecideError::NotWaiting(step.status.as_str().into()));
        }
        let now = self.clock.now_ms();
        let Some(expires_at) = step.expires_at else {
            return Err(DecideError::NotWaiting("without a gate window".into()));
        };
        if now >= expires_at {
            return Err(DecideError::Expired);
        }
        if let Some(max_age) = rules.step_up_max_age_ms
            && (decider.auth_time_unknown || now - decider.auth_time > max_age)
        {
            return Err(DecideError::StepUpRequired {
                max_age_minutes: max_age / 60_000,
            });
        }
        let run = self.get_run(&step.run_id).await?;
        let person = approver.actor();
        if names_person(&run.principal, approver) {
            return Err(DecideError::SelfApproval);
        }
        if verdict == Verdict::Approved
            && let Some(refusal) = self
                .accountable(&step, &run, approver, rules.party_confirms)
                .await?
        {
            self.record_refused_decision(&step, &person, &refusal, reason)
                .await?;
            return Err(refusal);
        }
        if rules.four_eyes
            && verdict == Verdict::Approved
            && let Some(agent_id) = &step.agent_id
        {
            let agent = self.get_agent(agent_id).await?;
            four_eyes(&agent.created_by, &agent.name, approver)?;
        }
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw)
            .map_err(|e| DecideError::Store(StoreError::Conflict(format!("random source: {e}"))))?;
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let token = format!("cs_appr_{token}");
        // A batch's approvals end with the grant, if it ends before the gate.
        let approval_expires = batch.map_or(expires_at, |(_, until)| until.min(expires_at));
        // Only a signature of exactly this step, these inputs, verdict and approver, ending no
        // earlier, is kept with the approval.
        let signature = signature.filter(|s| {
            s.covers(
                &step.id,
                &step.inputs_hash,
                verdict.as_str(),
                &person,
                approval_expires,
            )
        });
        let approval = Approval {
            id: Uuid::new_v4().to_string(),
            step_id: step.id.clone(),
            inputs_hash: step.inputs_hash.clone(),
            decision: verdict.as_str().into(),
            approver_iss: approver.iss.clone(),
            approver_sub: approver.sub.clone(),
            reason: reason.to_string(),
            token_hash: hash_text(&token),
            decided_at: now,
            expires_at: approval_expires,
            signature: signature.map(|s| serde_json::Value::Object(s.record().clone()).to_string()),
        };
        // INVARIANT: a signature-required approval carries a verified signature that covers
        // it (fail closed): none given is `missing`, one for something else `challenge`.
        let signed_only = rules.signature_required;
        if signed_only && verdict == Verdict::Approved && signature.is_none() {
            let refusal = DecideError::Signature(if given_signature {
                SignatureRefusal::Challenge
            } else {
                SignatureRefusal::Missing
            });
            self.record_refused_decision(&step, &person, &refusal, reason)
                .await?;
            return Err(refusal);
        }
        let needed = usize::try_from(rules.approvals_needed.max(1)).unwrap_or(usize::MAX);
        // The transition the decision makes once `approvals` (this one included) are counted.
        let transition = |approvals: usize| {
            let (to, event) = match verdict {
                // Not enough distinct approvals yet: the gate stays closed.
                Verdict::Approved if approvals < needed => {
                    (StepStatus::NeedsApproval, AuditEvent::Approved)
                }
                Verdict::Approved => (StepStatus::Pending, AuditEvent::Approved),
                Verdict::Rejected => (StepStatus::Refused, AuditEvent::Rejected),
            };
            let mut detail = serde_json::Map::new();
            detail.insert("inputs_hash".into(), json!(approval.inputs_hash));
            detail.insert("approver_iss".into(), json!(approval.approver_iss));
            detail.insert("reason".into(), json!(approval.reason));
            detail.insert("token_hash".into(), json!(approval.token_hash));
            detail.insert("approval_id".into(), json!(approval.id));
            detail.insert("approvals".into(), json!(approvals));
            detail.insert("approvals_needed".into(), json!(needed));
            if let Some((batch_id, _)) = batch {
                detail.insert("batch_id".into(), json!(batch_id));
                detail.insert("approval_expires_at".into(), json!(approval.expires_at));
            }
            if let Some(s) = signature {
                detail.insert(
                    "signature".into(),
                    serde_json::Value::Object(s.record().clone()),
                );
            }
            Transition {
                step_id: step.id.clone(),
                from: vec![StepStatus::NeedsApproval],
                to: Some(to),
                approval: Some(approval.id.clone()),
                rule: (verdict == Verdict::Rejected).then(|| "approval.rejected".to_string()),
                records: vec![(
                    event,
                    NewAuditRecord {
                        event: Some(event),
                        run_id: Some(step.run_id.clone()),
                        step_id: Some(step.id.clone()),
                        tool: Some(step.tool.clone()),
                        actor: Some(person.clone()),
                        rule: step.rule.clone(),
                        detail,
                        tenant: None,
                    },
                )],
                ..Transition::default()
            }
        };
        let recorded = crate::store::steps::retry_collisions("deciding a step", || {
            self.record_decision(
                &approval,
                &transition,
                signed_only,
                signature.and_then(VerifiedSignature::credential_id),
            )
        })
        .await?;
        match recorded {
            Recorded::Moved => {}
            Recorded::AlreadyDecided => return Err(DecideError::AlreadyDecided),
            Recorded::KeyEnded => {
                let refusal = DecideError::Signature(SignatureRefusal::Credential);
                self.record_refused_decision(&step, &person, &refusal, reason)
                    .await?;
                return Err(refusal);
            }
            Recorded::NotMoved => {
                let now_status = self.get_step(step_id).await?.status;
                return Err(DecideError::NotWaiting(now_status.as_str().into()));
            }
        }
        let token = (verdict == Verdict::Approved).then(|| Secret::new(token));
        Ok((approval, token))
    }

    /// The refusal an approval by `approver` meets because they are accountable for the
    /// proposal: they created, or are the party of, the credential that proposed `step` or
    /// the one `run` belongs to. With `party_confirms` the party is the one who must approve:
    /// refused unless every such credential acts for `approver`. `None` when it may go on.
    async fn accountable(
        &self,
        step: &Step,
        run: &crate::store::Run,
        approver: &Approver,
        party_confirms: bool,
    ) -> Result<Option<DecideError>, StoreError> {
        let mut ids: Vec<&str> = step.agent_id.iter().map(String::as_str).collect();
        if let Some(id) = run.agent_id.as_deref()
            && !ids.contains(&id)
        {
            ids.push(id);
        }
        for id in ids {
            let agent = match self.get_agent(id).await {
                Ok(a) => a,
                // INVARIANT: a step names only credentials that existed; one that cannot be
                // read now cannot be told apart from the approver (fail closed).
                Err(StoreError::NotFound) => {
                    return Ok(Some(DecideError::CreatorApproval { name: id.into() }));
                }
                Err(e) => return Err(e),
            };
            if names_person(&agent.created_by, approver) {
                return Ok(Some(DecideError::CreatorApproval { name: agent.name }));
            }
            let is_party = agent
                .acts_for
                .as_deref()
                .is_some_and(|party| names_person(party, approver));
            match (party_confirms, is_party) {
                (false, true) => {
                    return Ok(Some(DecideError::ActsForApproval { name: agent.name }));
                }
                (true, false) => {
                    return Ok(Some(DecideError::NotTheParty {
                        party: agent.acts_for,
                    }));
                }
                (false, false) | (true, true) => {}
            }
        }
        // INVARIANT: a party's confirmation needs a credential that acts for someone.
        if party_confirms && step.agent_id.is_none() && run.agent_id.is_none() {
            return Ok(Some(DecideError::NotTheParty { party: None }));
        }
        Ok(None)
    }

    /// [duties] Whether `approver`, acting on `step` of `run` as a countersigner outside a gate
    /// (an escalation's settlement or undo), is accountable for its proposal — they created,
    /// or are the party of, the proposing credential or the run's — the same check an approval
    /// meets. When so, the refusal is audited (`refused`, with its rule) and returned.
    pub async fn refuse_accountable(
        &self,
        step: &Step,
        run: &crate::store::Run,
        approver: &Approver,
        reason: &str,
    ) -> Result<Option<DecideError>, StoreError> {
        let Some(refusal) = self.accountable(step, run, approver, false).await? else {
            return Ok(None);
        };
        let person = approver.actor();
        self.record_refused_decision(step, &person, &refusal, reason)
            .await?;
        Ok(Some(refusal))
    }

    /// Appends the `refused` record of an approval refused by [`Store::accountable`] or for
    /// its signature.
    pub(crate) async fn record_refused_decision(
        &self,
        step: &Step,
        person: &str,
        refusal: &DecideError,
        reason: &str,
    ) -> Result<(), StoreError> {
        let mut detail = serde_json::Map::new();
        detail.insert("verdict".into(), json!(Verdict::Approved.as_str()));
        detail.insert("inputs_hash".into(), json!(step.inputs_hash));
        detail.insert("reason".into(), json!(reason));
        detail.insert("refusal".into(), json!(refusal.to_string()));
        self.append_audit(&NewAuditRecord {
            event: Some(AuditEvent::Refused),
            run_id: Some(step.run_id.clone()),
            step_id: Some(step.id.clone()),
            tool: Some(step.tool.clone()),
            actor: Some(person.to_string()),
            rule: refusal.audited_rule().map(str::to_string),
            detail,
            tenant: None,
        })
        .await?;
        Ok(())
    }

    /// [decision] Stores `approval` and makes the transition `transition(approvals)` builds
    /// (`approvals`: this person's approval counted with the earlier ones bound to the same
    /// inputs) in ONE transaction, under the audit chain's append lock, which every decision
    /// takes first: decisions on a step are serialised, so each counts every earlier one (two
    /// people approving at once cannot both count one), and a decision whose transition
    /// does not move the step (it left `needs_approval` meanwhile) is rolled back with it —
    /// no approval row exists without its audited transition.
    /// With `signed_only` (the tool requires signatures) only signed approvals count, an
    /// unsigned one of this person has lapsed, and the signing passkey must still be active
    /// under the append lock (a revocation takes it too: its record and this one are in order):
    /// `key` is the signature's credential id, `None` for an unsigned decision.
    async fn record_decision(
        &self,
        approval: &Approval,
        transition: &impl Fn(usize) -> Transition,
        signed_only: bool,
        key: Option<&str>,
    ) -> Result<Recorded, StoreError> {
        let now = self.clock.now_ms();
        let insert = format!(
            "INSERT INTO approvals (tenant, {COLUMNS})
             VALUES ((SELECT tenant FROM steps WHERE id = $2), $1, $2, $3, $4, $5, $6, $7, $8,
                     $9, $10, $11)"
        );
        let earlier_sql = format!("SELECT {COLUMNS} FROM approvals WHERE step_id = $1");
        // Every transition `transition` builds is of this step: its records join one chain.
        let chain = self
            .chain_for(
                &transition(1)
                    .records
                    .iter()
                    .map(|(_, r)| r)
                    .collect::<Vec<_>>(),
            )
            .await?;
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr, $insert_records:path) => {{
                let mut tx = $pool.begin_with($begin).await?;
                let mut head: Option<crate::audit::ChainHead> = None;
                // The append lock before any row lock (see `store::group`): no lock cycles.
                crate::store::audit_append::hold_head!(&mut *tx, $lock, &mut head, &chain);
                if let Some(key) = key {
                    let active: i64 = sqlx::query_scalar(
                        "SELECT COUNT(*) FROM passkeys WHERE credential_id = $1
                         AND revoked_at IS NULL
                         AND tenant = (SELECT tenant FROM steps WHERE id = $2)",
                    )
                    .bind(key)
                    .bind(&approval.step_id)
                    .fetch_one(&mut *tx)
                    .await?;
                    if active == 0 {
                        tx.rollback().await?;
                        return Ok(Recorded::KeyEnded);
                    }
                }
                let earlier: Vec<Approval> = sqlx::query_as(&earlier_sql)
                    .bind(&approval.step_id)
                    .fetch_all(&mut *tx)
                    .await?;
                if let Some(mine) = earlier.iter().find(|a| {
                    a.approver_iss == approval.approver_iss
                        && a.approver_sub == approval.approver_sub
                }) {
                    // Only a lapsed approval (expired, or bound to other inputs) gives way to
                    // a new decision; its record stays in the audit.
                    let lapsed = mine.decision == Verdict::Approved.as_str()
                        && (mine.expires_at <= approval.decided_at
                            || mine.inputs_hash != approval.inputs_hash
                            || (signed_only && mine.signature.is_none()));
                    if !lapsed {
                        tx.rollback().await?;
                        return Ok(Recorded::AlreadyDecided);
                    }
                    sqlx::query("DELETE FROM approvals WHERE id = $1")
                        .bind(&mine.id)
                        .execute(&mut *tx)
                        .await?;
                }
                sqlx::query(&insert)
                    .bind(&approval.id)
                    .bind(&approval.step_id)
                    .bind(&approval.inputs_hash)
                    .bind(&approval.decision)
                    .bind(&approval.approver_iss)
                    .bind(&approval.approver_sub)
                    .bind(&approval.reason)
                    .bind(&approval.token_hash)
                    .bind(approval.decided_at)
                    .bind(approval.expires_at)
                    .bind(&approval.signature)
                    .execute(&mut *tx)
                    .await?;
                // Counted as the gate counts them: bound to these inputs and not expired.
                let approvals = 1 + earlier
                    .iter()
                    .filter(|a| {
                        a.decision == "approved"
                            && a.inputs_hash == approval.inputs_hash
                            && a.expires_at > approval.decided_at
                            && (!signed_only || a.signature.is_some())
                    })
                    .count();
                let t = transition(approvals);
                match crate::store::steps::apply_transition!(
                    &mut *tx, $lock, &mut head, &chain, &t, now
                ) {
                    Some(records) => {
                        $insert_records(&mut *tx, &records).await?;
                        tx.commit().await?;
                        Recorded::Moved
                    }
                    None => {
                        tx.rollback().await?;
                        Recorded::NotMoved
                    }
                }
            }};
        }
        Ok(match &self.pool {
            Pool::Sqlite(p) => {
                run_in!(p, "BEGIN IMMEDIATE", false, insert_all_sqlite)
            }
            Pool::Postgres(p) => {
                run_in!(p, "BEGIN", true, insert_all_pg)
            }
        })
    }
}

/// Whether `who` names a signed-in person: `person:ISS#SUB`, both parts non-empty (an OIDC
/// issuer has no fragment, so the first `#` ends it).
pub fn is_person(who: &str) -> bool {
    who.strip_prefix("person:")
        .and_then(|w| w.split_once('#'))
        .is_some_and(|(iss, sub)| !iss.is_empty() && !sub.is_empty())
}

/// Whether `who` names `approver` in any form an identity takes here: `person:ISS#SUB`,
/// `ISS#SUB` or the bare subject.
pub fn names_person(who: &str, approver: &Approver) -> bool {
    let who = who.trim();
    !who.is_empty()
        && (who == approver.sub
            || who == format!("{}#{}", approver.iss, approver.sub)
            || who == approver.actor())
}

/// Four eyes: `created_by` must be a person (`person:ISS#SUB`) other than `approver`.
fn four_eyes(created_by: &str, name: &str, approver: &Approver) -> Result<(), DecideError> {
    if !is_person(created_by) {
        return Err(DecideError::FourEyesUnknownCreator {
            name: name.to_string(),
            created_by: created_by.to_string(),
        });
    }
    if created_by == approver.actor() {
        return Err(DecideError::FourEyes);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ana() -> Approver {
        Approver {
            iss: "https://idp.example".into(),
            sub: "ana".into(),
        }
    }

    #[test]
    fn a_person_is_named_in_every_form_an_identity_takes_here() {
        for who in [
            "person:https://idp.example#ana",
            "https://idp.example#ana",
            "ana",
            "  ana ",
        ] {
            assert!(names_person(who, &ana()), "{who}");
        }
        for who in [
            "",
            "person:https://other.example#ana",
            "https://idp.example#anabel",
            "person:ana",
            "agent:ana",
            "scenario:ana",
        ] {
            assert!(!names_person(who, &ana()), "{who}");
        }
    }

    #[test]
    fn only_accountable_refusals_are_audited_with_their_rule() {
        let creator = DecideError::CreatorApproval { name: "bot".into() };
        let party = DecideError::ActsForApproval { name: "bot".into() };
        let not_party = DecideError::NotTheParty { party: None };
        assert_eq!(creator.audited_rule(), Some(CREATOR_RULE));
        assert_eq!(party.audited_rule(), Some(ACTS_FOR_RULE));
        assert_eq!(not_party.audited_rule(), Some(NOT_PARTY_RULE));
        assert!(not_party.to_string().contains("acts for nobody"));
        assert_eq!(DecideError::FourEyes.audited_rule(), None);
        assert_eq!(DecideError::NotAnApprover.audited_rule(), None);
    }
}
