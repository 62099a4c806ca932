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

use std::sync::Arc;

use countersign_core::{DemoClock, ManualClock, Store};

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

/// How many days of history the demo plays when the server's clock can be moved
/// ([`ClockHand`]): one gated hold a day ([`HOLDS`] of them), so the metrics have trends.
pub const HISTORY_DAYS: usize = HOLDS;

/// Moves the server's clock forward (the demo's [`DemoClock`], a test's [`ManualClock`]): the
/// demo's history is played a day at a time with it.
pub trait ClockHand: Send + Sync {
    /// Moves the clock `by` forward.
    fn advance(&self, by: chrono::Duration);
    /// Brings the clock to the present (where it has one).
    fn to_present(&self);
}

impl ClockHand for DemoClock {
    fn advance(&self, by: chrono::Duration) {
        self.catch_up(by);
    }

    fn to_present(&self) {
        self.catch_up(self.lag());
    }
}

impl ClockHand for ManualClock {
    fn advance(&self, by: chrono::Duration) {
        ManualClock::advance(self, by);
    }

    /// A manual clock's present is wherever the history left it.
    fn to_present(&self) {}
}

/// The demo's clock for a server about to play the demo on `store`: [`HISTORY_DAYS`] behind
/// the real time when the database has no runs of the demo tenant (the demo will play),
/// `None` otherwise (a restart: real time).
pub async fn clock_for(store: &Store) -> Result<Option<DemoClock>, countersign_core::StoreError> {
    let empty = store.list_runs(TENANT, 1).await?.is_empty();
    // The first day half a day inside the month: every decision in a 30-day window.
    let lag = chrono::Duration::days(HISTORY_DAYS as i64 - 1) + chrono::Duration::hours(12);
    Ok(empty.then(|| DemoClock::behind(lag)))
}

/// The day of the history (counted from its first) on which the ERP pays a racking deposit
/// but the answer is lost and the ERP cannot tell reconciliation either: the demo's escalation.
const UNKNOWN_DAY: usize = 27;

/// The demo's gate history (issues 33 and 36), played before [`SEED`]: the finance worker asks
/// to hold invoice INV-20260615 [`HOLDS`] times for growing disputed amounts (1,100 to 6,030
/// EUR, each above the 1,000 EUR threshold, so each waits for a person); Ana approves them but
/// one, which Pat rejects, and each approved hold runs on the worker's next call. With `days`
/// the holds are one a day over [`HISTORY_DAYS`] days (the clock advanced between them), and
/// on day [`UNKNOWN_DAY`] the 3,720 EUR racking deposit (INV-20260616) is paid, its answer lost while the ERP's
/// lookup is down: an `unknown` nobody can reconcile, which goes to the escalations page; a
/// hold of INV-20260612 is left waiting that day, so its gate expires within hours of today.
pub fn history(days: bool) -> String {
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
        if days && i == UNKNOWN_DAY {
            steps.push_str(UNKNOWN_PAYMENT);
            // Left waiting since then: its gate expires within the day.
            steps.push_str(EXPIRING_HOLD);
        }
        if days && i + 1 < HOLDS {
            steps.push_str("  - advance: 24h\n");
        }
    }
    if !days {
        steps.push_str(UNKNOWN_PAYMENT);
    }
    format!(
        "name: finance demo, gate history\nseed: \"000\"\nactors:\n  fin: {{role: worker.finance}}\n  ana: {{person: ana}}\n  pat: {{person: pat}}\nsteps:\n{steps}expect:\n  effects:\n    - {{operation: invoices.hold, count: {}}}\n",
        HOLDS - 1
    )
}

