//! Executor throughput (issue 5): planned steps executed per second by 1, 4 and 16
//! `countersign::executor::work_once` loops on Postgres against a no-op adapter, next to a raw
//! SQL baseline doing the same claim and a completing statement in a bare sqlx loop, in the
//! same run, with the ratio per worker count.
//!
//! * Steps: `plan.submit` (over `/mcp`, as a planner) of runs of 20 `bench.noop` steps — a
//!   `write` tool added to the finance example for this bench, served by the built-in `noop`
//!   provider, which answers at once and touches nothing — so what is measured is the executor:
//!   claim, policy, key reservation, status changes and audit records. `BENCH_STEP_TOOL`
//!   picks another tool: `invoice.get` (a read against the demo ERP: one indexed read, no key
//!   reservation) or `note.draft` (a write to the demo ERP, which numbers notes from a counter
//!   written with the note, so concurrent drafts collide and the losers take a number derived
//!   from their key; that measures the demo target, not the executor). Each configuration executes `BENCH_STEPS` (default 2,000)
//!   fresh steps. After seeding, `ANALYZE steps, runs` gives the planner the statistics a
//!   running system has (autovacuum's) for the other statements; the claim's plan no longer
//!   depends on them (a function whose settings leave one plan, migration 26).
//! * Ours: every step goes through the whole executor path — claim (`FOR UPDATE SKIP
//!   LOCKED`, the emergency stop checked in the same statement), run bounds, policy again, key
//!   reservation, the adapter, the status changes with their audit records, release, settling
//!   the run.
//! * Baseline: [`countersign_core::Store::claim_statement`] itself — the executor's claim,
//!   on a connection that does not wait for the WAL flush (a lost claim only leaves its step
//!   pending; the store's claims commit durably since its unflushed pool went) — then one
//!   `UPDATE … SET status = 'done'` completing the step, committed durably (as any recorded
//!   outcome must be), each autocommitted, through 16-connection pools of the store's own
//!   kind and settings (`store::LeanPool` over `store::pg_pool_options`: no ping on acquire,
//!   none on return), on steps
//!   seeded the same way. The floor of a durable queue: one claim and one synchronous commit
//!   per step.
//! * CPU per step, both sides: the machine's busy CPU time over each run (and the bench
//!   process's share of it) divided by the steps; from the executor's at 4 workers, the most
//!   steps/s the machine's CPUs could complete — a ceiling on the ratio to the baseline.
//!
//! * Floor, at 4 workers, measured right after the 4-worker baseline: the claim, then
//!   `running` and `done` through the store's committer with one audit record each — the
//!   least a crash-safe, audited step does on today's append path. Everything else the
//!   executor does comes on top of it.
//! * References, at 4 workers, right after the floor, in bare sqlx like the baseline (no
//!   Countersign code): the claim, then `running` and `done` each committed durably — the two
//!   durable points the crash tests require of a write — and the same with the three audit
//!   rows of an allowed write (`decided`, `started`, `succeeded`) written by those statements
//!   into `audit_shadow`, a copy of `audit` with all its indexes, unchained; and that again
//!   with each worker's steps overlapped (one durable statement ends its previous step and
//!   starts the next: the baseline's statement count). What the issue's own guarantees cost
//!   before any executor logic.
//!
//! `BENCH_PROFILE=1` also profiles the 4-worker runs (both sides): `pg_stat_activity` and
//! ungranted `pg_locks` sampled every 20 ms, `EXPLAIN (ANALYZE, BUFFERS)` of the claim half
//! way through, every sqlx statement's latency (its `tracing` events) and the executor's
//! per-step phase timings ([`countersign::executor::TIMING`]) with the committer's per-batch
//! ones ([`countersign_core::store::COMMITTER_TIMING`]). Profiling costs time itself:
//! the table of a profiled run is not the one to quote.
//!
//! Run with `cargo bench -p countersign --bench executor_steps` (`BENCH_STEPS=200` for a quick
//! check). Prints a markdown section on stdout; progress on stderr. Target: ≥ 60 % of the
//! baseline at 4 workers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{CpuUsed, Mcp, Server, cpu_reading, cpu_used, env_num, fresh_postgres, pct};
use countersign::executor::{TIMING, Timings, work_once};
use countersign::stop::EMERGENCY_STOP;
use countersign_core::store::{COMMITTER_TIMING, LeanPool, pg_pool_options};
use countersign_core::{Clock, StepStatus};
use serde_json::{Value, json};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Postgres, Row};

const INVOICE: &str = "INV-20260611";
const PLAN_STEPS: usize = 20;

/// Completes a claimed step: done, outcome recorded, attempt counted, lease released.
const COMPLETE: &str = "UPDATE steps SET status = 'done', outcome = $1, attempts = attempts + 1,
       updated_at = $2, claimed_by = NULL, lease_until = NULL
     WHERE id = $3 AND claimed_by = $4";

/// The outcome every reference loop records.
const OUTCOME: &str = r#"{"answer":{"status":"drafted"}}"#;

