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

/// How many gated invoice holds the demo's gate history decides.
pub const HOLDS: usize = 30;

/// The holds the gate history leaves waiting (amount EUR, PO line), one batch for the inbox.
pub const WAITING_HOLDS: [(u32, u32); 3] = [(1250, 1), (1480, 2), (2100, 3)];

/// The one hold of [`HOLDS`] a person rejects.
const REJECTED_HOLD: usize = 17;

/// The demo's gate history (issue 33), played after [`SEED`]: the finance worker asks to hold
/// invoice INV-20260615 [`HOLDS`] times for growing disputed amounts (1,100 to 6,030 EUR, each
/// above the 1,000 EUR threshold, so each waits for a person); Ana approves them but one,
/// which Pat rejects, and each approved hold runs on the worker's next call. The advisor then
/// has evidence (30 decisions, one rejection, the tool's reversal cost), the shadow cap on
/// holds above 5,000 EUR has would-denies, and Max drafts the advisor's proposal, so the admin
/// page shows a proposal with a non-empty impact preview. Three holds of another invoice (a
/// batch) and a 12,750 EUR payment (two approvers) are left waiting in the inbox.
pub fn gate_history() -> String {
    let mut steps = String::new();
    for i in 0..HOLDS {
        let amount = 1100 + 170 * i;
        let args = format!(
            "{{invoice_id: INV-20260615, amount: {amount}, currency: EUR, reason: \"Racking delivery {i}: quantity disputed with the supplier\"}}"
        );
        steps.push_str(&format!(
            "  - as: fin\n    call: invoice.hold\n    arguments: {args}\n    reply: {{equal: {{/status: needs_approval}}}}\n    save: {{h{i}: /step_id}}\n"
        ));
        if i == REJECTED_HOLD {
            steps.push_str(&format!(
                "  - as: pat\n    decide: {{step: \"${{h{i}}}\", verdict: rejected, reason: \"The quantity dispute was settled with the supplier on the phone\"}}\n"
            ));
        } else {
            steps.push_str(&format!(
                "  - as: ana\n    decide: {{step: \"${{h{i}}}\", verdict: approved, reason: \"Goods receipt shows the shortfall\"}}\n  - as: fin\n    call: invoice.hold\n    arguments: {args}\n"
            ));
        }
    }
    // Left waiting for the inbox: three holds of one invoice (one batch), and a payment above
    // the second-approval threshold (two people).
    for (amount, line) in WAITING_HOLDS {
        steps.push_str(&format!(
            "  - as: fin\n    call: invoice.hold\n    arguments: {{invoice_id: INV-20260613, amount: {amount}, currency: EUR, reason: \"Freight contract: quantity disputed on line {line}\"}}\n    reply: {{equal: {{/status: needs_approval}}}}\n"
        ));
    }
    steps.push_str("  - as: fin\n    call: payment.schedule\n    arguments: {invoice_id: INV-20260613, amount: 12750, currency: EUR, value_date: \"2026-06-30\", reason: \"Annual freight contract, first instalment as agreed\"}\n    reply: {equal: {/status: needs_approval}}\n");
    format!(
        "name: finance demo, gate history\nseed: \"000\"\nactors:\n  fin: {{role: worker.finance}}\n  ana: {{person: ana}}\n  pat: {{person: pat}}\n  max: {{person: max}}\nsteps:\n{steps}  - note: the advisor recommends the model reviewer; Max drafts the proposal\n    as: max\n    form: {{path: /gates/draft, fields: {{tool: invoice.hold, rule: amount.threshold}}}}\nexpect:\n  effects:\n    - {{operation: invoices.hold, count: {}}}\n",
        HOLDS - 1
    )
}

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
    let target = Target {
        url: url.to_string(),
        origin,
        store: store.clone(),
        advance: None,
    };
    let mut report = scenario::run(&scenario::parse(SEED)?, &target).await?;
    let history = scenario::run(&scenario::parse(&gate_history())?, &target).await?;
    report.checks.extend(history.checks);
    Ok(Some(report))
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
                    "demo: played (one paid run, five gates waiting in the inbox, one refused injection, 30 decided holds, the advisor's draft)"
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
