//! The read path's deterministic budget (issue 34), counted on the wire: the server reaches
//! Postgres through a proxy in this test that reads the Postgres protocol's frontend messages
//! and counts round trips per connection (a `Sync` closes an extended-protocol query, a
//! `Query` is a simple one), so every statement the store sends is counted whatever code path
//! sent it. The committer's batches are the transactions (BEGIN … COMMIT on one connection)
//! and the one-trip statements (`countersign_commit_batch`); every other statement is the
//! request path's (a steady read's request path runs no transaction; one that did would be
//! counted in the committer's budget and fail it, not hide). A round trip that carries no
//! statement (sqlx's ping of a connection it takes back into its pool: the store's lean pool
//! skips it for statements that completed and transactions that committed,
//! `store::lean_pool`) is counted apart and not held to the budget.
//!
//! Budget of one steady-state allowed read: at most 3 statements on its request path, at most 1
//! in its committer batch (a sequential client's read is one batch: `countersign_commit_batch`
//! writes its step row and its record in one statement, migration 24), exactly 1 audit record
//! and at most 1 step row. Background pollers (registry,
//! checkpoints) may add statements to a window, never remove any: the best of a few windows
//! is held to the budget.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use countersign_core::Backend;
use countersign_core::store::testing::FreshDb;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{example, spawn_app_on};
use crate::mcp::{Client, INV, agent};

/// Round trips per pool, and the statements they carried, in order.
#[derive(Default, Clone, Debug)]
struct Counts {
    request: Vec<String>,
    batch: Vec<String>,
    /// Round trips that carry no statement (see [`Frontend::typed`]).
    pings: usize,
}

/// A TCP proxy to `upstream` counting round trips into `counts`.
async fn counting_proxy(upstream: SocketAddr, counts: Arc<Mutex<Counts>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let counts = counts.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut from_server, mut to_server) = tokio::io::split(server);
                let (mut from_client, mut to_client) = tokio::io::split(client);
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                });
                let mut conn = Frontend::default();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match from_client.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    conn.feed(&buf[..n], &counts);
                    if to_server.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// One connection's frontend stream, parsed as it passes.
#[derive(Default)]
struct Frontend {
    pending: Vec<u8>,
    /// The startup message was read (typed messages follow).
    started: bool,
    /// Inside a transaction (a committer batch): from its BEGIN to its COMMIT or ROLLBACK.
    in_tx: bool,
    /// Prepared statements by name, and the statement the next `Sync` closes.
    prepared: std::collections::HashMap<String, String>,
    current: String,
    /// The message kinds since the last round trip (shown for one that names no statement).
    kinds: String,
}

impl Frontend {
    fn feed(&mut self, bytes: &[u8], counts: &Mutex<Counts>) {
        self.pending.extend_from_slice(bytes);
        loop {
            let header = if self.started { 5 } else { 4 };
            if self.pending.len() < header {
                return;
            }
            let at = header - 4;
            let len = u32::from_be_bytes(self.pending[at..at + 4].try_into().unwrap()) as usize;
            let total = at + len;
            if self.pending.len() < total {
                return;
            }
            let message: Vec<u8> = self.pending.drain(..total).collect();
            if self.started {
                self.typed(message[0], &message[5..], counts);
            } else {
                self.untyped(&message[4..]);
            }
        }
    }

    /// SSLRequest / GSSENCRequest (answered by one byte; untyped messages follow) or the
    /// startup message.
    fn untyped(&mut self, body: &[u8]) {
        let code = u32::from_be_bytes(body[..4].try_into().unwrap());
        if code == 80_877_103 || code == 80_877_104 {
            return;
        }
        self.started = true;
    }

    fn typed(&mut self, kind: u8, body: &[u8], counts: &Mutex<Counts>) {
        self.kinds.push(char::from(kind));
        let text = |b: &[u8]| {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            (String::from_utf8_lossy(&b[..end]).to_string(), end + 1)
        };
        match kind {
            b'P' => {
                let (name, used) = text(body);
                let (query, _) = text(&body[used..]);
                self.prepared.insert(name, query.clone());
                self.current = query;
            }
            b'B' => {
                let (_portal, used) = text(body);
                let (name, _) = text(&body[used..]);
                if let Some(q) = self.prepared.get(&name) {
                    self.current = q.clone();
                }
            }
            b'S' | b'Q' => {
                let statement = if kind == b'Q' {
                    text(body).0
                } else {
                    std::mem::take(&mut self.current)
                };
                let statement = statement.split_whitespace().collect::<Vec<_>>().join(" ");
                let kinds = std::mem::take(&mut self.kinds);
                let mut c = counts.lock().unwrap();
                // A bare Sync carries no statement: sqlx's ping, which it sends whenever a
                // connection goes back to its pool (sqlx-core 0.8, `return_to_pool`).
                let upper = statement.to_ascii_uppercase();
                if upper.starts_with("BEGIN") {
                    self.in_tx = true;
                }
                let batch = self.in_tx || upper.starts_with("SELECT COUNTERSIGN_COMMIT_BATCH(");
                if upper.starts_with("COMMIT") || upper.starts_with("ROLLBACK") {
                    self.in_tx = false;
                }
                if kinds == "S" {
                    c.pings += 1;
                } else if batch {
                    c.batch.push(statement);
                } else {
                    c.request.push(statement);
                }
            }
            _ => {}
        }
    }
}

