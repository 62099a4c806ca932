//! `/mcp` over the wire: JSON-RPC over MCP streamable HTTP, spoken with plain reqwest
//! against the finance example on both backends.

use countersign_core::store::NewAgent;
use countersign_core::{Backend, Clock};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, WWW_AUTHENTICATE};
use serde_json::{Value, json};

use crate::helpers::{TestApp, example, spawn_app_with};

pub const PROTOCOL: &str = "2025-06-18";
/// The session-less revision (no `initialize`, no session).
pub const SESSION_LESS: &str = "2026-07-28";
pub const INV: &str = "INV-20260611";
pub const REASON: &str = "Invoice approved by AP, due in four days";

/// Runs `test` against a fresh finance server on SQLite, then on Postgres.
pub async fn each_finance_app<F, Fut>(test: F)
where
    F: Fn(TestApp) -> Fut,
    Fut: std::future::Future<Output = TestApp>,
{
    each_finance_app_with(&[], test).await;
}

/// [`each_finance_app`] with extra `COUNTERSIGN_*` settings.
pub async fn each_finance_app_with<F, Fut>(extra: &[(&str, &str)], test: F)
where
    F: Fn(TestApp) -> Fut,
    Fut: std::future::Future<Output = TestApp>,
{
    let registry = example("finance");
    let mut env = vec![("COUNTERSIGN_REGISTRY", registry.as_str())];
    env.extend_from_slice(extra);
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(app) = spawn_app_with(backend, &env).await else {
            continue;
        };
        let app = test(app).await;
        app.stop().await;
    }
}

/// Creates an agent credential in `role` and returns (credential id, token).
pub async fn agent(app: &TestApp, name: &str, role: &str) -> (String, String) {
    agent_on(&app.store, name, role).await
}

/// [`agent`] on `store` (of a server in another process).
pub async fn agent_on(store: &countersign_core::Store, name: &str, role: &str) -> (String, String) {
    let (cred, token) = store
        .create_agent(&NewAgent {
            name: name.into(),
            role: role.into(),
            tenant: "acme".into(),
            // An admin who approves nothing in these tests (four eyes needs a person).
            created_by: "person:https://idp.example#admin".into(),
            expires_at: None,
            acts_for: None,
            origin: countersign_core::policy::TaskOrigin::User,
        })
        .await
        .unwrap();
    (cred.id, token.reveal().to_string())
}

/// Opens as many sessions as one credential may hold (`token`'s); returns their ids.
pub async fn fill_sessions(app: &TestApp, token: &str) -> Vec<String> {
    let mut open = Vec::new();
    for _ in 0..countersign::mcp::guard::MAX_SESSIONS_PER_AGENT {
        let mut c = Client::new(app, token);
        c.connect().await;
        open.push(c.session().unwrap());
    }
    open
}

/// The params of an `initialize` at [`PROTOCOL`].
pub fn initialize_params() -> Value {
    json!({"protocolVersion": PROTOCOL, "capabilities": {},
           "clientInfo": {"name": "it", "version": "0"}})
}

/// A minimal MCP client over streamable HTTP.
pub struct Client<'a> {
    http: reqwest::Client,
    url: String,
    app: std::marker::PhantomData<&'a TestApp>,
    protocol: &'static str,
    token: String,
    session: Option<String>,
    next_id: u64,
}

impl<'a> Client<'a> {
    pub fn new(app: &'a TestApp, token: &str) -> Self {
        Self::at(app.client.clone(), &app.url("/mcp"), token)
    }

