//! Executor workers and the reconciler: the durable half of the gateway.
//!
//! Invariants:
//! * A worker executes only steps it claimed (a lease in the database, taken with
//!   `FOR UPDATE SKIP LOCKED` on Postgres, by SQLite's single writer otherwise), and only
//!   through [`pipeline::execute_claimed`] — the same policy, gate and key path as an agent's
//!   call. Two workers holding the same step (an expired lease) still call the target at
//!   most once: the key reservation decides.
//! * Steps of a run execute in `seq` order; a step that is not `done` blocks the later ones.
//! * Only retryable failures are retried (attempts < 4, with backoff); a denial, a business
//!   refusal or an irreversible timeout never is.
//! * The reconciler never calls a mutating tool: for an `unknown` step, or a `running` one
//!   whose worker vanished, it asks the target by key. Found → `done` with the target's
//!   result; the target confirms it never happened → `pending` (it may run again under the
//!   same key); cannot tell → left as it is, and an `unknown` left so for
//!   [`Timings::escalate_unknown_after`] goes to a person ([`crate::escalations`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::store::{KeyState, Run, RunGuard, RunStatus, Step, Transition};
use countersign_core::{RoleName, StepStatus, StoreError};
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::AppState;
use crate::pipeline::{self, Answer, Prefetched};
use crate::stop::EMERGENCY_STOP;

/// Executor timings.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// How long a claim holds a step.
    pub lease: Duration,
    /// Pause when no step is ready.
    pub idle: Duration,
    /// A `running` step untouched for this long is reconciled.
    pub stale_after: Duration,
    /// Pause between reconciliation passes.
    pub reconcile_every: Duration,
    /// An `unknown` step the target still cannot tell about after this long goes to a person
    /// (an escalation, [`crate::escalations`]).
    pub escalate_unknown_after: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(60),
            idle: Duration::from_millis(200),
            stale_after: Duration::from_secs(120),
            reconcile_every: Duration::from_secs(5),
            escalate_unknown_after: Duration::from_secs(600),
        }
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// Runs one worker until `stop` turns true: claim, execute, settle the run, repeat.
pub async fn worker(
    state: AppState,
    id: String,
    timings: Timings,
    mut stop: watch::Receiver<bool>,
) {
    tracing::info!(worker = %id, "executor worker started");
    loop {
        if *stop.borrow() {
            break;
        }
        match work_once(&state, &id, timings).await {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(worker = %id, error = %e, "executor: step failed inside Countersign")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(timings.idle) => {}
            _ = stop.changed() => {}
        }
    }
    tracing::info!(worker = %id, "executor worker stopped");
}

