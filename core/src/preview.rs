//! Impact preview (issue 33): what a proposed registry/policy bundle would have decided for
//! calls already recorded, beside what the bundle in force decides for the same inputs.
//!
//! Invariants:
//! * Pure: nothing is executed, no adapter is called, no clock is read — each call is decided
//!   at the instant it was recorded, with the facts recorded with it.
//! * Both sides decide the same inputs, the base bundle included (not the stored decision): a
//!   transition is the proposed change's doing, never drift between then and now.
//! * A call is listed, then validated against the tool's schema, then decided by policy,
//!   exactly the order of the pipeline; an unlisted or invalid call is its own outcome.
//! * A step counts once, by its first recorded decision (the question its gate was asked);
//!   a later attempt of the same step (after an approval) is not another call.
//! * A change of outcome is a change of its kind (`allow->deny`); the same kind under another
//!   rule is counted apart (`rule_changed`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::RoleName;
use crate::bundle::Bundle;
use crate::policy::{
    ApprovalState, Decision, Principal, PrincipalKind, Request, ResourceFact,
    StandingAuthorization, TaskOrigin,
};
use crate::registry::ToolName;

/// The most example calls kept per transition.
pub const EXAMPLES_PER_TRANSITION: usize = 20;

/// One recorded call, as a replay needs it.
#[derive(Debug, Clone)]
pub struct RecordedCall {
    /// The audit record that holds its decision (for links), if known.
    pub record: Option<(String, i64)>,
    /// Its step.
    pub step_id: String,
    /// Its run, if known.
    pub run_id: Option<String>,
    /// The agent credential, its role and tenant.
    pub agent_id: String,
    /// Role.
    pub role: String,
    /// Tenant.
    pub tenant: String,
    /// The tool asked for.
    pub tool: String,
    /// The canonical arguments.
    pub arguments: Value,
    /// Where its task came from.
    pub task_origin: TaskOrigin,
    /// When it was decided.
    pub at: DateTime<Utc>,
    /// What else policy decided on, when recorded (`None`: older records; replayed without
    /// resource facts, party or grants, and counted as approximate).
    pub inputs: Option<RecordedInputs>,
}

/// The policy inputs recorded with a decision beyond the step's row.
#[derive(Debug, Clone, Default)]
pub struct RecordedInputs {
    /// The decision's own instant (the record's time can be later: a read's outcome record).
    pub now: Option<DateTime<Utc>>,
    /// The resource facts were withheld (a tool that redacts its inputs): replayed without
    /// them, and counted as approximate.
    pub resources_withheld: bool,
    /// The party the agent acted for.
    pub party: Option<String>,
    /// Whether an approval of exactly these inputs was in hand.
    pub approved: bool,
    /// The resource facts the target system gave.
    pub resources: Vec<ResourceFact>,
    /// The standing authorizations the party held.
    pub grants: Vec<StandingAuthorization>,
}

/// What one bundle makes of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The role does not have the tool.
    Unlisted,
    /// The arguments do not fit the tool's schema.
    Invalid,
    /// Policy allows it (outright or within a standing authorization).
    Allow,
    /// A person must approve it (the rule).
    RequireApproval(String),
    /// Policy refuses it (the rule).
    Deny(String),
}

impl Outcome {
    /// Its name in a transition (`allow`, `require_approval`, `deny`, `invalid`, `unlisted`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Unlisted => "unlisted",
            Self::Invalid => "invalid",
            Self::Allow => "allow",
            Self::RequireApproval(_) => "require_approval",
            Self::Deny(_) => "deny",
        }
    }

    /// The rule that decided, if one did.
    pub fn rule(&self) -> Option<&str> {
        match self {
            Self::RequireApproval(r) | Self::Deny(r) => Some(r),
            _ => None,
        }
    }
}

