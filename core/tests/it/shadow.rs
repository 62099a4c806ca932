//! Shadow rules (`@shadow`, issue 33): validated with the rest, never enforced; what each would
//! have decided is reported beside the decision in force.

use chrono::DateTime;
use countersign_core::RoleName;
use countersign_core::bundle::{Bundle, BundleSources};
use countersign_core::policy::{
    ApprovalState, Decision, DecisionReport, Principal, PrincipalKind, Request, ResourceFact,
    TaskOrigin,
};
use proptest::prelude::*;
use serde_json::json;

use crate::bundle::example_sources;

/// Three shadow rules on top of the finance policies: a lower hold cap, a gate on every
/// `invoice.get`, and a forbid of everything.
const SHADOWS: &str = r#"
@id("shadow.hold.cap")
@shadow
@rule("hold.cap")
forbid (principal, action == Action::"invoice.hold", resource)
when { context.args.amount_minor > 300000 };

@id("shadow.read.gate")
@shadow("true")
@decision("require_approval")
@rule("read.gate")
permit (principal, action == Action::"invoice.get", resource);

@shadow
@id("shadow.everything")
@rule("everything.stops")
forbid (principal, action, resource);
"#;

/// The finance example's own shadow rule.
const WATCH: &str = "@id(\"finance.hold.cap_watch\")\n@shadow\n@rule(\"hold.cap\")\nforbid (principal, action == Action::\"invoice.hold\", resource)\nwhen { context.args.amount_minor > 500000 };";

/// The finance example without any shadow rule, plus `extra`.
fn finance(extra: &str) -> Bundle {
    let mut sources: BundleSources = example_sources("finance");
    let without = sources.policies.replace(WATCH, "");
    assert_ne!(
        without, sources.policies,
        "the example's shadow rule is as written here"
    );
    sources.policies = without;
    sources.policies.push_str(extra);
    match Bundle::load(sources) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    }
}

fn decide(
    bundle: &Bundle,
    tool: &str,
    args: serde_json::Value,
    origin: TaskOrigin,
) -> DecisionReport {
    decide_with(bundle, tool, args, origin, Vec::new(), ApprovalState::None)
}

fn decide_with(
    bundle: &Bundle,
    tool: &str,
    args: serde_json::Value,
    origin: TaskOrigin,
    resources: Vec<ResourceFact>,
    approval: ApprovalState,
) -> DecisionReport {
    let role = RoleName::parse("worker.finance").unwrap();
    let facts = bundle.tool_facts(&role, tool).unwrap();
    bundle.policy.decide(&Request {
        principal: Principal {
            kind: PrincipalKind::Agent,
            id: "agent-1".into(),
            role: "worker.finance".into(),
            tenant: "acme".into(),
            acts_for: None,
        },
        tool: facts,
        schema_errors: Vec::new(),
        arguments: args,
        resources,
        task_origin: origin,
        approval,
        now: DateTime::from_timestamp(1_781_170_937, 0).unwrap(),
        authorizations: Vec::new(),
    })
}

fn hold(amount: f64) -> serde_json::Value {
    json!({"invoice_id": "INV-20260611", "amount": amount, "currency": "EUR",
           "reason": "Disputed quantity on line 2 of the PO"})
}

#[test]
fn shadow_rules_report_what_they_would_decide_and_change_nothing() {
    let plain = finance("");
    let shadowed = finance(SHADOWS);
    assert_eq!(
        shadowed.policy.shadow_rules(),
        [
            (
                "shadow.everything".to_string(),
                "everything.stops".to_string()
            ),
            ("shadow.hold.cap".into(), "hold.cap".into()),
            ("shadow.read.gate".into(), "read.gate".into()),
        ]
    );
    // A gated hold above the shadow cap: the cap and the forbid-all would deny it.
    let report = decide(&shadowed, "invoice.hold", hold(4000.0), TaskOrigin::User);
    assert_eq!(
        report.decision,
        decide(&plain, "invoice.hold", hold(4000.0), TaskOrigin::User).decision
    );
    assert_eq!(report.decision.kind(), "require_approval");
    let hits: Vec<(&str, &str)> = report
        .shadow
        .iter()
        .map(|h| (h.id.as_str(), h.would.kind()))
        .collect();
    assert_eq!(
        hits,
        [("shadow.everything", "deny"), ("shadow.hold.cap", "deny")]
    );
    // A read would be gated by one and denied by the other; it runs.
    let report = decide(
        &shadowed,
        "invoice.get",
        json!({"invoice_id": "INV-20260611"}),
        TaskOrigin::User,
    );
    assert_eq!(report.decision, Decision::Allow);
    let hits: Vec<(&str, &str)> = report
        .shadow
        .iter()
        .map(|h| (h.id.as_str(), h.would.kind()))
        .collect();
    assert_eq!(
        hits,
        [
            ("shadow.everything", "deny"),
            ("shadow.read.gate", "require_approval")
        ]
    );
    // A gate's policies: enforced require-approval policies of exactly that tool.
    assert_eq!(
        shadowed
            .policy
            .gate_policies("invoice.hold", "amount.threshold"),
        Some(vec!["finance.hold.above_threshold".to_string()])
    );
    // Not another tool's; never a shadow rule; never a forbid.
    assert_eq!(
        shadowed
            .policy
            .gate_policies("payment.schedule", "amount.threshold"),
        None
    );
    assert_eq!(
        shadowed.policy.gate_policies("invoice.hold", "hold.cap"),
        None
    );
    assert_eq!(
        shadowed
            .policy
            .gate_policies("invoice.hold", "amount.exceeds_invoice"),
        None
    );
}

