//! Two `countersign serve` processes on one Postgres database behind a round-robin proxy, as
//! docs/deploy.md describes: no sticky sessions, workers in both replicas. MCP clients of
//! both eras (the official Python SDK, and scripted agents speaking the protocol) send every
//! request to the next replica; one replica is killed (SIGKILL) mid-traffic; every session
//! and call continues on the other; a payment gated through one replica and approved through
//! the other runs once; the targets show no effect lost or duplicated and the audit chain
//! verifies. `make reliability` runs it larger for its replica-kill row.
//!
//! The proxy forwards each request to the next replica in turn and, when a replica cannot be
//! reached or drops the connection before answering, to the other one (nginx's
//! `proxy_next_upstream error`, retrying non-idempotent requests too): an MCP call is safe to
//! send twice, since a write's identity in its run is (run, tool, inputs). A call whose
//! answer broke off mid-stream is sent again by the agent, in the same session.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use countersign_core::store::testing::FreshDb;
use countersign_core::{Backend, StepStatus, Store, SystemClock};
use reqwest::StatusCode;
use serde_json::{Value, json};

use countersign::adapters::builtin::{ERP, Latency, set_latency};

use crate::helpers::{countersign_on, example};
use crate::interop::{self, Sdk};
use crate::mcp::{Client, REASON, SESSION_LESS, try_read_response};
use crate::reliability::{Child, Tally, free_port, tally};

/// Headers a proxy does not pass on (hop by hop, or set again for the next hop).
const HOP: &[&str] = &[
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
];

/// The round-robin proxy in front of the replicas.
struct Proxy {
    backends: Vec<String>,
    next: AtomicUsize,
    /// Requests each replica answered.
    served: Vec<AtomicU64>,
    /// Requests sent on to the other replica because one could not answer.
    failovers: AtomicU64,
    http: reqwest::Client,
}

async fn start_proxy(listener: tokio::net::TcpListener, backends: Vec<String>) -> Arc<Proxy> {
    let proxy = Arc::new(Proxy {
        served: backends.iter().map(|_| AtomicU64::new(0)).collect(),
        backends,
        next: AtomicUsize::new(0),
        failovers: AtomicU64::new(0),
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
    });
    let app = axum::Router::new()
        .fallback(forward)
        .with_state(proxy.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    proxy
}

async fn forward(State(p): State<Arc<Proxy>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 64 << 20).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let first = p.next.fetch_add(1, Ordering::SeqCst);
    for k in 0..p.backends.len() {
        let i = (first + k) % p.backends.len();
        let mut out = p
            .http
            .request(parts.method.clone(), format!("{}{path}", p.backends[i]))
            .body(body.clone());
        for (name, value) in &parts.headers {
            if !HOP.contains(&name.as_str()) {
                out = out.header(name, value);
            }
        }
        match out.send().await {
            Ok(resp) => {
                p.served[i].fetch_add(1, Ordering::SeqCst);
                return relay(resp);
            }
            Err(_) => {
                p.failovers.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    StatusCode::BAD_GATEWAY.into_response()
}

/// A replica's answer passed on as it streams (an SSE answer is not buffered).
fn relay(resp: reqwest::Response) -> Response {
    let mut out = Response::builder().status(resp.status());
    for (name, value) in resp.headers() {
        if !HOP.contains(&name.as_str()) {
            out = out.header(name, value);
        }
    }
    let body = futures_util::stream::unfold(Some(resp), |resp| async move {
        let mut resp = resp?;
        match resp.chunk().await {
            Ok(Some(chunk)) => Some((Ok::<_, std::io::Error>(chunk), Some(resp))),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(e)), None)),
        }
    });
    out.body(axum::body::Body::from_stream(body)).unwrap()
}

