//! The gate advisor and the shadow rules on `/gates` (issue 33): per gated tool and rule, the
//! rejection rate with its interval, trend, reversal cost and a recommendation with its
//! evidence, and a button that drafts the matching proposal (never applied here: a proposal
//! waits for an admin); per shadow rule, what it would have denied or gated, by day.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

/// The form the draft button posts to.
pub const DRAFT_PATH: &str = "/gates/draft";

/// The form that proposes enforcing a shadow rule.
pub const PROMOTE_PATH: &str = "/admin/shadow/promote";

/// A rejection the advice rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    /// The run (for its timeline).
    pub run_id: String,
    /// The approver's reason.
    pub reason: String,
}

/// The advisor's view of one gate (a tool and the rule that opened it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdviceRow {
    /// Tool.
    pub tool: String,
    /// Rule.
    pub rule: String,
    /// Gates decided in the window.
    pub decided: u32,
    /// Of which rejected.
    pub rejected: u32,
    /// `r` and its 95 % interval, as text (`2.0 % (0.4 %–7.0 %)`), or `—`.
    pub rate: String,
    /// `rising`, `falling`, `steady`, or empty (not enough in a half).
    pub trend: String,
    /// The tool's reversal cost in approvals, as set in the registry (empty: unset).
    pub reversal_cost: String,
    /// The advice's code (`pays`, `consider_reviewer`, `too_few`, `no_cost`, `undecided`).
    pub advice: String,
    /// The advice in plain words.
    pub words: String,
    /// The latest rejections, newest first (at most five).
    pub recent: Vec<Rejection>,
    /// What the draft button would propose, when there is one.
    pub draft: Option<String>,
}

/// One day of a shadow rule's would-decisions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowDay {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    /// Would have been denied.
    pub deny: u32,
    /// Would have waited for a person.
    pub gate: u32,
}

/// A call a shadow rule would have decided otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowExample {
    /// `YYYY-MM-DD HH:MM` (UTC).
    pub at: String,
    /// Tool.
    pub tool: String,
    /// What it would have been (`deny`, `require_approval`, `allow`).
    pub would: String,
    /// What it was.
    pub was: String,
    /// Its run.
    pub run_id: String,
}

/// One shadow rule over the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowRow {
    /// The policy's `@id`.
    pub id: String,
    /// Its `@rule`.
    pub rule: String,
    /// Calls it would have denied.
    pub would_deny: u32,
    /// Calls it would have gated.
    pub would_gate: u32,
    /// Days with any would-decision, oldest first.
    pub days: Vec<ShadowDay>,
    /// The latest calls it would have decided otherwise, newest first (at most five).
    pub examples: Vec<ShadowExample>,
}

/// The message for a `?done=` code after a draft.
pub fn notice_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "drafted" => {
            "Proposal drafted. Nothing changes until an admin reviews its impact preview on the \
             admin page and a second admin approves it."
        }
        _ => return None,
    })
}

/// The message for a `?error=` code after a draft that was not filed.
pub fn error_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "not_offered" => {
            "The advisor does not recommend a change for this gate now (or no draft can be \
             made for it). Nothing was drafted."
        }
        "no_change" => "The registry already says this. Nothing was drafted.",
        "stale" => "The registry changed meanwhile. Nothing was drafted; look again.",
        "invalid" => "The draft would not be a valid registry. Nothing was drafted.",
        "unavailable" => "The database did not answer. Nothing was drafted; try again.",
        _ => return None,
    })
}

const LINK: &str = "text-indigo-800 underline hover:text-indigo-950 focus:outline-none focus:ring-2 focus:ring-indigo-600";
const BUTTON: &str = "rounded bg-indigo-700 px-3 py-1.5 text-sm font-medium text-white hover:bg-indigo-800 focus:outline-none focus:ring-2 focus:ring-indigo-500 focus:ring-offset-2";

/// The advisor table.
#[component]
pub fn Advisor(rows: Vec<AdviceRow>) -> impl IntoView {
    view! {
        <section class="space-y-2" aria-labelledby="advisor-h">
            <h2 id="advisor-h" class="text-lg font-semibold">"Gate advisor"</h2>
            <p class="max-w-3xl text-sm text-slate-800">
                "Per gated tool and rule: the rejection rate r with its 95 % interval over the window, its trend (older half vs newer half), "
                "and the reversal cost k admins set for the tool. The gate pays when r × k > 1 for the whole interval; "
                "a draft is only a proposal: an admin reviews its impact preview and a second admin approves it."
            </p>
            {if rows.is_empty() {
                view! { <p class="text-slate-700">"No gated tool decided in this window."</p> }.into_any()
            } else {
                rows.into_iter().map(|r| view! { <AdviceCard row=r/> }).collect_view().into_any()
            }}
        </section>
    }
}

