//! Escalations (issue 36), on both backends: an `unknown` the target cannot tell about goes to
//! a person after the reconciler's grace period and is settled by two people for an
//! irreversible tool (each refusal writes nothing); a write whose undo failed is undone once by
//! a person's approval; an effect nothing can undo is acknowledged; reconciliation that later
//! succeeds closes the escalation itself.

use std::time::{Duration, Instant};

use countersign::adapters::builtin::{ERP, Fault, FaultMode, LOOKUP, inject_fault};
use countersign::executor::{Timings, reconcile_once};
use countersign_core::policy::TaskOrigin;
use countersign_core::store::{KeyState, NewAgent, NewRun, NewStep, RunStatus, Step, Transition};
use countersign_core::{CanonicalJson, Effect, StepStatus};
use reqwest::StatusCode;
use reqwest::header::LOCATION;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::mcp::{Client, agent, each_finance_app, each_finance_app_with, payment};
use crate::runs::{note_step, submit};

/// A step of `tool` in a run of its own (tenant acme) proposed by credential `agent`, moved
/// to `unknown`.
async fn unknown_step(
    app: &TestApp,
    tool: &str,
    effect: Effect,
    inputs: Value,
    agent: Option<&str>,
) -> Step {
    let run = app
        .store
        .create_run(&NewRun {
            tenant: "acme".into(),
            principal: "agent:test".into(),
            agent_id: agent.map(str::to_string),
            task: "Pay the June freight".into(),
            origin: "user".into(),
            planned: false,
        })
        .await
        .unwrap();
    let (step, _) = app
        .store
        .open_step(&NewStep {
            run_id: run.id,
            role: "worker.finance".into(),
            tool: tool.into(),
            effect,
            inputs: CanonicalJson::from_value(&inputs).unwrap(),
            agent_id: agent.map(str::to_string),
            reason: String::new(),
            evidence: vec![],
            observed: None,
            trace_id: "t".into(),
            status: StepStatus::Pending,
        })
        .await
        .unwrap();
    app.store
        .transition(&Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending],
            to: Some(StepStatus::Unknown),
            ..Transition::default()
        })
        .await
        .unwrap()
        .unwrap();
    app.store.get_step(&step.id).await.unwrap()
}

/// The ERP's key lookup cannot answer for the next `times` lookups.
async fn lookup_down(app: &TestApp, times: u32) {
    inject_fault(
        &app.store,
        ERP,
        LOOKUP,
        &Fault {
            mode: FaultMode::Unavailable,
            times,
        },
    )
    .await
    .unwrap();
}

/// One reconciler pass that escalates at once.
async fn reconcile(app: &TestApp) -> usize {
    app.clock.advance(chrono::Duration::seconds(1));
    let timings = Timings {
        escalate_unknown_after: Duration::ZERO,
        ..Timings::default()
    };
    reconcile_once(&app.state, timings).await.unwrap()
}

/// Posts an escalation action as `who`; returns the redirect's target.
async fn act(who: &reqwest::Client, app: &TestApp, id: &str, form: &[(&str, &str)]) -> String {
    let resp = who
        .post(app.url(&format!("/escalations/{id}")))
        .header("origin", format!("http://{}", app.addr))
        .form(form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    resp.headers()
        .get(LOCATION)
        .map(|l| l.to_str().unwrap().to_string())
        .unwrap_or_default()
}

async fn rules_of(app: &TestApp, run: &str) -> Vec<String> {
    app.store
        .audit_for_run(run)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|r| r.rule)
        .collect()
}

