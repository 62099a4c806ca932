//! The ablation run (issue 34's rule: each mechanism added for the old targets shows what it
//! pays, on vs off, in one run). One `countersign serve` per configuration, each on its own
//! fresh Postgres database: everything on, then each set of `BENCH_ABLATE` (`;`-separated
//! values of `COUNTERSIGN_STORE_ABLATE`) off. Rounds interleave the configurations: per
//! round, each runs the no-op read, the floor and the demo ERP write in turn. All servers
//! stay up (idle between their windows), each holding up to 16 connections: Postgres needs
//! room for about 16 per configuration. Database CPU is every Postgres process's, idle
//! servers' included (their registry polls: a few statements a second).

use std::sync::Arc;
use std::time::Duration;

use countersign_core::Store;
use countersign_core::clock::SystemClock;
use countersign_core::store::ConnectOptions;

use crate::common::figures::{median, spread};
use crate::common::fresh_postgres;
use crate::common::procs::{Parties, ServerProcess, UpstreamProcess};
use crate::{Client, Window, Work, bench_registry, mcp_clients, uuid_like, window};

const WORKS: [Work; 3] = [Work::Read, Work::Floor, Work::Write];

struct Config {
    label: String,
    windows: Vec<(Work, Vec<Window>)>,
}

pub async fn run(sets: &str, clients: usize, rounds: usize, secs: Duration) {
    let labels: Vec<String> = std::iter::once(String::new())
        .chain(sets.split(';').map(|s| s.trim().to_string()))
        .collect();
    // The databases first: without Postgres the bench exits before it starts a process.
    let mut dbs = Vec::new();
    for _ in &labels {
        dbs.push(fresh_postgres().await);
    }
    let dir = std::env::temp_dir().join(format!("cs-ablate-bench-{}", uuid_like()));
    std::fs::create_dir_all(&dir).unwrap();
    let upstream = UpstreamProcess::start().await;
    let registry = bench_registry(&dir, upstream.addr);
    let mut live = Vec::new();
    for ((i, label), db) in labels.iter().enumerate().zip(dbs) {
        let log = dir.join(format!("server-{i}.log"));
        let env = [("COUNTERSIGN_STORE_ABLATE", label.as_str())];
        let server = ServerProcess::start(db.url.expose(), &registry, &log, &env).await;
        let store = Store::connect(&db.url, &ConnectOptions::default(), Arc::new(SystemClock))
            .await
            .unwrap();
        let mut pools: Vec<(Work, Vec<Client>)> = Vec::new();
        for work in WORKS {
            pools.push((work, mcp_clients(&store, server.addr, work, clients).await));
        }
        drop(store);
        let parties = Parties {
            server: Some(server.pid),
            upstream: None,
            postgres: true,
        };
        live.push((db, server, parties, pools));
    }
    let mut configs: Vec<Config> = labels
        .iter()
        .map(|l| Config {
            label: l.clone(),
            windows: WORKS.iter().map(|w| (*w, Vec::new())).collect(),
        })
        .collect();
    for round in 0..rounds {
        eprintln!(" ablation round {}", round + 1);
        let warmup = Duration::from_secs(if round == 0 { 2 } else { 1 });
        // Each round starts one configuration later (see the main run's rounds).
        let n = live.len();
        for k in 0..n {
            let i = (k + round) % n;
            let (_, _, parties, pools) = &mut live[i];
            eprintln!("  off: {:?}", configs[i].label);
            for (j, (work, cs)) in pools.iter_mut().enumerate() {
                let (back, w) = window(*work, std::mem::take(cs), warmup, secs, *parties).await;
                *cs = back;
                configs[i].windows[j].1.push(w);
            }
        }
    }
    for (db, server, _, _) in live {
        server.stop().await;
        db.drop_db().await;
    }
    upstream.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    print(&configs, clients, secs);
}

fn print(configs: &[Config], clients: usize, secs: Duration) {
    println!("### Ablation: each write-path mechanism off (issue 34)\n");
    println!(
        "One `countersign serve` per configuration on Postgres, each on its own fresh database, \
         {clients} clients; {} rounds, each running every configuration's no-op read, floor \
         and demo ERP write for {} s in turn. Each cell: calls/s (median of rounds), the \
         server + database CPU per call, and in brackets the median per-round ratio to \
         everything on (throughput; CPU).\n",
        configs[0].windows[0].1.len(),
        secs.as_secs()
    );
    let mut head = "| mechanism off |".to_string();
    let mut rule = "|---|".to_string();
    for w in WORKS {
        head.push_str(&format!(" {} |", w.name()));
        rule.push_str("---:|");
    }
    println!("{head}\n{rule}");
    let on = &configs[0];
    for c in configs {
        let label = if c.label.is_empty() {
            "none (everything on)".to_string()
        } else {
            format!("`{}`", c.label)
        };
        let mut row = format!("| {label} |");
        for (j, (work, ws)) in c.windows.iter().enumerate() {
            let base = &on.windows[j].1;
            let per_s: Vec<f64> = ws.iter().map(Window::per_s).collect();
            let cpu: Vec<f64> = ws.iter().map(|w| w.system_ms(*work)).collect();
            let rate: Vec<f64> = ws
                .iter()
                .zip(base)
                .map(|(a, b)| a.per_s() / b.per_s())
                .collect();
            let cost: Vec<f64> = ws
                .iter()
                .zip(base)
                .map(|(a, b)| a.system_ms(*work) / b.system_ms(*work))
                .collect();
            let failed: usize = ws.iter().map(|w| w.failed).sum();
            row.push_str(&format!(
                " {:.0}/s, {:.3} ms ({:.2}×, rounds {}; {:.2}×){} |",
                median(&per_s),
                median(&cpu),
                median(&rate),
                spread(&rate, 2),
                median(&cost),
                if failed > 0 {
                    format!(", {failed} failed")
                } else {
                    String::new()
                }
            ));
        }
        println!("{row}");
    }
    println!();
}