/// A call whose outcome the proposal changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Example {
    /// Its step.
    pub step_id: String,
    /// Its audit record (chain, seq), if known.
    pub record: Option<(String, i64)>,
    /// Its run, if known.
    pub run_id: Option<String>,
    /// The tool.
    pub tool: String,
    /// The rule the base decided with, if any.
    pub from_rule: Option<String>,
    /// The rule the proposal decides with, if any.
    pub to_rule: Option<String>,
}

/// What a replay found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Calls replayed.
    pub replayed: usize,
    /// Calls whose outcome the proposal changes.
    pub changed: usize,
    /// Calls replayed without all their policy inputs (older records, withheld facts).
    pub approximate: usize,
    /// Calls whose outcome keeps its kind under another rule.
    pub rule_changed: usize,
    /// Changed calls per transition (`allow->deny`, …).
    pub transitions: BTreeMap<String, usize>,
    /// Per tool, changed calls per transition.
    pub by_tool: BTreeMap<String, BTreeMap<String, usize>>,
    /// Per rule (the proposal's, else the base's), changed calls per transition.
    pub by_rule: BTreeMap<String, BTreeMap<String, usize>>,
    /// Up to [`EXAMPLES_PER_TRANSITION`] calls per transition.
    pub examples: BTreeMap<String, Vec<Example>>,
}

/// What `bundle` makes of `call`, at the instant and with the facts it was recorded with.
pub fn outcome(bundle: &Bundle, call: &RecordedCall) -> Outcome {
    let Ok(role) = RoleName::parse(&call.role) else {
        return Outcome::Unlisted;
    };
    let (Some(facts), Ok(name)) = (
        bundle.tool_facts(&role, &call.tool),
        ToolName::parse(&call.tool),
    ) else {
        return Outcome::Unlisted;
    };
    if !facts.listed_for_role {
        return Outcome::Unlisted;
    }
    if bundle.registry.validate(&name, &call.arguments).is_err() {
        return Outcome::Invalid;
    }
    let inputs = call.inputs.clone().unwrap_or_default();
    let report = bundle.policy.decide_enforced(&Request {
        principal: Principal {
            kind: PrincipalKind::Agent,
            id: call.agent_id.clone(),
            role: call.role.clone(),
            tenant: call.tenant.clone(),
            acts_for: inputs.party,
        },
        tool: facts,
        schema_errors: Vec::new(),
        arguments: call.arguments.clone(),
        resources: inputs.resources,
        task_origin: call.task_origin,
        approval: if inputs.approved {
            ApprovalState::Approved
        } else {
            ApprovalState::None
        },
        now: inputs.now.unwrap_or(call.at),
        authorizations: inputs.grants,
    });
    match report.decision {
        Decision::Allow | Decision::AllowWithinAuthorization(_) => Outcome::Allow,
        Decision::RequireApproval(rule) => Outcome::RequireApproval(rule.as_str().to_string()),
        Decision::Deny(rule) => Outcome::Deny(rule.as_str().to_string()),
    }
}

/// Replays `calls` through `base` and `proposed`; what changes, counted and exemplified.
pub fn replay(base: &Bundle, proposed: &Bundle, calls: &[RecordedCall]) -> Report {
    let mut replay = Replay::new(base, proposed);
    for call in calls {
        replay.call(call);
    }
    replay.finish()
}

/// A replay fed one recorded call at a time (a window too large to hold at once).
pub struct Replay<'a> {
    base: &'a Bundle,
    proposed: &'a Bundle,
    seen: std::collections::HashSet<String>,
    report: Report,
}

impl<'a> Replay<'a> {
    /// A replay of nothing yet.
    pub fn new(base: &'a Bundle, proposed: &'a Bundle) -> Self {
        Self {
            base,
            proposed,
            seen: std::collections::HashSet::new(),
            report: Report::default(),
        }
    }

    /// What it found.
    pub fn finish(self) -> Report {
        self.report
    }

