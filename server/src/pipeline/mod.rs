//! The call pipeline (DESIGN §5): one code path from a proposed tool call to its outcome.
//!
//! listing → schema → canonicalise, hash, resolve or open the step (its key derived here) →
//! policy (decided again every time) → gate → key reservation → adapter → outcome, with the
//! step's status, the key's stored result and the audit records committed together.
//!
//! Invariants:
//! * A tool the caller's role does not list does not exist for it ([`Answer::UnknownTool`],
//!   the same for a tool that exists nowhere).
//! * No adapter runs unless the arguments fit the closed schema, policy allows the call, and —
//!   where approval is required — an approval bound to exactly these inputs hash is valid now.
//! * A write runs at most once per key: the key is reserved (unique row) before the adapter
//!   is called, and every later identical call gets the stored outcome. Keys are derived by
//!   Countersign; a key a client supplies is ignored.
//! * A timed-out irreversible call becomes `unknown` and is never retried blind.
//! * Every outcome appends audit records before the caller hears it; if recording fails the
//!   call fails closed. Agents never see internal errors, only "internal error".

mod adapter;
mod answer;
mod caller;
mod claimed;
mod ctx;
mod execute;
mod failpoint;
mod gate;
mod halt;
mod key;
mod listing;
mod open;
mod outcome;
mod policy;
mod redact;
mod replay;
mod revalidation;
mod run;
mod schema;

use crate::AppState;
pub use crate::provenance::{Provenance, traceparent_trace_id};
use answer::next;
pub use answer::{APPROVAL_EXPIRED, Answer, Internal, stored_outcome};
pub use caller::{Admission, COMPENSATOR, CallRequest, Caller};
pub use claimed::{AGENT_EXPIRED, AGENT_REVOKED, CREDENTIAL_ROLE, REVIEW_REQUIRED};
pub use claimed::{Prefetched, execute_claimed, execute_claimed_in};
use ctx::Ctx;
use ctx::bounded;
use execute::execute;
pub use halt::{EMERGENCY_STOP, STOP_RULE};
pub use key::IDEMPOTENCY_MISMATCH;
pub use open::{PLANNED_RUN, STEP_UNKNOWN};
pub use outcome::{DECISION_RULE, FOLDED, MAX_ATTEMPTS, TARGET_FAILED, TARGET_TIMEOUT, folds};
pub use policy::{POLICY_INPUTS, SHADOW, gate_rules, resource_id};
pub use redact::{audit_inputs, redacted};
pub use replay::IN_FLIGHT_WAIT;
use serde_json::Value;
use std::time::Instant;

pub use crate::adapters::ADAPTER_TIMEOUT;

/// Runs one call through the pipeline, and counts it for `/metrics`.
pub async fn call(
    state: &AppState,
    caller: &Caller,
    request: CallRequest,
) -> Result<Answer, Internal> {
    let began = Instant::now();
    let tool = bounded(&request.tool);
    let answer = call_inner(state, caller, request).await;
    let (tool, decision, outcome) = match &answer {
        Err(_) => (tool, "error", "internal_error".to_string()),
        Ok(Answer::UnknownTool) => ("<unlisted>".to_string(), "refuse", "unknown_tool".into()),
        Ok(Answer::Result { error, structured }) => {
            // Only the gateway's own statuses count: a tool's result may carry a `status`.
            let status = structured
                .get("status")
                .and_then(Value::as_str)
                .filter(|s| *error || ["needs_approval", "in_flight", "unknown"].contains(s));
            let decision = match status {
                Some("denied") => "deny",
                Some("invalid") => "schema",
                Some("needs_approval") | Some("expired") => "require_approval",
                Some("refused") => "refuse",
                _ => "allow",
            };
            let outcome = match (status, error) {
                (Some(s), _) => s.to_string(),
                (None, false) => "done".to_string(),
                (None, true) => "failed".to_string(),
            };
            (tool, decision, outcome)
        }
    };
    state
        .metrics
        .observe_call(&tool, decision, &outcome, began.elapsed());
    answer
}

/// The stages of one agent call, in order; each either hands on what the next needs or ends
/// the call with its answer (`answer::Flow`).
async fn call_inner(
    state: &AppState,
    caller: &Caller,
    request: CallRequest,
) -> Result<Answer, Internal> {
    // 2. The role's listing: unknown and unlisted are the same answer (and the same record).
    let loaded = state.registry.current();
    let Some((loaded, tool)) = listing::listed(loaded.as_deref(), caller, &request.tool) else {
        return listing::refuse_unlisted(state, caller, &request.tool).await;
    };
    let ctx = Ctx::for_call(state, caller, loaded, tool, &request.provenance);
    // 3. The closed schema, before anything else looks at the arguments; its canonical form.
    let arguments = Value::Object(request.arguments);
    let canonical = next!(schema::closed(&ctx, &arguments).await);
    // 4. The run and the step (whose key is derived on opening).
    let run = run::resolve_run(&ctx, request.run_id.as_deref()).await?;
    next!(open::refuse_planned_write(&ctx, &run).await);
    next!(open::check_named_step(&ctx, &run, request.step_id.as_deref(), &canonical).await);
    let opened = next!(open::open_step(&ctx, &run, &arguments, &canonical).await);
    // 5–12. Policy, gate, key, adapter, outcome.
    execute(
        &ctx,
        &run,
        opened.step,
        opened.fresh,
        opened.written,
        &canonical,
    )
    .await
}
