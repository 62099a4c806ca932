//! Approvals bind exact inputs: any mutation of approved inputs is refused by the check the
//! executor runs ([`Store::valid_approval`]), reordering object members is not a mutation,
//! and an approval of one step never lets another through. On both backends.

use std::sync::Arc;

use countersign_core::approvals::{Approver, Decider, GateRules, Verdict};
use countersign_core::store::testing::FreshDb;
use countersign_core::store::{Backend, NewRun, NewStep, Step, Transition};
use countersign_core::{CanonicalJson, Clock, Effect, InputsHash, StepStatus, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};

use crate::test_clock;

fn pat() -> Decider {
    Decider {
        approver: Approver {
            iss: "https://idp.example".into(),
            sub: "pat".into(),
        },
        roles: vec!["approver".into()],
        auth_time: 0,
        auth_time_unknown: false,
    }
}

fn one_approver() -> GateRules {
    GateRules {
        approver_roles: vec!["approver".into()],
        four_eyes: false,
        approvals_needed: 1,
        step_up_max_age_ms: None,
        party_confirms: false,
        signature_required: false,
    }
}

/// A run, a step over `inputs` waiting for a person, its gate open for an hour.
async fn waiting_step(store: &Store, inputs: &CanonicalJson) -> Step {
    let run = store
        .create_run(&NewRun {
            tenant: "acme".into(),
            principal: "person:https://idp.example#ana".into(),
            agent_id: None,
            task: "pay an invoice".into(),
            origin: "user".into(),
            planned: false,
        })
        .await
        .unwrap();
    let (step, created) = store
        .open_step(&NewStep {
            run_id: run.id,
            role: "worker.finance".into(),
            tool: "payment.schedule".into(),
            effect: Effect::Write,
            inputs: inputs.clone(),
            agent_id: None,
            reason: String::new(),
            evidence: vec![],
            observed: None,
            trace_id: "t".into(),
            status: StepStatus::Pending,
        })
        .await
        .unwrap();
    assert!(created);
    store
        .transition(&Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending],
            to: Some(StepStatus::NeedsApproval),
            expires_at: Some(store.clock().now_ms() + 3_600_000),
            ..Transition::default()
        })
        .await
        .unwrap()
        .unwrap();
    store.get_step(&step.id).await.unwrap()
}

// ---- payment-like inputs ----------------------------------------------------------------

fn word() -> impl Strategy<Value = String> {
    "[A-Za-z0-9 .-]{1,12}"
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        word().prop_map(Value::from),
        (-1_000_000_000i64..1_000_000_000).prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        Just(Value::Null),
    ]
}

/// An invoice payment: ids, an integer amount in minor units, a nested recipient with an
/// address, invoice lines, and a few extra optional members.
fn payment() -> impl Strategy<Value = Value> {
    let line = (word(), 1i64..1_000, 0i64..10_000_000)
        .prop_map(|(sku, qty, minor)| json!({"sku": sku, "qty": qty, "amount_minor": minor}));
    (
        "INV-[0-9]{8}",
        0i64..100_000_000_000,
        prop_oneof![Just("EUR"), Just("USD"), Just("GBP"), Just("CHF")],
        (
            "[A-Z]{2}[0-9]{2}[0-9A-Z]{10,20}",
            word(),
            word(),
            "[A-Z]{2}",
        ),
        prop::collection::vec(line, 1..4),
        prop::collection::btree_map("x_[a-z]{1,6}", leaf(), 0..4),
    )
        .prop_map(
            |(invoice, amount, currency, (iban, name, city, country), lines, extra)| {
                let mut v = json!({
                    "invoice_id": invoice,
                    "amount_minor": amount,
                    "currency": currency,
                    "value_date": "2026-06-15",
                    "recipient": {
                        "name": name,
                        "iban": iban,
                        "address": {"city": city, "country": country},
                    },
                    "lines": lines,
                });
                if let Value::Object(m) = &mut v {
                    m.extend(extra);
                }
                v
            },
        )
}

#[derive(Debug, Clone)]
enum Mutation {
    /// A top-level member (by index) gets another value.
    ChangeField(usize),
    /// The minor-unit amount moves by one cent.
    Amount(i64),
    /// A member that was not there.
    AddField(String, Value),
    /// A top-level member (by index) is removed.
    RemoveField(usize),
    /// A value inside the recipient or a line changes.
    Nested(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::ChangeField),
        prop_oneof![Just(-1i64), Just(1i64)].prop_map(Mutation::Amount),
        ("[a-z_]{1,10}", leaf()).prop_map(|(k, v)| Mutation::AddField(k, v)),
        any::<usize>().prop_map(Mutation::RemoveField),
        any::<usize>().prop_map(Mutation::Nested),
    ]
}