/// Claims and executes one step; `false` when none was ready (or the emergency stop is on:
/// the claim itself checks the switch).
pub async fn work_once(state: &AppState, worker: &str, timings: Timings) -> Result<bool, String> {
    let store = &state.store;
    let began = Instant::now();
    let lease_until = store.clock().now_ms() + ms(timings.lease);
    let Some(step) = store
        .claim_step(worker, lease_until, Some(EMERGENCY_STOP))
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(false);
    };
    let claimed = began.elapsed();
    let step_id = step.id.clone();
    // The run, its agent and the call's context in one read (the pipeline checks the
    // credential; the start is guarded against a cancel or a stop that lands after this).
    let (run, agent, context, recent, later_open, duties, planner_ends) = match store
        .planned_call(&step.run_id, step.seq, EMERGENCY_STOP)
        .await
    {
        Ok(call) => (
            call.run,
            call.agent,
            call.context,
            call.recent_events,
            call.later_open,
            call.duties,
            call.planner_ends,
        ),
        Err(e) => {
            let _ = store.release_step(&step_id, worker).await;
            return Err(e.to_string());
        }
    };
    let run_id = run.id.clone();
    let breach = match bounds_breach(state, &run, &step, recent).await {
        Ok(breach) => breach,
        Err(e) => {
            let _ = store.release_step(&step_id, worker).await;
            return Err(e.to_string());
        }
    };
    if let Some(breach) = breach {
        let _ = store.release_step(&step_id, worker).await;
        stop_run_for(state, &step, &breach)
            .await
            .map_err(|e| e.to_string())?;
        return Ok(true);
    }
    let checked = began.elapsed();
    let closed_done = AtomicBool::new(false);
    let prefetched = Some(Prefetched {
        agent,
        context,
        duties,
        planner_ends,
    });
    let answer =
        pipeline::execute_claimed_in(state, run, step, worker, prefetched, Some(&closed_done))
            .await;
    let executed = began.elapsed();
    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let timed = |released: Duration| {
        tracing::debug!(
            target: TIMING,
            claim_us = us(claimed),
            run_and_bounds_us = us(checked - claimed),
            execute_us = us(executed - checked),
            release_us = us(released.saturating_sub(executed)),
            settle_us = us(began.elapsed().saturating_sub(released)),
            "step executed"
        );
    };
    // Done, its lease ended by that same write, with later steps of the run still to run: the
    // run is not done, and nothing is left to release or settle.
    if answer.is_ok() && closed_done.load(Ordering::Relaxed) && later_open > 0 {
        timed(executed);
        return Ok(true);
    }
    // A release that fails is harmless (the lease expires by itself): settle from a plain read.
    let settled = match store.release_and_settle(&step_id, worker).await {
        Ok(settled) => Ok(settled),
        Err(_) => store.step_and_run_done(&step_id).await,
    };
    let released = began.elapsed();
    let answer = answer.map_err(|e| e.to_string())?;
    let (step, run_done) = settled.map_err(|e| e.to_string())?;
    settle(state, &run_id, step, run_done, &answer)
        .await
        .map_err(|e| e.to_string())?;
    timed(released);
    Ok(true)
}

/// The `tracing` target of the per-step phase timings [`work_once`] emits at debug level
/// (claim, run and bounds reads, execution, release, settling; microseconds).
pub const TIMING: &str = "countersign::executor::timing";

/// Minor units of a step's `amount` (two decimals), if it has one.
fn amount_minor(inputs: &str) -> i64 {
    serde_json::from_str::<Value>(inputs)
        .ok()
        .and_then(|v| v.get("amount").and_then(Value::as_f64))
        .map(|a| (a * 100.0).round() as i64)
        .unwrap_or(0)
}

/// The run bound `step` would break by starting now, if any: `bounds.wall_time`,
/// `bounds.spend` (done steps' amounts plus this one's above the cap) or `bounds.failures`
/// (failed attempts in a row).
async fn bounds_breach(
    state: &AppState,
    run: &Run,
    step: &Step,
    recent: Option<Vec<(i64, String)>>,
) -> Result<Option<String>, StoreError> {
    let bounds = state.config.run_bounds;
    let store = &state.store;
    let now = store.clock().now_ms();
    if now - run.created_at > bounds.max_minutes.saturating_mul(60_000) {
        return Ok(Some("bounds.wall_time".into()));
    }
    if let Some(cap) = bounds.max_spend_minor {
        let steps = store.steps_for_run(&run.id).await?;
        let spent: i64 = steps
            .iter()
            .filter(|s| s.status == StepStatus::Done)
            .map(|s| amount_minor(&s.inputs))
            .sum();
        if spent + amount_minor(&step.inputs) > cap {
            return Ok(Some("bounds.spend".into()));
        }
    }
    let limit = i64::try_from(bounds.max_failures.max(1)).unwrap_or(i64::MAX);
    let in_a_row = store.failures_in_a_row_from(&run.id, limit, recent).await?;
    let in_a_row = usize::try_from(in_a_row).unwrap_or(0);
    if in_a_row >= bounds.max_failures {
        return Ok(Some("bounds.failures".into()));
    }
    Ok(None)
}

