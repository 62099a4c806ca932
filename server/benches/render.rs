//! Dashboard render time (issue 7, Performance): the real server, on SQLite and on Postgres,
//! with 10,000 pending gates and 1,000,000 audit records, rendering the approval inbox and
//! audit searches over HTTP, next to a baseline measured in the same run.
//!
//! * Seeding is bulk SQL so it takes seconds, not hours: one `INSERT … SELECT` over
//!   `generate_series` (Postgres) or a recursive CTE (SQLite) per table. Rows have the
//!   shape the server writes: gates are `payment.schedule` steps of tenant `acme` waiting for
//!   approval with canonical inputs and an expiry; audit records carry seq, time, event, run,
//!   step, tool, actor, rule and a canonical record text with `prev` and a unique `hash`.
//!   The chain is not a valid hash chain (its hashes are not SHA-256 of the records); the
//!   page then reports it as not checked, as for any chain longer than its tail limit. It
//!   keeps the chain's time order (`at` never decreases along `seq`): the seeded records
//!   start after the server's own newest one, one per millisecond.
//!   `ANALYZE` runs after seeding, as autovacuum would on a live database.
//! * Each page is fetched `BENCH_RENDERS` times (default 60) in a row by one signed-in
//!   browser-like client (demo sign-in: Ana the approver for the inbox, Aud the auditor for
//!   audit), after 5 warm-up requests; the time is the full server-side render, from request
//!   to the last byte of HTML over loopback.
//! * Baseline: the home page (`/`) for the same client: session lookup, the Leptos shell,
//!   no data.
//!
//! Run with `cargo bench -p countersign --bench render` (Postgres from
//! `COUNTERSIGN_TEST_POSTGRES_URL`, default the local one; `BENCH_GATES`, `BENCH_AUDIT`
//! change the seed sizes). Prints a markdown section on stdout; progress on stderr.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Server, env_num, fresh_postgres, ms, percentile};
use countersign_core::Backend;
use countersign_core::store::testing::FreshDb;
use sqlx::Connection;

/// One measured page.
struct Measured {
    page: &'static str,
    path: String,
    p50: Duration,
    p95: Duration,
    bytes: usize,
}

/// What one backend measured.
struct Report {
    backend: &'static str,
    seed: Duration,
    baseline: Measured,
    pages: Vec<Measured>,
}