/// Takes a claimed step durably, in the references: `running`, attempt counted. `$1` now,
/// `$2` the step, `$3` the worker.
const START: &str = "UPDATE steps SET status = 'running', attempts = attempts + 1, updated_at = $1
     WHERE id = $2 AND claimed_by = $3 AND status = 'pending'";

/// Ends a `running` step, in the references: bound as [`COMPLETE`], attempt not counted.
const FINISH: &str = "UPDATE steps SET status = 'done', outcome = $1, updated_at = $2,
       claimed_by = NULL, lease_until = NULL
     WHERE id = $3 AND claimed_by = $4 AND status = 'running'";

/// Audit rows for the rows of `m` (id, run_id, tool, at, e: the event) in `audit_shadow`, a
/// copy of `audit` with all its indexes and constraints (no triggers), numbered by a
/// sequence: no chain, no append lock.
const ROWS: &str = "INSERT INTO audit_shadow
       (chain, seq, at, event, run_id, step_id, tool, actor, rule, record, prev, hash)
     SELECT 'bench', nextval('audit_shadow_seq'), m.at, m.e, m.run_id, m.id, m.tool, 'executor:bench',
            'policy.allow', x.r, '', encode(sha256(convert_to(x.r, 'UTF8')), 'hex')
       FROM m, LATERAL (SELECT json_build_object('event', m.e, 'run', m.run_id, 'step', m.id,
                  'tool', m.tool, 'actor', 'executor:bench', 'rule', 'policy.allow',
                  'detail', json_build_object('decision', 'allow', 'key', m.id))::text) AS x(r)";

/// The `RETURNING` list [`ROWS`] reads.
const MOVED: &str = "RETURNING id, run_id, tool, updated_at AS at";

/// What a reference loop does with each claimed step.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// The baseline: one completing UPDATE, committed durably.
    Complete,
    /// `running` committed durably before the (absent) effect, then `done` committed
    /// durably: the two durable points the crash tests require of a write.
    DurableStart,
    /// [`Shape::DurableStart`] with the three audit rows an allowed write leaves (`decided`
    /// and `started` with the start, `succeeded` with the outcome), in the same statements.
    DurableStartRows,
    /// [`Shape::DurableStartRows`] with a worker's steps overlapped: one durable statement
    /// ends its previous step and starts the one it just claimed, so a step costs the
    /// baseline's two statements and one durable commit, plus its rows.
    Overlapped,
}

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
/// Then analyzes the queue tables (see the module docs).
async fn seed(planner: &mut Mcp, pool: &LeanPool<Postgres>, tool: &str, steps: usize, tag: &str) {
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
    sqlx::query("ANALYZE steps, runs")
        .execute(pool)
        .await
        .unwrap();
}

/// `workers` executor loops until no step is left of the `seeded` ones; (steps executed,
/// elapsed).
async fn ours(
    server: &Server,
    workers: usize,
    seeded: u64,
    progress: &Arc<AtomicU64>,
) -> (u64, Duration) {
    let began = Instant::now();
    let executed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..workers {
        let executed = executed.clone();
        let state = server.state.clone();
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("bench-worker-{w}");
            let mut done = 0_u64;
            loop {
                if work_once(&state, &id, Timings::default()).await.unwrap() {
                    done += 1;
                    executed.fetch_add(1, Ordering::Relaxed);
                    progress.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                // Nothing ready: finished, or a retry waits out its backoff, or the other
                // workers hold the last runs. Counting pending steps scans the table, so it
                // is asked only once as many executions as seeded steps have happened (the
                // bench's own polling would otherwise load the database it measures).
                if executed.load(Ordering::Relaxed) >= seeded
                    && state.store.count_steps(StepStatus::Pending).await.unwrap() == 0
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            done
        }));
    }
    joined(tasks, began).await
}

/// The floor of a crash-safe, audited execution on the store's own API: the executor's
/// claim, then a transition to `running` with one audit record (committed and flushed before
/// an effect could start, as the crash tests require) and a transition to `done` with one
/// record — no run, bounds, agent or context read, no policy, no `decided` record, no
/// run/stop guard on the start, no key, no release, no settling.
async fn floor(server: &Server, workers: usize, progress: &Arc<AtomicU64>) -> (u64, Duration) {
    use countersign_core::audit::{AuditEvent, NewAuditRecord};
    use countersign_core::store::Transition;
    let began = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let store = server.state.store.clone();
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("floor-worker-{w}");
            let mut done = 0_u64;
            let record = |event, step: &countersign_core::store::Step| {
                (
                    event,
                    NewAuditRecord {
                        event: Some(event),
                        run_id: Some(step.run_id.clone()),
                        step_id: Some(step.id.clone()),
                        tool: Some(step.tool.clone()),
                        actor: Some(format!("executor:{id}")),
                        rule: Some("policy.allow".into()),
                        detail: serde_json::Map::new(),
                        tenant: None,
                    },
                )
            };
            loop {
                let lease = store.clock().now_ms() + 60_000;
                let Some(step) = store
                    .claim_step(&id, lease, Some(EMERGENCY_STOP))
                    .await
                    .unwrap()
                else {
                    break;
                };
                let started = Transition {
                    step_id: step.id.clone(),
                    from: vec![StepStatus::Pending],
                    to: Some(StepStatus::Running),
                    bump_attempts: true,
                    records: vec![record(AuditEvent::Started, &step)],
                    ..Transition::default()
                };
                assert!(store.move_step(&started).await.unwrap(), "started once");
                let finished = Transition {
                    step_id: step.id.clone(),
                    from: vec![StepStatus::Running],
                    to: Some(StepStatus::Done),
                    outcome: Some(r#"{"answer":{"status":"ok"}}"#.into()),
                    records: vec![record(AuditEvent::Succeeded, &step)],
                    ..Transition::default()
                };
                assert!(store.move_step(&finished).await.unwrap(), "done once");
                done += 1;
                progress.fetch_add(1, Ordering::Relaxed);
            }
            done
        }));
    }
    joined(tasks, began).await
}

