//! The gateway pipeline end to end over `/mcp`: steps, the gate, keys and the demo ERP's
//! state, on both backends. Assertions are on the audit log and on the target's effects.

use countersign::adapters::builtin::{ERP, Fault, FaultMode, inject_fault};
use countersign_core::StepStatus;
use countersign_core::approvals::{Approver, DecideError, Decider, GateRules, Verdict};
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::mcp::{
    Client, INV, agent, each_finance_app, each_finance_app_with, hold, payment, payment_for,
};

/// Ana, an approver who signed in just now (by the test clock's epoch: long ago is fine for
/// tools without step-up).
pub fn ana() -> Decider {
    Decider {
        approver: Approver {
            iss: "https://idp.example".into(),
            sub: "ana".into(),
        },
        roles: vec!["approver".into()],
        auth_time: 1_781_170_937_000,
        auth_time_unknown: false,
    }
}

/// One passkey-signed approval by an `approver` (payment.schedule's, below its second
/// approver's threshold, without its step-up).
pub fn signed() -> GateRules {
    GateRules {
        signature_required: true,
        ..one()
    }
}

/// One approval by an `approver`, no four eyes, no step-up.
pub fn one() -> GateRules {
    GateRules {
        approver_roles: vec!["approver".into()],
        four_eyes: false,
        approvals_needed: 1,
        step_up_max_age_ms: None,
        party_confirms: false,
        signature_required: false,
    }
}

async fn payments(app: &TestApp) -> usize {
    app.store
        .demo_effects(ERP, "payments.schedule")
        .await
        .unwrap()
        .len()
}

fn content(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

/// Proposes the 4,180.00 EUR payment and returns its waiting step id.
async fn waiting_payment(client: &mut Client<'_>, amount: Value) -> String {
    let reply = client.call("payment.schedule", payment(amount)).await;
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    assert_eq!(content(&reply)["status"], "needs_approval", "{reply}");
    assert_eq!(content(&reply)["rule"], "irreversible.always", "{reply}");
    content(&reply)["step_id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn gateway_gated_payment_waits_for_a_person_then_pays_exactly_once() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let step_id = waiting_payment(&mut client, json!(4180.00)).await;
        // The same call later reports the same waiting step; nothing reached the ERP.
        let again = client.call("payment.schedule", payment(json!(4180))).await;
        assert_eq!(content(&again)["step_id"], step_id.as_str(), "{again}");
        assert_eq!(content(&again)["status"], "needs_approval");
        assert_eq!(payments(&app).await, 0);

        let (approval, token) = crate::helpers::decide_signed(
            &app,
            &step_id,
            &ana(),
            &crate::gateway::signed(),
            Verdict::Approved,
            "matches PO-77812 line 2",
        )
        .await
        .unwrap();
        assert!(token.is_some());
        assert_eq!(approval.decision, "approved");

        let paid = client
            .call("payment.schedule", payment(json!(4180.00)))
            .await;
        assert_eq!(paid["result"]["isError"], false, "{paid}");
        let reference = content(&paid)["ref"].as_str().unwrap().to_string();
        assert!(reference.starts_with("PAYRUN-2026-06-15/"), "{paid}");
        assert_eq!(content(&paid)["status"], "scheduled");
        // Repeats, with a client-supplied key that is ignored: the stored outcome, one payment.
        for meta in [json!({}), json!({"idempotency_key": "client-key-1"})] {
            let again = client
                .call_meta("payment.schedule", payment(json!(4180)), meta)
                .await;
            assert_eq!(content(&again)["ref"], reference.as_str(), "{again}");
        }
        assert_eq!(payments(&app).await, 1);
        let step = app.store.get_step(&step_id).await.unwrap();
        assert_eq!(step.status, StepStatus::Done);
        assert_eq!(step.attempts, 1);
        assert!(step.idem_key.starts_with("idem:"), "{}", step.idem_key);
        let effect = &app
            .store
            .demo_effects(ERP, "payments.schedule")
            .await
            .unwrap()[0];
        assert_eq!(
            effect.idem_key, step.idem_key,
            "the ERP saw Countersign's key"
        );

        let events: Vec<String> = app
            .store
            .audit_in_order(0, 1000)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.step_id.as_deref() == Some(step_id.as_str()))
            .map(|r| r.event)
            .collect();
        let first: Vec<&str> = events.iter().map(String::as_str).take(2).collect();
        assert_eq!(first, ["decided", "waiting_approval"], "{events:?}");
        for e in ["approved", "started", "succeeded"] {
            assert_eq!(
                events.iter().filter(|x| *x == e).count(),
                1,
                "{e}: {events:?}"
            );
        }
        assert!(app.store.verify_audit().await.unwrap().is_ok());
        app
    })
    .await;
}