    /// A client of the `/mcp` endpoint at `url` (another process's, a proxy's).
    pub fn at(http: reqwest::Client, url: &str, token: &str) -> Self {
        Self {
            http,
            url: url.to_string(),
            app: std::marker::PhantomData,
            protocol: PROTOCOL,
            token: token.to_string(),
            session: None,
            next_id: 1,
        }
    }

    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("Accept", "application/json, text/event-stream")
            .json(body);
        if let Some(session) = &self.session {
            req = req
                .header("Mcp-Session-Id", session)
                .header("MCP-Protocol-Version", self.protocol);
        }
        req
    }

    /// Sends a request; returns the HTTP status and, on 200, the JSON-RPC response.
    pub async fn try_request(
        &mut self,
        method: &str,
        params: Value,
    ) -> (StatusCode, Option<Value>) {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let resp = self.post(&body).send().await.unwrap();
        let status = resp.status();
        if status != StatusCode::OK {
            return (status, None);
        }
        if let Some(session) = resp.headers().get("mcp-session-id") {
            self.session = Some(session.to_str().unwrap().to_string());
        }
        (status, Some(read_response(resp, id).await))
    }

    /// Sends a request; `Err` (never a panic) when no JSON-RPC answer comes back: the
    /// connection failed, the status was not 200, or the stream ended first.
    pub async fn send(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let resp = self.post(&body).send().await.map_err(|e| e.to_string())?;
        if resp.status() != StatusCode::OK {
            return Err(format!("status {}", resp.status()));
        }
        try_read_response(resp, id).await
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let (status, body) = self.try_request(method, params).await;
        assert_eq!(status, StatusCode::OK, "{method}");
        body.unwrap()
    }

    /// initialize + notifications/initialized.
    pub async fn connect(&mut self) {
        let init = self
            .request(
                "initialize",
                json!({
                    "protocolVersion": self.protocol,
                    "capabilities": {},
                    "clientInfo": {"name": "it", "version": "0"},
                }),
            )
            .await;
        assert_eq!(init["result"]["protocolVersion"], self.protocol, "{init}");
        assert!(
            init["result"]["capabilities"]["tools"].is_object(),
            "{init}"
        );
        assert!(self.session.is_some(), "a session id is issued");
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let resp = self.post(&note).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
    }

    pub async fn tool_names(&mut self) -> Vec<String> {
        let list = self.request("tools/list", json!({})).await;
        list["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{list}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    }

    /// The MCP session id, once connected.
    pub fn session(&self) -> Option<String> {
        self.session.clone()
    }

    /// Presents `session` as this client's MCP session id from now on.
    pub fn use_session(&mut self, session: Option<String>) {
        self.session = session;
    }

    /// `tools/call` with `_meta`.
    pub async fn call_meta(&mut self, name: &str, arguments: Value, meta: Value) -> Value {
        self.request(
            "tools/call",
            json!({"name": name, "arguments": arguments, "_meta": meta}),
        )
        .await
    }

    pub async fn call(&mut self, name: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": arguments}))
            .await
    }
}

/// The JSON-RPC response with `id`, from a JSON body or an SSE stream (read until it comes).
pub async fn read_response(resp: reqwest::Response, id: u64) -> Value {
    try_read_response(resp, id).await.unwrap()
}

/// [`read_response`], `Err` when the body breaks off or the stream ends before the answer.
pub async fn try_read_response(mut resp: reqwest::Response, id: u64) -> Result<Value, String> {
    let sse = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !sse {
        return resp.json().await.map_err(|e| e.to_string());
    }
    let mut buf = String::new();
    loop {
        let chunk = resp
            .chunk()
            .await
            .map_err(|e| format!("stream broke before response {id}: {e}"))?
            .ok_or_else(|| format!("stream ended before response {id}: {buf}"))?;
        buf.push_str(&String::from_utf8_lossy(&chunk));
        for line in buf.lines() {
            if let Some(data) = line.strip_prefix("data:")
                && let Ok(msg) = serde_json::from_str::<Value>(data.trim())
                && msg["id"] == json!(id)
            {
                return Ok(msg);
            }
        }
    }
}

pub fn payment(amount: Value) -> Value {
    json!({"invoice_id": INV, "amount": amount, "currency": "EUR", "value_date": "2026-06-15", "reason": REASON})
}

pub fn payment_for(invoice: &str, amount: Value) -> Value {
    json!({"invoice_id": invoice, "amount": amount, "currency": "EUR", "value_date": "2026-06-15", "reason": REASON})
}

pub fn hold(amount: Value) -> Value {
    json!({"invoice_id": INV, "amount": amount, "currency": "EUR", "reason": REASON})
}

fn initialize_body() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "it", "version": "0"}}})
}

async fn assert_unauthorized(resp: reqwest::Response) {
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        resp.headers().get(WWW_AUTHENTICATE).unwrap(),
        r#"Bearer realm="countersign""#
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body, json!({"error": "unauthorized"}));
}

