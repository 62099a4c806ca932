//! The admin page (`/admin`) and its form endpoints, signed in through the demo sign-in (ada
//! and bob are the two demo admins), on both backends: who may see and change what, the
//! two-admin review of role × tool changes reaching a live MCP session's `tools/list`,
//! stale proposals superseded, agent credentials, and the emergency stop.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use countersign_core::audit::AuditRecord;
use countersign_core::store::{ProposalStatus, RunStatus};
use countersign_core::{Registry, StepStatus};
use reqwest::StatusCode;
use reqwest::header::LOCATION;
use serde_json::json;

use crate::helpers::TestApp;
use crate::mcp::{Client, INV, agent, each_finance_app};

fn location(resp: &reqwest::Response) -> String {
    resp.headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

fn origin(app: &TestApp) -> String {
    format!("http://{}", app.addr)
}

/// POSTs `form` to `path` from the dashboard's origin.
async fn post(
    client: &reqwest::Client,
    app: &TestApp,
    path: &str,
    form: &[(&str, String)],
) -> reqwest::Response {
    client
        .post(app.url(path))
        .header("origin", origin(app))
        .form(form)
        .send()
        .await
        .unwrap()
}

/// The current version and its listing as (role, tool) pairs.
async fn listing(app: &TestApp) -> (i64, BTreeSet<(String, String)>) {
    let (version, sources) = app.store.current_bundle().await.unwrap().unwrap();
    let registry = Registry::from_sources(&sources.registry_sources()).unwrap();
    let pairs = registry
        .listing()
        .iter()
        .flat_map(|(r, tools)| tools.iter().map(move |t| (r.to_string(), t.to_string())))
        .collect();
    (version, pairs)
}

/// The matrix form after ticking `add` and unticking `remove` ((role, tool) pairs), against
/// `base`.
fn matrix_form(
    base: i64,
    current: &BTreeSet<(String, String)>,
    add: &[(&str, &str)],
    remove: &[(&str, &str)],
    note: &str,
) -> Vec<(&'static str, String)> {
    let mut wanted = current.clone();
    for (r, t) in add {
        wanted.insert(((*r).to_string(), (*t).to_string()));
    }
    for (r, t) in remove {
        wanted.remove(&((*r).to_string(), (*t).to_string()));
    }
    let mut form = vec![("base", base.to_string()), ("note", note.to_string())];
    form.extend(
        wanted
            .into_iter()
            .map(|(r, t)| ("cell", format!("{r}|{t}"))),
    );
    form
}

/// Proposes through the page's form as `client`; returns the redirect target.
async fn propose(
    client: &reqwest::Client,
    app: &TestApp,
    add: &[(&str, &str)],
    remove: &[(&str, &str)],
) -> String {
    let (base, current) = listing(app).await;
    let form = matrix_form(base, &current, add, remove, "comms needs to find invoices");
    let resp = post(client, app, "/admin/proposals", &form).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    // Proposals list newest first by time: keep each one's time distinct.
    app.clock.advance(chrono::Duration::seconds(1));
    location(&resp)
}

async fn newest_proposal(app: &TestApp) -> countersign_core::store::Proposal {
    app.store
        .list_proposals(1)
        .await
        .unwrap()
        .into_iter()
        .next()
        .expect("a proposal")
}

async fn decide(
    client: &reqwest::Client,
    app: &TestApp,
    id: &str,
    verdict: &str,
    reason: &str,
) -> String {
    let resp = post(
        client,
        app,
        &format!("/admin/proposals/{id}/decision"),
        &[("verdict", verdict.into()), ("reason", reason.into())],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    location(&resp)
}

/// The `admin.proposal.*` audit records, in order: (rule suffix, actor).
async fn proposal_audit(app: &TestApp) -> Vec<(String, String)> {
    let records: Vec<AuditRecord> = app.store.audit_in_order(0, 10_000).await.unwrap();
    records
        .into_iter()
        .filter_map(|r| {
            let rule = r.rule?.strip_prefix("admin.proposal.")?.to_string();
            Some((rule, r.actor.unwrap_or_default()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_page_and_endpoints_refuse_everyone_but_admins() {
    each_finance_app(|app| async move {
        // Signed out: the page redirects to sign-in; a form post is 401.
        let anon = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let resp = anon.get(app.url("/admin")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        assert!(
            location(&resp).starts_with("/auth/login"),
            "{}",
            location(&resp)
        );
        let (base, current) = listing(&app).await;
        let form = matrix_form(
            base,
            &current,
            &[("worker.comms", "invoice.search")],
            &[],
            "x",
        );
        let resp = post(&anon, &app, "/admin/proposals", &form).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);

        // A manager and an approver are signed in but refused: no data, no change.
        for user in ["max", "ana"] {
            let client = app.demo_client(user).await;
            let resp = client.get(app.url("/admin")).send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{user}");
            let html = resp.text().await.unwrap();
            assert!(html.contains("data-testid=\"not-admin\""), "{user}: {html}");
            assert!(
                !html.contains("payment.schedule"),
                "{user}: the page leaks tools"
            );
            assert!(
                !html.contains("admin-matrix"),
                "{user}: the page leaks the matrix"
            );
            for (path, form) in [
                ("/admin/proposals", form.clone()),
                (
                    "/admin/stop",
                    vec![("scope", "tenant".into()), ("reason", "nope".to_string())],
                ),
                (
                    "/admin/agents",
                    vec![
                        ("name", "sneaky".to_string()),
                        ("role", "planner".into()),
                        ("tenant", "acme".into()),
                    ],
                ),
            ] {
                let resp = post(&client, &app, path, &form).await;
                assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{user} {path}");
            }
        }
        assert!(app.store.list_proposals(10).await.unwrap().is_empty());
        assert!(app.store.switches().await.unwrap().is_empty());
        assert!(app.store.list_agents().await.unwrap().is_empty());

        // An admin's form posted from another origin is refused (CSRF).
        let ada = app.demo_client("ada").await;
        let resp = ada
            .post(app.url("/admin/stop"))
            .header("origin", "http://evil.example")
            .form(&[("scope", "tenant"), ("reason", "csrf")])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert!(app.store.switches().await.unwrap().is_empty());

        // The admin sees the matrix with effect classes and gate settings.
        let resp = ada.get(app.url("/admin")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let html = resp.text().await.unwrap();
        assert!(html.contains("data-testid=\"admin-matrix\""), "{html}");
        let row = html
            .split("data-tool=\"payment.schedule\"")
            .nth(1)
            .and_then(|rest| rest.split("</tr>").next())
            .expect("a payment.schedule row");
        assert!(row.contains("irreversible"), "{row}");
        assert!(row.contains("approvers: approver"), "{row}");
        let checked = |pair: &str| {
            let cell = row
                .split(&format!("data-testid=\"cell:{pair}\""))
                .next()
                .and_then(|before| before.rsplit("<input").next())
                .unwrap_or_default()
                .to_string();
            cell.contains("checked")
        };
        assert!(checked("worker.finance|payment.schedule"), "{row}");
        assert!(!checked("planner|payment.schedule"), "{row}");
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_change_applies_only_after_a_second_admin_and_reaches_tools_list() {
    each_finance_app(|app| async move {
        let (_, comms) = agent(&app, "comms-1", "worker.comms").await;
        let mut client = Client::new(&app, &comms);
        client.connect().await;
        let before = client.tool_names().await;
        assert!(
            !before.contains(&"invoice.search".to_string()),
            "{before:?}"
        );
        assert!(before.contains(&"note.discard".to_string()), "{before:?}");
        let (v1, _) = listing(&app).await;

        let ada = app.demo_client("ada").await;
        let bob = app.demo_client("bob").await;
        let to = propose(
            &ada,
            &app,
            &[("worker.comms", "invoice.search")],
            &[("worker.comms", "note.discard")],
        )
        .await;
        assert_eq!(to, "/admin?done=proposed");
        let p = newest_proposal(&app).await;
        assert_eq!(p.status, ProposalStatus::Proposed);
        assert_eq!(p.base_version, v1);
        assert_eq!(
            p.changes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            vec![
                "+ invoice.search for role worker.comms",
                "- note.discard no longer for role worker.comms",
            ]
        );
        // Proposed is not in force.
        assert_eq!(client.tool_names().await, before);

        // The proposer cannot approve it: refused, audited, nothing applied.
        assert_eq!(
            decide(&ada, &app, &p.id, "approve", "looks right").await,
            "/admin?error=own"
        );
        assert_eq!(newest_proposal(&app).await.status, ProposalStatus::Proposed);
        assert_eq!(listing(&app).await.0, v1);
        assert_eq!(client.tool_names().await, before);

        // The page shows the diff and offers bob, not ada, the approve button.
        let html = bob
            .get(app.url("/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(html.contains("+ invoice.search for worker.comms"), "{html}");
        assert!(
            html.contains("- note.discard no longer for worker.comms"),
            "{html}"
        );
        assert!(html.contains("data-testid=\"approve\""), "{html}");
        let html = ada
            .get(app.url("/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(html.contains("data-testid=\"own-proposal\""), "{html}");
        assert!(!html.contains("data-testid=\"approve\""), "{html}");

        // A second admin approves: a new version, in force for the live MCP session.
        assert_eq!(
            decide(&bob, &app, &p.id, "approve", "comms asked for it").await,
            "/admin?done=approved"
        );
        let p = app.store.get_proposal(&p.id).await.unwrap();
        assert_eq!(p.status, ProposalStatus::Approved);
        assert_eq!(p.applied_version, Some(v1 + 1));
        assert_eq!(listing(&app).await.0, v1 + 1);
        let after = client.tool_names().await;
        assert!(after.contains(&"invoice.search".to_string()), "{after:?}");
        assert!(!after.contains(&"note.discard".to_string()), "{after:?}");
        assert!(after.contains(&"note.draft".to_string()), "{after:?}");
        // The removed tool does not exist for the role any more.
        let reply = client
            .call("note.discard", json!({"note_id": "NOTE-1", "reason": "x"}))
            .await;
        assert!(
            reply["error"].is_object() || reply["result"]["isError"] == true,
            "{reply}"
        );
        // Approving twice does nothing more.
        assert_eq!(
            decide(&bob, &app, &p.id, "approve", "again").await,
            "/admin?error=not_pending"
        );
        assert_eq!(listing(&app).await.0, v1 + 1);

        let versions = app.store.registry_versions(1).await.unwrap();
        assert!(versions[0].created_by.contains(&p.id), "{versions:?}");
        assert!(versions[0].diff.contains("worker.comms"), "{versions:?}");
        assert_eq!(
            proposal_audit(&app).await,
            vec![
                ("proposed".into(), "person:urn:countersign:demo#ada".into()),
                (
                    "refused_own".into(),
                    "person:urn:countersign:demo#ada".into()
                ),
                ("approved".into(), "person:urn:countersign:demo#bob".into()),
            ]
        );
        let report = app.store.verify_audit().await.unwrap();
        assert!(report.is_ok(), "{report:?}");
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_stale_proposals_are_superseded_and_bad_ones_refused() {
    each_finance_app(|app| async move {
        let ada = app.demo_client("ada").await;
        let bob = app.demo_client("bob").await;
        let (v1, current) = listing(&app).await;
        assert_eq!(
            propose(&ada, &app, &[("worker.comms", "po.get")], &[]).await,
            "/admin?done=proposed"
        );
        let first = newest_proposal(&app).await;
        assert_eq!(
            propose(&ada, &app, &[("worker.comms", "supplier.get")], &[]).await,
            "/admin?done=proposed"
        );
        let second = newest_proposal(&app).await;
        assert_ne!(first.id, second.id);

        assert_eq!(
            decide(&bob, &app, &first.id, "approve", "ok").await,
            "/admin?done=approved"
        );
        // The second was made against v1, which is no longer current: superseded.
        assert_eq!(
            decide(&bob, &app, &second.id, "approve", "ok").await,
            "/admin?done=superseded"
        );
        let second = app.store.get_proposal(&second.id).await.unwrap();
        assert_eq!(second.status, ProposalStatus::Superseded);
        assert_eq!(second.applied_version, None);
        let (v2, now) = listing(&app).await;
        assert_eq!(v2, v1 + 1);
        assert!(now.contains(&("worker.comms".into(), "po.get".into())));
        assert!(!now.contains(&("worker.comms".into(), "supplier.get".into())));

        // A form made against the old version is refused as stale; nothing is stored.
        let form = matrix_form(
            v1,
            &current,
            &[("worker.comms", "payment.lookup")],
            &[],
            "x",
        );
        let resp = post(&ada, &app, "/admin/proposals", &form).await;
        assert_eq!(location(&resp), "/admin?error=stale");
        // No change, no note, a tool left without a role: refused.
        let form = matrix_form(v2, &now, &[], &[], "nothing");
        let resp = post(&ada, &app, "/admin/proposals", &form).await;
        assert_eq!(location(&resp), "/admin?error=no_change");
        let form = matrix_form(v2, &now, &[("planner", "note.draft")], &[], " ");
        let resp = post(&ada, &app, "/admin/proposals", &form).await;
        assert_eq!(location(&resp), "/admin?error=note");
        let form = matrix_form(
            v2,
            &now,
            &[],
            &[("worker.vendor_master", "supplier.update_iban")],
            "drop it",
        );
        let resp = post(&ada, &app, "/admin/proposals", &form).await;
        assert_eq!(location(&resp), "/admin?error=invalid");
        assert_eq!(app.store.list_proposals(10).await.unwrap().len(), 2);

        // Rejecting needs a reason; then the proposal is rejected and never applies.
        assert_eq!(
            propose(&ada, &app, &[("planner", "note.draft")], &[]).await,
            "/admin?done=proposed"
        );
        let third = newest_proposal(&app).await;
        assert_eq!(
            decide(&bob, &app, &third.id, "reject", " ").await,
            "/admin?error=reason"
        );
        assert_eq!(
            decide(&bob, &app, &third.id, "reject", "planners do not write").await,
            "/admin?done=rejected"
        );
        assert_eq!(
            decide(&bob, &app, &third.id, "approve", "changed my mind").await,
            "/admin?error=not_pending"
        );
        assert_eq!(
            app.store.get_proposal(&third.id).await.unwrap().status,
            ProposalStatus::Rejected
        );
        assert_eq!(listing(&app).await.0, v2);
        let rules: Vec<String> = proposal_audit(&app)
            .await
            .into_iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(
            rules,
            vec![
                "proposed",
                "proposed",
                "approved",
                "superseded",
                "proposed",
                "rejected"
            ]
        );
        app
    })
    .await;
}

async fn wait_for(app: &TestApp, step: &str, status: StepStatus) {
    let began = Instant::now();
    loop {
        let now = app.store.get_step(step).await.unwrap();
        if now.status == status {
            return;
        }
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "step {step} stuck at {:?}, wanted {status:?}",
            now.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Submits a one-note plan; returns (run id, step id).
async fn note_plan(client: &mut Client<'_>) -> (String, String) {
    let reply = client
        .call(
            "plan.submit",
            json!({"task": "Process invoice", "steps": [
                {"tool": "note.draft", "arguments": {"invoice_id": INV, "text": "Paying now."},
                 "reason": "Record why the invoice is paid now", "evidence": [INV]}]}),
        )
        .await;
    let content = &reply["result"]["structuredContent"];
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    (
        content["run_id"].as_str().unwrap().to_string(),
        content["steps"][0]["step_id"].as_str().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_credentials_and_the_emergency_stop_switch() {
    each_finance_app(|app| async move {
        let ada = app.demo_client("ada").await;

        // Create a planner credential from the page: the token is shown once and works.
        let resp = post(
            &ada,
            &app,
            "/admin/agents",
            &[
                ("name", "planner-web".to_string()),
                ("role", "planner".into()),
                ("tenant", "acme".into()),
                ("expires", "30d".into()),
            ],
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let html = resp.text().await.unwrap();
        let token = html
            .split("value=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("the token")
            .to_string();
        let cred = app.store.list_agents().await.unwrap().remove(0);
        assert_eq!(cred.created_by, "person:urn:countersign:demo#ada");
        assert!(cred.expires_at.is_some());
        let page = ada
            .get(app.url("/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(page.contains("planner-web"), "listed");
        assert!(!page.contains(&token), "the token is never shown again");
        // An unknown role is refused.
        let resp = post(
            &ada,
            &app,
            "/admin/agents",
            &[
                ("name", "x".to_string()),
                ("role", "root".into()),
                ("tenant", "acme".into()),
            ],
        )
        .await;
        assert_eq!(location(&resp), "/admin?error=agent");

        let mut planner = Client::new(&app, &token);
        planner.connect().await;
        let (run, _) = note_plan(&mut planner).await;
        let steps = app.store.steps_for_run(&run).await.unwrap();
        wait_for(&app, &steps[0].id, StepStatus::Done).await;

        // Another planner, connected before the stop from the page.
        let (_, second) = agent(&app, "planner-2", "planner").await;
        let mut other = Client::new(&app, &second);
        other.connect().await;
        let resp = post(
            &ada,
            &app,
            "/admin/stop",
            &[("scope", "tenant".into()), ("reason", " ".to_string())],
        )
        .await;
        assert_eq!(location(&resp), "/admin?error=reason");
        assert!(app.store.switches().await.unwrap().is_empty());
        let resp = post(
            &ada,
            &app,
            "/admin/stop",
            &[
                ("scope", "tenant".into()),
                ("reason", "suspected prompt injection".to_string()),
            ],
        )
        .await;
        assert_eq!(location(&resp), "/admin?done=stopped");
        let html = ada
            .get(app.url("/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(html.contains("data-stop=\"on\""), "{html}");
        assert!(html.contains("suspected prompt injection"), "{html}");
        // While it is on, no step starts (a run submitted now stays pending).
        let (run2, step2) = note_plan(&mut other).await;
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(
            app.store.get_step(&step2).await.unwrap().status,
            StepStatus::Pending
        );
        assert_eq!(
            app.store.get_run(&run2).await.unwrap().status,
            RunStatus::Active
        );
        // Lifting needs a reason; then the waiting step runs.
        let resp = post(
            &ada,
            &app,
            "/admin/stop/lift",
            &[
                ("scope", "tenant".into()),
                ("reason", "all clear".to_string()),
            ],
        )
        .await;
        assert_eq!(location(&resp), "/admin?done=lifted");
        wait_for(&app, &step2, StepStatus::Done).await;
        let rules: Vec<String> = app
            .store
            .audit_in_order(0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|r| r.rule)
            .filter(|r| r.starts_with("emergency."))
            .collect();
        assert_eq!(rules, vec!["emergency.stop", "emergency.lift"]);

        // Revoke from the page: the agent is refused from its next request.
        let resp = post(
            &ada,
            &app,
            &format!("/admin/agents/{}/revoke", cred.id),
            &[],
        )
        .await;
        assert_eq!(location(&resp), "/admin?done=revoked");
        let (status, _) = planner.try_request("tools/list", json!({})).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);

        // Credentials are per tenant: Ada (acme) neither creates, sees nor revokes globex's.
        let resp = post(
            &ada,
            &app,
            "/admin/agents",
            &[
                ("name", "globex-bot".to_string()),
                ("role", "planner".into()),
                ("tenant", "globex".into()),
            ],
        )
        .await;
        assert_eq!(location(&resp), "/admin?error=agent");
        let (globex, _) = app
            .store
            .create_agent(&countersign_core::store::NewAgent {
                name: "globex-planner".into(),
                role: "planner".into(),
                tenant: "globex".into(),
                created_by: "person:https://idp.example#gus".into(),
                expires_at: None,
                acts_for: None,
                origin: countersign_core::policy::TaskOrigin::User,
            })
            .await
            .unwrap();
        let page = ada
            .get(app.url("/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            !page.contains("globex-planner"),
            "another tenant's credential is not listed"
        );
        let resp = post(
            &ada,
            &app,
            &format!("/admin/agents/{}/revoke", globex.id),
            &[],
        )
        .await;
        assert_eq!(location(&resp), "/admin?error=not_found");
        assert!(
            app.store
                .get_agent(&globex.id)
                .await
                .unwrap()
                .revoked_at
                .is_none()
        );
        app
    })
    .await;
}

/// The tool settings form for `tool` against the current version, with `set` applied.
async fn settings_form(
    app: &TestApp,
    tool: &str,
    set: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    let (base, _) = listing(app).await;
    let mut form = vec![
        ("base", base.to_string()),
        ("tool", tool.to_string()),
        (
            "note",
            "holds are disputes: a person looks at each".to_string(),
        ),
    ];
    form.extend(set.iter().map(|(k, v)| (*k, (*v).to_string())));
    form
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_tool_settings_change_only_after_a_second_admin_and_refuse_everyone_else() {
    each_finance_app(|app| async move {
        use countersign::adapters::builtin::ERP;
        let (v1, _) = listing(&app).await;
        let always = settings_form(&app, "invoice.hold", &[("gate", "always")]).await;

        // Signed out: 401; an approver and a manager: 403; an admin from another origin:
        // 403. Nothing is proposed.
        let anon = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let resp = post(&anon, &app, "/admin/tools/settings", &always).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        for user in ["ana", "max"] {
            let client = app.demo_client(user).await;
            let resp = post(&client, &app, "/admin/tools/settings", &always).await;
            assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{user}");
        }
        let ada = app.demo_client("ada").await;
        let bob = app.demo_client("bob").await;
        let resp = ada
            .post(app.url("/admin/tools/settings"))
            .header("origin", "http://evil.example")
            .form(&always)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert!(app.store.list_proposals(10).await.unwrap().is_empty());

        // Malformed or impossible settings are refused: nothing stored.
        for (tool, set, code) in [
            ("invoice.hold", ("gate", "sometimes"), "invalid"),
            ("invoice.hold", ("effect", "harmless"), "invalid"),
            ("invoice.hold", ("expires", "soon"), "invalid"),
            ("invoice.hold", ("signature", "maybe"), "invalid"),
            ("invoice.hold", ("gate", "policy"), "no_change"),
            ("no.such_tool", ("gate", "always"), "not_found"),
            // note.draft has no approval settings: gating it cannot load.
            ("note.draft", ("gate", "always"), "invalid"),
        ] {
            let form = settings_form(&app, tool, &[set]).await;
            let resp = post(&ada, &app, "/admin/tools/settings", &form).await;
            assert_eq!(resp.status(), StatusCode::SEE_OTHER);
            assert_eq!(
                location(&resp),
                format!("/admin?error={code}"),
                "{tool} {set:?}"
            );
        }
        let mut no_note = always.clone();
        no_note.retain(|(k, _)| *k != "note");
        let resp = post(&ada, &app, "/admin/tools/settings", &no_note).await;
        assert_eq!(location(&resp), "/admin?error=note");
        assert!(app.store.list_proposals(10).await.unwrap().is_empty());

        // Before any change: a small hold is below the policy's gate and runs at once.
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let reply = client
            .call("invoice.hold", crate::mcp::hold(json!(50)))
            .await;
        assert_ne!(
            reply["result"]["structuredContent"]["status"], "needs_approval",
            "{reply}"
        );
        let holds = || async {
            app.store
                .demo_effects(ERP, "invoices.hold")
                .await
                .unwrap()
                .len()
        };
        assert_eq!(holds().await, 1);

        // Ada proposes gate always and a 24h approval window.
        let form = settings_form(
            &app,
            "invoice.hold",
            &[("gate", "always"), ("expires", "24h")],
        )
        .await;
        let resp = post(&ada, &app, "/admin/tools/settings", &form).await;
        assert_eq!(location(&resp), "/admin?done=proposed");
        app.clock.advance(chrono::Duration::seconds(1));
        let p = newest_proposal(&app).await;
        assert_eq!(
            p.changes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            vec![
                "~ invoice.hold gate: policy → always",
                "~ invoice.hold expires: 72h → 24h",
            ]
        );
        // Proposed is not in force: another small hold still runs ungated.
        let reply = client
            .call("invoice.hold", crate::mcp::hold(json!(51)))
            .await;
        assert_ne!(
            reply["result"]["structuredContent"]["status"], "needs_approval",
            "{reply}"
        );
        assert_eq!(holds().await, 2);

        // The proposer cannot approve it.
        assert_eq!(
            decide(&ada, &app, &p.id, "approve", "fine").await,
            "/admin?error=own"
        );
        assert_eq!(listing(&app).await.0, v1);
        let html = bob
            .get(app.url("/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            html.contains("~ invoice.hold gate: policy → always"),
            "{html}"
        );
        assert!(html.contains("data-testid=\"tool-settings\""), "{html}");

        // Bob approves: in force at once, and the same small hold now waits for a person.
        assert_eq!(
            decide(&bob, &app, &p.id, "approve", "agreed").await,
            "/admin?done=approved"
        );
        assert_eq!(listing(&app).await.0, v1 + 1);
        let reply = client
            .call("invoice.hold", crate::mcp::hold(json!(52)))
            .await;
        assert_eq!(
            reply["result"]["structuredContent"]["status"], "needs_approval",
            "{reply}"
        );
        assert_eq!(holds().await, 2);
        let html = bob
            .get(app.url("/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let row = html
            .split("data-tool=\"invoice.hold\"")
            .nth(1)
            .and_then(|rest| rest.split("</tr>").next())
            .unwrap_or_default();
        assert!(row.contains("always"), "{row}");
        assert!(row.contains("expires after 24h"), "{row}");
        let rules: Vec<String> = proposal_audit(&app)
            .await
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        assert_eq!(rules, vec!["proposed", "refused_own", "approved"]);
        app
    })
    .await;
}
