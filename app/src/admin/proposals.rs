//! The admin page's proposals: each change with its diff, its impact preview (what the
//! recorded calls of the window would have been decided as, issue 33), and the decision form.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use super::style::{BUTTON, CARD, H2, INPUT};

/// An example call whose outcome a proposal changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewExample {
    /// `allow->deny`, …
    pub transition: String,
    /// Tool.
    pub tool: String,
    /// The rule before → after, in words.
    pub rules: String,
    /// Its run (the timeline shows the step and its records).
    pub run_id: String,
    /// Its audit record, `chain#seq`.
    pub record: String,
}

/// A proposal's impact preview, as the page shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewView {
    /// Days replayed.
    pub days: i64,
    /// Whose calls: `tenant acme` or `every tenant`.
    pub scope: String,
    /// Calls replayed.
    pub replayed: usize,
    /// Calls decided differently.
    pub changed: usize,
    /// Replayed without all their recorded facts.
    pub approximate: usize,
    /// Same outcome under another rule.
    pub rule_changed: usize,
    /// Per transition, the count.
    pub transitions: Vec<(String, usize)>,
    /// Per tool: (tool, `allow->deny 3, …`).
    pub by_tool: Vec<(String, String)>,
    /// Per rule: (rule, `allow->deny 3, …`).
    pub by_rule: Vec<(String, String)>,
    /// Example calls (a few per transition).
    pub examples: Vec<PreviewExample>,
    /// Why there is no preview (the proposal no longer applies, the database failed).
    pub error: Option<String>,
}

/// One registry change proposal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProposalRow {
    /// Id.
    pub id: String,
    /// Who proposed it (display name).
    pub proposer: String,
    /// Whether the signed-in admin proposed it (they cannot approve it).
    pub mine: bool,
    /// UTC text.
    pub created: String,
    /// The registry version it was made against.
    pub base_version: i64,
    /// The diff: (`+`, `-` or `~`, the change in words).
    pub changes: Vec<(char, String)>,
    /// The proposer's note.
    pub note: String,
    /// `proposed`, `approved`, `rejected` or `superseded`.
    pub status: String,
    /// Who decided, and why, when decided.
    pub decision: Option<String>,
    /// The registry version it created, when approved.
    pub applied_version: Option<i64>,
    /// What it would have decided differently (pending proposals only).
    pub preview: Option<PreviewView>,
}

/// How the page names proposal `id` (its first 8 characters): `proposal 1a2b3c4d`.
pub fn proposal_name(id: &str) -> String {
    format!("proposal {}", id.chars().take(8).collect::<String>())
}

fn title_case(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
}

#[component]
pub(super) fn Proposals(proposals: Vec<ProposalRow>, platform: bool) -> AnyView {
    let empty = proposals.is_empty();
    let items = proposals
        .into_iter()
        .map(|p| {
            let diff = p
                .changes
                .iter()
                .map(|(sign, words)| {
                    let class = match sign {
                        '+' => "text-emerald-900 bg-emerald-50",
                        '-' => "text-red-900 bg-red-50",
                        _ => "text-amber-950 bg-amber-50",
                    };
                    view! { <li class=format!("px-2 font-mono {class}")>{words.clone()}</li> }
                })
                .collect_view();
            let waiting = p.status == "proposed";
            // Every control names the proposal it acts on: several may be open at once.
            let name = proposal_name(&p.id);
            let heading_id = format!("proposal-{}-h", p.id);
            let decide = waiting.then(|| {
                let action = format!("/admin/proposals/{}/decision", p.id);
                let reason_id = format!("proposal-{}-reason", p.id);
                let approve = (!p.mine && platform).then(|| {
                    let label = format!("Approve {name}");
                    view! {
                        <button type="submit" name="verdict" value="approve" aria-label=label class=BUTTON data-testid="approve">
                            "Approve"
                        </button>
                    }
                });
                let reject = format!("Reject {name}");
                let mine = p.mine.then(|| {
                    view! {
                        <p class="text-sm text-slate-600" data-testid="own-proposal">
                            "You proposed this: a second admin must approve it. You may withdraw it (reject)."
                        </p>
                    }
                });
                let not_platform = (!p.mine && !platform).then(|| {
                    view! {
                        <p class="text-sm text-slate-600" data-testid="needs-platform">
                            "Approving needs the platform admin role: the registry is shared by every tenant. You may reject it."
                        </p>
                    }
                });
                view! {
                    {mine}
                    {not_platform}
                    <form method="post" action=action class="flex flex-wrap items-end gap-2">
                        <div class="flex flex-col text-sm">
                            <label for=reason_id.clone()>
                                "Reason" <span class="sr-only">{format!(" for {name}")}</span>
                            </label>
                            <input id=reason_id name="reason" class=INPUT data-testid="decision-reason"/>
                        </div>
                        {approve}
                        <button
                            type="submit"
                            name="verdict"
                            value="reject"
                            aria-label=reject
                            data-testid="reject"
                            class="rounded border border-slate-400 bg-white px-3 py-1.5 text-sm font-medium text-slate-900 hover:bg-slate-100 focus:outline-none focus:ring-2 focus:ring-indigo-500"
                        >
                            "Reject"
                        </button>
                    </form>
                }
            });
            view! {
                <li class=CARD data-testid="proposal" data-proposal-id=p.id.clone() data-status=p.status.clone()>
                    <h3 id=heading_id class="text-base font-semibold">{title_case(&name)}</h3>
                    <p class="text-sm">
                        <span class="font-semibold">{p.status.clone()}</span>
                        " · proposed by " {p.proposer.clone()} " at " {p.created.clone()}
                        " against version " {p.base_version}
                        {p.applied_version.map(|v| format!(" · applied as version {v}"))}
                    </p>
                    <p class="text-sm text-slate-700">{p.note.clone()}</p>
                    <ul class="text-sm" aria-label="Changes" data-testid="proposal-diff">{diff}</ul>
                    {p.decision.clone().map(|d| view! { <p class="text-sm text-slate-700">{d}</p> })}
                    {p.preview.clone().map(|preview| view! { <Preview preview/> })}
                    {decide}
                </li>
            }
            .into_any()
        })
        .collect_view();
    view! {
        <section aria-labelledby="proposals-h" class="space-y-3">
            <h2 id="proposals-h" class=H2>"Proposals"</h2>
            {empty.then(|| view! { <p class="text-slate-600">"No registry changes proposed."</p> })}
            <ul class="space-y-3">{items}</ul>
        </section>
    }
    .into_any()
}

