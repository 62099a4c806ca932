//! Stage 5: the facts policy decides on (resources, the gate's rules) and its words for a decision.

use super::answer::Internal;
use super::ctx::Ctx;
use super::ctx::detail;
use super::redact::audit_inputs;
use countersign_core::Decision;
use countersign_core::approvals::Approval;
use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::policy::ResourceFact;
use countersign_core::policy::{ApprovalState, Principal, PrincipalKind, Request, TaskOrigin};
use countersign_core::registry::Tool;
use countersign_core::store::{AgentCredential, CallContext, Run, Step};
use countersign_core::{CanonicalJson, RoleName, StepStatus};
use serde_json::{Value, json};

/// Resource facts for the records the arguments point at, from the tool's provider.
pub(super) async fn resource_facts(
    ctx: &Ctx<'_>,
    canonical: &Value,
) -> Result<Vec<ResourceFact>, Internal> {
    let Some(adapter) = ctx.loaded.adapters.get(ctx.tool.handler.provider.as_str()) else {
        return Ok(Vec::new());
    };
    let mut facts = Vec::new();
    for (field, kind) in &ctx.tool.resources {
        // [stillon] ids may be integers (`reservation_id: 8472`), not only strings.
        let Some(id) = canonical.get(field).and_then(resource_id) else {
            continue;
        };
        let id = id.as_str();
        match adapter.facts(kind, id).await {
            Ok(Some(fact)) => facts.push(fact),
            Ok(None) => {}
            Err(e) => return Err(Internal(format!("resource facts for {kind} {id}: {e}"))),
        }
    }
    Ok(facts)
}