#[tokio::test]
async fn gateway_500_concurrent_identical_payments_make_one_payment() {
    each_finance_app(|app| async move {
        let (cred, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let step_id = waiting_payment(&mut client, json!(4180.00)).await;
        crate::helpers::decide_signed(
            &app,
            &step_id,
            &ana(),
            &crate::gateway::signed(),
            Verdict::Approved,
            "checked against the PO",
        )
        .await
        .unwrap();
        let run_id = app.store.get_step(&step_id).await.unwrap().run_id;
        assert_eq!(
            app.store
                .get_run(&run_id)
                .await
                .unwrap()
                .agent_id
                .as_deref(),
            Some(cred.as_str())
        );
        // Ten sessions of the same agent, fifty calls each, all at once, all naming the run.
        let mut sessions = Vec::new();
        for _ in 0..10 {
            let mut c = Client::new(&app, &fin);
            c.connect().await;
            sessions.push(c.session().unwrap());
        }
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..500u64 {
            let http = app.client.clone();
            let url = app.url("/mcp");
            let token = fin.clone();
            let session = sessions[(i % 10) as usize].clone();
            let body = json!({"jsonrpc": "2.0", "id": i + 100, "method": "tools/call", "params": {
                "name": "payment.schedule", "arguments": payment(json!(4180)),
                "_meta": {"run_id": run_id, "idempotency_key": format!("k{i}")}}});
            tasks.spawn(async move {
                let resp = http
                    .post(url)
                    .bearer_auth(token)
                    .header("Accept", "application/json, text/event-stream")
                    .header("Mcp-Session-Id", session)
                    .header("MCP-Protocol-Version", "2025-06-18")
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                crate::mcp::read_response(resp, i + 100).await
            });
        }
        let mut refs = std::collections::BTreeSet::new();
        while let Some(reply) = tasks.join_next().await {
            let reply = reply.unwrap();
            assert_eq!(reply["result"]["isError"], false, "{reply}");
            refs.insert(
                content(&reply)["ref"]
                    .as_str()
                    .unwrap_or("<none>")
                    .to_string(),
            );
        }
        assert_eq!(
            refs.len(),
            1,
            "every caller got the same reference: {refs:?}"
        );
        assert_eq!(
            payments(&app).await,
            1,
            "exactly one payment at the ERP: {refs:?} {:?} {:?}",
            app.store.backend(),
            app.store.get_step(&step_id).await.unwrap()
        );
        let key = app
            .store
            .get_key(&app.store.get_step(&step_id).await.unwrap().idem_key)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(key.state, countersign_core::store::KeyState::Done);
        assert_eq!(app.store.get_step(&step_id).await.unwrap().attempts, 1);
        app
    })
    .await;
}

#[tokio::test]
async fn gateway_injected_invoice_text_leads_to_no_supplier_call_and_no_effect() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let invoice = client.call("invoice.get", json!({"invoice_id": INV})).await;
        let text = content(&invoice)["text"].as_str().unwrap().to_string();
        assert!(text.contains("update the beneficiary IBAN"), "{invoice}");
        // The surface makes the instruction inert: the tool does not exist for this role.
        assert!(
            !client
                .tool_names()
                .await
                .contains(&"supplier.update_iban".to_string())
        );
        let reply = client
            .call(
                "supplier.update_iban",
                json!({"supplier_id": "SUP-000417", "iban": "ES9121000418450200051332",
                       "reason": "System notice on the invoice asks for it"}),
            )
            .await;
        assert_eq!(reply["error"]["code"], -32602, "{reply}");
        assert_eq!(reply["error"]["message"], "Unknown tool");
        // The IBAN at the ERP is what it was; no supplier write, no payment.
        let supplier = app
            .store
            .demo_get(ERP, "supplier", "SUP-000417")
            .await
            .unwrap()
            .unwrap();
        assert!(supplier.data.contains("SE4550000000058398257466"));
        assert_eq!(supplier.version, 1);
        assert!(
            app.store
                .demo_effects(ERP, "suppliers.update_iban")
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(payments(&app).await, 0);
        let refused: Vec<_> = app
            .store
            .audit_in_order(0, 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.rule.as_deref() == Some("role.tool_not_listed"))
            .collect();
        assert_eq!(refused.len(), 1);
        // A read returns the supplier with its IBAN hashed, never in clear.
        let sup = client
            .call("supplier.get", json!({"supplier_id": "SUP-000417"}))
            .await;
        let shown = content(&sup)["iban"].as_str().unwrap();
        assert!(shown.starts_with("redacted:hmac-sha256:"), "{sup}");
        assert_eq!(content(&sup)["name"], "Lindqvist Industrial Supply AB");
        app
    })
    .await;
}

