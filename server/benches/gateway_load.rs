//! Gateway load (issues 4 and 34): `countersign serve` in its own process, on Postgres and on
//! SQLite, driven over loopback by concurrent MCP clients from this process, next to the
//! references that carry the same guarantees, measured in the same run.
//!
//! * Processes: the server (the release binary), Postgres, an upstream MCP server (this
//!   binary again) and the load generator (this process) each run apart; CPU is read per
//!   process from `/proc` (`common::procs`), so "CPU per call" says whose CPU.
//! * Rounds: every workload runs once per round, each round starting one workload later in
//!   the list, `BENCH_ROUNDS` (default 3) rounds of `BENCH_SECONDS` (default 10) s windows after a warm-up; a figure is the
//!   median over rounds of the ratio of its two sides measured in the same round, shown with
//!   the rounds' spread.
//! * Workloads, each `BENCH_CLIENTS` (default 16) clients in closed loops, each client its
//!   own MCP session and agent:
//!   - baseline: `BEGIN; INSERT; COMMIT` of a 400-byte row (about one audit record) per call
//!     through a pool of the server's kind, size and settings (the store's `LeanPool` over
//!     `store::pg_pool_options` or `store::sqlite_connect_options`, its own SQLite file
//!     beside the server's);
//!   - `bench.read`: an allowed read of the built-in no-op system — the gateway alone;
//!   - floor: a `tools/call` of a tool the role is not listed for — transport, credential,
//!     the role's listing and one chained, durable audit record: the least an audited call
//!     does;
//!   - ping: an authenticated MCP `ping` — transport and credential only;
//!   - `invoice.get` and `note.draft`: a read and a write of the demo ERP (its record read,
//!     a note drafted with a distinct text per call);
//!   - through / direct: the upstream's `lookup` through Countersign (`bench.lookup`, a
//!     provider of kind `mcp`) and called directly by the same client code.
//!
//! Writes one markdown section per backend on stdout, progress on stderr, and the issue-34
//! figures to `BENCH_FIGURES` (`common::figures`). `BENCH_BACKENDS` (default
//! `postgres,sqlite`) picks the backends; `BENCH_ONLY` (e.g. `read` or `read,floor`: the keys
//! of [`Work::key`]) runs only those workloads and prints their table, no figures (for a
//! profiler attached to the server); `BENCH_ABLATE` runs the ablation instead
//! (`gateway/ablate.rs`); `BENCH_MCP=2026-07-28` makes the clients of Countersign speak the
//! session-less revision (no session; answers as JSON) instead of 2025-06-18. Run with `cargo bench -p countersign --bench
//! gateway_load` (Postgres from `COUNTERSIGN_TEST_POSTGRES_URL`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "gateway/ablate.rs"]
mod ablate;
mod common;
#[path = "gateway/upstream.rs"]
mod upstream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::figures::{Side, median, ms_per, record, spread};
use common::procs::{Parties, ServerProcess, Spent, UPSTREAM_ENV, UpstreamProcess};
use common::{Mcp, env_num, fresh_postgres, ms, percentile};
use countersign_core::clock::SystemClock;
use countersign_core::store::testing::FreshDb;
use countersign_core::store::{
    ConnectOptions, LeanPool, NewAgent, pg_pool_options, sqlite_connect_options,
};
use countersign_core::{Backend, Store};
use serde_json::json;

const INVOICE: &str = "INV-20260611";

/// The baseline's row body: about one audit record's size (built once, not per call on the
/// load generator's side of the measurement).
static BASELINE_BODY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| "x".repeat(400));
const ROLE: &str = "worker.finance";

/// The workloads, in the order each round runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    Baseline,
    Read,
    Floor,
    Ping,
    ErpRead,
    Write,
    Through,
    Direct,
}

impl Work {
    const ALL: [Work; 8] = [
        Work::Baseline,
        Work::Read,
        Work::Floor,
        Work::Ping,
        Work::ErpRead,
        Work::Write,
        Work::Through,
        Work::Direct,
    ];