/// A resource id argument as text: a string, or an integer (`8472`).
pub fn resource_id(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

pub(super) fn decision_text(d: &Decision) -> (&'static str, String) {
    match d {
        Decision::Allow => ("allow", "policy.allow".to_string()),
        Decision::AllowWithinAuthorization(id) => {
            ("allow_within_authorization", format!("authorization:{id}"))
        }
        Decision::RequireApproval(rule) => ("require_approval", rule.as_str().to_string()),
        Decision::Deny(rule) => ("deny", rule.as_str().to_string()),
    }
}

/// What `tool`'s gate asks of approvers for a call with `arguments`: its approver roles,
/// four eyes, step-up, and two distinct approvals when `amount` is above the tool's
/// `second_approval_above`.
pub fn gate_rules(tool: &Tool, arguments: &Value) -> countersign_core::approvals::GateRules {
    let Some(approval) = &tool.approval else {
        return countersign_core::approvals::GateRules {
            approver_roles: vec!["approver".into()],
            four_eyes: false,
            approvals_needed: 1,
            step_up_max_age_ms: None,
            party_confirms: false,
            signature_required: false,
        };
    };
    let amount = arguments.get("amount").and_then(Value::as_f64);
    let threshold = approval
        .second_approval_above
        .as_ref()
        .and_then(serde_json::Number::as_f64);
    let two = matches!((amount, threshold), (Some(a), Some(t)) if a > t);
    countersign_core::approvals::GateRules {
        approver_roles: approval
            .approver_roles
            .iter()
            .map(|r| r.as_str().to_string())
            .collect(),
        four_eyes: approval.four_eyes,
        approvals_needed: if two { 2 } else { 1 },
        step_up_max_age_ms: approval
            .step_up_max_age
            .map(|s| i64::try_from(s.as_secs()).unwrap_or(i64::MAX / 1000) * 1000),
        party_confirms: approval.party_confirms,
        signature_required: approval.signature_required,
    }
}

/// What policy decided for this attempt, and what the later stages need of it.
pub(super) struct Decided {
    /// The decision.
    pub(super) decision: Decision,
    /// Its name as stored on the step (`allow`, `deny`, …).
    pub(super) name: &'static str,
    /// Its rule as stored on the step and in the records.
    pub(super) rule: String,
    /// The approval bound to exactly these inputs, valid now, if any.
    pub(super) approval: Option<Approval>,
    /// The `decided` record, committed with the step's next move.
    pub(super) record: (AuditEvent, NewAuditRecord),
    /// The statuses the step may move from: the one this caller read (`pending`, or `failed`
    /// when `replay` found it retryable). A caller holding a stale copy never moves a step
    /// another attempt has ended meanwhile.
    pub(super) movable: Vec<StepStatus>,
}

impl Decided {
    /// Whether the step goes no further now (refused, or parked at its gate).
    pub(super) fn stops_here(&self) -> bool {
        match &self.decision {
            Decision::Deny(_) => true,
            Decision::RequireApproval(_) => self.approval.is_none(),
            Decision::Allow | Decision::AllowWithinAuthorization(_) => false,
        }
    }
}

/// Stage 5: policy decides this attempt with the facts of now — the tool's policy facts, the
/// resources its arguments name, the approval bound to exactly these inputs, the task's
/// origin, the party and grants of `world` — and the `decided` record is prepared.
pub(super) async fn decide(
    ctx: &Ctx<'_>,
    run: &Run,
    step: &Step,
    fresh: bool,
    canonical: &CanonicalJson,
    arguments: &Value,
    world: &CallContext,
) -> Result<Decided, Internal> {
    let store = &ctx.state.store;
    let credential = &ctx.caller.credential;
    let resources = resource_facts(ctx, arguments).await?;
    let role = RoleName::parse(&credential.role).map_err(|e| Internal(e.to_string()))?;
    let Some(facts) = ctx.loaded.bundle.tool_facts(&role, ctx.tool.name.as_str()) else {
        return Err(Internal(format!(
            "listed tool {} has no policy facts",
            ctx.tool.name
        )));
    };
    let rules = gate_rules(ctx.tool, arguments);
    let approval = if fresh {
        None
    } else {
        store
            .valid_approval_with(
                step,
                canonical,
                rules.approvals_needed,
                rules.signature_required,
            )
            .await?
    };
    let origin = task_origin(run, credential);
    let now = store.clock().now();
    let inputs = policy_inputs(
        now.timestamp_millis(),
        world,
        approval.is_some(),
        ctx.tool.redact.is_empty().then_some(resources.as_slice()),
    );
    let report = ctx.loaded.bundle.policy.decide(&Request {
        principal: Principal {
            kind: PrincipalKind::Agent,
            id: credential.id.clone(),
            role: credential.role.clone(),
            tenant: credential.tenant.clone(),
            acts_for: world.party.clone(),
        },
        tool: facts,
        schema_errors: Vec::new(),
        arguments: arguments.clone(),
        resources,
        task_origin: origin,
        approval: if approval.is_some() {
            ApprovalState::Approved
        } else {
            ApprovalState::None
        },
        now,
        authorizations: world.grants.clone(),
    });
    if !report.errors.is_empty() {
        tracing::warn!(tool = %ctx.tool.name, errors = ?report.errors, "policy evaluation errors");
    }
    let (name, rule) = decision_text(&report.decision);
    let mut members = detail(&[
        (DECISION, json!(name)),
        ("inputs", audit_inputs(ctx.state, ctx.tool, arguments)),
        ("inputs_hash", json!(step.inputs_hash)),
        ("idem_key", json!(step.idem_key)),
        ("effect", json!(ctx.tool.effect.as_str())),
        ("policy_ids", json!(report.policy_ids)),
        ("registry_version", json!(ctx.loaded.version)),
        ("task_origin", json!(origin.as_str())),
        ("declared", ctx.provenance.declared().unwrap_or(Value::Null)),
        (POLICY_INPUTS, inputs),
    ]);
    if !report.shadow.is_empty() {
        members.insert(SHADOW.into(), json!(report.shadow));
    }
    let record = ctx.record(AuditEvent::Decided, Some(step), Some(&rule), members);
    Ok(Decided {
        decision: report.decision,
        name,
        rule,
        approval,
        record,
        movable: vec![step.status],
    })
}

use countersign_core::audit::members::DECISION;
pub use countersign_core::audit::members::{POLICY_INPUTS, SHADOW};

/// [`POLICY_INPUTS`]: the instant (`now_ms`), the party the agent acted for, whether an
/// approval of exactly these inputs was in hand, the resource facts the target system gave,
/// and the standing authorizations the party held (their ids; the grants are rows).
/// Resource facts are `null` for a tool that redacts any of its inputs: a fact's id is an
/// argument and its attributes come from the target, and the audit never holds what the
/// tool's redaction keeps out of it (a preview replays such calls as approximate).
fn policy_inputs(
    now_ms: i64,
    world: &CallContext,
    approved: bool,
    resources: Option<&[ResourceFact]>,
) -> Value {
    json!({
        "v": 1,
        "now_ms": now_ms,
        "party": world.party,
        "approval": if approved { "approved" } else { "none" },
        "resources": resources,
        "grants": world.grants.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
    })
}

/// The run's origin, or the credential's when that is now `external` (an operator who learns
/// the agent reads inbound content says so once, for its open session runs too; a planned
/// step keeps the origin its planner had at submission); a text that is no origin is read as
/// `external`, the least trusted (fail closed).
fn task_origin(run: &Run, credential: &AgentCredential) -> TaskOrigin {
    match (
        TaskOrigin::parse(&run.origin),
        TaskOrigin::parse(&credential.origin),
    ) {
        (_, Some(TaskOrigin::External) | None) | (None, _) => TaskOrigin::External,
        (Some(origin), Some(_)) => origin,
    }
}