/// Another value of the same kind, never equal to `v` (and never a spelling of it).
fn other(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::from(format!("{s}x")),
        Value::Number(n) => Value::from(n.as_i64().map_or(1, |i| i.wrapping_add(1))),
        Value::Bool(b) => Value::from(!b),
        Value::Null => Value::from(0),
        Value::Array(a) => {
            let mut a = a.clone();
            a.push(Value::Null);
            Value::Array(a)
        }
        Value::Object(m) => {
            let mut m = m.clone();
            m.insert("zz_added".into(), Value::Null);
            Value::Object(m)
        }
    }
}

fn apply(v: &Value, m: &Mutation) -> Value {
    let mut v = v.clone();
    let obj = v.as_object_mut().unwrap();
    let keys: Vec<String> = obj.keys().cloned().collect();
    match m {
        Mutation::ChangeField(i) => {
            let k = &keys[i % keys.len()];
            let changed = other(&obj[k]);
            obj.insert(k.clone(), changed);
        }
        Mutation::Amount(d) => {
            let a = obj["amount_minor"].as_i64().unwrap();
            obj.insert("amount_minor".into(), Value::from(a + d));
        }
        Mutation::AddField(k, value) => {
            let mut k = k.clone();
            while obj.contains_key(&k) {
                k.push('_');
            }
            obj.insert(k, value.clone());
        }
        Mutation::RemoveField(i) => {
            obj.remove(&keys[i % keys.len()]);
        }
        Mutation::Nested(i) => {
            let lines = obj["lines"].as_array().unwrap().len();
            let spots = 4 + 3 * lines;
            let spot = i % spots;
            let target = match spot {
                0 => &mut obj["recipient"]["name"],
                1 => &mut obj["recipient"]["iban"],
                2 => &mut obj["recipient"]["address"]["city"],
                3 => &mut obj["recipient"]["address"]["country"],
                n => {
                    let (line, field) = ((n - 4) / 3, (n - 4) % 3);
                    let name = ["sku", "qty", "amount_minor"][field];
                    &mut obj["lines"][line][name]
                }
            };
            *target = other(target);
        }
    }
    v
}

/// JSON text of `v` with every object's members in a shuffled order (the canonical form
/// sorts them again).
fn shuffled_text(v: &Value, seed: &mut u64) -> String {
    let mut next = || {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *seed >> 33
    };
    fn go(v: &Value, next: &mut dyn FnMut() -> u64) -> String {
        match v {
            Value::Object(m) => {
                let mut members: Vec<(&String, &Value)> = m.iter().collect();
                for i in (1..members.len()).rev() {
                    let j = usize::try_from(next()).unwrap() % (i + 1);
                    members.swap(i, j);
                }
                let parts: Vec<String> = members
                    .iter()
                    .map(|(k, v)| format!("{}:{}", serde_json::to_string(k).unwrap(), go(v, next)))
                    .collect();
                format!("{{{}}}", parts.join(","))
            }
            Value::Array(a) => {
                let parts: Vec<String> = a.iter().map(|x| go(x, next)).collect();
                format!("[{}]", parts.join(","))
            }
            leaf => serde_json::to_string(leaf).unwrap(),
        }
    }
    go(v, &mut next)
}

fn canonical(v: &Value) -> CanonicalJson {
    CanonicalJson::from_value(v).unwrap()
}

