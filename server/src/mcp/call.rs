//! The front of the `tools/call` pipeline (DESIGN §5 steps 2–5): role listing → schema →
//! canonicalise and hash → policy.
//!
//! This slice stops at the decision. It runs no adapter and writes no run, step or key row
//! yet: an allowed call answers `{status: "accepted", inputs_hash}` and a call needing
//! approval answers `{status: "needs_approval", rule}` without parking a step. The gate, key
//! reservation, adapters and `_meta.run_id` come in a later change.
//!
//! Every outcome appends one audit record before the agent hears it: `refused` (with
//! `role.tool_not_listed` or `input.schema`) or `decided` (with the deciding rule). If the
//! append fails the call fails closed with an internal error. Until the redaction key is
//! configured (issue 6) records carry the inputs hash, never the inputs.
//!
//! Also still to come: resource facts (the records the arguments point at) are read from the
//! target systems by the adapters, so policies that need one (`payment.no_invoice`) deny for
//! now; the task origin comes from the caller's run, so a direct call counts as
//! [`DIRECT_CALL_ORIGIN`]; `acts_for` is unknown.

use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::policy::{ApprovalState, Principal, PrincipalKind, Request, TaskOrigin};
use countersign_core::store::AgentCredential;
use countersign_core::{CanonicalJson, Decision, InputsHash, RoleName, Rule};
use rmcp::ErrorData;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::{Map, Value, json};

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
    // 2. The role's listing: unknown and unlisted are the same answer (and the same record).
    let refused_unlisted = || async {
        let mut detail = Map::new();
        detail.insert("requested_tool".into(), json!(bounded(&request.name)));
        record(
            state,
            credential,
            AuditEvent::Refused,
            None,
            Rule::TOOL_NOT_LISTED.as_str(),
            detail,
        )
        .await?;
        Err(unknown_tool())
    };
    let Some(loaded) = state.registry.current() else {
        return refused_unlisted().await;
    };
    let Ok(role) = RoleName::parse(&credential.role) else {
        return refused_unlisted().await;
    };
    let registry = &loaded.bundle.registry;
    let Some(tool) = registry.tool_for_role(&role, &request.name) else {
        return refused_unlisted().await;
    };
    let tool_name = tool.name.as_str();

    // 3. The closed schema, before anything else looks at the arguments.
    let arguments = Value::Object(request.arguments.unwrap_or_default());
    if let Err(errors) = registry.validate(&tool.name, &arguments) {
        let errors: Vec<Value> = errors
            .iter()
            .map(|e| json!({"path": e.path, "message": e.message}))
            .collect();
        return refuse_invalid(state, credential, tool_name, errors).await;
    }

    // 4. Canonical form and its hash: everything downstream binds to these.
    let canonical = match CanonicalJson::from_value(&arguments) {
        Ok(c) => c,
        Err(e) => {
            let errors = vec![json!({"path": "", "message": e.to_string()})];
            return refuse_invalid(state, credential, tool_name, errors).await;
        }
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
    let (decision, rule) = match &report.decision {
        Decision::Allow => ("allow", "policy.allow".to_string()),
        Decision::AllowWithinAuthorization(id) => {
            ("allow_within_authorization", format!("authorization:{id}"))
        }
        Decision::RequireApproval(rule) => ("require_approval", rule.as_str().to_string()),
        Decision::Deny(rule) => ("deny", rule.as_str().to_string()),
    };
    let mut detail = Map::new();
    detail.insert("decision".into(), json!(decision));
    detail.insert("inputs_hash".into(), json!(inputs_hash.to_string()));
    detail.insert("effect".into(), json!(tool.effect.as_str()));
    detail.insert("policy_ids".into(), json!(report.policy_ids));
    record(
        state,
        credential,
        AuditEvent::Decided,
        Some(tool_name),
        &rule,
        detail,
    )
    .await?;
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

/// At most 128 characters of agent-supplied text, for the audit record.
fn bounded(text: &str) -> String {
    text.chars().take(128).collect()
}

/// Appends one audit record for this call; an error here fails the call closed.
async fn record(
    state: &AppState,
    credential: &AgentCredential,
    event: AuditEvent,
    tool: Option<&str>,
    rule: &str,
    detail: Map<String, Value>,
) -> Result<(), ErrorData> {
    let new = NewAuditRecord {
        event: Some(event),
        run_id: None,
        step_id: None,
        tool: tool.map(str::to_string),
        actor: Some(format!(
            "agent:{} role:{} tenant:{}",
            credential.id, credential.role, credential.tenant
        )),
        rule: Some(rule.to_string()),
        detail,
    };
    state
        .store
        .append_audit(&new)
        .await
        .map(|_| ())
        .map_err(|e| {
            tracing::error!(error = %e, "mcp: audit append failed; refusing the call");
            internal_error()
        })
}

/// Records an `input.schema` refusal, then answers with it.
async fn refuse_invalid(
    state: &AppState,
    credential: &AgentCredential,
    tool_name: &str,
    errors: Vec<Value>,
) -> Result<CallToolResult, ErrorData> {
    let mut detail = Map::new();
    detail.insert("errors".into(), Value::Array(errors.clone()));
    record(
        state,
        credential,
        AuditEvent::Refused,
        Some(tool_name),
        Rule::INPUT_SCHEMA.as_str(),
        detail,
    )
    .await?;
    Ok(invalid(errors))
}

/// The refusal for arguments that do not match the tool's input schema.
fn invalid(errors: Vec<Value>) -> CallToolResult {
    CallToolResult::structured_error(json!({
        "status": "invalid",
        "rule": "input.schema",
        "errors": errors,
    }))
}
