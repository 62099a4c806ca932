//! Approvals: who may decide, two approvers above a threshold, four eyes, step-up, and the
//! HTTP API the inbox calls (signed in through the demo sign-in) — on both backends.

use countersign::adapters::builtin::ERP;
use countersign_core::StepStatus;
use countersign_core::approvals::{Approver, DecideError, Decider, Verdict};
use countersign_core::signing::verified::SignatureRefusal;
use countersign_core::store::{NewAgent, NewRun};
use countersign_core::{Registry, ToolName};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::gateway::{ana, one};
use crate::helpers::{TestApp, decide_signed, example, http_signature};
use crate::mcp::{Client, REASON, agent, each_finance_app, payment_for};

fn person(sub: &str, roles: &[&str], auth_time: i64) -> Decider {
    Decider {
        approver: Approver {
            iss: "https://idp.example".into(),
            sub: sub.into(),
        },
        roles: roles.iter().map(|r| (*r).to_string()).collect(),
        auth_time,
        auth_time_unknown: false,
    }
}

fn finance_rules(tool: &str, args: &Value) -> countersign_core::approvals::GateRules {
    let registry = Registry::from_path(std::path::Path::new(&format!(
        "{}/registry.yaml",
        example("finance")
    )))
    .unwrap();
    let tool = registry.tool(&ToolName::parse(tool).unwrap()).unwrap();
    countersign::pipeline::gate_rules(tool, args)
}