/// One case: approve `inputs`, then the mutated inputs are refused (at the call and in the
/// stored step) and the reordered spelling is accepted.
async fn one_case(
    store: &Store,
    inputs: &Value,
    m: &Mutation,
    mut seed: u64,
) -> Result<(), TestCaseError> {
    let approved = canonical(inputs);
    let step = waiting_step(store, &approved).await;
    store
        .decide_step(
            &step.id,
            &pat(),
            &one_approver(),
            Verdict::Approved,
            "checked",
        )
        .await
        .unwrap();
    let step = store.get_step(&step.id).await.unwrap();
    prop_assert_eq!(step.status, StepStatus::Pending);
    prop_assert!(
        store
            .valid_approval(&step, &approved, 1)
            .await
            .unwrap()
            .is_some()
    );

    // The same inputs spelled with members in another order: the same approval holds.
    let text = shuffled_text(inputs, &mut seed);
    let reordered = canonical(&serde_json::from_str(&text).unwrap());
    prop_assert_eq!(reordered.as_str(), approved.as_str());
    prop_assert!(
        store
            .valid_approval(&step, &reordered, 1)
            .await
            .unwrap()
            .is_some()
    );

    // Mutated inputs presented for execution: no approval binds them.
    let mutated = canonical(&apply(inputs, m));
    prop_assert_ne!(InputsHash::of(&mutated), InputsHash::of(&approved));
    prop_assert!(
        store
            .valid_approval(&step, &mutated, 1)
            .await
            .unwrap()
            .is_none(),
        "mutation {:?} accepted: {}",
        m,
        mutated.as_str()
    );
    // The stored step changed after the decision (its text alone, or text and hash): the
    // executor runs the stored inputs, and no approval binds them either.
    let text_only = Step {
        inputs: mutated.as_str().into(),
        ..step.clone()
    };
    prop_assert!(
        store
            .valid_approval(&text_only, &mutated, 1)
            .await
            .unwrap()
            .is_none()
    );
    prop_assert!(
        store
            .valid_approval(&text_only, &approved, 1)
            .await
            .unwrap()
            .is_none()
    );
    let rehashed = Step {
        inputs: mutated.as_str().into(),
        inputs_hash: InputsHash::of(&mutated).to_string(),
        ..step.clone()
    };
    prop_assert!(
        store
            .valid_approval(&rehashed, &mutated, 1)
            .await
            .unwrap()
            .is_none()
    );

    // The same change written to the database.
    store
        .execute_sql(&format!(
            "UPDATE steps SET inputs = '{}' WHERE id = '{}'",
            mutated.as_str().replace('\'', "''"),
            step.id
        ))
        .await
        .unwrap();
    let stored = store.get_step(&step.id).await.unwrap();
    let runs: CanonicalJson = CanonicalJson::from_canonical_text(&stored.inputs).unwrap();
    prop_assert!(
        store
            .valid_approval(&stored, &runs, 1)
            .await
            .unwrap()
            .is_none()
    );
    Ok(())
}

#[test]
fn any_mutation_of_approved_inputs_is_refused_and_reordering_is_not_a_mutation() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let (_, clock) = test_clock();
        let clock: Arc<dyn Clock> = clock;
        let Some(db) = rt.block_on(FreshDb::create(backend)) else {
            continue;
        };
        let store = rt.block_on(db.store(clock));
        let mut runner = TestRunner::new(Config {
            cases: if backend == Backend::Sqlite { 64 } else { 48 },
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(
            &(payment(), mutation(), any::<u64>()),
            |(inputs, m, seed)| rt.block_on(one_case(&store, &inputs, &m, seed)),
        );
        rt.block_on(store.close());
        rt.block_on(db.drop_db());
        if let Err(e) = result {
            panic!("{backend:?}: {e}");
        }
    }
}

#[test]
fn each_mutation_kind_changes_the_hash_of_a_fixed_payment() {
    // The generator's mutations, on one known payment: each one must change the canonical
    // text, and reordering must not (guards the property above against vacuous mutations).
    let inputs = json!({
        "invoice_id": "INV-00000042", "amount_minor": 418_025, "currency": "EUR",
        "value_date": "2026-06-15",
        "recipient": {"name": "Acme", "iban": "DE89370400440532013000",
                      "address": {"city": "Berlin", "country": "DE"}},
        "lines": [{"sku": "A-1", "qty": 2, "amount_minor": 209_012}],
    });
    let base = canonical(&inputs);
    let kinds = [
        Mutation::ChangeField(0),
        Mutation::Amount(1),
        Mutation::Amount(-1),
        Mutation::AddField("note".into(), Value::Null),
        Mutation::RemoveField(3),
        Mutation::Nested(2),
        Mutation::Nested(5),
    ];
    for m in &kinds {
        assert_ne!(
            canonical(&apply(&inputs, m)).as_str(),
            base.as_str(),
            "{m:?}"
        );
    }
    let moved = canonical(&apply(&inputs, &Mutation::Amount(1)));
    assert!(moved.as_str().contains("\"amount_minor\":418026"));
    let mut seed = 7;
    let text = shuffled_text(&inputs, &mut seed);
    assert_ne!(
        text,
        serde_json::to_string(&inputs).unwrap(),
        "not shuffled"
    );
    assert_eq!(
        canonical(&serde_json::from_str(&text).unwrap()).as_str(),
        base.as_str()
    );
}

