//! Whether a step's approvals let it run now: the check the gate makes at execution.
//!
//! Invariants: see [`super`] — an approval authorises only its own step, only while the
//! inputs about to run, the stored canonical text and the stored hash all hash to the bound
//! one, before its expiry, with no rejection; for a tool that requires signatures only signed
//! approvals count.

use super::{Approval, COLUMNS};
use crate::canonical::CanonicalJson;
use crate::keys::InputsHash;
use crate::store::{Step, Store, StoreError, on_pool};

impl Store {
    /// The approval that lets `step` run with `inputs` (the canonical inputs about to be
    /// executed) now: `needed` distinct approvals, each bound to the hash of exactly these
    /// inputs and not expired, and no rejection. Returns the latest of them; `None` otherwise.
    ///
    /// Fails closed: when `inputs`, the step's stored canonical text and its stored hash do
    /// not all hash alike (inputs changed after the decision, in a call or in the database),
    /// no approval binds them.
    pub async fn valid_approval(
        &self,
        step: &Step,
        inputs: &CanonicalJson,
        needed: u32,
    ) -> Result<Option<Approval>, StoreError> {
        self.valid_approval_with(step, inputs, needed, false).await
    }

    /// [`Store::valid_approval`]; with `signed_only` (the tool requires signatures) only
    /// approvals that carry a verified passkey signature count: an approval row written any
    /// other way lets nothing through.
    pub async fn valid_approval_with(
        &self,
        step: &Step,
        inputs: &CanonicalJson,
        needed: u32,
        signed_only: bool,
    ) -> Result<Option<Approval>, StoreError> {
        // Approvals are recorded only for a step parked at its gate, which opens its window
        // (`expires_at`, never cleared afterwards): a step without one has none to read.
        if step.expires_at.is_none() {
            return Ok(None);
        }
        let current = InputsHash::of(inputs).to_string();
        let stored_text_hash = CanonicalJson::from_canonical_text(&step.inputs)
            .ok()
            .map(|c| InputsHash::of(&c).to_string());
        if step.inputs_hash != current || stored_text_hash.as_deref() != Some(current.as_str()) {
            return Ok(None);
        }
        let now = self.clock.now_ms();
        let all = self.approvals_for_step(&step.id).await?;
        if all.iter().any(|a| a.decision == "rejected") {
            return Ok(None);
        }
        let valid: Vec<&Approval> = all
            .iter()
            .filter(|a| {
                a.decision == "approved"
                    && a.step_id == step.id
                    && a.inputs_hash == current
                    && a.expires_at > now
                    && (!signed_only || a.signature.is_some())
            })
            .collect();
        let needed = usize::try_from(needed.max(1)).unwrap_or(usize::MAX);
        Ok((valid.len() >= needed)
            .then(|| valid.last().map(|a| (*a).clone()))
            .flatten())
    }

    /// Every decision on a step, oldest first.
    pub async fn approvals_for_step(&self, step_id: &str) -> Result<Vec<Approval>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM approvals WHERE step_id = $1 ORDER BY decided_at");
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(step_id).fetch_all(p).await?
        }))
    }
}