/// Reads through Countersign on Postgres stay within the budget (see the module doc).
#[tokio::test]
async fn a_steady_state_read_stays_within_its_statement_budget() {
    let Some(db) = FreshDb::create(Backend::Postgres).await else {
        return;
    };
    let real = url::Url::parse(db.url.expose()).unwrap();
    let upstream: SocketAddr = tokio::net::lookup_host((
        real.host_str().unwrap().to_string(),
        real.port().unwrap_or(5432),
    ))
    .await
    .unwrap()
    .next()
    .unwrap();
    let counts = Arc::new(Mutex::new(Counts::default()));
    let proxy = counting_proxy(upstream, counts.clone()).await;
    let mut proxied = real.clone();
    proxied.set_host(Some("127.0.0.1")).unwrap();
    proxied.set_port(Some(proxy.port())).unwrap();
    // The protocol in clear, so that the proxy can read it.
    proxied.query_pairs_mut().append_pair("sslmode", "disable");
    let registry = example("finance");
    let app = spawn_app_on(
        db,
        &[
            ("COUNTERSIGN_DATABASE_URL", proxied.as_str()),
            ("COUNTERSIGN_REGISTRY", registry.as_str()),
            ("COUNTERSIGN_WORKERS", "0"),
        ],
    )
    .await;
    let (_, token) = agent(&app, "fin-budget", "worker.finance").await;
    let mut client = Client::new(&app, &token);
    client.connect().await;
    let read = json!({"invoice_id": INV});
    // Warm: the session's run, the committer's chain head, every statement prepared.
    for _ in 0..5 {
        client.call("invoice.get", read.clone()).await;
    }
    let rows = |sql: &'static str| {
        let store = app.store.clone();
        async move {
            store.query_strings(sql).await.unwrap()[0]
                .parse::<usize>()
                .unwrap()
        }
    };
    const CALLS: usize = 10;
    let mut best: Option<Counts> = None;
    for _ in 0..4 {
        let audit_before = rows("SELECT COUNT(*)::text FROM audit").await;
        let steps_before = rows("SELECT COUNT(*)::text FROM steps").await;
        let start = counts.lock().unwrap().clone();
        for _ in 0..CALLS {
            let answer = client.call("invoice.get", read.clone()).await;
            assert!(answer["result"]["isError"] != json!(true), "{answer}");
        }
        let end = counts.lock().unwrap().clone();
        let window = Counts {
            request: end.request[start.request.len()..].to_vec(),
            batch: end.batch[start.batch.len()..].to_vec(),
            pings: end.pings - start.pings,
        };
        // Every read audited once, and one step row each (counted after the window).
        assert_eq!(
            rows("SELECT COUNT(*)::text FROM audit").await - audit_before,
            CALLS,
            "one audit record per read"
        );
        assert_eq!(
            rows("SELECT COUNT(*)::text FROM steps").await - steps_before,
            CALLS,
            "one step row per read"
        );
        let total = |c: &Counts| c.request.len() + c.batch.len();
        if best.as_ref().is_none_or(|b| total(&window) < total(b)) {
            best = Some(window);
        }
    }
    let best = best.unwrap();
    let request: Vec<&String> = best.request.iter().collect();
    eprintln!(
        "{CALLS} reads: {} request-path statements, {} committer statements (+{} pings on \
         release)",
        request.len(),
        best.batch.len(),
        best.pings,
    );
    // The proxy saw the traffic (an upper bound alone would pass on counting nothing): one
    // one-trip batch a read in the committer, and the request path reached the store.
    let one_trips = best
        .batch
        .iter()
        .filter(|s| s.starts_with("SELECT countersign_commit_batch("))
        .count();
    assert_eq!(one_trips, CALLS, "{:?}", best.batch);
    assert!(request.len() >= CALLS, "{request:?}");
    // The store's lean pool hands a completed statement's connection back without sqlx's
    // round trip (41 pings for 10 reads before it): the reads send none; a background
    // transaction or an idle connection's check may add one or two.
    assert!(
        best.pings < CALLS,
        "{} pings on release for {CALLS} reads: connections go back through sqlx's pool",
        best.pings
    );
    assert!(
        request.len() <= 3 * CALLS,
        "{} request-path statements for {CALLS} reads (budget 3 each):\n{}",
        request.len(),
        request
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        best.batch.len() <= CALLS,
        "{} committer statements for {CALLS} reads, one batch each (budget 1 a batch: the \
         one-trip statement):\n{}",
        best.batch.len(),
        best.batch.join("\n")
    );
    app.stop().await;
}
