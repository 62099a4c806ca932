//! The reliability report. `make reliability` (scripts/reliability.sh) runs the ignored test
//! below, which measures and writes `docs/reliability.md` — never edited by hand:
//!
//! 1. every scenario file, played `RELIABILITY_REPEAT` times on each backend;
//! 2. the fault tests (worker killed at each failpoint of the execute sequence, many workers
//!    racing for the same queue), repeated;
//! 3. a soak on Postgres: `RELIABILITY_SOAK_MINUTES` (default 10) of mixed agent traffic
//!    against a `countersign serve` process, with `countersign worker` processes killed with
//!    SIGKILL at random every `RELIABILITY_KILL_EVERY_SECS` (default 30) and replaced.
//!
//! What is counted, from the database and the demo targets (never from the agents' replies):
//! * effects — rows the demo targets applied (`demo_effects`);
//! * duplicated — effects beyond the first with the same system, operation and request (the
//!   same business action applied twice, whatever key it came under), plus keys with more
//!   than one effect;
//! * lost — steps `done` at a demo target whose key has no effect there;
//! * unknown — steps left `unknown` (not reconciled) at the end.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use countersign::adapters::builtin::{ERP, Latency, set_latency};
use countersign::adapters::stillon::{HOLD_OPERATION, STILLON};
use countersign::scenario::{self, Target};
use countersign_core::store::testing::FreshDb;
use countersign_core::{Backend, Bundle, StepStatus, Store, SystemClock, ToolName};
use serde_json::{Value, json};

use crate::helpers::{countersign_on, example, spawn_app_with};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the targets and the steps say.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tally {
    pub(crate) effects: usize,
    pub(crate) duplicated: usize,
    pub(crate) lost: usize,
    pub(crate) unknown: usize,
    pub(crate) by_operation: BTreeMap<String, usize>,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.effects += o.effects;
        self.duplicated += o.duplicated;
        self.lost += o.lost;
        self.unknown += o.unknown;
        for (k, v) in &o.by_operation {
            *self.by_operation.entry(k.clone()).or_default() += v;
        }
    }
}

pub(crate) async fn tally(store: &Store) -> Tally {
    let mut t = Tally::default();
    let mut by_request: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    let mut by_key: BTreeMap<(String, String), usize> = BTreeMap::new();
    for system in [ERP, STILLON] {
        for op in scenario::write_operations(system) {
            for fx in store.demo_effects(system, op).await.unwrap() {
                t.effects += 1;
                *t.by_operation.entry(format!("{system} {op}")).or_default() += 1;
                *by_key
                    .entry((system.to_string(), fx.idem_key.clone()))
                    .or_default() += 1;
                // A hold is part of its move (counted with it), not a business action.
                if *op != HOLD_OPERATION {
                    *by_request
                        .entry((system.to_string(), fx.operation.clone(), fx.request.clone()))
                        .or_default() += 1;
                }
            }
        }
    }
    t.duplicated = by_request.values().map(|n| n - 1).sum::<usize>()
        + by_key.values().map(|n| n - 1).sum::<usize>();
    let bundle = store
        .current_bundle()
        .await
        .unwrap()
        .map(|(_, sources)| Bundle::load(sources).unwrap());
    for step in store
        .steps_in_status(StepStatus::Done, 1_000_000)
        .await
        .unwrap()
    {
        let provider = bundle.as_ref().and_then(|b| {
            ToolName::parse(&step.tool)
                .ok()
                .and_then(|n| b.registry.tool(&n))
                .map(|tool| tool.handler.provider.as_str().to_string())
        });
        let Some(system) = provider.filter(|p| p == ERP || p == STILLON) else {
            continue;
        };
        if step.effect == countersign_core::Effect::Read {
            continue;
        }
        if store
            .demo_effect(&system, &step.idem_key)
            .await
            .unwrap()
            .is_none()
        {
            t.lost += 1;
        }
    }
    t.unknown = usize::try_from(store.count_steps(StepStatus::Unknown).await.unwrap()).unwrap();
    t
}

/// One row of a report table.
struct Row {
    what: String,
    tried: String,
    times: usize,
    failed: usize,
    tally: Tally,
}

fn table(out: &mut String, rows: &[Row]) {
    out.push_str(
        "| what | tried | times | failed | effects | lost | duplicated | unknown left |\n",
    );
    out.push_str("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.what,
            r.tried,
            r.times,
            r.failed,
            r.tally.effects,
            r.tally.lost,
            r.tally.duplicated,
            r.tally.unknown
        );
    }
}

/// Plays every scenario file `repeat` times on each backend.
async fn scenarios(repeat: usize, notes: &mut Vec<String>) -> Vec<Row> {
    let mut rows = Vec::new();
    for (bundle, path) in crate::scenarios::scenario_files() {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let parsed = scenario::load(&path).unwrap();
        let mut row = Row {
            what: format!("`{bundle}/{file}`"),
            tried: parsed
                .description
                .lines()
                .next()
                .filter(|d| !d.is_empty())
                .unwrap_or(&parsed.name)
                .replace('|', "/"),
            times: 0,
            failed: 0,
            tally: Tally::default(),
        };
        let registry = example(&bundle);
        for _ in 0..repeat {
            for backend in [Backend::Sqlite, Backend::Postgres] {
                let Some(app) =
                    spawn_app_with(backend, &[("COUNTERSIGN_REGISTRY", registry.as_str())]).await
                else {
                    panic!("the report needs {backend:?}");
                };
                let clock = app.clock.clone();
                let advance = move |by: chrono::Duration| clock.advance(by);
                let target = Target {
                    url: format!("http://{}", app.addr),
                    origin: None,
                    store: app.store.clone(),
                    advance: Some(&advance),
                };
                row.times += 1;
                match scenario::run(&parsed, &target).await {
                    Ok(report) if report.failures().is_empty() => {}
                    Ok(report) => {
                        row.failed += 1;
                        for f in report.failures() {
                            notes.push(format!("{file} [{backend:?}]: {} — {}", f.name, f.detail));
                        }
                    }
                    Err(e) => {
                        row.failed += 1;
                        notes.push(format!("{file} [{backend:?}]: {e}"));
                    }
                }
                row.tally.add(&tally(&app.store).await);
                app.stop().await;
            }
        }
        eprintln!("reliability: {file} x{}", row.times);
        rows.push(row);
    }
    rows
}

