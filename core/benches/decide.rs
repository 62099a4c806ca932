//! What Countersign's decision costs over bare Cedar: schema validation + canonicalise +
//! `PolicyEngine::decide` on a
//! finance `payment.schedule` request, against `cedar_policy::Authorizer::is_authorized` on
//! all the bundle's policies with the request, entities and context already built. The engine
//! is the finance example bundle's (registry + policies + entity schema); it puts to Cedar only
//! the policies that can apply to the call's action, so a second reading compares it with bare
//! Cedar on that share alone (printed, not the figure).
//!
//! Run with `cargo bench -p countersign-core --bench decide`; prints both medians and the ratio.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::str::FromStr;
use std::time::{Duration, Instant};

use chrono::DateTime;
use countersign_core::ToolName;
use countersign_core::bundle::{Bundle, BundleSources};
use countersign_core::canonical::canonicalize;
use countersign_core::policy::{
    ApprovalState, Principal, PrincipalKind, Request, ResourceFact, TaskOrigin, ToolFacts,
};
use countersign_core::{Effect, Gate};
use criterion::{Criterion, criterion_group};
use serde_json::{Value, json};

const POLICY: &str = include_str!("../../examples/finance/policy.cedar");

fn finance() -> Bundle {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/finance");
    Bundle::load(BundleSources::read(&dir).unwrap()).unwrap()
}

fn arguments() -> Value {
    json!({
        "invoice_id": "INV-20260611",
        "amount": 4180.00,
        "currency": "EUR",
        "value_date": "2026-06-15",
        "reason": "Invoice approved by AP, due in four days"
    })
}

fn ours() -> (Bundle, Request) {
    let engine = finance();
    let attrs = json!({"status": "approved", "amount": 30000, "currency": "EUR", "supplier_id": "SUP-0042"});
    let request = Request {
        principal: Principal {
            kind: PrincipalKind::Agent,
            id: "agent-fin-1".into(),
            role: "worker.finance".into(),
            tenant: "acme".into(),
            acts_for: Some("user-123".into()),
        },
        tool: ToolFacts {
            name: "payment.schedule".into(),
            effect: Effect::Irreversible,
            gate: Gate::Always,
            listed_for_role: true,
        },
        schema_errors: vec![],
        arguments: arguments(),
        resources: vec![ResourceFact {
            kind: "invoice".into(),
            id: "INV-20260611".into(),
            tenant: "acme".into(),
            owner: None,
            attrs: attrs.as_object().unwrap().clone(),
        }],
        task_origin: TaskOrigin::User,
        approval: ApprovalState::None,
        now: DateTime::from_timestamp(1_781_170_937, 0).unwrap(),
        authorizations: vec![],
    };
    (engine, request)
}

struct Bare {
    authorizer: cedar_policy::Authorizer,
    policies: cedar_policy::PolicySet,
    request: cedar_policy::Request,
    entities: cedar_policy::Entities,
}

fn bare() -> Bare {
    // The same policies, re-identified by @id as the engine does (ids do not affect timing).
    bare_with(cedar_policy::PolicySet::from_str(POLICY).unwrap())
}

