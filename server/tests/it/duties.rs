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

async fn decide(app: &TestApp, who: &reqwest::Client, step: &str, verdict: &str) -> StatusCode {
    who.post(app.url(&format!("/api/steps/{step}/decision")))
        .header("origin", format!("http://{}", app.addr))
        .json(&json!({"verdict": verdict, "reason": "three-way match checked"}))
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
            decide(&app, &ana, &api, "approved").await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(status(&app, &api).await, StepStatus::NeedsApproval);
        assert!(app.store.approvals_for_step(&api).await.unwrap().is_empty());
        assert_eq!(
            refusals(&app, &api, "approval.creator").await,
            [demo_person("ana")]
        );
        assert_eq!(decide(&app, &pat, &api, "approved").await, StatusCode::OK);
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
            decide(&app, &ana, &rejected, "rejected").await,
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
            decide(&app, &pat, &step, "approved").await,
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
            .audit_records(0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.rule.as_deref() == Some("agent.bound"))
            .collect();
        assert_eq!(bound.len(), 1);
        let record: Value = serde_json::from_str(&bound[0].record).unwrap();
        assert_eq!(record["detail"]["was_acts_for"], demo_person("pat"));
        assert_eq!(record["detail"]["acts_for"], Value::Null);
        assert_eq!(decide(&app, &pat, &step, "approved").await, StatusCode::OK);
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
