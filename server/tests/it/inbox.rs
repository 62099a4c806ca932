//! The approval inbox pages (`/inbox`, `/inbox/{step}`) and their HTML decision form, signed
//! in through the demo sign-in, on both backends.

use countersign::adapters::builtin::ERP;
use countersign_core::StepStatus;
use reqwest::StatusCode;
use reqwest::header::LOCATION;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::mcp::{Client, INV, REASON, agent, each_finance_app, payment_for};

fn status_of(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]["status"]
}

/// Opens a gated 4,180.00 EUR payment; returns the step id.
async fn gated_payment(client: &mut Client<'_>) -> String {
    let reply = client
        .call("payment.schedule", payment_for(INV, json!(4180.00)))
        .await;
    assert_eq!(status_of(&reply), "needs_approval", "{reply}");
    reply["result"]["structuredContent"]["step_id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn page(client: &reqwest::Client, app: &TestApp, path: &str) -> String {
    let resp = client.get(app.url(path)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{path}");
    resp.text().await.unwrap()
}

async fn step_status(app: &TestApp, step: &str) -> StepStatus {
    app.store.get_step(step).await.unwrap().status
}

async fn payments(app: &TestApp) -> usize {
    app.store
        .demo_effects(ERP, "payments.schedule")
        .await
        .unwrap()
        .len()
}

fn location(resp: &reqwest::Response) -> String {
    resp.headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_shows_gates_to_approvers_only_with_amount_target_expiry_and_detail() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let step = gated_payment(&mut client).await;

        // Signed out: sent to sign-in, no data.
        let anon = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let resp = anon.get(app.url("/inbox")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        assert!(
            location(&resp).starts_with("/auth/login"),
            "{}",
            location(&resp)
        );

        // A manager is signed in but is no approver: the page says so and shows no gate.
        let max = app.demo_client("max").await;
        for path in ["/inbox".to_string(), format!("/inbox/{step}")] {
            let html = page(&max, &app, &path).await;
            assert!(
                html.contains("data-testid=\"not-approver\""),
                "{path}: {html}"
            );
            assert!(!html.contains("4,180.00"), "{path} leaks the amount");
            assert!(!html.contains(INV), "{path} leaks the target");
            assert!(!html.contains(&step), "{path} leaks the step");
        }

        let ana = app.demo_client("ana").await;
        let html = page(&ana, &app, "/inbox").await;
        assert_eq!(
            html.matches("data-testid=\"gate-row\"").count(),
            1,
            "{html}"
        );
        assert!(html.contains(&format!("data-step-id=\"{step}\"")), "{html}");
        assert!(html.contains("payment.schedule"), "{html}");
        assert!(html.contains("4,180.00 EUR"), "{html}");
        assert!(html.contains(&format!("invoice {INV}")), "{html}");
        assert!(html.contains("expires in "), "{html}");
        assert!(html.contains(&format!("href=\"/inbox/{step}\"")), "{html}");

        let detail = page(&ana, &app, &format!("/inbox/{step}")).await;
        assert!(detail.contains("data-testid=\"gate-detail\""), "{detail}");
        // The canonical inputs, pretty-printed: keys in canonical order, numbers as sent.
        let inputs = detail
            .split("data-testid=\"gate-inputs\"")
            .nth(1)
            .and_then(|rest| rest.split("</pre>").next())
            .unwrap_or_default()
            .replace("&quot;", "\"");
        let amount = inputs.find("\"amount\": 4180").expect("amount in inputs");
        let currency = inputs.find("\"currency\": \"EUR\"").expect("currency");
        let invoice = inputs
            .find(&format!("\"invoice_id\": \"{INV}\""))
            .expect("invoice");
        assert!(amount < currency && currency < invoice, "{inputs}");
        assert!(detail.contains(REASON), "the model's reason: {detail}");
        assert!(detail.contains("irreversible"), "effect class: {detail}");
        assert!(
            detail.contains("sha256:"),
            "the bound inputs hash: {detail}"
        );
        assert!(
            detail.contains("data-testid=\"history-row\""),
            "history: {detail}"
        );
        assert!(detail.contains("name=\"reason\""), "the form: {detail}");
        assert!(
            detail.contains(&format!("action=\"/inbox/{step}/decision\"")),
            "{detail}"
        );

        // Pat sees the same gate; a step that does not exist shows nothing.
        let pat = app.demo_client("pat").await;
        assert!(page(&pat, &app, "/inbox").await.contains("4,180.00 EUR"));
        let none = page(&ana, &app, "/inbox/no-such-step").await;
        assert!(!none.contains("data-testid=\"gate-detail\""), "{none}");
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_form_refuses_cross_origin_missing_reasons_and_stale_sign_ins_then_approves() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let step = gated_payment(&mut client).await;
        let origin = format!("http://{}", app.addr);
        let action = app.url(&format!("/inbox/{step}/decision"));
        let ana = app.demo_client("ana").await;

        // Cross-origin: refused by the CSRF check, nothing decided.
        let forged = ana
            .post(&action)
            .header("origin", "https://evil.example")
            .form(&[("verdict", "approved"), ("reason", "click here")])
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), StatusCode::FORBIDDEN);
        assert_eq!(step_status(&app, &step).await, StepStatus::NeedsApproval);

        // Rejection without a reason: refused, shown on the gate's page.
        let blank = ana
            .post(&action)
            .header("origin", &origin)
            .form(&[("verdict", "rejected"), ("reason", "   ")])
            .send()
            .await
            .unwrap();
        assert_eq!(blank.status(), StatusCode::SEE_OTHER);
        let back = location(&blank);
        assert_eq!(back, format!("/inbox/{step}?error=reason"));
        assert_eq!(step_status(&app, &step).await, StepStatus::NeedsApproval);
        let shown = page(&ana, &app, &back).await;
        // The step and address in the message tell a page of another request from this one.
        assert!(
            shown.contains("role=\"alert\""),
            "GET {back} (step {step}) showed no alert:\n{shown}"
        );
        assert!(shown.contains("A reason is required"), "{shown}");
        // Only known codes are shown, never text from the address.
        // (The whole phrase: ids and nonces on the page are random and may hold "555".)
        let odd = page(&ana, &app, &format!("/inbox/{step}?error=Call+555+now")).await;
        assert!(
            !odd.contains("Call 555 now") && !odd.contains("Call+555+now"),
            "{odd}"
        );
        assert!(
            !odd.contains("role=\"alert\""),
            "an unknown code shows nothing: {odd}"
        );

        // No verdict: refused.
        let none = ana
            .post(&action)
            .header("origin", &origin)
            .form(&[("reason", "fine")])
            .send()
            .await
            .unwrap();
        assert_eq!(location(&none), format!("/inbox/{step}?error=verdict"));

        // A manager cannot decide.
        let max = app.demo_client("max").await;
        let boss = max
            .post(&action)
            .header("origin", &origin)
            .form(&[("verdict", "approved"), ("reason", "I'm the boss")])
            .send()
            .await
            .unwrap();
        assert_eq!(boss.status(), StatusCode::FORBIDDEN);
        assert_eq!(step_status(&app, &step).await, StepStatus::NeedsApproval);

        // Payments need a sign-in within 15 minutes: 16 minutes on, Ana must sign in again.
        app.clock.advance(chrono::Duration::minutes(16));
        let stale = ana
            .post(&action)
            .header("origin", &origin)
            .form(&[
                ("verdict", "approved"),
                ("reason", "three-way match checked"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(location(&stale), format!("/inbox/{step}?error=step_up"));
        assert_eq!(step_status(&app, &step).await, StepStatus::NeedsApproval);
        let shown = page(&ana, &app, &location(&stale)).await;
        assert!(shown.contains("needs a recent sign-in"));
        // Its link asks the identity provider to authenticate her now, back to this gate.
        assert!(
            shown.contains(&format!(
                "href=\"/auth/login?fresh=1&amp;next=/inbox/{step}\""
            )) || shown.contains(&format!("href=\"/auth/login?fresh=1&next=/inbox/{step}\"")),
            "{shown}"
        );

        let ana = app.demo_client("ana").await;
        // Payments require her passkey's signature: an unsigned form is refused (audited).
        let unsigned = ana
            .post(&action)
            .header("origin", &origin)
            .form(&[
                ("verdict", "approved"),
                ("reason", "three-way match checked"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(
            location(&unsigned),
            format!("/inbox/{step}?error=signature_missing")
        );
        assert_eq!(step_status(&app, &step).await, StepStatus::NeedsApproval);
        let shown = page(&ana, &app, &location(&unsigned)).await;
        assert!(shown.contains("passkey"), "{shown}");
        let signature = crate::helpers::http_signature(&app, &ana, "ana", &step).await;
        let form = crate::helpers::with_signature(
            &[
                ("verdict", "approved"),
                ("reason", "three-way match checked"),
            ],
            &signature,
        );
        let ok = ana
            .post(&action)
            .header("origin", &origin)
            .form(&form)
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), StatusCode::SEE_OTHER);
        assert_eq!(location(&ok), "/inbox?done=approved");
        assert_eq!(step_status(&app, &step).await, StepStatus::Pending);
        let after = page(&ana, &app, "/inbox?done=approved").await;
        assert!(after.contains("data-testid=\"notice\""), "{after}");
        assert_eq!(
            after.matches("data-testid=\"gate-row\"").count(),
            0,
            "{after}"
        );

        // The agent's next call runs it: exactly one payment.
        assert_eq!(payments(&app).await, 0);
        let paid = client
            .call("payment.schedule", payment_for(INV, json!(4180.00)))
            .await;
        assert_eq!(status_of(&paid), "scheduled", "{paid}");
        assert_eq!(payments(&app).await, 1);

        // Deciding again: not waiting any more.
        let again = ana
            .post(&action)
            .header("origin", &origin)
            .form(&[("verdict", "rejected"), ("reason", "too late")])
            .send()
            .await
            .unwrap();
        assert_eq!(location(&again), format!("/inbox/{step}?error=not_waiting"));
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_form_rejection_with_a_reason_refuses_the_step_for_good() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let step = gated_payment(&mut client).await;
        let pat = app.demo_client("pat").await;
        let resp = pat
            .post(app.url(&format!("/inbox/{step}/decision")))
            .header("origin", format!("http://{}", app.addr))
            .form(&[
                ("verdict", "rejected"),
                ("reason", "duplicate of last week's payment"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(location(&resp), "/inbox?done=rejected");
        assert_eq!(step_status(&app, &step).await, StepStatus::Refused);
        let reply = client
            .call("payment.schedule", payment_for(INV, json!(4180.00)))
            .await;
        assert_ne!(status_of(&reply), "scheduled", "{reply}");
        assert_eq!(payments(&app).await, 0);
        app
    })
    .await;
}

/// POSTs to the inbox's server function (what the open page polls) from `origin`.
async fn poll(client: &reqwest::Client, app: &TestApp, origin: &str) -> reqwest::Response {
    use leptos::server_fn::ServerFn;
    client
        .post(app.url(countersign_app::inbox::LoadGates::PATH))
        .header("origin", origin)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("")
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_poll_returns_gates_opened_after_the_page_loaded_to_approvers_only() {
    use countersign_app::inbox::InboxView;
    each_finance_app(|app| async move {
        let own = format!("http://{}", app.addr);
        let ana = app.demo_client("ana").await;
        let html = page(&ana, &app, "/inbox").await;
        assert!(html.contains("No gated calls are waiting"), "{html}");
        let resp = poll(&ana, &app, &own).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.json::<InboxView>().await.unwrap(),
            InboxView::Gates(Vec::new())
        );

        // A gate opens while the page is open: the next poll carries it.
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let step = gated_payment(&mut client).await;
        let resp = poll(&ana, &app, &own).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let InboxView::Gates(rows) = resp.json::<InboxView>().await.unwrap() else {
            panic!("ana is an approver");
        };
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].step_id, step);
        assert_eq!(rows[0].amount.as_deref(), Some("4,180.00 EUR"));

        // Another tenant's gate never reaches this tenant's approver.
        let (_, globex) = app
            .store
            .create_agent(&countersign_core::store::NewAgent {
                name: "globex-fin".into(),
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
        let mut other = Client::new(&app, &globex);
        other.connect().await;
        let reply = other
            .call(
                "payment.schedule",
                crate::mcp::payment_for("INV-20269001", json!(2500.00)),
            )
            .await;
        assert_eq!(status_of(&reply), "needs_approval", "{reply}");
        let foreign = reply["result"]["structuredContent"]["step_id"]
            .as_str()
            .unwrap()
            .to_string();
        let InboxView::Gates(rows) = poll(&ana, &app, &own)
            .await
            .json::<InboxView>()
            .await
            .unwrap()
        else {
            panic!("ana is an approver");
        };
        assert_eq!(
            rows.iter().map(|r| r.step_id.as_str()).collect::<Vec<_>>(),
            vec![step.as_str()]
        );
        assert!(!page(&ana, &app, "/inbox").await.contains(&foreign));

        // A manager polls and gets no gate; signed out and cross-origin polls are refused.
        let max = app.demo_client("max").await;
        let resp = poll(&max, &app, &own).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.json::<InboxView>().await.unwrap(),
            InboxView::NotApprover
        );
        let anon = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let resp = poll(&anon, &app, &own).await;
        assert!(
            resp.status() == StatusCode::UNAUTHORIZED || resp.status().is_redirection(),
            "{}",
            resp.status()
        );
        assert!(!resp.text().await.unwrap().contains(&step));
        let resp = poll(&ana, &app, "https://evil.example").await;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert!(!resp.text().await.unwrap().contains(&step));
        app
    })
    .await;
}

/// Regression: a gate page rendered while other pages render shows the message of its own
/// address, never another request's. Leptos keeps the current reactive owner in a
/// thread-local; when tokio moved a render to another worker thread, parts of the route were
/// built under whatever owner that thread last held (another request's), so
/// `/inbox/{step}?error=reason` once rendered without its alert in CI. Many gate pages with
/// different codes render at once on a four-worker runtime; each must show exactly its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_gate_pages_each_show_their_own_message() {
    const CODES: [(&str, &str); 8] = [
        ("error=reason", "A reason is required. Nothing was decided."),
        (
            "error=verdict",
            "Choose approve or reject. Nothing was decided.",
        ),
        (
            "error=expired",
            "The approval window closed. Nothing was decided.",
        ),
        (
            "error=not_waiting",
            "This step is no longer waiting for approval.",
        ),
        ("error=not_found", "There is no such gate waiting for you."),
        ("error=unavailable", "The database did not answer."),
        ("done=rejected", "Rejected. The step will never run."),
        ("", ""),
    ];
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let step = gated_payment(&mut client).await;
        let ana = app.demo_client("ana").await;
        let own_form = format!("/inbox/{step}/decision");
        let mut wrong = Vec::new();
        for round in 0..12 {
            let mut pages = tokio::task::JoinSet::new();
            for (i, (query, text)) in CODES.iter().cycle().skip(round).take(24).enumerate() {
                let path = if query.is_empty() {
                    format!("/inbox/{step}")
                } else {
                    format!("/inbox/{step}?{query}")
                };
                let url = app.url(&path);
                let ana = ana.clone();
                pages.spawn(async move {
                    let html = ana.get(url).send().await.unwrap().text().await.unwrap();
                    (i, path, *text, html)
                });
            }
            while let Some(done) = pages.join_next().await {
                let (i, path, text, html) = done.unwrap();
                let own = text.is_empty() || html.contains(text);
                let others = CODES
                    .iter()
                    .filter(|(_, t)| !t.is_empty() && *t != text && html.contains(t))
                    .count();
                if !own || others > 0 || !html.contains(&own_form) {
                    wrong.push(format!(
                        "round {round} page {i} {path}: own={own} others={others}"
                    ));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "{} of 288 pages wrong:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_gates_someone_else_decides_never_hide_an_approvers_own() {
    use countersign_core::store::{NewRun, NewStep, Transition};
    use countersign_core::{CanonicalJson, Effect};
    // The finance registry with bank-detail changes decided by managers, not AP clerks.
    let dir = std::env::temp_dir().join(format!("cs-inbox-roles-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let from = std::path::PathBuf::from(crate::helpers::example("finance"));
    for name in ["registry.yaml", "policy.cedar", "policy.cedarschema"] {
        let mut text = std::fs::read_to_string(from.join(name)).unwrap();
        if name == "registry.yaml" {
            let at = text.find("  supplier.update_iban:").unwrap();
            let roles = at + text[at..].find("approver_roles: [approver]").unwrap();
            text.replace_range(roles..roles + 26, "approver_roles: [manager]");
        }
        std::fs::write(dir.join(name), text).unwrap();
    }
    let registry = dir.to_str().unwrap().to_string();
    for backend in [
        countersign_core::Backend::Sqlite,
        countersign_core::Backend::Postgres,
    ] {
        let Some(app) =
            crate::helpers::spawn_app_with(backend, &[("COUNTERSIGN_REGISTRY", &registry)]).await
        else {
            continue;
        };
        let run = app
            .store
            .create_run(&NewRun {
                tenant: "acme".into(),
                principal: "agent:test".into(),
                agent_id: None,
                task: "many gates".into(),
                origin: "user".into(),
                planned: false,
            })
            .await
            .unwrap();
        let gate = |tool: &'static str, n: usize| {
            let store = app.store.clone();
            let run = run.id.clone();
            async move {
                let (step, _) = store
                    .open_step(&NewStep {
                        run_id: run,
                        role: "worker.finance".into(),
                        tool: tool.into(),
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
                step.id
            }
        };
        // 500 older gates only a manager decides, then one an AP clerk decides.
        for n in 0..500 {
            gate("supplier.update_iban", n).await;
        }
        app.clock.advance(chrono::Duration::seconds(1));
        let hold = gate("invoice.hold", 500).await;
        let ana = app.demo_client("ana").await;
        let gates: Value = ana
            .get(app.url("/api/gates"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ids: Vec<&str> = gates["gates"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|g| g["step_id"].as_str())
            .collect();
        assert_eq!(ids, vec![hold.as_str()], "{backend:?}");
        app.stop().await;
    }
}