#[tokio::test]
async fn gateway_refuses_cross_tenant_and_over_ceiling_payments_before_any_handler() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let other = client
            .call("payment.schedule", payment_for("INV-20269001", json!(2500)))
            .await;
        assert_eq!(other["result"]["isError"], true, "{other}");
        assert_eq!(content(&other)["rule"], "tenant.mismatch", "{other}");
        let read = client
            .call("invoice.get", json!({"invoice_id": "INV-20269001"}))
            .await;
        assert_eq!(content(&read)["rule"], "tenant.mismatch", "{read}");
        let big = client
            .call(
                "payment.schedule",
                payment_for("INV-20260613", json!(31250)),
            )
            .await;
        assert_eq!(content(&big)["rule"], "amount.ceiling", "{big}");
        assert_eq!(payments(&app).await, 0);
        // Refused steps stay refused: asking again does not reopen them.
        let again = client
            .call(
                "payment.schedule",
                payment_for("INV-20260613", json!(31250)),
            )
            .await;
        assert_eq!(content(&again)["status"], "denied", "{again}");
        assert_eq!(payments(&app).await, 0);
        app
    })
    .await;
}

#[tokio::test]
async fn gateway_a_changed_cent_needs_a_new_approval_and_a_mismatched_step_is_refused() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let approved = waiting_payment(&mut client, json!(4180.00)).await;
        crate::helpers::decide_signed(
            &app,
            &approved,
            &ana(),
            &crate::gateway::signed(),
            Verdict::Approved,
            "checked",
        )
        .await
        .unwrap();
        // One cent more is another call: a new step, back through the gate, nothing paid.
        let changed = waiting_payment(&mut client, json!(4179.99)).await;
        assert_ne!(changed, approved);
        assert_eq!(payments(&app).await, 0);
        // Naming the approved step with other inputs is refused outright.
        let reply = client
            .call_meta(
                "payment.schedule",
                payment(json!(4179.99)),
                json!({"step_id": approved}),
            )
            .await;
        assert_eq!(reply["result"]["isError"], true, "{reply}");
        assert_eq!(content(&reply)["rule"], "idempotency.mismatch", "{reply}");
        assert_eq!(payments(&app).await, 0);
        // Reordered keys are the same inputs: the approval holds.
        let reordered = json!({"reason": crate::mcp::REASON, "value_date": "2026-06-15",
                               "currency": "EUR", "amount": 4180, "invoice_id": INV});
        let paid = client
            .call_meta("payment.schedule", reordered, json!({"step_id": approved}))
            .await;
        assert_eq!(content(&paid)["status"], "scheduled", "{paid}");
        assert_eq!(payments(&app).await, 1);
        app
    })
    .await;
}

#[tokio::test]
async fn gateway_expired_gates_fail_closed() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        // Never approved: past 72 h the step expires and cannot be approved any more.
        let stale = waiting_payment(&mut client, json!(4180.00)).await;
        app.clock.advance(chrono::Duration::seconds(72 * 3600 + 1));
        let late = crate::helpers::decide_signed(
            &app,
            &stale,
            &ana(),
            &crate::gateway::signed(),
            Verdict::Approved,
            "late",
        )
        .await;
        assert!(matches!(late, Err(DecideError::Expired)), "{late:?}");
        let reply = client
            .call("payment.schedule", payment(json!(4180.00)))
            .await;
        assert_eq!(reply["result"]["isError"], true, "{reply}");
        assert_eq!(content(&reply)["status"], "expired", "{reply}");
        assert_eq!(
            app.store.get_step(&stale).await.unwrap().status,
            StepStatus::Expired
        );

        // Approved at t, executed at t + 72 h + 1 s: expired, no call at the target.
        let hold_step = {
            let reply = client.call("invoice.hold", hold(json!(2000))).await;
            content(&reply)["step_id"].as_str().unwrap().to_string()
        };
        app.store
            .decide_step(
                &hold_step,
                &ana(),
                &crate::gateway::one(),
                Verdict::Approved,
                "dispute is real",
            )
            .await
            .unwrap();
        app.clock.advance(chrono::Duration::seconds(72 * 3600 + 1));
        let reply = client.call("invoice.hold", hold(json!(2000))).await;
        assert_eq!(content(&reply)["status"], "expired", "{reply}");
        assert!(
            app.store
                .demo_effects(ERP, "invoices.hold")
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(payments(&app).await, 0);
        let expired = app
            .store
            .audit_in_order(0, 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.event == "expired")
            .count();
        assert_eq!(expired, 2);
        app
    })
    .await;
}

#[tokio::test]
async fn gateway_rejected_steps_never_run() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let step = waiting_payment(&mut client, json!(4180.00)).await;
        let (_, token) = app
            .store
            .decide_step(
                &step,
                &ana(),
                &crate::gateway::one(),
                Verdict::Rejected,
                "supplier disputes the amount",
            )
            .await
            .unwrap();
        assert!(token.is_none());
        let reply = client
            .call("payment.schedule", payment(json!(4180.00)))
            .await;
        assert_eq!(reply["result"]["isError"], true, "{reply}");
        assert_eq!(
            app.store.get_step(&step).await.unwrap().status,
            StepStatus::Refused
        );
        assert_eq!(payments(&app).await, 0);
        // A decided step cannot be decided again.
        let again = app
            .store
            .decide_step(
                &step,
                &ana(),
                &crate::gateway::one(),
                Verdict::Approved,
                "changed my mind",
            )
            .await;
        assert!(
            matches!(again, Err(DecideError::NotWaiting(_))),
            "{again:?}"
        );
        app
    })
    .await;
}

