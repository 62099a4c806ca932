//! Writing a registry back to YAML in its canonical form: long forms only (handler as
//! `{provider, operation}`, redactions as `{field, how}`), every role pairing written on the
//! tool, defaults written out (`version`, `expires`, `open_world`). Loading the output gives
//! an equal registry.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::load::gate_str;
use super::model::{Registry, Tool};

#[derive(Serialize)]
struct FileOut<'a> {
    providers: BTreeMap<&'a str, ProviderOut<'a>>,
    roles: BTreeMap<&'a str, RoleOut<'a>>,
    tools: BTreeMap<&'a str, ToolOut<'a>>,
}

#[derive(Serialize)]
struct ProviderOut<'a> {
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    base_url: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    allowed_hosts: Vec<&'a str>,
    open_world: bool,
}

#[derive(Serialize)]
struct RoleOut<'a> {
    description: &'a str,
}

#[derive(Serialize)]
struct ToolOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    title: Option<&'a str>,
    description: &'a str,
    version: u32,
    effect: &'static str,
    gate: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    review: Option<&'static str>,
    roles: Vec<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    approval: Option<ApprovalOut<'a>>,
    handler: HandlerOut<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    compensate: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    verify: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reconcile: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    redact: Vec<RedactOut<'a>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    resources: &'a BTreeMap<String, String>,
    #[serde(rename = "inputSchema")]
    input_schema: &'a Value,
    #[serde(rename = "outputSchema", skip_serializing_if = "Option::is_none")]
    output_schema: Option<&'a Value>,
}

#[derive(Serialize)]
struct ApprovalOut<'a> {
    approver_roles: Vec<&'a str>,
    expires: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step_up_max_age: Option<String>,
    four_eyes: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    second_approval_above: Option<&'a serde_json::Number>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    party_confirms: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reversal_cost: Option<&'a serde_json::Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    signature: Option<&'static str>,
}

#[derive(Serialize)]
struct HandlerOut<'a> {
    provider: &'a str,
    operation: &'a str,
}

#[derive(Serialize)]
struct RedactOut<'a> {
    field: &'a str,
    how: &'static str,
}

fn tool_out(t: &Tool) -> ToolOut<'_> {
    ToolOut {
        title: t.title.as_deref(),
        description: &t.description,
        version: t.version,
        effect: t.effect.as_str(),
        gate: gate_str(t.gate),
        review: t.review_required.then_some("required"),
        roles: t.roles.iter().map(|r| r.as_str()).collect(),
        approval: t.approval.as_ref().map(|a| ApprovalOut {
            approver_roles: a.approver_roles.iter().map(|r| r.as_str()).collect(),
            expires: a.expires.to_string(),
            step_up_max_age: a.step_up_max_age.map(|s| s.to_string()),
            four_eyes: a.four_eyes,
            second_approval_above: a.second_approval_above.as_ref(),
            party_confirms: a.party_confirms,
            reversal_cost: a.reversal_cost.as_ref(),
            signature: a.signature_required.then_some("required"),
        }),
        handler: HandlerOut {
            provider: t.handler.provider.as_str(),
            operation: &t.handler.operation,
        },
        compensate: t.compensate.as_ref().map(|n| n.as_str()),
        verify: t.verify.as_ref().map(|n| n.as_str()),
        reconcile: t.reconcile.as_ref().map(|n| n.as_str()),
        redact: t
            .redact
            .iter()
            .map(|r| RedactOut {
                field: &r.field,
                how: r.how.as_str(),
            })
            .collect(),
        resources: &t.resources,
        input_schema: &t.input_schema,
        output_schema: t.output_schema.as_ref(),
    }
}

pub(super) fn to_yaml(r: &Registry) -> Result<String, ExportError> {
    let file = FileOut {
        providers: r
            .providers
            .values()
            .map(|p| {
                (
                    p.name.as_str(),
                    ProviderOut {
                        kind: p.kind.as_str(),
                        description: p.description.as_deref(),
                        base_url: p.base_url.as_deref(),
                        url: p.url.as_deref(),
                        allowed_hosts: p.allowed_hosts.iter().map(String::as_str).collect(),
                        open_world: p.open_world,
                    },
                )
            })
            .collect(),
        roles: r
            .roles
            .values()
            .map(|role| {
                (
                    role.name.as_str(),
                    RoleOut {
                        description: &role.description,
                    },
                )
            })
            .collect(),
        tools: r
            .tools
            .values()
            .map(|t| (t.name.as_str(), tool_out(t)))
            .collect(),
    };
    Ok(serde_norway::to_string(&file)?)
}

/// The registry could not be written out.
#[derive(Debug, thiserror::Error)]
#[error("cannot export the registry as YAML: {0}")]
pub struct ExportError(#[from] serde_norway::Error);
