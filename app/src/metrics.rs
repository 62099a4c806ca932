//! Gate metrics (`/gates`, managers and admins): rejection rate per tool and per policy rule
//! by day (SVG drawn on the server, readable without JavaScript, with the numbers beside
//! it), approval latency percentiles, expired gates, and seed 000's break-even.
//!
//! Seed 000: with a rejection rate r and a reversal cost k (in approvals), a gated step saves
//! r × k approvals' worth and costs one, so the gate pays when r × k > 1, i.e. for any
//! reversal cost above k = 1 / r. A tool whose r is zero never pays on this evidence: that is
//! the argument for moving it from a person to the model reviewer.
//!
//! Invariants:
//! * The server function returns data only to a signed-in person holding one of
//!   [`METRICS_ROLES`] and a tenant, computed over that tenant's runs only; everyone else
//!   gets [`MetricsView::Refused`] and a 403.
//! * Every chart's SVG is built here from numbers only; labels are escaped.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::{Refused, RefusedNote};

pub mod advisor;
pub use advisor::{AdviceRow, Rejection, ShadowDay, ShadowExample, ShadowRow};

/// Roles that may read gate metrics.
#[cfg(feature = "ssr")]
pub const METRICS_ROLES: [countersign_core::AppRole; 2] = [
    countersign_core::AppRole::Manager,
    countersign_core::AppRole::Admin,
];

/// The window the page covers, in days.
pub const WINDOW_DAYS: i64 = 30;

/// Decided gates and rejections on one day.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DayCell {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    /// Gates decided (approved or rejected) that day.
    pub decided: u32,
    /// Of which rejected.
    pub rejected: u32,
}

/// One chart: a tool or a rule, day by day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Series {
    /// The tool or rule.
    pub label: String,
    /// Decided in the window.
    pub decided: u32,
    /// Rejected in the window.
    pub rejected: u32,
    /// One cell per day of the window, oldest first.
    pub days: Vec<DayCell>,
}

/// Gate outcomes of one tool over the window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolGate {
    /// Tool.
    pub tool: String,
    /// Gates opened.
    pub opened: u32,
    /// Approved (all approvals given).
    pub approved: u32,
    /// Rejected.
    pub rejected: u32,
    /// Expired without a decision.
    pub expired: u32,
    /// Still waiting.
    pub waiting: u32,
}

/// Approval latency (gate opened → decided), milliseconds, nearest-rank percentiles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latency {
    /// Decisions measured.
    pub decisions: u32,
    /// Median.
    pub p50_ms: i64,
    /// 90th percentile.
    pub p90_ms: i64,
    /// 99th percentile.
    pub p99_ms: i64,
}

/// Everything the page shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsData {
    /// First day of the window.
    pub since: String,
    /// Last day of the window.
    pub until: String,
    /// Per tool, by day.
    pub by_tool: Vec<Series>,
    /// Per policy rule (the rule that opened the gate), by day.
    pub by_rule: Vec<Series>,
    /// Per tool totals.
    pub tools: Vec<ToolGate>,
    /// Latency over all decisions, if any.
    pub latency: Option<Latency>,
    /// Gates that expired in the window.
    pub expired: u32,
    /// The gate advisor, per tool and rule.
    pub advice: Vec<AdviceRow>,
    /// The shadow rules' would-decisions.
    pub shadow: Vec<ShadowRow>,
    /// Whether the viewer is an admin (may propose enforcing a shadow rule).
    pub admin: bool,
}

/// The metrics as the signed-in person may see them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetricsView {
    /// No data for this person.
    Refused(Refused),
    /// The metrics.
    Data(Box<MetricsData>),
}

/// Where the server's metrics come from (server only).
#[cfg(feature = "ssr")]
pub trait MetricsSource: Send + Sync + 'static {
    /// Gate metrics over `tenant`'s runs.
    fn metrics<'a>(
        &'a self,
        tenant: &'a str,
        admin: bool,
    ) -> crate::inbox::BoxFuture<'a, Result<MetricsData, String>>;
}

/// The context value the server provides.
#[cfg(feature = "ssr")]
#[derive(Clone)]
pub struct Metrics(pub std::sync::Arc<dyn MetricsSource>);

/// The gate metrics.
#[leptos::server]
pub async fn load_metrics() -> Result<MetricsView, ServerFnError> {
    let (person, tenant) = match crate::person_with(&METRICS_ROLES)? {
        Ok(p) => p,
        Err(why) => return Ok(MetricsView::Refused(why)),
    };
    let source =
        use_context::<Metrics>().ok_or_else(|| ServerFnError::new("metrics are not available"))?;
    source
        .0
        .metrics(&tenant, person.has_role(countersign_core::AppRole::Admin))
        .await
        .map(|d| MetricsView::Data(Box::new(d)))
        .map_err(ServerFnError::new)
}

