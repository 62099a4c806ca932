//! The inbox's batch decision (`POST /inbox/batch`, issue 36), on both backends: ticked gates
//! of one tool are approved through the bounded batch with every per-step check (a gate its
//! approver may not countersign is refused and keeps waiting), or rejected each on its own;
//! empty selections, a missing reason, several tools and non-approvers are refused whole.

use countersign_core::StepStatus;
use countersign_core::policy::TaskOrigin;
use countersign_core::store::NewAgent;
use reqwest::StatusCode;
use reqwest::header::LOCATION;
use serde_json::json;

use crate::helpers::TestApp;
use crate::mcp::{Client, each_finance_app, hold, payment_for};

const DEMO_ISSUER: &str = "urn:countersign:demo";

async fn worker_by(app: &TestApp, name: &str, created_by: &str) -> String {
    worker_in(app, name, created_by, "acme").await
}

async fn worker_in(app: &TestApp, name: &str, created_by: &str, tenant: &str) -> String {
    let (_, token) = app
        .store
        .create_agent(&NewAgent {
            name: name.into(),
            role: "worker.finance".into(),
            tenant: tenant.into(),
            created_by: created_by.into(),
            expires_at: None,
            acts_for: None,
            origin: TaskOrigin::User,
        })
        .await
        .unwrap();
    token.reveal().to_string()
}

async fn gated(client: &mut Client<'_>, tool: &str, args: serde_json::Value) -> String {
    let reply = client.call(tool, args).await;
    let c = &reply["result"]["structuredContent"];
    assert_eq!(c["status"], "needs_approval", "{reply}");
    c["step_id"].as_str().unwrap().to_string()
}