    /// Its name in `BENCH_ONLY`.
    fn key(self) -> &'static str {
        match self {
            Work::Baseline => "baseline",
            Work::Read => "read",
            Work::Floor => "floor",
            Work::Ping => "ping",
            Work::ErpRead => "erp_read",
            Work::Write => "write",
            Work::Through => "through",
            Work::Direct => "direct",
        }
    }

    /// The workloads `BENCH_ONLY` (comma-separated keys) keeps; all without it.
    fn chosen() -> Vec<Work> {
        let Ok(only) = std::env::var("BENCH_ONLY") else {
            return Work::ALL.to_vec();
        };
        let keys: Vec<&str> = only.split(',').map(str::trim).collect();
        for k in &keys {
            assert!(
                Work::ALL.iter().any(|w| w.key() == *k),
                "BENCH_ONLY: unknown workload {k:?}"
            );
        }
        Work::ALL
            .into_iter()
            .filter(|w| keys.contains(&w.key()))
            .collect()
    }

    fn name(self) -> &'static str {
        match self {
            Work::Baseline => "baseline: INSERT + COMMIT",
            Work::Read => "`bench.read` (no-op read)",
            Work::Floor => "floor: unlisted tool (credential + one audit record)",
            Work::Ping => {
                "reference: MCP ping or, at 2026-07-28, server/discover (transport + credential)"
            }
            Work::ErpRead => "`invoice.get` (demo ERP read)",
            Work::Write => "`note.draft` (demo ERP write)",
            Work::Through => "`bench.lookup` through Countersign",
            Work::Direct => "upstream `lookup` called directly",
        }
    }
}

/// A raw baseline pool: the store's kind of pool, so that the baseline pays what the store
/// pays per statement and per commit.
#[derive(Clone)]
enum Raw {
    Pg(LeanPool<sqlx::Postgres>),
    Sqlite(LeanPool<sqlx::Sqlite>),
}

impl Raw {
    async fn insert(&self, c: usize, n: u64, body: &str) {
        const SQL: &str =
            "INSERT INTO bench_baseline (client, n, body, created_at) VALUES ($1, $2, $3, $4)";
        match self {
            Raw::Pg(p) => {
                let mut tx = p.begin().await.unwrap();
                let q = sqlx::query(SQL).bind(c as i64).bind(n as i64).bind(body);
                q.bind(n as i64).execute(&mut *tx).await.unwrap();
                tx.commit().await.unwrap();
            }
            Raw::Sqlite(p) => {
                let mut tx = p.begin().await.unwrap();
                let q = sqlx::query(SQL).bind(c as i64).bind(n as i64).bind(body);
                q.bind(n as i64).execute(&mut *tx).await.unwrap();
                tx.commit().await.unwrap();
            }
        }
    }
}

/// One client of a workload.
enum Client {
    Raw(Raw),
    Mcp(Mcp),
}