/// A `countersign serve` replica (one executor worker) on `db`, reached at `public` (the
/// proxy), logging warnings to a file in the temp dir.
fn spawn_replica(db: &str, port: u16, public: &str) -> (Child, PathBuf) {
    let log = std::env::temp_dir().join(format!("countersign-replica-{port}.log"));
    let err = std::fs::File::create(&log).unwrap();
    let child = countersign_on(db)
        .env("COUNTERSIGN_LISTEN", format!("127.0.0.1:{port}"))
        .env("COUNTERSIGN_PUBLIC_URL", public)
        .env("COUNTERSIGN_REGISTRY", example("finance"))
        .env("COUNTERSIGN_WORKERS", "1")
        .env("COUNTERSIGN_DEMO_SIGN_IN", "true")
        .env("COUNTERSIGN_LOG_LEVEL", "warn")
        .arg("serve")
        .stdout(std::process::Stdio::null())
        .stderr(err)
        .spawn()
        .unwrap();
    (Child(child), log)
}

async fn wait_up(http: &reqwest::Client, base: &str, log: &std::path::Path) {
    let began = Instant::now();
    loop {
        if let Ok(r) = http.get(format!("{base}/healthz")).send().await
            && r.status().is_success()
        {
            return;
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "{base} never came up; see {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn agent(store: &Store, name: &str) -> String {
    agent_in(store, name, "worker.finance").await
}

async fn agent_in(store: &Store, name: &str, role: &str) -> String {
    crate::mcp::agent_on(store, name, role).await.1
}

/// Seeds `n` approved invoices named `prefix` + a number (copies of the demo's INV-20260611).
async fn seed_invoices(store: &Store, prefix: &str, n: usize) -> Vec<String> {
    let template = store
        .demo_get("erp", "invoice", "INV-20260611")
        .await
        .unwrap()
        .unwrap();
    let mut inv: Value = serde_json::from_str(&template.data).unwrap();
    let mut ids = Vec::new();
    for i in 0..n {
        let id = format!("{prefix}{i:07}");
        inv["invoice_id"] = json!(id);
        store
            .demo_seed("erp", "invoice", &id, "acme", &inv.to_string())
            .await
            .unwrap();
        ids.push(id);
    }
    ids
}

fn hold_for(invoice: &str) -> Value {
    json!({"invoice_id": invoice, "amount": 500, "currency": "EUR", "reason": REASON})
}

fn payment_for(invoice: &str) -> Value {
    json!({"invoice_id": invoice, "amount": 1860.50, "currency": "EUR",
           "value_date": "2026-06-15", "reason": REASON})
}

/// One session-less (2026-07-28) `tools/call` of `tool`; `Err` when no answer came back.
async fn call_session_less(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    id: u64,
    tool: &str,
    arguments: Value,
) -> Result<Value, String> {
    let params = json!({"name": tool, "arguments": arguments, "_meta": {
        "io.modelcontextprotocol/protocolVersion": SESSION_LESS,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "replica-it", "version": "0"},
    }});
    let resp = http
        .post(url)
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", SESSION_LESS)
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", tool)
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if resp.status() != StatusCode::OK {
        return Err(format!("status {}", resp.status()));
    }
    try_read_response(resp, id).await
}

/// What one scripted agent saw.
#[derive(Debug, Default)]
struct Driven {
    calls: usize,
    /// Calls sent again because the first try got no answer.
    resent: usize,
    /// Calls sent after the kill, so answered by B (in the same session, for a session
    /// agent).
    after_kill: usize,
    /// Answers that were protocol errors or error results.
    errors: Vec<String>,
}

/// Holds each of `invoices` in turn, in one MCP session (`session: true`) or session-less,
/// sending a call again (same session, same arguments) until it is answered.
async fn drive(
    mcp: String,
    token: String,
    invoices: Vec<String>,
    session: bool,
    killed: Arc<std::sync::atomic::AtomicBool>,
) -> Driven {
    let http = reqwest::Client::new();
    let mut client = Client::at(http.clone(), &mcp, &token);
    if session {
        client.connect().await;
    }
    let mut d = Driven::default();
    for (n, invoice) in invoices.iter().enumerate() {
        let began = Instant::now();
        // Sent when A was already dead: B answered it.
        let after_kill = killed.load(Ordering::SeqCst);
        let answer = loop {
            let tried = if session {
                client
                    .send(
                        "tools/call",
                        json!({"name": "invoice.hold", "arguments": hold_for(invoice)}),
                    )
                    .await
            } else {
                let id = u64::try_from(n).unwrap() + 1;
                call_session_less(&http, &mcp, &token, id, "invoice.hold", hold_for(invoice)).await
            };
            match tried {
                // The first try's step is still running (on the replica that died, until the
                // reconciler settles it): ask again, as an agent waiting for its call does.
                Ok(answer) if unsettled(&answer) => {
                    assert!(
                        began.elapsed() < Duration::from_secs(60),
                        "{invoice}: unsettled for a minute: {answer}"
                    );
                    d.resent += 1;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Ok(answer) => break answer,
                Err(e) => {
                    assert!(
                        began.elapsed() < Duration::from_secs(60),
                        "{invoice}: no answer for a minute: {e}"
                    );
                    d.resent += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        d.calls += 1;
        if after_kill {
            d.after_kill += 1;
        }
        if answer.get("error").is_some() || answer["result"]["isError"] == json!(true) {
            d.errors.push(format!("{invoice}: {answer}"));
        }
    }
    d
}

/// Whether a call's answer says its step has not settled yet (`in_flight`, `unknown`).
fn unsettled(answer: &Value) -> bool {
    let status = &answer["result"]["structuredContent"]["status"];
    status == "in_flight" || status == "unknown"
}

/// Signs `person` in on `base` (the demo sign-in) and decides `step`.
async fn approve_on(base: &str, origin: &str, step: &str) {
    let http = reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let signed = http
        .post(format!("{base}/auth/demo"))
        .header("origin", origin)
        .form(&[("user", "ana")])
        .send()
        .await
        .unwrap();
    assert_eq!(
        signed.status(),
        StatusCode::SEE_OTHER,
        "demo sign-in on {base}"
    );
    // payment.schedule requires a passkey signature: register one through this replica's
    // API, as a browser would, then sign the gate's challenge.
    use countersign_core::signing::webauthn::soft::SoftPasskey;
    use countersign_core::signing::webauthn::{RelyingParty, b64, unb64};
    let rp = RelyingParty::from_public_url(&url::Url::parse(origin).unwrap()).unwrap();
    let mut key = SoftPasskey::random().unwrap();
    let post = |path: String, body: Value| {
        http.post(format!("{base}{path}"))
            .header("origin", origin)
            .json(&body)
            .send()
    };
    let options: Value = post("/api/passkeys/options".into(), json!({}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let nonce = options["nonce"].as_str().unwrap().to_string();
    let (cd, att) = key.register(&rp, &unb64(&nonce, "nonce").unwrap());
    let registered = post(
        "/api/passkeys".into(),
        json!({"label": "replica test", "nonce": nonce,
               "client_data_json": b64(&cd), "attestation_object": b64(&att)}),
    )
    .await
    .unwrap();
    assert_eq!(
        registered.status(),
        StatusCode::CREATED,
        "passkey on {base}"
    );
    let issued: Value = post(
        format!("/api/steps/{step}/challenge"),
        json!({"verdict": "approved"}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let a = key.assert(
        &rp,
        &unb64(issued["challenge"].as_str().unwrap(), "challenge").unwrap(),
    );
    let decided = http
        .post(format!("{base}/api/steps/{step}/decision"))
        .header("origin", origin)
        .json(
            &json!({"verdict": "approved", "reason": "Replica test approval",
                      "signature": {"nonce": issued["nonce"],
                                    "credential_id": b64(&a.credential_id),
                                    "authenticator_data": b64(&a.authenticator_data),
                                    "client_data_json": b64(&a.client_data_json),
                                    "signature": b64(&a.signature)}}),
        )
        .send()
        .await
        .unwrap();
    let status = decided.status();
    let body = decided.text().await.unwrap_or_default();
    assert_eq!(status, StatusCode::OK, "decision on {base}: {body}");
}

/// Plans a payment of `invoice` through the `/mcp` at `mcp` (a planner's credential), has
/// it reviewed through `review_at` (a reviewer's credential): the step id, once the step
/// waits for a person.
async fn plan_payment(
    store: &Store,
    mcp: &str,
    (planner, reviewer): (&str, &str),
    review_at: &str,
    invoice: &str,
) -> String {
    let token = planner;
    let mut c = Client::at(reqwest::Client::new(), mcp, token);
    c.connect().await;
    let planned = c
        .call(
            "plan.submit",
            json!({"task": format!("Pay {invoice}"), "steps": [{"tool": "payment.schedule",
                   "arguments": payment_for(invoice), "reason": "Replica test payment"}]}),
        )
        .await;
    let step = planned["result"]["structuredContent"]["steps"][0]["step_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{planned}"))
        .to_string();
    let hash = store.get_step(&step).await.unwrap().inputs_hash;
    let mut review = Client::at(reqwest::Client::new(), review_at, reviewer);
    review.connect().await;
    let reviewed = review
        .call(
            "step.approve",
            json!({"step_id": step, "inputs_hash": hash.to_string(),
                   "reason": "Amount and supplier match the approved invoice"}),
        )
        .await;
    assert_eq!(reviewed["result"]["isError"], false, "{reviewed}");
    wait_step(store, &step, StepStatus::NeedsApproval).await;
    step
}

async fn wait_step(store: &Store, step: &str, status: StepStatus) {
    let began = Instant::now();
    loop {
        let now = store.get_step(step).await.unwrap().status;
        if now == status {
            return;
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "step {step} is {now:?}, never {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn payments_of(store: &Store, invoice: &str) -> usize {
    store
        .demo_effects("erp", "payments.schedule")
        .await
        .unwrap()
        .iter()
        .filter(|fx| fx.request.contains(invoice))
        .count()
}

/// The Python SDK (both eras) through the proxy: negotiated revision, role listing, and an
/// allowed, an invalid, a gated and a denied call.
async fn python_sdk(sdk: Sdk, mcp: &str, token: &str) {
    let Some(cmd) = interop::client_command(sdk) else {
        return;
    };
    let script = json!([
        {"op": "list"},
        interop::call("invoice.get", json!({"invoice_id": "INV-20260611"})),
        interop::call("invoice.hold", json!({"invoice_id": "INV-20260611", "amount": -5,
            "currency": "EUR", "reason": REASON})),
        interop::call("invoice.hold", json!({"invoice_id": "INV-20260611", "amount": 2000,
            "currency": "EUR", "reason": REASON})),
        interop::call("payment.schedule", json!({"invoice_id": "INV-20260611",
            "amount": 30000, "currency": "EUR", "value_date": "2026-06-15", "reason": REASON})),
        {"op": "list"},
    ]);
    let out = interop::run_client_at(cmd, sdk, mcp, token, script).await;
    interop::assert_negotiated(sdk, &out);
    let tools = interop::at(&out, 0)["tools"].to_string();
    assert!(tools.contains("\"invoice.get\""), "{sdk:?}: {out:#}");
    assert!(
        !tools.contains("\"supplier.update_iban\""),
        "{sdk:?}: {out:#}"
    );
    assert_eq!(
        interop::result(&out, 1)["isError"],
        false,
        "{sdk:?}: {out:#}"
    );
    let invalid = interop::result(&out, 2);
    assert_eq!(invalid["structuredContent"]["status"], "invalid", "{out:#}");
    let gated = interop::result(&out, 3);
    assert_eq!(
        gated["structuredContent"]["status"], "needs_approval",
        "{out:#}"
    );
    let denied = interop::result(&out, 4);
    assert_eq!(denied["structuredContent"]["status"], "denied", "{out:#}");
    assert_eq!(
        interop::at(&out, 5)["tools"].to_string(),
        tools,
        "{sdk:?}: {out:#}"
    );
}

/// How large a replica-kill run is.
pub(crate) struct Size {
    /// Scripted agents; every other one keeps one MCP session, the rest are session-less.
    pub(crate) agents: usize,
    /// Writes (holds of distinct invoices) per agent.
    pub(crate) calls: usize,
    /// How long the demo ERP takes to hold an invoice, half before the effect and half after
    /// (so the kill lands mid-call, on either side of the effect).
    pub(crate) latency_ms: u64,
}

/// What a replica-kill run counted.
pub(crate) struct Outcome {
    pub(crate) calls: usize,
    pub(crate) resent: usize,
    pub(crate) failovers: u64,
    pub(crate) served: Vec<u64>,
    pub(crate) tally: Tally,
}

/// Runs two replicas behind the proxy, drives `size` of traffic, kills replica A once a
/// third of it is answered, and checks everything the module promises. `None` without
/// Postgres (outside CI).
pub(crate) async fn replica_kill(size: Size) -> Option<Outcome> {
    let db = FreshDb::create(Backend::Postgres).await?;
    let url = db.url.expose().clone();
    let http = reqwest::Client::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let public = format!("http://{}", listener.local_addr().unwrap());
    let (port_a, port_b) = (free_port(), free_port());
    let (base_a, base_b) = (
        format!("http://127.0.0.1:{port_a}"),
        format!("http://127.0.0.1:{port_b}"),
    );
    // One at a time: the first migrates and imports the registry, the second finds both done.
    let (replica_a, log_a) = spawn_replica(&url, port_a, &public);
    wait_up(&http, &base_a, &log_a).await;
    let (mut replica_b, log_b) = spawn_replica(&url, port_b, &public);
    wait_up(&http, &base_b, &log_b).await;
    let proxy = start_proxy(listener, vec![base_a.clone(), base_b.clone()]).await;
    let mcp = format!("{public}/mcp");
    let store = db.store(Arc::new(SystemClock)).await;

    // The official SDK of both eras, every request to the next replica.
    for sdk in [Sdk::Python, Sdk::PythonHandshake] {
        let token = agent(&store, &format!("py-{sdk:?}")).await;
        python_sdk(sdk, &mcp, &token).await;
    }

    let (mcp_a, mcp_b) = (format!("{base_a}/mcp"), format!("{base_b}/mcp"));
    let paid = seed_invoices(&store, "INV-8", 3).await;
    // A planned payment gated through A is approved through B and run once, by whichever
    // replica's worker claims it.
    let planner = agent_in(&store, "planner", "planner").await;
    let reviewer = agent_in(&store, "reviewer", "reviewer").await;
    let plan = (planner.as_str(), reviewer.as_str());
    let step = plan_payment(&store, &mcp_a, plan, &mcp, &paid[0]).await;
    approve_on(&base_b, &public, &step).await;
    wait_step(&store, &step, StepStatus::Done).await;
    assert_eq!(payments_of(&store, &paid[0]).await, 1);
    // An agent's own payment gated in its session on A, approved on B, is run by the agent's
    // next call in that session — on B — once; asking again on A changes nothing.
    let payer = agent(&store, "payer").await;
    let mut on_a = Client::at(reqwest::Client::new(), &mcp_a, &payer);
    on_a.connect().await;
    let gated = on_a.call("payment.schedule", payment_for(&paid[1])).await;
    let gated = &gated["result"]["structuredContent"];
    assert_eq!(gated["status"], "needs_approval", "{gated}");
    approve_on(&base_b, &public, gated["step_id"].as_str().unwrap()).await;
    let mut on_b = Client::at(reqwest::Client::new(), &mcp_b, &payer);
    on_b.use_session(on_a.session());
    let paid_b = on_b.call("payment.schedule", payment_for(&paid[1])).await;
    assert_eq!(paid_b["result"]["isError"], false, "{paid_b}");
    let again = on_a.call("payment.schedule", payment_for(&paid[1])).await;
    assert_eq!(
        again["result"]["structuredContent"], paid_b["result"]["structuredContent"],
        "the same call in the same session is the same step"
    );
    assert_eq!(payments_of(&store, &paid[1]).await, 1);
    // A third waits, planned through A, when A is killed.
    let orphan = plan_payment(&store, &mcp_a, plan, &mcp, &paid[2]).await;
    // A session only A has served: B must restore it after the kill.
    let mut only_a = Client::at(reqwest::Client::new(), &mcp_a, &payer);
    only_a.connect().await;
    let first = only_a
        .call("invoice.get", json!({"invoice_id": paid[0]}))
        .await;
    assert_eq!(first["result"]["isError"], false, "{first}");
    let served_before = proxy.served[0].load(Ordering::SeqCst);

    // Scripted agents of both eras; A is killed once a third of their calls are answered.
    set_latency(
        &store,
        ERP,
        "invoices.hold",
        Latency {
            before_ms: size.latency_ms / 2,
            after_ms: size.latency_ms - size.latency_ms / 2,
        },
    )
    .await
    .unwrap();
    let invoices = seed_invoices(&store, "INV-9", size.agents * size.calls).await;
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut drivers = Vec::new();
    for (i, mine) in invoices.chunks(size.calls).enumerate() {
        let token = agent(&store, &format!("driver-{i}")).await;
        drivers.push(tokio::spawn(drive(
            mcp.clone(),
            token,
            mine.to_vec(),
            i % 2 == 0,
            killed.clone(),
        )));
    }
    let began = Instant::now();
    loop {
        let done = store
            .demo_effects("erp", "invoices.hold")
            .await
            .unwrap()
            .len();
        if done * 3 >= invoices.len() {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "traffic never got going"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(replica_a); // SIGKILL, then reaped.
    killed.store(true, Ordering::SeqCst);
    // (An answer A sent just before it died may still be on its way through the proxy.)
    tokio::time::sleep(Duration::from_millis(200)).await;
    let served_a = proxy.served[0].load(Ordering::SeqCst);
    assert!(
        served_a > served_before,
        "A served the agents before it died"
    );
    let mut via_proxy = Client::at(reqwest::Client::new(), &mcp, &payer);
    via_proxy.use_session(only_a.session());
    let restored = via_proxy
        .call("invoice.get", json!({"invoice_id": paid[1]}))
        .await;
    assert_eq!(restored["result"]["isError"], false, "{restored}");
    // What A had running when it died is settled by a reconciler that finds it stale soon.
    let reconciler = Child(
        countersign_on(&url)
            .args(["worker", "--count", "1", "--stale-after", "2"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    approve_on(&public, &public, &orphan).await;

    let mut driven = Vec::new();
    for d in drivers {
        driven.push(d.await.unwrap());
    }
    wait_step(&store, &orphan, StepStatus::Done).await;
    assert_eq!(
        payments_of(&store, &paid[2]).await,
        1,
        "approved after A died"
    );
    for (i, d) in driven.iter().enumerate() {
        assert_eq!(d.calls, size.calls, "agent {i}: {d:?}");
        assert!(d.errors.is_empty(), "agent {i}: {d:?}");
        // A session agent's session went on, on B, after A died.
        if i % 2 == 0 {
            assert!(
                d.after_kill > 0,
                "agent {i} made no call after the kill: {d:?}"
            );
        }
    }
    // Nothing left running once the reconciler has looked.
    let began = Instant::now();
    while store.count_steps(StepStatus::Running).await.unwrap() > 0 {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "steps left running"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(reconciler);
    let tally = tally(&store).await;
    assert_eq!(
        (tally.lost, tally.duplicated, tally.unknown),
        (0, 0, 0),
        "{tally:?}"
    );
    // Every hold is applied exactly once.
    let holds = tally.by_operation.get("erp invoices.hold").copied();
    assert_eq!(holds, Some(invoices.len()), "{tally:?}");
    assert!(
        matches!(store.verify_audit().await, Ok(Ok(_))),
        "the audit chain verifies"
    );
    let served: Vec<u64> = proxy
        .served
        .iter()
        .map(|n| n.load(Ordering::SeqCst))
        .collect();
    assert_eq!(served[0], served_a, "nothing reached A after it died");
    replica_b.0.kill().ok();
    let _ = replica_b.0.wait();
    store.close().await;
    db.drop_db().await;
    Some(Outcome {
        calls: driven.iter().map(|d| d.calls).sum(),
        resent: driven.iter().map(|d| d.resent).sum(),
        failovers: proxy.failovers.load(Ordering::SeqCst),
        served,
        tally,
    })
}

#[tokio::test]
async fn replicas_share_sessions_and_survive_a_kill() {
    let Some(out) = replica_kill(Size {
        agents: 4,
        calls: 20,
        latency_ms: 200,
    })
    .await
    else {
        return;
    };
    eprintln!(
        "replica kill: {} calls, {} sent again, {} failovers, served {:?}, {:?}",
        out.calls, out.resent, out.failovers, out.served, out.tally
    );
}