/// Posts the inbox's batch form as demo person `user` (signed in on `who`); an approval is
/// signed as the page signs it (payment.schedule requires signatures).
async fn post(
    who: &reqwest::Client,
    user: &str,
    app: &TestApp,
    form: &[(&str, &str)],
) -> (StatusCode, String, String) {
    let mut fields: Vec<(String, String)> = form
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    if form.contains(&("verdict", "approved")) {
        let steps: Vec<String> = form
            .iter()
            .filter(|(k, _)| *k == "step")
            .map(|(_, v)| (*v).to_string())
            .collect();
        fields.extend(crate::helpers::inbox_batch_signature(app, who, user, &steps).await);
    }
    let resp = who
        .post(app.url("/inbox/batch"))
        .header("origin", format!("http://{}", app.addr))
        .form(&fields)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let location = resp
        .headers()
        .get(LOCATION)
        .map(|l| l.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, location, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_batch_approves_within_bounds_refuses_per_step_and_rejects_each() {
    each_finance_app(|app| async move {
        let token = worker_by(&app, "batch-fin", "person:https://idp.example#admin").await;
        let own = worker_by(&app, "batch-own", &format!("person:{DEMO_ISSUER}#ana")).await;
        let (mut client, mut mine) = (Client::new(&app, &token), Client::new(&app, &own));
        client.connect().await;
        mine.connect().await;
        let a = gated(
            &mut client,
            "payment.schedule",
            payment_for("INV-20260612", json!(1200.0)),
        )
        .await;
        let b = gated(
            &mut client,
            "payment.schedule",
            payment_for("INV-20260612", json!(1300.0)),
        )
        .await;
        let c = gated(
            &mut mine,
            "payment.schedule",
            payment_for("INV-20260612", json!(1400.0)),
        )
        .await;
        let h = gated(&mut client, "invoice.hold", hold(json!(2000.0))).await;
        let h2 = gated(&mut client, "invoice.hold", hold(json!(2100.0))).await;
        let globex = worker_in(
            &app,
            "batch-globex",
            "person:https://idp.example#gus",
            "globex",
        )
        .await;
        let mut theirs = Client::new(&app, &globex);
        theirs.connect().await;
        let foreign = gated(
            &mut theirs,
            "payment.schedule",
            payment_for("INV-20269001", json!(900.0)),
        )
        .await;
        let ana = app.demo_client("ana").await;
        let reason = ("reason", "Freight instalments checked against PO-77813");

        // Refused whole, nothing decided: nothing ticked; no reason; two tools; not an approver.
        let (status, to, _) = post(&ana, "ana", &app, &[("verdict", "approved"), reason]).await;
        assert_eq!(
            (status, to.as_str()),
            (StatusCode::SEE_OTHER, "/inbox?error=batch_empty")
        );
        let (_, to, _) = post(
            &ana,
            "ana",
            &app,
            &[("step", &a), ("verdict", "approved"), ("reason", " ")],
        )
        .await;
        assert_eq!(to, "/inbox?error=reason");
        let (_, to, _) = post(
            &ana,
            "ana",
            &app,
            &[("step", &a), ("step", &h), ("verdict", "approved"), reason],
        )
        .await;
        assert_eq!(to, "/inbox?error=batch_tools");
        // Ticked twice, or another tenant's gate alone: refused whole.
        let (_, to, _) = post(
            &ana,
            "ana",
            &app,
            &[("step", &a), ("step", &a), ("verdict", "approved"), reason],
        )
        .await;
        assert_eq!(to, "/inbox?error=batch_refused");
        let (_, to, _) = post(
            &ana,
            "ana",
            &app,
            &[("step", &foreign), ("verdict", "approved"), reason],
        )
        .await;
        assert_eq!(to, "/inbox?error=not_found");
        // Beside one's own gate, another tenant's (of another tool or not) is answered as
        // missing, never as a reason to refuse the batch.
        let (status, _, html) = post(
            &ana,
            "ana",
            &app,
            &[
                ("step", &foreign),
                ("step", &h2),
                ("verdict", "approved"),
                reason,
            ],
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert!(html.contains("1 of 2 gate(s) approved"), "{html}");
        assert!(
            html.contains("a gate that is not yours to decide"),
            "{html}"
        );
        assert_eq!(
            app.store.get_step(&foreign).await.unwrap().status,
            StepStatus::NeedsApproval
        );
        let max = app.demo_client("max").await;
        let (status, _, _) = post(
            &max,
            "max",
            &app,
            &[("step", &a), ("verdict", "approved"), reason],
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        for step in [&a, &b, &c, &h] {
            assert_eq!(
                app.store.get_step(step).await.unwrap().status,
                StepStatus::NeedsApproval
            );
        }

        // Three ticked: the two in bounds approved, the one Ana's own credential proposed
        // refused with why, still waiting.
        let (status, _, html) = post(
            &ana,
            "ana",
            &app,
            &[
                ("step", &a),
                ("step", &b),
                ("step", &c),
                ("verdict", "approved"),
                reason,
            ],
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert!(
            html.contains("2 of 3 gate(s) approved; 1 not decided, still waiting."),
            "{html}"
        );
        assert_eq!(
            html.matches("data-testid=\"batch-done\"").count(),
            2,
            "{html}"
        );
        let refused = html
            .split("data-testid=\"batch-refused\"")
            .nth(1)
            .unwrap_or_else(|| panic!("{html}"));
        assert!(refused.contains("1,400.00 EUR"), "{refused}");
        assert!(refused.contains("not decided:"), "{refused}");
        for step in [&a, &b] {
            assert_ne!(
                app.store.get_step(step).await.unwrap().status,
                StepStatus::NeedsApproval
            );
        }
        assert_eq!(
            app.store.get_step(&c).await.unwrap().status,
            StepStatus::NeedsApproval
        );

        // A rejection is each gate's own decision, of one tool too.
        let (_, to, _) = post(
            &ana,
            "ana",
            &app,
            &[("step", &c), ("step", &h), ("verdict", "rejected"), reason],
        )
        .await;
        assert_eq!(to, "/inbox?error=batch_tools");
        for step in [&c, &h] {
            let (status, _, html) = post(
                &ana,
                "ana",
                &app,
                &[("step", step), ("verdict", "rejected"), reason],
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{html}");
            assert!(html.contains("1 of 1 gate(s) rejected"), "{html}");
        }
        for step in [&c, &h] {
            assert_eq!(
                app.store.get_step(step).await.unwrap().status,
                StepStatus::Refused
            );
        }
        app
    })
    .await;
}