/// One call of `work`; false for a failed (retryable) call, which is counted apart.
async fn call(work: Work, client: &mut Client, c: usize, n: u64) -> bool {
    let mcp = match client {
        Client::Raw(raw) => {
            raw.insert(c, n, &BASELINE_BODY).await;
            return true;
        }
        Client::Mcp(mcp) => mcp,
    };
    match work {
        Work::Baseline => unreachable!("the baseline has raw clients"),
        Work::Read => {
            let r = mcp.call("bench.read", json!({"n": 7})).await;
            assert_eq!(r["structuredContent"]["status"], json!("ok"), "{r}");
        }
        Work::Floor => {
            let reply = mcp
                .request(
                    "tools/call",
                    json!({"name": "supplier.update_iban", "arguments": {}}),
                )
                .await;
            // The unknown-tool answer (-32602), not an internal error (a failed append).
            assert_eq!(reply["error"]["code"], json!(-32602), "{reply}");
        }
        Work::Ping => {
            // 2026-07-28 has no `ping`: `server/discover` is its no-op request.
            let method = if mcp.speaks_session_less() {
                "server/discover"
            } else {
                "ping"
            };
            let reply = mcp.request(method, json!({})).await;
            assert!(reply["result"].is_object(), "{reply}");
        }
        Work::ErpRead => {
            let r = mcp
                .call("invoice.get", json!({"invoice_id": INVOICE}))
                .await;
            assert!(r["structuredContent"].is_object(), "{r}");
        }
        Work::Write => {
            // Distinct across windows and rounds too: a repeated text is the same call,
            // answered from its first outcome (no new effect), which is not a write.
            static NOTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let note = NOTES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let text = format!("bench note {c}-{n}-{note}-{}", std::process::id());
            let r = mcp
                .try_call("note.draft", json!({"invoice_id": INVOICE, "text": text}))
                .await;
            if r["isError"] == json!(true) {
                // Only a retryable failure of the target is tolerated (and counted).
                assert_eq!(r["structuredContent"]["retryable"], json!(true), "{r}");
                return false;
            }
            assert!(r["structuredContent"].is_object(), "{r}");
        }
        Work::Through => {
            let r = mcp.call("bench.lookup", json!({"id": "r-1"})).await;
            assert_eq!(r["structuredContent"]["found"], json!(true), "{r}");
        }
        Work::Direct => {
            let r = mcp.call(upstream::TOOL, json!({"id": "r-1"})).await;
            assert_eq!(r["structuredContent"]["found"], json!(true), "{r}");
        }
    }
    true
}

/// What one window of one workload measured.
struct Window {
    calls: usize,
    failed: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    cpu: Spent,
}

impl Window {
    fn per_s(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU per call (ms) of the system under test: server and database; for the direct
    /// upstream, the upstream.
    fn system_ms(&self, work: Work) -> f64 {
        let cpu = if work == Work::Direct {
            self.cpu.upstream
        } else {
            self.cpu.system()
        };
        cpu.map_or(f64::NAN, |d| ms_per(d, self.calls + self.failed))
    }
}

/// Runs every client's closed loop of `work` for `secs` after `warmup`; gives the clients
/// back.
async fn window(
    work: Work,
    clients: Vec<Client>,
    warmup: Duration,
    secs: Duration,
    parties: Parties,
) -> (Vec<Client>, Window) {
    let began = Instant::now() + warmup;
    let until = began + secs;
    let first = tokio::spawn(async move {
        tokio::time::sleep_until(began.into()).await;
        parties.read()
    });
    let mut tasks = Vec::new();
    for (c, mut client) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut failed, mut n) = (Vec::new(), 0_usize, 0_u64);
            loop {
                let start = Instant::now();
                if start >= until {
                    break;
                }
                let ok = call(work, &mut client, c, n).await;
                n += 1;
                if start >= began {
                    if ok {
                        lat.push(start.elapsed());
                    } else {
                        failed += 1;
                    }
                }
            }
            (client, lat, failed)
        }));
    }
    let (mut back, mut latencies, mut failed) = (Vec::new(), Vec::new(), 0);
    for t in tasks {
        let (client, lat, f) = t.await.unwrap();
        back.push(client);
        latencies.extend(lat);
        failed += f;
    }
    // The window closes when the last call that started inside it returns.
    let elapsed = Instant::now().saturating_duration_since(began);
    let cpu = Spent::between(&first.await.unwrap(), &parties.read());
    latencies.sort();
    let w = Window {
        calls: latencies.len(),
        failed,
        elapsed,
        latencies,
        cpu,
    };
    eprintln!(
        "  {}: {:.0}/s ({} failed)",
        work.name(),
        w.per_s(),
        w.failed
    );
    (back, w)
}