/// Rejection rate r = rejected / decided; `None` with no decisions.
pub fn rejection_rate(decided: u32, rejected: u32) -> Option<f64> {
    (decided > 0).then(|| f64::from(rejected) / f64::from(decided))
}

/// Seed 000's break-even reversal cost: the gate pays when k > 1 / r. `None` when r is 0
/// (or unknown): no reversal cost makes the gate pay on this evidence.
pub fn break_even(rate: Option<f64>) -> Option<f64> {
    rate.filter(|r| *r > 0.0).map(|r| 1.0 / r)
}

/// The nearest-rank `p`-th percentile (0 < p ≤ 100) of `sorted` (ascending).
pub fn percentile(sorted: &[i64], p: u32) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    // rank = ceil(p/100 × n), at least 1.
    let rank = (usize::try_from(p).unwrap_or(100) * n).div_ceil(100).max(1);
    sorted.get(rank.min(n) - 1).copied()
}

/// `950 ms`, `4.2 s`, `12 min`, `3.5 h`.
pub fn duration_text(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1_000.0)
    } else if ms < 3_600_000 {
        format!("{} min", ms / 60_000)
    } else {
        format!("{:.1} h", ms as f64 / 3_600_000.0)
    }
}

/// A rate as a percentage with one decimal: `0.125` → `12.5 %`.
pub fn percent(r: f64) -> String {
    format!("{:.1} %", r * 100.0)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// The SVG bar chart of `series`' daily rejection rate (0–100 %). Days without decisions
/// show a grey baseline tick; every bar carries its numbers as a tooltip title.
pub fn chart_svg(series: &Series, id: &str) -> String {
    const W: f64 = 640.0;
    const H: f64 = 180.0;
    const LEFT: f64 = 44.0;
    const TOP: f64 = 10.0;
    const BOTTOM: f64 = 26.0;
    let plot_w = W - LEFT - 8.0;
    let plot_h = H - TOP - BOTTOM;
    let n = series.days.len().max(1) as f64;
    let slot = plot_w / n;
    let label = escape(&series.label);
    let total = match rejection_rate(series.decided, series.rejected) {
        Some(r) => format!(
            "{} of {} decided gates rejected ({})",
            series.rejected,
            series.decided,
            percent(r)
        ),
        None => "no decided gates".to_string(),
    };
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {H}\" width=\"100%\" \
         role=\"img\" aria-labelledby=\"{id}-t {id}-d\" class=\"max-w-2xl\">\
         <title id=\"{id}-t\">Daily gate rejection rate: {label}</title>\
         <desc id=\"{id}-d\">{}</desc>",
        escape(&total)
    );
    for (frac, text) in [(0.0, "0 %"), (0.5, "50 %"), (1.0, "100 %")] {
        let y = TOP + plot_h * (1.0 - frac);
        out.push_str(&format!(
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#cbd5e1\" stroke-width=\"1\"/>\
             <text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#334155\">{text}</text>",
            W - 8.0,
            LEFT - 6.0,
            y + 4.0
        ));
    }
    for (i, d) in series.days.iter().enumerate() {
        let x = LEFT + slot * i as f64 + slot * 0.15;
        let w = (slot * 0.7).max(1.0);
        match rejection_rate(d.decided, d.rejected) {
            Some(r) => {
                let h = (plot_h * r).max(1.5);
                out.push_str(&format!(
                    "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"#b91c1c\">\
                     <title>{}: {} of {} rejected ({})</title></rect>",
                    TOP + plot_h - h,
                    escape(&d.day),
                    d.rejected,
                    d.decided,
                    percent(r)
                ));
            }
            None => out.push_str(&format!(
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"1\" fill=\"#94a3b8\">\
                 <title>{}: no decisions</title></rect>",
                TOP + plot_h - 1.0,
                escape(&d.day)
            )),
        }
    }
    if let (Some(first), Some(last)) = (series.days.first(), series.days.last()) {
        out.push_str(&format!(
            "<text x=\"{LEFT}\" y=\"{:.1}\" font-size=\"11\" fill=\"#334155\">{}</text>\
             <text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#334155\">{}</text>",
            H - 8.0,
            escape(&first.day),
            W - 8.0,
            H - 8.0,
            escape(&last.day)
        ));
    }
    out.push_str("</svg>");
    out
}

