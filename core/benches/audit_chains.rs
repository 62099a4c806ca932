//! Audit-heavy appends with one chain per tenant (issue 39): appends/s with 1 tenant vs 8
//! tenants, through 1 store vs 2 stores over one Postgres (each store has its own pools and
//! committers, as two `serve` replicas have), and the share of the database's busy sessions
//! that are waiting for a lock (a chain's head row: the only lock an append waits for).
//!
//! Load: `BENCH_CLIENTS` (default 32) tasks, each appending one record at a time in a closed
//! loop (`Store::append_audit`: a committer batch, durable before it answers), spread evenly
//! over the tenants and the stores — every tenant's callers on every store, or (tenant
//! affinity, as a load balancer routing by tenant gives) each tenant's callers on one store.
//! CPU is read per process from `/proc` (this process; every `postgres` process). Workloads run interleaved, `BENCH_ROUNDS` (default 3)
//! rounds of `BENCH_SECONDS` (default 5) each after a 1 s warm-up; medians and the spread are
//! printed as a Markdown table. A sampler connection reads `pg_stat_activity` every 5 ms.
//!
//! Run with `cargo bench -p countersign-core --bench audit_chains` (Postgres from
//! `COUNTERSIGN_TEST_POSTGRES_URL`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::store::testing::FreshDb;
use countersign_core::{Backend, Clock, Store, SystemClock};
use serde_json::json;
use sqlx::Connection;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn record(tenant: &str, i: u64) -> NewAuditRecord {
    let mut detail = serde_json::Map::new();
    detail.insert("kind".into(), json!("bench"));
    detail.insert("n".into(), json!(i));
    detail.insert(
        "inputs".into(),
        json!({"amount": 4180, "iban": "hmac-sha256:ab", "invoice": format!("INV-{i}")}),
    );
    NewAuditRecord {
        event: Some(AuditEvent::Operational),
        actor: Some("bench".into()),
        tool: Some("payment.schedule".into()),
        detail,
        tenant: Some(tenant.to_string()),
        ..NewAuditRecord::default()
    }
}

#[derive(Clone, Copy)]
struct Workload {
    tenants: usize,
    stores: usize,
    /// Each tenant's callers all on one store (a load balancer with tenant affinity), rather
    /// than every tenant's callers spread over every store.
    affinity: bool,
}

/// One window: appends/s, the share of sampled busy sessions waiting for a lock, and the CPU
/// (in cores) of this process and of every Postgres process.
struct Window {
    per_sec: f64,
    lock_share: f64,
    cpu_self: f64,
    cpu_pg: f64,
    /// Committer batches written in one round trip, per second.
    one_trips: f64,
}