#[component]
fn AdviceCard(row: AdviceRow) -> impl IntoView {
    let cost = if row.reversal_cost.is_empty() {
        "not set".to_string()
    } else {
        format!("{} approvals", row.reversal_cost)
    };
    let trend = if row.trend.is_empty() {
        "not enough in one half".to_string()
    } else {
        row.trend.clone()
    };
    let draft = row.draft.clone().map(|what| {
        view! {
            <form method="post" action=DRAFT_PATH class="flex flex-wrap items-center gap-2">
                <input type="hidden" name="tool" value=row.tool.clone()/>
                <input type="hidden" name="rule" value=row.rule.clone()/>
                <button type="submit" class=BUTTON data-testid="draft">"Draft the proposal"</button>
                <span class="text-sm text-slate-700">{what}</span>
            </form>
        }
    });
    view! {
        <article class="space-y-2 rounded border border-slate-200 bg-white p-3" data-testid="advice" data-tool=row.tool.clone() data-rule=row.rule.clone() data-advice=row.advice.clone()>
            <h3 class="font-medium"><span class="font-mono break-all">{row.tool.clone()}</span>" · "<span class="font-mono break-all">{row.rule.clone()}</span></h3>
            <p class="text-base font-semibold" data-testid="advice-words">{row.words.clone()}</p>
            <dl class="grid grid-cols-2 gap-x-4 text-sm sm:grid-cols-4">
                <dt class="text-slate-700">"Decided"</dt><dd class="tabular-nums">{format!("{} ({} rejected)", row.decided, row.rejected)}</dd>
                <dt class="text-slate-700">"r (95 % interval)"</dt><dd class="tabular-nums" data-testid="advice-rate">{row.rate.clone()}</dd>
                <dt class="text-slate-700">"Trend"</dt><dd>{trend}</dd>
                <dt class="text-slate-700">"Reversal cost k"</dt><dd>{cost}</dd>
            </dl>
            {(!row.recent.is_empty()).then(|| view! {
                <details class="text-sm">
                    <summary class="cursor-pointer text-indigo-800 focus:outline-none focus:ring-2 focus:ring-indigo-600">"Recent rejections"</summary>
                    <ul class="mt-1 list-disc pl-5">
                        {row.recent.iter().map(|x| view! {
                            <li>{x.day.clone()}": "{x.reason.clone()}" "{(!x.run_id.is_empty()).then(|| view! { <a class=LINK href=format!("/runs/{}", x.run_id)>"run"</a> })}</li>
                        }).collect_view()}
                    </ul>
                </details>
            })}
            {draft}
        </article>
    }
}

/// The shadow rules and what they would have decided.
#[component]
pub fn ShadowRules(rows: Vec<ShadowRow>, admin: bool) -> impl IntoView {
    view! {
        <section class="space-y-2" aria-labelledby="shadow-h">
            <h2 id="shadow-h" class="text-lg font-semibold">"Shadow rules"</h2>
            <p class="max-w-3xl text-sm text-slate-800">
                "A policy marked @shadow is evaluated on every call and never changes an outcome; what it would have decided is recorded with the call. "
                "Enforcing one is a proposal, with its impact preview, that a second admin approves."
            </p>
            {if rows.is_empty() {
                view! { <p class="text-slate-700">"No shadow rule is in force, or none would have decided otherwise in this window."</p> }.into_any()
            } else {
                rows.into_iter().map(|r| view! { <ShadowCard row=r admin/> }).collect_view().into_any()
            }}
        </section>
    }
}

#[component]
fn ShadowCard(row: ShadowRow, admin: bool) -> impl IntoView {
    let promote = admin.then(|| {
        view! {
            <form method="post" action=PROMOTE_PATH>
                <input type="hidden" name="id" value=row.id.clone()/>
                <button type="submit" class=BUTTON data-testid="promote">"Propose enforcing it"</button>
            </form>
        }
    });
    view! {
        <article class="space-y-2 rounded border border-slate-200 bg-white p-3" data-testid="shadow-rule" data-id=row.id.clone()>
            <h3 class="font-medium"><span class="font-mono break-all">{row.id.clone()}</span>" · "<span class="font-mono break-all">{row.rule.clone()}</span></h3>
            <p class="text-sm" data-testid="shadow-counts">{format!("would deny {} · would gate {}", row.would_deny, row.would_gate)}</p>
            {(!row.days.is_empty()).then(|| view! {
                <table class="text-left text-sm">
                    <caption class="sr-only">{format!("What {} would have decided, by day", row.id)}</caption>
                    <thead><tr><th scope="col" class="pr-4">"Day"</th><th scope="col" class="pr-4">"Would deny"</th><th scope="col">"Would gate"</th></tr></thead>
                    <tbody>
                        {row.days.iter().map(|d| view! { <tr><td class="pr-4">{d.day.clone()}</td><td class="pr-4 tabular-nums">{d.deny}</td><td class="tabular-nums">{d.gate}</td></tr> }).collect_view()}
                    </tbody>
                </table>
                <ul class="list-disc pl-5 text-sm">
                    {row.examples.iter().map(|e| view! {
                        <li data-testid="shadow-example">{format!("{} {}: {} → would {} ", e.at, e.tool, e.was, e.would)}{(!e.run_id.is_empty()).then(|| view! { <a class=LINK href=format!("/runs/{}", e.run_id)>"run"</a> })}</li>
                    }).collect_view()}
                </ul>
            })}
            {promote}
        </article>
    }
}
