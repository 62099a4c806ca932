//! MCP sessions shared by replicas: two servers in this process on one database (each with
//! its own rmcp session manager and owner cache, as two `serve` processes have), on both
//! backends. The process-level test — two `countersign serve` behind a proxy, one killed — is
//! [`crate::replicas`].

use std::time::{Duration, Instant};

use countersign::mcp::guard::MAX_SESSIONS_PER_AGENT;
use countersign_core::Backend;
use countersign_core::store::testing::FreshDb;
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{TestApp, example, spawn_app_on};
use crate::mcp::{Client, INV, agent};

/// Two finance servers on one fresh database of `backend` (`None` without Postgres).
async fn two_replicas(backend: Backend) -> Option<(TestApp, TestApp)> {
    let registry = example("finance");
    let first = FreshDb::create(backend).await?;
    let url = first.url.expose().clone();
    let a = spawn_app_on(first, &[("COUNTERSIGN_REGISTRY", registry.as_str())]).await;
    // The second server's own fresh database is only a placeholder: the URL wins.
    let placeholder = FreshDb::create(backend).await?;
    let b = spawn_app_on(
        placeholder,
        &[
            ("COUNTERSIGN_REGISTRY", registry.as_str()),
            ("COUNTERSIGN_DATABASE_URL", url.as_str()),
        ],
    )
    .await;
    Some((a, b))
}

fn client<'a>(app: &'a TestApp, token: &str, session: Option<&str>) -> Client<'a> {
    let mut c = Client::new(app, token);
    c.use_session(session.map(str::to_string));
    c
}

async fn delete(app: &TestApp, token: &str, session: &str) -> StatusCode {
    app.client
        .delete(app.url("/mcp"))
        .bearer_auth(token)
        .header("Mcp-Session-Id", session)
        .header("MCP-Protocol-Version", crate::mcp::PROTOCOL)
        .send()
        .await
        .unwrap()
        .status()
}

/// What `app` answers `token`'s `tools/list` in `session`.
async fn list_status(app: &TestApp, token: &str, session: &str) -> StatusCode {
    client(app, token, Some(session))
        .try_request("tools/list", json!({}))
        .await
        .0
}

#[tokio::test]
async fn sessions_continue_on_another_replica_and_end_everywhere() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some((a, b)) = two_replicas(backend).await else {
            continue;
        };
        let (fin_1, token) = agent(&a, "fin-1", "worker.finance").await;
        let (_, other) = agent(&a, "fin-2", "worker.finance").await;
        let mut on_a = Client::new(&a, &token);
        on_a.connect().await;
        let session = on_a.session().unwrap();

        // Replica B has never seen the session: another agent naming it there is refused by
        // the database (not by a cache), and cannot end it.
        assert_eq!(
            list_status(&b, &other, &session).await,
            StatusCode::NOT_FOUND
        );
        assert_eq!(delete(&b, &other, &session).await, StatusCode::NOT_FOUND);
        // Its owner's request restores it there from the database.
        let mut on_b = client(&b, &token, Some(&session));
        let names = on_b.tool_names().await;
        assert!(
            names.contains(&"invoice.get".to_string()),
            "{backend:?}: {names:?}"
        );
        let read = on_b.call("invoice.get", json!({"invoice_id": INV})).await;
        assert_eq!(read["result"]["isError"], false, "{backend:?}: {read}");
        // Both replicas' calls of the session are one run.
        let read_a = on_a.call("invoice.get", json!({"invoice_id": INV})).await;
        assert_eq!(read_a["result"]["isError"], false, "{backend:?}: {read_a}");
        let runs = crate::gateway::runs_of(&a, &fin_1).await;
        assert_eq!(
            runs.len(),
            1,
            "{backend:?}: one run for one session: {runs:?}"
        );

        // Now that both replicas serve it, another agent still finds nothing on either.
        assert_eq!(
            list_status(&b, &other, &session).await,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            list_status(&a, &other, &session).await,
            StatusCode::NOT_FOUND
        );
        assert_eq!(delete(&a, &other, &session).await, StatusCode::NOT_FOUND);
        // Nor can it push an `initialize` into it by naming a session-less revision in its
        // header (rmcp takes every `initialize` into a session).
        let pushed = a
            .client
            .post(a.url("/mcp"))
            .bearer_auth(&other)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", crate::mcp::SESSION_LESS)
            .header("Mcp-Session-Id", &session)
            .json(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": crate::mcp::SESSION_LESS, "capabilities": {},
                "clientInfo": {"name": "it", "version": "0"}}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(pushed.status(), StatusCode::NOT_FOUND, "{backend:?}");
        assert_eq!(list_status(&a, &token, &session).await, StatusCode::OK);
        assert_eq!(list_status(&b, &token, &session).await, StatusCode::OK);

        // Ended on B: B refuses it at once, A once its poll has seen the end.
        assert_eq!(delete(&b, &token, &session).await, StatusCode::NO_CONTENT);
        assert_eq!(
            list_status(&b, &token, &session).await,
            StatusCode::NOT_FOUND
        );
        let began = Instant::now();
        loop {
            let status = list_status(&a, &token, &session).await;
            if status == StatusCode::NOT_FOUND {
                break;
            }
            assert_eq!(status, StatusCode::OK, "{backend:?}");
            assert!(
                began.elapsed() < countersign::mcp::sessions::ENDED_POLL * 3,
                "{backend:?}: replica A still serves a session ended on B"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Ending it again finds no session.
        assert_eq!(delete(&a, &token, &session).await, StatusCode::NOT_FOUND);
        b.stop().await;
        a.stop().await;
    }
}