#[tokio::test]
async fn gateway_timeout_after_the_effect_leaves_an_irreversible_step_unknown_not_retried() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let step = waiting_payment(&mut client, json!(4180.00)).await;
        crate::helpers::decide_signed(
            &app,
            &step,
            &ana(),
            &crate::gateway::signed(),
            Verdict::Approved,
            "checked",
        )
        .await
        .unwrap();
        let fault = Fault {
            mode: FaultMode::TimeoutAfterEffect,
            times: 1,
        };
        inject_fault(&app.store, ERP, "payments.schedule", &fault)
            .await
            .unwrap();
        let reply = client
            .call("payment.schedule", payment(json!(4180.00)))
            .await;
        assert_eq!(reply["result"]["isError"], false, "{reply}");
        assert_eq!(content(&reply)["status"], "unknown", "{reply}");
        assert_eq!(payments(&app).await, 1, "the effect happened");
        // Asking again does not retry blind.
        let again = client
            .call("payment.schedule", payment(json!(4180.00)))
            .await;
        assert_eq!(content(&again)["status"], "unknown", "{again}");
        assert_eq!(payments(&app).await, 1);
        let s = app.store.get_step(&step).await.unwrap();
        assert_eq!((s.status, s.attempts), (StepStatus::Unknown, 1));
        app
    })
    .await;
}

#[tokio::test]
async fn gateway_retries_a_write_the_target_never_applied() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let fault = Fault {
            mode: FaultMode::Unavailable,
            times: 1,
        };
        inject_fault(&app.store, ERP, "notes.draft", &fault)
            .await
            .unwrap();
        let note = json!({"invoice_id": INV, "text": "Paid after three-way match."});
        let first = client.call("note.draft", note.clone()).await;
        assert_eq!(first["result"]["isError"], true, "{first}");
        assert_eq!(content(&first)["retryable"], true, "{first}");
        let second = client.call("note.draft", note.clone()).await;
        assert_eq!(second["result"]["isError"], false, "{second}");
        assert_eq!(content(&second)["note_id"], "NOTE-00000001", "{second}");
        let third = client.call("note.draft", note).await;
        assert_eq!(content(&third)["note_id"], "NOTE-00000001", "{third}");
        assert_eq!(
            app.store
                .demo_effects(ERP, "notes.draft")
                .await
                .unwrap()
                .len(),
            1
        );
        // A business refusal is final: the ERP will not hold a paid invoice, and is not asked twice.
        app
    })
    .await;
}

#[tokio::test]
async fn metrics_with_a_token_configured_answer_only_a_scraper_sending_it() {
    const TOKEN: &str = "scrape-0123456789abcdef0123456789abcdef";
    each_finance_app_with(&[("COUNTERSIGN_METRICS_TOKEN", TOKEN)], |app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        client.call("invoice.get", json!({"invoice_id": INV})).await;
        let scrape = |auth: Option<String>| {
            let mut req = app.client.get(app.url("/metrics"));
            if let Some(auth) = auth {
                req = req.header("authorization", auth);
            }
            req.send()
        };
        for auth in [
            None,
            Some("Bearer wrong-0123456789abcdef0123456789abcdef".to_string()),
            Some(format!("Bearer {}", &TOKEN[..TOKEN.len() - 1])),
            Some(format!("Basic {TOKEN}")),
            Some(format!("Bearer {TOKEN}x")),
            // An agent's own credential is not a scrape token.
            Some(format!("Bearer {fin}")),
        ] {
            let resp = scrape(auth.clone()).await.unwrap();
            assert_eq!(resp.status(), reqwest::StatusCode::UNAUTHORIZED, "{auth:?}");
            assert_eq!(
                resp.headers()["www-authenticate"],
                "Bearer realm=\"metrics\"",
                "{auth:?}"
            );
            let body = resp.text().await.unwrap();
            assert!(!body.contains("countersign_"), "{auth:?}: {body}");
        }
        // The scheme's case does not matter.
        let resp = scrape(Some(format!("bearer {TOKEN}"))).await.unwrap();
        assert_eq!(resp.status(), reqwest::StatusCode::OK);
        let resp = scrape(Some(format!("Bearer {TOKEN}"))).await.unwrap();
        assert_eq!(resp.status(), reqwest::StatusCode::OK);
        let text = resp.text().await.unwrap();
        let line = "countersign_tool_calls_total{tool=\"invoice.get\",decision=\"allow\",outcome=\"done\"} 1";
        assert!(text.lines().any(|l| l == line), "missing {line} in:\n{text}");
        app
    })
    .await;
}

