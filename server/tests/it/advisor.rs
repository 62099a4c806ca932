//! Shadow rules and the gate advisor through the product (issue 33), on both backends: a
//! shadow rule's would-decision is recorded with the call and counted on `/gates`; enforcing it
//! is an admin's proposal whose impact preview the admin page shows; the advisor recommends on
//! the evidence and drafts only what it recommends, for managers and admins only.

use countersign_core::store::{Change, ProposalStatus};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::mcp::{Client, agent, each_finance_app};

/// The invoice the holds name (12,400.00 EUR).
const INVOICE: &str = "INV-20260615";

fn hold(amount: f64, n: usize) -> Value {
    json!({"invoice_id": INVOICE, "amount": amount, "currency": "EUR",
           "reason": format!("Racking delivery {n}: quantity disputed with the supplier")})
}

/// A hold of `amount` by `client`: (its status, its step id).
async fn call_hold(client: &mut Client<'_>, amount: f64, n: usize) -> (String, String) {
    let reply = client.call("invoice.hold", hold(amount, n)).await;
    let c = &reply["result"]["structuredContent"];
    (
        c["status"].as_str().unwrap_or_default().to_string(),
        c["step_id"].as_str().unwrap_or_default().to_string(),
    )
}

async fn page(client: &reqwest::Client, app: &TestApp, path: &str) -> (StatusCode, String) {
    let resp = client.get(app.url(path)).send().await.unwrap();
    let status = resp.status();
    (status, resp.text().await.unwrap())
}

/// Posts a form; its status and where it redirects to (empty: no redirect).
async fn post(
    client: &reqwest::Client,
    app: &TestApp,
    path: &str,
    form: &[(&str, &str)],
) -> (StatusCode, String) {
    let resp = client
        .post(app.url(path))
        .header("origin", format!("http://{}", app.addr))
        .form(form)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let to = resp
        .headers()
        .get(reqwest::header::LOCATION)
        .map(|l| l.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, to)
}