#[tokio::test]
async fn mcp_refuses_missing_malformed_and_unknown_tokens() {
    each_finance_app(|app| async move {
        let url = app.url("/mcp");
        let accept = "application/json, text/event-stream";
        let unknown = format!("cs_agent_{}", "0".repeat(64));
        for auth in [
            None,
            Some("Bearer"),
            Some("Basic abc"),
            Some("Bearer nope"),
            Some(&*format!("Bearer {unknown}")),
        ] {
            let mut req = app
                .client
                .post(&url)
                .header("Accept", accept)
                .json(&initialize_body());
            if let Some(auth) = auth {
                req = req.header("Authorization", auth);
            }
            assert_unauthorized(req.send().await.unwrap()).await;
        }
        app
    })
    .await;
}

#[tokio::test]
async fn mcp_refuses_a_token_revoked_mid_session() {
    each_finance_app(|app| async move {
        let (id, token) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &token);
        client.connect().await;
        assert!(!client.tool_names().await.is_empty());
        app.store.revoke_agent(&id, "test").await.unwrap();
        let resp = client
            .post(&json!({"jsonrpc": "2.0", "id": 99, "method": "tools/list", "params": {}}))
            .send()
            .await
            .unwrap();
        assert_unauthorized(resp).await;
        app
    })
    .await;
}

#[tokio::test]
async fn mcp_lists_only_the_roles_tools_with_registry_annotations() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let list = client.request("tools/list", json!({})).await;
        let tools = list["result"]["tools"].as_array().unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert!(!names.contains(&"supplier.update_iban"), "{names:?}");
        assert!(names.contains(&"payment.schedule"), "{names:?}");
        assert!(!names.contains(&"plan.submit"), "{names:?}");
        let pay = tools.iter().find(|t| t["name"] == "payment.schedule").unwrap();
        assert_eq!(pay["title"], "Schedule a supplier payment");
        assert!(pay["description"].as_str().unwrap().starts_with("Schedule a supplier payment"));
        assert_eq!(pay["inputSchema"]["additionalProperties"], false);
        // The tool's own result, or one of the gateway's status answers.
        assert_eq!(pay["outputSchema"]["type"], "object");
        assert_eq!(pay["outputSchema"]["anyOf"][0]["required"], json!(["ref", "status"]));
        assert_eq!(pay["outputSchema"]["anyOf"][1]["required"], json!(["status"]));
        assert_eq!(
            pay["annotations"],
            json!({"readOnlyHint": false, "destructiveHint": true, "idempotentHint": true, "openWorldHint": false})
        );
        let get = tools.iter().find(|t| t["name"] == "invoice.get").unwrap();
        assert_eq!(get["annotations"]["readOnlyHint"], true);

        assert!(list["result"].get("nextCursor").is_none(), "one page: {list}");
        // A cursor continues after the named tool.
        let after = client.request("tools/list", json!({"cursor": "invoice.hold"})).await;
        let rest: Vec<&str> = after["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        let expected: Vec<&str> = names.iter().copied().filter(|n| *n > "invoice.hold").collect();
        assert_eq!(rest, expected);

        let (_, vm) = agent(&app, "vm-1", "worker.vendor_master").await;
        let mut vendor = Client::new(&app, &vm);
        vendor.connect().await;
        let names = vendor.tool_names().await;
        assert!(names.contains(&"supplier.update_iban".to_string()), "{names:?}");
        assert!(!names.contains(&"payment.schedule".to_string()), "{names:?}");
        app
    })
    .await;
}

#[tokio::test]
async fn mcp_unlisted_tool_answers_exactly_like_a_nonexistent_one() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let args = json!({"supplier_id": "SUP-000042", "iban": "DE89370400440532013000", "reason": REASON});
        let mut unlisted = client.call("supplier.update_iban", args.clone()).await;
        let mut missing = client.call("no.such.tool", args).await;
        assert!(unlisted.get("result").is_none(), "{unlisted}");
        assert!(unlisted["error"].is_object(), "{unlisted}");
        // Same bytes but for the JSON-RPC id.
        unlisted.as_object_mut().unwrap().remove("id");
        missing.as_object_mut().unwrap().remove("id");
        assert_eq!(unlisted.to_string(), missing.to_string());
        assert!(!unlisted.to_string().contains("update_iban"));
        app
    })
    .await;
}

