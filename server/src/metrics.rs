//! The gateway's counters, rendered as Prometheus text for `GET /metrics` (served, behind its
//! token, by `crate::http::metrics`).
//!
//! * `countersign_tool_calls_total{tool, decision, outcome}` — every `tools/call`, by tool,
//!   the policy/gate decision and the outcome the caller heard.
//! * `countersign_tool_call_duration_seconds{tool}` — latency histogram of the whole pipeline.
//! * `countersign_gate_queue_depth` — steps waiting for a person (read from the database at
//!   scrape time, so every replica reports the shared queue).
//! * `countersign_steps_unknown` — steps whose outcome is being reconciled.
//! * `countersign_mcp_sessions` — MCP sessions this process holds open (closed by the
//!   client's `DELETE /mcp`, or by rmcp after they sit idle).
//!
//! Counters live in this process; with several replicas, sum them in Prometheus.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

/// Histogram bucket upper bounds, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

#[derive(Debug, Default)]
struct Inner {
    calls: BTreeMap<(String, String, String), u64>,
    latency: BTreeMap<String, Histogram>,
}

/// The process's gateway metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
    /// The `/mcp` endpoint's session manager, once mounted.
    mcp_sessions: OnceLock<Weak<LocalSessionManager>>,
}

impl Metrics {
    /// Reports the open sessions of `manager` (the `/mcp` endpoint's) as
    /// `countersign_mcp_sessions`.
    pub fn track_mcp_sessions(&self, manager: &Arc<LocalSessionManager>) {
        let _ = self.mcp_sessions.set(Arc::downgrade(manager));
    }

    /// How many MCP sessions are open, if the endpoint is mounted.
    pub async fn mcp_sessions(&self) -> Option<usize> {
        let manager = self.mcp_sessions.get()?.upgrade()?;
        let n = manager.sessions.read().await.len();
        Some(n)
    }

    /// Counts one call of `tool` with its `decision` and `outcome`, taking `latency`.
    pub fn observe_call(&self, tool: &str, decision: &str, outcome: &str, latency: Duration) {
        let mut inner = match self.inner.lock() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        };
        *inner
            .calls
            .entry((tool.to_string(), decision.to_string(), outcome.to_string()))
            .or_default() += 1;
        let h = inner.latency.entry(tool.to_string()).or_default();
        let secs = latency.as_secs_f64();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                h.counts[i] += 1;
            }
        }
        h.sum += secs;
        h.count += 1;
    }

    /// The text exposition of the in-process counters.
    pub fn render(&self) -> String {
        let inner = match self.inner.lock() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        };
        let mut out = String::new();
        out.push_str(
            "# HELP countersign_tool_calls_total Tool calls by tool, decision and outcome.\n",
        );
        out.push_str("# TYPE countersign_tool_calls_total counter\n");
        for ((tool, decision, outcome), n) in &inner.calls {
            let _ = writeln!(
                out,
                "countersign_tool_calls_total{{tool=\"{}\",decision=\"{}\",outcome=\"{}\"}} {n}",
                escape(tool),
                escape(decision),
                escape(outcome)
            );
        }
        out.push_str(
            "# HELP countersign_tool_call_duration_seconds Time from request to answer, per tool.\n",
        );
        out.push_str("# TYPE countersign_tool_call_duration_seconds histogram\n");
        for (tool, h) in &inner.latency {
            let tool = escape(tool);
            for (bound, n) in BUCKETS.iter().zip(h.counts.iter()) {
                let _ = writeln!(
                    out,
                    "countersign_tool_call_duration_seconds_bucket{{tool=\"{tool}\",le=\"{bound}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "countersign_tool_call_duration_seconds_bucket{{tool=\"{tool}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "countersign_tool_call_duration_seconds_sum{{tool=\"{tool}\"}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "countersign_tool_call_duration_seconds_count{{tool=\"{tool}\"}} {}",
                h.count
            );
        }
        out
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
