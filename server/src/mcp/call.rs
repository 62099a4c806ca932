//! The front of the `tools/call` pipeline (DESIGN §5 steps 2–5): role listing → schema →
//! canonicalise and hash → policy.
//!
//! This slice stops at the decision. It runs no adapter and writes no run, step, key or audit
//! row yet: an allowed call answers `{status: "accepted", inputs_hash}` and a call needing
//! approval answers `{status: "needs_approval", rule}` without parking a step. The gate, key
//! reservation, adapters, audit records and `_meta.run_id` come in a later change.
//!
//! Also still to come: resource facts (the records the arguments point at) are read from the
//! target systems by the adapters, so policies that need one (`payment.no_invoice`) deny for
//! now; the task origin comes from the caller's run, so a direct call counts as
//! [`DIRECT_CALL_ORIGIN`]; `acts_for` is unknown.

use countersign_core::policy::{ApprovalState, Principal, PrincipalKind, Request, TaskOrigin};
use countersign_core::store::AgentCredential;
use countersign_core::{CanonicalJson, Decision, InputsHash, RoleName};
use rmcp::ErrorData;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::{Value, json};

use super::{internal_error, unknown_tool};
use crate::AppState;

/// The task origin policies see for a call made outside any run.
pub const DIRECT_CALL_ORIGIN: TaskOrigin = TaskOrigin::User;

/// Runs one `tools/call` for `credential`. `Err` only for a tool the role does not have
/// ([`unknown_tool`]) or an internal failure ([`internal_error`]); every other outcome is a
/// tool result, `isError` when refused.
pub async fn call(
    state: &AppState,
    credential: &AgentCredential,
    request: CallToolRequestParams,
) -> Result<CallToolResult, ErrorData> {
    // 2. The role's listing: unknown and unlisted are the same answer.
    let Some(loaded) = state.registry.current() else {
        return Err(unknown_tool());
    };
    let Ok(role) = RoleName::parse(&credential.role) else {
        return Err(unknown_tool());
    };
    let registry = &loaded.bundle.registry;
    let Some(tool) = registry.tool_for_role(&role, &request.name) else {
        return Err(unknown_tool());
    };

    // 3. The closed schema, before anything else looks at the arguments.
    let arguments = Value::Object(request.arguments.unwrap_or_default());
    if let Err(errors) = registry.validate(&tool.name, &arguments) {
        let errors: Vec<Value> = errors
            .iter()
            .map(|e| json!({"path": e.path, "message": e.message}))
            .collect();
        return Ok(invalid(errors));
    }

    // 4. Canonical form and its hash: everything downstream binds to these.
    let canonical = match CanonicalJson::from_value(&arguments) {
        Ok(c) => c,
        Err(e) => return Ok(invalid(vec![json!({"path": "", "message": e.to_string()})])),
    };
    let inputs_hash = InputsHash::of(&canonical);
    let canonical_arguments = canonical.to_value().map_err(|e| {
        tracing::error!(error = %e, "mcp: canonical arguments do not read back");
        internal_error()
    })?;

    // 5. Policy, decided here whatever was decided at planning time.
    let Some(facts) = loaded.bundle.tool_facts(&role, tool.name.as_str()) else {
        tracing::error!(tool = %tool.name, "mcp: a listed tool has no policy facts");
        return Err(internal_error());
    };
    let policy_request = Request {
        principal: Principal {
            kind: PrincipalKind::Agent,
            id: credential.id.clone(),
            role: credential.role.clone(),
            tenant: credential.tenant.clone(),
            acts_for: None,
        },
        tool: facts,
        schema_errors: Vec::new(),
        arguments: canonical_arguments,
        resources: Vec::new(),
        task_origin: DIRECT_CALL_ORIGIN,
        approval: ApprovalState::None,
        now: state.store.clock().now(),
        authorizations: Vec::new(),
    };
    let report = loaded.bundle.policy.decide(&policy_request);
    if !report.errors.is_empty() {
        tracing::warn!(tool = %tool.name, errors = ?report.errors, "mcp: policy evaluation errors");
    }
    Ok(match report.decision {
        Decision::Allow | Decision::AllowWithinAuthorization(_) => {
            CallToolResult::structured(json!({
                "status": "accepted",
                "inputs_hash": inputs_hash.to_string(),
            }))
        }
        Decision::RequireApproval(rule) => CallToolResult::structured(json!({
            "status": "needs_approval",
            "rule": rule.as_str(),
        })),
        Decision::Deny(rule) => CallToolResult::structured_error(json!({
            "status": "denied",
            "rule": rule.as_str(),
        })),
    })
}

/// The refusal for arguments that do not match the tool's input schema.
fn invalid(errors: Vec<Value>) -> CallToolResult {
    CallToolResult::structured_error(json!({
        "status": "invalid",
        "rule": "input.schema",
        "errors": errors,
    }))
}
