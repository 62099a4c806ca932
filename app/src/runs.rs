//! Runs: the list (`/runs`) and one run's timeline (`/runs/{id}`): its steps and every audit
//! record of the run in chain order, linked step ↔ proposal ↔ decision ↔ approval ↔ outcome.
//!
//! Invariants:
//! * The server functions return data only to a signed-in person holding one of
//!   [`RUN_ROLES`] and a tenant, and only that tenant's runs ([`RunsSource`] is asked with
//!   the person's tenant); everyone else gets [`RunsView::Refused`] / [`TimelineView::Refused`]
//!   and a 403, with no run data. A run of another tenant is [`TimelineView::NotFound`].
//! * Statuses are always shown as text next to their colour ([`tone`]); colour is never the
//!   only carrier of meaning.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use serde::{Deserialize, Serialize};

use crate::{Refused, RefusedNote};

/// Roles that may read runs.
#[cfg(feature = "ssr")]
pub const RUN_ROLES: [countersign_core::AppRole; 4] = [
    countersign_core::AppRole::Approver,
    countersign_core::AppRole::Manager,
    countersign_core::AppRole::Admin,
    countersign_core::AppRole::Auditor,
];

/// How many steps of a run are where.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepCounts {
    /// All steps.
    pub total: i64,
    /// Done.
    pub done: i64,
    /// Waiting for a person.
    pub waiting: i64,
    /// Pending or running.
    pub open: i64,
    /// Failed, refused, expired or cancelled.
    pub stopped: i64,
    /// Unknown: sent, no answer; being reconciled.
    pub unknown: i64,
}

/// One run in the list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRow {
    /// Run id.
    pub id: String,
    /// The task text.
    pub task: String,
    /// Run status text.
    pub status: String,
    /// Who the run acts for.
    pub principal: String,
    /// The principal in words (an agent's name and role).
    pub principal_name: String,
    /// Tenant.
    pub tenant: String,
    /// Where the task came from.
    pub origin: String,
    /// Opened, UTC text.
    pub created: String,
    /// Why it stopped, if it did.
    pub reason: String,
    /// Step counts.
    pub steps: StepCounts,
}

/// One page of the run list: rows newest first, and the `before=` cursor of the older page.
pub type RunListPage = (Vec<RunRow>, Option<String>);

/// The run list as the signed-in person may see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunsView {
    /// No data for this person.
    Refused(Refused),
    /// Runs newest first, and the cursor of the next (older) page.
    Runs {
        /// The rows.
        rows: Vec<RunRow>,
        /// `before=` value for the older page, if there is one.
        older: Option<String>,
    },
}

/// Links from a step to its audit records (their `seq`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLinks {
    /// The step's first record (`proposed`, or the first `decided` of a direct call).
    pub proposal: Option<i64>,
    /// The last `decided` record.
    pub decision: Option<i64>,
    /// `approved` / `rejected` / `expired` records.
    pub approvals: Vec<(i64, String)>,
    /// The last outcome record (`succeeded`, `failed`, `unknown`, `reconciled`, `refused`…).
    pub outcome: Option<(i64, String)>,
}

/// One step of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepView {
    /// Step id.
    pub id: String,
    /// Position in the run.
    pub seq: i64,
    /// Tool.
    pub tool: String,
    /// Effect class.
    pub effect: String,
    /// Step status text.
    pub status: String,
    /// Amount with currency, when the inputs carry one.
    pub amount: Option<String>,
    /// What the call acts on.
    pub target: Option<String>,
    /// Executions started.
    pub attempts: i64,
    /// The rule behind the last decision.
    pub rule: Option<String>,
    /// The target system's reference, when it answered with one.
    pub reference: Option<String>,
    /// Links to the audit records.
    pub links: StepLinks,
}

/// One audit record of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventView {
    /// Chain position.
    pub seq: i64,
    /// UTC text.
    pub at: String,
    /// Event text.
    pub event: String,
    /// The step, if any.
    pub step_id: Option<String>,
    /// The step's position in the run.
    pub step_seq: Option<i64>,
    /// Tool.
    pub tool: Option<String>,
    /// Actor, exactly as recorded.
    pub actor: Option<String>,
    /// The actor in words (agent and person names).
    pub actor_name: Option<String>,
    /// Rule.
    pub rule: Option<String>,
    /// A one-line summary of the record's detail.
    pub summary: String,
    /// The hashed record, pretty-printed.
    pub record: String,
}

