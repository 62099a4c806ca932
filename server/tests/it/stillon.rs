//! StillOn (seed 004) against the built-in partner systems, on both backends: a move within
//! the traveller's standing authorization (hold, mutate once, read back), a cancel that waits
//! for the traveller, the slot taken in flight (fail closed, no mutation, re-plan flag), a
//! partner that accepts a move but applies another one (read-back fails closed), a
//! notification that fails after the move, and standing authorizations managed from the CLI
//! (revoked, out of bounds, another party's, another tenant's or expired → the gate).

use std::time::{Duration, Instant};

use countersign::adapters::builtin::{Fault, FaultMode, inject_fault};
use countersign::adapters::stillon::{HOLD_OPERATION, STILLON, TENANT, TRAVELLER};
use countersign::revalidate::{BEFORE_CALL, READ_BACK, STATE_CHANGED};
use countersign_core::approvals::{Approver, DecideError, Decider, GateRules, Verdict};
use countersign_core::policy::TaskOrigin;
use countersign_core::store::RunStatus;
use countersign_core::{Backend, StepStatus};
use serde_json::{Value, json};

use crate::helpers::{TestApp, countersign_on, example, spawn_app_with};
use crate::mcp::{Client, agent};

const GRANT: &str = "authorization:SA-user-123-dining-shift-30";
const MOVE_REASON: &str = "Inbound flight now lands 19:20 instead of 17:45";

/// Runs `test` against a fresh StillOn server on SQLite, then on Postgres.
pub async fn each_stillon_app<F, Fut>(test: F)
where
    F: Fn(TestApp) -> Fut,
    Fut: std::future::Future<Output = TestApp>,
{
    each_stillon_app_with(&[], test).await
}

/// [`each_stillon_app`] with extra `COUNTERSIGN_*` settings.
pub async fn each_stillon_app_with<F, Fut>(extra: &[(&str, &str)], test: F)
where
    F: Fn(TestApp) -> Fut,
    Fut: std::future::Future<Output = TestApp>,
{
    let registry = example("stillon");
    let mut env = vec![("COUNTERSIGN_REGISTRY", registry.as_str())];
    env.extend_from_slice(extra);
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(app) = spawn_app_with(backend, &env).await else {
            continue;
        };
        let app = test(app).await;
        app.stop().await;
    }
}

/// An agent in `role` acting for the traveller; returns its token.
async fn for_traveller(app: &TestApp, name: &str, role: &str) -> String {
    let (id, token) = agent(app, name, role).await;
    app.store
        .bind_agent(&id, Some(TRAVELLER), TaskOrigin::User, "operator")
        .await
        .unwrap();
    token
}

/// The traveller, deciding in the app (StillOn's gated tools are approved by `traveller`).
fn traveller() -> Decider {
    Decider {
        approver: Approver {
            iss: "https://idp.example".into(),
            sub: TRAVELLER.into(),
        },
        roles: vec!["traveller".into()],
        auth_time: 1_781_170_937_000,
        auth_time_unknown: false,
    }
}

fn traveller_gate() -> GateRules {
    GateRules {
        approver_roles: vec!["traveller".into()],
        four_eyes: false,
        approvals_needed: 1,
        step_up_max_age_ms: None,
        party_confirms: true,
        signature_required: false,
    }
}

fn content(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

async fn object(app: &TestApp, kind: &str, id: &str) -> Value {
    let obj = app
        .store
        .demo_get(STILLON, kind, id)
        .await
        .unwrap()
        .unwrap();
    serde_json::from_str(&obj.data).unwrap()
}

async fn effects(app: &TestApp, operation: &str) -> usize {
    app.store
        .demo_effects(STILLON, operation)
        .await
        .unwrap()
        .len()
}

fn move_args(time: &str) -> Value {
    json!({"reservation_id": 8472, "requested_time": time, "reason": MOVE_REASON})
}

fn observed_free_2000() -> Value {
    json!([{"field": "time", "value": "19:30"}, {"field": "owner", "value": TRAVELLER},
           {"field": "status", "value": "confirmed"}, {"field": "slots.2000", "value": "free"}])
}

fn move_step(observed: Value) -> Value {
    json!({"tool": "reservation.modify", "arguments": move_args("20:00"),
           "reason": "Dinner at 19:30 is no longer reachable; 20:00 keeps the party together",
           "evidence": ["FLIGHT-TP1351"], "observed": observed})
}

async fn submit(client: &mut Client<'_>, steps: Vec<Value>) -> (String, Vec<String>) {
    let reply = client
        .call(
            "plan.submit",
            json!({"task": "Recover the evening after the flight delay", "steps": steps}),
        )
        .await;
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    let run = content(&reply)["run_id"].as_str().unwrap().to_string();
    let ids = content(&reply)["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step_id"].as_str().unwrap().to_string())
        .collect();
    (run, ids)
}

