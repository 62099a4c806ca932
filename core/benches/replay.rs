//! Impact preview throughput (issue 33): replaying recorded calls through the finance bundle
//! and a proposal (the invoice-hold threshold raised), against bare policy decisions — the
//! engine's `decide` on one prepared request, and bare Cedar `is_authorized` on the same
//! policies — in the same run. A replay decides each call twice (base and proposal) and checks
//! its listing and schema on both sides, so about a third of the bare decision rate is its
//! ceiling.
//!
//! Run with `cargo bench -p countersign-core --bench replay` (`BENCH_CALLS`, default 100,000);
//! prints a Markdown table with calls or decisions per second and the ratios.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::str::FromStr;
use std::time::Instant;

use chrono::DateTime;
use countersign_core::RoleName;
use countersign_core::bundle::{Bundle, BundleSources};
use countersign_core::policy::{
    ApprovalState, Principal, PrincipalKind, Request, ResourceFact, TaskOrigin,
};
use countersign_core::preview::{RecordedCall, RecordedInputs, replay};
use serde_json::json;

fn sources() -> BundleSources {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/finance");
    BundleSources::read(&dir).unwrap()
}

fn invoice() -> ResourceFact {
    ResourceFact {
        kind: "invoice".into(),
        id: "INV-20260615".into(),
        tenant: "acme".into(),
        owner: None,
        attrs: json!({"amount": 12400.0, "currency": "EUR", "status": "approved"})
            .as_object()
            .unwrap()
            .clone(),
    }
}

/// `n` recorded invoice holds of amounts spread over 1 to 8,000 EUR, with their facts.
fn calls(n: usize) -> Vec<RecordedCall> {
    let start = DateTime::from_timestamp(1_781_170_937, 0).unwrap();
    (0..n)
        .map(|i| RecordedCall {
            record: Some(("acme".into(), i as i64 + 1)),
            step_id: format!("step-{i}"),
            run_id: Some(format!("run-{}", i / 4)),
            agent_id: "agent-fin-1".into(),
            role: "worker.finance".into(),
            tenant: "acme".into(),
            tool: "invoice.hold".into(),
            arguments: json!({"invoice_id": "INV-20260615", "amount": 1.0 + (i % 8000) as f64,
                              "currency": "EUR", "reason": "Disputed quantity on line 2 of the PO"}),
            task_origin: TaskOrigin::User,
            at: start + chrono::Duration::seconds(i as i64),
            inputs: Some(RecordedInputs {
                resources: vec![invoice()],
                ..RecordedInputs::default()
            }),
        })
        .collect()
}

fn per_second(n: usize, f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    n as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let n: usize = std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let base = Bundle::load(sources()).unwrap();
    let mut raised = sources();
    raised.policies = raised.policies.replace(
        "context.args.amount_minor > 100000",
        "context.args.amount_minor > 300000",
    );
    let proposed = Bundle::load(raised).unwrap();
    let recorded = calls(n);

    // Bare decisions first: the engine's, on one request like the replayed ones.
    let role = RoleName::parse("worker.finance").unwrap();
    let request = Request {
        principal: Principal {
            kind: PrincipalKind::Agent,
            id: "agent-fin-1".into(),
            role: "worker.finance".into(),
            tenant: "acme".into(),
            acts_for: None,
        },
        tool: base.tool_facts(&role, "invoice.hold").unwrap(),
        schema_errors: Vec::new(),
        arguments: recorded[2000].arguments.clone(),
        resources: vec![invoice()],
        task_origin: TaskOrigin::User,
        approval: ApprovalState::None,
        now: recorded[2000].at,
        authorizations: Vec::new(),
    };
    let engine = per_second(n, || {
        for _ in 0..n {
            black_box(base.policy.decide(black_box(&request)));
        }
    });
    // Bare Cedar on the same policies, request and entities built once.
    let policies = cedar_policy::PolicySet::from_str(&sources().policies).unwrap();
    let entities = cedar_policy::Entities::from_json_value(
        json!([
            {"uid": {"type": "Agent", "id": "agent-fin-1"},
             "attrs": {"role": "worker.finance", "tenant": "acme", "acts_for": "agent-fin-1"},
             "parents": [{"type": "Role", "id": "worker.finance"}]},
            {"uid": {"type": "Invoice", "id": "INV-20260615"},
             "attrs": {"tenant": "acme", "amount_minor": 1_240_000, "currency": "EUR",
                       "status": "approved"}, "parents": []}
        ]),
        None,
    )
    .unwrap();
    let context = cedar_policy::Context::from_json_value(
        json!({"args": {"invoice_id": "INV-20260615", "amount_minor": 200_100, "currency": "EUR",
                        "reason": "Disputed quantity on line 2 of the PO"},
               "call": {"tenant": "acme", "task_origin": "user", "approval": "none",
                        "now": 1_781_170_937_i64}}),
        None,
    )
    .unwrap();
    let cedar_request = cedar_policy::Request::new(
        cedar_policy::EntityUid::from_str(r#"Agent::"agent-fin-1""#).unwrap(),
        cedar_policy::EntityUid::from_str(r#"Action::"invoice.hold""#).unwrap(),
        cedar_policy::EntityUid::from_str(r#"Invoice::"INV-20260615""#).unwrap(),
        context,
        None,
    )
    .unwrap();
    let authorizer = cedar_policy::Authorizer::new();
    let cedar = per_second(n, || {
        for _ in 0..n {
            black_box(authorizer.is_authorized(&cedar_request, &policies, &entities));
        }
    });
    let mut changed = 0;
    let replayed = per_second(n, || {
        let report = replay(&base, &proposed, black_box(&recorded));
        changed = report.changed;
    });

    println!("### Impact preview (core)");
    println!();
    println!(
        "Replaying {n} recorded `invoice.hold` calls through the finance bundle and a proposal"
    );
    println!(
        "(hold threshold 1,000 → 3,000 EUR; {changed} change), each listed, validated and decided"
    );
    println!("on both sides, against bare decisions on one prepared request, in the same run.");
    println!();
    println!("| what | per second | replay ÷ it |");
    println!("|---|---:|---:|");
    println!("| replayed calls (2 decisions each) | {replayed:.0} | 1.00 |");
    println!(
        "| `PolicyEngine::decide` | {engine:.0} | {:.2} |",
        replayed / engine
    );
    println!(
        "| bare Cedar `is_authorized` | {cedar:.0} | {:.2} |",
        replayed / cedar
    );
    println!();
}
