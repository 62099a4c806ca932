//! The policy engine itself: loading, the annotation convention, floors and properties.
//! The decision tables are in `policy_tables`.

use countersign_core::policy::{
    Decision, PolicyEngine, PolicyLoadError, Rule, StandingAuthorization,
};
use countersign_core::{Effect, Gate};
use proptest::prelude::*;
use serde_json::json;

use crate::policy_tables::{Example, Row, bundle, now, rows};

fn engine(example: Example) -> &'static PolicyEngine {
    &bundle(example).policy
}

const SCHEMA: &str = r#"
entity Role;
entity Agent in [Role] { role: String, tenant: String, acts_for: String };
entity Human in [Role] { role: String, tenant: String, acts_for: String };
entity Tool { tenant: String };
type Call = { tenant: String, task_origin: String, approval: String, now: Long };
action "x.do" appliesTo {
  principal: [Agent, Human], resource: [Tool],
  context: { args: { n: Long }, call: Call }
};
"#;

fn load(policies: &str) -> Result<PolicyEngine, PolicyLoadError> {
    PolicyEngine::load(policies, SCHEMA)
}

fn row_named(name: &str) -> Row {
    rows().into_iter().find(|r| r.name == name).unwrap()
}

#[test]
fn the_engine_can_be_shared_across_threads() {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<PolicyEngine>();
}

#[test]
fn the_examples_load() {
    let finance = engine(Example::Finance);
    assert!(
        finance
            .policy_ids()
            .contains(&"finance.payment.ceiling.worker_finance".to_owned())
    );
    let stillon = engine(Example::StillOn);
    assert!(
        stillon
            .policy_ids()
            .contains(&"stillon.owner_only".to_owned())
    );
}

