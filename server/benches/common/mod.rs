//! Shared by the load benches: a real server on a fresh Postgres database, a minimal MCP
//! client over streamable HTTP, and the statistics and markdown they print.
#![allow(dead_code)]

pub mod figures;
pub mod procs;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use countersign::{AppState, Application, Config};
use countersign_core::clock::SystemClock;
use countersign_core::store::NewAgent;
use countersign_core::store::testing::FreshDb;
use countersign_core::{Backend, Clock};
use serde_json::{Value, json};
use tokio::sync::oneshot;

const PROTOCOL: &str = "2025-06-18";
/// The session-less revision, spoken when `BENCH_MCP` names it.
const SESSION_LESS: &str = "2026-07-28";

/// Whether the bench's MCP clients speak the session-less revision (`BENCH_MCP=2026-07-28`)
/// rather than open a session.
pub fn session_less() -> bool {
    std::env::var("BENCH_MCP").is_ok_and(|v| v == SESSION_LESS)
}

/// An environment variable as a number, or `default`.
pub fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fresh Postgres database; exits the bench when Postgres is unreachable (a bench
/// without its database measures nothing).
pub async fn fresh_postgres() -> FreshDb {
    match FreshDb::create(Backend::Postgres).await {
        Some(db) => db,
        None => {
            eprintln!("bench: Postgres is unreachable (COUNTERSIGN_TEST_POSTGRES_URL)");
            std::process::exit(2);
        }
    }
}

/// The real server, serving on an ephemeral loopback port.
pub struct Server {
    pub addr: SocketAddr,
    pub state: AppState,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    /// Starts `countersign serve` in-process on `db` with the finance example and no
    /// executor workers (the benches drive those themselves).
    pub async fn start(db: &FreshDb) -> Self {
        Self::start_with(
            db,
            &format!("{}/../examples/finance", env!("CARGO_MANIFEST_DIR")),
        )
        .await
    }

    /// [`Server::start`] with the registry file or folder at `registry`.
    pub async fn start_with(db: &FreshDb, registry: &str) -> Self {
        let registry = registry.to_string();
        let env = vec![
            (
                "COUNTERSIGN_DATABASE_URL".to_string(),
                db.url.expose().clone(),
            ),
            ("COUNTERSIGN_LISTEN".to_string(), "127.0.0.1:0".to_string()),
            ("COUNTERSIGN_LOG_LEVEL".to_string(), "error".to_string()),
            ("COUNTERSIGN_REGISTRY".to_string(), registry),
            ("COUNTERSIGN_WORKERS".to_string(), "0".to_string()),
            ("COUNTERSIGN_DEMO_SIGN_IN".to_string(), "true".to_string()),
            // The ablation run (scripts/bench.sh) turns write-path mechanisms off.
            (
                "COUNTERSIGN_STORE_ABLATE".to_string(),
                std::env::var("BENCH_STORE_ABLATE").unwrap_or_default(),
            ),
        ];
        let config = Config::load(None, env).expect("bench config is valid");
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let app = Application::build(config, clock)
            .await
            .expect("server builds");
        let addr = app.local_addr().unwrap();
        let state = app.state().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            app.run_until(async move {
                let _ = stopped.await;
            })
            .await
            .expect("server runs");
        });
        Self {
            addr,
            state,
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    /// A fresh agent token in `role` (tenant acme, the finance example's).
    pub async fn agent(&self, name: &str, role: &str) -> String {
        let (_, token) = self
            .state
            .store
            .create_agent(&NewAgent {
                name: name.into(),
                role: role.into(),
                tenant: "acme".into(),
                created_by: "bench".into(),
                expires_at: None,
                acts_for: None,
                origin: countersign_core::policy::TaskOrigin::User,
            })
            .await
            .unwrap();
        token.reveal().to_string()
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.handle.take() {
            let _ = handle.await;
        }
    }
}

/// One MCP client (its own HTTP connection and session) over streamable HTTP.
pub struct Mcp {
    http: reqwest::Client,
    url: String,
    token: String,
    session: Option<String>,
    next_id: u64,
    /// Speaks 2026-07-28: no session, each request's revision in its `_meta`.
    modern: bool,
}

impl Mcp {
    pub fn new(addr: SocketAddr, token: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(1)
                .build()
                .unwrap(),
            url: format!("http://{addr}/mcp"),
            token: token.to_string(),
            session: None,
            next_id: 1,
            modern: false,
        }
    }

    /// Whether this client speaks 2026-07-28.
    pub fn speaks_session_less(&self) -> bool {
        self.modern
    }

    /// A client of the session-less revision 2026-07-28 (`connect` sends `server/discover`).
    pub fn session_less(mut self) -> Self {
        self.modern = true;
        self
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
                .header("MCP-Protocol-Version", PROTOCOL);
        }
        req
    }

    /// A JSON-RPC request; the response (from a JSON body or an SSE stream).
    pub async fn request(&mut self, method: &str, mut params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let tool = params["name"].as_str().map(str::to_string);
        if self.modern {
            params["_meta"] = json!({
                "io.modelcontextprotocol/protocolVersion": SESSION_LESS,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
            });
        }
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut req = self.post(&body);
        if self.modern {
            req = req
                .header("MCP-Protocol-Version", SESSION_LESS)
                .header("Mcp-Method", method);
            if let Some(tool) = tool {
                req = req.header("Mcp-Name", tool);
            }
        }
        let mut resp = req.send().await.unwrap();
        assert_eq!(resp.status(), reqwest::StatusCode::OK, "{method}");
        if let Some(session) = resp.headers().get("mcp-session-id") {
            self.session = Some(session.to_str().unwrap().to_string());
        }
        let sse = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !sse {
            return resp.json().await.unwrap();
        }
        let mut buf = String::new();
        loop {
            let chunk = resp
                .chunk()
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("stream ended before response {id}: {buf}"));
            buf.push_str(&String::from_utf8_lossy(&chunk));
            for line in buf.lines() {
                if let Some(data) = line.strip_prefix("data:")
                    && let Ok(msg) = serde_json::from_str::<Value>(data.trim())
                    && msg["id"] == json!(id)
                {
                    return msg;
                }
            }
        }
    }

    /// initialize + notifications/initialized: a new MCP session (`server/discover` for a
    /// session-less client).
    pub async fn connect(&mut self) {
        if self.modern {
            let found = self.request("server/discover", json!({})).await;
            let versions = found["result"]["supportedVersions"].to_string();
            assert!(versions.contains(SESSION_LESS), "{found}");
            return;
        }
        let init = self
            .request(
                "initialize",
                json!({"protocolVersion": PROTOCOL, "capabilities": {},
                       "clientInfo": {"name": "bench", "version": "0"}}),
            )
            .await;
        assert!(
            init["result"]["capabilities"]["tools"].is_object(),
            "{init}"
        );
        assert!(self.session.is_some(), "a session id is issued");
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let resp = self.post(&note).send().await.unwrap();
        assert_eq!(resp.status(), reqwest::StatusCode::ACCEPTED);
    }

    /// `tools/call`; the `result`, which may be an error result.
    pub async fn try_call(&mut self, name: &str, arguments: Value) -> Value {
        let reply = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await;
        assert!(reply["result"].is_object(), "{name}: {reply}");
        reply["result"].clone()
    }

    /// `tools/call`; the `result`, which must not be an error.
    pub async fn call(&mut self, name: &str, arguments: Value) -> Value {
        let reply = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await;
        let result = &reply["result"];
        assert!(
            result.is_object() && result["isError"] != json!(true),
            "{name} failed: {reply}"
        );
        result.clone()
    }
}