/// The seed statements for `backend`: runs + gates ($1 = base time, $2 = gates), then audit
/// records ($1 = base time, $2 = count, $3 = first seq, $4 = runs to spread over).
fn seed_sql(backend: Backend) -> [&'static str; 3] {
    match backend {
        Backend::Postgres => [
            "INSERT INTO runs (id, tenant, principal, task, status, created_at, updated_at)
             SELECT 'bench-run-' || g, 'acme', 'agent:bench', 'bench gate ' || g, 'active',
                    $1 + g, $1 + g
             FROM generate_series(1, $2::bigint) AS g",
            "INSERT INTO steps (tenant, id, run_id, seq, role, tool, effect, inputs, inputs_hash,
                                idem_key, status, decision, rule, reason, evidence,
                                created_at, updated_at, expires_at)
             SELECT 'acme', 'bench-step-' || g, 'bench-run-' || g, 1, 'worker.finance',
                    'payment.schedule', 'irreversible',
                    '{\"amount\":' || (100 + g % 900) || '.5,\"currency\":\"EUR\",\"invoice_id\":\"INV-'
                      || lpad(g::text, 8, '0') || '\",\"reason\":\"Bench gate waiting for a person\",'
                      || '\"value_date\":\"2026-06-30\"}',
                    'sha256:' || md5('inputs' || g) || md5('i' || g),
                    'sha256:' || md5('key' || g) || md5('k' || g),
                    'needs_approval', 'require_approval', 'irreversible.always',
                    'Bench gate waiting for a person', '[]',
                    $1 + g, $1 + g, $1 + g + 259200000
             FROM generate_series(1, $2::bigint) AS g",
            "INSERT INTO audit (chain, seq, at, event, run_id, step_id, tool, actor, rule, record,
                                prev, hash)
             SELECT 'acme', s, at, event, run_id, step_id, tool, actor, rule,
                    '{\"actor\":\"' || actor || '\",\"at\":' || at || ',\"detail\":{},\"event\":\"'
                      || event || '\",\"prev\":\"' || prev || '\",\"rule\":'
                      || COALESCE('\"' || rule || '\"', 'null') || ',\"run_id\":\"' || run_id
                      || '\",\"seq\":' || s || ',\"step_id\":\"' || step_id || '\",\"tool\":\"'
                      || tool || '\"}',
                    prev, hash
             FROM (
               SELECT g + $3 - 1 AS s, $1 + g AS at,
                      (ARRAY['proposed','validated','decided','started','succeeded'])[1 + g % 5] AS event,
                      'bench-run-' || (1 + g % $4) AS run_id,
                      'bench-step-' || (1 + g % $4) AS step_id,
                      (ARRAY['invoice.get','note.draft','payment.schedule','invoice.hold'])[1 + g % 4] AS tool,
                      'agent:bench-' || (g % 20) || ' role:worker.finance tenant:acme' AS actor,
                      CASE WHEN g % 5 = 2 THEN 'role.allowed' END AS rule,
                      CASE WHEN g = 1 THEN $5
                           ELSE 'sha256:' || md5('r' || (g - 1)) || md5('s' || (g - 1)) END AS prev,
                      'sha256:' || md5('r' || g) || md5('s' || g) AS hash
               FROM generate_series(1, $2::bigint) AS g
             ) AS rows",
        ],
        Backend::Sqlite => [
            "INSERT INTO runs (id, tenant, principal, task, status, created_at, updated_at)
             WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < $2)
             SELECT 'bench-run-' || n, 'acme', 'agent:bench', 'bench gate ' || n, 'active',
                    $1 + n, $1 + n
             FROM g",
            "INSERT INTO steps (tenant, id, run_id, seq, role, tool, effect, inputs, inputs_hash,
                                idem_key, status, decision, rule, reason, evidence,
                                created_at, updated_at, expires_at)
             WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < $2)
             SELECT 'acme', 'bench-step-' || n, 'bench-run-' || n, 1, 'worker.finance',
                    'payment.schedule', 'irreversible',
                    '{\"amount\":' || (100 + n % 900) || '.5,\"currency\":\"EUR\",\"invoice_id\":\"INV-'
                      || printf('%08d', n) || '\",\"reason\":\"Bench gate waiting for a person\",'
                      || '\"value_date\":\"2026-06-30\"}',
                    printf('sha256:%064d', n), printf('sha256:k%063d', n),
                    'needs_approval', 'require_approval', 'irreversible.always',
                    'Bench gate waiting for a person', '[]',
                    $1 + n, $1 + n, $1 + n + 259200000
             FROM g",
            "INSERT INTO audit (chain, seq, at, event, run_id, step_id, tool, actor, rule, record,
                                prev, hash)
             WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < $2),
             rows AS (
               SELECT n + $3 - 1 AS s, $1 + n AS at,
                      CASE n % 5 WHEN 0 THEN 'proposed' WHEN 1 THEN 'validated'
                                 WHEN 2 THEN 'decided' WHEN 3 THEN 'started'
                                 ELSE 'succeeded' END AS event,
                      'bench-run-' || (1 + n % $4) AS run_id,
                      'bench-step-' || (1 + n % $4) AS step_id,
                      CASE n % 4 WHEN 0 THEN 'invoice.get' WHEN 1 THEN 'note.draft'
                                 WHEN 2 THEN 'payment.schedule' ELSE 'invoice.hold' END AS tool,
                      'agent:bench-' || (n % 20) || ' role:worker.finance tenant:acme' AS actor,
                      CASE WHEN n % 5 = 2 THEN 'role.allowed' END AS rule,
                      CASE WHEN n = 1 THEN $5 ELSE printf('sha256:r%063d', n - 1) END AS prev,
                      printf('sha256:r%063d', n) AS hash
               FROM g
             )
             SELECT 'acme', s, at, event, run_id, step_id, tool, actor, rule,
                    '{\"actor\":\"' || actor || '\",\"at\":' || at || ',\"detail\":{},\"event\":\"'
                      || event || '\",\"prev\":\"' || prev || '\",\"rule\":'
                      || COALESCE('\"' || rule || '\"', 'null') || ',\"run_id\":\"' || run_id
                      || '\",\"seq\":' || s || ',\"step_id\":\"' || step_id || '\",\"tool\":\"'
                      || tool || '\"}',
                    prev, hash
             FROM rows",
        ],
    }
}