/// Fails the runs whose step still waits for its model review past the run's wall-time
/// bound (`bounds.wall_time`, as if the step had been claimed): such a step is never claimed,
/// so the executor's own check never sees it. The step's refusal commits with its move out of
/// `pending`, so of several sweepers (replicas) only one stops a run. Returns how many runs
/// this pass stopped.
pub async fn sweep_overdue_reviews(state: &AppState) -> Result<usize, StoreError> {
    const RULE: &str = "bounds.wall_time";
    let bounds = state.config.run_bounds;
    let store = &state.store;
    let before = store.clock().now_ms() - bounds.max_minutes.saturating_mul(60_000);
    let mut stopped = std::collections::BTreeSet::new();
    for step in store.overdue_reviews(before, 100).await? {
        if stopped.contains(&step.run_id) {
            continue;
        }
        let mut detail = Map::new();
        detail.insert("kind".into(), json!("run_bounds"));
        detail.insert("blocked_step".into(), json!(step.id));
        detail.insert("waiting_for".into(), json!("review"));
        let record = NewAuditRecord {
            event: Some(AuditEvent::Refused),
            run_id: Some(step.run_id.clone()),
            step_id: Some(step.id.clone()),
            tool: Some(step.tool.clone()),
            actor: Some("executor".into()),
            rule: Some(RULE.into()),
            detail,
            tenant: None,
        };
        let moved = store
            .transition(&Transition {
                step_id: step.id.clone(),
                from: vec![StepStatus::Pending],
                to: Some(StepStatus::Cancelled),
                rule: Some(RULE.into()),
                records: vec![(AuditEvent::Refused, record)],
                guard: Some(RunGuard {
                    run_id: step.run_id.clone(),
                    ..RunGuard::default()
                }),
                ..Transition::default()
            })
            .await?;
        if moved.is_none() {
            continue; // reviewed, cancelled or stopped meanwhile, or another sweeper's
        }
        stopped.insert(step.run_id.clone());
        crate::runs::cancel_run(state, &step.run_id, "executor", RULE, RunStatus::Failed).await?;
        let compensated = crate::compensation::compensate(state, &step.run_id, &step).await;
        store.end_execution_credentials(&step.run_id).await?;
        compensated?;
    }
    Ok(stopped.len())
}

/// Stops `step`'s run for breaking `rule`: audited, the run failed, its unstarted steps
/// cancelled, the writes done before `step` compensated.
async fn stop_run_for(state: &AppState, step: &Step, rule: &str) -> Result<(), StoreError> {
    let mut detail = Map::new();
    detail.insert("kind".into(), json!("run_bounds"));
    detail.insert("blocked_step".into(), json!(step.id));
    state
        .store
        .append_audit(&NewAuditRecord {
            event: Some(AuditEvent::Refused),
            run_id: Some(step.run_id.clone()),
            step_id: Some(step.id.clone()),
            tool: Some(step.tool.clone()),
            actor: Some("executor".into()),
            rule: Some(rule.to_string()),
            detail,
            tenant: None,
        })
        .await?;
    crate::runs::cancel_run(state, &step.run_id, "executor", rule, RunStatus::Failed).await?;
    // The run failed with writes done before the blocked step: they are undone or escalated
    // as after any failed step, never left half-done in silence.
    let compensated = crate::compensation::compensate(state, &step.run_id, step).await;
    state.store.end_execution_credentials(&step.run_id).await?;
    compensated
}

/// Whether the step's stored outcome marks its failure as one that may be retried.
fn outcome_says_retryable(step: &Step) -> bool {
    step.outcome
        .as_deref()
        .and_then(|o| serde_json::from_str::<serde_json::Value>(o).ok())
        .and_then(|o| o.pointer("/answer/retryable").and_then(|r| r.as_bool()))
        .unwrap_or(false)
}