#[tokio::test]
async fn mcp_invalid_arguments_are_an_error_result_listing_paths() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let mut args = payment(json!(50000.01));
        args["note"] = json!("pay it now");
        let reply = client.call("payment.schedule", args).await;
        let result = &reply["result"];
        assert_eq!(result["isError"], true, "{reply}");
        let content = &result["structuredContent"];
        assert_eq!(content["status"], "invalid", "{reply}");
        assert_eq!(content["rule"], "input.schema", "{reply}");
        let errors = content["errors"].as_array().unwrap();
        assert!(
            errors
                .iter()
                .all(|e| e["path"].is_string() && e["message"].is_string()),
            "{reply}"
        );
        assert!(errors.iter().any(|e| e["path"] == "/amount"), "{reply}");
        assert!(
            errors.iter().any(|e| e.to_string().contains("note")),
            "{reply}"
        );
        app
    })
    .await;
}

#[tokio::test]
async fn mcp_calls_answer_with_the_policy_decision() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;

        // A small hold runs unattended, and the demo ERP answers.
        let reply = client.call("invoice.hold", hold(json!(500))).await;
        let result = &reply["result"];
        assert_eq!(result["isError"], false, "{reply}");
        assert_eq!(
            result["structuredContent"],
            json!({"invoice_id": INV, "status": "on_hold"})
        );
        // The same inputs spelled differently are the same step: stored outcome, no second hold.
        let reply = client.call("invoice.hold", hold(json!(500.0))).await;
        assert_eq!(reply["result"]["structuredContent"]["status"], "on_hold", "{reply}");
        assert_eq!(app.store.demo_effects("erp", "invoices.hold").await.unwrap().len(), 1);

        // Above the threshold a person countersigns: a structured, non-error result.
        let reply = client.call("invoice.hold", hold(json!(2000))).await;
        assert_eq!(reply["result"]["isError"], false, "{reply}");
        let waiting = &reply["result"]["structuredContent"];
        assert_eq!(waiting["status"], "needs_approval", "{reply}");
        assert_eq!(waiting["rule"], "amount.threshold", "{reply}");
        assert!(waiting["step_id"].is_string() && waiting["expires_at"].is_string(), "{reply}");

        // Above the role's ceiling: denied, naming the rule.
        let reply = client.call("payment.schedule", payment_for("INV-20260613", json!(30000))).await;
        assert_eq!(reply["result"]["isError"], true, "{reply}");
        assert_eq!(reply["result"]["structuredContent"]["status"], "denied", "{reply}");
        assert_eq!(reply["result"]["structuredContent"]["rule"], "amount.ceiling", "{reply}");

        // An irreversible tool always waits for a person.
        let (_, vm) = agent(&app, "vm-1", "worker.vendor_master").await;
        let mut vendor = Client::new(&app, &vm);
        vendor.connect().await;
        let args = json!({"supplier_id": "SUP-000417", "iban": "DE89370400440532013000", "reason": REASON});
        let reply = vendor.call("supplier.update_iban", args).await;
        assert_eq!(reply["result"]["isError"], false, "{reply}");
        assert_eq!(reply["result"]["structuredContent"]["status"], "needs_approval", "{reply}");
        assert_eq!(reply["result"]["structuredContent"]["rule"], "irreversible.always", "{reply}");
        assert!(app.store.demo_effects("erp", "invoices.hold").await.unwrap().len() == 1);
        assert!(app.store.demo_effects("erp", "suppliers.update_iban").await.unwrap().is_empty());
        app
    })
    .await;
}

/// A payment for an invoice that does not exist has no Invoice resource: the finance policy
/// refuses it before the gate.
#[tokio::test]
async fn mcp_payment_for_a_missing_invoice_is_denied() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let reply = client
            .call(
                "payment.schedule",
                payment_for("INV-20999999", json!(4180.00)),
            )
            .await;
        assert_eq!(reply["result"]["isError"], true, "{reply}");
        assert_eq!(
            reply["result"]["structuredContent"]["rule"], "payment.no_invoice",
            "{reply}"
        );
        assert!(
            app.store
                .demo_effects("erp", "payments.schedule")
                .await
                .unwrap()
                .is_empty()
        );
        app
    })
    .await;
}

