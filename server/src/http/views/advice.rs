//! The gate advisor's rows and the shadow rules' would-decisions for `/gates` (issue 33), and
//! the drafts the advisor offers.
//!
//! Invariants:
//! * Read-only: rows are computed from the tenant's own records and the registry in force.
//! * A draft is only ever offered for a recommendation to move a gate to the model reviewer,
//!   and never for a floor that cannot be lifted (`irreversible.always`).

use std::collections::BTreeMap;

use countersign_app::metrics::{
    AdviceRow, Rejection, ShadowDay, ShadowExample, ShadowRow, percent,
};
use countersign_core::advisor::{Advice, advise, trend, wilson};
use countersign_core::audit::AuditRecord;
use countersign_core::audit::members::{DECISION, SHADOW};
use countersign_core::bundle::Bundle;
use countersign_core::policy::{Rule, ShadowHit};
use countersign_core::registry::ToolName;
use serde_json::Value;

use super::metrics::{Gate, day_of, detail_of};

/// How many rejections and examples a row shows.
const RECENT: usize = 5;

/// What the advisor can draft for a gate of `tool` opened by `rule`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Draft {
    /// The tool's `gate: always` becomes `gate: policy`, and its planned steps wait for the
    /// model reviewer.
    GateToPolicy,
    /// The enforced policies naming the rule become shadow rules (they keep watching), and
    /// the tool's planned steps wait for the model reviewer.
    Demote(Vec<String>),
}

impl Draft {
    /// What it proposes, in words.
    pub fn words(&self, tool: &str) -> String {
        match self {
            Self::GateToPolicy => format!(
                "proposes {tool} gate: always → policy and review: required: its planned steps \
                 wait for the model reviewer, and its direct calls run without a person unless \
                 a policy still gates them (the impact preview shows which)"
            ),
            Self::Demote(ids) => format!(
                "proposes {} as shadow rule(s) (still recorded, no longer gating) and review: \
                 required for {tool}: its planned steps wait for the model reviewer, and its \
                 direct calls run without a person (the impact preview shows which)",
                ids.join(", ")
            ),
        }
    }
}

/// The draft for `tool`'s gate by `rule` under `bundle`, if one can be made.
pub fn draft_for(bundle: &Bundle, tool: &str, rule: &str) -> Option<Draft> {
    let name = ToolName::parse(tool).ok()?;
    let t = bundle.registry.tool(&name)?;
    match rule {
        r if r == Rule::IRREVERSIBLE_ALWAYS.as_str() => None,
        r if r == Rule::GATE_ALWAYS.as_str() => {
            (t.gate == countersign_core::Gate::Always).then_some(Draft::GateToPolicy)
        }
        _ => bundle.policy.gate_policies(tool, rule).map(Draft::Demote),
    }
}

/// One row per (tool, rule) with gates decided since `since`.
pub(super) fn advice_rows(
    gates: &BTreeMap<&str, Gate>,
    since: i64,
    now: i64,
    bundle: Option<&Bundle>,
) -> Vec<AdviceRow> {
    #[derive(Default)]
    struct Tally<'a> {
        decided: u32,
        rejected: u32,
        halves: [(u32, u32); 2],
        recent: Vec<(i64, &'a Gate)>,
    }
    let middle = since + (now - since) / 2;
    let mut tallies: BTreeMap<(&str, &str), Tally> = BTreeMap::new();
    for g in gates.values() {
        let Some((kind, at)) = g.outcome else {
            continue;
        };
        if at < since || kind == "expired" || g.tool.is_empty() {
            continue;
        }
        let rule = g.rule.as_deref().unwrap_or("(no rule)");
        let t = tallies.entry((g.tool.as_str(), rule)).or_default();
        let rejected = kind == "rejected";
        t.decided += 1;
        t.rejected += u32::from(rejected);
        let half = &mut t.halves[usize::from(at >= middle)];
        half.0 += 1;
        half.1 += u32::from(rejected);
        if rejected {
            t.recent.push((at, g));
        }
    }
    tallies
        .into_iter()
        .map(|((tool, rule), mut t)| {
            let approval = bundle
                .and_then(|b| b.registry.tool(&ToolName::parse(tool).ok()?))
                .and_then(|t| t.approval.as_ref());
            let k = approval.and_then(|a| a.reversal_cost.as_ref());
            let advice = advise(
                t.decided,
                t.rejected,
                k.and_then(serde_json::Number::as_f64),
            );
            let rate = match wilson(t.decided, t.rejected) {
                Some((lo, hi)) => format!(
                    "{} ({}–{})",
                    percent(f64::from(t.rejected) / f64::from(t.decided)),
                    percent(lo),
                    percent(hi)
                ),
                None => "—".into(),
            };
            t.recent.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
            let draft = (advice == Advice::ConsiderReviewer)
                .then(|| bundle.and_then(|b| draft_for(b, tool, rule)))
                .flatten()
                .map(|d| d.words(tool));
            AdviceRow {
                tool: tool.to_string(),
                rule: rule.to_string(),
                decided: t.decided,
                rejected: t.rejected,
                rate,
                trend: trend(t.halves[0], t.halves[1])
                    .unwrap_or_default()
                    .to_string(),
                reversal_cost: k.map(ToString::to_string).unwrap_or_default(),
                advice: advice.code().to_string(),
                words: advice.words().to_string(),
                recent: t
                    .recent
                    .iter()
                    .take(RECENT)
                    .map(|(at, g)| Rejection {
                        day: day_of(*at),
                        run_id: g.run_id.clone().unwrap_or_default(),
                        reason: g.reason.clone().unwrap_or_default(),
                    })
                    .collect(),
                draft,
            }
        })
        .collect()
}