/// The finance example plus the no-op system, `bench.read` and the upstream's `bench.lookup`,
/// in the folder `dir`.
fn bench_registry(dir: &Path, upstream: std::net::SocketAddr) -> PathBuf {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/finance");
    let reg = dir.join("registry");
    std::fs::create_dir_all(&reg).unwrap();
    for file in ["registry.yaml", "policy.cedar", "policy.cedarschema"] {
        std::fs::copy(example.join(file), reg.join(file)).unwrap();
    }
    let bench = format!(
        r#"
providers:
  noop:
    kind: builtin
    description: Does nothing (gateway benchmark).
  upstream:
    kind: mcp
    description: The bench's upstream MCP server.
    url: "http://{upstream}/mcp"
    allowed_hosts: ["127.0.0.1"]
tools:
  bench.read:
    title: Benchmark no-op read
    description: Reads nothing at the no-op system (gateway benchmark).
    effect: read
    gate: never
    roles: [{ROLE}]
    handler: {{provider: noop, operation: noop.read}}
    inputSchema:
      type: object
      additionalProperties: false
      required: [n]
      properties:
        n: {{type: integer, minimum: 0, maximum: 1000000000}}
  bench.lookup:
    title: Benchmark upstream lookup
    description: Looks a record up at the bench's upstream MCP server.
    effect: read
    gate: never
    roles: [{ROLE}]
    handler: {{provider: upstream, operation: {tool}}}
    inputSchema:
      type: object
      additionalProperties: false
      required: [id]
      properties:
        id: {{type: string, maxLength: 40}}
"#,
        tool = upstream::TOOL
    );
    std::fs::write(reg.join("zz-bench.yaml"), bench).unwrap();
    reg
}

/// The baseline's pool and table: on Postgres in the server's database, on SQLite in its own
/// file beside the server's.
async fn baseline_pool(db: &FreshDb, dir: &Path, size: u32) -> Raw {
    const TABLE: &str =
        "CREATE TABLE bench_baseline (id INTEGER PRIMARY KEY, client BIGINT NOT NULL,
        n BIGINT NOT NULL, body TEXT NOT NULL, created_at BIGINT NOT NULL)";
    match db.backend {
        Backend::Postgres => {
            let pool = pg_pool_options()
                .max_connections(size)
                .connect(db.url.expose())
                .await
                .unwrap();
            let table = TABLE.replace("INTEGER PRIMARY KEY", "BIGSERIAL PRIMARY KEY");
            sqlx::query(&table).execute(&pool).await.unwrap();
            Raw::Pg(LeanPool::new(pool))
        }
        Backend::Sqlite => {
            let url = format!("sqlite://{}", dir.join("baseline.db").display());
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(size)
                .connect_with(sqlite_connect_options(&url).unwrap())
                .await
                .unwrap();
            sqlx::query(TABLE).execute(&pool).await.unwrap();
            Raw::Sqlite(LeanPool::new(pool))
        }
    }
}

/// `clients` MCP sessions, each its own fresh agent in [`ROLE`] (none for the direct
/// upstream, which authenticates nobody).
async fn mcp_clients(
    store: &Store,
    addr: std::net::SocketAddr,
    work: Work,
    n: usize,
) -> Vec<Client> {
    let mut out = Vec::new();
    for i in 0..n {
        let token = if work == Work::Direct {
            "none".to_string()
        } else {
            let agent = NewAgent {
                name: format!("bench-{work:?}-{i}").to_lowercase(),
                role: ROLE.into(),
                tenant: "acme".into(),
                created_by: "bench".into(),
                expires_at: None,
                acts_for: None,
                origin: countersign_core::policy::TaskOrigin::User,
            };
            let (_, token) = store.create_agent(&agent).await.unwrap();
            token.reveal().to_string()
        };
        let mut mcp = Mcp::new(addr, &token);
        // The bench's own upstream is spoken to with a session whatever BENCH_MCP says.
        if common::session_less() && work != Work::Direct {
            mcp = mcp.session_less();
        }
        mcp.connect().await;
        out.push(Client::Mcp(mcp));
    }
    out
}

/// Every workload's windows, round by round, on one backend.
struct Runs {
    backend: Backend,
    clients: usize,
    secs: Duration,
    by_work: Vec<(Work, Vec<Window>)>,
    drafted: usize,
}

