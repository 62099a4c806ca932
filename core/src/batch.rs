//! Batch approval: one person approves many gated steps at once, inside explicit bounds
//! (seed 002: "a batch approval must constrain action type, target set, count, and time
//! window"; "approve this agent" never means all future behaviour).
//!
//! Invariants:
//! * A batch names one tool, an explicit list of step ids (the target set), a maximum count,
//!   a proposal window `[proposed_from, proposed_to]` and its own expiry. It approves only
//!   listed steps of that tool, of the approver's tenant, waiting at `needs_approval`, proposed
//!   within the window, at most `max_count` of them, and only before it expires. Every other
//!   step is refused individually with a reason and is left exactly as it was (still waiting
//!   for its own approval).
//! * A batch is not a bypass: each step in bounds gets its own per-step approval through the
//!   same checks as a single decision ([`Store::decide_step`]: approver role, self-approval,
//!   four eyes, step-up, one decision per person per step), bound to that step's own inputs
//!   hash. A step that needs two approvers gets one of them from the batch and stays waiting.
//! * A listed step of another tenant, or of a tool whose approver roles the person holds
//!   none of (or that is no longer in the registry), is answered as missing (`not_found`) before anything else about it (tool,
//!   status, age) is looked at.
//! * Approvals made through a batch expire no later than the batch.
//! * The batch is audited as one `approved` record (no step) naming the batch id, tool,
//!   count, window, expiry and step ids, before the per-step records, which name the batch.
//! * Malformed batches (no reason, empty or duplicated or oversized target set, zero count,
//!   inverted window, already expired) are refused whole, and nothing is written.

use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use crate::approvals::{DecideError, Decider, GateRules, Verdict};
use crate::audit::{AuditEvent, NewAuditRecord};
use crate::model::StepStatus;
use crate::signing::verified::{SignatureRefusal, VerifiedSignature};
use crate::store::{Step, Store, StoreError};

/// The most steps one batch may list.
pub const MAX_BATCH_STEPS: usize = 500;

/// What an approver grants in one go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchGrant {
    /// The one tool (action type) it covers.
    pub tool: String,
    /// The target set: exactly these steps, nothing else.
    pub step_ids: Vec<String>,
    /// At most this many approvals are given (in list order).
    pub max_count: u32,
    /// Only steps proposed at or after this instant (Unix ms)…
    pub proposed_from: i64,
    /// …and at or before this one (Unix ms).
    pub proposed_to: i64,
    /// The grant may be applied only before this instant, and its approvals end here (Unix ms).
    pub expires_at: i64,
    /// The approver's tenant: steps of other tenants are outside the batch.
    pub tenant: String,
    /// The approver's reason, recorded on every approval.
    pub reason: String,
}

/// Why a whole batch was refused (nothing was written).
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// A reason is required.
    #[error("a reason is required")]
    NoReason,
    /// The target set is empty.
    #[error("the batch lists no steps")]
    Empty,
    /// More than [`MAX_BATCH_STEPS`] steps.
    #[error("a batch lists at most {MAX_BATCH_STEPS} steps")]
    TooMany,
    /// A step id appears twice.
    #[error("step {0} is listed twice")]
    Duplicate(String),
    /// `max_count` is zero.
    #[error("max_count must be at least 1")]
    ZeroCount,
    /// `proposed_from` is after `proposed_to`.
    #[error("the window's start is after its end")]
    InvertedWindow,
    /// The grant's own expiry has passed.
    #[error("the batch expired")]
    Expired,
    /// No tool named.
    #[error("a tool is required")]
    NoTool,
    /// An expiry no date can carry (beyond what a signature's challenge can bind).
    #[error("the batch's expiry is too far in the future")]
    TooFar,
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why one listed step was not approved by the batch. It stays as it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outside {
    /// No such step.
    NotFound,
    /// Its run belongs to another tenant.
    OtherTenant,
    /// It is a call of another tool.
    OtherTool,
    /// It is not waiting for approval (its status).
    NotWaiting(String),
    /// Proposed before `proposed_from` or after `proposed_to`.
    OutsideWindow,
    /// The batch's count was used up by steps listed before it.
    OverCount,
}

impl Outside {
    /// A stable code for APIs.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::OtherTenant => "other_tenant",
            Self::OtherTool => "other_tool",
            Self::NotWaiting(_) => "not_waiting",
            Self::OutsideWindow => "outside_window",
            Self::OverCount => "over_count",
        }
    }
}