/// CPU time (user + system, in clock ticks) of process `pid`, from `/proc` (0 where unreadable).
fn ticks(pid: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command name (which may hold spaces) in parentheses.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

/// CPU ticks of this process, and of every process named `postgres` (server and backends).
fn cpu_ticks() -> (u64, u64) {
    let mut pg = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().to_string();
        if pid.bytes().all(|b| b.is_ascii_digit())
            && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        {
            pg += ticks(&pid);
        }
    }
    (ticks("self"), pg)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
const TICKS_PER_SEC: f64 = 100.0;

async fn window(stores: &[Store], w: Workload, url: &str, clients: u64, secs: u64) -> Window {
    let stop = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..clients as usize {
        let (store, tenant) = if w.affinity {
            (c % w.tenants % w.stores, c % w.tenants)
        } else {
            (c % w.stores, (c / w.stores) % w.tenants)
        };
        let (store, tenant) = (stores[store].clone(), format!("t{tenant}"));
        let (stop, counted, done) = (stop.clone(), counted.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                store.append_audit(&record(&tenant, i)).await.unwrap();
                i += 1;
                if counted.load(Ordering::Relaxed) {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Warm-up (every chain's head known, connections open), then the measured window.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut sampler = sqlx::PgConnection::connect(url).await.unwrap();
    counted.store(true, Ordering::Relaxed);
    let cpu_before = cpu_ticks();
    let trips = || stores.iter().map(Store::one_trip_batches).sum::<u64>();
    let trips_before = trips();
    let began = Instant::now();
    let (mut busy, mut waiting) = (0_i64, 0_i64);
    while began.elapsed() < Duration::from_secs(secs) {
        let (b, l): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'active'),
                    count(*) FILTER (WHERE state = 'active' AND wait_event_type = 'Lock')
               FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut sampler)
        .await
        .unwrap();
        busy += b;
        waiting += l;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = began.elapsed().as_secs_f64();
    counted.store(false, Ordering::Relaxed);
    let cpu_after = cpu_ticks();
    let one_trips = trips().saturating_sub(trips_before) as f64 / elapsed;
    let cores = |a: u64, b: u64| b.saturating_sub(a) as f64 / TICKS_PER_SEC / elapsed;
    let n = done.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let _ = sampler.close().await;
    Window {
        per_sec: n as f64 / elapsed,
        lock_share: if busy > 0 {
            waiting as f64 / busy as f64
        } else {
            0.0
        },
        cpu_self: cores(cpu_before.0, cpu_after.0),
        cpu_pg: cores(cpu_before.1, cpu_after.1),
        one_trips,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let clients = env("BENCH_CLIENTS", 32);
    let rounds = env("BENCH_ROUNDS", 3);
    let secs = env("BENCH_SECONDS", 5);
    let Some(db) = FreshDb::create(Backend::Postgres).await else {
        panic!("the audit chains bench needs Postgres (COUNTERSIGN_TEST_POSTGRES_URL)");
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let stores = vec![db.store(clock.clone()).await, db.store(clock.clone()).await];
    let url = db.url.expose().clone();
    let workloads = [
        Workload {
            tenants: 1,
            stores: 1,
            affinity: false,
        },
        Workload {
            tenants: 8,
            stores: 1,
            affinity: false,
        },
        Workload {
            tenants: 1,
            stores: 2,
            affinity: false,
        },
        Workload {
            tenants: 8,
            stores: 2,
            affinity: false,
        },
        Workload {
            tenants: 8,
            stores: 2,
            affinity: true,
        },
    ];
    let mut results: Vec<Vec<Window>> = workloads.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (i, w) in workloads.iter().enumerate() {
            results[i].push(window(&stores[..w.stores], *w, &url, clients, secs).await);
        }
    }
    let base = median(results[0].iter().map(|w| w.per_sec).collect());
    println!("### Audit appends, one chain per tenant (issue 39)\n");
    println!(
        "{clients} tasks appending one audit record at a time (each a committer batch, durable \
         before it answers) on Postgres, {rounds} interleaved rounds of {secs} s per workload; \
         medians (min–max). \"Stores\": independent `Store`s (own pools and committers, as \
         replicas have) in one process; \"tenant affinity\": each tenant's callers all on one \
         store, else every tenant's callers on every store. \"Waiting for a lock\": of the \
         database's sessions sampled busy every 5 ms, the share waiting for a lock — a chain's \
         head row is the only lock an append takes. CPU in cores, per process (this bench; \
         every Postgres process). \"One-trip batches\": committer batches written in one round \
         trip; appends/s divided by it is about the records per batch.\n"
    );
    println!(
        "| tenants | stores | appends/s | vs 1 tenant, 1 store | waiting for a lock (of busy sessions) | CPU: bench process, Postgres (cores) | one-trip batches/s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (w, r) in workloads.iter().zip(&results) {
        let rates: Vec<f64> = r.iter().map(|x| x.per_sec).collect();
        let (lo, hi) = (
            rates.iter().copied().fold(f64::INFINITY, f64::min),
            rates.iter().copied().fold(0.0, f64::max),
        );
        let m = median(rates);
        let lock = median(r.iter().map(|x| x.lock_share).collect());
        println!(
            "| {} | {}{} | {m:.0} ({lo:.0}–{hi:.0}) | {:.0} % | {:.1} % | {:.2}, {:.2} | {:.0} |",
            w.tenants,
            w.stores,
            if w.affinity { " (tenant affinity)" } else { "" },
            100.0 * m / base,
            100.0 * lock,
            median(r.iter().map(|x| x.cpu_self).collect()),
            median(r.iter().map(|x| x.cpu_pg).collect()),
            median(r.iter().map(|x| x.one_trips).collect()),
        );
    }
    println!();
    for s in &stores {
        s.close().await;
    }
    db.drop_db().await;
}