/// A worker credential of tenant acme created by `created_by`; its token.
async fn worker(app: &TestApp, name: &str, created_by: &str) -> (String, String) {
    let (cred, token) = app
        .store
        .create_agent(&NewAgent {
            name: name.into(),
            role: "worker.finance".into(),
            tenant: "acme".into(),
            created_by: created_by.into(),
            expires_at: None,
            acts_for: None,
            origin: TaskOrigin::User,
        })
        .await
        .unwrap();
    (cred.id, token.reveal().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalations_an_unknown_the_target_cannot_tell_is_settled_by_two_people() {
    each_finance_app(|app| async move {
        // A payment approved by Ana whose answer is lost while the ERP cannot be asked.
        let (_, token) = worker(&app, "esc-fin", "person:https://idp.example#admin").await;
        let mut fin = Client::new(&app, &token);
        fin.connect().await;
        let args = payment(json!(4180.0));
        let reply = fin.call("payment.schedule", args.clone()).await;
        let c = &reply["result"]["structuredContent"];
        assert_eq!(c["status"], "needs_approval", "{reply}");
        let step_id = c["step_id"].as_str().unwrap().to_string();
        let ana = app.demo_client("ana").await;
        // Signed with her passkey, as the inbox's page signs it (payment.schedule requires it).
        let signature = crate::helpers::http_signature(&app, &ana, "ana", &step_id).await;
        let form = crate::helpers::with_signature(
            &[
                ("verdict", "approved"),
                ("reason", "Matches PO-77812 line 2"),
            ],
            &signature,
        );
        let resp = ana
            .post(app.url(&format!("/inbox/{step_id}/decision")))
            .header("origin", format!("http://{}", app.addr))
            .form(&form)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        lookup_down(&app, 1_000_000).await;
        inject_fault(
            &app.store,
            ERP,
            "payments.schedule",
            &Fault {
                mode: FaultMode::TimeoutAfterEffect,
                times: 1,
            },
        )
        .await
        .unwrap();
        let reply = fin.call("payment.schedule", args).await;
        assert_eq!(
            reply["result"]["structuredContent"]["status"], "unknown",
            "{reply}"
        );
        let step = app.store.get_step(&step_id).await.unwrap();
        assert_eq!(step.status, StepStatus::Unknown);

        // Within the grace period nothing is escalated; past it, once.
        let settled = reconcile_once(&app.state, Timings::default())
            .await
            .unwrap();
        assert_eq!(settled, 0);
        assert!(
            app.store
                .open_escalations("acme", 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(reconcile(&app).await, 0);
        assert_eq!(reconcile(&app).await, 0);
        let open = app.store.open_escalations("acme", 10).await.unwrap();
        assert_eq!(open.len(), 1, "{open:?}");
        let esc = open[0].clone();
        assert_eq!(
            (esc.kind.as_str(), esc.step_id.as_str()),
            ("unknown", step.id.as_str())
        );
        let opened = rules_of(&app, &step.run_id).await;
        assert_eq!(
            opened.iter().filter(|r| *r == "escalation.opened").count(),
            1,
            "{opened:?}"
        );

        // The page shows it to an approver of the tool, with its amount and target.
        let page = ana.get(app.url("/escalations")).send().await.unwrap();
        assert_eq!(page.status(), StatusCode::OK);
        let html = page.text().await.unwrap();
        assert!(html.contains("Outcome unknown"), "{html}");
        assert!(
            html.contains("invoice INV-20260611, 4,180.00 EUR"),
            "{html}"
        );
        // A manager sees nothing, and neither another tenant's admin.
        let max = app.demo_client("max").await;
        let page = max.get(app.url("/escalations")).send().await.unwrap();
        assert_eq!(page.status(), StatusCode::FORBIDDEN);
        let gus = app.demo_client("gus").await;
        let html = gus
            .get(app.url("/escalations"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(!html.contains("INV-20260611"), "{html}");

        // Refusals, each writing nothing.
        let reason = ("reason", "The bank statement shows the transfer");
        let happened = ("action", "happened");
        for (who, form, want) in [
            (
                &max,
                vec![happened, ("reference", "PAY-1"), reason],
                "/escalations?error=not_found",
            ),
            (
                &gus,
                vec![happened, ("reference", "PAY-1"), reason],
                "/escalations?error=not_found",
            ),
            (
                &ana,
                vec![("action", "acknowledge"), reason],
                "/escalations?error=action",
            ),
            (
                &ana,
                vec![("action", "undo"), reason],
                "/escalations?error=action",
            ),
            (
                &ana,
                vec![("action", "pay"), reason],
                "/escalations?error=action",
            ),
            (
                &ana,
                vec![happened, ("reference", " "), reason],
                "/escalations?error=reference",
            ),
            (
                &ana,
                vec![happened, ("reference", "PAY-1"), ("reason", " ")],
                "/escalations?error=reason",
            ),
        ] {
            assert_eq!(act(who, &app, &esc.id, &form).await, want, "{form:?}");
        }
        let long = "R".repeat(201);
        assert_eq!(
            act(
                &ana,
                &app,
                &esc.id,
                &[happened, ("reference", &long), reason]
            )
            .await,
            "/escalations?error=reference"
        );
        assert_eq!(
            act(
                &ana,
                &app,
                "no-such-escalation",
                &[happened, ("reference", "PAY-1"), reason]
            )
            .await,
            "/escalations?error=not_found"
        );
        assert_eq!(app.store.get_escalation(&esc.id).await.unwrap(), esc);

        // Two people: the first is recorded, the step stays unknown.
        let first = [happened, ("reference", "PAY-1"), reason];
        assert_eq!(
            act(&ana, &app, &esc.id, &first).await,
            "/escalations?done=first"
        );
        assert_eq!(
            app.store.get_step(&step.id).await.unwrap().status,
            StepStatus::Unknown
        );
        let html = ana
            .get(app.url("/escalations"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            html.contains("settled it as happened, reference PAY-1"),
            "{html}"
        );
        // The first settler cannot be the second; a disagreeing second withdraws the first.
        assert_eq!(
            act(&ana, &app, &esc.id, &first).await,
            "/escalations?error=same_settler"
        );
        let pat = app.demo_client("pat").await;
        assert_eq!(
            act(
                &pat,
                &app,
                &esc.id,
                &[happened, ("reference", "PAY-2"), reason]
            )
            .await,
            "/escalations?error=disagrees"
        );
        assert_eq!(
            app.store.get_step(&step.id).await.unwrap().status,
            StepStatus::Unknown
        );
        assert_eq!(
            app.store.get_escalation(&esc.id).await.unwrap().first_by,
            None
        );
        assert!(
            rules_of(&app, &step.run_id)
                .await
                .iter()
                .any(|r| r == "escalation.first_withdrawn")
        );
        // Two people agreeing from the start: done, its key done (it never runs again), the
        // record names both.
        assert_eq!(
            act(&ana, &app, &esc.id, &first).await,
            "/escalations?done=first"
        );
        assert_eq!(
            act(&pat, &app, &esc.id, &first).await,
            "/escalations?done=settled"
        );
        let after = app.store.get_step(&step.id).await.unwrap();
        assert_eq!(after.status, StepStatus::Done);
        assert!(
            after.outcome.as_deref().unwrap_or("").contains("PAY-1"),
            "{after:?}"
        );
        let key = app
            .store
            .get_key(&after.idem_key)
            .await
            .unwrap()
            .expect("the call's key");
        assert_eq!(key.state, KeyState::Done);
        let records = app.store.audit_for_run(&step.run_id).await.unwrap();
        let settled = records
            .iter()
            .find(|r| r.rule.as_deref() == Some("escalation.settled"))
            .expect("no settled record");
        assert_eq!(settled.event, "reconciled");
        assert!(
            settled.actor.as_deref().unwrap_or("").ends_with("#pat"),
            "{settled:?}"
        );
        assert!(settled.record.contains("#ana"), "{settled:?}");
        assert!(settled.record.contains("PAY-1"), "{settled:?}");
        let closed = app.store.get_escalation(&esc.id).await.unwrap();
        assert_eq!(closed.resolution.as_deref(), Some("settled"));
        assert!(
            app.store
                .open_escalations("acme", 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            act(&pat, &app, &esc.id, &first).await,
            "/escalations?error=closed"
        );
        // Asking again sends nothing: the key is done.
        let reply = fin.call("payment.schedule", payment(json!(4180.0))).await;
        assert_ne!(
            reply["result"]["structuredContent"]["status"], "scheduled",
            "{reply}"
        );
        assert_eq!(
            app.store
                .demo_effects(ERP, "payments.schedule")
                .await
                .unwrap()
                .len(),
            1
        );
        assert!(app.store.verify_audit().await.unwrap().is_ok());
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalations_close_when_reconciliation_settles_and_one_person_settles_a_write() {
    each_finance_app_with(&[("COUNTERSIGN_WORKERS", "0")], |app| async move {
        // The target cannot tell once: escalated; then it can, and says it never happened.
        let step = unknown_step(
            &app,
            "payment.schedule",
            Effect::Irreversible,
            payment(json!(99.0)),
            None,
        )
        .await;
        lookup_down(&app, 1_000_000).await;
        assert_eq!(reconcile(&app).await, 0);
        let esc = app.store.open_escalations("acme", 10).await.unwrap()[0].clone();
        // The ERP answers again (the server's own reconciler may be first to ask).
        lookup_down(&app, 0).await;
        reconcile(&app).await;
        assert_eq!(
            app.store.get_step(&step.id).await.unwrap().status,
            StepStatus::Pending
        );
        let closed = app.store.get_escalation(&esc.id).await.unwrap();
        assert_eq!(closed.resolution.as_deref(), Some("reconciled"));
        assert_eq!(closed.closed_by.as_deref(), Some("reconciler"));

        // Escalated again once it is unknown again: a new escalation.
        app.store
            .transition(&Transition {
                step_id: step.id.clone(),
                from: vec![StepStatus::Pending],
                to: Some(StepStatus::Unknown),
                ..Transition::default()
            })
            .await
            .unwrap()
            .unwrap();
        lookup_down(&app, 1_000_000).await;
        assert_eq!(reconcile(&app).await, 0);
        let again = app.store.open_escalations("acme", 10).await.unwrap();
        assert_eq!(again.len(), 1, "{again:?}");
        assert_ne!(again[0].id, esc.id);

        // A write needs one person, never one accountable for the agent that proposed it;
        // "never happened" fails the step without retrying it.
        let (ana_bot, _) = worker(&app, "esc-ana-bot", "person:urn:countersign:demo#ana").await;
        let note = unknown_step(
            &app,
            "note.draft",
            Effect::Write,
            json!({"invoice_id": "INV-20260611", "text": "Paid."}),
            Some(&ana_bot),
        )
        .await;
        lookup_down(&app, 1000).await;
        reconcile(&app).await;
        let esc = app
            .store
            .open_escalations("acme", 10)
            .await
            .unwrap()
            .into_iter()
            .find(|e| e.step_id == note.id)
            .unwrap();
        // note.draft has no approval settings: its escalations are the approvers'. Ana created
        // the proposing credential: refused, and the attempt recorded.
        let form = [
            ("action", "not_happened"),
            ("reason", "The ERP has no such note"),
        ];
        let ada = app.demo_client("ada").await;
        assert_eq!(
            act(&ada, &app, &esc.id, &form).await,
            "/escalations?error=not_found"
        );
        let ana = app.demo_client("ana").await;
        assert_eq!(
            act(&ana, &app, &esc.id, &form).await,
            "/escalations?error=accountable"
        );
        assert!(
            app.store
                .audit_for_run(&note.run_id)
                .await
                .unwrap()
                .iter()
                .any(|r| r.event == "refused" && r.rule.as_deref() == Some("approval.creator"))
        );
        assert_eq!(
            app.store.get_step(&note.id).await.unwrap().status,
            StepStatus::Unknown
        );
        let pat = app.demo_client("pat").await;
        assert_eq!(
            act(&pat, &app, &esc.id, &form).await,
            "/escalations?done=settled"
        );
        let after = app.store.get_step(&note.id).await.unwrap();
        assert_eq!(after.status, StepStatus::Failed);
        assert_eq!(
            reconcile(&app).await,
            0,
            "a settled step is not reconciled again"
        );
        assert_eq!(
            app.store.get_step(&note.id).await.unwrap().status,
            StepStatus::Failed
        );
        app
    })
    .await;
}

/// Waits (real time, at most 20 s) until `run` has an open escalation; returns it.
async fn escalation_of(app: &TestApp, run: &str) -> countersign_core::store::Escalation {
    let began = Instant::now();
    loop {
        if let Some(e) = app
            .store
            .escalations_of_run(run)
            .await
            .unwrap()
            .into_iter()
            .find(|e| e.closed_at.is_none())
        {
            return e;
        }
        assert!(began.elapsed() < Duration::from_secs(20), "never escalated");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalations_an_undo_runs_once_and_what_cannot_be_undone_is_acknowledged() {
    each_finance_app(|app| async move {
        let (_, planner) = agent(&app, "planner-esc", "planner").await;
        let mut client = Client::new(&app, &planner);
        client.connect().await;
        let fail = Fault {
            mode: FaultMode::Fail,
            times: 1,
        };
        // The note is drafted, the hold fails, and so does the note's undo: a person decides.
        inject_fault(&app.store, ERP, "invoices.hold", &fail)
            .await
            .unwrap();
        // The ERP cannot be reached for the undo: it may be tried again under its key.
        let down = Fault {
            mode: FaultMode::Unavailable,
            times: 1,
        };
        inject_fault(&app.store, ERP, "notes.discard", &down)
            .await
            .unwrap();
        let hold = json!({"tool": "invoice.hold", "arguments": crate::mcp::hold(json!(500)),
                          "reason": "Dispute on line 1 quantities received"});
        let (run, steps) = submit(&mut client, vec![note_step(), hold]).await;
        let esc = escalation_of(&app, &run).await;
        assert_eq!(
            (esc.kind.as_str(), esc.step_id.as_str()),
            ("undo", steps[0].as_str())
        );
        assert_eq!(
            app.store.get_run(&run).await.unwrap().status,
            RunStatus::Failed
        );

        let ana = app.demo_client("ana").await;
        let reason = ("reason", "The note must not stay on the invoice");
        assert_eq!(
            act(
                &ana,
                &app,
                &esc.id,
                &[("action", "happened"), ("reference", "X"), reason]
            )
            .await,
            "/escalations?error=action"
        );
        assert_eq!(
            act(&ana, &app, &esc.id, &[("action", "undo"), reason]).await,
            "/escalations?done=undone"
        );
        let note = app
            .store
            .demo_get(ERP, "note", "NOTE-00000001")
            .await
            .unwrap()
            .unwrap();
        assert!(note.data.contains("\"discarded\""), "{}", note.data);
        let closed = app.store.get_escalation(&esc.id).await.unwrap();
        assert_eq!(closed.resolution.as_deref(), Some("undone"));
        let undo_step = closed.undo_step.clone().unwrap();
        assert_eq!(
            app.store.get_step(&undo_step).await.unwrap().status,
            StepStatus::Done
        );
        // Once: asking again runs nothing. The undo's own credential ended with it.
        assert_eq!(
            act(&ana, &app, &esc.id, &[("action", "undo"), reason]).await,
            "/escalations?error=closed"
        );
        let rules = rules_of(&app, &run).await;
        assert!(
            rules.iter().any(|r| r == "escalation.undo_started"),
            "{rules:?}"
        );
        let creds = app.store.agents_of("acme").await.unwrap();
        assert!(
            creds
                .iter()
                .filter(|c| c.run_id.as_deref() == Some(run.as_str()))
                .all(|c| c.revoked_at.is_some()),
            "an execution credential of the failed run is still live"
        );
        let discards = app
            .store
            .steps_for_run(&run)
            .await
            .unwrap()
            .into_iter()
            .filter(|s| s.tool == "note.discard" && s.status == StepStatus::Done)
            .count();
        assert_eq!(discards, 1);
        assert!(
            rules_of(&app, &run)
                .await
                .iter()
                .any(|r| r == "escalation.undo")
        );

        // A hold has no compensating tool: when the note after it fails, it is acknowledged.
        inject_fault(&app.store, ERP, "notes.draft", &fail)
            .await
            .unwrap();
        let hold = json!({"tool": "invoice.hold", "arguments": {"invoice_id": "INV-20260612",
            "amount": 100, "currency": "EUR", "reason": "Surcharge disputed with the carrier"},
            "reason": "Dispute on the freight surcharge"});
        let note = json!({"tool": "note.draft", "arguments": {"invoice_id": "INV-20260612",
            "text": "Held for the surcharge."}, "reason": "Tell AP why the invoice is held"});
        let (run, steps) = submit(&mut client, vec![hold, note]).await;
        let esc = escalation_of(&app, &run).await;
        assert_eq!(
            (esc.kind.as_str(), esc.step_id.as_str()),
            ("manual", steps[0].as_str())
        );
        assert_eq!(
            act(&ana, &app, &esc.id, &[("action", "undo"), reason]).await,
            "/escalations?error=action"
        );
        assert_eq!(
            act(
                &ana,
                &app,
                &esc.id,
                &[
                    ("action", "acknowledge"),
                    ("reason", "Hold released by phone with the carrier")
                ]
            )
            .await,
            "/escalations?done=acknowledged"
        );
        let closed = app.store.get_escalation(&esc.id).await.unwrap();
        assert_eq!(closed.resolution.as_deref(), Some("acknowledged"));
        assert!(closed.closed_by.as_deref().unwrap_or("").ends_with("#ana"));
        assert!(
            rules_of(&app, &run)
                .await
                .iter()
                .any(|r| r == "escalation.acknowledged")
        );
        app
    })
    .await;
}