#[test]
fn syntax_errors_are_refused_with_the_message() {
    let err = load(r#"@id("a") permit (principal, action, resource"#).unwrap_err();
    assert!(matches!(err, PolicyLoadError::Syntax(_)), "{err}");
}

#[test]
fn schema_errors_are_refused() {
    let err = PolicyEngine::load("", "entity A { x: Nope };").unwrap_err();
    assert!(matches!(err, PolicyLoadError::Schema(_)), "{err}");
}

#[test]
fn policies_that_do_not_validate_are_refused() {
    // A typo in an attribute name is caught at load, not at 3 a.m.
    let err = load(
        r#"@id("a") permit (principal, action == Action::"x.do", resource) when { context.args.m > 1 };"#,
    )
    .unwrap_err();
    let PolicyLoadError::Validation(message) = &err else {
        panic!("expected a validation error, got {err}");
    };
    assert!(message.contains('m'), "{message}");
    // An action the schema does not know.
    assert!(matches!(
        load(r#"@id("a") permit (principal, action == Action::"x.undo", resource);"#),
        Err(PolicyLoadError::Validation(_))
    ));
    // Comparing a string with a number.
    assert!(matches!(
        load(
            r#"@id("a") permit (principal, action == Action::"x.do", resource) when { principal.tenant > 1 };"#
        ),
        Err(PolicyLoadError::Validation(_))
    ));
}

#[test]
fn the_annotation_convention_is_enforced() {
    let cases = [
        (r#"permit (principal, action, resource);"#, "missing @id"),
        (
            r#"@id("") permit (principal, action, resource);"#,
            "missing @id",
        ),
        (
            r#"@id("f") forbid (principal, action, resource);"#,
            "must name a @rule",
        ),
        (
            r#"@id("f") @rule("a.b") @decision("require_approval") forbid (principal, action, resource);"#,
            "@decision is for permit",
        ),
        (
            r#"@id("p") @decision("require_approval") permit (principal, action, resource);"#,
            "needs a @rule",
        ),
        (
            r#"@id("p") @decision("maybe") @rule("a.b") permit (principal, action, resource);"#,
            "@decision must be",
        ),
        (
            r#"@id("p") @rule("Amount") permit (principal, action, resource);"#,
            "@rule must look like",
        ),
        (
            r#"@id("p") permit (principal, action, resource); @id("p") permit (principal, action, resource);"#,
            "duplicate @id",
        ),
    ];
    for (text, expected) in cases {
        match load(text) {
            Err(PolicyLoadError::Annotation { message, .. }) => {
                assert!(message.contains(expected), "{text}: {message}");
            }
            other => panic!("{text}: expected an annotation error, got {other:?}"),
        }
    }
    assert_eq!(
        load(r#"@id("t") permit (principal == ?principal, action, resource);"#).unwrap_err(),
        PolicyLoadError::Template
    );
}

#[test]
fn floors_rule_before_cedar_in_order() {
    let finance = engine(Example::Finance);
    let mut row = row_named("payment within limits still needs a person");
    // All three pre-Cedar floors at once: listing wins, then schema, then tenant.
    row.role = "planner";
    row.resources[0].tenant = "globex".into();
    let with_schema_errors = |row: &Row| {
        let mut request = row.request();
        request.schema_errors = vec!["bad".into()];
        request
    };
    assert_eq!(
        finance.decide(&with_schema_errors(&row)).decision,
        Decision::Deny(Rule::TOOL_NOT_LISTED)
    );
    row.role = "worker.finance";
    let report = finance.decide(&with_schema_errors(&row));
    assert_eq!(report.decision, Decision::Deny(Rule::INPUT_SCHEMA));
    assert_eq!(report.errors, ["bad"]);
    assert_eq!(
        finance.decide(&row.request()).decision,
        Decision::Deny(Rule::TENANT_MISMATCH)
    );
}

#[test]
fn reports_name_the_determining_policies() {
    let finance = engine(Example::Finance);
    let report = finance.decide(&row_named("payment one cent over the ceiling").request());
    assert_eq!(
        report.decision,
        Decision::Deny(Rule::parse("amount.ceiling").unwrap())
    );
    assert_eq!(
        report.policy_ids,
        ["finance.payment.ceiling.worker_finance"]
    );
    assert!(report.errors.is_empty());

    let report = finance.decide(&row_named("hold one cent over").request());
    assert_eq!(
        report.policy_ids,
        ["base.listed", "finance.hold.above_threshold"]
    );

    // The irreversible floor names itself; the permit that matched is still reported.
    let report = finance.decide(&row_named("payment within limits still needs a person").request());
    assert_eq!(
        report.decision,
        Decision::RequireApproval(Rule::IRREVERSIBLE_ALWAYS)
    );
    assert_eq!(report.policy_ids, ["base.listed"]);

    let report = finance
        .decide(&row_named("payment without an amount errors closed in the engine").request());
    assert_eq!(report.decision, Decision::Deny(Rule::POLICY_ERROR));
    assert!(!report.errors.is_empty());
}

#[test]
fn an_evaluation_error_in_any_policy_denies() {
    // `b` would allow, but `e` raises an error (an attribute the request lacks): deny.
    let engine = load(
        r#"
        @id("b") permit (principal, action == Action::"x.do", resource);
        @id("e") @decision("require_approval") @rule("n.big")
        permit (principal, action == Action::"x.do", resource) when { context.args.n > 10 };
        "#,
    )
    .unwrap();
    let mut row = row_named("planner searches invoices");
    let request = |args: serde_json::Value, row: &mut Row| {
        let mut r = row.request();
        r.tool.name = "x.do".into();
        r.arguments = args;
        r
    };
    let ok = engine.decide(&request(json!({"n": 3}), &mut row));
    assert_eq!(ok.decision, Decision::Allow);
    let big = engine.decide(&request(json!({"n": 11}), &mut row));
    assert_eq!(
        big.decision,
        Decision::RequireApproval(Rule::parse("n.big").unwrap())
    );
    let missing = engine.decide(&request(json!({}), &mut row));
    assert_eq!(missing.decision, Decision::Deny(Rule::POLICY_ERROR));
    assert!(!missing.errors.is_empty());
    let not_object = engine.decide(&request(json!([1]), &mut row));
    assert_eq!(not_object.decision, Decision::Deny(Rule::POLICY_ERROR));
}

/// Cedar is given only the policies whose action scope may match the call: a policy scoped
/// to another action neither decides nor errs (it would not have in the whole set: Cedar
/// reads the scope first), one scoped to this action or to a group holding it still does.
#[test]
fn policies_scoped_to_other_actions_change_nothing_and_this_actions_still_decide() {
    // The engine's test schema with a second action beside `x.do`.
    let two = SCHEMA.replace(r#"action "x.do""#, r#"action "x.do", "x.undo""#);
    assert_ne!(two, SCHEMA);
    let engine = PolicyEngine::load(
        r#"
        @id("all") permit (principal, action in [Action::"x.do", Action::"x.undo"], resource);
        @id("undo.big") @decision("require_approval") @rule("undo.big")
        permit (principal, action == Action::"x.undo", resource) when { context.args.n > 10 };
        @id("undo.never") @rule("undo.never")
        forbid (principal, action in [Action::"x.undo"], resource) when { context.args.n == 7 };
        "#,
        &two,
    )
    .unwrap();
    let mut row = row_named("planner searches invoices");
    let call = |tool: &str, args: serde_json::Value, row: &mut Row| {
        let mut r = row.request();
        r.tool.name = tool.into();
        r.arguments = args;
        engine.decide(&r)
    };
    // `undo.big` would err on arguments without `n`, and `undo.never` forbid n = 7: neither
    // reaches a call of `x.do`.
    let done = call("x.do", json!({}), &mut row);
    assert_eq!(done.decision, Decision::Allow, "{done:?}");
    assert!(done.errors.is_empty());
    assert_eq!(done.policy_ids, ["all"]);
    assert_eq!(
        call("x.do", json!({"n": 7}), &mut row).decision,
        Decision::Allow
    );
    // On `x.undo` both decide, and the error denies.
    let missing = call("x.undo", json!({}), &mut row);
    assert_eq!(missing.decision, Decision::Deny(Rule::POLICY_ERROR));
    assert!(!missing.errors.is_empty());
    assert_eq!(
        call("x.undo", json!({"n": 11}), &mut row).decision,
        Decision::RequireApproval(Rule::parse("undo.big").unwrap())
    );
    assert_eq!(
        call("x.undo", json!({"n": 7}), &mut row).decision,
        Decision::Deny(Rule::parse("undo.never").unwrap())
    );
}

#[test]
fn floors_after_cedar_only_raise() {
    let engine =
        load(r#"@id("b") permit (principal, action == Action::"x.do", resource);"#).unwrap();
    let mut request = row_named("planner searches invoices").request();
    request.tool.name = "x.do".into();
    request.arguments = json!({"n": 1});
    let cases = [
        (Effect::Read, Gate::Never, Decision::Allow),
        (Effect::Write, Gate::Policy, Decision::Allow),
        (
            Effect::Write,
            Gate::Always,
            Decision::RequireApproval(Rule::GATE_ALWAYS),
        ),
        (
            Effect::Irreversible,
            Gate::Never,
            Decision::RequireApproval(Rule::IRREVERSIBLE_ALWAYS),
        ),
        (
            Effect::Irreversible,
            Gate::Always,
            Decision::RequireApproval(Rule::IRREVERSIBLE_ALWAYS),
        ),
    ];
    for (effect, gate, expected) in cases {
        request.tool.effect = effect;
        request.tool.gate = gate;
        assert_eq!(
            engine.decide(&request).decision,
            expected,
            "{effect:?} {gate:?}"
        );
    }
    // No permit stays a deny whatever the floors say.
    let none = load(r#"@id("f") @rule("x.never") forbid (principal, action, resource);"#).unwrap();
    assert_eq!(
        none.decide(&request).decision,
        Decision::Deny(Rule::parse("x.never").unwrap())
    );
}

#[test]
fn a_grant_lifts_no_permit_but_nothing_else() {
    let engine = load(
        r#"@id("f") @rule("n.too_big") forbid (principal, action == Action::"x.do", resource) when { context.args.n > 100 };"#,
    )
    .unwrap();
    let mut request = row_named("planner searches invoices").request();
    request.tool.name = "x.do".into();
    request.tool.effect = Effect::Write;
    request.arguments = json!({"n": 1});
    assert_eq!(
        engine.decide(&request).decision,
        Decision::Deny(Rule::NO_PERMIT)
    );
    request.authorizations = vec![StandingAuthorization {
        id: "g".into(),
        principal: request.principal.party().to_owned(),
        tool: "x.do".into(),
        conditions: vec![],
        expires_at: now() + chrono::Duration::minutes(1),
    }];
    assert_eq!(
        engine.decide(&request).decision,
        Decision::AllowWithinAuthorization("g".into())
    );
    request.arguments = json!({"n": 101});
    assert_eq!(
        engine.decide(&request).decision,
        Decision::Deny(Rule::parse("n.too_big").unwrap())
    );
}

#[test]
fn decisions_are_deterministic_and_serialisable() {
    for row in rows() {
        let engine = &row.bundle().policy;
        let request = row.request();
        let a = engine.decide(&request);
        let b = engine.decide(&request);
        assert_eq!(a, b, "{}", row.name);
        let text = serde_json::to_string(&a).unwrap();
        let back: countersign_core::DecisionReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back, a);
    }
    let within = serde_json::to_value(Decision::AllowWithinAuthorization("sa-1".into())).unwrap();
    assert_eq!(
        within,
        json!({"decision": "allow_within_authorization", "reason": "sa-1"})
    );
    let deny = serde_json::to_value(Decision::Deny(Rule::TENANT_MISMATCH)).unwrap();
    assert_eq!(
        deny,
        json!({"decision": "deny", "reason": "tenant.mismatch"})
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the amount, an irreversible payment never runs unattended.
    #[test]
    fn payments_never_run_unattended(cents in 1u64..5_000_000, external in any::<bool>()) {
        let finance = engine(Example::Finance);
        let mut request = row_named("payment exactly at the ceiling").request();
        let amount: serde_json::Value =
            serde_json::from_str(&format!("{}.{:02}", cents / 100, cents % 100)).unwrap();
        request.arguments["amount"] = amount;
        if external {
            request.task_origin = countersign_core::policy::TaskOrigin::External;
        }
        let decision = finance.decide(&request).decision;
        prop_assert!(!decision.runs_unattended(), "{}", decision);
        let over = cents > 2_500_000;
        match (&decision, over, external) {
            (Decision::Deny(rule), _, true) => prop_assert_eq!(rule.as_str(), "origin.external"),
            (Decision::Deny(rule), true, false) => prop_assert_eq!(rule.as_str(), "amount.ceiling"),
            (Decision::RequireApproval(rule), false, false) => {
                prop_assert_eq!(rule, &Rule::IRREVERSIBLE_ALWAYS)
            }
            _ => prop_assert!(false, "unexpected {} for {} cents", decision, cents),
        }
    }

    /// The hold threshold sits exactly at 1,000.00 EUR, cent for cent.
    #[test]
    fn hold_threshold_is_exact(cents in 1u64..3_000_000) {
        let finance = engine(Example::Finance);
        let mut request = row_named("hold below threshold").request();
        request.arguments["amount"] =
            serde_json::from_str(&format!("{}.{:02}", cents / 100, cents % 100)).unwrap();
        let decision = finance.decide(&request).decision;
        if cents <= 100_000 {
            prop_assert_eq!(decision, Decision::Allow);
        } else {
            prop_assert_eq!(decision, Decision::RequireApproval(Rule::parse("amount.threshold").unwrap()));
        }
    }
}