/// A run's timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunDetail {
    /// The run.
    pub run: RunRow,
    /// Executed by the workers from a plan.
    pub planned: bool,
    /// Flagged for re-planning.
    pub replan: bool,
    /// Steps in order.
    pub steps: Vec<StepView>,
    /// Every audit record of the run, in chain order.
    pub events: Vec<EventView>,
}

/// One run as the signed-in person may see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimelineView {
    /// No data for this person.
    Refused(Refused),
    /// No such run in the person's tenant.
    NotFound,
    /// The run.
    Run(Box<RunDetail>),
}

/// Where the server's run data comes from (server only).
#[cfg(feature = "ssr")]
pub trait RunsSource: Send + Sync + 'static {
    /// A page of `tenant`'s runs, newest first, older than the `before` cursor.
    fn runs<'a>(
        &'a self,
        tenant: &'a str,
        before: Option<String>,
    ) -> crate::inbox::BoxFuture<'a, Result<RunListPage, String>>;

    /// One run of `tenant`, `None` when there is none.
    fn run<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
    ) -> crate::inbox::BoxFuture<'a, Result<Option<RunDetail>, String>>;
}

/// The context value the server provides.
#[cfg(feature = "ssr")]
#[derive(Clone)]
pub struct Runs(pub std::sync::Arc<dyn RunsSource>);

#[cfg(feature = "ssr")]
fn source() -> Result<Runs, ServerFnError> {
    use_context::<Runs>().ok_or_else(|| ServerFnError::new("runs are not available"))
}

/// The signed-in person's runs.
#[leptos::server]
pub async fn load_runs(before: Option<String>) -> Result<RunsView, ServerFnError> {
    let (_, tenant) = match crate::person_with(&RUN_ROLES)? {
        Ok(p) => p,
        Err(why) => return Ok(RunsView::Refused(why)),
    };
    let (rows, older) = source()?
        .0
        .runs(&tenant, before)
        .await
        .map_err(ServerFnError::new)?;
    Ok(RunsView::Runs { rows, older })
}

/// One run's timeline.
#[leptos::server]
pub async fn load_run(id: String) -> Result<TimelineView, ServerFnError> {
    let (_, tenant) = match crate::person_with(&RUN_ROLES)? {
        Ok(p) => p,
        Err(why) => return Ok(TimelineView::Refused(why)),
    };
    match source()?.0.run(&tenant, &id).await {
        Ok(Some(detail)) => Ok(TimelineView::Run(Box::new(detail))),
        Ok(None) => Ok(TimelineView::NotFound),
        Err(e) => Err(ServerFnError::new(e)),
    }
}

/// Colour classes and the words for a run, step or event status. The words always show.
pub fn tone(status: &str) -> (&'static str, &'static str) {
    const GREEN: &str = "border-emerald-300 bg-emerald-50 text-emerald-900";
    const AMBER: &str = "border-amber-400 bg-amber-50 text-amber-950";
    const RED: &str = "border-red-300 bg-red-50 text-red-900";
    const BLUE: &str = "border-sky-300 bg-sky-50 text-sky-900";
    const PURPLE: &str = "border-violet-300 bg-violet-50 text-violet-900";
    const GREY: &str = "border-slate-300 bg-slate-50 text-slate-800";
    match status {
        "done" | "succeeded" => (GREEN, "done"),
        "approved" => (GREEN, "approved"),
        "active" => (BLUE, "active"),
        "pending" => (BLUE, "pending"),
        "running" | "started" => (BLUE, "running"),
        "needs_approval" | "waiting_approval" => (AMBER, "needs approval"),
        "unknown" => (PURPLE, "unknown: sent, no answer; reconciling by key"),
        "reconciled" => (PURPLE, "reconciled with the target"),
        "compensated" => (PURPLE, "compensated"),
        "failed" => (RED, "failed"),
        "refused" => (RED, "refused"),
        "rejected" => (RED, "rejected"),
        "expired" => (RED, "expired: gate closed"),
        "stopped" => (RED, "stopped"),
        "cancelled" => (GREY, "cancelled"),
        "proposed" => (GREY, "proposed"),
        "validated" => (GREY, "validated"),
        "decided" => (GREY, "decided"),
        "operational" => (GREY, "operational"),
        _ => (GREY, "other"),
    }
}

