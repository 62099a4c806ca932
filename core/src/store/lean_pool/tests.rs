//! The lean pool's tests: parking and lending, the paths back through sqlx, close, and a TCP
//! relay that goes silent or holds answers (the idle check's bound, a cut-off `BEGIN`).

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use super::LeanPool;
use crate::store::testing::postgres_admin_url;

/// A lean pool of at most `size` connections to the test Postgres; `None` when it is
/// unreachable outside CI.
async fn pool(size: u32) -> Option<LeanPool<Postgres>> {
    let connected = PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(3))
        .connect(&postgres_admin_url())
        .await;
    match connected {
        Ok(p) => Some(LeanPool::new(p)),
        Err(e) if !crate::store::testing::in_ci() => {
            eprintln!("WARNING: Postgres unreachable, lean pool tests skipped: {e}");
            None
        }
        Err(e) => panic!("Postgres unreachable in CI: {e}"),
    }
}

async fn backend_pid(p: &LeanPool<Postgres>) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(p)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_finished_statement_parks_its_connection_and_the_next_reuses_it() {
    let Some(p) = pool(4).await else { return };
    let first = backend_pid(&p).await;
    assert_eq!(p.parked_now(), 1);
    for _ in 0..5 {
        assert_eq!(
            backend_pid(&p).await,
            first,
            "the parked connection is lent again"
        );
    }
    assert_eq!(p.parked_now(), 1);
    p.close().await;
}

#[tokio::test]
async fn failed_cancelled_and_uncommitted_uses_go_back_through_sqlx_committed_ones_are_parked() {
    let Some(p) = pool(4).await else { return };
    // A failed statement.
    assert!(
        sqlx::query("SELECT * FROM no_such_table")
            .execute(&p)
            .await
            .is_err()
    );
    assert_eq!(
        p.parked_now(),
        0,
        "a failed statement's connection is not parked"
    );
    // A statement dropped mid-way (its request cancelled).
    let cancelled = tokio::time::timeout(
        Duration::from_millis(100),
        sqlx::query("SELECT pg_sleep(1)").execute(&p),
    )
    .await;
    assert!(cancelled.is_err(), "the sleep was cut short");
    assert_eq!(
        p.parked_now(),
        0,
        "a cancelled statement's connection is not parked"
    );
    // A transaction dropped open, rolled back, or failing at its commit.
    let mut tx = p.begin_with("BEGIN").await.unwrap();
    let dropped: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    drop(tx);
    // Its ROLLBACK is sent by sqlx's check, in a task of its own: its session ends
    // idle, not idle in a transaction.
    let admin = PgPool::connect(&postgres_admin_url()).await.unwrap();
    let mut state = String::new();
    for _ in 0..500 {
        state = sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE pid = $1")
            .bind(dropped)
            .fetch_one(&admin)
            .await
            .unwrap();
        if state == "idle" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(state, "idle", "a dropped transaction is rolled back");
    admin.close().await;
    let tx = p.begin().await.unwrap();
    tx.rollback().await.unwrap();
    let mut tx = p.begin().await.unwrap();
    sqlx::query("CREATE TEMP TABLE lean_deferred (x INT UNIQUE DEFERRABLE INITIALLY DEFERRED)")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("INSERT INTO lean_deferred VALUES (1), (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(
        tx.commit().await.is_err(),
        "the deferred check fails the commit"
    );
    assert_eq!(
        p.parked_now(),
        0,
        "a transaction's connection is parked only after its commit"
    );
    // A committed transaction's connection is parked like a finished statement's.
    let mut tx = p.begin().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(p.parked_now() >= 1);
    assert_eq!(backend_pid(&p).await, pid, "lent again after its commit");
    // The pool still answers (sqlx kept or replaced those connections).
    backend_pid(&p).await;
    p.close().await;
}

#[tokio::test]
async fn a_borrower_waiting_at_the_pools_size_gets_the_connection_that_finishes() {
    // One connection: the second statement waits on sqlx's pool while the first holds it.
    // Were the first's connection parked in the free list, the second would wait out
    // sqlx's acquire timeout (3 s) and fail; it goes back through sqlx instead, and is
    // parked after the second statement (nobody waits then).
    let Some(p) = pool(1).await else { return };
    let slow = sqlx::query("SELECT pg_sleep(0.3)").execute(&p);
    let quick = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        backend_pid(&p).await
    };
    let (slow, _) = tokio::join!(slow, quick);
    slow.unwrap();
    assert_eq!(p.parked_now(), 1);
    p.close().await;
}

#[tokio::test]
async fn a_connection_idle_past_the_ping_interval_is_checked_before_it_is_lent() {
    let Some(p) = pool(4).await else { return };
    let parked = backend_pid(&p).await;
    assert_eq!(p.parked_now(), 1);
    // The database ends the parked connection's session (a restart, a firewall).
    let admin = PgPool::connect(&postgres_admin_url()).await.unwrap();
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(parked)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(ended);
    admin.close().await;
    tokio::time::sleep(super::PING_AFTER_IDLE + Duration::from_millis(200)).await;
    // The ping finds it broken: the statement runs on another connection.
    let next = backend_pid(&p).await;
    assert_ne!(next, parked);
    p.close().await;
}

/// The relay passes everything.
const PASS: u8 = 0;
/// The relay drops everything, both ways (a firewall dropping packets).
const SILENT: u8 = 1;
/// The relay holds the server's answers until it passes again (a slow network).
const HOLD: u8 = 2;