#[tokio::test]
async fn an_approval_of_one_step_never_lets_another_step_through() {
    let (_, clock) = test_clock();
    countersign_core::store::testing::each_backend(clock, |store| async move {
        let inputs = canonical(&json!({"invoice_id": "INV-1", "amount_minor": 100}));
        // Two steps with identical inputs (so identical inputs hashes) in two runs.
        let a = waiting_step(&store, &inputs).await;
        let b = waiting_step(&store, &inputs).await;
        assert_eq!(a.inputs_hash, b.inputs_hash);
        let (approval, token) = store
            .decide_step(&a.id, &pat(), &one_approver(), Verdict::Approved, "fine")
            .await
            .unwrap();
        assert!(token.is_some());
        assert_eq!(approval.step_id, a.id);
        let a = store.get_step(&a.id).await.unwrap();
        let b = store.get_step(&b.id).await.unwrap();
        assert!(
            store
                .valid_approval(&a, &inputs, 1)
                .await
                .unwrap()
                .is_some()
        );
        // B is untouched and its gate finds no approval, though the inputs hash is the same.
        assert_eq!(b.status, StepStatus::NeedsApproval);
        assert!(
            store
                .valid_approval(&b, &inputs, 1)
                .await
                .unwrap()
                .is_none()
        );
        assert!(store.approvals_for_step(&b.id).await.unwrap().is_empty());
        // Approving B needs its own decision, which binds B alone.
        store
            .decide_step(
                &b.id,
                &pat(),
                &one_approver(),
                Verdict::Rejected,
                "not this one",
            )
            .await
            .unwrap();
        let b = store.get_step(&b.id).await.unwrap();
        assert_eq!(b.status, StepStatus::Refused);
        let a = store.get_step(&a.id).await.unwrap();
        assert!(
            store
                .valid_approval(&a, &inputs, 1)
                .await
                .unwrap()
                .is_some()
        );
    })
    .await;
}

fn person(sub: &str) -> Decider {
    Decider {
        approver: Approver {
            iss: "https://idp.example".into(),
            sub: sub.into(),
        },
        ..pat()
    }
}

fn two_approvers() -> GateRules {
    GateRules {
        approvals_needed: 2,
        ..one_approver()
    }
}

/// How many decisions are stored for `step`, and how many audit records decide it.
async fn decisions_and_records(store: &Store, step: &Step) -> (usize, usize) {
    let rows = store.approvals_for_step(&step.id).await.unwrap().len();
    let records = store
        .audit_for_run(&step.run_id)
        .await
        .unwrap()
        .iter()
        .filter(|r| {
            r.step_id.as_deref() == Some(step.id.as_str())
                && (r.event == "approved" || r.event == "rejected")
        })
        .count();
    (rows, records)
}