/// One row per shadow rule in force (and any other that left records in the window), from
/// the records that carry shadow hits, in chain order.
pub(super) fn shadow_rows(records: &[AuditRecord], bundle: Option<&Bundle>) -> Vec<ShadowRow> {
    let mut rows: BTreeMap<String, ShadowRow> = BTreeMap::new();
    // A step is decided again on each attempt: it counts once per shadow rule, by its first.
    let mut seen: std::collections::HashSet<(String, String)> = std::collections::HashSet::new();
    let row = |rows: &mut BTreeMap<String, ShadowRow>, id: &str, rule: &str| {
        rows.entry(id.to_string()).or_insert_with(|| ShadowRow {
            id: id.to_string(),
            rule: rule.to_string(),
            would_deny: 0,
            would_gate: 0,
            days: Vec::new(),
            examples: Vec::new(),
        });
    };
    for (id, rule) in bundle.map(|b| b.policy.shadow_rules()).unwrap_or_default() {
        row(&mut rows, &id, &rule);
    }
    for r in records {
        let detail = detail_of(&r.record);
        let Some(hits) = detail
            .get(SHADOW)
            .cloned()
            .and_then(|v| serde_json::from_value::<Vec<ShadowHit>>(v).ok())
        else {
            continue;
        };
        let was = detail
            .get(DECISION)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let day = day_of(r.at);
        // A record of no step counts on its own.
        let step = r
            .step_id
            .clone()
            .unwrap_or_else(|| format!("{}#{}", r.chain, r.seq));
        for hit in hits {
            if !seen.insert((step.clone(), hit.id.clone())) {
                continue;
            }
            row(&mut rows, &hit.id, &hit.rule);
            let Some(s) = rows.get_mut(&hit.id) else {
                continue;
            };
            let kind = hit.would.kind();
            if s.days.last().is_none_or(|d| d.day != day) {
                s.days.push(ShadowDay {
                    day: day.clone(),
                    deny: 0,
                    gate: 0,
                });
            }
            if let Some(d) = s.days.last_mut() {
                match kind {
                    "deny" => d.deny += 1,
                    "require_approval" => d.gate += 1,
                    _ => {}
                }
            }
            match kind {
                "deny" => s.would_deny += 1,
                "require_approval" => s.would_gate += 1,
                _ => {}
            }
            s.examples.push(ShadowExample {
                at: chrono::DateTime::from_timestamp_millis(r.at)
                    .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
                    .unwrap_or_default(),
                tool: r.tool.clone().unwrap_or_default(),
                would: kind.to_string(),
                was: was.clone(),
                run_id: r.run_id.clone().unwrap_or_default(),
            });
        }
    }
    rows.into_values()
        .map(|mut s| {
            s.examples.reverse();
            s.examples.truncate(RECENT);
            s
        })
        .collect()
}
