//! `/mcp` at the session-less revision 2026-07-28, spoken with plain reqwest: `server/discover`,
//! then requests that each stand alone (revision and client in `_meta`, no session), through
//! the same guard, listing and refusals as the handshake revisions. The official Python SDK
//! speaking it end to end is in [`crate::interop`].

use reqwest::StatusCode;
use reqwest::header::CONTENT_TYPE;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::mcp::{Client, agent, each_finance_app, fill_sessions, initialize_params};

const MODERN: &str = crate::mcp::SESSION_LESS;

/// POSTs one session-less request at `revision` with the `_meta` and headers the revision
/// asks for.
async fn post_at(
    app: &TestApp,
    token: Option<&str>,
    revision: &str,
    method: &str,
    params: Value,
) -> reqwest::Response {
    post_naming(app, token, revision, method, params, None).await
}

/// [`post_at`], naming `session` in an `Mcp-Session-Id` header (which a session-less
/// revision has no use for).
async fn post_naming(
    app: &TestApp,
    token: Option<&str>,
    revision: &str,
    method: &str,
    mut params: Value,
    session: Option<&str>,
) -> reqwest::Response {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": revision,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "it", "version": "0"},
    });
    let tool = params["name"].as_str().map(str::to_string);
    let mut req = app
        .client
        .post(app.url("/mcp"))
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", revision)
        .header("Mcp-Method", method)
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}));
    if let Some(name) = &tool {
        // The revision names a call's tool in a header too (rmcp refuses a call without it).
        req = req.header("Mcp-Name", name);
    }
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(session) = session {
        req = req.header("Mcp-Session-Id", session);
    }
    req.send().await.unwrap()
}

/// A session-less request at 2026-07-28 that must succeed: its JSON-RPC answer, which came
/// as plain JSON and opened no session.
async fn modern(app: &TestApp, token: &str, method: &str, params: Value) -> Value {
    modern_naming(app, token, method, params, None).await
}

/// [`modern`] with an `Mcp-Session-Id` header naming `session`.
async fn modern_naming(
    app: &TestApp,
    token: &str,
    method: &str,
    params: Value,
    session: Option<&str>,
) -> Value {
    let resp = post_naming(app, Some(token), MODERN, method, params, session).await;
    let status = resp.status();
    let kind = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let session = resp.headers().get("mcp-session-id").cloned();
    let body = resp.text().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{method}: {body}");
    assert!(kind.starts_with("application/json"), "{method}: {kind}");
    assert!(session.is_none(), "{method} opened a session: {session:?}");
    serde_json::from_str(&body).unwrap()
}