/// A lean pool of one connection to the test Postgres, through a TCP relay switched by
/// the returned mode ([`PASS`], [`SILENT`], [`HOLD`]), with a 1 s acquire timeout.
async fn relayed_pool() -> Option<(LeanPool<Postgres>, Arc<AtomicU8>)> {
    let options = PgConnectOptions::from_str(&postgres_admin_url()).unwrap();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_port = listener.local_addr().unwrap().port();
    let mode = Arc::new(AtomicU8::new(PASS));
    let switch = Arc::clone(&mode);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&upstream).await else {
                continue;
            };
            let (client_in, client_out) = client.into_split();
            let (server_in, server_out) = server.into_split();
            tokio::spawn(pump(client_in, server_out, Arc::clone(&switch), false));
            tokio::spawn(pump(server_in, client_out, Arc::clone(&switch), true));
        }
    });
    let connected = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(options.host("127.0.0.1").port(relay_port))
        .await;
    match connected {
        Ok(p) => Some((LeanPool::new(p), mode)),
        Err(e) if !crate::store::testing::in_ci() => {
            eprintln!("WARNING: Postgres unreachable, lean pool tests skipped: {e}");
            None
        }
        Err(e) => panic!("Postgres unreachable through the test relay in CI: {e}"),
    }
}

/// Copies bytes one way as `mode` says (`answers`: this is the server-to-client way).
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mode: Arc<AtomicU8>, answers: bool) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while answers && mode.load(Ordering::SeqCst) == HOLD {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if mode.load(Ordering::SeqCst) == SILENT {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_parked_connection_gone_silent_is_dropped_and_its_place_freed_within_the_timeout() {
    let Some((p, mode)) = relayed_pool().await else {
        return;
    };
    backend_pid(&p).await;
    assert_eq!(p.parked_now(), 1);
    mode.store(SILENT, Ordering::SeqCst);
    tokio::time::sleep(super::PING_AFTER_IDLE + Duration::from_millis(200)).await;
    // Its check goes unanswered, and so does a new connection's start: the lend ends at
    // the acquire timeout, and the silent connection no longer holds the pool's one
    // place (sqlx's own check of it would hang).
    let silenced = sqlx::query("SELECT 1").execute(&p).await;
    assert!(
        matches!(silenced, Err(sqlx::Error::PoolTimedOut)),
        "{silenced:?}"
    );
    assert_eq!(
        p.shared.sqlx.size(),
        0,
        "the silent connection's place is free"
    );
    // The network heals: the next statement opens a new connection.
    mode.store(PASS, Ordering::SeqCst);
    assert!(backend_pid(&p).await > 0);
    p.close().await;
}

#[tokio::test]
async fn a_connection_whose_begin_was_cut_off_is_never_lent_again() {
    let Some((p, mode)) = relayed_pool().await else {
        return;
    };
    backend_pid(&p).await;
    // The server runs the BEGIN; its answer is held until the borrower has gone.
    mode.store(HOLD, Ordering::SeqCst);
    let cut = tokio::time::timeout(Duration::from_millis(200), p.begin()).await;
    assert!(cut.is_err(), "the BEGIN's answer was held");
    mode.store(PASS, Ordering::SeqCst);
    // What the pool lends next commits what it runs: another session sees its table.
    // (Lent again, the cut-off connection would run it inside the open transaction.)
    let table = format!("lean_cut_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE TABLE {table} (x INT)"))
        .execute(&p)
        .await
        .unwrap();
    let admin = PgPool::connect(&postgres_admin_url()).await.unwrap();
    let seen: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&table)
        .fetch_one(&admin)
        .await
        .unwrap();
    p.close().await;
    sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    assert!(
        seen,
        "the statement after a cut-off BEGIN ran in no transaction"
    );
}

#[tokio::test]
async fn a_statement_ending_after_close_hands_its_connection_to_sqlx_and_close_returns() {
    let Some(p) = pool(4).await else { return };
    backend_pid(&p).await;
    let slow = sqlx::query("SELECT pg_sleep(0.5)").execute(&p);
    let close = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        tokio::time::timeout(Duration::from_secs(10), p.close()).await
    };
    let (slow, closed) = tokio::join!(slow, close);
    slow.unwrap();
    closed.expect("close returns once the statement in flight ends");
    assert_eq!(p.parked_now(), 0);
    let after = sqlx::query("SELECT 1").execute(&p).await;
    assert!(
        matches!(after, Err(sqlx::Error::PoolClosed)),
        "nothing is lent after close: {after:?}"
    );
}

#[tokio::test]
async fn sqlite_connections_are_parked_and_lent_again_too() {
    let dir = std::env::temp_dir().join(format!("lean-pool-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("t.db").display());
    let sqlx = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(crate::store::sqlite_connect_options(&url).unwrap())
        .await
        .unwrap();
    let p = LeanPool::new(sqlx);
    // A temporary table lives on its connection only: the next statement finds it.
    sqlx::query("CREATE TEMP TABLE mine (x INTEGER)")
        .execute(&p)
        .await
        .unwrap();
    assert_eq!(p.parked_now(), 1);
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM temp.mine")
        .fetch_one(&p)
        .await
        .unwrap();
    assert_eq!(n, 0);
    assert!(
        sqlx::query("SELECT * FROM nowhere")
            .execute(&p)
            .await
            .is_err()
    );
    assert_eq!(p.parked_now(), 0);
    p.close().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn closing_with_parked_connections_returns() {
    let Some(p) = pool(4).await else { return };
    let (a, b) = tokio::join!(backend_pid(&p), backend_pid(&p));
    assert!(a > 0 && b > 0);
    assert!(p.parked_now() >= 1);
    tokio::time::timeout(Duration::from_secs(10), p.close())
        .await
        .expect("close waits for no parked connection");
}