/// Bare Cedar on the policies that can apply to `payment.schedule` only (the share the
/// engine puts to Cedar: every policy not scoped `action == Action::"<another tool>"`), for
/// the figure's second reading.
fn bare_sliced() -> Bare {
    let action = cedar_policy::EntityUid::from_str(r#"Action::"payment.schedule""#).unwrap();
    let mut share = cedar_policy::PolicySet::new();
    for p in cedar_policy::PolicySet::from_str(POLICY)
        .unwrap()
        .policies()
    {
        let applies = match p.action_constraint() {
            cedar_policy::ActionConstraint::Eq(only) => only == action,
            cedar_policy::ActionConstraint::Any | cedar_policy::ActionConstraint::In(_) => true,
        };
        if applies {
            share.add(p.clone()).unwrap();
        }
    }
    bare_with(share)
}

fn bare_with(policies: cedar_policy::PolicySet) -> Bare {
    let entities = cedar_policy::Entities::from_json_value(
        json!([
            {"uid": {"type": "Agent", "id": "agent-fin-1"},
             "attrs": {"role": "worker.finance", "tenant": "acme", "acts_for": "user-123"},
             "parents": [{"type": "Role", "id": "worker.finance"}]},
            {"uid": {"type": "Invoice", "id": "INV-20260611"},
             "attrs": {"tenant": "acme", "status": "approved", "amount_minor": 3_000_000,
                       "currency": "EUR", "supplier_id": "SUP-0042"},
             "parents": []}
        ]),
        None,
    )
    .unwrap();
    let context = cedar_policy::Context::from_json_value(
        json!({
            "args": {"invoice_id": "INV-20260611", "amount_minor": 418_000, "currency": "EUR",
                     "value_date": "2026-06-15",
                     "reason": "Invoice approved by AP, due in four days"},
            "call": {"tenant": "acme", "task_origin": "user", "approval": "none",
                     "now": 1_781_170_937_i64}
        }),
        None,
    )
    .unwrap();
    let request = cedar_policy::Request::new(
        cedar_policy::EntityUid::from_str(r#"Agent::"agent-fin-1""#).unwrap(),
        cedar_policy::EntityUid::from_str(r#"Action::"payment.schedule""#).unwrap(),
        cedar_policy::EntityUid::from_str(r#"Invoice::"INV-20260611""#).unwrap(),
        context,
        None,
    )
    .unwrap();
    Bare {
        authorizer: cedar_policy::Authorizer::new(),
        policies,
        request,
        entities,
    }
}

fn ours_once(bundle: &Bundle, tool: &ToolName, request: &Request) {
    bundle
        .registry
        .validate(tool, black_box(&request.arguments))
        .unwrap();
    let canonical = canonicalize(black_box(&request.arguments)).unwrap();
    black_box(canonical);
    black_box(bundle.policy.decide(black_box(request)));
}

fn bare_once(b: &Bare) {
    black_box(
        b.authorizer
            .is_authorized(black_box(&b.request), &b.policies, &b.entities),
    );
}

fn decide(c: &mut Criterion) {
    let (engine, request) = ours();
    let tool = ToolName::parse("payment.schedule").unwrap();
    let b = bare();
    let mut group = c.benchmark_group("payment.schedule");
    group.bench_function("countersign validate+canonicalise+decide", |bench| {
        bench.iter(|| ours_once(&engine, &tool, &request));
    });
    group.bench_function("bare cedar is_authorized", |bench| {
        bench.iter(|| bare_once(&b));
    });
    group.finish();
}

criterion_group!(benches, decide);

/// Time per call of one batch of `batch` calls.
fn per_call(batch: u32, f: &mut impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..batch {
        f();
    }
    start.elapsed() / batch
}

/// Over `samples` alternating batches of `a` and `b` (A B A B …): the medians of each
/// side's time per call and of the per-pair ratios.
fn paired_medians(
    samples: usize,
    batch: u32,
    mut a: impl FnMut(),
    mut b: impl FnMut(),
) -> (Duration, Duration, f64) {
    let (mut ta, mut tb, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..samples {
        let x = per_call(batch, &mut a);
        let y = per_call(batch, &mut b);
        ratios.push(x.as_secs_f64() / y.as_secs_f64());
        ta.push(x);
        tb.push(y);
    }
    ta.sort();
    tb.sort();
    ratios.sort_by(f64::total_cmp);
    (ta[samples / 2], tb[samples / 2], ratios[samples / 2])
}

/// Appends issue 34's `decide_over_bare_cedar` figure to the file `BENCH_FIGURES` names
/// (one JSON object per line; see the server's benches/common/figures.rs).
fn record(ours: Duration, bare: Duration, ratio: f64) {
    use std::io::Write;
    let Ok(path) = std::env::var("BENCH_FIGURES") else {
        return;
    };
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| "unknown".into());
    let line = serde_json::json!({
        "figure": "decide_over_bare_cedar",
        "value": (ratio * 1000.0).round() / 1000.0,
        "target": "≤ 2",
        "met": ratio <= 2.0,
        "numerator": {"what": "payment.schedule: validate + canonicalise + decide",
                      "value": ours.as_secs_f64() * 1e6, "unit": "µs per call"},
        "denominator": {"what": "bare Cedar is_authorized, all the bundle's policies (the engine evaluates the action's share)",
                        "value": bare.as_secs_f64() * 1e6, "unit": "µs per call"},
        "date": env("BENCH_DATE"),
        "commit": env("BENCH_COMMIT"),
    });
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("BENCH_FIGURES is writable");
    writeln!(f, "{line}").expect("BENCH_FIGURES is writable");
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();

    let (engine, request) = ours();
    let tool = ToolName::parse("payment.schedule").unwrap();
    let b = bare();
    let (ours_median, bare_median, ratio) = paired_medians(
        51,
        500,
        || ours_once(&engine, &tool, &request),
        || bare_once(&b),
    );
    println!(
        "payment.schedule decide: ours (validate + canonicalise + decide) median {ours_median:?}, \
         bare Cedar is_authorized median {bare_median:?}, ratio {ratio:.2}x \
         (median of 51 alternating pairs; target ≤ 2.0x: {})",
        if ratio <= 2.0 { "met" } else { "missed" }
    );
    record(ours_median, bare_median, ratio);

    // The engine puts to Cedar only the policies that can apply to the call's action; the
    // figure's bare side evaluates them all. The same comparison against bare Cedar on that
    // share alone says how much of the gap is the engine's own work.
    let sliced = bare_sliced();
    let (ours_median, sliced_median, ratio) = paired_medians(
        51,
        500,
        || ours_once(&engine, &tool, &request),
        || bare_once(&sliced),
    );
    println!(
        "payment.schedule decide: ours median {ours_median:?}, bare Cedar on the {} policies \
         that can apply (of {}) median {sliced_median:?}, ratio {ratio:.2}x (not the figure)",
        sliced.policies.policies().count(),
        b.policies.policies().count(),
    );
}
