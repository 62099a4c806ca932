//! The finance demo (`countersign serve --demo`, config `demo = true`): on a database with no
//! runs, the scripted agents of `examples/finance/demo/seed.yaml` play against this server at
//! start, over its real `/mcp` and approval API, so the dashboard shows real data on first load.
//!
//! Invariants:
//! * off unless asked for; never plays on a database that already has runs (a restart, or a
//!   production database, is left alone);
//! * it goes through the same gateway, policy, gates and audit as any agent: the demo approver
//!   signs in through the demo sign-in (loopback, no OIDC issuer), so with OIDC configured the
//!   demo stops at the first approval and says so — it never bypasses a gate;
//! * a failure is logged, never fatal to serving.

use countersign_core::Store;

use crate::scenario::{self, Report, ScenarioError, Target};

/// The demo script, built into the binary.
pub const SEED: &str = include_str!("../../examples/finance/demo/seed.yaml");

/// The tenant the demo plays in (the demo people's).
pub const TENANT: &str = "acme";

/// Plays the demo against the server at `url` if `store` has no runs of the demo tenant.
/// `Ok(None)`: skipped (not empty).
pub async fn seed(
    store: &Store,
    url: &str,
    origin: Option<String>,
) -> Result<Option<Report>, ScenarioError> {
    let empty = store
        .list_runs(TENANT, 1)
        .await
        .map_err(|e| ScenarioError::Parse(format!("listing runs: {e}")))?
        .is_empty();
    if !empty {
        return Ok(None);
    }
    let script = scenario::parse(SEED)?;
    let target = Target {
        url: url.to_string(),
        origin,
        store: store.clone(),
        advance: None,
    };
    scenario::run(&script, &target).await.map(Some)
}

/// Waits until the server at `url` answers `/healthz` (at most ~10 s), then plays the demo;
/// logs the outcome.
pub async fn seed_when_up(store: Store, url: String, origin: Option<String>) {
    let http = reqwest::Client::new();
    for _ in 0..100 {
        if http
            .get(format!("{url}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    match seed(&store, &url, origin).await {
        Ok(None) => tracing::info!("demo: the database has runs already; not played"),
        Ok(Some(report)) => {
            let failed = report.failures();
            if failed.is_empty() {
                tracing::info!(
                    checks = report.checks.len(),
                    "demo: played (one paid run, one payment waiting in the inbox, one refused injection)"
                );
            } else {
                for c in failed {
                    tracing::warn!(check = %c.name, detail = %c.detail, "demo: expectation not met");
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "demo: stopped"),
    }
}