async fn wait_for(app: &TestApp, step: &str, status: StepStatus) -> countersign_core::store::Step {
    let began = Instant::now();
    loop {
        let now = app.store.get_step(step).await.unwrap();
        if now.status == status {
            return now;
        }
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "step {step} stuck at {:?}, wanted {status:?}: {now:?}",
            now.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_run(app: &TestApp, run: &str, status: RunStatus) {
    let began = Instant::now();
    while app.store.get_run(run).await.unwrap().status != status {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "run never became {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn step_audit(app: &TestApp, run: &str, step: &str) -> Vec<(String, Option<String>, Value)> {
    app.store
        .audit_for_run(run)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.step_id.as_deref() == Some(step))
        .map(|r| {
            (
                r.event,
                r.rule,
                serde_json::from_str::<Value>(&r.record).unwrap()["detail"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn stillon_an_agent_not_acting_for_the_owner_is_denied_and_nothing_moves() {
    each_stillon_app(|app| async move {
        let (_, token) = agent(&app, "stranger", "worker.travel").await;
        let mut client = Client::new(&app, &token);
        client.connect().await;
        let reply = client.call("reservation.modify", move_args("20:00")).await;
        assert_eq!(reply["result"]["isError"], true, "{reply}");
        assert_eq!(content(&reply)["rule"], "resource.not_owner", "{reply}");
        // Another traveller's reservation, even for an agent of user-123.
        let token = for_traveller(&app, "travel-1", "worker.travel").await;
        let mut client = Client::new(&app, &token);
        client.connect().await;
        let reply = client
            .call(
                "reservation.modify",
                json!({"reservation_id": 8473, "requested_time": "20:00", "reason": MOVE_REASON}),
            )
            .await;
        assert_eq!(content(&reply)["rule"], "resource.not_owner", "{reply}");
        assert_eq!(effects(&app, "dining.reservation.modify").await, 0);
        assert_eq!(effects(&app, HOLD_OPERATION).await, 0);
        assert_eq!(object(&app, "reservation", "8472").await["time"], "19:30");
        app
    })
    .await;
}

#[tokio::test]
async fn stillon_a_30_minute_move_runs_within_the_standing_authorization_once() {
    each_stillon_app(|app| async move {
        let token = for_traveller(&app, "travel-1", "worker.travel").await;
        let mut client = Client::new(&app, &token);
        client.connect().await;
        // An hour is outside the grant: the traveller is asked.
        let reply = client.call("reservation.modify", move_args("18:30")).await;
        assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
        assert_eq!(content(&reply)["rule"], "reservation.change", "{reply}");

        let reply = client.call("reservation.modify", move_args("20:00")).await;
        assert_eq!(reply["result"]["isError"], false, "{reply}");
        assert_eq!(content(&reply)["time"], "20:00", "{reply}");
        let again = client.call("reservation.modify", move_args("20:00")).await;
        assert_eq!(content(&again)["ref"], content(&reply)["ref"], "{again}");
        assert_eq!(effects(&app, "dining.reservation.modify").await, 1);
        assert_eq!(effects(&app, HOLD_OPERATION).await, 1, "the slot was held");
        let res = object(&app, "reservation", "8472").await;
        assert_eq!(res["time"], "20:00");
        assert_eq!(res["starts_at"], "2026-06-11T20:00:00+01:00");
        let rst = object(&app, "restaurant", "RST-1001").await;
        assert_eq!(rst["slots"]["2026-06-11"]["20:00"], "R:8472");
        assert_eq!(rst["slots"]["2026-06-11"]["19:30"], "free");
        // Read back through reservation.get.
        let read = client
            .call("reservation.get", json!({"reservation_id": 8472}))
            .await;
        assert_eq!(content(&read)["time"], "20:00", "{read}");
        assert_eq!(content(&read)["slots"]["2000"], "yours", "{read}");
        // A "misapplied" fault on a read refuses it (a read has nothing else to apply): the
        // fault is never used up unseen.
        fault_once(&app, "dining.reservation.get", FaultMode::Misapplied).await;
        let faulted = client
            .call("reservation.get", json!({"reservation_id": 8472}))
            .await;
        assert_eq!(faulted["result"]["isError"], true, "{faulted}");
        assert_eq!(content(&faulted)["code"], "injected", "{faulted}");
        app
    })
    .await;
}

#[tokio::test]
async fn stillon_a_plan_holds_mutates_once_and_reads_back() {
    each_stillon_app(|app| async move {
        let token = for_traveller(&app, "maestro", "planner").await;
        let mut planner = Client::new(&app, &token);
        planner.connect().await;
        let calendar = json!({"tool": "calendar.update",
            "arguments": {"event_id": "EVT-0000a1b2", "start": "2026-06-11T20:00:00+01:00",
                          "end": "2026-06-11T22:00:00+01:00"},
            "reason": "Keep the traveller's calendar in step with the dinner"});
        let (run, steps) = submit(
            &mut planner,
            vec![move_step(observed_free_2000()), calendar],
        )
        .await;
        let done = wait_for(&app, &steps[0], StepStatus::Done).await;
        assert_eq!(done.decision.as_deref(), Some("allow_within_authorization"));
        assert_eq!(done.rule.as_deref(), Some(GRANT));
        wait_for(&app, &steps[1], StepStatus::Done).await;
        wait_run(&app, &run, RunStatus::Done).await;
        assert_eq!(effects(&app, "dining.reservation.modify").await, 1);
        assert_eq!(effects(&app, "calendar.update").await, 1);
        assert_eq!(object(&app, "reservation", "8472").await["time"], "20:00");
        let ev = object(&app, "calendar_event", "EVT-0000a1b2").await;
        assert_eq!(ev["revision"], 2);
        let events: Vec<String> = step_audit(&app, &run, &steps[0])
            .await
            .into_iter()
            .map(|(e, _, _)| e)
            .collect();
        assert_eq!(events, ["proposed", "decided", "started", "succeeded"]);
        assert!(!app.store.get_run(&run).await.unwrap().replan);
        assert!(app.store.verify_audit().await.unwrap().is_ok());
        app
    })
    .await;
}

#[tokio::test]
async fn stillon_the_slot_taken_in_flight_fails_closed_without_a_mutation() {
    each_stillon_app(|app| async move {
        let token = for_traveller(&app, "maestro", "planner").await;
        let mut planner = Client::new(&app, &token);
        planner.connect().await;
        let seen = planner
            .call(
                "restaurant.availability",
                json!({"restaurant_id": "RST-1001", "date": "2026-06-11", "party_size": 4}),
            )
            .await;
        assert!(
            content(&seen)["free"]
                .as_array()
                .unwrap()
                .contains(&json!("20:00")),
            "{seen}"
        );
        // Someone else books 20:00 while the plan is on its way.
        let mut rst = object(&app, "restaurant", "RST-1001").await;
        rst["slots"]["2026-06-11"]["20:00"] = json!("taken");
        app.store
            .demo_put(STILLON, "restaurant", "RST-1001", TENANT, &rst.to_string())
            .await
            .unwrap();
        let (run, steps) = submit(&mut planner, vec![move_step(observed_free_2000())]).await;
        let failed = wait_for(&app, &steps[0], StepStatus::Failed).await;
        assert_eq!(failed.rule.as_deref(), Some(STATE_CHANGED));
        wait_run(&app, &run, RunStatus::Failed).await;
        assert!(
            app.store.get_run(&run).await.unwrap().replan,
            "re-plan flag"
        );
        assert_eq!(effects(&app, "dining.reservation.modify").await, 0);
        assert_eq!(effects(&app, HOLD_OPERATION).await, 0, "not even held");
        assert_eq!(object(&app, "reservation", "8472").await["time"], "19:30");
        let audit = step_audit(&app, &run, &steps[0]).await;
        let (event, rule, detail) = audit.last().unwrap().clone();
        assert_eq!(event, "failed");
        assert_eq!(rule.as_deref(), Some(STATE_CHANGED));
        assert_eq!(detail["fields"][0]["field"], "slots.2000", "{detail}");
        assert_eq!(detail["fields"][0]["current"], "taken", "{detail}");
        assert_eq!(detail["effect_applied"], false, "{detail}");
        assert_eq!(detail["check"], BEFORE_CALL, "{detail}");
        assert!(!audit.iter().any(|(e, _, _)| e == "succeeded"));
        app
    })
    .await;
}

#[tokio::test]
async fn stillon_a_move_the_partner_applies_differently_fails_closed_on_read_back() {
    each_stillon_app(|app| async move {
        // The partner accepts "20:00" and answers "20:00", but seats the party at 19:00 (the
        // free sitting nearest 20:00: 20:30 and 21:00 are taken).
        fault_once(&app, "dining.reservation.modify", FaultMode::Misapplied).await;
        let token = for_traveller(&app, "maestro", "planner").await;
        let mut planner = Client::new(&app, &token);
        planner.connect().await;
        let calendar = json!({"tool": "calendar.update",
            "arguments": {"event_id": "EVT-0000a1b2", "start": "2026-06-11T20:00:00+01:00",
                          "end": "2026-06-11T22:00:00+01:00"},
            "reason": "Keep the traveller's calendar in step with the dinner"});
        let (run, steps) = submit(
            &mut planner,
            vec![move_step(observed_free_2000()), calendar],
        )
        .await;
        let failed = wait_for(&app, &steps[0], StepStatus::Failed).await;
        assert_eq!(failed.rule.as_deref(), Some(STATE_CHANGED), "{failed:?}");
        wait_run(&app, &run, RunStatus::Failed).await;
        assert!(
            app.store.get_run(&run).await.unwrap().replan,
            "re-plan flag"
        );
        // Never reported as a success, to the planner or anyone.
        let status = planner.call("run.status", json!({"run_id": run})).await;
        assert_eq!(content(&status)["replan"], true, "{status}");
        assert_eq!(content(&status)["steps"][0]["status"], "failed", "{status}");
        let outcome: Value = serde_json::from_str(failed.outcome.as_deref().unwrap()).unwrap();
        assert_eq!(outcome["error"], true, "{outcome}");
        assert_eq!(outcome["answer"]["rule"], STATE_CHANGED, "{outcome}");
        assert_eq!(outcome["answer"]["effect_applied"], true, "{outcome}");
        // Its applied effect is not left in silence: escalated to a person.
        let escalated = compensated(&app, &run, &steps[0])
            .await
            .into_iter()
            .find(|(e, _, _)| e == "compensated")
            .unwrap();
        assert_eq!(
            escalated.1.as_deref(),
            Some("compensation.escalated"),
            "{escalated:?}"
        );
        assert_eq!(
            escalated.2["after_failed_step"],
            steps[0].as_str(),
            "{escalated:?}"
        );
        // The target: one effect (not retried), the reservation where the partner put it, and
        // the later step never started.
        assert_eq!(effects(&app, "dining.reservation.modify").await, 1);
        assert_eq!(object(&app, "reservation", "8472").await["time"], "19:00");
        assert_eq!(
            app.store.get_step(&steps[0]).await.unwrap().attempts,
            1,
            "an applied effect is never retried"
        );
        assert_eq!(
            app.store.get_step(&steps[1]).await.unwrap().status,
            StepStatus::Cancelled
        );
        assert_eq!(effects(&app, "calendar.update").await, 0);
        assert_eq!(
            object(&app, "calendar_event", "EVT-0000a1b2").await["revision"],
            1
        );
        // The audit: started, then failed with the read-back's fields — no `succeeded` — and
        // the escalation a person acts on (issue 36), to be handled by hand.
        let audit = step_audit(&app, &run, &steps[0]).await;
        let events: Vec<&str> = audit.iter().map(|(e, _, _)| e.as_str()).collect();
        assert_eq!(
            events,
            [
                "proposed",
                "decided",
                "started",
                "failed",
                "compensated",
                "operational"
            ]
        );
        assert_eq!(audit[5].1.as_deref(), Some("escalation.opened"));
        assert_eq!(audit[5].2["kind"], "manual", "{:?}", audit[5]);
        let (_, rule, detail) = audit[3].clone();
        assert_eq!(rule.as_deref(), Some(STATE_CHANGED));
        assert_eq!(detail["check"], READ_BACK, "{detail}");
        assert_eq!(detail["effect_applied"], true, "{detail}");
        assert_eq!(detail["replan"], true, "{detail}");
        assert_eq!(
            detail["reference"], "8472@20:00",
            "what the partner claimed: {detail}"
        );
        let time = detail["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["field"] == "time")
            .unwrap_or_else(|| panic!("no time field: {detail}"));
        assert_eq!(time["expected"], "20:00", "{detail}");
        assert_eq!(time["current"], "19:00", "{detail}");
        assert!(app.store.verify_audit().await.unwrap().is_ok());
        app
    })
    .await;
}

#[tokio::test]
async fn stillon_without_observed_state_the_partner_refuses_a_taken_slot() {
    each_stillon_app(|app| async move {
        let token = for_traveller(&app, "travel-1", "worker.travel").await;
        let mut client = Client::new(&app, &token);
        client.connect().await;
        let mut rst = object(&app, "restaurant", "RST-1001").await;
        rst["slots"]["2026-06-11"]["20:00"] = json!("taken");
        app.store
            .demo_put(STILLON, "restaurant", "RST-1001", TENANT, &rst.to_string())
            .await
            .unwrap();
        let reply = client.call("reservation.modify", move_args("20:00")).await;
        assert_eq!(reply["result"]["isError"], true, "{reply}");
        assert_eq!(content(&reply)["code"], "slot.unavailable", "{reply}");
        assert_eq!(effects(&app, "dining.reservation.modify").await, 0);
        let hold = object(&app, "hold", "RST-1001/2026-06-11/20:00").await;
        assert_eq!(hold["active"], false, "the refused move released its hold");
        assert_eq!(object(&app, "reservation", "8472").await["time"], "19:30");
        app
    })
    .await;
}

#[tokio::test]
async fn stillon_cancel_waits_for_the_traveller() {
    each_stillon_app(|app| async move {
        let token = for_traveller(&app, "maestro", "planner").await;
        let mut planner = Client::new(&app, &token);
        planner.connect().await;
        let cancel = json!({"tool": "reservation.cancel",
            "arguments": {"reservation_id": 8472, "reason": "The restaurant cannot seat us at 20:00"},
            "reason": "No later table keeps the party together; cancel instead"});
        let (run, steps) = submit(&mut planner, vec![cancel]).await;
        let waiting = wait_for(&app, &steps[0], StepStatus::NeedsApproval).await;
        assert_eq!(waiting.rule.as_deref(), Some("irreversible.always"), "{waiting:?}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(effects(&app, "dining.reservation.cancel").await, 0);
        assert_eq!(object(&app, "reservation", "8472").await["status"], "confirmed");

        // The traveller's own confirmation: another person with the role may not give it
        // (refused and audited), whatever their role says.
        let mut someone_else = traveller();
        someone_else.approver.sub = "user-999".into();
        let refused = app
            .store
            .decide_step(
                &steps[0],
                &someone_else,
                &traveller_gate(),
                Verdict::Approved,
                "on their behalf",
            )
            .await;
        assert!(
            matches!(&refused, Err(DecideError::NotTheParty { party: Some(p) }) if p == TRAVELLER),
            "{refused:?}"
        );
        let records = app.store.audit_for_run(&run).await.unwrap();
        assert!(
            records
                .iter()
                .any(|r| r.rule.as_deref() == Some("approval.not_party") && r.event == "refused"),
            "{records:?}"
        );
        assert_eq!(
            app.store.get_step(&steps[0]).await.unwrap().status,
            StepStatus::NeedsApproval
        );

        app.store
            .decide_step(
                &steps[0],
                &traveller(),
                &traveller_gate(),
                Verdict::Approved,
                "yes, cancel it",
            )
            .await
            .unwrap();
        wait_for(&app, &steps[0], StepStatus::Done).await;
        wait_run(&app, &run, RunStatus::Done).await;
        assert_eq!(effects(&app, "dining.reservation.cancel").await, 1);
        assert_eq!(object(&app, "reservation", "8472").await["status"], "cancelled");
        app
    })
    .await;
}

#[tokio::test]
async fn stillon_notify_failing_after_the_move_is_recorded() {
    each_stillon_app(|app| async move {
        fault_once(&app, "messaging.send", FaultMode::Fail).await;
        let token = for_traveller(&app, "maestro", "planner").await;
        let mut planner = Client::new(&app, &token);
        planner.connect().await;
        let notify = notify_step();
        let (run, steps) =
            submit(&mut planner, vec![move_step(observed_free_2000()), notify]).await;
        wait_for(&app, &steps[0], StepStatus::Done).await;
        wait_for(&app, &steps[1], StepStatus::NeedsApproval).await;
        app.store
            .decide_step(
                &steps[1],
                &traveller(),
                &traveller_gate(),
                Verdict::Approved,
                "send it",
            )
            .await
            .unwrap();
        let failed = wait_for(&app, &steps[1], StepStatus::Failed).await;
        wait_run(&app, &run, RunStatus::Failed).await;
        assert_eq!(effects(&app, "messaging.send").await, 0);
        assert_eq!(
            effects(&app, "dining.reservation.modify").await,
            1,
            "the move stands"
        );
        assert_eq!(object(&app, "reservation", "8472").await["time"], "20:00");
        let outcome: Value = serde_json::from_str(failed.outcome.as_deref().unwrap()).unwrap();
        assert_eq!(outcome["answer"]["code"], "injected", "{outcome}");
        let audit = step_audit(&app, &run, &steps[1]).await;
        let (event, rule, _) = audit.last().unwrap().clone();
        assert_eq!(
            (event.as_str(), rule.as_deref()),
            ("failed", Some("target.failed"))
        );
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stillon_an_undo_that_needs_a_person_restores_the_party_and_leaves_the_inbox() {
    let (hook, told) = crate::helpers::webhook_sink().await;
    let env = [("COUNTERSIGN_WEBHOOK_URLS", hook.as_str())];
    each_stillon_app_with(&env, |app| {
        let told = told.clone();
        async move {
            told.lock().unwrap().clear();
            fault_once(&app, "messaging.send", FaultMode::Fail).await;
            let token = for_traveller(&app, "maestro", "planner").await;
            let mut planner = Client::new(&app, &token);
            planner.connect().await;
            // The move also grows the party: outside the standing authorization, so approved.
            let mut bigger = move_step(observed_free_2000());
            bigger["arguments"]["party_size"] = json!(6);
            let notify = notify_step();
            let (run, steps) = submit(&mut planner, vec![bigger, notify]).await;
            for step in &steps {
                wait_for(&app, step, StepStatus::NeedsApproval).await;
                app.store
                    .decide_step(
                        step,
                        &traveller(),
                        &traveller_gate(),
                        Verdict::Approved,
                        "yes",
                    )
                    .await
                    .unwrap();
            }
            wait_for(&app, &steps[1], StepStatus::Failed).await;
            wait_run(&app, &run, RunStatus::Failed).await;
            let trail = compensated(&app, &run, &steps[0]).await;
            assert!(
                trail.iter().any(|(e, r, _)| e == "compensated"
                    && r.as_deref() == Some("compensation.escalated")),
                "{trail:?}"
            );
            let all = app.store.steps_for_run(&run).await.unwrap();
            let comp = all
                .iter()
                .find(|s| s.reason.starts_with("compensates step"))
                .unwrap();
            let undo: Value = serde_json::from_str(&comp.inputs).unwrap();
            assert_eq!(undo["party_size"], 4, "the party it had: {undo}");
            assert_eq!(undo["requested_time"], "19:30", "{undo}");
            // Nobody is invited to approve an undo no worker would run: it is cancelled.
            assert_eq!(comp.status, StepStatus::Cancelled);
            assert_eq!(comp.rule.as_deref(), Some("compensation.escalated"));
            assert!(matches!(
                app.store
                    .decide_step(
                        &comp.id,
                        &traveller(),
                        &traveller_gate(),
                        Verdict::Approved,
                        "undo"
                    )
                    .await,
                Err(DecideError::NotWaiting(_))
            ));
            let reservation = object(&app, "reservation", "8472").await;
            assert_eq!(reservation["time"], "20:00", "{reservation}");
            assert_eq!(reservation["party_size"], 6, "{reservation}");
            // The webhooks: one invitation per planned gate, none for the cancelled undo, and the
            // escalation of the move.
            let began = std::time::Instant::now();
            let bodies = loop {
                let bodies = told.lock().unwrap().clone();
                if bodies
                    .iter()
                    .any(|b| b["event"] == "compensation_escalated")
                    || began.elapsed() > Duration::from_secs(10)
                {
                    break bodies;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let of = |event: &str| -> Vec<String> {
                bodies
                    .iter()
                    .filter(|b| b["event"] == event)
                    .map(|b| b["step_id"].as_str().unwrap_or_default().to_string())
                    .collect()
            };
            assert_eq!(of("gate_opened"), steps, "{bodies:?}");
            assert_eq!(
                of("compensation_escalated"),
                vec![steps[0].clone()],
                "{bodies:?}"
            );
            app
        }
    })
    .await;
}

/// The partner fails `operation`'s next call with `mode`.
async fn fault_once(app: &TestApp, operation: &str, mode: FaultMode) {
    inject_fault(&app.store, STILLON, operation, &Fault { mode, times: 1 })
        .await
        .unwrap();
}

/// A plan step telling the guest the dinner moved to 20:00.
fn notify_step() -> Value {
    json!({"tool": "notify.send",
        "arguments": {"contact_id": "CONTACT-0042", "channel": "sms",
                      "message": "Dinner moved to 20:00 at Osteria Lume"},
        "reason": "Tell the guest the dinner moved to 20:00"})
}

/// `step`'s audit trail in `run` once it holds its `compensated` record.
async fn compensated(app: &TestApp, run: &str, step: &str) -> Vec<(String, Option<String>, Value)> {
    loop {
        let trail = step_audit(app, run, step).await;
        if trail.iter().any(|(e, _, _)| e == "compensated") {
            return trail;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `countersign standing ARGS…` on `app`'s database: (exit code, stdout, stderr).
fn standing_cli(app: &TestApp, args: &[&str]) -> (i32, String, String) {
    let out = countersign_on(&app.db_url())
        .arg("standing")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fresh session (so a fresh run and step) asks to move dinner to `time`; the reply.
async fn move_to(app: &TestApp, token: &str, time: &str) -> Value {
    let mut client = Client::new(app, token);
    client.connect().await;
    client.call("reservation.modify", move_args(time)).await
}

#[tokio::test]
async fn stillon_standing_authorizations_come_from_the_store_and_fail_closed() {
    each_stillon_app(|app| async move {
        let seeded = GRANT.trim_start_matches("authorization:");
        let (code, out, err) = standing_cli(&app, &["list", "--tenant", TENANT]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains(seeded) && out.contains("active"), "{out}");
        let token = for_traveller(&app, "travel-1", "worker.travel").await;

        // Refusals first. The CLI refuses what could never be a sound grant.
        let base = [
            "grant",
            "--tenant",
            TENANT,
            "--party",
            TRAVELLER,
            "--expires",
            "30d",
            "--reason",
            "the traveller lets dinner move",
        ];
        for (extra, why) in [
            (
                &["--tool", "reservation.cancel", "--owns-resource"][..],
                "irreversible",
            ),
            (&["--tool", "reservation.modify"][..], "condition"),
            (
                &["--tool", "reservation.nope", "--owns-resource"][..],
                "not a tool",
            ),
            (
                &[
                    "--tool",
                    "reservation.modify",
                    "--only-arguments",
                    "reservation_id,party",
                ][..],
                "no argument",
            ),
            // An amount bound needs its currency, and a currency is a code.
            (
                &["--tool", "reservation.modify", "--max-amount-minor", "5000"][..],
                "needs --currency",
            ),
            (
                &[
                    "--tool",
                    "reservation.modify",
                    "--max-amount-minor",
                    "5000",
                    "--currency",
                    "euro",
                ][..],
                "ISO 4217",
            ),
        ] {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            let (code, _, err) = standing_cli(&app, &args);
            assert_eq!(code, 1, "{extra:?}: {err}");
            assert!(err.contains(why), "{extra:?}: {err}");
        }

        // Revoked: the 30-minute move the seeded grant covered now waits for the traveller.
        let (code, out, err) = standing_cli(
            &app,
            &[
                "revoke",
                seeded,
                "--reason",
                "the traveller withdrew it",
                "--by",
                "ops",
            ],
        );
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("revoked"), "{out}");
        let (code, _, err) = standing_cli(&app, &["revoke", seeded, "--reason", "again"]);
        assert_eq!(code, 1);
        assert!(err.contains("already revoked"), "{err}");
        let reply = move_to(&app, &token, "20:00").await;
        assert_eq!(
            content(&reply)["status"],
            "needs_approval",
            "revoked: {reply}"
        );
        assert_eq!(content(&reply)["rule"], "reservation.change", "{reply}");

        // Out of bounds: a 15-minute grant does not cover a 30-minute move.
        let args: Vec<&str> = base
            .iter()
            .copied()
            .chain([
                "--tool",
                "reservation.modify",
                "--owns-resource",
                "--max-shift-minutes",
                "15",
                "--id",
                "SA-15",
            ])
            .collect();
        let (code, out, err) = standing_cli(&app, &args);
        assert_eq!(code, 0, "{err}");
        assert_eq!(out.trim(), "SA-15");
        let reply = move_to(&app, &token, "20:00").await;
        assert_eq!(
            content(&reply)["status"],
            "needs_approval",
            "bounds: {reply}"
        );

        // Another party's and another tenant's grants, and an expired one, cover nothing.
        let (code, _, err) = standing_cli(
            &app,
            &[
                "grant",
                "--tenant",
                TENANT,
                "--party",
                "user-999",
                "--tool",
                "reservation.modify",
                "--owns-resource",
                "--max-shift-minutes",
                "60",
                "--expires",
                "30d",
                "--reason",
                "someone else's",
            ],
        );
        assert_eq!(code, 0, "{err}");
        let (code, _, err) = standing_cli(
            &app,
            &[
                "grant",
                "--tenant",
                "globex",
                "--party",
                TRAVELLER,
                "--tool",
                "reservation.modify",
                "--owns-resource",
                "--max-shift-minutes",
                "60",
                "--expires",
                "30d",
                "--reason",
                "another tenant's",
            ],
        );
        assert_eq!(code, 0, "{err}");
        app.store
            .grant_standing(&countersign_core::store::NewStanding {
                id: Some("SA-brief".into()),
                tenant: TENANT.into(),
                party: TRAVELLER.into(),
                tool: "reservation.modify".into(),
                conditions: vec![countersign_core::policy::AuthorizationCondition::OwnsResource],
                expires_at: app.store.clock().now_ms() + 60_000,
                reason: "one minute".into(),
                granted_by: "ops".into(),
            })
            .await
            .unwrap();
        app.clock.advance(chrono::Duration::minutes(2));
        let reply = move_to(&app, &token, "20:00").await;
        assert_eq!(
            content(&reply)["status"],
            "needs_approval",
            "others: {reply}"
        );
        assert_eq!(effects(&app, "dining.reservation.modify").await, 0);
        assert_eq!(object(&app, "reservation", "8472").await["time"], "19:30");

        // A grant that holds: the move runs within it, once.
        let args: Vec<&str> = base
            .iter()
            .copied()
            .chain([
                "--tool",
                "reservation.modify",
                "--owns-resource",
                "--max-shift-minutes",
                "30",
                "--only-arguments",
                "reservation_id,requested_time,reason",
                "--id",
                "SA-30",
            ])
            .collect();
        let (code, _, err) = standing_cli(&app, &args);
        assert_eq!(code, 0, "{err}");
        let reply = move_to(&app, &token, "20:00").await;
        assert_eq!(reply["result"]["isError"], false, "{reply}");
        assert_eq!(effects(&app, "dining.reservation.modify").await, 1);
        let decided = app
            .store
            .audit_in_order(0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.event == "decided" && r.tool.as_deref() == Some("reservation.modify"))
            .filter_map(|r| r.rule)
            .collect::<Vec<_>>();
        assert_eq!(
            decided.last().map(String::as_str),
            Some("authorization:SA-30")
        );

        // Every change is in the audit trail, and the chain verifies.
        let changes: Vec<(String, Value)> = app
            .store
            .audit_in_order(0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| {
                r.rule
                    .as_deref()
                    .is_some_and(|x| x.starts_with("standing."))
            })
            .map(|r| {
                let v: Value = serde_json::from_str(&r.record).unwrap();
                (r.rule.unwrap(), v["detail"]["id"].clone())
            })
            .collect();
        let granted = changes
            .iter()
            .filter(|(r, _)| r == "standing.granted")
            .count();
        assert_eq!(
            granted, 6,
            "seeded + SA-15 + other party + other tenant + SA-brief + SA-30: {changes:?}"
        );
        assert!(
            changes.contains(&("standing.revoked".into(), json!(seeded))),
            "{changes:?}"
        );
        let (_, out, _) = standing_cli(&app, &["list"]);
        assert!(out.contains(&format!("{seeded}  revoked")), "{out}");
        assert!(out.contains("tenant=globex"), "{out}");
        assert!(app.store.verify_audit().await.unwrap().is_ok());
        app
    })
    .await;
}