#[tokio::test]
async fn mcp_refuses_a_forbidden_origin() {
    let allowed = [(
        "COUNTERSIGN_ALLOWED_ORIGINS",
        "https://agents.example, http://localhost:8080",
    )];
    each_finance_app_with(&allowed, |app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let with_origin = |origin: &str| {
            app.client
                .post(app.url("/mcp"))
                .bearer_auth(&fin)
                .header("Accept", "application/json, text/event-stream")
                .header("Origin", origin)
                .json(&initialize_body())
        };
        for bad in [
            "https://evil.example",
            "http://agents.example",
            "null",
            "http://localhost:8081",
        ] {
            let resp = with_origin(bad).send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{bad}");
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body, json!({"error": "forbidden"}));
        }
        // A forbidden origin is refused before the token is even looked at.
        let resp = app
            .client
            .post(app.url("/mcp"))
            .header("Origin", "https://evil.example")
            .json(&initialize_body())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        for good in [
            "https://agents.example",
            "https://agents.example:443",
            "http://localhost:8080",
        ] {
            let resp = with_origin(good).send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "{good}");
        }
        app
    })
    .await;
}

#[tokio::test]
async fn mcp_speaks_both_session_revisions_and_answers_ping() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        for protocol in ["2025-06-18", "2025-11-25"] {
            let mut client = Client::new(&app, &fin);
            client.protocol = protocol;
            client.connect().await;
            let pong = client.request("ping", json!({})).await;
            assert_eq!(pong["result"], json!({}), "{protocol}: {pong}");
            assert!(
                client
                    .tool_names()
                    .await
                    .contains(&"invoice.get".to_string())
            );
        }
        app
    })
    .await;
}

#[tokio::test]
async fn mcp_refuses_a_token_that_expires_mid_session() {
    each_finance_app(|app| async move {
        let now = app.clock.now_ms();
        let (_, token) = app
            .store
            .create_agent(&NewAgent {
                name: "fin-short".into(),
                role: "worker.finance".into(),
                tenant: "acme".into(),
                created_by: "test".into(),
                expires_at: Some(now + 60_000),
                acts_for: None,
                origin: countersign_core::policy::TaskOrigin::User,
            })
            .await
            .unwrap();
        let mut client = Client::new(&app, token.reveal());
        client.connect().await;
        assert!(!client.tool_names().await.is_empty());
        app.clock.advance(chrono::Duration::minutes(2));
        let (status, _) = client.try_request("tools/list", json!({})).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        app
    })
    .await;
}

#[tokio::test]
async fn mcp_refuses_a_host_it_is_not_served_at() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let resp = app
            .client
            .post(app.url("/mcp"))
            .bearer_auth(&fin)
            .header("Host", "rebound.example")
            .header("Accept", "application/json, text/event-stream")
            .json(&initialize_body())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        app
    })
    .await;
}

