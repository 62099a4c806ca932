//! Notifications to people: when a step starts waiting for a person (`gate_opened`), or when
//! a failed run leaves a write that only a person can undo (`compensation_escalated`), or an
//! `unknown` outcome reconciliation cannot settle goes to a person (`unknown_escalated`), each
//! configured webhook gets a JSON POST with a Slack-compatible `text` field and the step's facts.
//!
//! The inbox is the source of truth: a notification is a courtesy. Delivery is retried
//! (3 attempts, backoff), runs in the background, and a failure is logged — never fatal, never
//! blocking the call that opened the gate. Notifications carry no inputs (only the tool, rule and
//! ids), so nothing classified leaves through them.

use std::time::Duration;

use countersign_core::store::Step;
use serde_json::json;

use crate::AppState;

/// Attempts per URL.
pub const ATTEMPTS: u32 = 3;

/// Posts the "gate opened" notification for `step` to every configured URL, in the background.
pub fn gate_opened(state: &AppState, step: &Step) {
    if state.config.webhook_urls.is_empty() {
        return;
    }
    let inbox = page(state, &format!("inbox/{}", step.id));
    let body = json!({
        "text": format!(
            "Countersign: {} waits for approval ({}). Review it: {inbox}",
            step.tool,
            step.rule.as_deref().unwrap_or("gate")
        ),
        "event": "gate_opened",
        "step_id": step.id,
        "run_id": step.run_id,
        "tool": step.tool,
        "rule": step.rule,
        "expires_at": step.expires_at,
        "inbox": inbox,
    });
    post_all(state, body);
}

/// Posts "a person must decide the undo of `step`" (its run failed at `failed_step` and the
/// step could not be compensated) to every configured URL, in the background. The reason is
/// left to the run page and the audit: it may quote the step's inputs.
pub fn compensation_escalated(state: &AppState, step: &Step, failed_step: &str) {
    if state.config.webhook_urls.is_empty() {
        return;
    }
    let run = page(state, &format!("runs/{}", step.run_id));
    let body = json!({
        "text": format!(
            "Countersign: a run failed after {} had run, and it could not be undone \
             automatically. A person must decide: {run}",
            step.tool
        ),
        "event": "compensation_escalated",
        "step_id": step.id,
        "run_id": step.run_id,
        "tool": step.tool,
        "after_failed_step": failed_step,
        "run": run,
        "escalations": page(state, "escalations"),
    });
    post_all(state, body);
}

/// Posts "a person must settle the unknown outcome of `step`" (reconciliation could not) to
/// every configured URL, in the background.
pub fn unknown_escalated(state: &AppState, step: &Step) {
    if state.config.webhook_urls.is_empty() {
        return;
    }
    let escalations = page(state, "escalations");
    let body = json!({
        "text": format!(
            "Countersign: whether {} happened is unknown and the target cannot tell. A person \
             must settle it with the target's reference: {escalations}",
            step.tool
        ),
        "event": "unknown_escalated",
        "step_id": step.id,
        "run_id": step.run_id,
        "tool": step.tool,
        "escalations": escalations,
    });
    post_all(state, body);
}

/// The dashboard page at `path` under the public URL (empty if it cannot be joined).
fn page(state: &AppState, path: &str) -> String {
    state
        .config
        .public_url
        .join(path)
        .map(|u| u.to_string())
        .unwrap_or_default()
}

/// Posts `body` to every configured webhook, each in its own background task with retries.
fn post_all(state: &AppState, body: serde_json::Value) {
    for url in state.config.webhook_urls.iter().map(|u| u.expose().clone()) {
        let body = body.clone();
        tokio::spawn(async move {
            let client = match reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .redirect(reqwest::redirect::Policy::none())
                .build()
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "notify: no HTTP client");
                    return;
                }
            };
            // A webhook URL's path and userinfo are often its credential: logs name the host.
            let shown = format!("{}/…", url.origin().ascii_serialization());
            for attempt in 1..=ATTEMPTS {
                match client.post(url.clone()).json(&body).send().await {
                    Ok(r) if r.status().is_success() => return,
                    Ok(r) => {
                        tracing::warn!(webhook = %shown, status = %r.status(), attempt, "notify: webhook refused")
                    }
                    Err(e) => {
                        let e = e.without_url();
                        tracing::warn!(webhook = %shown, error = %e, attempt, "notify: webhook unreachable")
                    }
                }
                tokio::time::sleep(Duration::from_millis(250 * 2u64.pow(attempt))).await;
            }
            tracing::warn!(webhook = %shown, "notify: gave up; the inbox still shows the gate");
        });
    }
}