impl Runs {
    /// The windows of `work`; none when `BENCH_ONLY` left it out.
    fn of(&self, work: Work) -> &[Window] {
        self.by_work
            .iter()
            .find(|(w, _)| *w == work)
            .map_or(&[], |(_, ws)| ws)
    }

    /// Per round, `f(a) / f(b)`.
    fn ratios(&self, a: Work, b: Work, f: impl Fn(Work, &Window) -> f64) -> Vec<f64> {
        self.of(a)
            .iter()
            .zip(self.of(b))
            .map(|(x, y)| f(a, x) / f(b, y))
            .collect()
    }
}

async fn run_backend(backend: Backend, clients: usize, rounds: usize, secs: Duration) -> Runs {
    let db = match backend {
        Backend::Postgres => fresh_postgres().await,
        Backend::Sqlite => FreshDb::create(Backend::Sqlite).await.unwrap(),
    };
    let dir = std::env::temp_dir().join(format!("cs-gateway-bench-{}", uuid_like()));
    std::fs::create_dir_all(&dir).unwrap();
    let upstream = UpstreamProcess::start().await;
    let registry = bench_registry(&dir, upstream.addr);
    // Nothing ablated here, whatever the caller's environment holds.
    let env = [("COUNTERSIGN_STORE_ABLATE", "")];
    let server =
        ServerProcess::start(db.url.expose(), &registry, &dir.join("server.log"), &env).await;
    let store = Store::connect(&db.url, &ConnectOptions::default(), Arc::new(SystemClock))
        .await
        .unwrap();
    let parties = Parties {
        server: Some(server.pid),
        upstream: Some(upstream.pid),
        postgres: backend == Backend::Postgres,
    };
    eprintln!(
        "gateway_load on {backend:?}: {clients} clients, {rounds} rounds of {secs:?}, server pid {} on {}",
        server.pid, server.addr
    );

    let mut pools = Vec::new();
    for work in Work::chosen() {
        let cs = match work {
            Work::Baseline => {
                let raw = baseline_pool(&db, &dir, 16).await;
                (0..clients).map(|_| Client::Raw(raw.clone())).collect()
            }
            Work::Direct => mcp_clients(&store, upstream.addr, work, clients).await,
            _ => mcp_clients(&store, server.addr, work, clients).await,
        };
        pools.push((work, cs, Vec::new()));
    }
    for round in 0..rounds {
        eprintln!(" round {}", round + 1);
        let warmup = Duration::from_secs(if round == 0 { 2 } else { 1 });
        // Each round starts one workload later: what one leaves behind (a checkpoint, a
        // vacuum after the baseline's inserts) does not always land on the same next one.
        let n = pools.len();
        for k in 0..n {
            let (work, cs, windows) = &mut pools[(k + round) % n];
            let (back, w) = window(*work, std::mem::take(cs), warmup, secs, parties).await;
            *cs = back;
            windows.push(w);
        }
    }

    // Every write was one effect at the target (warm-up calls included).
    let drafted = store
        .demo_effects(countersign::adapters::builtin::ERP, "notes.draft")
        .await
        .unwrap()
        .len();
    let by_work: Vec<(Work, Vec<Window>)> = pools.into_iter().map(|(w, _, ws)| (w, ws)).collect();
    let writes: usize = by_work
        .iter()
        .filter(|(w, _)| *w == Work::Write)
        .flat_map(|(_, ws)| ws.iter().map(|w| w.calls))
        .sum();
    assert!(
        drafted >= writes,
        "{drafted} notes drafted for {writes} measured calls"
    );
    drop(store);
    server.stop().await;
    upstream.stop().await;
    db.drop_db().await;
    let _ = std::fs::remove_dir_all(&dir);
    Runs {
        backend,
        clients,
        secs,
        by_work,
        drafted,
    }
}

/// A name no other run of this bench uses (process id and a counter).
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// `d` per call in ms, or `–` without a reading.
fn cell(d: Option<Duration>, calls: usize) -> String {
    d.map_or("–".into(), |d| format!("{:.3}", ms_per(d, calls)))
}