/// A proposal's impact preview.
#[component]
fn Preview(preview: PreviewView) -> AnyView {
    if let Some(e) = preview.error {
        return view! { <p class="text-sm text-slate-700" data-testid="preview-error">{format!("No impact preview: {e}")}</p> }.into_any();
    }
    let summary = format!(
        "Impact preview: {} recorded call(s) of the last {} days ({}) replayed; {} would be decided differently{}.",
        preview.replayed,
        preview.days,
        preview.scope,
        preview.changed,
        if preview.approximate > 0 {
            format!(
                " ({} replayed without all their recorded facts)",
                preview.approximate
            )
        } else {
            String::new()
        }
    );
    let table = |caption: &'static str, rows: Vec<(String, String)>| {
        (!rows.is_empty()).then(|| view! {
            <table class="text-left text-sm">
                <caption class="text-left font-medium">{caption}</caption>
                <tbody>
                    {rows.into_iter().map(|(k, v)| view! { <tr><th scope="row" class="pr-4 font-mono font-normal break-all">{k}</th><td>{v}</td></tr> }).collect_view()}
                </tbody>
            </table>
        })
    };
    view! {
        <div class="space-y-2 rounded border border-indigo-200 bg-indigo-50 p-3" data-testid="preview">
            <p class="text-sm font-medium" data-testid="preview-summary">{summary}</p>
            <ul class="text-sm">
                {preview.transitions.iter().map(|(t, n)| view! {
                    <li data-testid="preview-transition" data-transition=t.clone()><span class="font-mono">{t.clone()}</span>": "<span class="tabular-nums">{*n}</span></li>
                }).collect_view()}
            </ul>
            {table("By tool", preview.by_tool)}
            {table("By rule", preview.by_rule)}
            {(!preview.examples.is_empty()).then(|| view! {
                <details class="text-sm">
                    <summary class="cursor-pointer text-indigo-800 focus:outline-none focus:ring-2 focus:ring-indigo-600">"Example calls"</summary>
                    <ul class="mt-1 list-disc pl-5">
                        {preview.examples.into_iter().map(|e| view! {
                            <li data-testid="preview-example">
                                <span class="font-mono">{e.transition}</span>" "{e.tool}" ("{e.rules}") · audit "
                                <span class="font-mono">{e.record}</span>
                                {(!e.run_id.is_empty()).then(|| view! {
                                    " · "<a class="text-indigo-800 underline" href=format!("/runs/{}", e.run_id)>"its run"</a>
                                })}
                            </li>
                        }).collect_view()}
                    </ul>
                </details>
            })}
        </div>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposals_are_named_by_their_short_id() {
        let name = proposal_name("1a2b3c4d-0000-4000-8000-000000000000");
        assert_eq!(name, "proposal 1a2b3c4d");
        assert_eq!(title_case(&name), "Proposal 1a2b3c4d");
    }
}