/// A status as a coloured badge with its words (and the stored text for anything unknown).
#[component]
pub fn Badge(status: String) -> impl IntoView {
    let (classes, words) = tone(&status);
    let words = if words == "other" {
        status.clone()
    } else {
        words.to_string()
    };
    view! {
        <span
            data-status=status
            class=format!("inline-flex items-center gap-1 rounded border px-2 py-0.5 text-xs font-medium {classes}")
        >
            <span aria-hidden="true">"●"</span>
            {words}
        </span>
    }
}

const LINK: &str = "text-indigo-800 underline hover:bg-indigo-50 focus:outline-none focus:ring-2 focus:ring-indigo-600 rounded";

#[component]
fn Problem(error: String) -> impl IntoView {
    view! {
        <p role="alert" class="rounded border border-red-300 bg-red-50 p-3 text-red-900">
            "The data could not be loaded: " {error}
        </p>
    }
}

/// `/runs`: the tenant's runs, newest first.
#[component]
pub fn RunsPage() -> impl IntoView {
    let query = crate::query::use_page_query();
    let before = move || query.get("before");
    let runs = Resource::new(before, load_runs);
    view! {
        <section class="space-y-4">
            <h1 class="text-2xl font-semibold">"Runs"</h1>
            <Suspense fallback=|| view! { <p class="text-slate-600">"Loading runs…"</p> }>
                {move || Suspend::new(async move {
                    match runs.await {
                        Ok(RunsView::Refused(why)) => {
                            view! { <RefusedNote why page="The run list" roles="approvers, managers, admins and auditors"/> }
                                .into_any()
                        }
                        Ok(RunsView::Runs { rows, .. }) if rows.is_empty() => {
                            view! {
                                <p class="rounded border border-dashed border-slate-300 bg-white p-6 text-slate-700">
                                    "No runs yet. Runs appear here when an agent calls a tool."
                                </p>
                            }
                                .into_any()
                        }
                        Ok(RunsView::Runs { rows, older }) => view! { <RunTable rows older/> }.into_any(),
                        Err(e) => view! { <Problem error=e.to_string()/> }.into_any(),
                    }
                })}
            </Suspense>
        </section>
    }
}

fn counts_text(c: &StepCounts) -> String {
    let mut parts = vec![format!("{} done", c.done)];
    if c.waiting > 0 {
        parts.push(format!("{} waiting", c.waiting));
    }
    if c.open > 0 {
        parts.push(format!("{} open", c.open));
    }
    if c.unknown > 0 {
        parts.push(format!("{} unknown", c.unknown));
    }
    if c.stopped > 0 {
        parts.push(format!("{} failed/refused", c.stopped));
    }
    format!("{} step(s): {}", c.total, parts.join(", "))
}