/// `/gates`: gate metrics.
#[component]
pub fn MetricsPage() -> impl IntoView {
    let data = Resource::new(|| (), |_| load_metrics());
    let query = crate::query::use_page_query();
    // Fixed sentences for known codes only; nothing from the query string is shown.
    let message = move || {
        if let Some(text) = query.get("error").and_then(|c| advisor::error_text(&c)) {
            return Some(view! {
                <p role="alert" data-testid="error" class="rounded border border-red-300 bg-red-50 p-3 font-medium text-red-900">{text}</p>
            }.into_any());
        }
        query.get("done").and_then(|c| advisor::notice_text(&c)).map(|text| view! {
            <p role="status" data-testid="notice" class="rounded border border-emerald-300 bg-emerald-50 p-3 font-medium text-emerald-900">{text}</p>
        }.into_any())
    };
    view! {
        <section class="space-y-6">
            <h1 class="text-2xl font-semibold">"Gate metrics"</h1>
            {message}
            <Suspense fallback=|| view! { <p class="text-slate-600">"Loading metrics…"</p> }>
                {move || Suspend::new(async move {
                    match data.await {
                        Ok(MetricsView::Refused(why)) => {
                            view! { <RefusedNote why page="Gate metrics" roles="managers and admins"/> }
                                .into_any()
                        }
                        Ok(MetricsView::Data(d)) => view! { <MetricsBody data=*d/> }.into_any(),
                        Err(e) => {
                            view! {
                                <p role="alert" class="rounded border border-red-300 bg-red-50 p-3 text-red-900">
                                    "The metrics could not be loaded: " {e.to_string()}
                                </p>
                            }
                                .into_any()
                        }
                    }
                })}
            </Suspense>
        </section>
    }
}

#[component]
fn Charts(title: &'static str, series: Vec<Series>, prefix: &'static str) -> impl IntoView {
    view! {
        <section class="space-y-3">
            <h2 class="text-lg font-semibold">{title}</h2>
            {if series.is_empty() {
                view! { <p class="text-slate-700">"No gates in this window."</p> }.into_any()
            } else {
                series
                    .into_iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let svg = chart_svg(&s, &format!("{prefix}-{i}"));
                        let rate = rejection_rate(s.decided, s.rejected)
                            .map_or_else(|| "no decisions".to_string(), percent);
                        let days: Vec<DayCell> = s.days.iter().filter(|d| d.decided > 0).cloned().collect();
                        view! {
                            <figure class="rounded border border-slate-200 bg-white p-3" data-testid="rate-chart" data-label=s.label.clone()>
                                <figcaption class="text-sm font-medium">
                                    <span class="font-mono">{s.label.clone()}</span>
                                    {format!(" — rejection rate {rate} ({} of {} decided)", s.rejected, s.decided)}
                                </figcaption>
                                <div inner_html=svg></div>
                                <details class="text-sm">
                                    <summary class="cursor-pointer text-indigo-800 focus:outline-none focus:ring-2 focus:ring-indigo-600">"Numbers by day"</summary>
                                    <table class="mt-1 text-left">
                                        <thead><tr><th scope="col" class="pr-4">"Day"</th><th scope="col" class="pr-4">"Decided"</th><th scope="col">"Rejected"</th></tr></thead>
                                        <tbody>
                                            {days.into_iter().map(|d| view! { <tr><td class="pr-4">{d.day}</td><td class="pr-4">{d.decided}</td><td>{d.rejected}</td></tr> }).collect_view()}
                                        </tbody>
                                    </table>
                                </details>
                            </figure>
                        }
                    })
                    .collect_view()
                    .into_any()
            }}
        </section>
    }
}