fn listed(reply: &Value) -> Vec<String> {
    reply["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply:#}"))
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn discover_names_every_revision_spoken_and_opens_no_session() {
    each_finance_app(|app| async move {
        let (_, token) = agent(&app, "fin-1", "worker.finance").await;
        let reply = modern(&app, &token, "server/discover", json!({})).await;
        let versions = &reply["result"]["supportedVersions"];
        assert_eq!(
            versions,
            &json!(["2025-06-18", "2025-11-25", MODERN]),
            "{reply:#}"
        );
        assert!(
            reply["result"]["capabilities"]["tools"].is_object(),
            "{reply:#}"
        );
        // Without a credential, the door is shut at this revision too.
        let resp = post_at(&app, None, MODERN, "server/discover", json!({})).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        // A revision not spoken is refused naming the ones that are.
        let resp = post_at(&app, Some(&token), "2099-01-01", "tools/list", json!({})).await;
        let body = resp.text().await.unwrap();
        assert!(body.contains("-32022"), "{body}");
        assert!(
            body.contains(r#""supported":["2025-06-18","2025-11-25","2026-07-28"]"#),
            "{body}"
        );
        app
    })
    .await;
}

#[tokio::test]
async fn a_session_less_request_sees_its_roles_tools_and_the_same_refusals() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let (_, vm) = agent(&app, "vm-1", "worker.vendor_master").await;
        let tools = listed(&modern(&app, &fin, "tools/list", json!({})).await);
        assert!(tools.contains(&"payment.schedule".to_string()), "{tools:?}");
        assert!(
            !tools.contains(&"supplier.update_iban".to_string()),
            "{tools:?}"
        );
        let tools = listed(&modern(&app, &vm, "tools/list", json!({})).await);
        assert!(
            tools.contains(&"supplier.update_iban".to_string()),
            "{tools:?}"
        );
        assert!(
            !tools.contains(&"payment.schedule".to_string()),
            "{tools:?}"
        );

        // A tool the role lacks answers exactly as one that exists nowhere.
        let call = |name: &str| json!({"name": name, "arguments": {}});
        let hidden = modern(&app, &fin, "tools/call", call("supplier.update_iban")).await;
        let absent = modern(&app, &fin, "tools/call", call("no.such.tool")).await;
        assert_eq!(hidden["error"]["code"], -32602, "{hidden:#}");
        let scrub = |v: &Value| v["error"].to_string().replace("no.such.tool", "X");
        assert_eq!(
            scrub(&hidden).replace("supplier.update_iban", "X"),
            scrub(&absent),
            "{hidden:#} vs {absent:#}"
        );

        // Invalid arguments: an error result from the pipeline, not a protocol error.
        let bad = json!({"name": "invoice.hold", "arguments": {"invoice_id": "INV-20260611",
            "amount": -5, "currency": "EUR", "reason": "no"}});
        let reply = modern(&app, &fin, "tools/call", bad).await;
        assert_eq!(reply["result"]["isError"], true, "{reply:#}");
        assert_eq!(
            reply["result"]["structuredContent"]["status"], "invalid",
            "{reply:#}"
        );
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_less_requests_do_not_meet_the_session_limit_and_ending_a_session_answers_204() {
    each_finance_app(|app| async move {
        let (_, token) = agent(&app, "fin-1", "worker.finance").await;
        let open = fill_sessions(&app, &token).await;
        // The limit is reached for sessions ...
        let initialize = initialize_params();
        let (status, _) = Client::new(&app, &token)
            .try_request("initialize", initialize.clone())
            .await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        // An `initialize` the guard cannot read as one other request meets the limit too.
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"initialize","params":{}}"#
                .to_string(),
            format!(r#"[{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{initialize}}}]"#),
        ] {
            let resp = app
                .client
                .post(app.url("/mcp"))
                .bearer_auth(&token)
                .header("Accept", "application/json, text/event-stream")
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS, "{body}");
            assert!(resp.headers().get("mcp-session-id").is_none(), "{body}");
        }
        // ... not for requests that open none.
        for _ in 0..3 {
            modern(&app, &token, "tools/list", json!({})).await;
        }
        // Ending a session answers 204, which every official SDK reads as success.
        let ended = app
            .client
            .delete(app.url("/mcp"))
            .bearer_auth(&token)
            .header("mcp-session-id", &open[0])
            .header("mcp-protocol-version", crate::mcp::PROTOCOL)
            .send()
            .await
            .unwrap();
        assert_eq!(ended.status(), StatusCode::NO_CONTENT);
        let (status, _) = Client::new(&app, &token)
            .try_request("initialize", initialize)
            .await;
        assert_eq!(status, StatusCode::OK);
        app
    })
    .await;
}

#[tokio::test]
async fn a_session_header_on_a_session_less_call_does_not_choose_its_run() {
    each_finance_app(|app| async move {
        let (agent_id, token) = agent(&app, "fin-1", "worker.finance").await;
        let read = json!({"name": "invoice.get", "arguments": {"invoice_id": crate::mcp::INV}});
        for session in [None, Some("made-up-1"), Some("made-up-2")] {
            let reply = modern_naming(&app, &token, "tools/call", read.clone(), session).await;
            assert_eq!(reply["result"]["isError"], false, "{session:?}: {reply:#}");
        }
        let runs = crate::gateway::runs_of(&app, &agent_id).await;
        assert_eq!(
            runs.len(),
            1,
            "one session-less run per credential: {runs:?}"
        );
        app
    })
    .await;
}
