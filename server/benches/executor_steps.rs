//! Executor throughput (issue 5): planned steps executed per second by 1, 4 and 16
//! `countersign::executor::work_once` loops on Postgres against a no-op adapter, next to a raw
//! SQL baseline doing the same claim and completion statements in a bare sqlx loop, in the same
//! run, with the ratio per worker count.
//!
//! * Steps: `plan.submit` (over `/mcp`, as a planner) of runs of 20 `bench.noop` steps — a
//!   `write` tool added to the finance example for this bench, served by the built-in `noop`
//!   provider, which answers at once and touches nothing — so what is measured is the executor:
//!   claim, policy, key reservation, status changes and audit records. `BENCH_STEP_TOOL`
//!   picks another tool: `invoice.get` (a read against the demo ERP: one indexed read, no key
//!   reservation) or `note.draft` (a write to the demo ERP, which numbers notes by counting all
//!   of them, so concurrent drafts collide and are retried with backoff; that measures the demo
//!   target, not the executor). Each configuration executes `BENCH_STEPS` (default 2,000)
//!   fresh steps.
//! * Ours: every step goes through the whole executor path — emergency-stop check, claim
//!   (`FOR UPDATE SKIP LOCKED`), run bounds, policy again, key reservation, the adapter, the
//!   status change with its audit records, release, settling the run.
//! * Baseline: the same claim statement, then one `UPDATE … SET status = 'done'` completing
//!   the step, each autocommitted, through a 16-connection sqlx `PgPool`, on steps seeded the
//!   same way.
//!
//! Run with `cargo bench -p countersign --bench executor_steps` (`BENCH_STEPS=200` for a quick
//! check). Prints a markdown section on stdout; progress on stderr. Target: ≥ 60 % of the
//! baseline at 4 workers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Mcp, Server, env_num, fresh_postgres, pct};
use countersign::executor::{Timings, work_once};
use countersign_core::StepStatus;
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

const INVOICE: &str = "INV-20260611";
const PLAN_STEPS: usize = 20;

/// The claim statement of `Store::claim_step` on Postgres (the baseline repeats it verbatim).
const CLAIM: &str = "UPDATE steps SET claimed_by = $1, lease_until = $2 WHERE id = (
       SELECT s.id FROM steps s JOIN runs r ON r.id = s.run_id
       WHERE s.status = 'pending' AND r.planned AND r.status = 'active'
         AND s.not_before <= $3 AND (s.lease_until IS NULL OR s.lease_until < $3)
         AND NOT EXISTS (SELECT 1 FROM steps e WHERE e.run_id = s.run_id
                         AND e.seq < s.seq AND e.status <> 'done')
       ORDER BY s.not_before, s.created_at, s.seq LIMIT 1 FOR UPDATE OF s SKIP LOCKED)
     RETURNING id";

/// Completes a claimed step: done, outcome recorded, attempt counted, lease released.
const COMPLETE: &str = "UPDATE steps SET status = 'done', outcome = $1, attempts = attempts + 1,
       updated_at = $2, claimed_by = NULL, lease_until = NULL
     WHERE id = $3 AND claimed_by = $4";

/// The no-op tool this bench adds to the finance example.
const NOOP_TOOL: &str = "bench.noop";