/// The status alone of `token`'s `tools/list` in `session` on `app` (the body unread: a
/// request whose session ends while it is served may see its stream cut).
async fn list_status_only(app: &TestApp, token: &str, session: &str) -> StatusCode {
    let resp = app
        .client
        .post(app.url("/mcp"))
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", crate::mcp::PROTOCOL)
        .header("Mcp-Session-Id", session)
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}))
        .send()
        .await
        .unwrap();
    // The body is left unread: the next request goes out while this answer's stream may
    // still be open (more requests in flight, more chances to meet the close; reading it
    // made the race too rare to show).
    resp.status()
}

/// Requests in flight on replica A while its poll closes a session ended on B are answered
/// as served (200) or as a session that does not exist (404) — never as a server fault: the
/// session may vanish between rmcp's check and its hand-over of the message.
#[tokio::test]
async fn requests_racing_a_session_closed_here_are_not_server_faults() {
    const SESSIONS: usize = 8;
    const CLIENTS_EACH: usize = 4;
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some((a, b)) = two_replicas(backend).await else {
            continue;
        };
        let (_, token) = agent(&a, "fin-1", "worker.finance").await;
        let mut sessions = Vec::new();
        for _ in 0..SESSIONS {
            let mut on_a = Client::new(&a, &token);
            on_a.connect().await;
            sessions.push(on_a.session().unwrap());
        }
        for session in &sessions {
            assert_eq!(delete(&b, &token, session).await, StatusCode::NO_CONTENT);
        }
        // Every client sends requests back to back until A refuses its session.
        let (on_a, token) = (&a, &token);
        let hammer = sessions.iter().flat_map(|session| {
            (0..CLIENTS_EACH).map(move |_| {
                let token = token.clone();
                async move {
                    let began = Instant::now();
                    let mut seen = Vec::new();
                    loop {
                        let status = list_status_only(on_a, &token, session).await;
                        seen.push(status);
                        // The bound only ends a failing run (each client stops at its 404).
                        if status != StatusCode::OK
                            || began.elapsed() > countersign::mcp::sessions::ENDED_POLL * 10
                        {
                            return seen;
                        }
                    }
                }
            })
        });
        let by_client = futures_util::future::join_all(hammer).await;
        let seen: Vec<StatusCode> = by_client.iter().flatten().copied().collect();
        let faults: Vec<_> = seen
            .iter()
            .filter(|s| **s != StatusCode::OK && **s != StatusCode::NOT_FOUND)
            .collect();
        assert!(
            faults.is_empty(),
            "{backend:?}: {faults:?} of {}",
            seen.len()
        );
        for statuses in &by_client {
            assert_eq!(
                statuses.last(),
                Some(&StatusCode::NOT_FOUND),
                "{backend:?}: A still serves a session ended on B"
            );
        }
        b.stop().await;
        a.stop().await;
    }
}

