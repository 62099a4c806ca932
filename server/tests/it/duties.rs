//! Separation of duties (issue 29): nobody countersigns their own agent, whatever the tool's
//! `four_eyes` says; who an agent acts for and where its tasks come from are an operator's
//! data, which policy and the approval check read — on both backends.

use countersign::adapters::builtin::ERP;
use countersign_core::StepStatus;
use countersign_core::policy::TaskOrigin;
use countersign_core::store::NewAgent;
use reqwest::StatusCode;
use reqwest::header::LOCATION;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::mcp::{Client, each_finance_app, payment_for};

fn content(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

/// The demo sign-in's issuer.
const DEMO_ISSUER: &str = "urn:countersign:demo";

/// `sub` of the demo sign-in as a credential's creator or party names them.
fn demo_person(sub: &str) -> String {
    format!("person:{DEMO_ISSUER}#{sub}")
}

/// A `worker.finance` credential created by `created_by`, acting for `acts_for`; its token.
async fn worker_by(
    app: &TestApp,
    name: &str,
    created_by: &str,
    acts_for: Option<&str>,
    origin: TaskOrigin,
) -> String {
    let (_, token) = app
        .store
        .create_agent(&NewAgent {
            name: name.into(),
            role: "worker.finance".into(),
            tenant: "acme".into(),
            created_by: created_by.into(),
            expires_at: None,
            acts_for: acts_for.map(str::to_string),
            origin,
        })
        .await
        .unwrap();
    token.reveal().to_string()
}

/// Proposes a payment that must wait for a person; its step id.
async fn gated(client: &mut Client<'_>, invoice: &str, amount: f64) -> String {
    let reply = client
        .call("payment.schedule", payment_for(invoice, json!(amount)))
        .await;
    assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
    content(&reply)["step_id"].as_str().unwrap().to_string()
}

/// Decides `step` through the API as demo person `user` (signed in on `who`); an approval is
/// signed with their passkey (payment.schedule requires it).
async fn decide(
    app: &TestApp,
    who: &reqwest::Client,
    user: &str,
    step: &str,
    verdict: &str,
) -> StatusCode {
    let mut body = json!({"verdict": verdict, "reason": "three-way match checked"});
    if verdict == "approved" {
        body["signature"] = crate::helpers::http_signature(app, who, user, step).await;
    }
    who.post(app.url(&format!("/api/steps/{step}/decision")))
        .header("origin", format!("http://{}", app.addr))
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
}

async fn status(app: &TestApp, step: &str) -> StepStatus {
    app.store.get_step(step).await.unwrap().status
}

/// The `refused` records of `step` with `rule`, as `(actor, rule)`.
async fn refusals(app: &TestApp, step: &str, rule: &str) -> Vec<String> {
    let run = app.store.get_step(step).await.unwrap().run_id;
    app.store
        .audit_for_run(&run)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.event == "refused" && r.step_id.as_deref() == Some(step))
        .filter(|r| r.rule.as_deref() == Some(rule))
        .map(|r| r.actor.unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_creator_of_an_agents_credential_never_countersigns_its_steps() {
    each_finance_app(|app| async move {
        // Ana creates the agent's credential; the tool has no four eyes of its own.
        let token = worker_by(&app, "fin-ana", &demo_person("ana"), None, TaskOrigin::User).await;
        let mut client = Client::new(&app, &token);
        client.connect().await;
        let api = gated(&mut client, "INV-20260611", 4180.00).await;
        let rejected = gated(&mut client, "INV-20260612", 1860.50).await;
        let batched = gated(&mut client, "INV-20260612", 100.00).await;
        let form = gated(&mut client, "INV-20260611", 100.00).await;
        let ana = app.demo_client("ana").await;
        let pat = app.demo_client("pat").await;

        // The JSON API: Ana's approval is refused (403), audited with its own rule; the step
        // still waits; Pat's is accepted and the payment goes out once.
        assert_eq!(
            decide(&app, &ana, "ana", &api, "approved").await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(status(&app, &api).await, StepStatus::NeedsApproval);
        assert!(app.store.approvals_for_step(&api).await.unwrap().is_empty());
        assert_eq!(
            refusals(&app, &api, "approval.creator").await,
            [demo_person("ana")]
        );
        assert_eq!(
            decide(&app, &pat, "pat", &api, "approved").await,
            StatusCode::OK
        );
        let paid = client
            .call(
                "payment.schedule",
                payment_for("INV-20260611", json!(4180.00)),
            )
            .await;
        assert_eq!(content(&paid)["status"], "scheduled", "{paid}");
        let effects = app
            .store
            .demo_effects(ERP, "payments.schedule")
            .await
            .unwrap();
        assert_eq!(effects.len(), 1, "{effects:?}");

        // Her rejection is accepted: stopping is always safe.
        assert_eq!(
            decide(&app, &ana, "ana", &rejected, "rejected").await,
            StatusCode::OK
        );
        assert_eq!(status(&app, &rejected).await, StepStatus::Refused);

        // The batch endpoint: the step is refused individually, with the reason code.
        let now = app.store.clock().now_ms();
        let resp = ana
            .post(app.url("/api/gates/batch"))
            .header("origin", format!("http://{}", app.addr))
            .json(&json!({
                "tool": "payment.schedule", "step_ids": [batched], "max_count": 1,
                "proposed_from": now - 60_000, "proposed_to": now + 60_000,
                "expires_at": now + 60_000, "reason": "June supplier run",
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(answer["approved"], 0, "{answer}");
        assert_eq!(answer["results"][0]["reason"], "creator", "{answer}");
        assert_eq!(status(&app, &batched).await, StepStatus::NeedsApproval);
        assert_eq!(refusals(&app, &batched, "approval.creator").await.len(), 1);

        // The inbox form: back to the gate with the code the page explains.
        let resp = ana
            .post(app.url(&format!("/inbox/{form}/decision")))
            .header("origin", format!("http://{}", app.addr))
            .form(&[("verdict", "approved"), ("reason", "looks right")])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        let back = resp.headers().get(LOCATION).unwrap().to_str().unwrap();
        assert_eq!(back, format!("/inbox/{form}?error=creator"));
        assert_eq!(status(&app, &form).await, StepStatus::NeedsApproval);
        let shown = ana
            .get(app.url(back))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            shown.contains("another approver must countersign"),
            "{shown}"
        );

        // Nothing but Pat's approval reached the ERP.
        let effects = app
            .store
            .demo_effects(ERP, "payments.schedule")
            .await
            .unwrap();
        assert_eq!(effects.len(), 1, "{effects:?}");
        assert_eq!(app.store.verify_audit().await.unwrap().map(|_| ()), Ok(()));
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_party_an_agent_acts_for_never_countersigns_its_steps() {
    each_finance_app(|app| async move {
        // Created by an admin, bound by an operator to act for Pat.
        let token = worker_by(
            &app,
            "fin-for-pat",
            &demo_person("ada"),
            Some(&demo_person("pat")),
            TaskOrigin::User,
        )
        .await;
        let mut client = Client::new(&app, &token);
        client.connect().await;
        let step = gated(&mut client, "INV-20260611", 4180.00).await;
        let pat = app.demo_client("pat").await;
        assert_eq!(
            decide(&app, &pat, "pat", &step, "approved").await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            refusals(&app, &step, "approval.acts_for").await,
            [demo_person("pat")]
        );
        assert_eq!(status(&app, &step).await, StepStatus::NeedsApproval);
        // Unbound by the operator (audited), Pat is no longer the party: she may approve.
        let cred = app.store.find_agent("fin-for-pat").await.unwrap();
        app.store
            .bind_agent(&cred.id, None, TaskOrigin::User, "ops")
            .await
            .unwrap();
        let bound: Vec<_> = app
            .store
            .audit_in_order(0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.rule.as_deref() == Some("agent.bound"))
            .collect();
        assert_eq!(bound.len(), 1);
        let record: Value = serde_json::from_str(&bound[0].record).unwrap();
        assert_eq!(record["detail"]["was_acts_for"], demo_person("pat"));
        assert_eq!(record["detail"]["acts_for"], Value::Null);
        assert_eq!(
            decide(&app, &pat, "pat", &step, "approved").await,
            StatusCode::OK
        );
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_origin_credentials_call_meets_the_policys_origin_rule() {
    each_finance_app(|app| async move {
        let user = worker_by(
            &app,
            "fin-user",
            &demo_person("ada"),
            None,
            TaskOrigin::User,
        )
        .await;
        let external = worker_by(
            &app,
            "fin-mail",
            &demo_person("ada"),
            None,
            TaskOrigin::External,
        )
        .await;
        let args = payment_for("INV-20260612", json!(1860.50));
        let mut client = Client::new(&app, &user);
        client.connect().await;
        let reply = client.call("payment.schedule", args.clone()).await;
        assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
        let decided = |step: String| {
            let app = &app;
            async move {
                let run = app.store.get_step(&step).await.unwrap().run_id;
                let records = app.store.audit_for_run(&run).await.unwrap();
                let decided = records
                    .iter()
                    .find(|r| r.event == "decided" && r.step_id.as_deref() == Some(step.as_str()))
                    .unwrap();
                (
                    decided.rule.clone().unwrap_or_default(),
                    serde_json::from_str::<Value>(&decided.record).unwrap(),
                )
            }
        };
        let (rule, record) = decided(content(&reply)["step_id"].as_str().unwrap().into()).await;
        assert_ne!(rule, "origin.external");
        assert_eq!(record["detail"]["task_origin"], "user");

        // The same payment from the credential that reads inbound e-mail: the origin rule.
        let mut mail = Client::new(&app, &external);
        mail.connect().await;
        let reply = mail.call("payment.schedule", args).await;
        let step = content(&reply)["step_id"].as_str().unwrap().to_string();
        let (rule, record) = decided(step).await;
        assert_eq!(rule, "origin.external", "{record}");
        assert_eq!(record["detail"]["task_origin"], "external");
        assert!(record["detail"]["registry_version"].as_i64().unwrap() >= 1);
        app
    })
    .await;
}

/// Waits (real time, at most 20 s) until `step` is `status`.
async fn reaches(app: &TestApp, step: &str, status: StepStatus) {
    let began = std::time::Instant::now();
    loop {
        let now = app.store.get_step(step).await.unwrap();
        if now.status == status {
            return;
        }
        assert!(
            began.elapsed() < std::time::Duration::from_secs(20),
            "step {step} stuck at {:?}, wanted {status:?}",
            now.status
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A credential in `role` created by Ada (who approves nothing here); `(credential, token)`.
async fn by_ada(
    app: &TestApp,
    name: &str,
    role: &str,
) -> (countersign_core::store::AgentCredential, String) {
    let (cred, token) = app
        .store
        .create_agent(&NewAgent {
            name: name.into(),
            role: role.into(),
            tenant: "acme".into(),
            created_by: demo_person("ada"),
            expires_at: None,
            acts_for: None,
            origin: TaskOrigin::User,
        })
        .await
        .unwrap();
    (cred, token.reveal().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_payment_waits_for_its_reviewer_then_a_person_and_runs_on_its_own_credential() {
    use countersign_core::store::ReviewError;
    each_finance_app(|app| async move {
        let (planner_cred, planner_token) = by_ada(&app, "planner-1", "planner").await;
        let (reviewer_cred, reviewer_token) = by_ada(&app, "reviewer-1", "reviewer").await;
        let mut planner = Client::new(&app, &planner_token);
        planner.connect().await;
        let (run, steps) = crate::runs::submit(
            &mut planner,
            vec![
                crate::runs::note_step(),
                crate::runs::payment_step(json!(4180.00)),
            ],
        )
        .await;
        let pay = steps[1].clone();
        reaches(&app, &steps[0], StepStatus::Done).await;
        // The payment waits for its reviewer: not claimed, no gate opened, nobody asked.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert_eq!(status(&app, &pay).await, StepStatus::Pending);
        let ana = app.demo_client("ana").await;
        let gates: Value = ana.get(app.url("/api/gates")).send().await.unwrap().json().await.unwrap();
        assert_eq!(gates["gates"].as_array().unwrap().len(), 0, "{gates}");
        let hash = app.store.get_step(&pay).await.unwrap().inputs_hash;

        // The planner's own credential never reviews its plan (over MCP it is not even
        // listed; the store refuses it too).
        let own = planner
            .call(
                "step.approve",
                json!({"step_id": pay, "inputs_hash": hash, "reason": "my own plan looks right to me"}),
            )
            .await;
        assert_eq!(own["error"]["code"], -32602, "{own}");
        let own = app.store.review_step(&pay, &hash, &planner_cred, "mine").await;
        assert!(matches!(own, Err(ReviewError::OwnPlan)), "{own:?}");
        // A review of other inputs does not count.
        let other = format!("sha256:{}", "0".repeat(64));
        let mut reviewer = Client::new(&app, &reviewer_token);
        reviewer.connect().await;
        let changed = reviewer
            .call(
                "step.approve",
                json!({"step_id": pay, "inputs_hash": other, "reason": "amounts match the purchase order"}),
            )
            .await;
        assert_eq!(changed["result"]["isError"], true, "{changed}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert_eq!(status(&app, &pay).await, StepStatus::Pending);
        assert!(app.store.step_duties(&pay).await.unwrap().unwrap().reviewed_hash.is_none());

        // The reviewer approves exactly these inputs: now it waits for a person.
        let listed = reviewer.call("step.list", json!({"run_id": run})).await;
        assert_eq!(content(&listed)["steps"][0]["inputs_hash"], hash.as_str(), "{listed}");
        assert_eq!(content(&listed)["steps"][0]["awaiting_review"], true, "{listed}");
        let ok = reviewer
            .call(
                "step.approve",
                json!({"step_id": pay, "inputs_hash": hash, "reason": "amounts match the purchase order"}),
            )
            .await;
        assert_eq!(content(&ok)["review"], "approved", "{ok}");
        reaches(&app, &pay, StepStatus::NeedsApproval).await;
        assert_eq!(decide(&app, &ana, "ana", &pay, "approved").await, StatusCode::OK);
        reaches(&app, &pay, StepStatus::Done).await;

        // The timeline names four identities: planner, reviewer, Ana, the execution credential.
        let records = app.store.audit_for_run(&run).await.unwrap();
        let actor_of = |event: &str| {
            records
                .iter()
                .find(|r| r.event == event && r.step_id.as_deref() == Some(pay.as_str()))
                .and_then(|r| r.actor.clone())
                .unwrap_or_default()
        };
        assert!(actor_of("proposed").contains(&planner_cred.id), "{records:?}");
        assert!(actor_of("validated").contains(&reviewer_cred.id), "{records:?}");
        assert!(actor_of("approved").contains("#ana"), "{records:?}");
        let executions: Vec<_> = app
            .store
            .list_agents()
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.run_id.as_deref() == Some(run.as_str()))
            .collect();
        let worker = executions
            .iter()
            .find(|a| a.role == "worker.finance")
            .expect("an execution credential for the payment's role");
        assert!(worker.name.starts_with("exec:"), "{worker:?}");
        assert_eq!(worker.created_by, demo_person("ada"), "the planner's creator stays accountable");
        // Its creation is in the run's trail, minted by Countersign, not signed by Ada.
        let minted = records
            .iter()
            .find(|r| {
                r.rule.as_deref() == Some("agent.created") && r.record.contains(&worker.id)
            })
            .expect("the execution credential's agent.created record");
        assert_eq!(minted.actor.as_deref(), Some("countersign:plan.submit"));
        assert!(minted.record.contains(&demo_person("ada")), "{}", minted.record);
        let started = actor_of("started");
        assert!(started.contains(&worker.id), "{started}");
        assert!(started.contains("role:worker.finance"), "{started}");
        assert!(!started.contains(&planner_cred.id), "{started}");
        // The run ended: its execution credentials with it.
        let began = std::time::Instant::now();
        while app.store.get_run(&run).await.unwrap().status == countersign_core::store::RunStatus::Active {
            assert!(began.elapsed() < std::time::Duration::from_secs(20), "the run never ended");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        for cred in &executions {
            let now = app.store.get_agent(&cred.id).await.unwrap();
            assert!(now.revoked_at.is_some(), "{now:?}");
            assert!(app.store.check_credential(now).is_err());
        }
        let effects = app.store.demo_effects(ERP, "payments.schedule").await.unwrap();
        assert_eq!(effects.len(), 1, "{effects:?}");
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_never_runs_on_a_credential_of_another_role_or_run() {
    each_finance_app(|app| async move {
        let (_, planner_token) = by_ada(&app, "planner-2", "planner").await;
        let mut planner = Client::new(&app, &planner_token);
        planner.connect().await;
        let (run, steps) = crate::runs::submit(
            &mut planner,
            vec![crate::runs::note_step(), crate::runs::note_step()],
        )
        .await;
        assert_eq!(steps[0], steps[1], "one write, one step");
        reaches(&app, &steps[0], StepStatus::Done).await;
        // Another plan's steps: their execution credential is of their own run.
        let (other_run, other) = crate::runs::submit(
            &mut planner,
            vec![json!({"tool": "note.draft",
                        "arguments": {"invoice_id": "INV-20260612", "text": "Freight matched."},
                        "reason": "Record the freight match"})],
        )
        .await;
        assert_ne!(other_run, run);
        reaches(&app, &other[0], StepStatus::Done).await;
        let duties = app.store.step_duties(&other[0]).await.unwrap().unwrap();
        let mine = app.store.step_duties(&steps[0]).await.unwrap().unwrap();
        assert_ne!(duties.assignee, mine.assignee, "each run mints its own");
        // A worker role without step.list sees nothing of the plan.
        let (_, comms) = by_ada(&app, "comms-1", "worker.comms").await;
        let mut comms = Client::new(&app, &comms);
        comms.connect().await;
        let listed = comms.call("step.list", json!({})).await;
        assert_eq!(listed["error"]["code"], -32602, "{listed}");

        // A step assigned to a credential of another role is refused, never run with the
        // role swapped in.
        use countersign_core::store::{NewRun, NewStep};
        use countersign_core::{CanonicalJson, Effect};
        let (fin, _) = by_ada(&app, "fin-other-role", "worker.finance").await;
        let (planner_cred, _) = by_ada(&app, "planner-3", "planner").await;
        let made = app
            .store
            .create_run(&NewRun {
                tenant: "acme".into(),
                principal: format!("agent:{}", planner_cred.id),
                agent_id: Some(planner_cred.id.clone()),
                task: "a step assigned to the wrong role".into(),
                origin: "user".into(),
                planned: false,
            })
            .await
            .unwrap();
        let (step, _) = app
            .store
            .open_step(&NewStep {
                run_id: made.id.clone(),
                role: "worker.comms".into(),
                tool: "note.draft".into(),
                effect: Effect::Write,
                inputs: CanonicalJson::from_value(
                    &json!({"invoice_id": "INV-20260611", "text": "swapped"}),
                )
                .unwrap(),
                agent_id: Some(planner_cred.id.clone()),
                reason: String::new(),
                evidence: vec![],
                observed: None,
                trace_id: "t".into(),
                status: StepStatus::Pending,
            })
            .await
            .unwrap();
        app.store
            .set_step_duties(&step.id, false, Some(&fin.id))
            .await
            .unwrap();
        app.store.seal_plan(&made.id).await.unwrap();
        reaches(&app, &step.id, StepStatus::Refused).await;
        let refused = app.store.get_step(&step.id).await.unwrap();
        assert_eq!(refused.rule.as_deref(), Some("agent.role_mismatch"));
        let drafted = app.store.demo_effects(ERP, "notes.draft").await.unwrap();
        assert!(
            !drafted.iter().any(|e| format!("{e:?}").contains("swapped")),
            "{drafted:?}"
        );
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_left_unreviewed_past_its_wall_time_fails_instead_of_waiting_forever() {
    each_finance_app(|app| async move {
        let (_, planner_token) = by_ada(&app, "planner-1", "planner").await;
        let mut planner = Client::new(&app, &planner_token);
        planner.connect().await;
        let (run, steps) = crate::runs::submit(
            &mut planner,
            vec![
                crate::runs::note_step(),
                crate::runs::payment_step(json!(4180.00)),
            ],
        )
        .await;
        let pay = steps[1].clone();
        reaches(&app, &steps[0], StepStatus::Done).await;
        // Within the bound the sweep leaves it waiting for its reviewer.
        assert_eq!(
            countersign::executor::sweep_overdue_reviews(&app.state)
                .await
                .unwrap(),
            0
        );
        assert_eq!(status(&app, &pay).await, StepStatus::Pending);
        // Past the run's wall-time bound (1440 minutes by default) nobody reviewed it: the
        // run fails with the bound's rule, the payment never starts, its credentials end.
        // (The server's own reconciler loop may sweep first: either way it is stopped once.)
        app.clock.advance(chrono::Duration::minutes(1441));
        countersign::executor::sweep_overdue_reviews(&app.state)
            .await
            .unwrap();
        assert_eq!(
            app.store.get_run(&run).await.unwrap().status,
            countersign_core::store::RunStatus::Failed
        );
        assert_eq!(status(&app, &pay).await, StepStatus::Cancelled);
        assert_eq!(refusals(&app, &pay, "bounds.wall_time").await.len(), 1);
        for cred in app.store.list_agents().await.unwrap() {
            if cred.run_id.as_deref() == Some(run.as_str()) {
                assert!(cred.revoked_at.is_some(), "{cred:?}");
            }
        }
        assert_eq!(
            countersign::executor::sweep_overdue_reviews(&app.state)
                .await
                .unwrap(),
            0,
            "a run is stopped once"
        );
        let effects = app
            .store
            .demo_effects(ERP, "payments.schedule")
            .await
            .unwrap();
        assert!(effects.is_empty(), "{effects:?}");
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_steps_never_hide_a_reviewers_own_in_step_list() {
    use countersign_core::store::{NewRun, NewStep};
    use countersign_core::{CanonicalJson, Effect};
    each_finance_app(|app| async move {
        // 501 older planned steps waiting in another tenant's run.
        let run = app
            .store
            .create_run(&NewRun {
                tenant: "globex".into(),
                principal: "agent:elsewhere".into(),
                agent_id: None,
                task: "globex's plan".into(),
                origin: "user".into(),
                planned: true,
            })
            .await
            .unwrap();
        for n in 0..501 {
            app.store
                .open_step(&NewStep {
                    run_id: run.id.clone(),
                    role: "worker.finance".into(),
                    tool: "note.draft".into(),
                    effect: Effect::Write,
                    inputs: CanonicalJson::from_value(&json!({"n": n})).unwrap(),
                    agent_id: None,
                    reason: String::new(),
                    evidence: vec![],
                    observed: None,
                    trace_id: format!("t{n}"),
                    status: StepStatus::Pending,
                })
                .await
                .unwrap();
        }
        app.clock.advance(chrono::Duration::seconds(1));
        // Acme's plan: its payment waits for acme's reviewer, who must see it.
        let (_, planner_token) = by_ada(&app, "planner-1", "planner").await;
        let (_, reviewer_token) = by_ada(&app, "reviewer-1", "reviewer").await;
        let mut planner = Client::new(&app, &planner_token);
        planner.connect().await;
        let (_, steps) = crate::runs::submit(
            &mut planner,
            vec![crate::runs::payment_step(json!(4180.00))],
        )
        .await;
        let mut reviewer = Client::new(&app, &reviewer_token);
        reviewer.connect().await;
        let listed = reviewer.call("step.list", json!({"limit": 10})).await;
        let ids: Vec<&str> = content(&listed)["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["step_id"].as_str())
            .collect();
        assert_eq!(ids, vec![steps[0].as_str()], "{listed}");
        app
    })
    .await;
}
