//! Processes of a bench and the CPU each one spends: the server (`countersign serve`, its
//! own process), Postgres (every process named `postgres`), an upstream MCP server, the load
//! generator (this process) and whatever else ran on the machine meanwhile.
//!
//! Counters come from `/proc` in clock ticks of `USER_HZ`, which Linux fixes at 100 for
//! user space; off Linux every reading is `None` and the tables say `n/a`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `/proc`'s clock ticks per second.
const USER_HZ: f64 = 100.0;

/// utime + stime (+ the children's it waited for) of `pid`, from `/proc/<pid>/stat`.
fn ticks_of(stat: &str) -> Option<u64> {
    // Fields after the command name (which may hold spaces) start at field 3; utime, stime,
    // cutime and cstime are fields 14 to 17.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let mut sum = 0;
    for i in 11..15 {
        sum += fields.get(i)?.parse::<u64>().ok()?;
    }
    Some(sum)
}

fn pid_ticks(pid: u32) -> Option<u64> {
    ticks_of(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Ticks of every process whose command name is `comm` (Postgres: the postmaster, whose
/// children's ticks include every backend that exited, and each live backend). Every
/// Postgres process of the machine counts, whatever database it serves: the bench wants a
/// quiet machine. A backend that exits between the scan's reading of the postmaster and of
/// itself is missed by that reading (rare: the benches' pools keep their connections).
fn comm_ticks(comm: &str) -> Option<u64> {
    let mut sum = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let named = stat
            .find('(')
            .zip(stat.rfind(')'))
            .is_some_and(|(a, b)| &stat[a + 1..b] == comm);
        if named && let Some(t) = ticks_of(&stat) {
            *sum.get_or_insert(0) += t;
        }
    }
    sum
}

/// Busy ticks of all CPUs (user, nice, system, irq, softirq; steal is time nothing here ran).
fn machine_busy() -> Option<u64> {
    let [user, nice, system, _idle, _iowait, irq, softirq, _steal] =
        all_cpus(&std::fs::read_to_string("/proc/stat").ok()?)?;
    Some(user + nice + system + irq + softirq)
}

/// The all-CPUs line of `/proc/stat` (`stat`, the file's text): user, nice, system, idle,
/// iowait, irq, softirq, steal ticks (guest time is inside user).
pub fn all_cpus(stat: &str) -> Option<[u64; 8]> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let f: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    f.get(..8)?.try_into().ok()
}

/// Which processes a reading covers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Parties {
    pub server: Option<u32>,
    pub upstream: Option<u32>,
    /// Whether a Postgres on this machine serves the bench (SQLite runs inside the server).
    pub postgres: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct Reading {
    /// Whether a database process was to be read (Postgres).
    postgres: bool,
    server: Option<u64>,
    upstream: Option<u64>,
    database: Option<u64>,
    client: Option<u64>,
    machine: Option<u64>,
    at: Instant,
}

impl Parties {
    pub fn read(&self) -> Reading {
        Reading {
            postgres: self.postgres,
            server: self.server.and_then(pid_ticks),
            upstream: self.upstream.and_then(pid_ticks),
            database: if self.postgres {
                comm_ticks("postgres")
            } else {
                None
            },
            client: pid_ticks(std::process::id()),
            machine: machine_busy(),
            at: Instant::now(),
        }
    }
}

/// CPU time each party spent between two readings.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spent {
    /// Whether the database runs in processes of its own (Postgres) that had to be read.
    pub postgres: bool,
    pub server: Option<Duration>,
    pub upstream: Option<Duration>,
    pub database: Option<Duration>,
    pub client: Option<Duration>,
    /// Everything else the machine ran meanwhile (other builds, the kernel's own threads).
    pub other: Option<Duration>,
    pub wall: Duration,
}

impl Spent {
    pub fn between(a: &Reading, b: &Reading) -> Self {
        let d = |x: Option<u64>, y: Option<u64>| {
            Some(Duration::from_secs_f64(
                y?.checked_sub(x?)? as f64 / USER_HZ,
            ))
        };
        let server = d(a.server, b.server);
        let upstream = d(a.upstream, b.upstream);
        let database = d(a.database, b.database);
        let client = d(a.client, b.client);
        let ours: Duration = [server, upstream, database, client].iter().flatten().sum();
        Self {
            postgres: a.postgres,
            server,
            upstream,
            database,
            client,
            other: d(a.machine, b.machine).map(|m| m.saturating_sub(ours)),
            wall: b.at.saturating_duration_since(a.at),
        }
    }

    /// The system under test: the server and, on Postgres, its database. `None` when a
    /// part of it could not be read (never a partial sum under the whole's name).
    pub fn system(&self) -> Option<Duration> {
        let database = if self.postgres {
            self.database?
        } else {
            Duration::ZERO
        };
        Some(self.server? + database)
    }
}

/// A free loopback port (bound, then released for the child to bind).
pub fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// `countersign serve` in its own process, killed when dropped.
pub struct ServerProcess {
    child: Killed,
    pub addr: SocketAddr,
    pub pid: u32,
    log: PathBuf,
}

impl ServerProcess {
    /// Starts the release binary on `db_url` with the registry folder `registry`, no
    /// executor workers, logging warnings to `log`, and `env` added; waits for `/healthz`.
    pub async fn start(db_url: &str, registry: &Path, log: &Path, env: &[(&str, &str)]) -> Self {
        let addr = free_port();
        let file = std::fs::File::create(log).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_countersign"))
            .arg("serve")
            .envs(env.iter().copied())
            .env("COUNTERSIGN_DATABASE_URL", db_url)
            .env("COUNTERSIGN_LISTEN", addr.to_string())
            .env("COUNTERSIGN_LOG_LEVEL", "warn")
            .env("COUNTERSIGN_REGISTRY", registry)
            .env("COUNTERSIGN_WORKERS", "0")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start countersign serve");
        let pid = child.id();
        let child = Killed(child);
        let mut server = Self {
            child,
            addr,
            pid,
            log: log.to_path_buf(),
        };
        server.wait_healthy().await;
        server
    }

    async fn wait_healthy(&mut self) {
        let http = reqwest::Client::new();
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if let Ok(Some(status)) = self.child.0.try_wait() {
                panic!("countersign serve exited ({status}): {}", self.log_text());
            }
            let up = http
                .get(format!("http://{}/healthz", self.addr))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if up {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("countersign serve not healthy in 60 s: {}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn stop(self) {
        drop(self.child);
    }
}

/// A child process killed (and reaped) when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// This bench binary again, in its own process, as the upstream MCP server
/// (`BENCH_UPSTREAM=1`); it prints its address on its first stdout line.
pub struct UpstreamProcess {
    child: Killed,
    pub addr: SocketAddr,
    pub pid: u32,
}

/// Set in the upstream child's environment.
pub const UPSTREAM_ENV: &str = "BENCH_UPSTREAM";

impl UpstreamProcess {
    pub async fn start() -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .env(UPSTREAM_ENV, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the upstream MCP server");
        let pid = child.id();
        let stdout = child.stdout.take().unwrap();
        let child = Killed(child);
        // Its first line comes at once (it binds, then prints).
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .map(|_| line)
        })
        .await
        .unwrap()
        .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("upstream did not say where it listens: {line:?}"));
        Self { child, addr, pid }
    }

    pub async fn stop(self) {
        drop(self.child);
    }
}