/// Waits for every worker task: (the steps they did in all, time since `began`).
async fn joined(tasks: Vec<tokio::task::JoinHandle<u64>>, began: Instant) -> (u64, Duration) {
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    (total, began.elapsed())
}

/// The pools of the baseline: claims on connections that do not wait for the WAL flush (all
/// a claim needs), completions on ordinary ones.
struct Raw {
    claim: String,
    claims: LeanPool<Postgres>,
    completions: LeanPool<Postgres>,
}

/// The executor's claim statement + what `shape` does with the step, in a bare sqlx loop per
/// worker.
async fn baseline(
    raw: &Raw,
    shape: Shape,
    workers: usize,
    now: i64,
    progress: &Arc<AtomicU64>,
) -> (u64, Duration) {
    let start_rows = format!(
        "WITH s AS ({START} {MOVED}),
              m AS (SELECT s.*, e FROM s, UNNEST(ARRAY['decided', 'started']) AS e) {ROWS}"
    );
    let finish_rows = format!("WITH m AS ({FINISH} {MOVED}, 'succeeded' AS e) {ROWS}");
    // $1 outcome, $2 now, $3 the previous step (or NULL), $4 the worker, $5 the step just
    // claimed (or NULL).
    let overlapped = format!(
        "WITH d AS ({FINISH} {MOVED}, 'succeeded' AS e),
              s AS (UPDATE steps SET status = 'running', attempts = attempts + 1,
                      updated_at = $2
                     WHERE id = $5 AND claimed_by = $4 AND status = 'pending' {MOVED}),
              m AS (SELECT * FROM d
                    UNION ALL SELECT s.*, e FROM s, UNNEST(ARRAY['decided', 'started']) AS e)
         {ROWS}"
    );
    let began = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let claims = raw.claims.clone();
        let pool = raw.completions.clone();
        let claim = raw.claim.clone();
        let progress = progress.clone();
        let (start_rows, finish_rows, overlapped) =
            (start_rows.clone(), finish_rows.clone(), overlapped.clone());
        tasks.push(tokio::spawn(async move {
            let id = format!("raw-worker-{w}");
            let mut done = 0_u64;
            // Overlapped: the step started by the last statement, ended by the next.
            let mut previous: Option<String> = None;
            loop {
                let claimed = sqlx::query(&claim)
                    .bind(&id)
                    .bind(now + 60_000)
                    .bind(now)
                    .bind(EMERGENCY_STOP)
                    .fetch_optional(&claims)
                    .await
                    .unwrap();
                let step: Option<String> = claimed.map(|row| row.get("id"));
                if shape == Shape::Overlapped {
                    if step.is_none() && previous.is_none() {
                        break;
                    }
                    let rows = sqlx::query(&overlapped)
                        .bind(OUTCOME)
                        .bind(now)
                        .bind(&previous)
                        .bind(&id)
                        .bind(&step)
                        .execute(&pool)
                        .await
                        .unwrap()
                        .rows_affected();
                    let expected = u64::from(previous.is_some()) + 2 * u64::from(step.is_some());
                    assert_eq!(
                        rows, expected,
                        "{previous:?} ended and {step:?} started once"
                    );
                    if previous.is_some() {
                        done += 1;
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                    previous = step;
                    continue;
                }
                let Some(step) = step else { break };
                let finish = |sql| bound(sql, Some(OUTCOME), now, &step, &id);
                let start = |sql| bound(sql, None, now, &step, &id);
                let ended = match shape {
                    Shape::Complete => finish(COMPLETE).execute(&pool).await,
                    Shape::DurableStart => {
                        let started = start(START).execute(&pool).await.unwrap();
                        assert_eq!(started.rows_affected(), 1, "{step} started once");
                        finish(FINISH).execute(&pool).await
                    }
                    Shape::DurableStartRows | Shape::Overlapped => {
                        let started = start(&start_rows).execute(&pool).await.unwrap();
                        assert_eq!(started.rows_affected(), 2, "{step} started, two rows");
                        finish(&finish_rows).execute(&pool).await
                    }
                };
                assert_eq!(ended.unwrap().rows_affected(), 1, "{step} completed once");
                done += 1;
                progress.fetch_add(1, Ordering::Relaxed);
            }
            done
        }));
    }
    joined(tasks, began).await
}