fn content(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

async fn payments(app: &TestApp) -> usize {
    app.store
        .demo_effects(ERP, "payments.schedule")
        .await
        .unwrap()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_above_the_threshold_need_two_distinct_approvers() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let args = payment_for("INV-20260615", json!(12400.00));
        let reply = client.call("payment.schedule", args.clone()).await;
        assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
        let step = content(&reply)["step_id"].as_str().unwrap().to_string();
        let rules = finance_rules("payment.schedule", &args);
        assert_eq!(rules.approvals_needed, 2);
        let now = app.store.clock().now_ms();
        let ana = person("ana", &["approver"], now);
        // payment.schedule requires signatures: each approval is the person's passkey's.
        decide_signed(
            &app,
            &step,
            &ana,
            &rules,
            Verdict::Approved,
            "first look: fine",
        )
        .await
        .unwrap();
        // One approval is not enough: the gate stays closed and nothing is paid.
        assert_eq!(
            app.store.get_step(&step).await.unwrap().status,
            StepStatus::NeedsApproval
        );
        let reply = client.call("payment.schedule", args.clone()).await;
        assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
        assert_eq!(payments(&app).await, 0);
        let again = decide_signed(&app, &step, &ana, &rules, Verdict::Approved, "me again").await;
        assert!(
            matches!(
                again,
                Err(DecideError::Signature(SignatureRefusal::SameSigner))
            ),
            "{again:?}"
        );
        let pat = person("pat", &["approver"], now);
        decide_signed(
            &app,
            &step,
            &pat,
            &rules,
            Verdict::Approved,
            "second pair of eyes",
        )
        .await
        .unwrap();
        let paid = client.call("payment.schedule", args).await;
        assert_eq!(content(&paid)["status"], "scheduled", "{paid}");
        assert_eq!(payments(&app).await, 1);
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_refuse_non_approvers_self_approval_four_eyes_and_stale_sign_ins() {
    each_finance_app(|app| async move {
        let now = app.store.clock().now_ms();
        // A run acting for Ana, with a step waiting for a person.
        let run = app
            .store
            .create_run(&NewRun {
                tenant: "acme".into(),
                principal: "person:https://idp.example#ana".into(),
                agent_id: None,
                task: "Ana's own expense".into(),
                origin: "user".into(),
                planned: false,
            })
            .await
            .unwrap();
        let step = crate::helpers::park_step(&app.store, &run.id, "invoice.hold", now + 3_600_000).await;
        let own = app
            .store
            .decide_step(&step.id, &ana(), &one(), Verdict::Approved, "looks fine to me")
            .await;
        assert!(matches!(own, Err(DecideError::SelfApproval)), "{own:?}");
        let manager = person("max", &["manager"], now);
        let not_approver = app
            .store
            .decide_step(&step.id, &manager, &one(), Verdict::Approved, "I'm the boss")
            .await;
        assert!(matches!(not_approver, Err(DecideError::NotAnApprover)), "{not_approver:?}");
        let no_reason = app
            .store
            .decide_step(&step.id, &person("pat", &["approver"], now), &one(), Verdict::Approved, " ")
            .await;
        assert!(matches!(no_reason, Err(DecideError::NoReason)), "{no_reason:?}");

        // Four eyes: Ana created the vendor-master agent's credential, so she cannot approve
        // its IBAN change; and the tool wants a sign-in within 5 minutes.
        let (cred, token) = app
            .store
            .create_agent(&NewAgent {
                name: "vm-1".into(),
                role: "worker.vendor_master".into(),
                tenant: "acme".into(),
                created_by: "person:https://idp.example#ana".into(),
                expires_at: None,
                acts_for: None,
                origin: countersign_core::policy::TaskOrigin::User,
            })
            .await
            .unwrap();
        let _ = cred;
        let mut vendor = Client::new(&app, token.reveal());
        vendor.connect().await;
        let args = json!({"supplier_id": "SUP-000417", "iban": "DE89370400440532013000", "reason": REASON});
        let reply = vendor.call("supplier.update_iban", args.clone()).await;
        let iban_step = content(&reply)["step_id"].as_str().unwrap().to_string();
        let rules = finance_rules("supplier.update_iban", &args);
        assert!(rules.four_eyes);
        let creator = app
            .store
            .decide_step(&iban_step, &person("ana", &["approver"], now), &rules, Verdict::Approved, "ok")
            .await;
        // Whatever four eyes says, the creator is accountable for the proposal.
        assert!(matches!(creator, Err(DecideError::CreatorApproval { .. })), "{creator:?}");
        let stale = app
            .store
            .decide_step(
                &iban_step,
                &person("pat", &["approver"], now - 6 * 60_000),
                &rules,
                Verdict::Approved,
                "ok",
            )
            .await;
        assert!(matches!(stale, Err(DecideError::StepUpRequired { max_age_minutes: 5 })), "{stale:?}");
        app.store
            .decide_step(&iban_step, &person("pat", &["approver"], now), &rules, Verdict::Approved, "verified by phone")
            .await
            .unwrap();
        assert_eq!(app.store.get_step(&iban_step).await.unwrap().status, StepStatus::Pending);
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_eyes_refuses_approvals_when_the_credential_creator_is_not_a_person() {
    each_finance_app(|app| async move {
        let now = app.store.clock().now_ms();
        // Created from the CLI by a Unix user: nobody can be told apart from "pat".
        for (i, creator) in ["pat", "person:pat", "person:#pat", "scenario:x"].into_iter().enumerate() {
            let (_, token) = app
                .store
                .create_agent(&NewAgent {
                    name: format!("vm-{i}"),
                    role: "worker.vendor_master".into(),
                    tenant: "acme".into(),
                    created_by: creator.into(),
                    expires_at: None,
                    acts_for: None,
                    origin: countersign_core::policy::TaskOrigin::User,
                })
                .await
                .unwrap();
            let mut vendor = Client::new(&app, token.reveal());
            vendor.connect().await;
            let args = json!({"supplier_id": "SUP-000417", "iban": "DE89370400440532013000", "reason": REASON});
            let reply = vendor.call("supplier.update_iban", args.clone()).await;
            let step = content(&reply)["step_id"].as_str().unwrap().to_string();
            let rules = finance_rules("supplier.update_iban", &args);
            let pat = person("pat", &["approver"], now);
            let refused = app
                .store
                .decide_step(&step, &pat, &rules, Verdict::Approved, "verified by phone")
                .await;
            if creator == "pat" {
                // A bare name that is the approver's subject: taken as them (fail closed).
                assert!(matches!(&refused, Err(DecideError::CreatorApproval { .. })), "{refused:?}");
            } else {
                assert!(
                    matches!(&refused, Err(DecideError::FourEyesUnknownCreator { created_by, .. }) if created_by == creator),
                    "{creator}: {refused:?}"
                );
            }
            assert_eq!(app.store.get_step(&step).await.unwrap().status, StepStatus::NeedsApproval);
            assert!(app.store.approvals_for_step(&step).await.unwrap().is_empty(), "{creator}");
            // Rejecting never runs anything: still allowed.
            app.store
                .decide_step(&step, &pat, &rules, Verdict::Rejected, "bank details never change this way")
                .await
                .unwrap();
            assert_eq!(app.store.get_step(&step).await.unwrap().status, StepStatus::Refused);
        }
        let effects = app.store.demo_effects(ERP, "suppliers.update_iban").await.unwrap();
        assert!(effects.is_empty(), "{effects:?}");
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_http_api_lists_and_decides_for_signed_in_approvers_only() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let args = payment_for("INV-20260611", json!(4180.00));
        let reply = client.call("payment.schedule", args.clone()).await;
        let step = content(&reply)["step_id"].as_str().unwrap().to_string();
        let origin = format!("http://{}", app.addr);

        // Not signed in: no data.
        let anon = app.client.get(app.url("/api/gates")).send().await.unwrap();
        assert_eq!(anon.status(), StatusCode::UNAUTHORIZED);
        // A manager is not an approver.
        let max = app.demo_client("max").await;
        let resp = max.get(app.url("/api/gates")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);

        let ana = app.demo_client("ana").await;
        let gates: Value = ana
            .get(app.url("/api/gates"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let listed = gates["gates"].as_array().unwrap();
        assert_eq!(listed.len(), 1, "{gates}");
        assert_eq!(listed[0]["step_id"], step.as_str());
        assert_eq!(listed[0]["inputs"]["amount"], 4180);

        // Cross-origin POST: refused by the CSRF check, nothing decided.
        let forged = ana
            .post(app.url(&format!("/api/steps/{step}/decision")))
            .header("origin", "https://evil.example")
            .json(&json!({"verdict": "approved", "reason": "click here"}))
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            app.store.get_step(&step).await.unwrap().status,
            StepStatus::NeedsApproval
        );

        // Payment tools ask for a sign-in within 15 minutes: the demo sign-in is fresh.
        let signature = http_signature(&app, &ana, "ana", &step).await;
        let ok = ana
            .post(app.url(&format!("/api/steps/{step}/decision")))
            .header("origin", &origin)
            .json(
                &json!({"verdict": "approved", "reason": "three-way match checked",
                          "signature": signature}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), StatusCode::OK, "{}", ok.text().await.unwrap());
        let paid = client.call("payment.schedule", args).await;
        assert_eq!(content(&paid)["status"], "scheduled", "{paid}");
        assert_eq!(payments(&app).await, 1);
        // Deciding again is a conflict.
        let again = ana
            .post(app.url(&format!("/api/steps/{step}/decision")))
            .header("origin", &origin)
            .json(&json!({"verdict": "rejected", "reason": "too late"}))
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), StatusCode::CONFLICT);
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_read_repeated_in_its_run_continues_its_step_and_runs_once_approved() {
    each_finance_app(|app| async move {
        // Reading a supplier's master data now needs an approver.
        crate::helpers::use_finance_registry_with(
            &app,
            "    effect: read\n    gate: never\n    roles: [planner, worker.finance, reviewer, worker.vendor_master]\n    handler: {provider: erp, operation: suppliers.get}\n",
            "    effect: read\n    gate: always\n    roles: [planner, worker.finance, reviewer, worker.vendor_master]\n    approval: {approver_roles: [approver], expires: 1h}\n    handler: {provider: erp, operation: suppliers.get}\n",
        )
        .await;

        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let args = json!({"supplier_id": "SUP-000417"});
        let first = client.call("supplier.get", args.clone()).await;
        assert_eq!(content(&first)["status"], "needs_approval", "{first}");
        let step = content(&first)["step_id"].as_str().unwrap().to_string();
        // Asking again: the same step, still waiting (not a new gate each time).
        let again = client.call("supplier.get", args.clone()).await;
        assert_eq!(content(&again)["status"], "needs_approval", "{again}");
        assert_eq!(content(&again)["step_id"], step.as_str(), "{again}");
        // Another supplier is another step.
        let other = client.call("supplier.get", json!({"supplier_id": "SUP-000042"})).await;
        assert_ne!(content(&other)["step_id"], step.as_str(), "{other}");
        // Another agent asking the same in its own run gets its own step.
        let (_, fin2) = agent(&app, "fin-2", "worker.finance").await;
        let mut second = Client::new(&app, &fin2);
        second.connect().await;
        let theirs = second.call("supplier.get", args.clone()).await;
        assert_eq!(content(&theirs)["status"], "needs_approval", "{theirs}");
        assert_ne!(content(&theirs)["step_id"], step.as_str(), "{theirs}");

        let now = app.store.clock().now_ms();
        app.store
            .decide_step(
                &step,
                &person("pat", &["approver"], now),
                &finance_rules("supplier.update_iban", &args),
                Verdict::Approved,
                "needed for the payment run",
            )
            .await
            .unwrap();
        let read = client.call("supplier.get", args.clone()).await;
        assert_eq!(read["result"]["isError"], false, "{read}");
        assert_eq!(content(&read)["supplier_id"], "SUP-000417", "{read}");
        assert_eq!(app.store.get_step(&step).await.unwrap().status, StepStatus::Done);
        // Done is done: the next read is a new step, gated again.
        let next = client.call("supplier.get", args).await;
        assert_eq!(content(&next)["status"], "needs_approval", "{next}");
        assert_ne!(content(&next)["step_id"], step.as_str(), "{next}");
        // Past its window a parked read is not continued: the call opens a new one.
        let lapsed = content(&other)["step_id"].as_str().unwrap().to_string();
        app.clock.advance(chrono::Duration::minutes(61));
        let anew = client.call("supplier.get", json!({"supplier_id": "SUP-000042"})).await;
        assert_eq!(content(&anew)["status"], "needs_approval", "{anew}");
        assert_ne!(content(&anew)["step_id"], lapsed.as_str(), "{anew}");
        app
    })
    .await;
}

/// Every decision records what policy decided on beyond the step's own row (issue 33's impact
/// preview replays it): the instant, the party, whether an approval was in hand, the resource
/// facts and the grants — before and after the approval of a gated payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_record_the_inputs_policy_decided_on() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let args = payment_for("INV-20260615", json!(1860.50));
        let reply = client.call("payment.schedule", args.clone()).await;
        let step = content(&reply)["step_id"].as_str().unwrap().to_string();
        let now = app.store.clock().now_ms();
        let rules = finance_rules("payment.schedule", &args);
        decide_signed(
            &app,
            &step,
            &person("ana", &["approver"], now),
            &rules,
            Verdict::Approved,
            "ok",
        )
        .await
        .unwrap();
        let paid = client.call("payment.schedule", args).await;
        assert_eq!(content(&paid)["status"], "scheduled", "{paid}");
        let decided: Vec<Value> = app
            .store
            .audit_records("acme", 1, 1000)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.event == "decided" && r.step_id.as_deref() == Some(step.as_str()))
            .map(|r| {
                let record: Value = serde_json::from_str(&r.record).unwrap();
                record["detail"][countersign::pipeline::POLICY_INPUTS].clone()
            })
            .collect();
        assert_eq!(decided.len(), 2, "{decided:?}");
        for (inputs, approval) in decided.iter().zip(["none", "approved"]) {
            assert_eq!(inputs["v"], 1, "{inputs}");
            assert_eq!(inputs["now_ms"], now, "{inputs}");
            assert_eq!(inputs["approval"], approval, "{inputs}");
            assert_eq!(inputs["party"], Value::Null, "{inputs}");
            assert_eq!(inputs["grants"], json!([]), "{inputs}");
            let invoice = &inputs["resources"][0];
            assert_eq!(invoice["kind"], "invoice", "{inputs}");
            assert_eq!(invoice["id"], "INV-20260615", "{inputs}");
            assert!(invoice["attrs"]["amount"].is_number(), "{inputs}");
            assert_eq!(invoice["attrs"]["status"], "approved", "{inputs}");
        }
        app
    })
    .await;
}

/// A tool that redacts its inputs never has its resource facts recorded (a fact's id is an
/// argument; its attributes come from the target): the audit holds nothing redaction keeps out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redacting_tools_resource_facts_are_withheld_from_the_audit() {
    each_finance_app(|app| async move {
        let (_, vm) = agent(&app, "vm-1", "worker.vendor_master").await;
        let mut client = Client::new(&app, &vm);
        client.connect().await;
        let reply = client
            .call(
                "supplier.update_iban",
                json!({"supplier_id": "SUP-000042", "iban": "DE89370400440532013000",
                       "reason": REASON}),
            )
            .await;
        let step = content(&reply)["step_id"].as_str().unwrap().to_string();
        let records = app.store.audit_records("acme", 1, 1000).await.unwrap();
        let decided = records
            .iter()
            .find(|r| r.event == "decided" && r.step_id.as_deref() == Some(step.as_str()))
            .expect("a decided record");
        let record: Value = serde_json::from_str(&decided.record).unwrap();
        let inputs = &record["detail"][countersign::pipeline::POLICY_INPUTS];
        assert_eq!(inputs["v"], 1, "{record}");
        assert_eq!(inputs["resources"], Value::Null, "{record}");
        assert!(
            !decided.record.contains("DE89370400440532013000"),
            "{record}"
        );
        app
    })
    .await;
}