#[component]
fn RunTable(rows: Vec<RunRow>, older: Option<String>) -> impl IntoView {
    view! {
        <table class="w-full border-collapse rounded border border-slate-200 bg-white text-left text-sm">
            <caption class="sr-only">"Runs, newest first"</caption>
            <thead class="bg-slate-100 text-slate-800">
                <tr>
                    <th scope="col" class="px-3 py-2">"Opened"</th>
                    <th scope="col" class="px-3 py-2">"Task"</th>
                    <th scope="col" class="px-3 py-2">"Status"</th>
                    <th scope="col" class="px-3 py-2">"Principal"</th>
                    <th scope="col" class="px-3 py-2">"Tenant"</th>
                    <th scope="col" class="px-3 py-2">"Steps"</th>
                </tr>
            </thead>
            <tbody>
                {rows
                    .into_iter()
                    .map(|r| {
                        let href = format!("/runs/{}", r.id);
                        let counts = counts_text(&r.steps);
                        view! {
                            <tr data-testid="run-row" data-run-id=r.id.clone() class="border-t border-slate-200 align-top">
                                <td class="px-3 py-2 whitespace-nowrap text-slate-700">{r.created.clone()}</td>
                                <td class="px-3 py-2">
                                    <a href=href class=LINK title=format!("run {}", r.id)>{if r.task.is_empty() { "(no task)".to_string() } else { r.task.clone() }}</a>
                                </td>
                                <td class="px-3 py-2"><Badge status=r.status.clone()/></td>
                                <td class="px-3 py-2 text-xs" title=r.principal.clone()>{r.principal_name.clone()}</td>
                                <td class="px-3 py-2">{r.tenant.clone()}</td>
                                <td class="px-3 py-2" data-testid="run-steps">{counts}</td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
        <nav aria-label="Pages" class="flex gap-4 text-sm">
            <a href="/runs" class=LINK>"Newest"</a>
            {older.map(|c| view! { <a href=format!("/runs?before={c}") class=LINK rel="next">"Older runs →"</a> })}
        </nav>
    }
}

/// `/runs/{id}`: one run's steps and every audit record in order.
#[component]
pub fn RunPage() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.read().get("id").unwrap_or_default();
    let run = Resource::new(id, load_run);
    view! {
        <section class="space-y-6">
            <p><a href="/runs" class=LINK>"← All runs"</a></p>
            <Suspense fallback=|| view! { <p class="text-slate-600">"Loading the run…"</p> }>
                {move || Suspend::new(async move {
                    match run.await {
                        Ok(TimelineView::Refused(why)) => {
                            view! { <RefusedNote why page="The run timeline" roles="approvers, managers, admins and auditors"/> }
                                .into_any()
                        }
                        Ok(TimelineView::NotFound) => {
                            view! {
                                <p data-testid="not-found" class="rounded border border-slate-300 bg-white p-6 text-slate-800">
                                    "There is no run at this address in your tenant."
                                </p>
                            }
                                .into_any()
                        }
                        Ok(TimelineView::Run(detail)) => view! { <Timeline detail=*detail/> }.into_any(),
                        Err(e) => view! { <Problem error=e.to_string()/> }.into_any(),
                    }
                })}
            </Suspense>
        </section>
    }
}

fn rec_link(seq: i64, text: String) -> impl IntoView {
    view! { <a href=format!("#rec-{seq}") class=LINK>{text}</a> }
}

#[component]
fn Timeline(detail: RunDetail) -> impl IntoView {
    let run = detail.run;
    let audit_href = format!("/audit?run={}", run.id);
    let flags = {
        let mut f = Vec::new();
        if detail.planned {
            f.push("planned (executed by workers)");
        }
        if detail.replan {
            f.push("flagged for re-planning");
        }
        f.join(", ")
    };
    view! {
        <article class="space-y-6" data-testid="run-timeline">
            <header class="space-y-2">
                <h1 class="text-2xl font-semibold" data-testid="run-task">{if run.task.is_empty() { "Run".to_string() } else { run.task.clone() }}</h1>
                <details class="text-sm text-slate-700">
                    <summary class="cursor-pointer">"Run id"</summary>
                    <code data-testid="run-id" class="select-all font-mono">{run.id.clone()}</code>
                </details>
                <p class="flex flex-wrap items-center gap-3 text-sm text-slate-700">
                    <Badge status=run.status.clone()/>
                    <span>"for " <span title=run.principal.clone() data-testid="run-principal">{run.principal_name.clone()}</span></span>
                    <span>"tenant " {run.tenant.clone()}</span>
                    <span>"origin " {run.origin.clone()}</span>
                    <span>"opened " {run.created.clone()}</span>
                    {(!flags.is_empty()).then(|| view! { <span>{flags.clone()}</span> })}
                    {(!run.reason.is_empty()).then(|| view! { <span>"reason: " {run.reason.clone()}</span> })}
                    <a href=audit_href class=LINK>"This run in the audit search"</a>
                </p>
            </header>
            <section class="space-y-2">
                <h2 class="text-lg font-semibold">"Steps"</h2>
                <table class="w-full border-collapse rounded border border-slate-200 bg-white text-left text-sm">
                    <thead class="bg-slate-100 text-slate-800">
                        <tr>
                            <th scope="col" class="px-3 py-2">"#"</th>
                            <th scope="col" class="px-3 py-2">"Tool"</th>
                            <th scope="col" class="px-3 py-2">"Status"</th>
                            <th scope="col" class="px-3 py-2 text-right">"Amount"</th>
                            <th scope="col" class="px-3 py-2">"Target"</th>
                            <th scope="col" class="px-3 py-2">"Proposal → decision → approval → outcome"</th>
                        </tr>
                    </thead>
                    <tbody>
                        {detail
                            .steps
                            .into_iter()
                            .map(|s| {
                                let links = s.links.clone();
                                view! {
                                    <tr id=format!("step-{}", s.id) data-testid="step-row" data-step-id=s.id.clone() class="border-t border-slate-200 align-top">
                                        <td class="px-3 py-2 tabular-nums">{s.seq}</td>
                                        <td class="px-3 py-2">
                                            <span class="font-mono">{s.tool.clone()}</span>
                                            <div class="text-xs text-slate-600">{format!("{} · {} attempt(s)", s.effect, s.attempts)}</div>
                                        </td>
                                        <td class="px-3 py-2">
                                            <Badge status=s.status.clone()/>
                                            {s.rule.clone().map(|r| view! { <div class="text-xs text-slate-700">"rule " <code>{r}</code></div> })}
                                            {s.reference.clone().map(|r| view! { <div class="text-xs text-slate-700">"ref " <code>{r}</code></div> })}
                                        </td>
                                        <td class="px-3 py-2 text-right tabular-nums" data-testid="step-amount">{s.amount.clone().unwrap_or_else(|| "—".into())}</td>
                                        <td class="px-3 py-2">{s.target.clone().unwrap_or_else(|| "—".into())}</td>
                                        <td class="px-3 py-2 space-x-2" data-testid="step-links">
                                            {links.proposal.map(|q| rec_link(q, format!("proposal #{q}")))}
                                            {links.decision.map(|q| rec_link(q, format!("decision #{q}")))}
                                            {links.approvals.into_iter().map(|(q, e)| rec_link(q, format!("{e} #{q}"))).collect_view()}
                                            {links.outcome.map(|(q, e)| rec_link(q, format!("{e} #{q}")))}
                                        </td>
                                    </tr>
                                }
                            })
                            .collect_view()}
                    </tbody>
                </table>
            </section>
            <section class="space-y-2">
                <h2 class="text-lg font-semibold">"Audit records, in chain order"</h2>
                <ol class="space-y-2">
                    {detail
                        .events
                        .into_iter()
                        .map(|e| {
                            let step = e.step_id.clone().zip(e.step_seq).map(|(id, n)| {
                                view! { <a href=format!("#step-{id}") class=LINK>{format!("step {n}")}</a> }
                            });
                            view! {
                                <li id=format!("rec-{}", e.seq) data-testid="event" data-event=e.event.clone() class="rounded border border-slate-200 bg-white p-3 text-sm target:ring-2 target:ring-indigo-600">
                                    <div class="flex flex-wrap items-center gap-3">
                                        <span class="font-mono text-slate-700">{format!("#{}", e.seq)}</span>
                                        <Badge status=e.event.clone()/>
                                        <span class="text-slate-700">{e.at.clone()}</span>
                                        {step}
                                        {e.tool.clone().map(|t| view! { <span class="font-mono">{t}</span> })}
                                        {e.rule.clone().map(|r| view! { <span>"rule " <code>{r}</code></span> })}
                                        {e.actor.clone().map(|a| {
                                            let name = e.actor_name.clone().unwrap_or_else(|| a.clone());
                                            view! { <span class="text-xs text-slate-700" title=a data-testid="event-actor">{name}</span> }
                                        })}
                                    </div>
                                    {(!e.summary.is_empty()).then(|| view! { <p class="mt-1 text-slate-800">{e.summary.clone()}</p> })}
                                    <details class="mt-1">
                                        <summary class="cursor-pointer text-indigo-800 focus:outline-none focus:ring-2 focus:ring-indigo-600">
                                            "Record" <span class="sr-only">{format!(" #{}", e.seq)}</span>
                                        </summary>
                                        <pre class="mt-1 overflow-x-auto rounded bg-slate-900 p-3 text-xs text-slate-100">{e.record.clone()}</pre>
                                    </details>
                                </li>
                            }
                        })
                        .collect_view()}
                </ol>
            </section>
        </article>
    }
}