/// After a step (as read back when its lease ended, with whether its whole run is done):
/// schedule a retry, finish the run, or leave it waiting.
async fn settle(
    state: &AppState,
    run_id: &str,
    step: Step,
    run_done: bool,
    answer: &Answer,
) -> Result<(), StoreError> {
    let store = &state.store;
    match step.status {
        StepStatus::Failed => {
            // Only an attempt that ended as may-be-retried: a write's key says so; a step
            // without a key (a read) says so in its outcome. A rejection, a refusal or a
            // fail-closed check is never retried.
            let key = store.get_key(&step.idem_key).await?;
            let retryable = match key {
                Some(k) => k.state == KeyState::Failed,
                None => outcome_says_retryable(&step),
            } && step.attempts < pipeline::MAX_ATTEMPTS;
            if retryable {
                let backoff = 500_i64.saturating_mul(1 << step.attempts.clamp(0, 10));
                store
                    .transition(&Transition {
                        step_id: step.id.clone(),
                        from: vec![StepStatus::Failed],
                        to: Some(StepStatus::Pending),
                        not_before: Some(store.clock().now_ms() + backoff),
                        // Only while the run is active: a run that ended meanwhile keeps the
                        // step as it failed, never a pending step nobody will run.
                        guard: Some(countersign_core::store::RunGuard {
                            run_id: run_id.to_string(),
                            allow_failed: false,
                            unless_switch: None,
                        }),
                        ..Transition::default()
                    })
                    .await?;
            } else {
                crate::compensation::fail_run(state, run_id, &step, answer).await?;
            }
        }
        StepStatus::Refused | StepStatus::Expired => {
            crate::compensation::fail_run(state, run_id, &step, answer).await?;
        }
        // Cancelled because its run ended (a person cancelled it, a bound or another step's
        // failure ended it) or by the emergency stop, whose own pass ends every active run as
        // stopped and revokes its agent: not a failure of the run, nothing to undo here.
        StepStatus::Cancelled
            if step
                .rule
                .as_deref()
                .is_some_and(|r| r.starts_with("run.") || r == pipeline::STOP_RULE) => {}
        StepStatus::Cancelled => {
            crate::compensation::fail_run(state, run_id, &step, answer).await?;
        }
        StepStatus::Done => {
            if run_done {
                store.finish_run(run_id, RunStatus::Done, "").await?;
            }
        }
        StepStatus::Pending
        | StepStatus::Running
        | StepStatus::NeedsApproval
        | StepStatus::Unknown => {}
    }
    Ok(())
}

/// Runs the reconciler until `stop` turns true.
pub async fn reconciler(state: AppState, timings: Timings, mut stop: watch::Receiver<bool>) {
    loop {
        if *stop.borrow() {
            break;
        }
        if let Err(e) = reconcile_once(&state, timings).await {
            tracing::warn!(error = %e, "reconciler pass failed");
        }
        if let Err(e) = sweep_overdue_reviews(&state).await {
            tracing::warn!(error = %e, "overdue-review sweep failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(timings.reconcile_every) => {}
            _ = stop.changed() => {}
        }
    }
}

/// One pass: asks the target about every unknown or stale running step. Returns how many
/// steps it settled.
pub async fn reconcile_once(state: &AppState, timings: Timings) -> Result<usize, StoreError> {
    let store = &state.store;
    let now = store.clock().now_ms();
    let stale_before = now - ms(timings.stale_after);
    let escalate_before = now - ms(timings.escalate_unknown_after);
    const PAGE: i64 = 100;
    let mut settled = 0;
    // Every candidate, a page at a time: steps the target cannot settle yet (or whose tool
    // left the registry) stay, and must not hide newer ones behind them.
    let mut after: Option<(i64, String)> = None;
    loop {
        let page = store
            .steps_to_reconcile(
                stale_before,
                after.as_ref().map(|(at, id)| (*at, id.as_str())),
                PAGE,
            )
            .await?;
        for step in &page {
            if reconcile_step(state, step).await? {
                settled += 1;
            } else if let Err(e) =
                crate::escalations::escalate_unknown(state, step, escalate_before).await
            {
                // The next pass tries again; the other steps are not held up.
                tracing::warn!(step = %step.id, error = %e, "reconciler: escalating failed");
            }
        }
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => {
                after = Some((last.updated_at, last.id.clone()));
            }
            _ => return Ok(settled),
        }
    }
}