    /// Replays one call (a step's later decisions are skipped: it counts once).
    pub fn call(&mut self, call: &RecordedCall) {
        if !self.seen.insert(call.step_id.clone()) {
            return;
        }
        let (base, proposed, report) = (self.base, self.proposed, &mut self.report);
        report.replayed += 1;
        if call.inputs.as_ref().is_none_or(|i| i.resources_withheld) {
            report.approximate += 1;
        }
        let (before, after) = (outcome(base, call), outcome(proposed, call));
        if before.name() == after.name() {
            if before != after {
                report.rule_changed += 1;
            }
            return;
        }
        report.changed += 1;
        let transition = format!("{}->{}", before.name(), after.name());
        *report.transitions.entry(transition.clone()).or_default() += 1;
        *report
            .by_tool
            .entry(call.tool.clone())
            .or_default()
            .entry(transition.clone())
            .or_default() += 1;
        if let Some(rule) = after.rule().or(before.rule()) {
            *report
                .by_rule
                .entry(rule.to_string())
                .or_default()
                .entry(transition.clone())
                .or_default() += 1;
        }
        let examples = report.examples.entry(transition).or_default();
        if examples.len() < EXAMPLES_PER_TRANSITION {
            examples.push(Example {
                step_id: call.step_id.clone(),
                record: call.record.clone(),
                run_id: call.run_id.clone(),
                tool: call.tool.clone(),
                from_rule: before.rule().map(str::to_string),
                to_rule: after.rule().map(str::to_string),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::BundleSources;
    use serde_json::json;

    fn finance(change: impl Fn(&mut BundleSources)) -> Bundle {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/finance");
        let mut sources = BundleSources::read(&path).expect("the finance example reads");
        change(&mut sources);
        Bundle::load(sources).expect("the finance example loads")
    }

    fn hold(step: &str, amount: f64) -> RecordedCall {
        RecordedCall {
            record: Some(("acme".into(), 7)),
            step_id: step.into(),
            run_id: None,
            agent_id: "agent-1".into(),
            role: "worker.finance".into(),
            tenant: "acme".into(),
            tool: "invoice.hold".into(),
            arguments: json!({"invoice_id": "INV-20260611", "amount": amount,
                              "currency": "EUR", "reason": "Disputed quantity on line 2 of the PO"}),
            task_origin: TaskOrigin::User,
            at: DateTime::from_timestamp(1_781_170_937, 0).expect("a time"),
            inputs: Some(RecordedInputs::default()),
        }
    }

    #[test]
    fn the_same_bundle_changes_nothing() {
        let base = finance(|_| {});
        let calls = [hold("s1", 500.0), hold("s2", 2000.0)];
        let report = replay(&base, &base, &calls);
        assert_eq!((report.replayed, report.changed), (2, 0));
        assert!(report.transitions.is_empty());
    }

    #[test]
    fn a_raised_threshold_moves_gated_holds_below_it_to_allow() {
        let base = finance(|_| {});
        let raised = finance(|s| {
            s.policies = s.policies.replace(
                "context.args.amount_minor > 100000",
                "context.args.amount_minor > 300000",
            );
        });
        let calls = [
            hold("s1", 500.0),
            hold("s2", 2000.0),
            hold("s3", 2500.0),
            hold("s4", 4000.0),
        ];
        assert_eq!(outcome(&base, &calls[1]).name(), "require_approval");
        let report = replay(&base, &raised, &calls);
        assert_eq!((report.replayed, report.changed), (4, 2));
        assert_eq!(
            report.transitions,
            BTreeMap::from([("require_approval->allow".into(), 2)])
        );
        assert_eq!(
            report.by_rule["amount.threshold"],
            BTreeMap::from([("require_approval->allow".into(), 2)])
        );
        let steps: Vec<&str> = report.examples["require_approval->allow"]
            .iter()
            .map(|e| e.step_id.as_str())
            .collect();
        assert_eq!(steps, ["s2", "s3"]);
    }

    #[test]
    fn a_tool_removed_from_the_role_and_a_tightened_schema_show_as_their_own_outcomes() {
        let base = finance(|_| {});
        let calls = [hold("s1", 500.0), hold("s2", 2000.0)];
        let edit = |from: &'static str, to: &'static str| {
            finance(move |s| {
                let changed = s.registry_yaml.replacen(from, to, 1);
                assert_ne!(changed, s.registry_yaml, "{from:?} is in the registry");
                s.registry_yaml = changed;
            })
        };
        let unlisted = edit(
            "    gate: policy\n    roles: [worker.finance]\n    approval:\n      approver_roles: [approver]\n      expires: 72h\n      reversal_cost: 5\n    handler: {provider: erp, operation: invoices.hold}",
            "    gate: policy\n    roles: [planner]\n    approval:\n      approver_roles: [approver]\n      expires: 72h\n      reversal_cost: 5\n    handler: {provider: erp, operation: invoices.hold}",
        );
        let report = replay(&base, &unlisted, &calls);
        assert_eq!(
            report.transitions,
            BTreeMap::from([
                ("allow->unlisted".into(), 1),
                ("require_approval->unlisted".into(), 1)
            ])
        );
        let tightened = edit(
            "amount: {type: number, exclusiveMinimum: 0, maximum: 50000}\n        currency: {type: string, enum: [EUR]}\n        reason: {type: string, minLength: 20, maxLength: 400}",
            "amount: {type: number, exclusiveMinimum: 0, maximum: 1000}\n        currency: {type: string, enum: [EUR]}\n        reason: {type: string, minLength: 20, maxLength: 400}",
        );
        let report = replay(&base, &tightened, &calls);
        assert_eq!(
            report.transitions,
            BTreeMap::from([("require_approval->invalid".into(), 1)])
        );
        assert_eq!(
            report.by_tool["invoice.hold"],
            BTreeMap::from([("require_approval->invalid".into(), 1)])
        );
    }

    #[test]
    fn recorded_resource_facts_decide_both_sides_and_a_step_counts_once() {
        let base = finance(|_| {});
        let without = finance(|s| {
            let changed = s.policies.replace(
                "forbid (principal, action == Action::\"invoice.hold\", resource is Invoice)",
                "forbid (principal, action == Action::\"invoice.hold\", resource is Invoice)\nunless { true }",
            );
            assert_ne!(changed, s.policies);
            s.policies = changed;
        });
        let invoice = ResourceFact {
            kind: "invoice".into(),
            id: "INV-20260611".into(),
            tenant: "acme".into(),
            owner: None,
            attrs: serde_json::from_value(json!({"amount": 1500.0, "currency": "EUR"}))
                .expect("attrs"),
        };
        let mut over = hold("s1", 2000.0);
        over.inputs = Some(RecordedInputs {
            resources: vec![invoice],
            ..RecordedInputs::default()
        });
        // The disputed amount exceeds the recorded invoice's: the base denies.
        assert_eq!(
            outcome(&base, &over),
            Outcome::Deny("amount.exceeds_invoice".into())
        );
        // Without the facts it would only be gated: the recorded facts are what decide.
        assert_eq!(
            outcome(&base, &hold("s1", 2000.0)).name(),
            "require_approval"
        );
        let mut later_attempt = over.clone();
        later_attempt.inputs = Some(RecordedInputs {
            approved: true,
            ..RecordedInputs::default()
        });
        let report = replay(&base, &without, &[over, later_attempt]);
        assert_eq!(report.replayed, 1, "a step counts once");
        assert_eq!(
            report.transitions,
            BTreeMap::from([("deny->require_approval".into(), 1)])
        );
    }

    #[test]
    fn calls_without_recorded_inputs_are_counted_as_approximate() {
        let base = finance(|_| {});
        let mut old = hold("s1", 500.0);
        old.inputs = None;
        let report = replay(&base, &base, &[old, hold("s2", 500.0)]);
        assert_eq!((report.replayed, report.approximate), (2, 1));
    }
}