async fn decide(app: &TestApp, who: &reqwest::Client, step: &str, verdict: &str) {
    let (status, to) = post(
        who,
        app,
        &format!("/inbox/{step}/decision"),
        &[("verdict", verdict), ("reason", "goods receipt checked")],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{to}");
}

/// The `decided` records of `step`, oldest first.
async fn decided(app: &TestApp, step: &str) -> Vec<Value> {
    app.store
        .audit_records("acme", 1, 10_000)
        .await
        .unwrap()
        .iter()
        .filter(|r| r.step_id.as_deref() == Some(step) && r.event == "decided")
        .map(|r| serde_json::from_str::<Value>(&r.record).unwrap()["detail"].clone())
        .collect()
}

/// The HTML of the element `testid` whose `data-<attr>` is `value` (to the next `</article>`).
fn card<'a>(html: &'a str, testid: &str, attr: &str, value: &str) -> Option<&'a str> {
    let wanted = format!("data-{attr}=\"{value}\"");
    html.split(&format!("data-testid=\"{testid}\""))
        .skip(1)
        .find(|c| c.split('>').next().is_some_and(|tag| tag.contains(&wanted)))
        .and_then(|c| c.split("</article>").next())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rules_would_denies_are_recorded_counted_and_enforcing_it_is_a_previewed_proposal()
{
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-shadow", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        // Above the example's shadow cap (5,000): gated as ever, and recorded as a would-deny.
        let (status, over) = call_hold(&mut client, 6000.0, 1).await;
        assert_eq!(status, "needs_approval");
        let (status, under) = call_hold(&mut client, 2000.0, 2).await;
        assert_eq!(status, "needs_approval");
        let (status, _) = call_hold(&mut client, 500.0, 3).await;
        assert_eq!(status, "on_hold", "the shadow rule changes no outcome: it ran");
        let records = decided(&app, &over).await;
        let hits = &records[0]["shadow"];
        assert_eq!(hits[0]["id"], "finance.hold.cap_watch", "{hits}");
        assert_eq!(hits[0]["would"]["decision"], "deny", "{hits}");
        assert_eq!(decided(&app, &under).await[0].get("shadow"), None);

        // Counted on /gates; only an admin is offered to enforce it.
        let max = app.demo_client("max").await;
        let (status, html) = page(&max, &app, "/gates").await;
        assert_eq!(status, StatusCode::OK);
        let shadow = card(&html, "shadow-rule", "id", "finance.hold.cap_watch")
            .unwrap_or_else(|| panic!("{html}"));
        assert!(shadow.contains("would deny 1 · would gate 0"), "{shadow}");
        assert!(!shadow.contains("data-testid=\"promote\""), "{shadow}");
        let (status, _) = post(&max, &app, "/admin/shadow/promote", &[("id", "finance.hold.cap_watch")]).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(app.store.list_proposals(10).await.unwrap().is_empty());

        let ada = app.demo_client("ada").await;
        let (_, html) = page(&ada, &app, "/gates").await;
        assert!(html.contains("data-testid=\"promote\""), "{html}");
        // Not a shadow rule: refused, nothing filed.
        let (_, to) = post(&ada, &app, "/admin/shadow/promote", &[("id", "finance.hold.above_threshold")]).await;
        assert_eq!(to, "/admin?error=not_shadow");
        assert!(app.store.list_proposals(10).await.unwrap().is_empty());
        let (_, to) = post(&ada, &app, "/admin/shadow/promote", &[("id", "finance.hold.cap_watch")]).await;
        assert_eq!(to, "/admin?done=proposed");
        let proposals = app.store.list_proposals(10).await.unwrap();
        assert_eq!(proposals.len(), 1);
        assert_eq!(proposals[0].status, ProposalStatus::Proposed);
        let Change::Bundle(bundle) = &proposals[0].changes[0] else {
            panic!("{:?}", proposals[0].changes);
        };
        assert!(!bundle.policies.contains("@shadow\n@rule(\"hold.cap\")"));

        // The admin page previews it: the gated 6,000 hold would have been refused.
        let (status, html) = page(&ada, &app, "/admin").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            html.contains("data-testid=\"preview-transition\" data-transition=\"require_approval-&gt;deny\"")
                || html.contains("data-testid=\"preview-transition\" data-transition=\"require_approval->deny\""),
            "{html}"
        );
        assert!(html.contains("3 recorded call(s) of the last 30 days (tenant acme) replayed; 1 would be decided differently"), "{html}");
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_advisor_recommends_on_the_evidence_and_drafts_only_what_it_recommends() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-advice", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let ana = app.demo_client("ana").await;
        let max = app.demo_client("max").await;
        let mut steps = Vec::new();
        for n in 0..20 {
            let (status, step) = call_hold(&mut client, 1100.0 + n as f64, n).await;
            assert_eq!(status, "needs_approval");
            steps.push(step);
        }
        for step in &steps[..19] {
            decide(&app, &ana, step, "approved").await;
        }
        let advice = |html: &str| {
            card(html, "advice", "tool", "invoice.hold")
                .map(str::to_string)
                .unwrap_or_else(|| panic!("{html}"))
        };
        // 19 decisions: too few for any recommendation, and nothing to draft.
        let (_, html) = page(&max, &app, "/gates").await;
        let row = advice(&html);
        assert!(row.contains("data-advice=\"too_few\""), "{row}");
        assert!(!row.contains("data-testid=\"draft\""), "{row}");
        let form = [("tool", "invoice.hold"), ("rule", "amount.threshold")];
        let (_, to) = post(&max, &app, "/gates/draft", &form).await;
        assert_eq!(
            to, "/gates?error=not_offered",
            "not recommended: not drafted"
        );

        // 20 decisions, none rejected, a reversal cost of 5 approvals: even the interval's
        // upper bound (16 %) × 5 is below one review.
        decide(&app, &ana, &steps[19], "approved").await;
        let (_, html) = page(&max, &app, "/gates").await;
        let row = advice(&html);
        assert!(row.contains("data-advice=\"consider_reviewer\""), "{row}");
        assert!(
            row.contains("consider moving this step to the model reviewer"),
            "{row}"
        );
        assert!(row.contains("5 approvals"), "{row}");
        assert!(row.contains("data-testid=\"draft\""), "{row}");

        // Who may draft: not an approver; never the irreversible floor.
        let (status, _) = post(&ana, &app, "/gates/draft", &form).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let floor = [
            ("tool", "payment.schedule"),
            ("rule", "irreversible.always"),
        ];
        let (_, to) = post(&max, &app, "/gates/draft", &floor).await;
        assert_eq!(to, "/gates?error=not_offered");
        // Nor would one be made for the floor, whatever the evidence.
        let loaded = app.state.registry.current().unwrap();
        assert_eq!(
            countersign::http::views::draft_for(
                &loaded.bundle,
                "payment.schedule",
                "irreversible.always"
            ),
            None
        );
        assert_eq!(
            countersign::http::views::draft_for(
                &loaded.bundle,
                "supplier.update_iban",
                "gate.always"
            ),
            Some(countersign::http::views::Draft::GateToPolicy)
        );
        let resp = max
            .post(app.url("/gates/draft"))
            .header("origin", "https://evil.example")
            .form(&form)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert!(app.store.list_proposals(10).await.unwrap().is_empty());

        let (_, to) = post(&max, &app, "/gates/draft", &form).await;
        assert_eq!(to, "/gates?done=drafted");
        let (_, html) = page(&max, &app, &to).await;
        assert!(html.contains("Proposal drafted."), "{html}");
        let proposals = app.store.list_proposals(10).await.unwrap();
        assert_eq!(proposals.len(), 1);
        let Change::Bundle(bundle) = &proposals[0].changes[0] else {
            panic!("{:?}", proposals[0].changes);
        };
        assert!(
            bundle
                .policies
                .contains("@shadow\n@id(\"finance.hold.above_threshold\")"),
            "the gate's rule keeps watching as a shadow rule"
        );
        assert!(bundle.summary.contains("review"), "{}", bundle.summary);
        assert!(
            proposals[0].note.contains("tenant acme"),
            "{}",
            proposals[0].note
        );
        // Nothing changed until a second admin approves.
        let (status, _) = call_hold(&mut client, 2500.0, 99).await;
        assert_eq!(status, "needs_approval");
        app
    })
    .await;
}
