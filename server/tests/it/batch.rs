//! Batch approval over HTTP (`POST /api/gates/batch`): bounded by tool, listed steps, count,
//! proposal window and expiry; everything outside stays waiting for its own approval; each
//! approved step still binds its own inputs at execution. On both backends.

use countersign::adapters::builtin::ERP;
use countersign_core::StepStatus;
use countersign_core::audit::AuditRecord;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, http_batch_signature};
use crate::mcp::{Client, agent, each_finance_app, hold, payment_for};

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

/// Proposes `args` with `tool` and returns the step id, which must be waiting for a person.
async fn waiting(client: &mut Client<'_>, tool: &str, args: &Value) -> String {
    let reply = client.call(tool, args.clone()).await;
    assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
    content(&reply)["step_id"].as_str().unwrap().to_string()
}

async fn status(app: &TestApp, step: &str) -> StepStatus {
    app.store.get_step(step).await.unwrap().status
}

/// Posts batch `body` as demo person `user` (signed in on `who`), signed with their passkey
/// (payment.schedule requires signatures) whenever the server issues a challenge for it.
async fn post_batch(
    app: &TestApp,
    who: &reqwest::Client,
    user: &str,
    body: &Value,
) -> (StatusCode, Value) {
    let mut body = body.clone();
    let signature = http_batch_signature(app, who, user, &body).await;
    if !signature.is_null() {
        body["signature"] = signature;
    }
    let resp = who
        .post(app.url("/api/gates/batch"))
        .header("origin", format!("http://{}", app.addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    let code = resp.status();
    let text = resp.text().await.unwrap();
    (
        code,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// `who` approves the payment `step` in a batch whose grant ends a minute from now.
async fn approve_in_a_minute_long_batch(app: &TestApp, who: &reqwest::Client, step: &str) {
    let now = app.store.clock().now_ms();
    let body = json!({
        "tool": "payment.schedule", "step_ids": [step], "max_count": 1,
        "proposed_from": now - 60_000, "proposed_to": now + 60_000,
        "expires_at": now + 60_000, "reason": "June supplier run, three-way matched",
    });
    let (code, answer) = post_batch(app, who, "ana", &body).await;
    assert_eq!(code, StatusCode::OK, "{answer}");
}

/// The result for `step` in a batch answer.
fn result_for<'a>(answer: &'a Value, step: &str) -> &'a Value {
    answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["step_id"] == step)
        .unwrap_or_else(|| panic!("no result for {step}: {answer}"))
}

async fn audit(app: &TestApp) -> Vec<AuditRecord> {
    app.store.audit_in_order(0, 100_000).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_refuses_each_step_outside_its_bounds_and_those_keep_waiting() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let t0 = app.store.clock().now_ms();
        // Proposed before the window opens.
        let early = waiting(
            &mut client,
            "payment.schedule",
            &payment_for("INV-20260611", json!(4180.00)),
        )
        .await;
        app.clock.advance(chrono::Duration::minutes(10));
        let inside = waiting(
            &mut client,
            "payment.schedule",
            &payment_for("INV-20260612", json!(1860.50)),
        )
        .await;
        // Another tool, in the window.
        let other_tool = waiting(&mut client, "invoice.hold", &hold(json!(2000))).await;
        // Another tenant's payment, in the window.
        let (_, globex) = app
            .store
            .create_agent(&countersign_core::store::NewAgent {
                name: "fin-g".into(),
                role: "worker.finance".into(),
                tenant: "globex".into(),
                created_by: "test".into(),
                expires_at: None,
                acts_for: None,
                origin: countersign_core::policy::TaskOrigin::User,
            })
            .await
            .unwrap();
        let globex = globex.reveal().to_string();
        let mut other_client = Client::new(&app, &globex);
        other_client.connect().await;
        let other_tenant = waiting(
            &mut other_client,
            "payment.schedule",
            &payment_for("INV-20269001", json!(2500.00)),
        )
        .await;
        // Above 10,000: needs two approvers.
        let big = waiting(
            &mut client,
            "payment.schedule",
            &payment_for("INV-20260615", json!(12400.00)),
        )
        .await;
        // Listed last: over the count.
        let last = waiting(
            &mut client,
            "payment.schedule",
            &payment_for("INV-20260613", json!(3000.00)),
        )
        .await;
        let unlisted = waiting(
            &mut client,
            "payment.schedule",
            &payment_for("INV-20260611", json!(100.00)),
        )
        .await;

        let ana = app.demo_client("ana").await;
        let now = app.store.clock().now_ms();
        let body = |ids: &[&String], max: u32, expires: i64| {
            json!({
                "tool": "payment.schedule", "step_ids": ids, "max_count": max,
                "proposed_from": t0 + 5 * 60_000, "proposed_to": t0 + 20 * 60_000,
                "expires_at": expires, "reason": "June supplier run, three-way matched",
            })
        };
        let listed = [&early, &inside, &other_tool, &other_tenant, &big, &last];

        // Malformed or expired batches are refused whole; nothing is decided.
        let (code, _) = post_batch(&app, &ana, "ana", &body(&listed, 2, now)).await;
        assert_eq!(code, StatusCode::CONFLICT, "an expired grant");
        let (code, _) = post_batch(
            &app,
            &ana,
            "ana",
            &body(&[&inside, &inside], 2, now + 3_600_000),
        )
        .await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "a step listed twice");
        let (code, _) = post_batch(&app, &ana, "ana", &body(&listed, 0, now + 3_600_000)).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "zero count");
        let mut no_reason = body(&listed, 2, now + 3_600_000);
        no_reason["reason"] = json!("  ");
        let (code, _) = post_batch(&app, &ana, "ana", &no_reason).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "no reason");
        for step in &listed {
            assert!(app.store.approvals_for_step(step).await.unwrap().is_empty());
        }

        let (code, answer) =
            post_batch(&app, &ana, "ana", &body(&listed, 2, now + 3_600_000)).await;
        assert_eq!(code, StatusCode::OK, "{answer}");
        let reason = |step: &String| result_for(&answer, step)["reason"].clone();
        assert_eq!(reason(&early), "outside_window", "{answer}");
        assert_eq!(
            result_for(&answer, &inside)["result"],
            "approved",
            "{answer}"
        );
        assert_eq!(
            result_for(&answer, &inside)["status"],
            "pending",
            "{answer}"
        );
        assert_eq!(reason(&other_tool), "other_tool", "{answer}");
        // Another tenant's step does not exist for Ana.
        assert_eq!(reason(&other_tenant), "not_found", "{answer}");
        // One of the two approvals the big payment needs; it keeps waiting for a second.
        assert_eq!(result_for(&answer, &big)["result"], "approved", "{answer}");
        assert_eq!(
            result_for(&answer, &big)["status"],
            "needs_approval",
            "{answer}"
        );
        assert_eq!(reason(&last), "over_count", "{answer}");
        assert_eq!(answer["approved"], 2);

        for step in [&early, &other_tool, &other_tenant, &last, &unlisted] {
            assert_eq!(
                status(&app, step).await,
                StepStatus::NeedsApproval,
                "{step}"
            );
            assert!(
                app.store.approvals_for_step(step).await.unwrap().is_empty(),
                "{step}"
            );
        }
        assert_eq!(status(&app, &inside).await, StepStatus::Pending);
        assert_eq!(status(&app, &big).await, StepStatus::NeedsApproval);

        // Only the approved one runs; the others are still gated.
        let paid = client
            .call(
                "payment.schedule",
                payment_for("INV-20260612", json!(1860.50)),
            )
            .await;
        assert_eq!(content(&paid)["status"], "scheduled", "{paid}");
        for args in [
            payment_for("INV-20260613", json!(3000.00)),
            payment_for("INV-20260615", json!(12400.00)),
            payment_for("INV-20260611", json!(4180.00)),
        ] {
            let reply = client.call("payment.schedule", args).await;
            assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
        }
        assert_eq!(payments(&app).await, 1);

        // Ana cannot be the second approver of the big payment through another batch: the
        // second signature must be someone else's (audited).
        let (_, again) = post_batch(&app, &ana, "ana", &body(&[&big], 5, now + 3_600_000)).await;
        assert_eq!(
            result_for(&again, &big)["reason"],
            "signature.same_signer",
            "{again}"
        );
        // …Pat can, and a step refused by the first batch can still get its own approval.
        let pat = app.demo_client("pat").await;
        let (code, second) =
            post_batch(&app, &pat, "pat", &body(&[&big, &last], 5, now + 3_600_000)).await;
        assert_eq!(code, StatusCode::OK, "{second}");
        assert_eq!(result_for(&second, &big)["status"], "pending", "{second}");
        assert_eq!(result_for(&second, &last)["status"], "pending", "{second}");
        assert_eq!(status(&app, &early).await, StepStatus::NeedsApproval);
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_approves_exactly_the_listed_steps_each_runs_once_and_is_audited() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let args = [
            payment_for("INV-20260611", json!(4180.00)),
            payment_for("INV-20260612", json!(1860.50)),
            payment_for("INV-20260613", json!(3000.00)),
        ];
        let mut steps = Vec::new();
        for a in &args {
            steps.push(waiting(&mut client, "payment.schedule", a).await);
        }
        let unlisted_args = payment_for("INV-20260611", json!(100.00));
        let unlisted = waiting(&mut client, "payment.schedule", &unlisted_args).await;
        let now = app.store.clock().now_ms();
        let body = json!({
            "tool": "payment.schedule", "step_ids": steps, "max_count": 3,
            "proposed_from": now - 60_000, "proposed_to": now + 60_000,
            "expires_at": now + 3_600_000, "reason": "June supplier run, three-way matched",
        });

        // Not signed in, not an approver, or cross-origin: refused, nothing decided.
        let anon = app
            .client
            .post(app.url("/api/gates/batch"))
            .header("origin", format!("http://{}", app.addr))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(anon.status(), StatusCode::UNAUTHORIZED);
        let max = app.demo_client("max").await;
        let (code, _) = post_batch(&app, &max, "max", &body).await;
        assert_eq!(code, StatusCode::FORBIDDEN);
        let ana = app.demo_client("ana").await;
        let forged = ana
            .post(app.url("/api/gates/batch"))
            .header("origin", "https://evil.example")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), StatusCode::FORBIDDEN);
        for s in &steps {
            assert_eq!(status(&app, s).await, StepStatus::NeedsApproval);
        }

        let (code, answer) = post_batch(&app, &ana, "ana", &body).await;
        assert_eq!(code, StatusCode::OK, "{answer}");
        assert_eq!(answer["approved"], 3, "{answer}");
        let batch_id = answer["batch_id"].as_str().unwrap().to_string();
        for s in &steps {
            assert_eq!(result_for(&answer, s)["result"], "approved", "{answer}");
            assert_eq!(status(&app, s).await, StepStatus::Pending);
            let approvals = app.store.approvals_for_step(s).await.unwrap();
            assert_eq!(approvals.len(), 1);
            // Each approval binds its own step's inputs and ends with the grant.
            let step = app.store.get_step(s).await.unwrap();
            assert_eq!(approvals[0].inputs_hash, step.inputs_hash);
            assert_eq!(approvals[0].expires_at, now + 3_600_000);
        }
        assert_eq!(status(&app, &unlisted).await, StepStatus::NeedsApproval);

        // Audited: one batch record naming tool, count, window and steps, then one record per
        // step naming the batch.
        let records = audit(&app).await;
        let batch: Vec<&AuditRecord> = records
            .iter()
            .filter(|r| r.rule.as_deref() == Some("approval.batch"))
            .collect();
        assert_eq!(batch.len(), 1);
        let detail: Value = serde_json::from_str(&batch[0].record).unwrap();
        let b = &detail["detail"]["batch"];
        assert_eq!(b["id"], batch_id.as_str());
        assert_eq!(b["tool"], "payment.schedule");
        assert_eq!(b["max_count"], 3);
        assert_eq!(b["proposed_from"], now - 60_000);
        assert_eq!(b["proposed_to"], now + 60_000);
        assert_eq!(b["step_ids"], json!(steps));
        assert_eq!(batch[0].event, "approved");
        assert!(batch[0].step_id.is_none());
        for s in &steps {
            let per_step: Vec<Value> = records
                .iter()
                .filter(|r| r.step_id.as_deref() == Some(s.as_str()) && r.event == "approved")
                .map(|r| serde_json::from_str(&r.record).unwrap())
                .collect();
            assert_eq!(per_step.len(), 1, "{s}");
            assert_eq!(per_step[0]["detail"]["batch_id"], batch_id.as_str());
            assert!(per_step[0]["seq"].as_i64() > Some(batch[0].seq));
        }
        assert_eq!(
            app.store.verify_audit().await.unwrap(),
            Ok(records.len() as i64)
        );

        // The next call of each executes it, once; calling again returns the stored outcome.
        for a in &args {
            let reply = client.call("payment.schedule", a.clone()).await;
            assert_eq!(content(&reply)["status"], "scheduled", "{reply}");
        }
        assert_eq!(payments(&app).await, 3);
        for a in &args {
            let reply = client.call("payment.schedule", a.clone()).await;
            assert_eq!(content(&reply)["status"], "scheduled", "{reply}");
        }
        assert_eq!(payments(&app).await, 3);
        for s in &steps {
            assert_eq!(status(&app, s).await, StepStatus::Done);
        }
        let reply = client.call("payment.schedule", unlisted_args).await;
        assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
        assert_eq!(payments(&app).await, 3);
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_inputs_change_after_the_batch_is_refused_at_execution() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let first = payment_for("INV-20260611", json!(4180.00));
        let second = payment_for("INV-20260612", json!(1860.50));
        let s1 = waiting(&mut client, "payment.schedule", &first).await;
        let s2 = waiting(&mut client, "payment.schedule", &second).await;
        let now = app.store.clock().now_ms();
        let ana = app.demo_client("ana").await;
        let (code, answer) = post_batch(
            &app,
            &ana,
            "ana",
            &json!({
                "tool": "payment.schedule", "step_ids": [s1, s2], "max_count": 2,
                "proposed_from": now - 60_000, "proposed_to": now,
                "expires_at": now + 3_600_000, "reason": "June supplier run, three-way matched",
            }),
        )
        .await;
        assert_eq!(code, StatusCode::OK, "{answer}");
        assert_eq!(answer["approved"], 2, "{answer}");

        // The stored inputs of the first step change after the batch (one cent less): its
        // approval no longer binds them, it goes back through the gate, nothing is paid.
        let stored = app.store.get_step(&s1).await.unwrap();
        let changed = stored
            .inputs
            .replace("\"amount\":4180", "\"amount\":4179.99");
        assert_ne!(changed, stored.inputs);
        app.store
            .execute_sql(&format!(
                "UPDATE steps SET inputs = '{}' WHERE id = '{s1}'",
                changed.replace('\'', "''")
            ))
            .await
            .unwrap();
        let reply = client.call("payment.schedule", first.clone()).await;
        assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
        assert_eq!(status(&app, &s1).await, StepStatus::NeedsApproval);
        assert_eq!(payments(&app).await, 0);

        // The agent changes the second payment by one cent: another step, its own gate.
        let mut cent = second.clone();
        cent["amount"] = json!(1860.49);
        let reply = client.call("payment.schedule", cent).await;
        assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
        assert_ne!(content(&reply)["step_id"], s2.as_str());
        // The same step id with other inputs is refused outright.
        let mut tampered = second.clone();
        tampered["amount"] = json!(1860.51);
        let run = app.store.get_step(&s2).await.unwrap().run_id;
        let reply = client
            .call_meta(
                "payment.schedule",
                tampered,
                json!({"run_id": run, "step_id": s2}),
            )
            .await;
        assert_eq!(content(&reply)["status"], "refused", "{reply}");
        assert_eq!(payments(&app).await, 0);

        // Exactly the approved inputs: paid, once.
        let reply = client.call("payment.schedule", second).await;
        assert_eq!(content(&reply)["status"], "scheduled", "{reply}");
        assert_eq!(payments(&app).await, 1);
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_batch_approval_ended_waits_again_in_its_first_window() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let args = payment_for("INV-20260611", json!(4180.00));
        let step = waiting(&mut client, "payment.schedule", &args).await;
        let window = app.store.get_step(&step).await.unwrap().expires_at.unwrap();
        // Approved in a batch whose grant ends in a minute.
        let ana = app.demo_client("ana").await;
        approve_in_a_minute_long_batch(&app, &ana, &step).await;
        assert_eq!(status(&app, &step).await, StepStatus::Pending);
        // The agent comes back after the grant ended: the step waits again, in the window
        // its gate opened with (no new 72 hours).
        app.clock.advance(chrono::Duration::minutes(2));
        let reply = client.call("payment.schedule", args.clone()).await;
        assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
        let parked = app.store.get_step(&step).await.unwrap();
        assert_eq!(parked.status, StepStatus::NeedsApproval);
        assert_eq!(parked.expires_at, Some(window));
        // Past that window it expires, however often it was parked.
        app.clock
            .set(chrono::DateTime::from_timestamp_millis(window + 1).unwrap());
        let reply = client.call("payment.schedule", args).await;
        assert_eq!(content(&reply)["status"], "expired", "{reply}");
        assert_eq!(payments(&app).await, 0);
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_answers_steps_of_tools_the_approver_cannot_approve_as_missing() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let held = waiting(&mut client, "invoice.hold", &hold(json!(2000))).await;
        let paid = waiting(
            &mut client,
            "payment.schedule",
            &payment_for("INV-20260612", json!(1860.50)),
        )
        .await;
        // Holds are now decided by controllers only; Ana is an approver, not a controller.
        crate::helpers::use_finance_registry_with(
            &app,
            "    approval:\n      approver_roles: [approver]\n      expires: 72h\n      reversal_cost: 5\n    handler: {provider: erp, operation: invoices.hold}",
            "    approval:\n      approver_roles: [controller]\n      expires: 72h\n      reversal_cost: 5\n    handler: {provider: erp, operation: invoices.hold}",
        )
        .await;

        let ana = app.demo_client("ana").await;
        let now = app.store.clock().now_ms();
        for tool in ["payment.schedule", "invoice.hold"] {
            let (code, answer) = post_batch(
                &app,
                &ana,
                "ana",
                &json!({
                    "tool": tool, "step_ids": [&held, &paid], "max_count": 5,
                    "proposed_from": now - 3_600_000, "proposed_to": now + 3_600_000,
                    "expires_at": now + 3_600_000, "reason": "June supplier run",
                }),
            )
            .await;
            assert_eq!(code, StatusCode::OK, "{answer}");
            // Nothing about the hold is told: not its tool, not that it waits.
            assert_eq!(result_for(&answer, &held)["reason"], "not_found", "{tool}: {answer}");
            assert_eq!(result_for(&answer, &held)["message"], "no such step", "{answer}");
        }
        assert_eq!(status(&app, &held).await, StepStatus::NeedsApproval);
        assert!(app.store.approvals_for_step(&held).await.unwrap().is_empty());

        // A waiting step of a tool the registry no longer has is as missing too.
        let run = app.store.get_step(&held).await.unwrap().run_id;
        let gone =
            crate::helpers::park_step(&app.store, &run, "credit_note.issue", now + 3_600_000).await;
        let (code, answer) = post_batch(
            &app,
            &ana,
            "ana",
            &json!({
                "tool": "credit_note.issue", "step_ids": [&gone.id], "max_count": 1,
                "proposed_from": now - 3_600_000, "proposed_to": now + 3_600_000,
                "expires_at": now + 3_600_000, "reason": "June supplier run",
            }),
        )
        .await;
        assert_eq!(code, StatusCode::OK, "{answer}");
        assert_eq!(result_for(&answer, &gone.id)["reason"], "not_found", "{answer}");
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_whose_batch_approval_ended_may_approve_the_step_again() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let args = payment_for("INV-20260611", json!(4180.00));
        let step = waiting(&mut client, "payment.schedule", &args).await;
        let ana = app.demo_client("ana").await;
        approve_in_a_minute_long_batch(&app, &ana, &step).await;
        app.clock.advance(chrono::Duration::minutes(2));
        let reply = client.call("payment.schedule", args.clone()).await;
        assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
        // Her approval lapsed with the batch: she may decide this step again.
        let signature = crate::helpers::http_signature(&app, &ana, "ana", &step).await;
        let again = ana
            .post(app.url(&format!("/api/steps/{step}/decision")))
            .header("origin", format!("http://{}", app.addr))
            .json(
                &json!({"verdict": "approved", "reason": "checked the payment run again",
                          "signature": signature}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(
            again.status(),
            StatusCode::OK,
            "{}",
            again.text().await.unwrap()
        );
        let approvals = app.store.approvals_for_step(&step).await.unwrap();
        assert_eq!(
            approvals.len(),
            1,
            "the lapsed approval is replaced: {approvals:?}"
        );
        assert!(approvals[0].expires_at > app.store.clock().now_ms());
        let paid = client.call("payment.schedule", args).await;
        assert_eq!(content(&paid)["status"], "scheduled", "{paid}");
        assert_eq!(payments(&app).await, 1);
        // Both of her approvals stay in the audit.
        let approved = audit(&app)
            .await
            .into_iter()
            .filter(|r| r.step_id.as_deref() == Some(step.as_str()) && r.event == "approved")
            .count();
        assert_eq!(approved, 2);
        // A standing decision is still final: deciding once more is a conflict.
        let late = ana
            .post(app.url(&format!("/api/steps/{step}/decision")))
            .header("origin", format!("http://{}", app.addr))
            .json(&json!({"verdict": "rejected", "reason": "too late"}))
            .send()
            .await
            .unwrap();
        assert_eq!(late.status(), StatusCode::CONFLICT);
        app
    })
    .await;
}
