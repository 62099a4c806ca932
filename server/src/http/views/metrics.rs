//! The metrics page's figures: gates opened, decided and expired, rejection rates, latency
//! and break-even, computed from the store for the signed-in person's tenant.

use countersign_app::metrics::{DayCell, Latency, MetricsData, Series, ToolGate, percentile};
use countersign_core::audit::AuditRecord;
use serde_json::Value;
use std::collections::BTreeMap;

/// One gate (a step's wait for people) as its records tell it.
#[derive(Default)]
pub(super) struct Gate {
    pub(super) tool: String,
    pub(super) rule: Option<String>,
    pub(super) run_id: Option<String>,
    pub(super) opened: Option<i64>,
    pub(super) outcome: Option<(&'static str, i64)>,
    /// The rejecting person's reason.
    pub(super) reason: Option<String>,
}

/// The gates `records` (in chain order) tell of, by step.
pub(super) fn gates(records: &[AuditRecord]) -> BTreeMap<&str, Gate> {
    let mut gates: BTreeMap<&str, Gate> = BTreeMap::new();
    for r in records {
        let Some(step) = r.step_id.as_deref() else {
            continue;
        };
        let g = gates.entry(step).or_default();
        if let Some(tool) = &r.tool {
            g.tool.clone_from(tool);
        }
        if g.run_id.is_none() {
            g.run_id.clone_from(&r.run_id);
        }
        match r.event.as_str() {
            "waiting_approval" => {
                g.opened.get_or_insert(r.at);
                g.rule.clone_from(&r.rule);
            }
            "approved" => {
                let d = detail_of(&r.record);
                let given = d.get("approvals").and_then(Value::as_i64).unwrap_or(1);
                let needed = d
                    .get("approvals_needed")
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                if given >= needed && g.outcome.is_none() {
                    g.outcome = Some(("approved", r.at));
                }
                if g.rule.is_none() {
                    g.rule.clone_from(&r.rule);
                }
            }
            "rejected" => {
                if g.outcome.is_none() {
                    g.outcome = Some(("rejected", r.at));
                    g.reason = detail_of(&r.record)
                        .get("reason")
                        .and_then(Value::as_str)
                        .map(str::to_string);
                }
                if g.rule.is_none() {
                    g.rule.clone_from(&r.rule);
                }
            }
            "expired" if g.outcome.is_none() => g.outcome = Some(("expired", r.at)),
            _ => {}
        }
    }
    gates
}

/// Gate metrics from the gates of [`gates`], for the days from `since` (midnight UTC) to the
/// day of `now`.
pub(super) fn metrics_of(gates: &BTreeMap<&str, Gate>, since: i64, now: i64) -> MetricsData {
    let days = usize::try_from((now.max(since) - since) / DAY_MS + 1).unwrap_or(1);
    let empty_days: Vec<DayCell> = (0..days)
        .map(|i| DayCell {
            day: day_of(since + i64::try_from(i).unwrap_or(0) * DAY_MS),
            decided: 0,
            rejected: 0,
        })
        .collect();
    let mut by_tool: BTreeMap<String, Series> = BTreeMap::new();
    let mut by_rule: BTreeMap<String, Series> = BTreeMap::new();
    let mut tools: BTreeMap<String, ToolGate> = BTreeMap::new();
    let mut latencies = Vec::new();
    let mut expired = 0u32;
    let series = |label: &str| Series {
        label: label.to_string(),
        decided: 0,
        rejected: 0,
        days: empty_days.clone(),
    };
    for g in gates.values() {
        let in_window =
            g.opened.is_some_and(|at| at >= since) || g.outcome.is_some_and(|(_, at)| at >= since);
        if !in_window || g.tool.is_empty() {
            continue;
        }
        let t = tools.entry(g.tool.clone()).or_insert_with(|| ToolGate {
            tool: g.tool.clone(),
            ..ToolGate::default()
        });
        if g.opened.is_some_and(|at| at >= since) {
            t.opened += 1;
        }
        match g.outcome {
            None => t.waiting += 1,
            Some((_, at)) if at < since => {}
            Some(("expired", _)) => {
                t.expired += 1;
                expired += 1;
            }
            Some((kind, at)) => {
                let rejected = kind == "rejected";
                if rejected {
                    t.rejected += 1;
                } else {
                    t.approved += 1;
                }
                if let Some(opened) = g.opened {
                    latencies.push(at - opened);
                }
                let day = usize::try_from((at - since) / DAY_MS).unwrap_or(0);
                let rule = g.rule.clone().unwrap_or_else(|| "(no rule)".into());
                for s in [
                    by_tool
                        .entry(g.tool.clone())
                        .or_insert_with(|| series(&g.tool)),
                    by_rule.entry(rule.clone()).or_insert_with(|| series(&rule)),
                ] {
                    s.decided += 1;
                    s.rejected += u32::from(rejected);
                    if let Some(cell) = s.days.get_mut(day) {
                        cell.decided += 1;
                        cell.rejected += u32::from(rejected);
                    }
                }
            }
        }
    }
    latencies.sort_unstable();
    let latency = (!latencies.is_empty()).then(|| Latency {
        decisions: u32::try_from(latencies.len()).unwrap_or(u32::MAX),
        p50_ms: percentile(&latencies, 50).unwrap_or(0),
        p90_ms: percentile(&latencies, 90).unwrap_or(0),
        p99_ms: percentile(&latencies, 99).unwrap_or(0),
    });
    MetricsData {
        since: day_of(since),
        until: day_of(now),
        by_tool: by_tool.into_values().collect(),
        by_rule: by_rule.into_values().collect(),
        tools: tools.into_values().collect(),
        latency,
        expired,
        advice: Vec::new(),
        shadow: Vec::new(),
        admin: false,
    }
}

pub(super) const DAY_MS: i64 = 86_400_000;

/// The detail object of a stored record (empty when it has none).
pub(super) fn detail_of(record: &str) -> serde_json::Map<String, Value> {
    match serde_json::from_str::<Value>(record) {
        Ok(Value::Object(mut o)) => match o.remove("detail") {
            Some(Value::Object(d)) => d,
            _ => serde_json::Map::new(),
        },
        _ => serde_json::Map::new(),
    }
}

pub(super) fn day_of(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or_else(String::new, |t| t.format("%Y-%m-%d").to_string())
}