/// Seeds `gates` waiting gates (created from `base`) and `records` audit records after the
/// server's own ones, one per millisecond from the returned time (after the head's `at`).
async fn seed(db: &FreshDb, gates: i64, records: i64, base: i64) -> i64 {
    let [runs, steps, audit] = seed_sql(db.backend);
    macro_rules! run_on {
        ($conn:expr, $analyze:expr) => {{
            let conn = &mut $conn;
            // The records extend tenant acme's chain (the database refuses anything else):
            // from its head, or from a new head at the genesis hash.
            let read = "SELECT seq, hash, at FROM audit_chains WHERE chain = 'acme'";
            let found: Option<(i64, String, i64)> =
                sqlx::query_as(read).fetch_optional(&mut *conn).await.unwrap();
            let (head, head_hash, head_at) = match found {
                Some(h) => h,
                None => {
                    sqlx::query(
                        "INSERT INTO audit_chains (chain, seq, hash, at) VALUES ('acme', 0, $1, $2)",
                    )
                    .bind(countersign_core::audit::GENESIS)
                    .bind(i64::MIN)
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                    (0, countersign_core::audit::GENESIS.to_string(), i64::MIN)
                }
            };
            // After every record so far, in any chain: the search maps a time range to a range
            // of the write order, which holds while time and write order agree.
            let newest: i64 =
                sqlx::query_scalar("SELECT CAST(COALESCE(MAX(at), 0) AS BIGINT) FROM audit")
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap();
            let audit_base = head_at.max(newest).max(base);
            let mut tx = conn.begin().await.unwrap();
            sqlx::query(runs)
                .bind(base)
                .bind(gates)
                .execute(&mut *tx)
                .await
                .unwrap();
            sqlx::query(steps)
                .bind(base)
                .bind(gates)
                .execute(&mut *tx)
                .await
                .unwrap();
            sqlx::query(audit)
                .bind(audit_base)
                .bind(records)
                .bind(head + 1)
                .bind(gates.max(1))
                .bind(&head_hash)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            sqlx::query($analyze).execute(&mut *conn).await.unwrap();
            audit_base
        }};
    }
    match db.backend {
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(db.url.expose()).await.unwrap();
            run_on!(conn, "ANALYZE")
        }
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(db.url.expose())
                .await
                .unwrap();
            run_on!(conn, "ANALYZE")
        }
    }
}

/// A browser-like client signed in as demo user `user`.
async fn signed_in(server: &Server, user: &str) -> reqwest::Client {
    let client = reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    let resp = client
        .post(format!("http://{}/auth/demo", server.addr))
        .header("origin", format!("http://{}", server.addr))
        .form(&[("user", user)])
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        reqwest::StatusCode::SEE_OTHER,
        "demo sign-in"
    );
    client
}

/// Fetches `path` `n` times after 5 warm-ups; checks each page holds `expect`.
async fn measure(
    server: &Server,
    client: &reqwest::Client,
    page: &'static str,
    path: &str,
    expect: &str,
    n: u64,
) -> Measured {
    let url = format!("http://{}{path}", server.addr);
    let mut lat = Vec::new();
    let mut bytes = 0;
    for i in 0..(n + 5) {
        let start = Instant::now();
        let resp = client.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), reqwest::StatusCode::OK, "{path}");
        let body = resp.text().await.unwrap();
        let took = start.elapsed();
        assert!(body.contains(expect), "{path}: no {expect:?} in the page");
        bytes = body.len();
        if i >= 5 {
            lat.push(took);
        }
    }
    lat.sort();
    Measured {
        page,
        path: path.to_string(),
        p50: percentile(&lat, 50.0),
        p95: percentile(&lat, 95.0),
        bytes,
    }
}

