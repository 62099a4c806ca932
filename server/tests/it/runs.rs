//! Durable runs: plans as data, the executor, the gate in a plan, cancellation, review, the
//! emergency stop, and crash recovery with real worker processes — on both backends.

use std::time::{Duration, Instant};

use countersign::adapters::builtin::ERP;
use countersign_core::StepStatus;
use countersign_core::approvals::Verdict;
use countersign_core::store::RunStatus;
use serde_json::{Value, json};

use crate::helpers::{TestApp, countersign_on};
use crate::mcp::{Client, INV, REASON, agent, each_finance_app, each_finance_app_with, payment};

fn content(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

pub(crate) fn note_step() -> Value {
    json!({"tool": "note.draft", "arguments": {"invoice_id": INV, "text": "Paying after the three-way match."},
           "reason": "Record why the invoice is being paid now", "evidence": ["INV-20260611", "PO-77812"]})
}

pub(crate) fn payment_step(amount: Value) -> Value {
    json!({"tool": "payment.schedule", "arguments": payment(amount),
           "reason": "Three-way match complete against PO-77812 line 2", "evidence": ["PO-77812"]})
}

/// Submits a plan as `planner` and returns (run id, step ids).
pub(crate) async fn submit(client: &mut Client<'_>, steps: Vec<Value>) -> (String, Vec<String>) {
    let reply = client
        .call(
            "plan.submit",
            json!({"task": "Process invoice INV-20260611", "steps": steps}),
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

/// A model reviewer's approval of `step`'s exact inputs, by a reviewer credential of its own.
pub async fn review(app: &TestApp, step: &str) {
    let reviewer = match app.store.find_agent("reviewer-it").await {
        Ok(cred) => cred,
        Err(_) => {
            let (id, _) = agent(app, "reviewer-it", "reviewer").await;
            app.store.get_agent(&id).await.unwrap()
        }
    };
    let hash = app.store.get_step(step).await.unwrap().inputs_hash;
    app.store
        .review_step(
            step,
            &hash,
            &reviewer,
            "Amounts and supplier match the evidence",
        )
        .await
        .unwrap();
}

/// Waits (real time, at most 20 s) until `step` reaches `status`. Waiting for a person's gate,
/// a step that first waits for its model review (payment.schedule) is reviewed here (the review
/// stage has its own tests in `duties`).
async fn wait_for(app: &TestApp, step: &str, status: StepStatus) {
    let began = Instant::now();
    loop {
        let now = app.store.get_step(step).await.unwrap();
        if now.status == status {
            return;
        }
        if status == StepStatus::NeedsApproval
            && now.status == StepStatus::Pending
            && app
                .store
                .step_duties(step)
                .await
                .unwrap()
                .is_some_and(|d| d.awaits_review(&now.inputs_hash))
        {
            review(app, step).await;
            continue;
        }
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "step {step} stuck at {:?}, wanted {status:?}: {now:?}",
            now.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn effects(app: &TestApp, operation: &str) -> usize {
    app.store.demo_effects(ERP, operation).await.unwrap().len()
}

#[tokio::test]
async fn runs_a_plan_executes_in_order_and_waits_at_the_gate_for_a_person() {
    each_finance_app(|app| async move {
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let (run, steps) =
            submit(&mut client, vec![note_step(), payment_step(json!(4180.00))]).await;
        assert_eq!(steps.len(), 2);
        wait_for(&app, &steps[0], StepStatus::Done).await;
        wait_for(&app, &steps[1], StepStatus::NeedsApproval).await;
        assert_eq!(effects(&app, "notes.draft").await, 1);
        assert_eq!(effects(&app, "payments.schedule").await, 0);
        let status = client.call("run.status", json!({"run_id": run})).await;
        assert_eq!(content(&status)["status"], "active", "{status}");
        assert_eq!(
            content(&status)["steps"][1]["status"],
            "needs_approval",
            "{status}"
        );

        crate::helpers::decide_signed(
            &app,
            &steps[1],
            &crate::gateway::ana(),
            &crate::gateway::signed(),
            Verdict::Approved,
            "matches the PO",
        )
        .await
        .unwrap();
        wait_for(&app, &steps[1], StepStatus::Done).await;
        assert_eq!(effects(&app, "payments.schedule").await, 1);
        let began = Instant::now();
        while app.store.get_run(&run).await.unwrap().status != RunStatus::Done {
            assert!(
                began.elapsed() < Duration::from_secs(10),
                "run never finished"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let status = client.call("run.status", json!({"run_id": run})).await;
        assert_eq!(
            content(&status)["steps"][1]["outcome"]["status"],
            "scheduled",
            "{status}"
        );
        // The step's audit: proposed by the planner, reviewed, decided, gated, approved,
        // started, succeeded.
        let events: Vec<String> = app
            .store
            .audit_for_run(&run)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.step_id.as_deref() == Some(steps[1].as_str()))
            .map(|r| r.event)
            .collect();
        assert_eq!(
            events,
            [
                "proposed",
                "validated",
                "decided",
                "waiting_approval",
                "approved",
                "decided",
                "started",
                "succeeded"
            ],
        );
        assert!(app.store.verify_audit().await.unwrap().is_ok());
        // Another agent cannot read the run.
        let (_, other) = agent(&app, "planner-2", "planner").await;
        let mut stranger = Client::new(&app, &other);
        stranger.connect().await;
        let denied = stranger.call("run.status", json!({"run_id": run})).await;
        assert_eq!(denied["result"]["isError"], true, "{denied}");
        app
    })
    .await;
}

#[tokio::test]
async fn runs_an_invalid_plan_is_refused_as_a_whole_with_reasons_per_step() {
    each_finance_app(|app| async move {
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let cross_tenant = json!({"tool": "payment.schedule",
            "arguments": {"invoice_id": "INV-20269001", "amount": 2500, "currency": "EUR",
                          "value_date": "2026-06-15", "reason": REASON},
            "reason": "Pay the consulting invoice that arrived today"});
        let too_much = payment_step(json!(60000));
        let no_tool = json!({"tool": "bank.transfer", "arguments": {}, "reason": "Move the money directly instead"});
        let reply = client
            .call(
                "plan.submit",
                json!({"task": "t", "steps": [note_step(), cross_tenant, too_much, no_tool]}),
            )
            .await;
        assert_eq!(reply["result"]["isError"], true, "{reply}");
        assert_eq!(content(&reply)["code"], "plan.invalid", "{reply}");
        let message = content(&reply)["message"].as_str().unwrap();
        for needle in ["step 2 (payment.schedule): tenant.mismatch", "step 3 (payment.schedule): /amount", "step 4: no tool"] {
            assert!(message.contains(needle), "{needle} in {message}");
        }
        assert!(!message.contains("step 1"), "{message}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(effects(&app, "notes.draft").await, 0, "nothing of a refused plan runs");
        let planned = app
            .store
            .list_runs("acme", 10)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.planned)
            .count();
        assert_eq!(planned, 0);
        app
    })
    .await;
}

#[tokio::test]
async fn runs_cancel_and_review_stop_steps_that_have_not_started() {
    each_finance_app(|app| async move {
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        // The payment gates first, so the note behind it cannot start.
        let (run, steps) =
            submit(&mut client, vec![payment_step(json!(4180.00)), note_step()]).await;
        wait_for(&app, &steps[0], StepStatus::NeedsApproval).await;
        let reply = client
            .call(
                "run.cancel",
                json!({"run_id": run, "reason": "The supplier sent a corrected invoice"}),
            )
            .await;
        assert_eq!(content(&reply)["cancelled_steps"], 2, "{reply}");
        assert_eq!(
            app.store.get_run(&run).await.unwrap().status,
            RunStatus::Cancelled
        );
        for s in &steps {
            assert_eq!(
                app.store.get_step(s).await.unwrap().status,
                StepStatus::Cancelled
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            effects(&app, "notes.draft").await + effects(&app, "payments.schedule").await,
            0
        );

        // A model reviewer's rejection refuses the step and flags the run for re-planning.
        let (run, steps) = submit(&mut client, vec![payment_step(json!(4100.00))]).await;
        wait_for(&app, &steps[0], StepStatus::NeedsApproval).await;
        let (_, reviewer) = agent(&app, "reviewer-1", "reviewer").await;
        let mut rev = Client::new(&app, &reviewer);
        rev.connect().await;
        let listed = rev.call("step.list", json!({})).await;
        assert!(
            content(&listed)["steps"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["step_id"] == steps[0].as_str()),
            "{listed}"
        );
        let rejected = rev
            .call(
                "step.reject",
                json!({"step_id": steps[0], "reason": "Amount differs from the invoice total"}),
            )
            .await;
        assert_eq!(content(&rejected)["status"], "refused", "{rejected}");
        assert!(app.store.get_run(&run).await.unwrap().replan);
        assert_eq!(
            app.store.get_step(&steps[0]).await.unwrap().status,
            StepStatus::Refused
        );
        app
    })
    .await;
}

#[tokio::test]
async fn runs_emergency_stop_halts_runs_and_revokes_their_agents() {
    each_finance_app(|app| async move {
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let (run, steps) =
            submit(&mut client, vec![payment_step(json!(4180.00)), note_step()]).await;
        wait_for(&app, &steps[0], StepStatus::NeedsApproval).await;
        let out = countersign_on(&app.db_url())
            .args(["stop", "--reason", "suspected prompt injection campaign"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            app.store.get_run(&run).await.unwrap().status,
            RunStatus::Stopped
        );
        assert_eq!(
            app.store.get_step(&steps[1]).await.unwrap().status,
            StepStatus::Cancelled
        );
        // The run's agent is refused on its next request.
        let (status, _) = client.try_request("tools/list", json!({})).await;
        assert_eq!(status, reqwest::StatusCode::UNAUTHORIZED);
        // While the stop is on, no planned step starts, even a new run's.
        let (_, planner2) = agent(&app, "planner-2", "planner").await;
        let mut second = Client::new(&app, &planner2);
        second.connect().await;
        let (_, steps2) = submit(&mut second, vec![note_step()]).await;
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(
            app.store.get_step(&steps2[0]).await.unwrap().status,
            StepStatus::Pending
        );
        assert_eq!(effects(&app, "notes.draft").await, 0);
        let out = countersign_on(&app.db_url())
            .args(["stop", "--lift", "--reason", "all clear"])
            .output()
            .unwrap();
        assert!(out.status.success());
        wait_for(&app, &steps2[0], StepStatus::Done).await;
        assert_eq!(effects(&app, "notes.draft").await, 1);
        app
    })
    .await;
}

/// A `countersign` process on the test database. The test server's clock is a fixed day in
/// 2026; worker processes run on the real clock, so the wall-time bound of a run (measured
/// from its creation on the test clock) is lifted for them.
fn worker_on(db_url: &str) -> std::process::Command {
    let mut cmd = countersign_on(db_url);
    cmd.env("COUNTERSIGN_RUN_MAX_MINUTES", "1000000000");
    cmd
}

/// Kills a child process when dropped (also when a test fails half-way).
struct KillOnDrop(std::process::Child);

impl KillOnDrop {
    /// Exit status and stderr of a child that has exited.
    fn wait_with_output_ref(&mut self) -> std::process::Output {
        use std::io::Read;
        let status = self.0.wait().unwrap();
        let mut stderr = Vec::new();
        if let Some(mut e) = self.0.stderr.take() {
            e.read_to_end(&mut stderr).unwrap();
        }
        std::process::Output {
            status,
            stdout: Vec::new(),
            stderr,
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A worker process killed at `point` of the execute sequence; after a restart the step ends
/// `done` with exactly one effect at the target.
/// Returns the number of backends it ran on (the reliability report counts trials).
pub(crate) async fn crash_at(point: &str) -> usize {
    let trials = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = trials.clone();
    each_finance_app_with(&[("COUNTERSIGN_WORKERS", "0")], move |app| {
        let counted = counted.clone();
        async move {
            let (_, planner) = agent(&app, "planner-1", "planner").await;
            let mut client = Client::new(&app, &planner);
            client.connect().await;
            let (_, steps) = submit(&mut client, vec![note_step()]).await;
            let child = worker_on(&app.db_url())
                .args(["worker", "--count", "1"])
                .env("COUNTERSIGN_TEST_CRASH_AT", point)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut child = KillOnDrop(child);
            let began = Instant::now();
            while child.0.try_wait().unwrap().is_none() {
                assert!(
                    began.elapsed() < Duration::from_secs(30),
                    "the worker never reached {point}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let crashed = child.wait_with_output_ref();
            assert!(!crashed.status.success(), "the worker died at {point}");
            assert!(
                String::from_utf8_lossy(&crashed.stderr).contains(&format!("failpoint {point}"))
            );
            let step = app.store.get_step(&steps[0]).await.unwrap();
            assert_eq!(step.status, StepStatus::Running, "left mid-call at {point}");
            let expected_before = usize::from(point == "after_call");
            assert_eq!(effects(&app, "notes.draft").await, expected_before);

            // Restart: the reconciler asks the ERP by key, then (if needed) the step runs again.
            let worker = worker_on(&app.db_url())
                .args(["worker", "--count", "1", "--stale-after", "0"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let _worker = KillOnDrop(worker);
            let began = Instant::now();
            loop {
                let s = app.store.get_step(&steps[0]).await.unwrap();
                if s.status == StepStatus::Done {
                    break;
                }
                assert!(
                    began.elapsed() < Duration::from_secs(30),
                    "{point}: stuck at {s:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            drop(_worker);
            assert_eq!(
                effects(&app, "notes.draft").await,
                1,
                "exactly one effect after {point}"
            );
            let reconciled = app
                .store
                .audit_in_order(0, 1000)
                .await
                .unwrap()
                .into_iter()
                .filter(|r| r.event == "reconciled")
                .count();
            assert_eq!(reconciled, 1);
            assert!(app.store.verify_audit().await.unwrap().is_ok());
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            app
        }
    })
    .await;
    trials.load(std::sync::atomic::Ordering::SeqCst)
}

#[tokio::test]
async fn runs_worker_killed_after_the_target_applied_the_effect_reconciles_to_one_effect() {
    crash_at("after_call").await;
}

#[tokio::test]
async fn runs_worker_killed_before_calling_the_target_runs_the_step_once_after_restart() {
    crash_at("before_call").await;
}

/// `steps` planned note.draft steps in runs of ten, executed by `workers` real worker
/// processes: every step done exactly once (one start, one effect), none left running after the
/// workers stop cleanly (SIGTERM).
pub(crate) async fn many_workers(app: &TestApp, workers: usize, steps: usize) {
    use countersign_core::store::{NewRun, NewStep};
    use countersign_core::{CanonicalJson, Effect};
    // The runs are made here, not planned: their agent holds the steps' role itself.
    let (planner, _) = agent(app, "planner-load", "worker.comms").await;
    let mut ids = Vec::new();
    for r in 0..steps.div_ceil(10) {
        let run = app
            .store
            .create_run(&NewRun {
                tenant: "acme".into(),
                principal: format!("agent:{planner}"),
                agent_id: Some(planner.clone()),
                task: format!("load run {r}"),
                origin: "user".into(),
                planned: true,
            })
            .await
            .unwrap();
        for s in 0..10.min(steps - r * 10) {
            let inputs = CanonicalJson::from_value(
                &json!({"invoice_id": INV, "text": format!("note {r}/{s}")}),
            )
            .unwrap();
            let (step, _) = app
                .store
                .open_step(&NewStep {
                    run_id: run.id.clone(),
                    role: "worker.comms".into(),
                    tool: "note.draft".into(),
                    effect: Effect::Write,
                    inputs,
                    agent_id: Some(planner.clone()),
                    reason: String::new(),
                    evidence: vec![],
                    observed: None,
                    trace_id: "load".into(),
                    status: StepStatus::Pending,
                })
                .await
                .unwrap();
            ids.push(step.id);
        }
    }
    let procs: Vec<KillOnDrop> = (0..workers)
        .map(|_| {
            KillOnDrop(
                worker_on(&app.db_url())
                    .args(["worker", "--count", "1"])
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    let began = Instant::now();
    loop {
        let done = app.store.count_steps(StepStatus::Done).await.unwrap();
        if done as usize == steps {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(240),
            "only {done} of {steps} steps done"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for p in &procs {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &p.0.id().to_string()])
            .status();
    }
    for mut p in procs {
        let status = p.0.wait().unwrap();
        assert!(status.success(), "a worker did not stop cleanly: {status}");
    }
    assert_eq!(app.store.count_steps(StepStatus::Running).await.unwrap(), 0);
    assert_eq!(effects(app, "notes.draft").await, steps);
    let started = app
        .store
        .audit_in_order(0, 100_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.event == "started")
        .count();
    assert_eq!(started, steps, "each step started exactly once");
    for id in ids.iter().step_by(97) {
        assert_eq!(app.store.get_step(id).await.unwrap().attempts, 1);
    }
}

#[tokio::test]
async fn runs_many_workers_execute_each_step_exactly_once() {
    for backend in [
        countersign_core::Backend::Sqlite,
        countersign_core::Backend::Postgres,
    ] {
        let registry = crate::helpers::example("finance");
        let env = [
            ("COUNTERSIGN_REGISTRY", registry.as_str()),
            ("COUNTERSIGN_WORKERS", "0"),
        ];
        let Some(app) = crate::helpers::spawn_app_with(backend, &env).await else {
            continue;
        };
        // Postgres: 4 workers x 2,000 steps. SQLite: one writer, 500 steps.
        match backend {
            countersign_core::Backend::Postgres => many_workers(&app, 4, 2000).await,
            countersign_core::Backend::Sqlite => many_workers(&app, 1, 500).await,
        }
        app.stop().await;
    }
}

#[tokio::test]
async fn runs_a_failed_step_compensates_earlier_writes_or_escalates() {
    use countersign::adapters::builtin::{Fault, FaultMode, inject_fault};
    let (hook, told) = crate::helpers::webhook_sink().await;
    let env = [("COUNTERSIGN_WEBHOOK_URLS", hook.as_str())];
    each_finance_app_with(&env, |app| {
        let told = told.clone();
        async move {
            told.lock().unwrap().clear();
            let (_, planner) = agent(&app, "planner-1", "planner").await;
            let mut client = Client::new(&app, &planner);
            client.connect().await;
            let fail = Fault {
                mode: FaultMode::Fail,
                times: 1,
            };
            // The note is drafted, then the hold fails for good: the note is discarded.
            inject_fault(&app.store, ERP, "invoices.hold", &fail)
                .await
                .unwrap();
            let hold = json!({"tool": "invoice.hold", "arguments": crate::mcp::hold(json!(500)),
                          "reason": "Dispute on line 1 quantities received"});
            let (run, steps) = submit(&mut client, vec![note_step(), hold]).await;
            wait_for(&app, &steps[1], StepStatus::Failed).await;
            let began = Instant::now();
            loop {
                let all = app.store.steps_for_run(&run).await.unwrap();
                if all.len() == 3 && all[2].status == StepStatus::Done {
                    assert_eq!(all[2].tool, "note.discard");
                    break;
                }
                assert!(
                    began.elapsed() < Duration::from_secs(20),
                    "no compensation: {all:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let note = app
                .store
                .demo_get(ERP, "note", "NOTE-00000001")
                .await
                .unwrap()
                .unwrap();
            assert!(note.data.contains("\"discarded\""), "{}", note.data);
            assert_eq!(
                app.store.get_run(&run).await.unwrap().status,
                RunStatus::Failed
            );
            // The compensation is recorded once its step is done (the record follows it).
            let began = Instant::now();
            let compensated: Vec<_> = loop {
                let found: Vec<_> = app
                    .store
                    .audit_for_run(&run)
                    .await
                    .unwrap()
                    .into_iter()
                    .filter(|r| r.event == "compensated")
                    .collect();
                if !found.is_empty() || began.elapsed() > Duration::from_secs(20) {
                    break found;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            assert_eq!(compensated.len(), 1);
            assert_eq!(compensated[0].rule.as_deref(), Some("compensation.done"));
            assert_eq!(compensated[0].step_id.as_deref(), Some(steps[0].as_str()));

            // A hold has no compensating tool: when the note after it fails, a person is asked.
            inject_fault(&app.store, ERP, "notes.draft", &fail)
                .await
                .unwrap();
            let hold = json!({"tool": "invoice.hold", "arguments": {"invoice_id": "INV-20260612",
            "amount": 100, "currency": "EUR", "reason": REASON},
            "reason": "Dispute on the freight surcharge"});
            let note = json!({"tool": "note.draft", "arguments": {"invoice_id": "INV-20260612",
            "text": "Held for the surcharge."}, "reason": "Tell AP why the invoice is held"});
            let (run, steps) = submit(&mut client, vec![hold, note]).await;
            wait_for(&app, &steps[1], StepStatus::Failed).await;
            let began = Instant::now();
            while !app.store.get_run(&run).await.unwrap().replan {
                assert!(began.elapsed() < Duration::from_secs(20), "never escalated");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let escalated = app
                .store
                .audit_for_run(&run)
                .await
                .unwrap()
                .into_iter()
                .filter(|r| r.rule.as_deref() == Some("compensation.escalated"))
                .count();
            assert_eq!(escalated, 1);
            // The people on the webhooks are told which step of which run needs them (and only
            // about the escalation: the discarded note was undone without them).
            let began = Instant::now();
            let bodies = loop {
                let bodies: Vec<Value> = told
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|b| b["event"] == "compensation_escalated")
                    .cloned()
                    .collect();
                if !bodies.is_empty() || began.elapsed() > Duration::from_secs(10) {
                    break bodies;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            assert_eq!(bodies.len(), 1, "{bodies:?}");
            assert_eq!(bodies[0]["step_id"], steps[0].as_str());
            assert_eq!(bodies[0]["run_id"], run.as_str());
            assert_eq!(bodies[0]["tool"], "invoice.hold");
            assert_eq!(bodies[0]["after_failed_step"], steps[1].as_str());
            let text = bodies[0]["text"].as_str().unwrap();
            assert!(text.contains(&format!("/runs/{run}")), "{text}");
            assert!(
                !bodies[0].to_string().contains("surcharge"),
                "no inputs: {}",
                bodies[0]
            );
            app
        }
    })
    .await;
}

#[tokio::test]
async fn runs_stop_at_their_spend_bound_before_the_step_that_would_break_it() {
    // At most 1,000.00 EUR per run.
    each_finance_app_with(&[("COUNTERSIGN_RUN_MAX_SPEND", "100000")], |app| async move {
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let hold = |invoice: &str, amount: f64| {
            json!({"tool": "invoice.hold", "arguments": {"invoice_id": invoice, "amount": amount,
                   "currency": "EUR", "reason": REASON}, "reason": "Dispute on delivered quantities"})
        };
        let (run, steps) = submit(
            &mut client,
            vec![hold("INV-20260611", 500.0), hold("INV-20260612", 600.0)],
        )
        .await;
        wait_for(&app, &steps[0], StepStatus::Done).await;
        wait_for(&app, &steps[1], StepStatus::Cancelled).await;
        assert_eq!(app.store.get_run(&run).await.unwrap().status, RunStatus::Failed);
        assert_eq!(app.store.get_run(&run).await.unwrap().reason, "bounds.spend");
        assert_eq!(effects(&app, "invoices.hold").await, 1);
        let refused = app
            .store
            .audit_for_run(&run)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.rule.as_deref() == Some("bounds.spend"))
            .count();
        assert_eq!(refused, 1);
        app
    })
    .await;
}

#[tokio::test]
async fn runs_worker_killed_right_after_taking_the_step_and_its_key_runs_it_once() {
    crash_at("after_start").await;
}

/// Cancellation race (issue 5): cancelling while a step is in flight lets that step finish
/// (one effect, recorded), and no later step starts — neither the plan's next step nor a
/// call the agent makes in the cancelled run afterwards.
#[tokio::test]
async fn runs_cancel_while_a_step_is_in_flight_lets_it_finish_and_starts_nothing_after() {
    use countersign::adapters::builtin::{Fault, FaultMode, inject_fault};
    each_finance_app(|app| async move {
        inject_fault(
            &app.store,
            ERP,
            "notes.draft",
            &Fault {
                mode: FaultMode::Slow,
                times: 1,
            },
        )
        .await
        .unwrap();
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let second = json!({"tool": "note.draft",
            "arguments": {"invoice_id": INV, "text": "Second note, must never be written."},
            "reason": "A later step of the same run"});
        let (run, steps) = submit(&mut client, vec![note_step(), second]).await;
        wait_for(&app, &steps[0], StepStatus::Running).await;
        let reply = client
            .call(
                "run.cancel",
                json!({"run_id": run, "reason": "Cancelled while the first note is being written"}),
            )
            .await;
        assert_eq!(content(&reply)["cancelled_steps"], 1, "{reply}");
        // The in-flight step finishes: one effect, recorded as done.
        wait_for(&app, &steps[0], StepStatus::Done).await;
        assert_eq!(effects(&app, "notes.draft").await, 1);
        assert_eq!(
            app.store.get_step(&steps[1]).await.unwrap().status,
            StepStatus::Cancelled
        );
        // A direct call in the cancelled run is refused before anything runs.
        let late = client
            .call_meta(
                "invoice.get",
                json!({"invoice_id": INV}),
                json!({"run_id": run}),
            )
            .await;
        assert_eq!(content(&late)["status"], "cancelled", "{late}");
        assert_eq!(content(&late)["rule"], "run.cancelled", "{late}");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            effects(&app, "notes.draft").await,
            1,
            "nothing after the cancel"
        );
        assert_eq!(
            app.store.get_run(&run).await.unwrap().status,
            RunStatus::Cancelled,
            "the finished step does not reopen the run"
        );
        let trail = app.store.audit_for_run(&run).await.unwrap();
        let events: Vec<(&str, Option<&str>)> = trail
            .iter()
            .filter(|r| r.step_id.as_deref() == Some(steps[0].as_str()))
            .map(|r| (r.event.as_str(), r.rule.as_deref()))
            .collect();
        assert!(
            events.iter().any(|(e, _)| *e == "succeeded"),
            "the in-flight step's outcome is recorded: {events:?}"
        );
        app
    })
    .await;
}

#[tokio::test]
async fn runs_a_read_that_raced_the_emergency_stop_is_cancelled_and_its_result_withheld() {
    use countersign::adapters::builtin::{Fault, FaultMode, inject_fault};
    use countersign::stop::EMERGENCY_STOP;
    each_finance_app(|app| async move {
        inject_fault(
            &app.store,
            ERP,
            "invoices.get",
            &Fault {
                mode: FaultMode::Slow,
                times: 1,
            },
        )
        .await
        .unwrap();
        let (_, clerk) = agent(&app, "reader-1", "worker.finance").await;
        let mut client = Client::new(&app, &clerk);
        client.connect().await;
        // The stop goes on while the (slow) read is at the target: it had started, so it
        // is not prevented, but its closing write sees the stop and withholds the result.
        let store = app.store.clone();
        let stopper = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            store
                .set_switch(EMERGENCY_STOP, "stop during a read", "test")
                .await
                .unwrap();
        });
        let reply = client.call("invoice.get", json!({"invoice_id": INV})).await;
        stopper.await.unwrap();
        let out = content(&reply);
        assert_eq!(out["status"], "cancelled", "{reply}");
        assert_eq!(out["rule"], "emergency.stop", "{reply}");
        assert!(
            !reply.to_string().contains("PO-77812"),
            "the invoice is withheld: {reply}"
        );
        let step_id = out["step_id"].as_str().unwrap().to_string();
        let step = app.store.get_step(&step_id).await.unwrap();
        assert_eq!(step.status, StepStatus::Cancelled);
        let trail = app.store.audit_for_run(&step.run_id).await.unwrap();
        let events: Vec<(&str, Option<&str>)> = trail
            .iter()
            .filter(|r| r.step_id.as_deref() == Some(step_id.as_str()))
            .map(|r| (r.event.as_str(), r.rule.as_deref()))
            .collect();
        assert_eq!(
            events,
            vec![("cancelled", Some("emergency.stop"))],
            "no success is recorded for a withheld read"
        );
        // While the stop is on, a read does not even start.
        let again = client.call("invoice.get", json!({"invoice_id": INV})).await;
        assert_eq!(content(&again)["rule"], "emergency.stop", "{again}");
        app
    })
    .await;
}

#[tokio::test]
async fn runs_stop_after_their_bound_of_failures_in_a_row() {
    use countersign::adapters::builtin::{Fault, FaultMode, inject_fault};
    each_finance_app_with(&[("COUNTERSIGN_RUN_MAX_FAILURES", "2")], |app| async move {
        inject_fault(
            &app.store,
            ERP,
            "notes.draft",
            &Fault {
                mode: FaultMode::Unavailable,
                times: 10,
            },
        )
        .await
        .unwrap();
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let (run, steps) = submit(&mut client, vec![note_step()]).await;
        // Each failed attempt is retried after a backoff on the test's clock: move it on.
        let deadline = Instant::now() + Duration::from_secs(30);
        while app.store.get_step(&steps[0]).await.unwrap().status != StepStatus::Cancelled {
            assert!(
                Instant::now() < deadline,
                "the run never hit its failures bound"
            );
            app.clock.advance(chrono::Duration::seconds(30));
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let stopped = app.store.get_run(&run).await.unwrap();
        assert_eq!(stopped.status, RunStatus::Failed);
        assert_eq!(stopped.reason, "bounds.failures");
        let trail = app.store.audit_for_run(&run).await.unwrap();
        let failed = trail.iter().filter(|r| r.event == "failed").count();
        assert_eq!(failed, 2, "two attempts failed, the third never started");
        assert_eq!(
            trail
                .iter()
                .filter(|r| r.rule.as_deref() == Some("bounds.failures"))
                .count(),
            1
        );
        assert_eq!(effects(&app, "notes.draft").await, 0);
        app
    })
    .await;
}

/// The records of `step` with `event`.
async fn records_of(
    app: &TestApp,
    run: &str,
    step: &str,
    event: &str,
) -> Vec<countersign_core::audit::AuditRecord> {
    app.store
        .audit_for_run(run)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.step_id.as_deref() == Some(step) && r.event == event)
        .collect()
}

#[tokio::test]
async fn runs_a_step_failed_for_good_stays_failed_for_a_second_holder() {
    use countersign::adapters::builtin::{Fault, FaultMode, inject_fault};
    each_finance_app_with(&[("COUNTERSIGN_WORKERS", "0")], |app| async move {
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        // The target refuses the hold: a business answer, never retried.
        let fail = Fault {
            mode: FaultMode::Fail,
            times: 1,
        };
        inject_fault(&app.store, ERP, "invoices.hold", &fail)
            .await
            .unwrap();
        let hold = json!({"tool": "invoice.hold", "arguments": crate::mcp::hold(json!(500)),
                          "reason": "Dispute on line 1 quantities received"});
        let (run, steps) = submit(&mut client, vec![hold]).await;
        // Two workers hold the same pending step: the first one's lease ran out before it
        // started (a stalled worker), so the second claimed it too.
        let now = app.store.clock().now_ms();
        let first = app
            .store
            .claim_step("w1", now - 1, None)
            .await
            .unwrap()
            .unwrap();
        let second = app
            .store
            .claim_step("w2", now + 60_000, None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.id, steps[0]);
        assert_eq!(second.id, steps[0]);
        let a = countersign::pipeline::execute_claimed(&app.state, first, "w1")
            .await
            .unwrap();
        assert_eq!(
            app.store.get_step(&steps[0]).await.unwrap().status,
            StepStatus::Failed,
            "{a:?}"
        );
        let b = countersign::pipeline::execute_claimed(&app.state, second, "w2")
            .await
            .unwrap();
        let step = app.store.get_step(&steps[0]).await.unwrap();
        assert_eq!(
            step.status,
            StepStatus::Failed,
            "the second holder's copy was stale: {b:?}"
        );
        assert_eq!(step.attempts, 1, "no second attempt");
        assert!(
            records_of(&app, &run, &steps[0], "succeeded")
                .await
                .is_empty()
        );
        assert_eq!(records_of(&app, &run, &steps[0], "started").await.len(), 1);
        assert_eq!(effects(&app, "invoices.hold").await, 0);
        app
    })
    .await;
}

#[tokio::test]
async fn runs_a_revoked_agents_planned_steps_never_start() {
    each_finance_app(|app| async move {
        let (planner_id, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let (run, steps) =
            submit(&mut client, vec![payment_step(json!(4180.00)), note_step()]).await;
        wait_for(&app, &steps[0], StepStatus::NeedsApproval).await;
        // The planner's credential leaks and is revoked while its payment waits for a person.
        app.store.revoke_agent(&planner_id, "test").await.unwrap();
        crate::helpers::decide_signed(
            &app,
            &steps[0],
            &crate::gateway::ana(),
            &crate::gateway::signed(),
            Verdict::Approved,
            "matches the PO",
        )
        .await
        .unwrap();
        wait_for(&app, &steps[0], StepStatus::Refused).await;
        let step = app.store.get_step(&steps[0]).await.unwrap();
        assert_eq!(step.rule.as_deref(), Some("agent.revoked"));
        assert_eq!(records_of(&app, &run, &steps[0], "refused").await.len(), 1);
        assert!(
            records_of(&app, &run, &steps[0], "started")
                .await
                .is_empty()
        );
        let began = Instant::now();
        while app.store.get_run(&run).await.unwrap().status == RunStatus::Active {
            assert!(
                began.elapsed() < Duration::from_secs(20),
                "the run never ended"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(effects(&app, "payments.schedule").await, 0);
        assert_eq!(effects(&app, "notes.draft").await, 0);
        assert_ne!(
            app.store.get_step(&steps[1]).await.unwrap().status,
            StepStatus::Done
        );
        app
    })
    .await;
}

/// A direct write naming a planned run is refused (`run.planned`, audited): it would run a
/// planned step out of turn (here while the step before it waits for a person) or add a step
/// the plan never had. A read there is still answered.
#[tokio::test]
async fn runs_refuse_a_direct_write_into_a_planned_run() {
    each_finance_app(|app| async move {
        // The planner may also draft notes, so only the run decides.
        crate::helpers::use_finance_registry_with(
            &app,
            "gate: never\n    roles: [worker.finance, worker.comms]\n    handler: {provider: erp, operation: notes.draft}",
            "gate: never\n    roles: [planner, worker.finance, worker.comms]\n    handler: {provider: erp, operation: notes.draft}",
        )
        .await;
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let note = json!({"invoice_id": "INV-20260611", "text": "Planned second"});
        let hold = json!({"tool": "invoice.hold", "arguments": crate::mcp::hold(json!(1500)),
                          "reason": "Dispute on line 1 quantities received"});
        let draft = json!({"tool": "note.draft", "arguments": note.clone(),
                           "reason": "Note the dispute once the hold is in place"});
        let (run, steps) = submit(&mut client, vec![hold, draft]).await;
        wait_for(&app, &steps[0], StepStatus::NeedsApproval).await;
        for arguments in [note, json!({"invoice_id": "INV-20260611", "text": "Not planned"})] {
            let reply = client
                .call_meta("note.draft", arguments, json!({"run_id": run}))
                .await;
            let body = content(&reply);
            assert_eq!(body["status"], "refused", "{reply}");
            assert_eq!(body["rule"], "run.planned", "{reply}");
        }
        assert_eq!(effects(&app, "notes.draft").await, 0);
        let second = app.store.get_step(&steps[1]).await.unwrap();
        assert_eq!(second.status, StepStatus::Pending);
        assert_eq!(app.store.steps_for_run(&run).await.unwrap().len(), 2);
        let refusals = app.store.audit_for_run(&run).await.unwrap();
        let refusals = refusals
            .iter()
            .filter(|r| r.event == "refused" && r.rule.as_deref() == Some("run.planned"));
        assert_eq!(refusals.count(), 2, "each refusal in the run's trail");
        // A read in the planned run is still answered.
        let reply = client
            .call_meta(
                "invoice.get",
                json!({"invoice_id": "INV-20260611"}),
                json!({"run_id": run}),
            )
            .await;
        assert_eq!(reply["result"]["isError"], false, "{reply}");
        app
    })
    .await;
}

#[tokio::test]
async fn runs_a_planned_step_meets_the_schema_in_force_when_it_runs() {
    each_finance_app(|app| async move {
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        // A hold above the policy's gate waits for a person; meanwhile the registry tightens
        // the hold's schema below its amount.
        let hold = json!({"tool": "invoice.hold", "arguments": crate::mcp::hold(json!(1500)),
                          "reason": "Dispute on line 1 quantities received"});
        let (run, steps) = submit(&mut client, vec![hold]).await;
        wait_for(&app, &steps[0], StepStatus::NeedsApproval).await;
        crate::helpers::use_finance_registry_with(
            &app,
            "amount: {type: number, exclusiveMinimum: 0, maximum: 50000}",
            "amount: {type: number, exclusiveMinimum: 0, maximum: 1000}",
        )
        .await;
        crate::helpers::decide_signed(
            &app,
            &steps[0],
            &crate::gateway::ana(),
            &crate::gateway::signed(),
            Verdict::Approved,
            "the dispute is real",
        )
        .await
        .unwrap();
        wait_for(&app, &steps[0], StepStatus::Refused).await;
        let step = app.store.get_step(&steps[0]).await.unwrap();
        assert_eq!(step.rule.as_deref(), Some("input.schema"));
        let refused = records_of(&app, &run, &steps[0], "refused").await;
        assert_eq!(refused.len(), 1);
        assert!(
            refused[0].record.contains("/amount"),
            "{}",
            refused[0].record
        );
        assert_eq!(effects(&app, "invoices.hold").await, 0);
        app
    })
    .await;
}

#[tokio::test]
async fn runs_a_planned_read_the_target_rejects_is_not_retried() {
    use countersign::adapters::builtin::{Fault, FaultMode, inject_fault};
    each_finance_app(|app| async move {
        inject_fault(
            &app.store,
            ERP,
            "invoices.get",
            &Fault {
                mode: FaultMode::Fail,
                times: 10,
            },
        )
        .await
        .unwrap();
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let read = json!({"tool": "invoice.get", "arguments": {"invoice_id": INV},
                          "reason": "Read the invoice before deciding anything"});
        let (run, steps) = submit(&mut client, vec![read]).await;
        let began = Instant::now();
        while app.store.get_run(&run).await.unwrap().status == RunStatus::Active {
            assert!(
                began.elapsed() < Duration::from_secs(20),
                "the run never ended"
            );
            // A retry would wait for its backoff on the test's clock: let it come due.
            app.clock.advance(chrono::Duration::seconds(30));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let ended = app.store.get_run(&run).await.unwrap();
        assert_eq!(ended.status, RunStatus::Failed);
        assert_ne!(
            ended.reason, "bounds.failures",
            "ended by its own failure: {}",
            ended.reason
        );
        assert_eq!(
            records_of(&app, &run, &steps[0], "failed").await.len(),
            1,
            "one attempt"
        );
        assert_eq!(
            app.store.get_step(&steps[0]).await.unwrap().status,
            StepStatus::Failed
        );
        app
    })
    .await;
}

#[tokio::test]
async fn runs_a_revalidation_failure_never_shows_a_redacted_value_in_clear() {
    use countersign_core::approvals::{Approver, Decider};
    each_finance_app(|app| async move {
        let supplier = app
            .store
            .demo_get(ERP, "supplier", "SUP-000417")
            .await
            .unwrap()
            .unwrap();
        let data: Value = serde_json::from_str(&supplier.data).unwrap();
        let current = data["iban"].as_str().unwrap().to_string();
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        // The planner claims to have seen another IBAN on file: the re-read before the change
        // finds the real one, and fails closed.
        let args = json!({"supplier_id": "SUP-000417", "iban": "DE89370400440532013000",
                          "reason": "The supplier's signed letter asks for the new IBAN"});
        let change = json!({"tool": "supplier.update_iban", "arguments": args,
            "reason": "The supplier's signed letter asks for the new IBAN",
            "observed": [{"field": "iban", "value": "FR1420041010050500013M02606"}]});
        let (run, steps) = submit(&mut client, vec![change]).await;
        wait_for(&app, &steps[0], StepStatus::NeedsApproval).await;
        let registry = countersign_core::Registry::from_path(std::path::Path::new(&format!(
            "{}/registry.yaml",
            crate::helpers::example("finance")
        )))
        .unwrap();
        let tool = registry
            .tool(&countersign_core::ToolName::parse("supplier.update_iban").unwrap())
            .unwrap();
        let rules = countersign::pipeline::gate_rules(tool, &args);
        let now = app.store.clock().now_ms();
        for sub in ["pat", "kim"]
            .into_iter()
            .take(rules.approvals_needed as usize)
        {
            let decider = Decider {
                approver: Approver {
                    iss: "https://idp.example".into(),
                    sub: sub.into(),
                },
                roles: vec!["approver".into()],
                auth_time: now,
                auth_time_unknown: false,
            };
            app.store
                .decide_step(
                    &steps[0],
                    &decider,
                    &rules,
                    Verdict::Approved,
                    "called the supplier",
                )
                .await
                .unwrap();
        }
        wait_for(&app, &steps[0], StepStatus::Failed).await;
        let step = app.store.get_step(&steps[0]).await.unwrap();
        assert_eq!(step.rule.as_deref(), Some("state.changed"), "{step:?}");
        assert_eq!(effects(&app, "suppliers.update_iban").await, 0);
        let failed = records_of(&app, &run, &steps[0], "failed").await;
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0].record.contains("\"field\":\"iban\""),
            "{}",
            failed[0].record
        );
        for r in app.store.audit_for_run(&run).await.unwrap() {
            assert!(
                !r.record.contains(&current),
                "the IBAN on file in clear: {}",
                r.record
            );
        }
        let outcome = step.outcome.unwrap_or_default();
        assert!(!outcome.contains(&current), "{outcome}");
        assert!(
            !outcome.contains("FR1420041010050500013M02606"),
            "{outcome}"
        );
        let status = client.call("run.status", json!({"run_id": run})).await;
        assert!(!status.to_string().contains(&current), "{status}");
        app
    })
    .await;
}

#[tokio::test]
async fn runs_a_write_that_checked_before_the_emergency_stop_does_not_start_after_it() {
    each_finance_app_with(&[("COUNTERSIGN_WORKERS", "0")], |app| async move {
        // Postgres only: the test holds the audit chain's append lock from its own session.
        if app.store.backend() != countersign_core::Backend::Postgres {
            return app;
        }
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let (run, steps) = submit(&mut client, vec![note_step()]).await;
        // The step's start (its records) waits for the append lock: the worker has read the
        // world (stop off) and decided policy by then.
        let mut holder = hold_append_lock(&app).await;
        let state = app.state.clone();
        let worker = tokio::spawn(async move {
            countersign::executor::work_once(
                &state,
                "w1",
                countersign::executor::Timings::default(),
            )
            .await
        });
        wait_for_lock_waiter(&mut holder, "the step never tried to start").await;
        // The operator pulls the emergency stop now, then the lock is let go.
        app.store
            .set_switch(countersign::stop::EMERGENCY_STOP, "test", "ops")
            .await
            .unwrap();
        release_append_lock(&mut holder).await;
        worker.await.unwrap().unwrap();
        let step = app.store.get_step(&steps[0]).await.unwrap();
        assert_eq!(step.status, StepStatus::Cancelled, "{step:?}");
        assert_eq!(step.rule.as_deref(), Some("emergency.stop"));
        assert!(
            records_of(&app, &run, &steps[0], "started")
                .await
                .is_empty()
        );
        assert_eq!(effects(&app, "notes.draft").await, 0);
        // The worker leaves the run to the stop's own pass: it ends `stopped` (not `failed`)
        // and its agent is revoked.
        assert_eq!(
            app.store.get_run(&run).await.unwrap().status,
            RunStatus::Active
        );
        countersign::stop::emergency_stop(
            &app.state,
            &countersign_core::store::StopScope::Platform,
            "ops",
            "test",
        )
        .await
        .unwrap();
        assert_eq!(
            app.store.get_run(&run).await.unwrap().status,
            RunStatus::Stopped
        );
        app
    })
    .await;
}

#[tokio::test]
async fn runs_stopped_at_a_bound_compensate_their_earlier_writes() {
    use countersign::adapters::builtin::{Fault, FaultMode, inject_fault};
    each_finance_app_with(&[("COUNTERSIGN_RUN_MAX_FAILURES", "2")], |app| async move {
        inject_fault(
            &app.store,
            ERP,
            "invoices.hold",
            &Fault {
                mode: FaultMode::Unavailable,
                times: 10,
            },
        )
        .await
        .unwrap();
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let hold = json!({"tool": "invoice.hold", "arguments": crate::mcp::hold(json!(500)),
                          "reason": "Dispute on line 1 quantities received"});
        let (run, steps) = submit(&mut client, vec![note_step(), hold]).await;
        wait_for(&app, &steps[0], StepStatus::Done).await;
        // The hold keeps failing (retryable) until the run's bound of failures stops it.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let all = app.store.steps_for_run(&run).await.unwrap();
            if all
                .iter()
                .any(|s| s.tool == "note.discard" && s.status == StepStatus::Done)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the note was never discarded: {all:?}"
            );
            app.clock.advance(chrono::Duration::seconds(30));
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let stopped = app.store.get_run(&run).await.unwrap();
        assert_eq!(stopped.status, RunStatus::Failed);
        assert_eq!(stopped.reason, "bounds.failures");
        let note = app
            .store
            .demo_get(ERP, "note", "NOTE-00000001")
            .await
            .unwrap()
            .unwrap();
        assert!(note.data.contains("\"discarded\""), "{}", note.data);
        assert_eq!(effects(&app, "invoices.hold").await, 0);
        app
    })
    .await;
}

/// A step of `tool` in a new run of its own, moved to `status` with `attempts` spent.
async fn step_in(
    app: &TestApp,
    role: &str,
    tool: &str,
    effect: countersign_core::Effect,
    inputs: Value,
    status: StepStatus,
    attempts: usize,
) -> countersign_core::store::Step {
    use countersign_core::store::{NewRun, NewStep, Transition};
    let run = app
        .store
        .create_run(&NewRun {
            tenant: "acme".into(),
            principal: "agent:test".into(),
            agent_id: None,
            task: "reconcile".into(),
            origin: "user".into(),
            planned: false,
        })
        .await
        .unwrap();
    let (step, _) = app
        .store
        .open_step(&NewStep {
            run_id: run.id,
            role: role.into(),
            tool: tool.into(),
            effect,
            inputs: countersign_core::CanonicalJson::from_value(&inputs).unwrap(),
            agent_id: None,
            reason: String::new(),
            evidence: vec![],
            observed: None,
            trace_id: "t".into(),
            status: StepStatus::Pending,
        })
        .await
        .unwrap();
    for _ in 0..attempts {
        app.store
            .transition(&Transition {
                step_id: step.id.clone(),
                from: vec![StepStatus::Pending],
                to: Some(StepStatus::Pending),
                bump_attempts: true,
                ..Transition::default()
            })
            .await
            .unwrap()
            .unwrap();
    }
    app.store
        .transition(&Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending],
            to: Some(status),
            ..Transition::default()
        })
        .await
        .unwrap()
        .unwrap();
    app.store.get_step(&step.id).await.unwrap()
}

#[tokio::test]
async fn runs_the_reconciler_walks_past_steps_it_cannot_settle() {
    use countersign_core::Effect;
    each_finance_app_with(&[("COUNTERSIGN_WORKERS", "0")], |app| async move {
        // 101 unknown steps of a tool the registry no longer has: nobody can ask about them.
        for i in 0..101 {
            step_in(
                &app,
                "worker.finance",
                "ghost.tool",
                Effect::Irreversible,
                json!({"n": i}),
                StepStatus::Unknown,
                1,
            )
            .await;
        }
        app.clock.advance(chrono::Duration::seconds(1));
        // A note drafted at the target whose worker died before recording it: `running`.
        let (_, fin) = agent(&app, "comms-1", "worker.comms").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let reply = client
            .call(
                "note.draft",
                json!({"invoice_id": INV, "text": "Held for review."}),
            )
            .await;
        let step_id = content(&reply)["step_id"].as_str().map(str::to_string);
        let steps = app
            .store
            .steps_in_status(StepStatus::Done, 10)
            .await
            .unwrap();
        let note = steps
            .iter()
            .find(|s| s.tool == "note.draft" && step_id.as_deref().is_none_or(|id| id == s.id))
            .unwrap_or_else(|| panic!("no note step: {reply}"))
            .clone();
        app.store
            .transition(&countersign_core::store::Transition {
                step_id: note.id.clone(),
                from: vec![StepStatus::Done],
                to: Some(StepStatus::Running),
                ..countersign_core::store::Transition::default()
            })
            .await
            .unwrap()
            .unwrap();
        app.clock.advance(chrono::Duration::seconds(1));
        let timings = countersign::executor::Timings {
            stale_after: Duration::ZERO,
            ..countersign::executor::Timings::default()
        };
        let settled = countersign::executor::reconcile_once(&app.state, timings)
            .await
            .unwrap();
        assert_eq!(settled, 1, "the note, found at the target by its key");
        assert_eq!(
            app.store.get_step(&note.id).await.unwrap().status,
            StepStatus::Done
        );
        assert_eq!(effects(&app, "notes.draft").await, 1);
        app
    })
    .await;
}

#[tokio::test]
async fn runs_an_unknown_call_the_target_never_got_is_not_resent_once_its_attempts_are_spent() {
    use countersign_core::Effect;
    each_finance_app_with(&[("COUNTERSIGN_WORKERS", "0")], |app| async move {
        let args = payment(json!(4180.00));
        let spent = step_in(
            &app,
            "worker.finance",
            "payment.schedule",
            Effect::Irreversible,
            args.clone(),
            StepStatus::Unknown,
            4,
        )
        .await;
        let mut other = args.clone();
        other["value_date"] = json!("2026-06-16");
        let fresh = step_in(
            &app,
            "worker.finance",
            "payment.schedule",
            Effect::Irreversible,
            other,
            StepStatus::Unknown,
            1,
        )
        .await;
        let settled = countersign::executor::reconcile_once(
            &app.state,
            countersign::executor::Timings::default(),
        )
        .await
        .unwrap();
        assert_eq!(settled, 2);
        // The target never got either: one may be sent again, the other has no attempt left.
        assert_eq!(
            app.store.get_step(&fresh.id).await.unwrap().status,
            StepStatus::Pending
        );
        let spent = app.store.get_step(&spent.id).await.unwrap();
        assert_eq!(spent.status, StepStatus::Failed, "{spent:?}");
        assert_eq!(spent.rule.as_deref(), Some("target.failed"));
        assert!(
            spent
                .outcome
                .unwrap_or_default()
                .contains("attempts.exhausted")
        );
        assert_eq!(effects(&app, "payments.schedule").await, 0);
        app
    })
    .await;
}

#[tokio::test]
async fn runs_a_reviewer_sees_planned_inputs_with_redacted_fields_hidden() {
    each_finance_app(|app| async move {
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let iban = "DE89370400440532013000";
        let change = json!({"tool": "supplier.update_iban",
            "arguments": {"supplier_id": "SUP-000417", "iban": iban,
                          "reason": "The supplier's signed letter asks for the new IBAN"},
            "reason": "The supplier's signed letter asks for the new IBAN"});
        let (_, steps) = submit(&mut client, vec![change]).await;
        wait_for(&app, &steps[0], StepStatus::NeedsApproval).await;
        let (_, reviewer) = agent(&app, "reviewer-1", "reviewer").await;
        let mut rev = Client::new(&app, &reviewer);
        rev.connect().await;
        let listed = rev.call("step.list", json!({})).await;
        let step = content(&listed)["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["step_id"] == steps[0].as_str())
            .unwrap_or_else(|| panic!("{listed}"))
            .clone();
        assert_eq!(step["inputs"]["supplier_id"], "SUP-000417", "{step}");
        assert!(!listed.to_string().contains(iban), "{listed}");
        app
    })
    .await;
}

#[tokio::test]
async fn runs_a_step_cancelled_with_its_run_while_a_worker_held_it_compensates_nothing() {
    each_finance_app_with(&[("COUNTERSIGN_WORKERS", "0")], |app| async move {
        // Postgres only: the test holds the audit chain's append lock from its own session.
        if app.store.backend() != countersign_core::Backend::Postgres {
            return app;
        }
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let hold = json!({"tool": "invoice.hold", "arguments": crate::mcp::hold(json!(500)),
                          "reason": "Dispute on line 1 quantities received"});
        let (run, steps) = submit(&mut client, vec![note_step(), hold]).await;
        let timings = countersign::executor::Timings::default();
        assert!(
            countersign::executor::work_once(&app.state, "w1", timings)
                .await
                .unwrap()
        );
        assert_eq!(
            app.store.get_step(&steps[0]).await.unwrap().status,
            StepStatus::Done
        );
        // The worker takes the hold and waits for the append lock to start it; meanwhile the
        // run is cancelled (its status, as a person's cancel leaves it).
        let mut holder = hold_append_lock(&app).await;
        let state = app.state.clone();
        let worker =
            tokio::spawn(
                async move { countersign::executor::work_once(&state, "w1", timings).await },
            );
        wait_for_lock_waiter(&mut holder, "the step never tried to start").await;
        sqlx::query(
            "UPDATE runs SET status = 'cancelled', reason = 'no longer needed' WHERE id = $1",
        )
        .bind(&run)
        .execute(&mut holder)
        .await
        .unwrap();
        release_append_lock(&mut holder).await;
        worker.await.unwrap().unwrap();
        let step = app.store.get_step(&steps[1]).await.unwrap();
        assert_eq!(step.status, StepStatus::Cancelled, "{step:?}");
        assert_eq!(step.rule.as_deref(), Some("run.cancelled"));
        // A cancel is not a failure: the drafted note stays, nothing is escalated.
        let all = app.store.steps_for_run(&run).await.unwrap();
        assert_eq!(all.len(), 2, "no compensation step: {all:?}");
        let trail = app.store.audit_for_run(&run).await.unwrap();
        assert!(!trail.iter().any(|r| r.event == "compensated"), "{trail:?}");
        let ended = app.store.get_run(&run).await.unwrap();
        assert!(!ended.replan);
        assert_eq!(ended.status, RunStatus::Cancelled);
        app
    })
    .await;
}

#[tokio::test]
async fn runs_a_retry_is_not_scheduled_in_a_run_that_ended_meanwhile() {
    use countersign::adapters::builtin::{Fault, FaultMode, Latency, inject_fault, set_latency};
    each_finance_app_with(&[("COUNTERSIGN_WORKERS", "0")], |app| async move {
        // Postgres only: the test holds the audit chain's append lock from its own session.
        if app.store.backend() != countersign_core::Backend::Postgres {
            return app;
        }
        // The ERP takes 1.5 s, then answers unavailable: a failure that may be retried.
        set_latency(
            &app.store,
            ERP,
            "notes.draft",
            Latency {
                before_ms: 1_500,
                after_ms: 0,
            },
        )
        .await
        .unwrap();
        inject_fault(
            &app.store,
            ERP,
            "notes.draft",
            &Fault {
                mode: FaultMode::Unavailable,
                times: 1,
            },
        )
        .await
        .unwrap();
        let (_, planner) = agent(&app, "planner-1", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let (run, steps) = submit(&mut client, vec![note_step()]).await;
        let state = app.state.clone();
        let timings = countersign::executor::Timings::default();
        let worker =
            tokio::spawn(
                async move { countersign::executor::work_once(&state, "w1", timings).await },
            );
        wait_for(&app, &steps[0], StepStatus::Running).await;
        // While the call is out, the run is cancelled; the failure is recorded after that.
        let mut holder = hold_append_lock(&app).await;
        sqlx::query(
            "UPDATE runs SET status = 'cancelled', reason = 'no longer needed' WHERE id = $1",
        )
        .bind(&run)
        .execute(&mut holder)
        .await
        .unwrap();
        wait_for_lock_waiter(&mut holder, "the failure was never recorded").await;
        release_append_lock(&mut holder).await;
        worker.await.unwrap().unwrap();
        let step = app.store.get_step(&steps[0]).await.unwrap();
        assert_eq!(
            step.status,
            StepStatus::Failed,
            "no retry in an ended run: {step:?}"
        );
        assert_eq!(effects(&app, "notes.draft").await, 0);
        app
    })
    .await;
}

/// A session of its own holding every audit chain's head row (Postgres): every write of a
/// step's records (to a chain that exists) waits for [`release_append_lock`].
async fn hold_append_lock(app: &TestApp) -> sqlx::PgConnection {
    use sqlx::Connection;
    let mut holder = sqlx::PgConnection::connect(&app.db_url()).await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT 1 FROM audit_chains FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();
    holder
}

/// Waits (at most 20 s) until some session waits for the append lock; `what` names it.
async fn wait_for_lock_waiter(holder: &mut sqlx::PgConnection, what: &str) {
    let began = Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted",
        )
        .fetch_one(&mut *holder)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(began.elapsed() < Duration::from_secs(20), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn release_append_lock(holder: &mut sqlx::PgConnection) {
    sqlx::raw_sql("COMMIT").execute(holder).await.unwrap();
}