/// What happened to one listed step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepResult {
    /// Approved through the batch; the step's status afterwards (`pending`, or
    /// `needs_approval` when it needs another approver).
    Approved {
        /// The per-step approval's id.
        approval_id: String,
        /// The step's status after it.
        status: StepStatus,
    },
    /// Not approved; why.
    Outside(Outside),
    /// Inside the bounds, but the per-step checks of [`Store::decide_step`] refused it.
    Decide {
        /// A stable code ([`decide_code`]).
        code: &'static str,
        /// The refusal, for people.
        message: String,
    },
}

/// The batch's outcome: its id and one result per listed step, in list order.
#[derive(Debug, Clone)]
pub struct BatchOutcome {
    /// The batch id (in its audit record and every per-step record).
    pub batch_id: String,
    /// `(step id, result)` in the order listed.
    pub results: Vec<(String, StepResult)>,
}

impl BatchOutcome {
    /// How many steps got an approval from this batch.
    pub fn approved(&self) -> usize {
        self.results
            .iter()
            .filter(|(_, r)| matches!(r, StepResult::Approved { .. }))
            .count()
    }
}

impl BatchGrant {
    /// Everything about the grant itself but its reason: a tool, 1..=[`MAX_BATCH_STEPS`]
    /// distinct steps, a positive count, an ordered window, an expiry after `now`.
    ///
    /// # Errors
    /// The first bound it breaks (nothing is written for such a grant).
    pub fn check_bounds(&self, now: i64) -> Result<(), BatchError> {
        if self.tool.trim().is_empty() {
            return Err(BatchError::NoTool);
        }
        if self.step_ids.is_empty() {
            return Err(BatchError::Empty);
        }
        if self.step_ids.len() > MAX_BATCH_STEPS {
            return Err(BatchError::TooMany);
        }
        let mut seen = std::collections::HashSet::new();
        for id in &self.step_ids {
            if !seen.insert(id.as_str()) {
                return Err(BatchError::Duplicate(id.clone()));
            }
        }
        if self.max_count == 0 {
            return Err(BatchError::ZeroCount);
        }
        if self.proposed_from > self.proposed_to {
            return Err(BatchError::InvertedWindow);
        }
        if now >= self.expires_at {
            return Err(BatchError::Expired);
        }
        if self.expires_at > crate::signing::challenge::MAX_INSTANT {
            return Err(BatchError::TooFar);
        }
        Ok(())
    }
}

/// A stable code for a per-step refusal.
pub fn decide_code(e: &DecideError) -> &'static str {
    match e {
        DecideError::NotWaiting(_) => "not_waiting",
        DecideError::Expired => "expired",
        DecideError::SelfApproval => "self_approval",
        DecideError::NoReason => "no_reason",
        DecideError::NotAnApprover => "not_an_approver",
        DecideError::NotTheParty { .. } => "not_party",
        DecideError::CreatorApproval { .. } => "creator",
        DecideError::ActsForApproval { .. } => "acts_for",
        DecideError::FourEyes => "four_eyes",
        DecideError::FourEyesUnknownCreator { .. } => "four_eyes_unknown",
        DecideError::AlreadyDecided => "already_decided",
        DecideError::StepUpRequired { .. } => "step_up_required",
        DecideError::Signature(r) => r.rule(),
        DecideError::Store(_) => "unavailable",
    }
}