/// The finance example plus the `noop` provider and [`NOOP_TOOL`], in a fresh folder.
fn bench_registry() -> std::path::PathBuf {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/finance");
    let dir = std::env::temp_dir().join(format!("cs-bench-registry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["policy.cedar", "policy.cedarschema"] {
        std::fs::copy(example.join(file), dir.join(file)).unwrap();
    }
    let yaml = std::fs::read_to_string(example.join("registry.yaml")).unwrap();
    assert!(yaml.contains("\nproviders:\n") && yaml.contains("\ntools:\n"));
    let yaml = yaml
        .replacen(
            "\nproviders:\n",
            "\nproviders:\n  noop:\n    kind: builtin\n    description: Does nothing (executor benchmark).\n",
            1,
        )
        .replacen(
            "\ntools:\n",
            &format!(
                "\ntools:\n  {NOOP_TOOL}:\n    title: Benchmark no-op\n    description: Does nothing at the no-op system (executor benchmark).\n    effect: write\n    gate: never\n    roles: [worker.finance]\n    handler: {{provider: noop, operation: noop.touch}}\n    inputSchema:\n      type: object\n      additionalProperties: false\n      required: [n]\n      properties:\n        n: {{type: integer, minimum: 0, maximum: 1000000000}}\n\n"
            ),
            1,
        );
    std::fs::write(dir.join("registry.yaml"), yaml).unwrap();
    dir
}

/// Submits plans totalling `steps` steps of `tool`; `tag` keeps texts distinct across rounds.
async fn seed(planner: &mut Mcp, tool: &str, steps: usize, tag: &str) {
    // A fresh MCP session per round: the server forgets sessions idle for minutes, and a
    // round of workers can take that long.
    planner.connect().await;
    let mut left = steps;
    let mut plan = 0;
    while left > 0 {
        let n = left.min(PLAN_STEPS);
        let items: Vec<Value> = (0..n)
            .map(|i| {
                let arguments = if tool == "note.draft" {
                    json!({"invoice_id": INVOICE, "text": format!("bench {tag} {plan}-{i}")})
                } else if tool == NOOP_TOOL {
                    json!({"n": plan * PLAN_STEPS + i})
                } else {
                    json!({"invoice_id": INVOICE})
                };
                json!({"tool": tool, "arguments": arguments,
                       "reason": "Executor benchmark: read the invoice before paying", "evidence": [INVOICE]})
            })
            .collect();
        let result = planner
            .call(
                "plan.submit",
                json!({"task": format!("bench {tag} {plan}"), "steps": items}),
            )
            .await;
        assert_eq!(
            result["structuredContent"]["steps"]
                .as_array()
                .map(Vec::len),
            Some(n),
            "{result}"
        );
        left -= n;
        plan += 1;
    }
}

/// `workers` executor loops until no step is left; (steps executed, elapsed).
async fn ours(server: &Server, workers: usize) -> (u64, Duration) {
    let began = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let state = server.state.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("bench-worker-{w}");
            let mut done = 0_u64;
            loop {
                if work_once(&state, &id, Timings::default()).await.unwrap() {
                    done += 1;
                    continue;
                }
                // Nothing ready: finished, or a retry waits out its backoff.
                if state.store.count_steps(StepStatus::Pending).await.unwrap() == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            done
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    (total, began.elapsed())
}

/// The same claim + completion statements in a bare sqlx loop per worker.
async fn baseline(pool: &PgPool, workers: usize, now: i64) -> (u64, Duration) {
    let began = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("raw-worker-{w}");
            let mut done = 0_u64;
            loop {
                let claimed: Option<String> = sqlx::query_scalar(CLAIM)
                    .bind(&id)
                    .bind(now + 60_000)
                    .bind(now)
                    .fetch_optional(&pool)
                    .await
                    .unwrap();
                let Some(step) = claimed else { break };
                let n = sqlx::query(COMPLETE)
                    .bind(r#"{"answer":{"status":"drafted"}}"#)
                    .bind(now)
                    .bind(&step)
                    .bind(&id)
                    .execute(&pool)
                    .await
                    .unwrap()
                    .rows_affected();
                assert_eq!(n, 1, "step {step} completed once");
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    (total, began.elapsed())
}

#[tokio::main]
async fn main() {
    let steps = env_num("BENCH_STEPS", 2_000) as usize;
    let tool = std::env::var("BENCH_STEP_TOOL").unwrap_or_else(|_| NOOP_TOOL.into());
    let tool = tool.as_str();
    let db = fresh_postgres().await;
    let registry = bench_registry();
    let server = Server::start_with(&db, registry.to_str().unwrap()).await;
    let store = server.state.store.clone();
    let token = server.agent("bench-planner", "planner").await;
    let mut planner = Mcp::new(server.addr, &token);
    planner.connect().await;
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect(db.url.expose())
        .await
        .unwrap();
    eprintln!("executor_steps: {steps} {tool} steps per configuration");

    // Warm-up: a small round through both paths (connections, caches, plans).
    seed(&mut planner, tool, 100, "warm-ours").await;
    ours(&server, 4).await;
    seed(&mut planner, tool, 100, "warm-raw").await;
    baseline(&pool, 4, store.clock().now_ms()).await;

    let mut rows = Vec::new();
    for workers in [1_usize, 4, 16] {
        seed(&mut planner, tool, steps, &format!("ours-{workers}")).await;
        // plan.submit is itself a step of the planner's session run: count after seeding.
        let expected_done = store.count_steps(StepStatus::Done).await.unwrap() + steps as i64;
        let (n_ours, t_ours) = ours(&server, workers).await;
        assert!(n_ours as usize >= steps, "every seeded step executed");
        assert_eq!(
            store.count_steps(StepStatus::Done).await.unwrap(),
            expected_done,
            "every step done, none twice"
        );
        seed(&mut planner, tool, steps, &format!("raw-{workers}")).await;
        let (n_raw, t_raw) = baseline(&pool, workers, store.clock().now_ms()).await;
        assert_eq!(n_raw as usize, steps, "every seeded step completed");
        let ours_per_s = steps as f64 / t_ours.as_secs_f64();
        let raw_per_s = n_raw as f64 / t_raw.as_secs_f64();
        eprintln!("  {workers} workers: ours {ours_per_s:.0}/s, raw {raw_per_s:.0}/s");
        rows.push((workers, ours_per_s, raw_per_s));
    }
    assert_eq!(
        store.count_steps(StepStatus::Running).await.unwrap(),
        0,
        "no step left running"
    );
    pool.close().await;
    server.stop().await;
    db.drop_db().await;
    let _ = std::fs::remove_dir_all(&registry);

    println!("### Executor steps per second (issue 5)\n");
    println!(
        "{steps} planned `{tool}` steps per configuration (runs of {PLAN_STEPS}, submitted \
         with `plan.submit`), executed by N `executor::work_once` loops on Postgres against {}; \
         each step is claimed, decided again, executed, recorded \
         with its audit records, released, and its run settled. Baseline in the same run: the same claim statement \
         (`FOR UPDATE SKIP LOCKED`) plus one completing `UPDATE`, in a bare sqlx loop per \
         worker over a 16-connection pool, on steps seeded the same way.\n",
        if tool == NOOP_TOOL {
            "the built-in no-op adapter (a write: its key is reserved)"
        } else {
            "the built-in demo ERP adapter"
        }
    );
    println!(
        "| workers | executor steps/s | raw claim + complete steps/s | executor vs baseline |"
    );
    println!("|---:|---:|---:|---:|");
    for (w, o, r) in &rows {
        println!("| {w} | {o:.0} | {r:.0} | {} |", pct(*o, *r));
    }
    if let Some((_, o, r)) = rows.iter().find(|(w, _, _)| *w == 4) {
        println!(
            "\nTarget: ≥ 60 % of the baseline at 4 workers — **{}** ({}).\n",
            if o / r >= 0.6 { "met" } else { "missed" },
            pct(*o, *r)
        );
    }
}