/// A reference statement on `step` by `worker`: bound ($1 `outcome`, $2 `now`, $3, $4) as
/// [`COMPLETE`] and [`FINISH`] with an outcome, ($1 `now`, $2, $3) as [`START`] without.
fn bound<'q>(
    sql: &'q str,
    outcome: Option<&'q str>,
    now: i64,
    step: &'q str,
    worker: &'q str,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let q = match outcome {
        Some(outcome) => sqlx::query(sql).bind(outcome),
        None => sqlx::query(sql),
    };
    q.bind(now).bind(step).bind(worker)
}

// ---- profiling (BENCH_PROFILE=1) -------------------------------------------------------------

/// Statement latencies (from sqlx's `tracing` events) and executor phase timings, recorded
/// under the label in force.
#[derive(Default)]
struct Profile {
    label: Mutex<Option<String>>,
    /// (label, statement) → (count, seconds).
    statements: Mutex<HashMap<(String, String), (u64, f64)>>,
    /// (label, phase) → (count, microseconds).
    phases: Mutex<HashMap<(String, String), (u64, u64)>>,
}

#[derive(Default)]
struct Fields {
    statement: String,
    summary: String,
    elapsed_secs: f64,
    numbers: Vec<(String, u64)>,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "db.statement" => self.statement = value.to_string(),
            "summary" => self.summary = value.to_string(),
            _ => {}
        }
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        if field.name() == "elapsed_secs" {
            self.elapsed_secs = value;
        }
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.numbers.push((field.name().to_string(), value));
    }
    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

struct ProfileLayer(Arc<Profile>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ProfileLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let target = event.metadata().target();
        if target != "sqlx::query" && target != TIMING && target != COMMITTER_TIMING {
            return;
        }
        let Some(label) = self.0.label.lock().unwrap().clone() else {
            return;
        };
        let mut f = Fields::default();
        event.record(&mut f);
        if target == TIMING || target == COMMITTER_TIMING {
            let mut phases = self.0.phases.lock().unwrap();
            for (name, us) in f.numbers {
                let name = if target == COMMITTER_TIMING {
                    format!("committer.{name}")
                } else {
                    name
                };
                let e = phases.entry((label.clone(), name)).or_default();
                e.0 += 1;
                e.1 += us;
            }
            return;
        }
        let text = if f.statement.trim().is_empty() {
            f.summary
        } else {
            f.statement
        };
        let text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let key: String = text.chars().take(72).collect();
        let mut statements = self.0.statements.lock().unwrap();
        let e = statements.entry((label, key)).or_default();
        e.0 += 1;
        e.1 += f.elapsed_secs;
    }
}

/// What the sampler saw: (wait | statement) and ungranted locks, with counts.
#[derive(Default)]
struct Waits {
    sessions: HashMap<String, usize>,
    locks: HashMap<String, usize>,
    samples: usize,
    explain: Vec<String>,
}

