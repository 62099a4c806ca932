//! Tenant-scoped administration, on both backends: a tenant admin's emergency stop halts their
//! tenant only; the stop for every tenant and approving registry changes need the platform
//! role; lifting a stop restores the credentials it revoked only when asked, each audited.

use countersign_core::policy::TaskOrigin;
use countersign_core::store::{NewAgent, ProposalStatus, RunStatus};
use reqwest::header::LOCATION;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::mcp::{Client, INV, each_finance_app};

/// Creates a `worker.finance` credential named `name` in `tenant`: (id, token).
async fn worker(app: &TestApp, name: &str, tenant: &str) -> (String, String) {
    let (cred, token) = app
        .store
        .create_agent(&NewAgent {
            name: name.into(),
            role: "worker.finance".into(),
            tenant: tenant.into(),
            created_by: "person:https://idp.example#admin".into(),
            expires_at: None,
            acts_for: None,
            origin: TaskOrigin::User,
        })
        .await
        .unwrap();
    (cred.id, token.reveal().to_string())
}

async fn post(
    client: &reqwest::Client,
    app: &TestApp,
    path: &str,
    form: &[(&str, &str)],
) -> String {
    let resp = client
        .post(app.url(path))
        .header("origin", format!("http://{}", app.addr))
        .form(form)
        .send()
        .await
        .unwrap();
    resp.headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// The rule a direct read answered with (`emergency.stop` when the stop refused it).
async fn read_rule(client: &mut Client<'_>) -> Value {
    let reply = client.call("invoice.get", json!({"invoice_id": INV})).await;
    reply["result"]["structuredContent"]["rule"].clone()
}

/// The switch rows set now.
async fn switches(app: &TestApp) -> Vec<String> {
    let rows = app.store.switches().await.unwrap();
    rows.into_iter().map(|(name, ..)| name).collect()
}

async fn revoked(app: &TestApp, id: &str) -> bool {
    app.store.get_agent(id).await.unwrap().revoked_at.is_some()
}

async fn session_run(app: &TestApp, agent: &str) -> String {
    let tenant = app.store.get_agent(agent).await.unwrap().tenant;
    let runs = app.store.list_runs(&tenant, 100).await.unwrap();
    runs.into_iter()
        .find(|r| r.agent_id.as_deref() == Some(agent))
        .map(|r| r.id)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenancy_a_tenant_stop_halts_that_tenant_only() {
    each_finance_app(|app| async move {
        let ada = app.demo_client("ada").await; // admin, acme
        let gus = app.demo_client("gus").await; // admin, globex
        let (acme_id, acme_token) = worker(&app, "acme-reader", "acme").await;
        let (globex_id, globex_token) = worker(&app, "globex-reader", "globex").await;
        let mut acme = Client::new(&app, &acme_token);
        acme.connect().await;
        let mut globex = Client::new(&app, &globex_token);
        globex.connect().await;
        assert_ne!(read_rule(&mut acme).await, "emergency.stop");
        assert_ne!(read_rule(&mut globex).await, "emergency.stop");
        let acme_run = session_run(&app, &acme_id).await;
        let globex_run = session_run(&app, &globex_id).await;

        // A tenant admin cannot pull the stop for every tenant.
        let to = post(
            &ada,
            &app,
            "/admin/stop",
            &[("scope", "platform"), ("reason", "all of them")],
        )
        .await;
        assert_eq!(to, "/admin?error=platform");
        assert!(switches(&app).await.is_empty());

        // Ada stops acme: acme's run stops and its agent is revoked; globex's go on.
        let to = post(
            &ada,
            &app,
            "/admin/stop",
            &[("scope", "tenant"), ("reason", "acme's agents misbehave")],
        )
        .await;
        assert_eq!(to, "/admin?done=stopped");
        assert_eq!(switches(&app).await, vec!["emergency_stop:acme"]);
        let status = |id: String| {
            let store = app.store.clone();
            async move { store.get_run(&id).await.unwrap().status }
        };
        assert_eq!(status(acme_run.clone()).await, RunStatus::Stopped);
        assert!(revoked(&app, &acme_id).await);
        assert_eq!(status(globex_run.clone()).await, RunStatus::Active);
        assert!(!revoked(&app, &globex_id).await);
        assert_ne!(read_rule(&mut globex).await, "emergency.stop");
        // A fresh acme credential is held by the stop; the stop is not globex's to lift.
        let (_, fresh_token) = worker(&app, "acme-fresh", "acme").await;
        let mut fresh = Client::new(&app, &fresh_token);
        fresh.connect().await;
        assert_eq!(read_rule(&mut fresh).await, "emergency.stop");
        let to = post(
            &gus,
            &app,
            "/admin/stop/lift",
            &[("scope", "tenant"), ("reason", "not mine to lift")],
        )
        .await;
        assert_eq!(to, "/admin?done=lifted");
        assert_eq!(switches(&app).await, vec!["emergency_stop:acme"]);
        assert_eq!(read_rule(&mut fresh).await, "emergency.stop");

        // Ada's page shows her tenant's stop on, with the one credential it may restore.
        let html = ada
            .get(app.url("/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            html.contains("data-testid=\"stop-state-tenant\" data-stop=\"on\""),
            "{html}"
        );
        assert!(
            html.contains("data-testid=\"stop-state-platform\" data-stop=\"off\""),
            "{html}"
        );
        assert!(html.contains("Restore the 1 agent credential"), "{html}");
        assert!(
            !html.contains("stop-button-platform"),
            "a tenant admin is not offered the platform stop"
        );

        // Lifting without restore leaves what the stop revoked revoked.
        let to = post(
            &ada,
            &app,
            "/admin/stop/lift",
            &[("scope", "tenant"), ("reason", "fixed")],
        )
        .await;
        assert_eq!(to, "/admin?done=lifted");
        assert!(switches(&app).await.is_empty());
        assert!(revoked(&app, &acme_id).await);
        assert_ne!(read_rule(&mut fresh).await, "emergency.stop");
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenancy_the_platform_stop_holds_every_tenant_and_lifting_restores_on_request() {
    each_finance_app(|app| async move {
        let bob = app.demo_client("bob").await; // admin + platform admin, acme
        let (acme_id, acme_token) = worker(&app, "acme-reader", "acme").await;
        let (globex_id, globex_token) = worker(&app, "globex-reader", "globex").await;
        let mut acme = Client::new(&app, &acme_token);
        acme.connect().await;
        let mut globex = Client::new(&app, &globex_token);
        globex.connect().await;
        read_rule(&mut acme).await;
        read_rule(&mut globex).await;
        let (suspect_id, suspect_token) = worker(&app, "acme-suspect", "acme").await;
        let mut suspect = Client::new(&app, &suspect_token);
        suspect.connect().await;
        read_rule(&mut suspect).await;

        let to = post(
            &bob,
            &app,
            "/admin/stop",
            &[("scope", "platform"), ("reason", "campaign across tenants")],
        )
        .await;
        assert_eq!(to, "/admin?done=stopped");
        assert_eq!(switches(&app).await, vec!["emergency_stop"]);
        assert!(revoked(&app, &acme_id).await);
        assert!(revoked(&app, &globex_id).await);
        assert!(revoked(&app, &suspect_id).await);
        // The suspect's credential, revoked by the stop, is revoked by a person too: that
        // revocation is theirs, and no lift undoes it.
        app.store.revoke_agent(&suspect_id, "ops").await.unwrap();

        // Lifting with restore: the two credentials the stop revoked come back, audited.
        let to = post(
            &bob,
            &app,
            "/admin/stop/lift",
            &[
                ("scope", "platform"),
                ("reason", "contained"),
                ("restore", "1"),
            ],
        )
        .await;
        assert_eq!(to, "/admin?done=lifted");
        assert!(switches(&app).await.is_empty());
        assert!(!revoked(&app, &acme_id).await);
        assert!(!revoked(&app, &globex_id).await);
        assert!(revoked(&app, &suspect_id).await);
        let restored: Vec<String> = app
            .store
            .audit_in_order(0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.rule.as_deref() == Some("agent.restored"))
            .map(|r| serde_json::from_str::<Value>(&r.record).unwrap())
            .filter_map(|r| r["detail"]["id"].as_str().map(String::from))
            .collect();
        let mut expected = vec![acme_id.clone(), globex_id.clone()];
        expected.sort();
        let mut got = restored.clone();
        got.sort();
        assert_eq!(got, expected);
        // Restored credentials work again (a new session: the stopped run stays stopped).
        let mut again = Client::new(&app, &acme_token);
        again.connect().await;
        let reply = again.call("invoice.get", json!({"invoice_id": INV})).await;
        assert_eq!(reply["result"]["isError"], false, "{reply}");

        // The CLI stops one tenant (--tenant) and lifts it with --restore.
        let out = crate::helpers::countersign_on(&app.db_url())
            .args(["stop", "--tenant", "globex", "--reason", "globex only"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(switches(&app).await, vec!["emergency_stop:globex"]);
        assert_ne!(read_rule(&mut again).await, "emergency.stop");
        let out = crate::helpers::countersign_on(&app.db_url())
            .args(["stop", "--tenant", "globex", "--lift", "--restore"])
            .args(["--reason", "done", "--by", "ops:carol"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(switches(&app).await.is_empty());
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenancy_registry_changes_need_the_platform_role_to_apply() {
    each_finance_app(|app| async move {
        let ada = app.demo_client("ada").await;
        let gus = app.demo_client("gus").await;
        let bob = app.demo_client("bob").await;
        let (base, _) = app.store.current_bundle().await.unwrap().unwrap();
        let base = base.to_string();
        let to = post(
            &ada,
            &app,
            "/admin/tools/settings",
            &[
                ("base", base.as_str()),
                ("tool", "invoice.hold"),
                ("note", "holds decided within two days"),
                ("expires", "48h"),
            ],
        )
        .await;
        assert_eq!(to, "/admin?done=proposed");
        let proposal = app.store.list_proposals(10).await.unwrap().remove(0);
        let path = format!("/admin/proposals/{}/decision", proposal.id);
        // Another tenant's admin, without the platform role: refused, nothing applied.
        let to = post(
            &gus,
            &app,
            &path,
            &[("verdict", "approve"), ("reason", "ok")],
        )
        .await;
        assert_eq!(to, "/admin?error=platform");
        let html = gus
            .get(app.url("/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(html.contains("data-testid=\"needs-platform\""), "{html}");
        assert_eq!(
            app.store.get_proposal(&proposal.id).await.unwrap().status,
            ProposalStatus::Proposed
        );
        let refused: Vec<Option<String>> = app
            .store
            .audit_in_order(0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.rule.as_deref() == Some("admin.proposal.refused_platform"))
            .map(|r| r.actor)
            .collect();
        assert_eq!(
            refused,
            vec![Some("person:urn:countersign:demo#gus".to_string())]
        );
        // The platform admin applies it.
        let to = post(
            &bob,
            &app,
            &path,
            &[("verdict", "approve"), ("reason", "ok")],
        )
        .await;
        assert_eq!(to, "/admin?done=approved");
        assert_eq!(
            app.store.get_proposal(&proposal.id).await.unwrap().status,
            ProposalStatus::Approved
        );
        app
    })
    .await;
}