#[test]
fn a_shadow_annotation_is_refused_where_it_means_nothing() {
    for (text, needle) in [
        (
            "@id(\"shadow.permit\")\n@shadow\npermit (principal, action, resource);",
            "@shadow is for forbid and require_approval policies",
        ),
        (
            "@id(\"shadow.maybe\")\n@shadow(\"maybe\")\n@rule(\"a.b\")\nforbid (principal, action, resource);",
            "@shadow takes no value",
        ),
    ] {
        let mut sources = example_sources("finance");
        sources.policies.push_str(text);
        let err = Bundle::load(sources).expect_err(text).to_string();
        assert!(err.contains(needle), "{err}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever the call, the decision with shadow rules present is the decision without
    /// them: shadow rules only ever add to `shadow`.
    #[test]
    fn enforced_outcomes_never_change_with_shadow_rules_present(
        tool in prop::sample::select(vec!["invoice.hold", "invoice.get", "payment.schedule", "note.draft"]),
        amount in 1u32..6_000_000,
        origin in prop::sample::select(TaskOrigin::ALL.to_vec()),
        invoices in prop::collection::vec((1u32..6_000_000, any::<bool>()), 0..3),
        approved in any::<bool>(),
    ) {
        // Zero to two invoices the call points at (one Cedar evaluation each), approved or not.
        let resources: Vec<ResourceFact> = invoices
            .iter()
            .enumerate()
            .map(|(i, (minor, ok))| ResourceFact {
                kind: "invoice".into(),
                id: format!("INV-2026061{i}"),
                tenant: "acme".into(),
                owner: None,
                attrs: serde_json::from_value(json!({
                    "amount": f64::from(*minor) / 100.0, "currency": "EUR",
                    "status": if *ok { "approved" } else { "received" }
                }))
                .unwrap(),
            })
            .collect();
        let approval = if approved { ApprovalState::Approved } else { ApprovalState::None };
        let (plain, shadowed) = bundles();
        let amount = f64::from(amount) / 100.0;
        let args = match tool {
            "invoice.hold" => hold(amount),
            "invoice.get" => json!({"invoice_id": "INV-20260611"}),
            "payment.schedule" => json!({"invoice_id": "INV-20260611", "amount": amount,
                "currency": "EUR", "value_date": "2026-06-15",
                "reason": "Invoice approved by AP, due in four days"}),
            _ => json!({"invoice_id": "INV-20260611", "text": "Quantity differs on line 2"}),
        };
        let a = decide_with(plain, tool, args.clone(), origin, resources.clone(), approval);
        let b = decide_with(shadowed, tool, args, origin, resources, approval);
        prop_assert_eq!(&a.decision, &b.decision);
        prop_assert_eq!(&a.policy_ids, &b.policy_ids);
        prop_assert_eq!(&a.errors, &b.errors);
        // A shadow rule is reported only where it is stricter than the decision in force.
        for hit in &b.shadow {
            prop_assert!(hit.would.kind() != a.decision.kind(), "{:?} vs {:?}", hit, a.decision);
        }
        prop_assert!(a.shadow.is_empty());
        // The forbid-all shadow is a hit exactly when the call is not denied already.
        let everything = b.shadow.iter().any(|h| h.id == "shadow.everything");
        prop_assert_eq!(everything, a.decision.kind() != "deny");
    }
}

fn bundles() -> &'static (Bundle, Bundle) {
    static BUNDLES: std::sync::OnceLock<(Bundle, Bundle)> = std::sync::OnceLock::new();
    BUNDLES.get_or_init(|| (finance(""), finance(SHADOWS)))
}