#[tokio::test]
async fn the_session_cap_counts_every_replica() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some((a, b)) = two_replicas(backend).await else {
            continue;
        };
        let (_, token) = agent(&a, "fin-1", "worker.finance").await;
        let mut open = Vec::new();
        for i in 0..MAX_SESSIONS_PER_AGENT {
            let mut c = Client::new(if i % 2 == 0 { &a } else { &b }, &token);
            c.connect().await;
            open.push(c.session().unwrap());
        }
        for app in [&a, &b] {
            let (status, _) = Client::new(app, &token)
                .try_request("initialize", crate::mcp::initialize_params())
                .await;
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{backend:?}");
        }
        // A session opened on A and ended on B frees a slot on both.
        assert_eq!(delete(&b, &token, &open[0]).await, StatusCode::NO_CONTENT);
        let mut again = Client::new(&a, &token);
        again.connect().await;
        b.stop().await;
        a.stop().await;
    }
}

#[tokio::test]
async fn an_initialize_whose_session_cannot_be_recorded_opens_none() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let registry = example("finance");
        let Some(db) = FreshDb::create(backend).await else {
            continue;
        };
        let app = spawn_app_on(db, &[("COUNTERSIGN_REGISTRY", registry.as_str())]).await;
        let (_, token) = agent(&app, "fin-1", "worker.finance").await;
        // Counting the agent's sessions works; recording a new one fails.
        let refuse: &[&str] = match backend {
            Backend::Sqlite => &["CREATE TRIGGER refuse BEFORE INSERT ON mcp_sessions
                 BEGIN SELECT RAISE(ABORT, 'refused'); END"],
            Backend::Postgres => &[
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql
                  AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$",
                "CREATE TRIGGER refuse BEFORE INSERT ON mcp_sessions
                  FOR EACH ROW EXECUTE FUNCTION refuse()",
            ],
        };
        for sql in refuse {
            app.store.execute_sql(sql).await.unwrap();
        }
        let resp = app
            .client
            .post(app.url("/mcp"))
            .bearer_auth(&token)
            .header("Accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                          "params": crate::mcp::initialize_params()}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "{backend:?}"
        );
        assert!(
            resp.headers().get("mcp-session-id").is_none(),
            "{backend:?}"
        );
        assert_eq!(
            app.state.metrics.mcp_sessions().await,
            Some(0),
            "{backend:?}: no session left open"
        );
        app.stop().await;
    }
}

/// What an operator changes through one replica reaches the other: a registry version within
/// the registry poll, the emergency stop and a revocation at the next request (docs/deploy.md,
/// "What converges how fast across replicas").
#[tokio::test]
async fn what_operators_change_through_one_replica_reaches_the_other() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some((a, b)) = two_replicas(backend).await else {
            continue;
        };
        let (id, token) = agent(&a, "fin-1", "worker.finance").await;
        let mut on_b = Client::new(&b, &token);
        on_b.connect().await;
        let description = |list: &serde_json::Value| {
            list["result"]["tools"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["name"] == "invoice.hold")
                .map(|t| t["description"].as_str().unwrap_or_default().to_string())
                .unwrap_or_default()
        };
        let before = description(&on_b.request("tools/list", json!({})).await);
        assert!(
            before.starts_with("Hold an invoice"),
            "{backend:?}: {before}"
        );

        // A registry version put in force through A: B lists it within its poll.
        crate::helpers::use_finance_registry_with(
            &a,
            "description: Hold an invoice from payment",
            "description: Converged. Hold an invoice from payment",
        )
        .await;
        let began = Instant::now();
        loop {
            let now = description(&on_b.request("tools/list", json!({})).await);
            if now.starts_with("Converged.") {
                break;
            }
            assert!(
                began.elapsed() < countersign::REGISTRY_POLL * 3,
                "{backend:?}: B still lists {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // The emergency stop set through A's database: B refuses the next call.
        a.store
            .set_switch(countersign::stop::EMERGENCY_STOP, "test", "ops")
            .await
            .unwrap();
        let held = on_b.call("invoice.hold", crate::mcp::hold(json!(50))).await;
        assert_eq!(held["result"]["isError"], true, "{backend:?}: {held}");
        assert_eq!(
            held["result"]["structuredContent"]["rule"], "emergency.stop",
            "{backend:?}: {held}"
        );
        a.store
            .clear_switch(countersign::stop::EMERGENCY_STOP)
            .await
            .unwrap();

        // A revocation through A: B refuses the next request.
        a.store
            .revoke_agent(&id, "person:https://idp.example#admin")
            .await
            .unwrap();
        let (status, _) = on_b.try_request("tools/list", json!({})).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{backend:?}");
        b.stop().await;
        a.stop().await;
    }
}