/// The fault tests, repeated: each trial asserts exactly one effect (a failure stops the
/// report loudly), so a finished row is measured, not assumed.
async fn faults(repeat: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    for (point, tried) in [
        (
            "before_call",
            "worker SIGKILL-equivalent abort after reserving the key, before calling the target; restart",
        ),
        (
            "after_start",
            "worker abort right after taking the step with its key; restart",
        ),
        (
            "after_call",
            "worker abort after the target applied the effect, before the commit; restart reconciles by key",
        ),
    ] {
        let mut times = 0;
        for _ in 0..repeat {
            times += crate::runs::crash_at(point).await;
        }
        rows.push(Row {
            what: format!("worker crash at `{point}`"),
            tried: tried.into(),
            times,
            failed: 0,
            // One planned note per trial, each asserted to be exactly one effect.
            tally: Tally {
                effects: times,
                ..Tally::default()
            },
        });
        eprintln!("reliability: crash at {point} x{times}");
    }
    let mut times = 0;
    for _ in 0..repeat {
        times += crate::adapters::forged_annotations_trial().await;
    }
    rows.push(Row {
        what: "forged tool annotations".into(),
        tried: "an upstream MCP server advertises its irreversible `purge` as read-only; the \
                registry's class decides listing, policy, gate and audit; approved, then called \
                twice"
            .into(),
        times,
        failed: 0,
        // Each play asserted nothing upstream before the approval and exactly one purge after.
        tally: Tally {
            effects: times,
            ..Tally::default()
        },
    });
    eprintln!("reliability: forged annotations x{times}");
    let steps = usize::try_from(env_u64("RELIABILITY_RACE_STEPS", 400)).unwrap();
    let registry = example("finance");
    let env = [
        ("COUNTERSIGN_REGISTRY", registry.as_str()),
        ("COUNTERSIGN_WORKERS", "0"),
    ];
    let mut race = Row {
        what: "many workers, one queue".into(),
        tried: format!(
            "4 `countersign worker` processes race for {steps} planned steps (Postgres)"
        ),
        times: 0,
        failed: 0,
        tally: Tally::default(),
    };
    for _ in 0..repeat {
        let app = spawn_app_with(Backend::Postgres, &env)
            .await
            .expect("the report needs Postgres");
        crate::runs::many_workers(&app, 4, steps).await;
        race.times += 1;
        race.tally.add(&tally(&app.store).await);
        app.stop().await;
    }
    rows.push(race);
    rows.push(replica_kills(repeat).await);
    rows
}

/// The replica-kill row: `crate::replicas::replica_kill` played `repeat` times, larger than
/// in `make test` (`RELIABILITY_REPLICA_AGENTS` agents, `RELIABILITY_REPLICA_CALLS` writes
/// each); a play whose checks fail counts as failed, its tally unknown.
async fn replica_kills(repeat: usize) -> Row {
    let agents = usize::try_from(env_u64("RELIABILITY_REPLICA_AGENTS", 8)).unwrap();
    let calls = usize::try_from(env_u64("RELIABILITY_REPLICA_CALLS", 50)).unwrap();
    let latency_ms = env_u64("RELIABILITY_REPLICA_LATENCY_MS", 400);
    let mut row = Row {
        what: "replica kill".into(),
        tried: format!(
            "two `countersign serve` behind a round-robin proxy (Postgres); {agents} agents \
             (half in one MCP session each, half session-less) hold {calls} invoices each, \
             the Python SDK of both eras, a payment gated on one replica and approved on the \
             other; one replica SIGKILLed a third of the way in, holds taking {latency_ms} ms"
        ),
        times: 0,
        failed: 0,
        tally: Tally::default(),
    };
    let (mut calls_made, mut resent, mut failovers) = (0, 0, 0);
    for _ in 0..repeat {
        let played = tokio::spawn(crate::replicas::replica_kill(crate::replicas::Size {
            agents,
            calls,
            latency_ms,
        }))
        .await;
        row.times += 1;
        match played {
            Ok(Some(out)) => {
                eprintln!(
                    "reliability: replica kill: {} calls, {} sent again, {} failovers",
                    out.calls, out.resent, out.failovers
                );
                row.tally.add(&out.tally);
                (calls_made, resent, failovers) = (
                    calls_made + out.calls,
                    resent + out.resent,
                    failovers + out.failovers,
                );
            }
            Ok(None) => panic!("the report needs Postgres"),
            Err(_) => row.failed += 1,
        }
    }
    let _ = write!(
        row.tried,
        "; in all {calls_made} agent calls answered, {resent} sent again by the agent (no \
         answer, or `in_flight` until the step settled), {failovers} requests the proxy sent \
         to the other replica"
    );
    row
}