#[component]
fn MetricsBody(data: MetricsData) -> impl IntoView {
    let latency = data.latency.clone().map_or_else(
        || "No decisions in this window.".to_string(),
        |l| {
            format!(
                "p50 {} · p90 {} · p99 {} (over {} decision(s))",
                duration_text(l.p50_ms),
                duration_text(l.p90_ms),
                duration_text(l.p99_ms),
                l.decisions
            )
        },
    );
    view! {
        <p class="text-sm text-slate-700">{format!("Window: {} to {} (UTC), by day of decision.", data.since, data.until)}</p>
        <dl class="grid grid-cols-1 gap-3 sm:grid-cols-2">
            <div class="rounded border border-slate-200 bg-white p-3">
                <dt class="text-sm font-medium text-slate-700">"Approval latency (gate opened → decided)"</dt>
                <dd data-testid="latency" class="text-lg">{latency}</dd>
            </div>
            <div class="rounded border border-slate-200 bg-white p-3">
                <dt class="text-sm font-medium text-slate-700">"Gates expired without a decision"</dt>
                <dd data-testid="expired" class="text-lg">{data.expired}</dd>
            </div>
        </dl>
        <section class="space-y-2">
            <h2 class="text-lg font-semibold">"Does the gate pay? (break-even, seed 000)"</h2>
            <p class="max-w-3xl text-sm text-slate-800">
                "With rejection rate r and a reversal cost of k approvals, a gated step saves r × k approvals' worth and costs one: "
                "the gate pays when r × k > 1, that is for any step whose reversal costs more than 1 / r approvals. "
                "A rate near zero over months argues for moving the step from a person to the model reviewer."
            </p>
            <table class="w-full border-collapse rounded border border-slate-200 bg-white text-left text-sm">
                <thead class="bg-slate-100 text-slate-800">
                    <tr>
                        <th scope="col" class="px-3 py-2">"Tool"</th>
                        <th scope="col" class="px-3 py-2 text-right">"Gates"</th>
                        <th scope="col" class="px-3 py-2 text-right">"Approved"</th>
                        <th scope="col" class="px-3 py-2 text-right">"Rejected"</th>
                        <th scope="col" class="px-3 py-2 text-right">"Expired"</th>
                        <th scope="col" class="px-3 py-2 text-right">"Waiting"</th>
                        <th scope="col" class="px-3 py-2 text-right">"r"</th>
                        <th scope="col" class="px-3 py-2">"Pays when k >"</th>
                    </tr>
                </thead>
                <tbody>
                    {data
                        .tools
                        .into_iter()
                        .map(|t| {
                            let rate = rejection_rate(t.approved + t.rejected, t.rejected);
                            let k = match (rate, break_even(rate)) {
                                (None, _) => "no decisions yet".to_string(),
                                (Some(_), None) => "never on this evidence (r = 0)".to_string(),
                                (Some(_), Some(k)) => format!("{k:.1} approvals"),
                            };
                            view! {
                                <tr data-testid="break-even-row" data-tool=t.tool.clone() class="border-t border-slate-200">
                                    <td class="px-3 py-2 font-mono">{t.tool.clone()}</td>
                                    <td class="px-3 py-2 text-right tabular-nums">{t.opened}</td>
                                    <td class="px-3 py-2 text-right tabular-nums">{t.approved}</td>
                                    <td class="px-3 py-2 text-right tabular-nums">{t.rejected}</td>
                                    <td class="px-3 py-2 text-right tabular-nums">{t.expired}</td>
                                    <td class="px-3 py-2 text-right tabular-nums">{t.waiting}</td>
                                    <td class="px-3 py-2 text-right tabular-nums" data-testid="rate">{rate.map_or_else(|| "—".to_string(), percent)}</td>
                                    <td class="px-3 py-2" data-testid="break-even">{k}</td>
                                </tr>
                            }
                        })
                        .collect_view()}
                </tbody>
            </table>
        </section>
        <advisor::Advisor rows=data.advice/>
        <advisor::ShadowRules rows=data.shadow admin=data.admin/>
        <Charts title="Rejection rate per tool, by day" series=data.by_tool prefix="tool"/>
        <Charts title="Rejection rate per policy rule, by day" series=data.by_rule prefix="rule"/>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn break_even_is_one_over_r_and_undefined_without_rejections() {
        let r = rejection_rate(100, 3);
        assert_eq!(r, Some(0.03));
        let k = break_even(r).unwrap();
        assert!((k - 33.333).abs() < 0.01, "{k}");
        assert_eq!(break_even(rejection_rate(10, 0)), None);
        assert_eq!(rejection_rate(0, 0), None);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), Some(50));
        assert_eq!(percentile(&v, 90), Some(90));
        assert_eq!(percentile(&v, 99), Some(99));
        assert_eq!(percentile(&[7], 99), Some(7));
        assert_eq!(percentile(&[1, 2, 3], 50), Some(2));
        assert_eq!(percentile(&[], 50), None);
    }

    #[test]
    fn chart_escapes_labels_and_draws_one_bar_per_day() {
        let s = Series {
            label: "<script>".into(),
            decided: 3,
            rejected: 1,
            days: vec![
                DayCell {
                    day: "2026-06-10".into(),
                    decided: 0,
                    rejected: 0,
                },
                DayCell {
                    day: "2026-06-11".into(),
                    decided: 3,
                    rejected: 1,
                },
            ],
        };
        let svg = chart_svg(&s, "c");
        assert!(!svg.contains("<script>"), "{svg}");
        assert!(svg.contains("&lt;script&gt;"));
        assert_eq!(svg.matches("<rect").count(), 2);
        assert!(
            svg.contains("2026-06-11: 1 of 3 rejected (33.3 %)"),
            "{svg}"
        );
        assert!(svg.contains("2026-06-10: no decisions"));
    }
}