#[tokio::test]
async fn gateway_metrics_count_calls_and_the_gate_queue() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        waiting_payment(&mut client, json!(4180.00)).await;
        client.call("invoice.get", json!({"invoice_id": INV})).await;
        client.call("invoice.get", json!({"invoice_id": INV})).await;
        client.call("supplier.update_iban", json!({})).await;
        let text = app
            .client
            .get(app.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for line in [
            "countersign_tool_calls_total{tool=\"payment.schedule\",decision=\"require_approval\",outcome=\"needs_approval\"} 1",
            "countersign_tool_calls_total{tool=\"invoice.get\",decision=\"allow\",outcome=\"done\"} 2",
            "countersign_tool_calls_total{tool=\"<unlisted>\",decision=\"refuse\",outcome=\"unknown_tool\"} 1",
            "countersign_tool_call_duration_seconds_count{tool=\"invoice.get\"} 2",
            "countersign_gate_queue_depth 1",
            "countersign_steps_unknown 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in:\n{text}");
        }
        app
    })
    .await;
}

#[tokio::test]
async fn gateway_audit_records_inputs_with_the_iban_hashed_by_the_configured_key() {
    let key = [(
        "COUNTERSIGN_REDACTION_KEY",
        "a-test-redaction-key-of-at-least-32-bytes!",
    )];
    crate::mcp::each_finance_app_with(&key, |app| async move {
        let (_, vm) = agent(&app, "vm-1", "worker.vendor_master").await;
        let mut vendor = Client::new(&app, &vm);
        vendor.connect().await;
        let iban = "DE89370400440532013000";
        let args = json!({"supplier_id": "SUP-000417", "iban": iban, "reason": crate::mcp::REASON});
        vendor.call("supplier.update_iban", args.clone()).await;
        // The same IBAN in another call hashes the same (equal values compare equal).
        let other =
            json!({"supplier_id": "SUP-000502", "iban": iban, "reason": crate::mcp::REASON});
        vendor.call("supplier.update_iban", other).await;
        let decided: Vec<Value> = app
            .store
            .audit_in_order(0, 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.event == "decided")
            .map(|r| serde_json::from_str::<Value>(&r.record).unwrap())
            .collect();
        assert_eq!(decided.len(), 2);
        let a = &decided[0]["detail"]["inputs"];
        let b = &decided[1]["detail"]["inputs"];
        assert_eq!(
            a["supplier_id"], "SUP-000417",
            "unclassified fields stay readable"
        );
        let digest = a["iban"].as_str().unwrap();
        assert!(!digest.contains(iban) && digest != iban, "{a}");
        assert!(
            !digest.starts_with("redacted:sha256:"),
            "keyed HMAC, not the plain fallback: {a}"
        );
        assert_eq!(a["iban"], b["iban"]);
        for r in app.store.audit_in_order(0, 100).await.unwrap() {
            assert!(
                !r.record.contains(iban),
                "IBAN in clear in record {}",
                r.seq
            );
        }
        app
    })
    .await;
}

#[tokio::test]
async fn gateway_gate_notifications_are_retried_and_never_block_the_call() {
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let hits = seen.clone();
    let hook = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let hits = hits.clone();
            async move {
                let mut h = hits.lock().unwrap();
                h.push(body);
                // The first delivery fails; the retry succeeds.
                if h.len() == 1 {
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, hook).await.unwrap() });
    let urls = format!("http://{addr}/hook, http://127.0.0.1:9/unreachable");
    let env = [("COUNTERSIGN_WEBHOOK_URLS", urls.as_str())];
    crate::mcp::each_finance_app_with(&env, |app| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().clear();
            let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
            let mut client = Client::new(&app, &fin);
            client.connect().await;
            let step = waiting_payment(&mut client, json!(4180.00)).await;
            let began = std::time::Instant::now();
            while seen.lock().unwrap().len() < 2 {
                assert!(
                    began.elapsed() < std::time::Duration::from_secs(10),
                    "no retry"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            let bodies = seen.lock().unwrap().clone();
            assert_eq!(bodies[0], bodies[1], "the retry repeats the notification");
            assert_eq!(bodies[1]["step_id"], step.as_str());
            let text = bodies[1]["text"].as_str().unwrap();
            assert!(
                text.contains("payment.schedule") && text.contains("/inbox/"),
                "{text}"
            );
            // No inputs: neither a field nor a value of the call. (Its ids and `expires_at`
            // are digits and hex, which may hold "4180" by chance: the amount is looked for
            // with its decimal point.)
            let body = bodies[1].to_string();
            for input in [
                "amount",
                "4180.0",
                "currency",
                "EUR",
                "value_date",
                "2026-06-15",
            ] {
                assert!(!body.contains(input), "{input} in a notification: {body}");
            }
            app
        }
    })
    .await;
}