#[tokio::test]
async fn a_decision_whose_transition_fails_leaves_no_approval_behind() {
    let (_, clock) = test_clock();
    countersign_core::store::testing::each_backend(clock, |store| async move {
        let inputs = canonical(&json!({"invoice_id": "INV-9", "amount_minor": 1_240_000}));
        let step = waiting_step(&store, &inputs).await;
        // The step's row refuses every update: the decision's transition fails.
        let (break_it, mend_it): (&[&str], &[&str]) = match store.backend() {
            Backend::Sqlite => (
                &["CREATE TRIGGER down BEFORE UPDATE ON steps \
                   BEGIN SELECT RAISE(ABORT, 'down'); END"],
                &["DROP TRIGGER down"],
            ),
            Backend::Postgres => (
                &[
                    "CREATE FUNCTION down() RETURNS trigger LANGUAGE plpgsql AS \
                     $$ BEGIN RAISE EXCEPTION 'down'; END $$",
                    "CREATE TRIGGER down BEFORE UPDATE ON steps \
                     FOR EACH ROW EXECUTE FUNCTION down()",
                ],
                &["DROP TRIGGER down ON steps", "DROP FUNCTION down()"],
            ),
        };
        for sql in break_it {
            store.execute_sql(sql).await.unwrap();
        }
        let failed = store
            .decide_step(
                &step.id,
                &person("kim"),
                &two_approvers(),
                Verdict::Approved,
                "looks right",
            )
            .await;
        assert!(failed.is_err(), "the transition could not be written");
        for sql in mend_it {
            store.execute_sql(sql).await.unwrap();
        }
        // Kim was told nothing was decided: nothing was. Her retry counts as her first.
        assert_eq!(decisions_and_records(&store, &step).await, (0, 0));
        store
            .decide_step(
                &step.id,
                &person("pat"),
                &two_approvers(),
                Verdict::Approved,
                "checked the invoice",
            )
            .await
            .unwrap();
        let now = store.get_step(&step.id).await.unwrap();
        assert_eq!(
            now.status,
            StepStatus::NeedsApproval,
            "one approval of two needed: the failed one does not count"
        );
        assert!(
            store
                .valid_approval(&now, &inputs, 2)
                .await
                .unwrap()
                .is_none()
        );
        store
            .decide_step(
                &step.id,
                &person("kim"),
                &two_approvers(),
                Verdict::Approved,
                "looks right",
            )
            .await
            .unwrap();
        let now = store.get_step(&step.id).await.unwrap();
        assert_eq!(now.status, StepStatus::Pending);
        assert_eq!(decisions_and_records(&store, &step).await, (2, 2));
        assert!(
            store
                .valid_approval(&now, &inputs, 2)
                .await
                .unwrap()
                .is_some()
        );

        // A decision that finds the step gone from its gate leaves no row either.
        let other = waiting_step(&store, &inputs).await;
        store
            .decide_step(
                &other.id,
                &person("kim"),
                &one_approver(),
                Verdict::Rejected,
                "no",
            )
            .await
            .unwrap();
        store
            .transition(&Transition {
                step_id: other.id.clone(),
                from: vec![StepStatus::Refused],
                to: Some(StepStatus::NeedsApproval),
                ..Transition::default()
            })
            .await
            .unwrap()
            .unwrap();
        // Parked again by hand (as if a stale reader): a decision racing the refusal would
        // have seen it at needs_approval; the check inside the decision still holds.
        assert_eq!(decisions_and_records(&store, &other).await, (1, 1));
        assert!(matches!(
            store
                .decide_step(
                    &other.id,
                    &person("kim"),
                    &one_approver(),
                    Verdict::Approved,
                    "yes"
                )
                .await,
            Err(countersign_core::approvals::DecideError::AlreadyDecided)
        ));
        assert_eq!(decisions_and_records(&store, &other).await, (1, 1));
    })
    .await;
}

#[tokio::test]
async fn two_people_approving_at_once_both_count() {
    let (_, clock) = test_clock();
    countersign_core::store::testing::each_backend(clock, |store| async move {
        let inputs = canonical(&json!({"invoice_id": "INV-7", "amount_minor": 1_240_000}));
        for round in 0..12 {
            let step = waiting_step(&store, &inputs).await;
            let rules = two_approvers();
            let (kim, pat) = (person("kim"), person("pat"));
            let (a, p) = tokio::join!(
                store.decide_step(&step.id, &kim, &rules, Verdict::Approved, "ok by kim"),
                store.decide_step(&step.id, &pat, &rules, Verdict::Approved, "ok by pat"),
            );
            a.unwrap();
            p.unwrap();
            let now = store.get_step(&step.id).await.unwrap();
            assert_eq!(
                now.status,
                StepStatus::Pending,
                "round {round}: two distinct approvals open a two-approval gate"
            );
            assert_eq!(decisions_and_records(&store, &step).await, (2, 2));
        }
    })
    .await;
}

#[tokio::test]
async fn a_sign_in_whose_provider_left_out_auth_time_is_never_fresh_for_a_step_up() {
    let (_, clock) = test_clock();
    countersign_core::store::testing::each_backend(clock, |store| async move {
        let inputs = canonical(&json!({"invoice_id": "INV-2", "amount_minor": 100}));
        let step = waiting_step(&store, &inputs).await;
        let step_up = GateRules {
            step_up_max_age_ms: Some(15 * 60_000),
            ..one_approver()
        };
        // Signed in a moment ago by the session's clock, but the provider never said when it
        // authenticated her: refused, nothing recorded.
        let unknown = Decider {
            auth_time: store.clock().now_ms(),
            auth_time_unknown: true,
            ..pat()
        };
        let refused = store
            .decide_step(&step.id, &unknown, &step_up, Verdict::Approved, "fine")
            .await;
        assert!(
            matches!(
                refused,
                Err(countersign_core::approvals::DecideError::StepUpRequired { .. })
            ),
            "{refused:?}"
        );
        assert!(store.approvals_for_step(&step.id).await.unwrap().is_empty());
        // The same sign-in time, stated by the provider: fresh.
        let stated = Decider {
            auth_time_unknown: false,
            ..unknown
        };
        store
            .decide_step(&step.id, &stated, &step_up, Verdict::Approved, "fine")
            .await
            .unwrap();
    })
    .await;
}