impl Store {
    /// Applies `grant` for `decider`: each listed step inside the bounds gets its own approval
    /// through [`Store::decide_step`] with the rules `rules_for` gives for it (from the
    /// registry in force and its inputs; `None` = unknown tool); every other listed step is
    /// refused individually and left as it was. Audits the batch as one record first. A step
    /// whose gate requires a signature is approved only when `signature` (one assertion over
    /// the batch's ordered (step id, inputs hash) pairs) covers it.
    ///
    /// # Errors
    /// The batch itself is malformed or expired (nothing written), or the database failed.
    pub async fn approve_batch(
        &self,
        grant: &BatchGrant,
        decider: &Decider,
        rules_for: impl Fn(&Step) -> Option<GateRules>,
        signature: Option<&VerifiedSignature>,
    ) -> Result<BatchOutcome, BatchError> {
        if grant.reason.trim().is_empty() {
            return Err(BatchError::NoReason);
        }
        grant.check_bounds(self.clock.now_ms())?;
        let batch_id = Uuid::new_v4().to_string();
        let approver = &decider.approver;
        let mut detail = serde_json::Map::new();
        detail.insert(
            "batch".into(),
            json!({
                "id": batch_id,
                "tool": grant.tool,
                "max_count": grant.max_count,
                "proposed_from": grant.proposed_from,
                "proposed_to": grant.proposed_to,
                "expires_at": grant.expires_at,
                "tenant": grant.tenant,
                "step_ids": grant.step_ids,
            }),
        );
        detail.insert("reason".into(), json!(grant.reason));
        detail.insert("approver_iss".into(), json!(approver.iss));
        self.append_audit(&NewAuditRecord {
            event: Some(AuditEvent::Approved),
            run_id: None,
            step_id: None,
            tool: Some(grant.tool.clone()),
            actor: Some(approver.actor()),
            rule: Some("approval.batch".into()),
            detail,
            tenant: Some(grant.tenant.clone()),
        })
        .await?;

        let mut given: u32 = 0;
        let mut results = Vec::with_capacity(grant.step_ids.len());
        for id in &grant.step_ids {
            let result = self
                .batch_step(grant, &batch_id, decider, &rules_for, id, given, signature)
                .await?;
            if matches!(result, StepResult::Approved { .. }) {
                given += 1;
            }
            results.push((id.clone(), result));
        }
        Ok(BatchOutcome { batch_id, results })
    }

    #[allow(clippy::too_many_arguments)]
    async fn batch_step(
        &self,
        grant: &BatchGrant,
        batch_id: &str,
        decider: &Decider,
        rules_for: &impl Fn(&Step) -> Option<GateRules>,
        id: &str,
        given: u32,
        signature: Option<&VerifiedSignature>,
    ) -> Result<StepResult, StoreError> {
        let outside = |o| Ok(StepResult::Outside(o));
        let step = match self.get_step(id).await {
            Ok(s) => s,
            Err(StoreError::NotFound) => return outside(Outside::NotFound),
            Err(e) => return Err(e),
        };
        let run = self.get_run(&step.run_id).await?;
        if run.tenant != grant.tenant {
            return outside(Outside::OtherTenant);
        }
        // A tool no longer in the registry has no approvers: its steps are as missing.
        let Some(rules) = rules_for(&step) else {
            return outside(Outside::NotFound);
        };
        // A step of a tool this person may not approve is answered as missing, before anything
        // about it (tool, status, age) is told.
        if !rules
            .approver_roles
            .iter()
            .any(|r| decider.roles.iter().any(|have| have == r))
        {
            return outside(Outside::NotFound);
        }
        if step.tool != grant.tool {
            return outside(Outside::OtherTool);
        }
        if step.status != StepStatus::NeedsApproval {
            return outside(Outside::NotWaiting(step.status.as_str().into()));
        }
        if step.created_at < grant.proposed_from || step.created_at > grant.proposed_to {
            return outside(Outside::OutsideWindow);
        }
        if given >= grant.max_count {
            return outside(Outside::OverCount);
        }
        match self
            .decide_step_within(
                &step.id,
                decider,
                &rules,
                Verdict::Approved,
                &grant.reason,
                Some((batch_id, grant.expires_at)),
                signature,
            )
            .await
        {
            Ok((approval, _token)) => {
                let status = self.get_step(&step.id).await?.status;
                Ok(StepResult::Approved {
                    approval_id: approval.id,
                    status,
                })
            }
            Err(DecideError::Store(e)) => Err(e),
            // A signer who already signed this step: the second signature is someone else's
            // (audited, as on the single-step path).
            Err(DecideError::AlreadyDecided) if rules.signature_required && signature.is_some() => {
                let refusal = SignatureRefusal::SameSigner;
                self.refuse_signature(&step, &decider.approver, refusal, &grant.reason)
                    .await?;
                let e = DecideError::Signature(refusal);
                Ok(StepResult::Decide {
                    code: decide_code(&e),
                    message: e.to_string(),
                })
            }
            Err(e) => Ok(StepResult::Decide {
                code: decide_code(&e),
                message: e.to_string(),
            }),
        }
    }
}