/// Latency percentile `p` (0..=100) of sorted `samples`.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// `part / whole` as a percentage with no decimals.
pub fn pct(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:.0} %", 100.0 * part / whole)
    } else {
        "n/a".into()
    }
}

/// A reading of the machine's CPU counters (`/proc/stat`) and this process's
/// (`/proc/self/stat`), to tell how much CPU a workload cost per call.
#[derive(Clone, Copy, Debug)]
pub struct CpuReading {
    /// Clock ticks of every CPU, busy or idle.
    total: u64,
    /// Clock ticks the CPUs spent busy (user, nice, system, irq, softirq). Steal (a
    /// virtual CPU waiting for its host) is time in which nothing here ran: not counted.
    busy: u64,
    /// Clock ticks this process spent (user + system, all threads).
    process: u64,
    /// CPUs the machine-wide counters add up.
    cpus: usize,
    at: std::time::Instant,
}

/// CPU time a workload used, machine-wide and in this process (the bench's own side: server
/// and clients; the rest is mostly Postgres).
#[derive(Clone, Copy, Debug)]
pub struct CpuUsed {
    pub machine: Duration,
    pub process: Duration,
    /// The machine's CPUs.
    pub cpus: usize,
}

impl CpuUsed {
    /// `total / calls` as milliseconds with three decimals, for a table cell.
    pub fn per_call(d: Duration, calls: usize) -> String {
        if calls == 0 {
            return "n/a".into();
        }
        format!("{:.3} ms", d.as_secs_f64() * 1e3 / calls as f64)
    }

    /// The machine's and the process's CPU per call of `cpu` over `calls`, for table cells
    /// (`n/a` without a reading).
    pub fn cells(cpu: Option<&CpuUsed>, calls: usize) -> (String, String) {
        match cpu {
            Some(c) => (
                Self::per_call(c.machine, calls),
                Self::per_call(c.process, calls),
            ),
            None => ("n/a".into(), "n/a".into()),
        }
    }

    /// The most calls per second the machine's CPUs could complete if each call costs what
    /// `calls` calls cost here and every CPU did nothing else.
    pub fn ceiling_per_s(&self, calls: usize) -> f64 {
        let per_call = self.machine.as_secs_f64() / calls.max(1) as f64;
        if per_call > 0.0 {
            self.cpus as f64 / per_call
        } else {
            f64::INFINITY
        }
    }
}

/// The current counters; `None` off Linux or when `/proc` is unreadable.
pub fn cpu_reading() -> Option<CpuReading> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = procs::all_cpus(&stat)?;
    let own = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at field 3; utime and
    // stime are fields 14 and 15.
    let rest = &own[own.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(CpuReading {
        total: user + nice + system + idle + iowait + irq + softirq + steal,
        busy: user + nice + system + irq + softirq,
        process: utime + stime,
        cpus: stat
            .lines()
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .count(),
        at: std::time::Instant::now(),
    })
}

/// CPU used between two readings. Ticks are turned into time by the share of all CPUs'
/// ticks that elapsed (no clock-tick constant needed).
pub fn cpu_used(from: Option<CpuReading>, to: Option<CpuReading>) -> Option<CpuUsed> {
    let (a, b) = (from?, to?);
    let total = b.total.checked_sub(a.total)?;
    if total == 0 {
        return None;
    }
    let cpus = b.cpus as f64;
    let wall = b.at.saturating_duration_since(a.at).as_secs_f64();
    let share = |ticks: u64| Duration::from_secs_f64(ticks as f64 / total as f64 * cpus * wall);
    Some(CpuUsed {
        machine: share(b.busy.saturating_sub(a.busy)),
        process: share(b.process.saturating_sub(a.process)),
        cpus: b.cpus,
    })
}