/// The runs `agent_id` has in tenant acme.
pub async fn runs_of(app: &TestApp, agent_id: &str) -> Vec<countersign_core::store::Run> {
    app.store
        .list_runs("acme", 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.agent_id.as_deref() == Some(agent_id))
        .collect()
}

#[tokio::test]
async fn gateway_a_run_cancelled_between_two_calls_of_a_session_withholds_the_second() {
    // The second call's context is read with its authentication: the cancel is seen, even
    // though the session's run was looked up (and remembered) by the first call.
    each_finance_app(|app| async move {
        let (id, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let first = client.call("invoice.get", json!({"invoice_id": INV})).await;
        assert_eq!(first["result"]["isError"], false, "{first}");
        assert_eq!(content(&first)["invoice_id"], INV, "{first}");
        let runs = runs_of(&app, &id).await;
        assert_eq!(runs.len(), 1);
        app.store
            .set_run_status(&runs[0].id, countersign_core::store::RunStatus::Cancelled)
            .await
            .unwrap();
        let second = client.call("invoice.get", json!({"invoice_id": INV})).await;
        assert_eq!(second["result"]["isError"], true, "{second}");
        assert_eq!(content(&second)["status"], "cancelled", "{second}");
        assert_eq!(content(&second)["rule"], "run.cancelled", "{second}");
        assert!(content(&second).get("invoice_id").is_none(), "{second}");
        let mut steps: Vec<(String, StepStatus)> = app
            .store
            .steps_for_run(&runs[0].id)
            .await
            .unwrap()
            .into_iter()
            .map(|s| (s.tool, s.status))
            .collect();
        steps.sort_by_key(|(_, s)| s.as_str());
        assert_eq!(
            steps,
            vec![
                ("invoice.get".to_string(), StepStatus::Cancelled),
                ("invoice.get".to_string(), StepStatus::Done),
            ]
        );
        app
    })
    .await;
}

#[tokio::test]
async fn gateway_a_session_id_presented_with_another_agents_token_is_not_found() {
    // A session belongs to the agent that opened it: another agent naming it (to call, resume
    // its stream or end it) is answered as for a session that does not exist.
    each_finance_app(|app| async move {
        let (a_id, a_token) = agent(&app, "fin-a", "worker.finance").await;
        let (b_id, b_token) = agent(&app, "fin-b", "worker.finance").await;
        let mut a = Client::new(&app, &a_token);
        a.connect().await;
        for _ in 0..2 {
            let reply = a.call("invoice.get", json!({"invoice_id": INV})).await;
            assert_eq!(reply["result"]["isError"], false, "{reply}");
        }
        let mut b = Client::new(&app, &b_token);
        b.use_session(a.session());
        let (status, reply) = b
            .try_request(
                "tools/call",
                json!({"name": "invoice.get", "arguments": {"invoice_id": INV}}),
            )
            .await;
        let a_runs = runs_of(&app, &a_id).await;
        assert_eq!(a_runs.len(), 1);
        let a_steps = app.store.steps_for_run(&a_runs[0].id).await.unwrap();
        assert_eq!(a_steps.len(), 2, "only A's own calls are in A's run");
        assert!(
            a_steps
                .iter()
                .all(|s| s.agent_id.as_deref() == Some(a_id.as_str()))
        );
        // The session is A's: for B it does not exist.
        assert_eq!(status, reqwest::StatusCode::NOT_FOUND, "{reply:?}");
        assert!(
            runs_of(&app, &b_id).await.is_empty(),
            "B's call ran nowhere"
        );
        let session = a.session().unwrap();
        let raw = |method: reqwest::Method, token: &str| {
            app.client
                .request(method, app.url("/mcp"))
                .bearer_auth(token)
                .header("mcp-session-id", &session)
                .header("mcp-protocol-version", crate::mcp::PROTOCOL)
                .header("accept", "text/event-stream")
                .header("last-event-id", "0")
        };
        // B can neither resume A's stream (and read A's results) nor end A's session.
        let resumed = raw(reqwest::Method::GET, &b_token).send().await.unwrap();
        assert_eq!(resumed.status(), reqwest::StatusCode::NOT_FOUND);
        let ended = raw(reqwest::Method::DELETE, &b_token).send().await.unwrap();
        assert_eq!(ended.status(), reqwest::StatusCode::NOT_FOUND);
        let reply = a.call("invoice.get", json!({"invoice_id": INV})).await;
        assert_eq!(
            reply["result"]["isError"], false,
            "A's session lives on: {reply}"
        );
        // A ends its own session.
        let ended = raw(reqwest::Method::DELETE, &a_token).send().await.unwrap();
        assert!(ended.status().is_success(), "{}", ended.status());
        app
    })
    .await;
}

/// The finance registry's `name` tool with `rules` as its redaction.
fn tool_redacting(
    name: &str,
    rules: &[(&str, countersign_core::registry::RedactHow)],
) -> countersign_core::registry::Tool {
    let registry = countersign_core::Registry::from_path(std::path::Path::new(&format!(
        "{}/registry.yaml",
        crate::helpers::example("finance")
    )))
    .unwrap();
    let mut tool = registry
        .tool(&countersign_core::ToolName::parse(name).unwrap())
        .unwrap()
        .clone();
    tool.redact = rules
        .iter()
        .map(|(field, how)| countersign_core::registry::Redaction {
            field: (*field).to_string(),
            how: *how,
        })
        .collect();
    tool
}

#[test]
fn gateway_redaction_honours_dotted_paths_bare_names_and_drop_over_hash() {
    use countersign_core::registry::RedactHow::{Drop, Hash};
    use sha2::Digest as _;
    let iban = "SE4550000000058398257466";
    let key = countersign_core::redact::RedactionKey::random().unwrap();
    let result = json!({
        "supplier": {"id": "SUP-000042", "iban": iban, "bank": {"iban": iban}},
        "lines": [{"iban": iban, "amount": 1}, {"iban": iban, "amount": 2}],
        "iban": "top-level",
        "contact": {"email": "ap@supplier.example"}
    });
    // A path reaches one member (arrays transparent); the same name elsewhere stays.
    let tool = tool_redacting(
        "supplier.get",
        &[("supplier.iban", Hash), ("lines.iban", Drop)],
    );
    let shown = countersign::pipeline::redacted(&key, &tool, &result);
    assert!(
        shown["supplier"]["iban"]
            .as_str()
            .unwrap()
            .starts_with("redacted:hmac-sha256:"),
        "{shown}"
    );
    // Keyed: the plain SHA-256 of the value (what a dictionary of IBANs would hold) is not
    // what the agent sees, and another key gives another digest.
    let plain: String = sha2::Sha256::digest(format!("\"{iban}\"").as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let digest = shown["supplier"]["iban"].as_str().unwrap();
    assert!(!digest.contains(&plain[..16]), "{digest}");
    let other = countersign_core::redact::RedactionKey::random().unwrap();
    let again = countersign::pipeline::redacted(&other, &tool, &result);
    assert_ne!(again["supplier"]["iban"], shown["supplier"]["iban"]);
    assert_eq!(
        countersign::pipeline::redacted(&key, &tool, &result),
        shown,
        "one key: equal values compare equal"
    );
    assert_eq!(
        shown["supplier"]["bank"]["iban"], iban,
        "a path is not a bare name"
    );
    assert_eq!(shown["lines"][0], json!({"amount": 1}), "{shown}");
    assert_eq!(shown["lines"][1], json!({"amount": 2}), "{shown}");
    assert_eq!(shown["iban"], "top-level");
    assert_eq!(shown["supplier"]["id"], "SUP-000042");
    // A bare name reaches every depth; drop wins over hash on one member.
    let tool = tool_redacting("supplier.get", &[("iban", Hash), ("supplier.iban", Drop)]);
    let shown = countersign::pipeline::redacted(&key, &tool, &result);
    assert!(shown["supplier"].get("iban").is_none(), "{shown}");
    let text = shown.to_string();
    assert!(
        !text.contains(iban) && !text.contains("top-level"),
        "{text}"
    );
    assert_eq!(shown["contact"]["email"], "ap@supplier.example");
    // A rule that does not parse withholds everything.
    let tool = tool_redacting("supplier.get", &[("supplier..iban", Hash)]);
    let shown = countersign::pipeline::redacted(&key, &tool, &result);
    assert!(!shown.to_string().contains(iban), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_mcp_streams_instead_of_waiting_for_them() {
    let registry = crate::helpers::example("finance");
    let app = crate::helpers::spawn_app_with(
        countersign_core::Backend::Sqlite,
        &[("COUNTERSIGN_REGISTRY", registry.as_str())],
    )
    .await
    .unwrap();
    let (_, token) = crate::mcp::agent(&app, "fin-1", "worker.finance").await;
    let mut client = crate::mcp::Client::new(&app, &token);
    client.connect().await;
    let session = client.session().unwrap();
    // The agent holds the session's standalone SSE stream open, as clients do.
    let stream = app
        .client
        .get(app.url("/mcp"))
        .bearer_auth(&token)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", crate::mcp::PROTOCOL)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert!(stream.status().is_success(), "{}", stream.status());
    // Stopping returns (before, the drain waited for the stream for good); a bound far above
    // the shutdown grace tells "returned" from "hangs".
    let stopped = tokio::time::timeout(std::time::Duration::from_secs(60), app.stop()).await;
    assert!(
        stopped.is_ok(),
        "the server did not stop while an MCP stream was open"
    );
    // And the stream itself was ended by the server, not left dangling.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(60), stream.bytes()).await;
    assert!(ended.is_ok(), "the MCP stream stayed open after shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_credential_holds_a_bounded_number_of_mcp_sessions() {
    each_finance_app(|app| async move {
        let (_, token) = agent(&app, "fin-1", "worker.finance").await;
        let open = crate::mcp::fill_sessions(&app, &token).await;
        let initialize = crate::mcp::initialize_params();
        let mut extra = Client::new(&app, &token);
        let (status, _) = extra.try_request("initialize", initialize.clone()).await;
        assert_eq!(status, reqwest::StatusCode::TOO_MANY_REQUESTS);
        // Another credential is not affected.
        let (_, other) = agent(&app, "fin-2", "worker.finance").await;
        Client::new(&app, &other).connect().await;
        // Ending one session makes room for one more.
        let ended = app
            .client
            .delete(app.url("/mcp"))
            .bearer_auth(&token)
            .header("mcp-session-id", &open[0])
            .header("mcp-protocol-version", crate::mcp::PROTOCOL)
            .send()
            .await
            .unwrap();
        assert!(ended.status().is_success(), "{}", ended.status());
        let mut again = Client::new(&app, &token);
        let (status, _) = again.try_request("initialize", initialize).await;
        assert_eq!(status, reqwest::StatusCode::OK);
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_initializes_cannot_exceed_the_session_limit() {
    use countersign::mcp::guard::MAX_SESSIONS_PER_AGENT;
    each_finance_app(|app| async move {
        let (_, token) = agent(&app, "fin-1", "worker.finance").await;
        let initialize = crate::mcp::initialize_params();
        let attempts = (0..MAX_SESSIONS_PER_AGENT + 12).map(|_| {
            let initialize = initialize.clone();
            let app = &app;
            let token = &token;
            async move {
                Client::new(app, token)
                    .try_request("initialize", initialize)
                    .await
                    .0
            }
        });
        let statuses = futures_util::future::join_all(attempts).await;
        let opened = statuses.iter().filter(|s| s.is_success()).count();
        assert!(opened <= MAX_SESSIONS_PER_AGENT, "{opened} sessions opened");
        assert!(
            statuses
                .iter()
                .all(|s| s.is_success() || *s == reqwest::StatusCode::TOO_MANY_REQUESTS),
            "{statuses:?}"
        );
        app
    })
    .await;
}

/// A read that ran is audited by one record, its outcome's, which carries what its decision
/// and its start would have recorded (issue 34: one record a read); a read that fails at its
/// target keeps the decision's rule beside its own.
#[tokio::test]
async fn gateway_a_read_is_audited_by_one_record_carrying_its_decision() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let read = client.call("invoice.get", json!({"invoice_id": INV})).await;
        assert_eq!(read["result"]["isError"], false, "{read}");
        let records: Vec<_> = app
            .store
            .audit_in_order(0, 1_000_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.tool.as_deref() == Some("invoice.get"))
            .collect();
        assert_eq!(records.len(), 1, "{records:?}");
        let r = &records[0];
        assert_eq!(r.event, "succeeded");
        assert_eq!(r.rule.as_deref(), Some("policy.allow"), "{r:?}");
        assert!(countersign::pipeline::folds(
            &r.record,
            countersign_core::audit::AuditEvent::Decided
        ));
        let body: Value = serde_json::from_str(&r.record).unwrap();
        let d = &body["detail"];
        assert_eq!(d["decision"], "allow", "{d}");
        assert_eq!(d["inputs"]["invoice_id"], INV, "{d}");
        assert_eq!(
            d[countersign::pipeline::FOLDED],
            json!(["decided", "started"])
        );
        for member in [
            "inputs_hash",
            "idem_key",
            "policy_ids",
            "attempt",
            "latency_ms",
        ] {
            assert!(!d[member].is_null(), "{member} missing: {d}");
        }

        // Failed at the target: its own rule, and the decision's beside it.
        let fault = Fault {
            mode: FaultMode::Unavailable,
            times: 1,
        };
        inject_fault(&app.store, ERP, "invoices.get", &fault)
            .await
            .unwrap();
        let failed = client.call("invoice.get", json!({"invoice_id": INV})).await;
        assert_eq!(failed["result"]["isError"], true, "{failed}");
        let last = app.store.audit_in_order(0, 1_000_000).await.unwrap();
        let r = last.last().unwrap();
        assert_eq!(r.event, "failed", "{r:?}");
        assert_eq!(
            r.rule.as_deref(),
            Some(countersign::pipeline::TARGET_FAILED)
        );
        let body: Value = serde_json::from_str(&r.record).unwrap();
        assert_eq!(
            body["detail"][countersign::pipeline::DECISION_RULE],
            "policy.allow",
            "{body}"
        );
        app
    })
    .await;
}
