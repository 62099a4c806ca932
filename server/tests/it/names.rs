//! Names, not ids, where people read (issue 36), on both backends: the gate history, the run
//! timeline and the audit search name the agent and the person; the audit search finds an
//! agent's records by its name; the exact recorded actor stays one hover away.

use countersign_core::policy::TaskOrigin;
use countersign_core::store::NewAgent;
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::TestApp;
use crate::mcp::{Client, each_finance_app, payment_for};

async fn page(who: &reqwest::Client, app: &TestApp, path: &str) -> String {
    let resp = who.get(app.url(path)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{path}");
    resp.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_read_agent_and_person_names_not_ids() {
    each_finance_app(|app| async move {
        let (cred, token) = app
            .store
            .create_agent(&NewAgent {
                name: "invoice-bot".into(),
                role: "worker.finance".into(),
                tenant: "acme".into(),
                created_by: "person:https://idp.example#admin".into(),
                expires_at: None,
                acts_for: None,
                origin: TaskOrigin::User,
            })
            .await
            .unwrap();
        let token = token.reveal().to_string();
        let mut client = Client::new(&app, &token);
        client.connect().await;
        let reply = client
            .call(
                "payment.schedule",
                payment_for("INV-20260612", json!(1200.0)),
            )
            .await;
        let step = reply["result"]["structuredContent"]["step_id"]
            .as_str()
            .unwrap()
            .to_string();
        let run = app.store.get_step(&step).await.unwrap().run_id;
        let ana = app.demo_client("ana").await;
        // The gate history names the agent; its id is only in the cell's title.
        let html = page(&ana, &app, &format!("/inbox/{step}")).await;
        assert!(
            html.contains(">agent invoice-bot (worker.finance)<"),
            "{html}"
        );
        assert!(
            html.contains(&format!(
                "title=\"agent:{} role:worker.finance tenant:acme\"",
                cred.id
            )),
            "{html}"
        );
        let resp = ana
            .post(app.url(&format!("/inbox/{step}/decision")))
            .header("origin", format!("http://{}", app.addr))
            .form(&[("verdict", "rejected"), ("reason", "not this week")])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);

        // The run timeline: the agent and the person by name; the id only in a title.
        let aud = app.demo_client("aud").await;
        let html = page(&aud, &app, &format!("/runs/{run}")).await;
        let actors: Vec<&str> = html
            .split("data-testid=\"event-actor\"")
            .skip(1)
            .filter_map(|s| s.split('>').nth(1)?.split('<').next())
            .collect();
        assert!(
            actors.contains(&"agent invoice-bot (worker.finance)"),
            "{actors:?}"
        );
        assert!(actors.contains(&"Ana (AP clerk)"), "{actors:?}");
        assert!(actors.iter().all(|a| !a.contains(&cred.id)), "{actors:?}");

        // The audit search by the agent's name finds its records, shown by name.
        let html = page(&aud, &app, "/audit?actor=invoice-bot").await;
        let found: Vec<&str> = html
            .split("data-testid=\"audit-actor\"")
            .skip(1)
            .filter_map(|s| s.split('>').nth(1)?.split('<').next())
            .collect();
        assert!(!found.is_empty(), "{html}");
        assert!(
            found
                .iter()
                .all(|a| *a == "agent invoice-bot (worker.finance)"),
            "{found:?}"
        );
        assert!(
            html.contains(&format!(
                "title=\"agent:{} role:worker.finance tenant:acme\"",
                cred.id
            )),
            "the exact actor stays one hover away"
        );
        // Records name their run by its task; its id is in the title.
        assert!(
            html.contains("run “MCP session of agent invoice-bot”"),
            "{html}"
        );
        assert!(html.contains(&format!("title=\"{run}\"")), "{html}");
        // The run list names the run's principal too.
        let html = page(&aud, &app, "/runs").await;
        assert!(
            html.contains(">agent invoice-bot (worker.finance)<"),
            "{html}"
        );
        // Another tenant's agent is never resolved nor named here, and the export follows
        // the same search.
        app.store
            .create_agent(&NewAgent {
                name: "globex-bot".into(),
                role: "worker.finance".into(),
                tenant: "globex".into(),
                created_by: "person:https://idp.example#gus".into(),
                expires_at: None,
                acts_for: None,
                origin: TaskOrigin::User,
            })
            .await
            .unwrap();
        let html = page(&aud, &app, "/audit?actor=globex-bot").await;
        assert!(!html.contains("data-testid=\"audit-row\""), "{html}");
        let export = page(&aud, &app, "/audit/export.jsonl?actor=invoice-bot").await;
        assert!(export.lines().count() >= 2, "{export}");
        assert!(export.lines().all(|l| l.contains(&cred.id)), "{export}");
        app
    })
    .await;
}