/// The real binary at `trace` level: neither a valid nor a refused token reaches the log.
#[tokio::test]
async fn mcp_tokens_never_reach_the_log() {
    use std::process::{Command, Stdio};

    let dir = std::env::temp_dir().join(format!("cs-mcp-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = format!("sqlite://{}/cs.db", dir.display());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let binary = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_countersign"));
        for (k, _) in std::env::vars() {
            if k.starts_with("COUNTERSIGN_") {
                cmd.env_remove(k);
            }
        }
        cmd.current_dir(&dir)
            .env("COUNTERSIGN_DATABASE_URL", &db)
            .env("COUNTERSIGN_REGISTRY", example("finance"))
            .env("COUNTERSIGN_LISTEN", format!("127.0.0.1:{port}"))
            // A webhook whose URL is its secret, on a port nobody listens on.
            .env(
                "COUNTERSIGN_WEBHOOK_URLS",
                "http://hook:pw123@127.0.0.1:1/services/T0/B0/HOOKSECRET",
            )
            .env("COUNTERSIGN_LOG_LEVEL", "trace");
        cmd
    };
    let log_path = dir.join("serve.log");
    let mut server = binary()
        .arg("serve")
        .stdout(Stdio::null())
        // A file, not a pipe: a full pipe would stall the server mid-test.
        .stderr(Stdio::from(std::fs::File::create(&log_path).unwrap()))
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let mut up = false;
    for _ in 0..100 {
        if client.get(format!("{base}/healthz")).send().await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(up, "server did not start");
    let out = binary()
        .args([
            "agent-token",
            "create",
            "--name",
            "bot",
            "--role",
            "worker.finance",
            "--tenant",
            "acme",
        ])
        .env("COUNTERSIGN_LOG_LEVEL", "off")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    let token = printed
        .split_whitespace()
        .find(|w| w.starts_with("cs_agent_"))
        .unwrap_or_else(|| panic!("no token in {printed}"))
        .to_string();
    let bad = format!("cs_agent_{}", "f".repeat(64));

    let post = |token: &str, body: Value, session: Option<&str>| {
        let mut req = client
            .post(format!("{base}/mcp"))
            .bearer_auth(token)
            .header("Accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(s) = session {
            req = req
                .header("Mcp-Session-Id", s)
                .header("MCP-Protocol-Version", PROTOCOL);
        }
        req.send()
    };
    let resp = post(&token, initialize_body(), None).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let session = resp.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    read_response(resp, 1).await;
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(&token, note, Some(&session)).await.unwrap();
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "invoice.hold", "arguments": hold(json!(500))}});
    let resp = post(&token, call, Some(&session)).await.unwrap();
    let reply = read_response(resp, 2).await;
    assert_eq!(
        reply["result"]["structuredContent"]["status"], "on_hold",
        "{reply}"
    );
    // A hold above the policy's threshold opens a gate: the webhook is told, and fails.
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "invoice.hold", "arguments": hold(json!(1500))}});
    let resp = post(&token, call, Some(&session)).await.unwrap();
    let reply = read_response(resp, 3).await;
    assert_eq!(
        reply["result"]["structuredContent"]["status"], "needs_approval",
        "{reply}"
    );
    let resp = post(&bad, initialize_body(), None).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let began = std::time::Instant::now();
    while !std::fs::read_to_string(&log_path)
        .unwrap()
        .contains("notify: webhook unreachable")
    {
        assert!(
            began.elapsed() < std::time::Duration::from_secs(10),
            "no webhook attempt"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    server.kill().unwrap();
    server.wait().unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("mcp: agent credential refused"),
        "the log was captured: {log}"
    );
    assert!(!log.contains(&token), "valid token logged");
    assert!(
        !log.contains("HOOKSECRET"),
        "the webhook's secret path logged"
    );
    assert!(!log.contains("pw123"), "the webhook's password logged");
    assert!(!log.contains(&bad), "refused token logged");
    assert!(
        !log.contains(&token["cs_agent_".len()..]),
        "token digits logged"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn mcp_every_call_outcome_is_audited_and_the_chain_verifies() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let iban = "ES9121000418450200051332";
        client
            .call(
                "supplier.update_iban",
                json!({"supplier_id": "SUP-000042", "iban": iban, "reason": REASON}),
            )
            .await;
        let mut bad = payment(json!(50000.01));
        bad["note"] = json!("pay it now");
        client.call("payment.schedule", bad).await;
        client.call("invoice.hold", hold(json!(2500.00))).await;

        let records = app.store.audit_in_order(0, 100).await.unwrap();
        let summary: Vec<(String, Option<String>, Option<String>)> = records
            .iter()
            .map(|r| (r.event.clone(), r.tool.clone(), r.rule.clone()))
            .collect();
        assert_eq!(
            summary,
            vec![
                // The credential's creation comes first.
                ("operational".into(), None, Some("agent.created".into())),
                ("refused".into(), None, Some("role.tool_not_listed".into())),
                (
                    "refused".into(),
                    Some("payment.schedule".into()),
                    Some("input.schema".into())
                ),
                (
                    "decided".into(),
                    Some("invoice.hold".into()),
                    Some("amount.threshold".into())
                ),
                (
                    "waiting_approval".into(),
                    Some("invoice.hold".into()),
                    Some("amount.threshold".into())
                ),
            ],
            "{records:#?}"
        );
        assert!(
            records[1].record.contains("supplier.update_iban"),
            "the refusal names what was asked for"
        );
        assert!(
            records[1]
                .actor
                .as_deref()
                .unwrap()
                .contains("role:worker.finance")
        );
        assert!(records[3].record.contains("require_approval"));
        for r in &records {
            assert!(!r.record.contains(iban), "inputs are not written in clear");
            assert!(
                !r.record.contains(&fin),
                "the token never reaches the audit"
            );
        }
        assert_eq!(app.store.verify_audit().await.unwrap(), Ok(5));
        app
    })
    .await;
}