async fn reconcile_step(state: &AppState, step: &Step) -> Result<bool, StoreError> {
    let store = &state.store;
    let Some(loaded) = state.registry.current() else {
        return Ok(false);
    };
    let Ok(role) = RoleName::parse(&step.role) else {
        return Ok(false);
    };
    let tool = match loaded.bundle.registry.tool_for_role(&role, &step.tool) {
        Some(t) => t,
        None => match countersign_core::ToolName::parse(&step.tool)
            .ok()
            .and_then(|n| loaded.bundle.registry.tool(&n))
        {
            Some(t) => t,
            None => return Ok(false),
        },
    };
    let Some(adapter) = loaded.adapters.get(tool.handler.provider.as_str()) else {
        return Ok(false);
    };
    let run = store.get_run(&step.run_id).await?;
    let found = match adapter.lookup(&run.tenant, &step.idem_key).await {
        Ok(found) => found,
        Err(e) => {
            // Said once as an escalation (audited, webhooks) past the grace period; not at
            // every pass.
            tracing::debug!(step = %step.id, error = %e, "reconciler: the target cannot tell yet");
            return Ok(false);
        }
    };
    let mut detail = Map::new();
    detail.insert("idem_key".into(), json!(step.idem_key));
    detail.insert("was".into(), json!(step.status.as_str()));
    detail.insert("found".into(), json!(found.is_some()));
    let (to, key, outcome) = match &found {
        Some(result) => {
            let shown = pipeline::redacted(&state.shown_key, tool, result);
            let stored = json!({"error": false, "answer": shown}).to_string();
            detail.insert(
                "reference".into(),
                result
                    .get("ref")
                    .cloned()
                    .unwrap_or(serde_json::Value::Null),
            );
            (StepStatus::Done, KeyState::Done, Some(stored))
        }
        // Never happened: it may run again, unless its attempts are spent — a call that keeps
        // timing out is not re-sent without end.
        None if step.attempts >= pipeline::MAX_ATTEMPTS => {
            detail.insert("attempts".into(), json!(step.attempts));
            let answer = json!({"status": "failed", "step_id": step.id, "code": "attempts.exhausted",
                "message": "the target never completed the call; no attempt is left",
                "retryable": false});
            let stored = json!({"error": true, "answer": answer}).to_string();
            (StepStatus::Failed, KeyState::Done, Some(stored))
        }
        None => (StepStatus::Pending, KeyState::Failed, None),
    };
    let record = NewAuditRecord {
        event: Some(AuditEvent::Reconciled),
        run_id: Some(step.run_id.clone()),
        step_id: Some(step.id.clone()),
        tool: Some(step.tool.clone()),
        actor: Some("reconciler".into()),
        rule: tool.reconcile.as_ref().map(|r| format!("reconcile:{r}")),
        detail,
        tenant: None,
    };
    let moved = store
        .transition(&Transition {
            step_id: step.id.clone(),
            from: vec![step.status],
            to: Some(to),
            rule: (to == StepStatus::Failed).then(|| pipeline::TARGET_FAILED.to_string()),
            outcome: outcome.clone(),
            key: Some((key, outcome)),
            records: vec![(AuditEvent::Reconciled, record)],
            ..Transition::default()
        })
        .await?;
    if moved.is_some() {
        // Its worker is gone: nobody holds the step any more.
        store.clear_lease(&step.id).await?;
    }
    if let Some((after, _)) = &moved
        && to == StepStatus::Failed
        && run.planned
    {
        let answer = pipeline::stored_outcome(after);
        crate::compensation::fail_run(state, &run.id, after, &answer).await?;
    }
    if let Some((after, _)) = &moved
        && to == StepStatus::Done
        && run.planned
    {
        if run.status == RunStatus::Active {
            let steps = store.steps_for_run(&run.id).await?;
            if steps.iter().all(|s| s.status == StepStatus::Done) {
                store.finish_run(&run.id, RunStatus::Done, "").await?;
            }
        } else {
            // The run ended while this write's outcome was unknown: nothing undid it.
            crate::compensation::left_after_end(state, &run, after).await?;
        }
    }
    if let Some((after, _)) = &moved
        && let Err(e) = crate::escalations::reconciled(state, after).await
    {
        // Closed when someone next acts on it (it is not shown meanwhile).
        tracing::warn!(step = %step.id, error = %e, "reconciler: closing the escalation failed");
    }
    Ok(moved.is_some())
}