/// `/proc/<pid>/status` VmRSS in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) struct Child(pub(crate) std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `countersign worker` process (two workers) on database `db`, its Postgres connections
/// tagged `application_name = tag` so the soak can tell when the server side of a killed
/// worker's connections has gone.
fn spawn_worker_as(db: &str, tag: Option<&str>) -> Child {
    let url = match tag {
        Some(tag) => format!(
            "{db}{}application_name={tag}",
            if db.contains('?') { '&' } else { '?' }
        ),
        None => db.to_string(),
    };
    Child(
        countersign_on(&url)
            .env("COUNTERSIGN_RUN_MAX_MINUTES", "1000000000")
            .args(["worker", "--count", "2", "--stale-after", "10"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Waits (up to 10 s) until Postgres has no backend left for connections tagged `tag`: a
/// killed worker's COMMIT already on the wire is still applied by its backend after the
/// process died, so what the worker left `running` is read only once its backends are gone.
async fn backends_gone(pool: &sqlx::PgPool, tag: &str) {
    for _ in 0..200 {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
                .bind(tag)
                .fetch_one(pool)
                .await
                .unwrap();
        if n == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The soak's episode `n` (one agent task), as a scenario.
fn episode(n: u64, invoice: &str) -> (scenario::Scenario, usize) {
    let text = match n % 3 {
        0 => format!(
            r#"
name: soak plan of notes {n}
actors: {{planner: {{role: planner}}}}
steps:
  - as: planner
    call: plan.submit
    arguments:
      task: Soak {n}
      steps:
        - {{tool: note.draft, arguments: {{invoice_id: INV-20260611, text: "soak {n} a"}}, reason: "Soak traffic, note one of three"}}
        - {{tool: note.draft, arguments: {{invoice_id: INV-20260611, text: "soak {n} b"}}, reason: "Soak traffic, note two of three"}}
        - {{tool: note.draft, arguments: {{invoice_id: INV-20260611, text: "soak {n} c"}}, reason: "Soak traffic, note three of three"}}
    save: {{last: /steps/2/step_id}}
  - wait: {{step: "${{last}}", status: done, timeout_ms: 180000}}
expect: {{chain_verifies: false, no_unapproved_effects: false, one_effect_per_key: false}}
"#
        ),
        1 => format!(
            r#"
name: soak payment {n}
actors: {{planner: {{role: planner}}, ana: {{person: ana}}}}
steps:
  - as: planner
    call: plan.submit
    arguments:
      task: Pay {invoice}
      steps:
        - tool: payment.schedule
          arguments: {{invoice_id: {invoice}, amount: 4180.00, currency: EUR, value_date: "2026-06-30", reason: "Soak traffic, approved invoice {invoice}"}}
          reason: Soak traffic, a payment through the gate
    save: {{pay: /steps/0/step_id}}
  - wait: {{step: "${{pay}}", status: needs_approval, timeout_ms: 180000}}
  - as: ana
    decide: {{step: "${{pay}}", verdict: approved, reason: "Soak traffic approval"}}
  - wait: {{step: "${{pay}}", status: done, timeout_ms: 180000}}
expect: {{chain_verifies: false, no_unapproved_effects: false, one_effect_per_key: false}}
"#
        ),
        _ => format!(
            r#"
name: soak direct calls {n}
actors: {{fin: {{role: worker.finance}}}}
steps:
  - {{as: fin, call: invoice.get, arguments: {{invoice_id: INV-20260611}}, reply: {{is_error: false}}}}
  - {{as: fin, call: note.draft, arguments: {{invoice_id: INV-20260611, text: "soak direct {n}"}}, reply: {{is_error: false}}}}
  - {{as: fin, call: note.draft, arguments: {{invoice_id: INV-20260611, text: "soak direct {n}"}}, reply: {{is_error: false}}}}
expect: {{chain_verifies: false, no_unapproved_effects: false, one_effect_per_key: false}}
"#
        ),
    };
    // Agent calls (tools/call) per episode: 1 plan, 1 plan (+ a person's decision), 3 direct.
    let calls = [1, 1, 3][usize::try_from(n % 3).unwrap()];
    (scenario::parse(&text).unwrap(), calls)
}

/// A step a killed worker was executing (`running`, claimed by it) when it was killed.
struct Caught {
    step_id: String,
    idem_key: String,
    /// Whether the target had applied its effect when the worker died.
    effect_at_kill: bool,
}

/// How the caught steps ended.
#[derive(Default)]
struct CaughtEnds {
    /// Effect applied before the kill; the reconciler found it by key: `done`, one effect.
    reconciled_done: usize,
    /// No effect before the kill; the reconciler confirmed it: back to `pending`, run again,
    /// `done` with one effect.
    pending_then_done: usize,
    /// Anything else (each listed under failed checks).
    other: Vec<String>,
}

/// A reader's episode: a fresh agent, its own MCP session, two reads, the session closed —
/// the session churn of many short-lived agents (what would pile up if sessions leaked).
fn reader_episode(n: u64) -> scenario::Scenario {
    scenario::parse(&format!(
        r#"
name: soak reader {n}
actors: {{fin: {{role: worker.finance}}}}
steps:
  - {{as: fin, call: invoice.get, arguments: {{invoice_id: INV-20260611}}, reply: {{is_error: false}}}}
  - {{as: fin, call: po.get, arguments: {{po_id: PO-77812}}, reply: {{is_error: false}}}}
expect: {{chain_verifies: false, no_unapproved_effects: false, one_effect_per_key: false}}
"#
    ))
    .unwrap()
}

struct Soak {
    minutes: u64,
    readers: u64,
    reader_episodes: u64,
    kill_every: u64,
    latency_ms: u64,
    episodes: u64,
    episode_errors: Vec<String>,
    calls: usize,
    planned_steps: i64,
    kills: usize,
    kills_mid_flight: usize,
    kills_caught: usize,
    caught: usize,
    caught_effect_at_kill: usize,
    ends: CaughtEnds,
    rerun: usize,
    tally: Tally,
    statuses: BTreeMap<String, i64>,
    rss_start: u64,
    rss_mid: u64,
    rss_end: u64,
    rss_peak: u64,
    sessions_peak: u64,
    sessions_end: Option<u64>,
    chain_ok: bool,
    reconciled: usize,
}

/// The `countersign_mcp_sessions` gauge of the server at `base`.
async fn open_sessions(http: &reqwest::Client, base: &str) -> Option<u64> {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("countersign_mcp_sessions "))
        .and_then(|n| n.trim().parse().ok())
}

/// The `running` steps claimed by a worker of process `pid` (worker ids are
/// `host:pid:index`).
async fn running_on(pool: &sqlx::PgPool, pid: u32) -> Vec<(String, String)> {
    sqlx::query_as("SELECT id, idem_key FROM steps WHERE status = 'running' AND claimed_by LIKE $1")
        .bind(format!("%:{pid}:%"))
        .fetch_all(pool)
        .await
        .unwrap()
}

/// How each caught step ended: its final status, its effects under its key, and what the
/// reconciler recorded about it.
async fn caught_ends(
    store: &Store,
    records: &[countersign_core::audit::AuditRecord],
    caught: &[Caught],
) -> CaughtEnds {
    let mut ends = CaughtEnds::default();
    for c in caught {
        let step = store.get_step(&c.step_id).await.unwrap();
        let effects = store
            .demo_effects(ERP, "notes.draft")
            .await
            .unwrap()
            .into_iter()
            .chain(store.demo_effects(ERP, "payments.schedule").await.unwrap())
            .filter(|fx| fx.idem_key == c.idem_key)
            .count();
        let found: Vec<bool> = records
            .iter()
            .filter(|r| r.event == "reconciled" && r.step_id.as_deref() == Some(&c.step_id))
            .filter_map(|r| serde_json::from_str::<Value>(&r.record).ok())
            .filter_map(|v| v["detail"]["found"].as_bool())
            .collect();
        let done_once = step.status == StepStatus::Done && effects == 1;
        match (c.effect_at_kill, found.as_slice()) {
            (true, [true]) if done_once => ends.reconciled_done += 1,
            (false, [false]) if done_once && step.attempts >= 2 => ends.pending_then_done += 1,
            _ => ends.other.push(format!(
                "step {} ({}): effect at kill {}, reconciled found {found:?}, ended `{}` after \
                 {} attempts with {effects} effect(s)",
                c.step_id,
                step.tool,
                c.effect_at_kill,
                step.status.as_str(),
                step.attempts
            )),
        }
    }
    ends
}

async fn soak(minutes: u64, kill_every: u64, agents: u64, readers: u64, latency_ms: u64) -> Soak {
    let db = FreshDb::create(Backend::Postgres)
        .await
        .expect("the soak needs Postgres");
    let url = db.url.expose().clone();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let registry = example("finance");
    let server = Child(
        countersign_on(&url)
            .env("COUNTERSIGN_LISTEN", format!("127.0.0.1:{port}"))
            .env("COUNTERSIGN_REGISTRY", &registry)
            .env("COUNTERSIGN_WORKERS", "0")
            .arg("serve")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let http = reqwest::Client::new();
    let began = Instant::now();
    loop {
        if let Ok(r) = http.get(format!("{base}/healthz")).send().await
            && r.status().is_success()
        {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "serve never came up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let store = db.store(std::sync::Arc::new(SystemClock)).await;
    // Approved invoices to pay, one per payment episode (an invoice is paid once).
    let template = store
        .demo_get(ERP, "invoice", "INV-20260611")
        .await
        .unwrap()
        .unwrap();
    let mut inv: Value = serde_json::from_str(&template.data).unwrap();
    let invoices = 2000;
    for i in 0..invoices {
        let id = format!("INV-3{i:07}");
        inv["invoice_id"] = json!(id);
        inv["text"] = json!("Soak invoice.");
        store
            .demo_seed(ERP, "invoice", &id, "acme", &inv.to_string())
            .await
            .unwrap();
    }
    // The targets take their time, as real ones do: half of it before the effect is applied,
    // half after (before the answer), so a kill lands mid-call on either side of the effect.
    for op in ["notes.draft", "payments.schedule"] {
        set_latency(
            &store,
            ERP,
            op,
            Latency {
                before_ms: latency_ms / 2,
                after_ms: latency_ms - latency_ms / 2,
            },
        )
        .await
        .unwrap();
    }
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let rss_start = rss_kib(server.0.id()).unwrap_or(0);
    let mut rss_peak = rss_start;
    let mut rss_mid = 0;
    let mut sessions_peak = 0;
    let mut spawned = 0u64;
    let mut tagged = |url: &str| {
        spawned += 1;
        let tag = format!("soak-worker-{spawned}");
        (spawn_worker_as(url, Some(&tag)), tag)
    };
    let mut workers: Vec<(Child, String)> = (0..3).map(|_| tagged(&url)).collect();
    let deadline = Instant::now() + Duration::from_secs(minutes * 60);

    let counter = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..agents {
        let counter = counter.clone();
        let store = store.clone();
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            let mut calls = 0usize;
            let mut errors = Vec::new();
            let mut episodes = 0u64;
            while Instant::now() < deadline {
                let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let invoice = format!("INV-3{:07}", (n / 3) % invoices);
                let (ep, c) = episode(n, &invoice);
                let target = Target {
                    url: base.clone(),
                    origin: None,
                    store: store.clone(),
                    advance: None,
                };
                episodes += 1;
                calls += c;
                match scenario::run(&ep, &target).await {
                    Ok(r) if r.failures().is_empty() => {}
                    Ok(r) => errors.push(format!("{}: {:?}", ep.name, r.failures())),
                    Err(e) => errors.push(format!("{}: {e}", ep.name)),
                }
            }
            (episodes, calls, errors)
        }));
    }
    let mut reader_tasks = Vec::new();
    for _ in 0..readers {
        let counter = counter.clone();
        let store = store.clone();
        let base = base.clone();
        reader_tasks.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            let mut episodes = 0u64;
            while Instant::now() < deadline {
                let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let ep = reader_episode(n);
                let target = Target {
                    url: base.clone(),
                    origin: None,
                    store: store.clone(),
                    advance: None,
                };
                episodes += 1;
                match scenario::run(&ep, &target).await {
                    Ok(r) if r.failures().is_empty() => {}
                    Ok(r) => errors.push(format!("{}: {:?}", ep.name, r.failures())),
                    Err(e) => errors.push(format!("{}: {e}", ep.name)),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (episodes, errors)
        }));
    }
    let mut kills = 0;
    let mut kills_mid_flight = 0;
    let mut kills_caught = 0;
    let mut caught: Vec<Caught> = Vec::new();
    let half_time = Instant::now() + Duration::from_secs(minutes * 30);
    let mut next_kill = Instant::now() + Duration::from_secs(kill_every);
    let mut next_sample = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if Instant::now() >= next_sample {
            let rss = rss_kib(server.0.id()).unwrap_or(0);
            rss_peak = rss_peak.max(rss);
            if rss_mid == 0 && Instant::now() >= half_time {
                rss_mid = rss;
            }
            sessions_peak = sessions_peak.max(open_sessions(&http, &base).await.unwrap_or(0));
            next_sample += Duration::from_secs(5);
        }
        if Instant::now() >= next_kill {
            let i =
                usize::try_from(uuid::Uuid::new_v4().as_u128() % workers.len() as u128).unwrap();
            if store.count_steps(StepStatus::Running).await.unwrap() > 0 {
                kills_mid_flight += 1;
            }
            // Child::kill is SIGKILL on Unix: no clean shutdown, steps left mid-flight.
            let pid = workers[i].0.0.id();
            let (mut victim, tag) = std::mem::replace(&mut workers[i], tagged(&url));
            let _ = victim.0.kill();
            let _ = victim.0.wait();
            kills += 1;
            // What it was doing when it died (it can do nothing more now, once Postgres has
            // finished what the process had already sent).
            backends_gone(&pool, &tag).await;
            let in_flight = running_on(&pool, pid).await;
            if !in_flight.is_empty() {
                kills_caught += 1;
            }
            for (step_id, idem_key) in in_flight {
                let effect_at_kill = store.demo_effect(ERP, &idem_key).await.unwrap().is_some();
                caught.push(Caught {
                    step_id,
                    idem_key,
                    effect_at_kill,
                });
            }
            next_kill += Duration::from_secs(kill_every);
        }
    }
    let mut episodes = 0;
    let mut calls = 0;
    let mut episode_errors = Vec::new();
    for t in tasks {
        let (e, c, errs) = t.await.unwrap();
        episodes += e;
        calls += c;
        episode_errors.extend(errs);
    }
    let mut reader_episodes = 0;
    for t in reader_tasks {
        let (e, errs) = t.await.unwrap();
        reader_episodes += e;
        calls += 2 * usize::try_from(e).unwrap();
        episode_errors.extend(errs);
    }
    // Quiesce: workers (and their reconcilers) finish what is left.
    let began = Instant::now();
    loop {
        let mut open = 0;
        for s in [
            StepStatus::Pending,
            StepStatus::Running,
            StepStatus::Unknown,
        ] {
            open += store.count_steps(s).await.unwrap();
        }
        if open == 0 || began.elapsed() > Duration::from_secs(180) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Sessions the agents closed are gone; none is left for rmcp's idle expiry.
    let sessions_end = open_sessions(&http, &base).await;
    let rss_end = rss_kib(server.0.id()).unwrap_or(0);
    rss_peak = rss_peak.max(rss_end);
    drop(workers);
    let t = tally(&store).await;
    let mut statuses = BTreeMap::new();
    for s in [
        StepStatus::Pending,
        StepStatus::Running,
        StepStatus::NeedsApproval,
        StepStatus::Done,
        StepStatus::Failed,
        StepStatus::Refused,
        StepStatus::Unknown,
        StepStatus::Cancelled,
        StepStatus::Expired,
    ] {
        statuses.insert(s.as_str().to_string(), store.count_steps(s).await.unwrap());
    }
    let records = store.audit_in_order(0, 10_000_000).await.unwrap();
    let reconciled = records.iter().filter(|r| r.event == "reconciled").count();
    let planned_steps = records.iter().filter(|r| r.event == "started").count();
    let ends = caught_ends(&store, &records, &caught).await;
    let chain_ok = store.verify_audit().await.unwrap().is_ok();
    let rerun = store
        .steps_in_status(StepStatus::Done, 10_000_000)
        .await
        .unwrap()
        .iter()
        .filter(|s| s.attempts > 1)
        .count();
    drop(server);
    pool.close().await;
    store.close().await;
    db.drop_db().await;
    Soak {
        minutes,
        readers,
        reader_episodes,
        kill_every,
        latency_ms,
        episodes,
        episode_errors,
        calls,
        planned_steps: i64::try_from(planned_steps).unwrap(),
        kills,
        kills_mid_flight,
        kills_caught,
        caught_effect_at_kill: caught.iter().filter(|c| c.effect_at_kill).count(),
        caught: caught.len(),
        ends,
        rerun,
        tally: t,
        statuses,
        rss_start,
        rss_mid,
        rss_end,
        rss_peak,
        sessions_peak,
        sessions_end,
        chain_ok,
        reconciled,
    }
}

#[tokio::test]
#[ignore = "run by `make reliability` (minutes); writes docs/reliability.md"]
async fn reliability_report() {
    let repeat = usize::try_from(env_u64("RELIABILITY_REPEAT", 3)).unwrap();
    let minutes = env_u64("RELIABILITY_SOAK_MINUTES", 10);
    let kill_every = env_u64("RELIABILITY_KILL_EVERY_SECS", 30);
    let agents = env_u64("RELIABILITY_AGENTS", 4);
    let latency_ms = env_u64("RELIABILITY_TARGET_LATENCY_MS", 2000);
    let readers = env_u64("RELIABILITY_READERS", 2);
    // RELIABILITY_CONCURRENT=1 plays the scenarios and fault tests while the soak runs (on
    // the same machine, each on its own database) instead of after it.
    let concurrent = env_u64("RELIABILITY_CONCURRENT", 0) == 1;
    let path = std::env::var("RELIABILITY_OUT")
        .unwrap_or_else(|_| format!("{}/../docs/reliability.md", env!("CARGO_MANIFEST_DIR")));
    let render = |s: &Soak,
                  scenario_rows: &[Row],
                  fault_rows: &[Row],
                  notes: &[String],
                  done: bool| {
        let mut out = String::new();
        out.push_str("# Reliability report\n\n");
        out.push_str(
        "Generated by `make reliability` (`scripts/reliability.sh`, which runs the ignored test \
         `reliability::reliability_report` in `server/tests/it/reliability.rs`). Do not edit by \
         hand: run it again.\n\n",
    );
        let _ = writeln!(
            out,
            "- run: {} on {} ({} CPUs), commit `{}`",
            std::env::var("RELIABILITY_DATE").unwrap_or_else(|_| "(date not given)".into()),
            std::env::var("RELIABILITY_HOST").unwrap_or_else(|_| "(host not given)".into()),
            std::thread::available_parallelism().map_or(0, usize::from),
            std::env::var("RELIABILITY_COMMIT").unwrap_or_else(|_| "(not given)".into()),
        );
        if !done {
            out.push_str("**Provisional: written after the soak; the scenarios and fault tests were still running.**\n\n");
        }
        if concurrent {
            out.push_str("- the scenarios and fault tests were played while the soak ran (`RELIABILITY_CONCURRENT=1`), each on its own database\n");
        }
        let _ = writeln!(
            out,
            "- settings: `RELIABILITY_REPEAT={repeat}` `RELIABILITY_SOAK_MINUTES={minutes}` \
         `RELIABILITY_KILL_EVERY_SECS={kill_every}` `RELIABILITY_AGENTS={agents}` \
         `RELIABILITY_READERS={readers}` `RELIABILITY_TARGET_LATENCY_MS={latency_ms}` (debug \
         build)\n"
        );
        out.push_str(
        "Counted from the database and the demo targets, never from agents' replies: **effects** \
         are the writes the targets applied; **lost** are steps `done` at a target with no \
         effect under their key; **duplicated** are effects beyond the first with the same \
         operation and request (the same business action applied twice, under any key) plus keys \
         with more than one effect; **unknown left** are steps still `unknown` at the end. \
         **failed** counts plays with any failed check (listed below the tables).\n\n",
    );
        out.push_str("## Scenarios\n\nEach file played on a fresh server, on SQLite and on Postgres, every expectation checked (audit trail, target effects, the chain, no effect without an approval where a person was asked, one effect per key).\n\n");
        table(&mut out, scenario_rows);
        out.push_str("\n## Fault tests\n\nReal `countersign worker` processes, real upstream targets. Each crash trial runs on both backends and asserts exactly one effect and one `reconciled` record after the restart (seed 002's \"worker crash after external success\" is the `after_call` row); the forged-annotations trial (seed 002's \"forged tool annotations from an upstream MCP server\") runs on both backends against an upstream MCP server and asserts no call before the approval and exactly one after it.\n\n");
        table(&mut out, fault_rows);
        let _ = writeln!(
            out,
            "\n## Soak: {} min on Postgres, workers killed every {} s\n",
            s.minutes, s.kill_every
        );
        let _ = writeln!(
            out,
            "One `countersign serve` process (no in-process workers) and three `countersign worker \
         --count 2` processes on one Postgres database; {agents} scripted agents loop over \
         episodes (a plan of three notes; a planned payment approved by a person through the \
         approval API; direct reads and a repeated write) and {} readers loop over short \
         episodes (a fresh agent, two reads), each agent closing its MCP session \
         (`DELETE /mcp`) when its episode ends. The ERP's writes (`notes.draft`, \
         `payments.schedule`) take {} ms each, half before the effect is applied and half \
         after, so a worker is killed mid-call, on either side of the effect. Every {} s a \
         random worker is killed with SIGKILL and replaced; the steps it was running at that \
         moment are followed to their end. Afterwards the workers get up to 180 s to finish \
         and reconcile.\n",
            s.readers, s.latency_ms, s.kill_every
        );
        out.push_str("| measure | value |\n| --- | ---: |\n");
        let mut line = |k: &str, v: String| {
            let _ = writeln!(out, "| {k} | {v} |");
        };
        line("episodes played (agents)", s.episodes.to_string());
        line("episodes played (readers)", s.reader_episodes.to_string());
        line("agent calls (`tools/call`)", s.calls.to_string());
        line(
            "steps started (every attempt, server and workers)",
            s.planned_steps.to_string(),
        );
        line("workers killed (SIGKILL)", s.kills.to_string());
        line(
            "…of which with a step `running` somewhere at that moment",
            s.kills_mid_flight.to_string(),
        );
        line(
            "…of which the killed worker was running a step (caught in flight)",
            s.kills_caught.to_string(),
        );
        line("steps caught in flight", s.caught.to_string());
        line(
            "&nbsp;&nbsp;…the target had applied the effect at the kill",
            s.caught_effect_at_kill.to_string(),
        );
        line(
            "&nbsp;&nbsp;…the target had not applied it yet",
            (s.caught - s.caught_effect_at_kill).to_string(),
        );
        line(
            "caught steps reconciled to `done` (effect found by key), one effect",
            s.ends.reconciled_done.to_string(),
        );
        line(
            "caught steps back to `pending` (no effect found), then `done` once",
            s.ends.pending_then_done.to_string(),
        );
        line(
            "**caught steps that ended any other way**",
            s.ends.other.len().to_string(),
        );
        line(
            "steps done after more than one attempt",
            s.rerun.to_string(),
        );
        line("effects at the targets", s.tally.effects.to_string());
        for (op, n) in &s.tally.by_operation {
            line(&format!("&nbsp;&nbsp;{op}"), n.to_string());
        }
        line("**duplicated**", s.tally.duplicated.to_string());
        line("**lost**", s.tally.lost.to_string());
        line("**unknown left unreconciled**", s.tally.unknown.to_string());
        line("`reconciled` audit records", s.reconciled.to_string());
        for (status, n) in &s.statuses {
            line(&format!("steps `{status}` at the end"), n.to_string());
        }
        line("audit chain verifies", s.chain_ok.to_string());
        line(
            "episodes that failed a check",
            s.episode_errors.len().to_string(),
        );
        line("server RSS at start (KiB)", s.rss_start.to_string());
        line("server RSS half-way (KiB)", s.rss_mid.to_string());
        line("server RSS at end (KiB)", s.rss_end.to_string());
        line(
            "server RSS peak (KiB, sampled every 5 s)",
            s.rss_peak.to_string(),
        );
        line(
            "MCP sessions open, peak (sampled every 5 s)",
            s.sessions_peak.to_string(),
        );
        line(
            "MCP sessions open at the end",
            s.sessions_end
                .map_or_else(|| "(not reported)".into(), |n| n.to_string()),
        );
        if notes.is_empty() && s.episode_errors.is_empty() && s.ends.other.is_empty() {
            out.push_str("\nNo play failed a check.\n");
        } else {
            out.push_str("\n## Failed checks\n\n");
            for n in notes
                .iter()
                .chain(s.ends.other.iter())
                .chain(s.episode_errors.iter().take(20))
            {
                let _ = writeln!(out, "- {}", n.replace('\n', " "));
            }
        }
        out
    };
    let soak_part = async {
        eprintln!("reliability: soak {minutes} min");
        let s = soak(minutes, kill_every, agents, readers, latency_ms).await;
        eprintln!(
            "reliability: soak done: {} kills, {} caught in flight, {} other endings, lost {} \
             duplicated {} unknown {}",
            s.kills,
            s.kills_caught,
            s.ends.other.len(),
            s.tally.lost,
            s.tally.duplicated,
            s.tally.unknown
        );
        std::fs::write(&path, render(&s, &[], &[], &[], false)).unwrap();
        s
    };
    let plays = async {
        let mut notes = Vec::new();
        let scenario_rows = scenarios(repeat, &mut notes).await;
        let fault_rows = faults(repeat).await;
        (scenario_rows, fault_rows, notes)
    };
    // The soak first (the longest part, whose failure should show soonest), or alongside.
    let (s, (scenario_rows, fault_rows, notes)) = if concurrent {
        tokio::join!(soak_part, plays)
    } else {
        let s = soak_part.await;
        (s, plays.await)
    };
    let out = render(&s, &scenario_rows, &fault_rows, &notes, true);
    std::fs::write(&path, &out).unwrap();
    eprintln!("{out}");
    let bad = scenario_rows
        .iter()
        .chain(fault_rows.iter())
        .map(|r| r.tally.lost + r.tally.duplicated + r.tally.unknown)
        .sum::<usize>()
        + s.tally.lost
        + s.tally.duplicated
        + s.tally.unknown
        + s.ends.other.len()
        + fault_rows.iter().map(|r| r.failed).sum::<usize>();
    assert_eq!(
        bad, 0,
        "lost, duplicated or unreconciled effects: see {path}"
    );
    assert!(s.chain_ok, "the audit chain does not verify after the soak");
}

/// The report's counters count: the same business action applied under two keys is one
/// duplicate (a tally that always said 0 would make the report worthless).
#[tokio::test]
async fn reliability_tally_counts_a_duplicated_effect() {
    use countersign_core::store::DemoEffect;
    let registry = example("finance");
    let Some(app) = spawn_app_with(
        Backend::Sqlite,
        &[("COUNTERSIGN_REGISTRY", registry.as_str())],
    )
    .await
    else {
        return;
    };
    let clean = tally(&app.store).await;
    assert_eq!((clean.effects, clean.duplicated, clean.lost), (0, 0, 0));
    for key in ["idem:a", "idem:b"] {
        app.store
            .demo_apply(
                &DemoEffect {
                    system: ERP.into(),
                    idem_key: key.into(),
                    operation: "notes.draft".into(),
                    request: r#"{"invoice_id":"INV-20260611","text":"twice"}"#.into(),
                    result: "{}".into(),
                    at: 0,
                },
                &[],
            )
            .await
            .unwrap();
    }
    let t = tally(&app.store).await;
    assert_eq!(t.effects, 2);
    assert_eq!(t.duplicated, 1, "{t:?}");
    assert_eq!(t.by_operation.get("erp notes.draft"), Some(&2));
    app.stop().await;
}

async fn sessions_gauge(app: &crate::helpers::TestApp) -> u64 {
    open_sessions(&app.client, &format!("http://{}", app.addr))
        .await
        .expect("/metrics reports countersign_mcp_sessions")
}

/// A client's `DELETE /mcp` frees its session at once (the gauge drops, the id is dead),
/// and the scenario runner — the soak's agents — closes every session it opened.
#[tokio::test]
async fn reliability_closed_mcp_sessions_are_freed() {
    use crate::mcp::{Client, agent};
    let registry = example("finance");
    let Some(app) = spawn_app_with(
        Backend::Sqlite,
        &[("COUNTERSIGN_REGISTRY", registry.as_str())],
    )
    .await
    else {
        return;
    };
    assert_eq!(sessions_gauge(&app).await, 0);
    let (_, token) = agent(&app, "closer", "worker.finance").await;
    let mut client = Client::new(&app, &token);
    client.connect().await;
    assert_eq!(sessions_gauge(&app).await, 1);
    let session = client.session().unwrap();
    let delete = app
        .client
        .delete(app.url("/mcp"))
        .bearer_auth(&token)
        .header("Mcp-Session-Id", &session)
        .header("MCP-Protocol-Version", "2025-06-18")
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), reqwest::StatusCode::NO_CONTENT);
    assert_eq!(sessions_gauge(&app).await, 0, "a closed session is freed");
    let (status, _) = client.try_request("tools/list", json!({})).await;
    assert_eq!(
        status,
        reqwest::StatusCode::NOT_FOUND,
        "a closed session's id is dead"
    );

    let (ep, _) = episode(2, "INV-20260611");
    let target = Target {
        url: format!("http://{}", app.addr),
        origin: None,
        store: app.store.clone(),
        advance: None,
    };
    let report = scenario::run(&ep, &target).await.unwrap();
    assert!(report.failures().is_empty(), "{:?}", report.failures());
    assert!(
        report
            .checks
            .iter()
            .any(|c| c.name == "sessions closed" && c.ok)
    );
    assert_eq!(
        sessions_gauge(&app).await,
        0,
        "the scenario closed its sessions"
    );
    app.stop().await;
}

/// The demo targets' latency knob: the effect is applied after `before_ms`, the answer comes
/// `after_ms` later; the soak relies on it to kill workers mid-call.
#[tokio::test]
async fn reliability_demo_latency_holds_a_call_on_both_sides_of_its_effect() {
    use crate::mcp::{Client, agent};
    let registry = example("finance");
    let Some(app) = spawn_app_with(
        Backend::Sqlite,
        &[("COUNTERSIGN_REGISTRY", registry.as_str())],
    )
    .await
    else {
        return;
    };
    set_latency(
        &app.store,
        ERP,
        "notes.draft",
        Latency {
            before_ms: 300,
            after_ms: 3000,
        },
    )
    .await
    .unwrap();
    let (_, token) = agent(&app, "slowpoke", "worker.finance").await;
    let mut client = Client::new(&app, &token);
    client.connect().await;
    let began = Instant::now();
    let mut call = Box::pin(client.call(
        "note.draft",
        json!({"invoice_id": "INV-20260611", "text": "slow note"}),
    ));
    // Watch the target while the call is in flight: its effect shows up before the answer.
    let mut effect_seen_at = None;
    let reply = loop {
        tokio::select! {
            reply = &mut call => break reply,
            () = tokio::time::sleep(Duration::from_millis(20)) => {
                if effect_seen_at.is_none()
                    && !app.store.demo_effects(ERP, "notes.draft").await.unwrap().is_empty()
                {
                    effect_seen_at = Some(began.elapsed());
                }
            }
        }
    };
    assert_eq!(reply["result"]["isError"], json!(false), "{reply}");
    let seen = effect_seen_at.expect("the effect was applied while the answer was held back");
    assert!(
        seen >= Duration::from_millis(300),
        "effect after before_ms: {seen:?}"
    );
    assert!(began.elapsed() >= Duration::from_millis(3300));
    assert_eq!(
        app.store
            .demo_effects(ERP, "notes.draft")
            .await
            .unwrap()
            .len(),
        1
    );
    drop(call);
    app.stop().await;
}