/// A hold left waiting on the history's last days: the inbox's gate that expires soon.
const EXPIRING_HOLD: &str = "  - note: a hold left waiting, its gate expiring soon
    as: fin
    call: invoice.hold
    arguments: {invoice_id: INV-20260612, amount: 1150, currency: EUR, reason: \"Freight June: one pallet arrived damaged\"}
    reply: {equal: {/status: needs_approval}}
";

/// The racking deposit whose answer is lost while the ERP cannot be asked about it.
const UNKNOWN_PAYMENT: &str = "  - note: a deposit is paid, the answer lost, and the ERP cannot tell reconciliation
    as: fin
    call: payment.schedule
    arguments: {invoice_id: INV-20260616, amount: 3720, currency: EUR, value_date: \"2026-06-30\", reason: \"Racking deposit as agreed with the supplier\"}
    reply: {equal: {/status: needs_approval}}
    save: {deposit: /step_id}
  - as: ana
    decide: {step: \"${deposit}\", verdict: approved, reason: \"Deposit agreed in the racking contract\"}
  - fault: {operation: lookup, mode: unavailable, times: 1000000}
  - fault: {operation: payments.schedule, mode: timeout_after_effect}
  - as: fin
    call: payment.schedule
    arguments: {invoice_id: INV-20260616, amount: 3720, currency: EUR, value_date: \"2026-06-30\", reason: \"Racking deposit as agreed with the supplier\"}
    reply: {equal: {/status: unknown}}
";

/// What the demo leaves for today, played after [`SEED`]: three holds of another invoice (a
/// batch), a 12,750 EUR payment (two approvers) and a supplier's IBAN change (four eyes: Ada
/// created the vendor-master agent's credential, so another approver must countersign)
/// waiting in the inbox; a planned run that
/// fails after drafting a note whose undo fails too (an escalation: approve the undo); a run
/// its planner cancels; and Max drafting the advisor's proposal, so the admin page shows a
/// proposal with a non-empty impact preview.
pub fn today() -> String {
    let mut steps = String::new();
    for (amount, line) in WAITING_HOLDS {
        steps.push_str(&format!(
            "  - as: fin\n    call: invoice.hold\n    arguments: {{invoice_id: INV-20260613, amount: {amount}, currency: EUR, reason: \"Freight contract: quantity disputed on line {line}\"}}\n    reply: {{equal: {{/status: needs_approval}}}}\n"
        ));
    }
    steps.push_str("  - as: fin\n    call: payment.schedule\n    arguments: {invoice_id: INV-20260613, amount: 12750, currency: EUR, value_date: \"2026-06-30\", reason: \"Annual freight contract, first instalment as agreed\"}\n    reply: {equal: {/status: needs_approval}}\n");
    format!(
        "name: finance demo, today\nseed: \"000\"\nactors:\n  fin: {{role: worker.finance}}\n  planner: {{role: planner}}\n  vm: {{role: worker.vendor_master, created_by: \"person:urn:countersign:demo#ada\"}}\n  max: {{person: max}}\nsteps:\n{steps}{TODAY}"
    )
}

/// [`today`]'s runs that fail or are cancelled, and Max's draft.
const TODAY: &str = "  - note: a bank-detail change waits for four eyes (Ada created the agent's credential)
    as: vm
    call: supplier.update_iban
    arguments: {supplier_id: SUP-000502, iban: DE89370400440532013000, reason: \"The carrier's new account, confirmed by a phone call-back to its finance office\"}
    reply: {equal: {/status: needs_approval}}
  - note: a run fails after its note was drafted, and the note's undo fails too
    fault: {operation: invoices.hold, mode: fail}
  - fault: {operation: notes.discard, mode: unavailable}
  - as: planner
    call: plan.submit
    arguments:
      task: Hold invoice INV-20260614 until the missing bearings arrive
      steps:
        - tool: note.draft
          arguments: {invoice_id: INV-20260614, text: \"Holding: 12 of 40 bearings missing from the delivery.\"}
          reason: Tell AP why the invoice is held
          evidence: [INV-20260614, PO-77815]
        - tool: invoice.hold
          arguments: {invoice_id: INV-20260614, amount: 294, currency: EUR, reason: \"12 of 40 bearings missing\"}
          reason: Hold the missing bearings' share
          evidence: [INV-20260614, PO-77815]
    save: {failing: /run_id}
  - wait: {run: \"${failing}\", status: failed}
  - note: a run its planner cancels
    as: planner
    call: plan.submit
    arguments:
      task: Pay the second freight instalment on INV-20260613
      steps:
        - tool: payment.schedule
          arguments: {invoice_id: INV-20260613, amount: 8680, currency: EUR, value_date: \"2026-07-15\", reason: \"Second instalment of the annual freight contract\"}
          reason: Second instalment as agreed
          evidence: [INV-20260613, PO-77814]
    save: {cancelling: /run_id}
  - as: planner
    call: run.cancel
    arguments: {run_id: \"${cancelling}\", reason: \"The carrier sends a corrected invoice first\"}
  - note: the advisor recommends the model reviewer; Max drafts the proposal
    as: max
    form: {path: /gates/draft, fields: {tool: invoice.hold, rule: amount.threshold}}
    reply: {http: 303}
expect:
  effects:
    - {operation: invoices.hold, count: 29}
";

/// Plays the demo against the server at `url` if `store` has no runs of the demo tenant.
/// `Ok(None)`: skipped (not empty).
pub async fn seed(
    store: &Store,
    url: &str,
    origin: Option<String>,
    hand: Option<Arc<dyn ClockHand>>,
) -> Result<Option<Report>, ScenarioError> {
    let empty = store
        .list_runs(TENANT, 1)
        .await
        .map_err(|e| ScenarioError::Parse(format!("listing runs: {e}")))?
        .is_empty();
    if !empty {
        return Ok(None);
    }
    let advance = hand
        .clone()
        .map(|hand| move |by: chrono::Duration| hand.advance(by));
    let target = Target {
        url: url.to_string(),
        origin,
        store: store.clone(),
        advance: advance
            .as_ref()
            .map(|a| a as &(dyn Fn(chrono::Duration) + Send + Sync)),
    };
    // The history first (a month ago, a day at a time, when the clock can move), then the
    // present: the clock catches up before anything is left waiting for a person.
    let mut report = scenario::run(&scenario::parse(&history(hand.is_some()))?, &target).await?;
    if let Some(hand) = &hand {
        hand.to_present();
    }
    for script in [SEED.to_string(), today()] {
        let played = scenario::run(&scenario::parse(&script)?, &target).await?;
        report.checks.extend(played.checks);
    }
    Ok(Some(report))
}

/// Waits until the server at `url` answers `/healthz` (at most ~10 s), then plays the demo;
/// logs the outcome.
pub async fn seed_when_up(
    store: Store,
    url: String,
    origin: Option<String>,
    hand: Option<Arc<dyn ClockHand>>,
) {
    let Ok(http) = scenario::client_for(&url).build() else {
        tracing::warn!("demo: no HTTP client; the demo is not played");
        return;
    };
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
    let played = seed(&store, &url, origin, hand.clone()).await;
    // Whatever happened, the server's clock joins the present (a history that stopped half-way
    // must not leave it behind).
    if let Some(hand) = &hand {
        hand.to_present();
    }
    match played {
        Ok(None) => tracing::info!("demo: the database has runs already; not played"),
        Ok(Some(report)) => {
            let failed = report.failures();
            if failed.is_empty() {
                tracing::info!(
                    checks = report.checks.len(),
                    "demo: played (30 days of decided holds, one paid run, five gates waiting in the inbox, one refused injection, a failed and a cancelled run, two escalations, the advisor's draft)"
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