async fn run(db: FreshDb, label: &'static str, gates: i64, records: i64, n: u64) -> Report {
    eprintln!("bench: {label}: starting the server");
    let server = Server::start(&db).await;
    let base = server.state.store.clock().now_ms() - 86_400_000;
    eprintln!("bench: {label}: seeding {gates} gates and {records} audit records");
    let began = Instant::now();
    let audit_base = seed(&db, gates, records, base).await;
    let seed_time = began.elapsed();
    eprintln!("bench: {label}: seeded in {:.1} s", seed_time.as_secs_f64());

    let ana = signed_in(&server, "ana").await;
    let aud = signed_in(&server, "aud").await;
    let baseline = measure(&server, &ana, "home page (baseline)", "/", "Countersign", n).await;
    let day = |offset_ms: i64| {
        chrono::DateTime::from_timestamp_millis(audit_base + offset_ms)
            .unwrap()
            .format("%Y-%m-%dT%H:%M")
            .to_string()
    };
    let pages = vec![
        measure(&server, &ana, "inbox", "/inbox", "data-testid=\"gate-row\"", n).await,
        measure(&server, &aud, "audit, newest page", "/audit", "bench-step-", n).await,
        measure(
            &server,
            &aud,
            "audit, tool + event",
            "/audit?tool=payment.schedule&event=started",
            "bench-step-",
            n,
        )
        .await,
        measure(
            &server,
            &aud,
            "audit, actor + time range",
            &format!(
                "/audit?actor=agent%3Abench-7%20role%3Aworker.finance%20tenant%3Aacme&from={}&to={}",
                day(200_000),
                day(500_000)
            ),
            "bench-step-",
            n,
        )
        .await,
        measure(
            &server,
            &aud,
            "audit, one run",
            "/audit?run=bench-run-4242",
            "bench-step-4242",
            n,
        )
        .await,
    ];
    server.stop().await;
    db.drop_db().await;
    Report {
        backend: label,
        seed: seed_time,
        baseline,
        pages,
    }
}

#[tokio::main]
async fn main() {
    let gates = i64::try_from(env_num("BENCH_GATES", 10_000)).unwrap();
    let records = i64::try_from(env_num("BENCH_AUDIT", 1_000_000)).unwrap();
    let n = env_num("BENCH_RENDERS", 60);
    let sqlite = FreshDb::create(Backend::Sqlite).await.unwrap();
    let mut reports = vec![run(sqlite, "SQLite", gates, records, n).await];
    let postgres = fresh_postgres().await;
    reports.push(run(postgres, "Postgres", gates, records, n).await);

    println!("### Dashboard render (issue 7)\n");
    println!(
        "Server render time of full dashboard pages over loopback HTTP (SSR, signed in through the \
         demo sign-in), with {gates} pending gates and {records} audit records seeded by bulk SQL; \
         {n} requests per page after 5 warm-ups, one at a time. Baseline: the home page for the \
         same session (session lookup and the page shell, no data). Target: p95 under 100 ms.\n"
    );
    println!("| backend | page | p50 | p95 | p50 / baseline p50 | HTML |");
    println!("|---|---|---:|---:|---:|---:|");
    for r in &reports {
        for m in std::iter::once(&r.baseline).chain(r.pages.iter()) {
            println!(
                "| {} | {} (`{}`) | {} | {} | {:.1}× | {} kB |",
                r.backend,
                m.page,
                m.path,
                ms(m.p50),
                ms(m.p95),
                m.p50.as_secs_f64() / r.baseline.p50.as_secs_f64().max(1e-9),
                m.bytes / 1024
            );
        }
    }
    println!();
    for r in &reports {
        println!(
            "- {}: seeding took {:.1} s.",
            r.backend,
            r.seed.as_secs_f64()
        );
    }
    println!();
}