/// The statement `countersign_claim_step` runs (its body's `RETURN QUERY`, its parameters as
/// `$1`..`$4`), with the function's settings made this transaction's (`SET LOCAL`): what the
/// claim's plan is, for `EXPLAIN`. `None` when the function is not there.
async fn claim_body(conn: &mut sqlx::PgConnection) -> Option<String> {
    let (src, config): (String, Vec<String>) = sqlx::query_as(
        "SELECT prosrc, COALESCE(proconfig, ARRAY[]::text[]) FROM pg_proc
          WHERE proname = 'countersign_claim_step'",
    )
    .fetch_optional(&mut *conn)
    .await
    .unwrap()?;
    for setting in config {
        let (name, value) = setting.split_once('=')?;
        sqlx::query(&format!("SET LOCAL {name} = '{value}'"))
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    let query = src.split_once("RETURN QUERY")?.1;
    let query = &query[..query.rfind(';')?];
    // Whole words only (`switch` is also the start of `switches`).
    let mut out = String::new();
    let mut word = String::new();
    for c in query.chars().chain(std::iter::once(' ')) {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        out.push_str(match word.as_str() {
            "worker" => "$1",
            "lease_to" => "$2",
            "now_ms" => "$3",
            "switch" => "$4",
            w => w,
        });
        word.clear();
        out.push(c);
    }
    Some(out)
}

/// Samples the database's active sessions and lock waits every 20 ms until `stop`, and
/// explains the claim once `progress` reaches `half`.
async fn sample(
    url: String,
    claim: String,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
    half: u64,
) -> Waits {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut out = Waits::default();
    while !stop.load(Ordering::Relaxed) {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT COALESCE(wait_event_type || ' / ' || wait_event, 'on CPU'),
                    LEFT(REGEXP_REPLACE(query, '\\s+', ' ', 'g'), 56)
             FROM pg_stat_activity
             WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        out.samples += 1;
        for (wait, query) in rows {
            let query = query.replace('|', "\\|");
            *out.sessions
                .entry(format!("{wait} | `{query}`"))
                .or_default() += 1;
        }
        let locks: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT l.locktype, l.mode,
                    COALESCE(l.relation::regclass::text, l.classid::text || ':' || l.objid::text, '')
             FROM pg_locks l
             WHERE NOT l.granted
               AND (l.database IS NULL OR l.database =
                    (SELECT oid FROM pg_database WHERE datname = current_database()))",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        for (kind, mode, what) in locks {
            *out.locks
                .entry(format!("{kind} | {mode} | {what}"))
                .or_default() += 1;
        }
        if out.explain.is_empty() && progress.load(Ordering::Relaxed) >= half {
            let now = countersign_core::clock::SystemClock.now_ms();
            let mut tx = conn.begin().await.unwrap();
            // The claim calls a function (migration 26): explain its statement, as it runs.
            let body = claim_body(&mut tx).await.unwrap_or_else(|| claim.clone());
            let plan: Vec<String> =
                sqlx::query_scalar(&format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {body}"))
                    .bind("bench-explain")
                    .bind(now + 60_000)
                    .bind(now)
                    .bind(EMERGENCY_STOP)
                    .fetch_all(&mut *tx)
                    .await
                    .unwrap();
            tx.rollback().await.unwrap();
            out.explain = plan;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = conn.close().await;
    out
}

fn print_profile(label: &str, waits: &Waits, profile: &Profile, steps: usize) {
    println!("#### Profile: {label}\n");
    let busy: usize = waits.sessions.values().sum();
    println!(
        "`pg_stat_activity` every 20 ms ({} samples; {:.2} busy sessions on average):\n",
        waits.samples,
        busy as f64 / waits.samples.max(1) as f64
    );
    println!("| wait | statement | share |");
    println!("|---|---|---:|");
    let mut sessions: Vec<_> = waits.sessions.iter().collect();
    sessions.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    for (what, n) in sessions.iter().take(12) {
        println!("| {what} | {} |", pct(**n as f64, busy as f64));
    }
    println!();
    if waits.locks.is_empty() {
        println!("Ungranted `pg_locks`: none seen.\n");
    } else {
        println!("Ungranted `pg_locks` (sessions waiting, summed over samples):\n");
        println!("| lock | mode | on | samples |");
        println!("|---|---|---|---:|");
        let mut locks: Vec<_> = waits.locks.iter().collect();
        locks.sort_by(|a, b| b.1.cmp(a.1));
        for (what, n) in locks {
            println!("| {what} | {n} |");
        }
        println!();
    }
    if !waits.explain.is_empty() {
        println!("The claim half way through, `EXPLAIN (ANALYZE, BUFFERS)`:\n");
        println!("```");
        for line in &waits.explain {
            println!("{line}");
        }
        println!("```\n");
    }
    let statements = profile.statements.lock().unwrap();
    let mut rows: Vec<_> = statements
        .iter()
        .filter(|((l, _), _)| l == label)
        .map(|((_, s), (n, secs))| (s.clone(), *n, *secs))
        .collect();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    if !rows.is_empty() {
        let total: f64 = rows.iter().map(|r| r.2).sum();
        println!(
            "Statements as the client timed them (sqlx; {:.1} ms of statements per step):\n",
            1000.0 * total / steps as f64
        );
        println!("| statement | per step | mean ms | share of statement time |");
        println!("|---|---:|---:|---:|");
        for (s, n, secs) in rows.iter().take(16) {
            println!(
                "| `{}` | {:.2} | {:.2} | {} |",
                s.replace('|', "\\|"),
                *n as f64 / steps as f64,
                1000.0 * secs / *n as f64,
                pct(*secs, total)
            );
        }
        println!();
    }
    let phases = profile.phases.lock().unwrap();
    let mut rows: Vec<_> = phases
        .iter()
        .filter(|((l, _), _)| l == label)
        .map(|((_, p), (n, us))| (p.clone(), *n, *us))
        .collect();
    if !rows.is_empty() {
        rows.sort();
        println!(
            "Executor phases, means: `work_once`'s per step; the committer's \
             (`committer.*`, all callers' transitions and appends) per batch. Times in ms; \
             `batch_jobs` in jobs:\n"
        );
        println!("| phase | mean |");
        println!("|---|---:|");
        for (p, n, v) in rows {
            let mean = v as f64 / n.max(1) as f64;
            if p.ends_with("_us") {
                println!("| {p} | {:.2} |", mean / 1000.0);
            } else {
                println!("| {p} | {mean:.2} |");
            }
        }
        println!();
    }
}

#[tokio::main]
async fn main() {
    let steps = env_num("BENCH_STEPS", 2_000) as usize;
    let tool = std::env::var("BENCH_STEP_TOOL").unwrap_or_else(|_| NOOP_TOOL.into());
    let tool = tool.as_str();
    let profiling = env_num("BENCH_PROFILE", 0) == 1;
    let profile = Arc::new(Profile::default());
    if profiling {
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber = tracing_subscriber::registry()
            .with(ProfileLayer(profile.clone()))
            .with(
                tracing_subscriber::filter::Targets::new()
                    .with_target("sqlx::query", tracing::Level::DEBUG)
                    .with_target(TIMING, tracing::Level::DEBUG)
                    .with_target(COMMITTER_TIMING, tracing::Level::DEBUG),
            );
        tracing::subscriber::set_global_default(subscriber).unwrap();
    }
    let db = fresh_postgres().await;
    let registry = bench_registry();
    let server = Server::start_with(&db, registry.to_str().unwrap()).await;
    let store = server.state.store.clone();
    let token = server.agent("bench-planner", "planner").await;
    let mut planner = Mcp::new(server.addr, &token);
    planner.connect().await;
    let options = PgConnectOptions::from_str(db.url.expose()).unwrap();
    let raw = Raw {
        claim: store.claim_statement(),
        claims: LeanPool::new(
            pg_pool_options()
                .max_connections(16)
                .connect_with(options.clone().options([("synchronous_commit", "off")]))
                .await
                .unwrap(),
        ),
        completions: LeanPool::new(
            pg_pool_options()
                .max_connections(16)
                .connect_with(options)
                .await
                .unwrap(),
        ),
    };
    let pool = &raw.completions;
    for sql in [
        "CREATE TABLE audit_shadow (LIKE audit INCLUDING ALL)",
        "CREATE SEQUENCE audit_shadow_seq",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }
    eprintln!(
        "executor_steps: {steps} {tool} steps per configuration{}",
        if profiling { " (profiling)" } else { "" }
    );
    let progress = Arc::new(AtomicU64::new(0));

    // Warm-up: a small round through both paths (connections, caches, plans).
    seed(&mut planner, pool, tool, 100, "warm-ours").await;
    ours(&server, 4, 100, &progress).await;
    seed(&mut planner, pool, tool, 100, "warm-raw").await;
    baseline(&raw, Shape::Complete, 4, store.clock().now_ms(), &progress).await;

    let mut rows = Vec::new();
    let mut profiles = Vec::new();
    let mut floor_run = None;
    let mut references = Vec::new();
    // `BENCH_PAIRED_ONLY=1`: only the paired rounds (the ablation run, scripts/bench.sh).
    let paired_only = env_num("BENCH_PAIRED_ONLY", 0) == 1;
    let sweep: &[usize] = if paired_only { &[] } else { &[1, 4, 16] };
    for &workers in sweep {
        let profiled = profiling && workers == 4;
        seed(&mut planner, pool, tool, steps, &format!("ours-{workers}")).await;
        // plan.submit is itself a step of the planner's session run: count after seeding.
        let expected_done = store.count_steps(StepStatus::Done).await.unwrap() + steps as i64;
        let sampler = |label: &str| {
            *profile.label.lock().unwrap() = Some(label.to_string());
            progress.store(0, Ordering::Relaxed);
            let stop = Arc::new(AtomicBool::new(false));
            let handle = tokio::spawn(sample(
                db.url.expose().clone(),
                raw.claim.clone(),
                stop.clone(),
                progress.clone(),
                steps as u64 / 2,
            ));
            (stop, handle)
        };
        let watch = profiled.then(|| sampler("ours, 4 workers"));
        let before = cpu_reading();
        let (n_ours, t_ours) = ours(&server, workers, steps as u64, &progress).await;
        let cpu_ours = cpu_used(before, cpu_reading());
        if let Some((stop, handle)) = watch {
            *profile.label.lock().unwrap() = None;
            stop.store(true, Ordering::Relaxed);
            profiles.push(("ours, 4 workers", handle.await.unwrap()));
        }
        assert!(n_ours as usize >= steps, "every seeded step executed");
        assert_eq!(
            store.count_steps(StepStatus::Done).await.unwrap(),
            expected_done,
            "every step done, none twice"
        );
        seed(&mut planner, pool, tool, steps, &format!("raw-{workers}")).await;
        let watch = profiled.then(|| sampler("baseline, 4 workers"));
        let before = cpu_reading();
        let (n_raw, t_raw) = baseline(
            &raw,
            Shape::Complete,
            workers,
            store.clock().now_ms(),
            &progress,
        )
        .await;
        let cpu_raw = cpu_used(before, cpu_reading());
        if let Some((stop, handle)) = watch {
            *profile.label.lock().unwrap() = None;
            stop.store(true, Ordering::Relaxed);
            profiles.push(("baseline, 4 workers", handle.await.unwrap()));
        }
        assert_eq!(n_raw as usize, steps, "every seeded step completed");
        if workers == 4 {
            // The floor right after the baseline it is compared with.
            seed(&mut planner, pool, tool, steps, "floor-4").await;
            let before = cpu_reading();
            let (n, t) = floor(&server, 4, &progress).await;
            assert_eq!(
                n as usize, steps,
                "every seeded step went through the floor"
            );
            floor_run = Some((n, t, cpu_used(before, cpu_reading())));
            for (shape, tag) in [
                (Shape::DurableStart, "durable-start"),
                (Shape::DurableStartRows, "durable-start-rows"),
                (Shape::Overlapped, "overlapped"),
            ] {
                seed(&mut planner, pool, tool, steps, tag).await;
                let before = cpu_reading();
                let (n, t) = baseline(&raw, shape, 4, store.clock().now_ms(), &progress).await;
                assert_eq!(n as usize, steps, "every seeded step went through {tag}");
                references.push((shape, n, t, cpu_used(before, cpu_reading())));
            }
        }
        let ours_per_s = steps as f64 / t_ours.as_secs_f64();
        let raw_per_s = n_raw as f64 / t_raw.as_secs_f64();
        eprintln!("  {workers} workers: ours {ours_per_s:.0}/s, raw {raw_per_s:.0}/s");
        rows.push((
            workers,
            ours_per_s,
            raw_per_s,
            cpu_ours.map(|c| (c, n_ours as usize)),
            cpu_raw.map(|c| (c, n_raw as usize)),
        ));
    }
    // Issue 34's figure: the executor at 4 workers against the guarantees' own reference
    // (claim + `running` + `done` durably, with the three rows), alternating A B A B ….
    let rounds = env_num("BENCH_ROUNDS", 3).max(1) as usize;
    let mut paired = Vec::new();
    for round in 0..rounds {
        // A B, then B A: neither side always runs on the larger steps table.
        let mut measured = [(0, Duration::ZERO); 2];
        for side in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
            seed(
                &mut planner,
                pool,
                tool,
                steps,
                &format!("pair-{side}-{round}"),
            )
            .await;
            measured[side] = if side == 0 {
                ours(&server, 4, steps as u64, &progress).await
            } else {
                let now = store.clock().now_ms();
                baseline(&raw, Shape::DurableStartRows, 4, now, &progress).await
            };
        }
        let [(n_ours, t_ours), (n_ref, t_ref)] = measured;
        let pair = (
            n_ours as f64 / t_ours.as_secs_f64(),
            n_ref as f64 / t_ref.as_secs_f64(),
        );
        eprintln!(
            "  round {}: executor {:.0}/s, reference {:.0}/s",
            round + 1,
            pair.0,
            pair.1
        );
        paired.push(pair);
    }
    assert_eq!(
        store.count_steps(StepStatus::Running).await.unwrap(),
        0,
        "no step left running"
    );
    raw.claims.close().await;
    raw.completions.close().await;
    server.stop().await;
    db.drop_db().await;
    let _ = std::fs::remove_dir_all(&registry);

    if paired_only {
        print_paired(&paired, steps, tool, true);
        return;
    }
    println!("### Executor steps per second (issue 5)\n");
    println!(
        "{steps} planned `{tool}` steps per configuration (runs of {PLAN_STEPS}, submitted \
         with `plan.submit`, tables analyzed after seeding), executed by N \
         `executor::work_once` loops on Postgres against {}; each step is claimed, decided \
         again, executed, recorded with its audit records, released, and its run settled. \
         Baseline in the same run: the executor's own claim statement (`FOR UPDATE SKIP \
         LOCKED`, committed without waiting for the WAL flush: all a claim needs) plus one \
         completing `UPDATE` committed durably, in a bare sqlx loop per worker through the \
         store's own pool (`LeanPool`), on steps seeded the same way.{}\n",
        if tool == NOOP_TOOL {
            "the built-in no-op adapter (a write: its key is reserved)"
        } else {
            "the built-in demo ERP adapter"
        },
        if profiling {
            " **Profiled run** (statement tracing and sampling on): slower than an unprofiled one."
        } else {
            ""
        }
    );
    println!(
        "| workers | executor steps/s | raw claim + complete steps/s | executor vs baseline \
         | CPU per step: executor (of it in the bench process) | CPU per step: baseline |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let cell = |c: &Option<(CpuUsed, usize)>| match c {
        Some((c, n)) => format!(
            "{} ({})",
            CpuUsed::per_call(c.machine, *n),
            CpuUsed::per_call(c.process, *n)
        ),
        None => "n/a".into(),
    };
    for (w, o, r, co, cr) in &rows {
        println!(
            "| {w} | {o:.0} | {r:.0} | {} | {} | {} |",
            pct(*o, *r),
            cell(co),
            cell(cr)
        );
    }
    if let Some((_, o, r, co, cr)) = rows.iter().find(|row| row.0 == 4) {
        println!(
            "\nTarget: ≥ 60 % of the baseline at 4 workers — **{}** ({}).\n",
            if o / r >= 0.6 { "met" } else { "missed" },
            pct(*o, *r)
        );
        if let (Some((co, no)), Some((cr, nr))) = (co, cr) {
            let ceiling = co.ceiling_per_s(*no);
            println!(
                "CPU ceiling: at 4 workers a step costs the machine {} of CPU, a baseline \
                 step {}. With all {} CPUs doing nothing but executor steps, they would \
                 complete at most {ceiling:.0} steps/s: {} of the baseline's measured \
                 throughput, however the work is scheduled.\n",
                CpuUsed::per_call(co.machine, *no),
                CpuUsed::per_call(cr.machine, *nr),
                co.cpus,
                pct(ceiling, *r)
            );
        }
    }
    if let (Some((_, _, r, _, _)), Some((n, t, cpu))) =
        (rows.iter().find(|row| row.0 == 4), &floor_run)
    {
        let per_s = *n as f64 / t.as_secs_f64();
        eprintln!("  floor, 4 workers: {per_s:.0}/s");
        let cpu = cpu
            .map(|c| {
                format!(
                    " at {} of CPU per step (CPU ceiling {})",
                    CpuUsed::per_call(c.machine, *n as usize),
                    pct(c.ceiling_per_s(*n as usize), *r)
                )
            })
            .unwrap_or_default();
        println!(
            "Floor, 4 workers, measured right after the 4-worker baseline (the claim, then \
             `running` and `done` through the store's committer with one audit record each, \
             nothing else): {per_s:.0} steps/s{cpu} — {} of the baseline. The executor adds \
             to it one read (run, agent, context, bounds), policy, a `decided` record, the \
             start's run/stop guard and key reservation, the lease's end with the close, and \
             for a run's last step the settling read.\n",
            pct(per_s, *r)
        );
    }
    if let Some((_, o, r, co, cr)) = rows.iter().find(|row| row.0 == 4) {
        println!(
            "What the issue's own guarantees cost before any executor logic, at 4 workers: \
             bare sqlx loops on the same pools and steps as the baseline, measured right \
             after the floor. A write must be `running` (with its key) durably before its \
             effect and its outcome durable after it (the crash tests); an allowed write \
             leaves three audit rows. The rows go to `audit_shadow`, a copy of `audit` with \
             all its indexes, numbered by a sequence: no chain, no append lock.\n"
        );
        println!(
            "| 4 workers | steps/s | vs baseline | CPU per step (of it in the bench process) |"
        );
        println!("|---|---:|---:|---:|");
        let cpu = |c: &Option<CpuUsed>, n: &u64| cell(&c.map(|c| (c, *n as usize)));
        println!(
            "| baseline: claim + `done` (1 durable commit) | {r:.0} | 100 % | {} |",
            cell(cr)
        );
        for (shape, n, t, c) in &references {
            let label = match shape {
                Shape::DurableStart => "claim + `running` + `done` (2 durable commits)",
                Shape::DurableStartRows => {
                    "the same + `decided`, `started`, `succeeded` rows in those statements"
                }
                _ => {
                    "the same, overlapped: one durable statement ends a worker's previous step \
                     and starts its next (2 statements and 1 durable commit per step)"
                }
            };
            let per_s = *n as f64 / t.as_secs_f64();
            println!(
                "| {label} | {per_s:.0} | {} | {} |",
                pct(per_s, *r),
                cpu(c, n)
            );
        }
        if let Some((n, t, c)) = &floor_run {
            let per_s = *n as f64 / t.as_secs_f64();
            println!(
                "| floor: the store's committer, chained, one record per transition | \
                 {per_s:.0} | {} | {} |",
                pct(per_s, *r),
                cpu(c, n)
            );
        }
        println!(
            "| executor (`work_once`) | {o:.0} | {} | {} |\n",
            pct(*o, *r),
            cell(co)
        );
    }
    print_paired(&paired, steps, tool, false);
    for (label, waits) in &profiles {
        print_profile(label, waits, &profile, steps);
    }
}

/// The rounds of executor vs reference at 4 workers, and issue 34's figure from them.
/// `row`: one table row for the ablation run, labelled with the mechanisms turned off, and no
/// figure recorded.
fn print_paired(paired: &[(f64, f64)], steps: usize, tool: &str, row: bool) {
    use common::figures::{Side, median, record, spread};
    let ablated = std::env::var("BENCH_STORE_ABLATE").unwrap_or_default();
    let ratios: Vec<f64> = paired.iter().map(|(o, r)| o / r).collect();
    let ours: Vec<f64> = paired.iter().map(|p| p.0).collect();
    let refs: Vec<f64> = paired.iter().map(|p| p.1).collect();
    let value = median(&ratios);
    let met = value >= 0.75;
    if row {
        let label = if ablated.is_empty() {
            "none (everything on)".to_string()
        } else {
            format!("`{ablated}`")
        };
        println!(
            "| {label} | {:.0} (rounds {}) | {:.0} (rounds {}) | {value:.2} (rounds {}) |",
            median(&ours),
            spread(&ours, 0),
            median(&refs),
            spread(&refs, 0),
            spread(&ratios, 2),
        );
        return;
    }
    println!(
        "Issue 34's figure, in {} alternating rounds of {steps} `{tool}` steps at 4 workers: the \
         executor {:.0} steps/s (median; rounds {}) against the guarantees' reference (claim + \
         `running` + `done` committed durably, with the three audit rows) {:.0} steps/s \
         (rounds {}): `executor_over_guarantee_reference` = **{value:.2}** (rounds {}), \
         target ≥ 0.75 — **{}**.\n",
        paired.len(),
        median(&ours),
        spread(&ours, 0),
        median(&refs),
        spread(&refs, 0),
        spread(&ratios, 2),
        if met { "met" } else { "missed" }
    );
    record(
        "executor_over_guarantee_reference",
        value,
        "≥ 0.75",
        met,
        Side {
            what: format!("executor steps/s, 4 workers, {tool} (Postgres)"),
            value: median(&ours),
            unit: "steps/s",
        },
        Side {
            what: "claim + running + done + 3 rows, bare sqlx, 4 workers (Postgres)".into(),
            value: median(&refs),
            unit: "steps/s",
        },
    );
}
