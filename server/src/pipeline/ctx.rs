//! What one call works with: the caller, the tool, its traces, and the audit record builder.

use super::answer::Internal;
use super::caller::Caller;
use crate::AppState;
use crate::provenance::Provenance;
use crate::registry::Loaded;
use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::registry::Tool;
use countersign_core::store::{Step, Transition};
use serde_json::{Map, Value, json};
use std::sync::atomic::AtomicBool;

/// Everything one call works with.
pub(super) struct Ctx<'a> {
    pub(super) state: &'a AppState,
    pub(super) caller: &'a Caller,
    pub(super) loaded: &'a Loaded,
    pub(super) tool: &'a Tool,
    /// This attempt's id: the owner of the key it reserves (never shared by two attempts).
    pub(super) trace_id: String,
    /// The action's trace id, shared by every record from proposal to outcome and sent to
    /// the target: the client's `traceparent` trace id, the planned step's, or new.
    pub(super) trace: String,
    /// What the caller declared about itself.
    pub(super) provenance: Provenance,
    /// Set when this call's closing transition moved the step to `done` and ended the
    /// executor's lease with it (`execute_claimed_in`).
    pub(super) closed_done: Option<&'a AtomicBool>,
}

impl<'a> Ctx<'a> {
    /// The context of an agent's call of `tool`: a new attempt id, and the trace the
    /// client's `traceparent` names (else a new one).
    pub(super) fn for_call(
        state: &'a AppState,
        caller: &'a Caller,
        loaded: &'a Loaded,
        tool: &'a Tool,
        provenance: &Provenance,
    ) -> Self {
        Ctx {
            state,
            caller,
            loaded,
            tool,
            trace_id: uuid::Uuid::new_v4().to_string(),
            trace: provenance
                .trace_id
                .clone()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            provenance: provenance.clone(),
            closed_done: None,
        }
    }

    pub(super) fn actor(&self) -> String {
        let c = &self.caller.credential;
        match &self.caller.executor {
            Some(w) => format!(
                "executor:{w} agent:{} role:{} tenant:{}",
                c.id, c.role, c.tenant
            ),
            None => format!("agent:{} role:{} tenant:{}", c.id, c.role, c.tenant),
        }
    }

    pub(super) fn record(
        &self,
        event: AuditEvent,
        step: Option<&Step>,
        rule: Option<&str>,
        detail: Map<String, Value>,
    ) -> (AuditEvent, NewAuditRecord) {
        let mut detail = detail;
        detail
            .entry("trace_id")
            .or_insert_with(|| json!(self.trace));
        (
            event,
            NewAuditRecord {
                event: Some(event),
                run_id: step.map(|s| s.run_id.clone()),
                step_id: step.map(|s| s.id.clone()),
                tool: Some(self.tool.name.as_str().to_string()),
                actor: Some(self.actor()),
                rule: rule.map(str::to_string),
                detail,
                // The caller's tenant; a step's run of another tenant is refused by the store.
                tenant: Some(self.caller.credential.tenant.clone()),
            },
        )
    }

    pub(super) async fn append(
        &self,
        record: (AuditEvent, NewAuditRecord),
    ) -> Result<(), Internal> {
        self.state.store.append_audit(&record.1).await?;
        Ok(())
    }

    /// [`Ctx::transition`] without reading the step back: `true` when it moved.
    pub(super) async fn moved(&self, t: Transition) -> Result<bool, Internal> {
        Ok(self.state.store.move_step(&t).await?)
    }

    /// Moves `step` (from one of `from`) with `records`; `None` when it had moved already.
    pub(super) async fn transition(&self, t: Transition) -> Result<Option<Step>, Internal> {
        Ok(self.state.store.transition(&t).await?.map(|(s, _)| s))
    }
}

pub(super) fn detail(pairs: &[(&str, Value)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

/// At most 128 characters of caller-supplied text, for the audit record.
pub(super) fn bounded(text: &str) -> String {
    text.chars().take(128).collect()
}