fn print_table(runs: &Runs) {
    println!(
        "| workload | calls/s (median) | rounds' spread | failed | p50 | p99 | vs baseline | \
         server | database | upstream | load generator | other |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let base: Vec<f64> = runs.of(Work::Baseline).iter().map(Window::per_s).collect();
    for (work, ws) in &runs.by_work {
        let per_s: Vec<f64> = ws.iter().map(Window::per_s).collect();
        let vs: Vec<f64> = per_s.iter().zip(&base).map(|(a, b)| a / b).collect();
        let mut lat: Vec<Duration> = ws.iter().flat_map(|w| w.latencies.clone()).collect();
        lat.sort();
        let calls: usize = ws.iter().map(|w| w.calls + w.failed).sum();
        let sum = |f: fn(&Spent) -> Option<Duration>| -> Option<Duration> {
            ws.iter().map(|w| f(&w.cpu)).sum()
        };
        println!(
            "| {} | {:.0} | {} | {} | {} | {} | {:.0} % | {} | {} | {} | {} | {} |",
            work.name(),
            median(&per_s),
            spread(&per_s, 0),
            ws.iter().map(|w| w.failed).sum::<usize>(),
            ms(percentile(&lat, 50.0)),
            ms(percentile(&lat, 99.0)),
            100.0 * median(&vs),
            cell(sum(|c| c.server), calls),
            cell(sum(|c| c.database), calls),
            cell(sum(|c| c.upstream), calls),
            cell(sum(|c| c.client), calls),
            cell(sum(|c| c.other), calls),
        );
    }
    println!();
}

/// A figure: the median of its per-round ratios, its spread, printed and recorded.
struct Figure {
    name: String,
    what: String,
    target: f64,
    /// Met when the value is at most the target (a cost) rather than at least (a rate).
    at_most: bool,
    over: (Work, &'static str),
    under: (Work, &'static str),
    /// Calls per second when true, system CPU per call (ms) when false.
    rate: bool,
}

fn report(runs: &Runs, figures: &[Figure]) {
    println!("| figure | target | value (median of rounds) | rounds | met |");
    println!("|---|---:|---:|---:|---|");
    for f in figures {
        let side = |work: Work, w: &Window| {
            if f.rate { w.per_s() } else { w.system_ms(work) }
        };
        let mut ok = true;
        if f.over.0 == Work::Write {
            ok = runs.of(Work::Write).iter().all(|w| w.failed == 0);
        }
        let ratios = runs.ratios(f.over.0, f.under.0, side);
        let value = median(&ratios);
        let met = ok
            && if f.at_most {
                value <= f.target
            } else {
                value >= f.target
            };
        let sign = if f.at_most { "≤" } else { "≥" };
        println!(
            "| `{}`: {} | {sign} {} | {value:.2} | {} | {} |",
            f.name,
            f.what,
            f.target,
            spread(&ratios, 2),
            if met { "yes" } else { "**no**" }
        );
        let sides = |(work, what): (Work, &str)| Side {
            what: format!("{what} ({:?}, {} clients)", runs.backend, runs.clients),
            value: median(
                &runs
                    .of(work)
                    .iter()
                    .map(|w| side(work, w))
                    .collect::<Vec<_>>(),
            ),
            unit: if f.rate { "calls/s" } else { "ms CPU per call" },
        };
        record(
            &f.name,
            value,
            &format!("{sign} {}", f.target),
            met,
            sides(f.over),
            sides(f.under),
        );
    }
    println!();
}

fn print_backend(runs: &Runs) {
    let (name, prefix) = match runs.backend {
        Backend::Postgres => ("Postgres", ""),
        Backend::Sqlite => ("SQLite", "sqlite_"),
    };
    println!("### Gateway over `/mcp` on {name} (issues 4 and 34)\n");
    println!(
        "{} concurrent MCP clients over loopback, each its own session, closed loop; {} rounds, \
         each running every workload for {} s in the order below. CPU columns: ms of CPU per \
         call (failed calls included) of each process, summed over the rounds; `other` is the \
         rest of the machine meanwhile (noise when it is not near zero).\n",
        runs.clients,
        runs.of(Work::Baseline).len(),
        runs.secs.as_secs()
    );
    print_table(runs);
    let sqlite = if prefix.is_empty() { "" } else { " (SQLite)" };
    let named = |s: &str| format!("{prefix}{s}");
    let what = |s: &str| format!("{s}{sqlite}");
    let figures = [
        Figure {
            name: named("read_over_insert_commit"),
            what: what("no-op read throughput ÷ raw INSERT + COMMIT"),
            target: if prefix.is_empty() { 0.35 } else { 0.50 },
            at_most: false,
            over: (Work::Read, "bench.read calls/s"),
            under: (Work::Baseline, "raw INSERT + COMMIT calls/s"),
            rate: true,
        },
        Figure {
            name: named("read_cpu_over_floor"),
            what: what("no-op read's server + database CPU ÷ the floor's"),
            target: 1.5,
            at_most: true,
            over: (Work::Read, "bench.read server + database CPU"),
            under: (Work::Floor, "unlisted-tool floor server + database CPU"),
            rate: false,
        },
        Figure {
            name: named("write_over_read"),
            what: what("`note.draft` ÷ `invoice.get` throughput, 0 failures"),
            target: 0.5,
            at_most: false,
            over: (Work::Write, "note.draft calls/s"),
            under: (Work::ErpRead, "invoice.get calls/s"),
            rate: true,
        },
        Figure {
            name: named("through_over_direct"),
            what: what("upstream read through Countersign ÷ called directly"),
            target: 0.5,
            at_most: false,
            over: (Work::Through, "bench.lookup through Countersign calls/s"),
            under: (Work::Direct, "upstream lookup direct calls/s"),
            rate: true,
        },
    ];
    report(runs, &figures);
    let write_failed: usize = runs.of(Work::Write).iter().map(|w| w.failed).sum();
    println!(
        "Writes: {} `note.draft` effects at the demo ERP, {write_failed} failed calls.\n",
        runs.drafted
    );
}

/// Whether the machine was busy before the run: the share of one CPU busy over one second.
fn busy_before() -> f64 {
    let parties = Parties::default();
    let a = parties.read();
    std::thread::sleep(Duration::from_secs(1));
    let spent = Spent::between(&a, &parties.read());
    let other = spent.other.unwrap_or_default() + spent.client.unwrap_or_default();
    other.as_secs_f64() / spent.wall.as_secs_f64()
}

#[tokio::main]
async fn main() {
    if std::env::var_os(UPSTREAM_ENV).is_some() {
        upstream::serve().await;
        return;
    }
    let clients = env_num("BENCH_CLIENTS", 16) as usize;
    let rounds = env_num("BENCH_ROUNDS", 3).max(1) as usize;
    let secs = Duration::from_secs(env_num("BENCH_SECONDS", 10));
    let backends = std::env::var("BENCH_BACKENDS").unwrap_or_else(|_| "postgres,sqlite".into());
    let busy = busy_before();
    if let Ok(sets) = std::env::var("BENCH_ABLATE") {
        ablate::run(&sets, clients, rounds, secs).await;
        print_busy(busy);
        return;
    }
    for name in backends.split(',') {
        let backend = match name.trim() {
            "postgres" => Backend::Postgres,
            "sqlite" => Backend::Sqlite,
            other => panic!("BENCH_BACKENDS: unknown backend {other:?}"),
        };
        let runs = run_backend(backend, clients, rounds, secs).await;
        if std::env::var_os("BENCH_ONLY").is_some() {
            // Some workloads only (profiling one): no figure has both its sides.
            print_table(&runs);
        } else {
            print_backend(&runs);
        }
    }
    print_busy(busy);
}

fn print_busy(busy: f64) {
    println!(
        "Before the run {:.0} % of one CPU was busy with other work{}.\n",
        100.0 * busy,
        if busy > 0.1 {
            ": **the machine was not quiet**, absolute figures are low and ratios noisy"
        } else {
            ""
        }
    );
}
