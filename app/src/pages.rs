//! One component per dashboard page. Pages that have no data yet say so plainly.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;

use crate::inbox::{
    DetailView, GateDetail, GateRow, InboxView, error_text, load_gate, load_gates, notice_text,
};
use crate::query::use_page_query;

/// The landing page: what Countersign is, and a hydration check.
#[component]
pub fn Home() -> impl IntoView {
    view! {
        <section class="space-y-6">
            <h1 class="text-2xl font-semibold">"Countersign"</h1>
            <p class="max-w-2xl text-slate-700">
                "The model proposes. Policy decides. A person countersigns what is risky. "
                "Agents reach tools through the MCP endpoint at "
                <code class="rounded bg-slate-100 px-1">"/mcp"</code>
                "; this dashboard is where people approve gated calls, follow runs and audit what happened."
            </p>
            <HydrationCheck/>
        </section>
    }
}

/// A button that only responds once the wasm bundle has hydrated the page: the
/// server-rendered HTML alone has no click handler.
#[component]
pub fn HydrationCheck() -> impl IntoView {
    let (clicks, set_clicks) = signal(0u32);
    let (hydrated, set_hydrated) = signal(false);
    // Effects run only in the browser, after hydration.
    Effect::new(move |_| set_hydrated.set(true));
    view! {
        <div class="flex items-center gap-4 rounded border border-slate-200 bg-white p-4">
            <button
                type="button"
                data-testid="hydration-button"
                class="rounded bg-indigo-700 px-4 py-2 text-sm font-medium text-white hover:bg-indigo-800 focus:outline-none focus:ring-2 focus:ring-indigo-500 focus:ring-offset-2"
                on:click=move |_| set_clicks.update(|n| *n += 1)
            >
                "Check interactivity"
            </button>
            <span data-testid="hydration-status" class="text-sm text-slate-700">
                {move || if hydrated.get() { "Interactive" } else { "Static (not hydrated)" }}
            </span>
            <span data-testid="hydration-clicks" class="text-sm text-slate-700">
                {move || format!("Clicks: {}", clicks.get())}
            </span>
        </div>
    }
}

#[component]
fn EmptyPage(title: &'static str, empty: &'static str) -> impl IntoView {
    view! {
        <section class="space-y-4">
            <h1 class="text-2xl font-semibold">{title}</h1>
            <p class="rounded border border-dashed border-slate-300 bg-white p-6 text-slate-600">
                {empty}
            </p>
        </section>
    }
}

/// Gated calls waiting for a person: the list (`/inbox`).
#[component]
pub fn Inbox() -> impl IntoView {
    #[cfg(feature = "hydrate")]
    inbox_keys();
    let gates = Resource::new(|| (), |_| load_gates());
    let query = use_page_query();
    let notice = move || {
        if let Some(text) = query.get("error").and_then(|code| error_text(&code)) {
            return Some(view! { <Problem text/> }.into_any());
        }
        query
            .get("done")
            .and_then(|code| notice_text(&code))
            .map(|text| view! { <Notice text/> }.into_any())
    };
    view! {
        <section class="space-y-4">
            <h1 class="text-2xl font-semibold">"Approval inbox"</h1>
            {notice}
            <Suspense fallback=|| view! { <p class="text-slate-600">"Loading gates…"</p> }>
                {move || Suspend::new(async move {
                    match gates.await {
                        Ok(InboxView::NotApprover) => view! { <NotApprover/> }.into_any(),
                        Ok(InboxView::Gates(rows)) => view! { <LiveGates initial=rows/> }.into_any(),
                        Err(e) => view! { <LoadError error=e.to_string()/> }.into_any(),
                    }
                })}
            </Suspense>
            <KeyboardHelp/>
        </section>
    }
}

/// Keyboard shortcuts on the inbox pages (browser only): `j` / `k` move the focus between
/// the gates' links, `a` / `r` focus the approve / reject button. Keys typed into a field are
/// left alone.
#[cfg(feature = "hydrate")]
fn inbox_keys() {
    use wasm_bindgen::JsCast;
    let handle = window_event_listener(leptos::ev::keydown, |ev| {
        if ev.ctrl_key() || ev.meta_key() || ev.alt_key() {
            return;
        }
        let typing = ev
            .target()
            .and_then(|t| t.dyn_into::<leptos::web_sys::Element>().ok())
            .is_some_and(|el| matches!(el.tag_name().as_str(), "INPUT" | "TEXTAREA" | "SELECT"));
        if typing {
            return;
        }
        let doc = document();
        let focus = |el: Option<leptos::web_sys::Element>| {
            if let Some(el) = el.and_then(|e| e.dyn_into::<leptos::web_sys::HtmlElement>().ok()) {
                let _ = el.focus();
            }
        };
        let key = ev.key();
        match key.as_str() {
            "j" | "k" => {
                // The list's links are `gate-link-0`, `gate-link-1`, … in order.
                let current: Option<u32> = doc.active_element().and_then(|a| {
                    a.id()
                        .strip_prefix("gate-link-")
                        .and_then(|n| n.parse().ok())
                });
                let next = match (key.as_str(), current) {
                    ("j", Some(i)) => i + 1,
                    ("k", Some(i)) => i.saturating_sub(1),
                    _ => 0,
                };
                if let Some(link) = doc.get_element_by_id(&format!("gate-link-{next}")) {
                    ev.prevent_default();
                    focus(Some(link));
                }
            }
            "a" | "r" => {
                let id = if key == "a" { "approve" } else { "reject" };
                if let Some(button) = doc.get_element_by_id(id) {
                    ev.prevent_default();
                    focus(Some(button));
                }
            }
            "x" => {
                // Ticks (or unticks) the row of the focused gate link, for a batch decision.
                let tick = doc
                    .active_element()
                    .filter(|a| a.id().starts_with("gate-link-"))
                    .and_then(|a| a.closest("tr").ok().flatten())
                    .and_then(|row| row.query_selector("input[type=checkbox]").ok().flatten())
                    .and_then(|b| b.dyn_into::<leptos::web_sys::HtmlElement>().ok());
                if let Some(b) = tick {
                    ev.prevent_default();
                    b.click();
                }
            }
            _ => {}
        }
    });
    on_cleanup(move || handle.remove());
}

#[component]
fn Notice(text: &'static str) -> impl IntoView {
    view! {
        <p
            role="status"
            data-testid="notice"
            class="rounded border border-emerald-300 bg-emerald-50 p-3 text-emerald-900"
        >
            {text}
        </p>
    }
}

#[component]
fn Problem(text: &'static str) -> impl IntoView {
    view! {
        <p
            role="alert"
            data-testid="error"
            class="rounded border border-red-300 bg-red-50 p-3 font-medium text-red-900"
        >
            {text}
        </p>
    }
}

#[component]
fn NotApprover() -> impl IntoView {
    view! {
        <p data-testid="not-approver" class="rounded border border-slate-300 bg-white p-6 text-slate-700">
            "The inbox is for approvers. Your account does not hold the approver role, so no gates are shown."
        </p>
    }
}

#[component]
fn LoadError(error: String) -> impl IntoView {
    view! {
        <p role="alert" class="rounded border border-red-300 bg-red-50 p-3 text-red-900">
            "The gates could not be loaded: " {error}
        </p>
    }
}

#[component]
fn KeyboardHelp() -> impl IntoView {
    view! {
        <p class="text-sm text-slate-600">
            "Keyboard: " <kbd class="rounded border px-1">"j"</kbd> " / "
            <kbd class="rounded border px-1">"k"</kbd> " move between gates, "
            <kbd class="rounded border px-1">"a"</kbd> " / " <kbd class="rounded border px-1">"r"</kbd>
            " go to approve / reject (after the reason), "
            <kbd class="rounded border px-1">"x"</kbd> " ticks the gate for a batch decision."
        </p>
    }
}

/// How often the open inbox asks the server for the waiting gates (browser only).
#[cfg(feature = "hydrate")]
const POLL_EVERY: std::time::Duration = std::time::Duration::from_secs(3);

/// The waiting gates, kept current while the page is open: the hydrated page asks the
/// inbox server function again every [`POLL_EVERY`] and updates the table in place. Rows are
/// keyed by step id, so a row that stays keeps its DOM node (and the focus, and with it the
/// j/k position); new gates are appended and announced politely, never focused.
#[component]
fn LiveGates(initial: Vec<GateRow>) -> impl IntoView {
    let rows = RwSignal::new(initial);
    // Effects run only in the browser: `data-live="on"` marks a page that is polling.
    let (live, set_live) = signal(false);
    Effect::new(move |_| set_live.set(true));
    #[cfg(feature = "hydrate")]
    poll_gates(rows);
    let count = move || rows.with(Vec::len);
    view! {
        <p
            role="status"
            aria-live="polite"
            data-testid="gate-count"
            data-live=move || if live.get() { "on" } else { "off" }
            class="text-sm text-slate-600"
        >
            {move || match count() {
                0 => String::new(),
                1 => "1 gated call waiting; this list updates by itself.".to_string(),
                n => format!("{n} gated calls waiting; this list updates by itself."),
            }}
        </p>
        <Show
            when=move || { count() > 0 }
            fallback=|| {
                view! {
                    <p class="rounded border border-dashed border-slate-300 bg-white p-6 text-slate-600">
                        "No gated calls are waiting for approval."
                    </p>
                }
            }
        >
            <GateTable rows/>
        </Show>
    }
}

/// Asks for the waiting gates every [`POLL_EVERY`] while the page is open; one request at a
/// time; a failed request leaves the list as it was.
#[cfg(feature = "hydrate")]
fn poll_gates(rows: RwSignal<Vec<GateRow>>) {
    use std::cell::Cell;
    use std::rc::Rc;
    let busy = Rc::new(Cell::new(false));
    let handle = set_interval_with_handle(
        move || {
            if busy.replace(true) {
                return;
            }
            let busy = Rc::clone(&busy);
            leptos::task::spawn_local(async move {
                if let Ok(InboxView::Gates(fresh)) = crate::inbox::refresh_gates().await
                    && rows.with_untracked(|now| *now != fresh)
                {
                    rows.set(fresh);
                }
                busy.set(false);
            });
        },
        POLL_EVERY,
    );
    if let Ok(handle) = handle {
        on_cleanup(move || handle.clear());
    }
}

/// The form the list's batch decision posts to.
const BATCH_PATH: &str = "/inbox/batch";

/// `minor` units of `currency` (exponent `exponent`) as `12,345.60 EUR`, exactly.
fn minor_text(minor: i64, exponent: u32, currency: &str) -> String {
    let unit = 10i64.saturating_pow(exponent);
    let (sign, abs) = if minor < 0 {
        ("-", minor.unsigned_abs())
    } else {
        ("", minor.unsigned_abs())
    };
    let unit = unit.unsigned_abs().max(1);
    let grouped = crate::inbox::group_thousands(&(abs / unit).to_string());
    let fraction = if exponent == 0 {
        String::new()
    } else {
        format!(".{:0width$}", abs % unit, width = exponent as usize)
    };
    format!("{sign}{grouped}{fraction} {currency}")
}

/// What the ticked gates add up to: `3 selected (invoice.hold) · total 4,000.00 EUR`.
fn selection_text(rows: &[GateRow], ticked: &std::collections::BTreeSet<String>) -> String {
    let chosen: Vec<&GateRow> = rows
        .iter()
        .filter(|r| ticked.contains(&r.step_id))
        .collect();
    if chosen.is_empty() {
        return "Tick gates of one tool (x ticks the focused row) to decide them together.".into();
    }
    let mut tools: Vec<&str> = chosen.iter().map(|r| r.tool.as_str()).collect();
    tools.sort_unstable();
    tools.dedup();
    let mut totals: std::collections::BTreeMap<(&str, u32), i64> =
        std::collections::BTreeMap::new();
    let mut without = 0;
    for r in &chosen {
        match (r.amount_minor, r.currency.as_deref()) {
            (Some(minor), Some(c)) => {
                let sum = totals.entry((c, r.exponent)).or_default();
                *sum = sum.saturating_add(minor);
            }
            _ => without += 1,
        }
    }
    let total = totals
        .iter()
        .map(|((c, exponent), minor)| minor_text(*minor, *exponent, c))
        .collect::<Vec<_>>()
        .join(" + ");
    let mut text = format!("{} selected ({})", chosen.len(), tools.join(", "));
    if !total.is_empty() {
        text.push_str(&format!(" · total {total}"));
    }
    if without > 0 && !total.is_empty() {
        text.push_str(&format!(" ({without} without an amount)"));
    }
    if tools.len() > 1 {
        text.push_str(" — a batch decides gates of one tool: untick the others");
    }
    text
}

#[component]
fn GateTable(rows: RwSignal<Vec<GateRow>>) -> impl IntoView {
    let ticked = RwSignal::new(std::collections::BTreeSet::<String>::new());
    let summary = move || rows.with(|all| ticked.with(|t| selection_text(all, t)));
    view! {
        <form method="post" action=BATCH_PATH id="batch" data-passkey="batch" autocomplete="off" class="space-y-3">
        <div class="overflow-x-auto">
        <table class="w-full border-collapse overflow-hidden rounded border border-slate-200 bg-white text-left text-sm">
            <caption class="sr-only">"Gated calls waiting for approval, oldest first"</caption>
            <thead class="bg-slate-100 text-slate-700">
                <tr>
                    <th scope="col" class="px-3 py-2"><span class="sr-only">"Select"</span></th>
                    <th scope="col" class="px-3 py-2">"Tool"</th>
                    <th scope="col" class="px-3 py-2 text-right">"Amount"</th>
                    <th scope="col" class="px-3 py-2">"Target"</th>
                    <th scope="col" class="px-3 py-2">"Expiry"</th>
                    <th scope="col" class="px-3 py-2">"Waiting since"</th>
                    <th scope="col" class="px-3 py-2">
                        <span class="sr-only">"Open"</span>
                    </th>
                </tr>
            </thead>
            <tbody>
                <For each=move || rows.get() key=|row| row.step_id.clone() let:row>
                    <GateLine row rows ticked/>
                </For>
            </tbody>
        </table>
        </div>
        <fieldset class="space-y-2 rounded border border-slate-200 bg-white p-3" data-testid="batch-panel">
            <legend class="px-1 text-sm font-medium">"Decide the ticked gates together"</legend>
            <p class="text-sm" role="status" aria-live="polite" data-testid="batch-summary">{summary}</p>
            // Filled by /assets/passkeys.js when the ticked tool requires a signature: one
            // assertion over the batch's ordered (step, inputs hash) pairs.
            {["nonce", "credential_id", "authenticator_data", "client_data_json", "signature", "batch_expires_at"]
                .map(|name| view! { <input type="hidden" name=name value=""/> })}
            <p data-passkey-status aria-live="polite" class="text-sm text-slate-700"></p>
            <div class="flex flex-wrap items-end gap-2">
                <div class="flex flex-col text-sm">
                    <label for="batch-reason">"Reason (recorded on each decision)"</label>
                    <textarea id="batch-reason" name="reason" rows="1" class="rounded border border-slate-500 bg-white px-2 py-1 text-sm focus:outline-none focus:ring-2 focus:ring-indigo-500" data-testid="batch-reason"></textarea>
                </div>
                <button type="submit" name="verdict" value="approved" data-testid="batch-approve" class="rounded bg-indigo-700 px-3 py-1.5 text-sm font-medium text-white hover:bg-indigo-800 focus:outline-none focus:ring-2 focus:ring-indigo-500 focus:ring-offset-2">
                    "Approve ticked"
                </button>
                <button type="submit" name="verdict" value="rejected" data-testid="batch-reject" class="rounded border border-slate-400 bg-white px-3 py-1.5 text-sm font-medium text-slate-900 hover:bg-slate-100 focus:outline-none focus:ring-2 focus:ring-indigo-500">
                    "Reject ticked"
                </button>
            </div>
        </fieldset>
        </form>
    }
}

/// What a row's Review link names besides "Review": the tool, its target and amount, so
/// that two gates of one tool are told apart.
fn review_name(row: &GateRow) -> String {
    let mut parts = vec![row.tool.clone()];
    parts.extend(row.target.clone());
    parts.extend(row.amount.clone());
    format!(" {}", parts.join(", "))
}

/// One row. Its link id (`gate-link-N`, N its position, which j/k walk) and its countdown
/// follow the list; everything else is fixed for a step.
#[component]
fn GateLine(
    row: GateRow,
    rows: RwSignal<Vec<GateRow>>,
    ticked: RwSignal<std::collections::BTreeSet<String>>,
) -> impl IntoView {
    let href = format!("/inbox/{}", row.step_id);
    let id = row.step_id.clone();
    let link_id = {
        let id = id.clone();
        move || {
            let at = rows.with(|all| all.iter().position(|r| r.step_id == id));
            format!("gate-link-{}", at.unwrap_or(usize::MAX))
        }
    };
    let expires = move || {
        rows.with(|all| {
            all.iter()
                .find(|r| r.step_id == id)
                .map(|r| r.expires.clone())
                .unwrap_or_default()
        })
    };
    let select_label = format!("Select{}", review_name(&row));
    let tick_id = row.step_id.clone();
    let on_tick = move |ev: leptos::ev::Event| {
        let on = event_target_checked(&ev);
        ticked.update(|set| {
            if on {
                set.insert(tick_id.clone());
            } else {
                set.remove(&tick_id);
            }
        });
    };
    view! {
        <tr
            data-testid="gate-row"
            data-step-id=row.step_id.clone()
            class="border-t border-slate-200 focus-within:bg-indigo-50"
        >
            <td class="px-3 py-2">
                <input
                    type="checkbox"
                    name="step"
                    value=row.step_id.clone()
                    aria-label=select_label
                    data-testid="gate-select"
                    on:change=on_tick
                    class="h-4 w-4 focus:outline-none focus:ring-2 focus:ring-indigo-500"
                />
            </td>
            <td class="px-3 py-2 font-mono">{row.tool.clone()}</td>
            <td data-testid="gate-amount" class="px-3 py-2 text-right tabular-nums">
                {row.amount.clone().unwrap_or_else(|| "—".into())}
            </td>
            <td class="px-3 py-2">{row.target.clone().unwrap_or_else(|| "—".into())}</td>
            <td class="px-3 py-2">{expires}</td>
            <td class="px-3 py-2 text-slate-600">{row.waiting_since.clone()}</td>
            <td class="px-3 py-2">
                <a
                    href=href
                    id=link_id
                    class="rounded px-2 py-1 font-medium text-indigo-700 underline hover:bg-indigo-50 focus:outline-none focus:ring-2 focus:ring-indigo-500"
                >
                    "Review"
                    <span class="sr-only">{review_name(&row)}</span>
                </a>
            </td>
        </tr>
    }
}

/// One gated call (`/inbox/{step_id}`): what exactly will run, why, and the decision form.
#[component]
pub fn GatePage() -> impl IntoView {
    #[cfg(feature = "hydrate")]
    inbox_keys();
    let params = use_params_map();
    let step_id = move || params.read().get("id").unwrap_or_default();
    let gate = Resource::new(step_id, load_gate);
    let query = use_page_query();
    let message = move || {
        if let Some((code, text)) = query
            .get("error")
            .and_then(|c| error_text(&c).map(|t| (c, t)))
        {
            // A step-up sign-in: the identity provider must authenticate the person now.
            let again = (code == "step_up").then(|| {
                let href = format!("/auth/login?fresh=1&next=/inbox/{}", step_id());
                view! {
                    <p>
                        <a href=href class="text-sm text-indigo-700 underline" data-testid="step-up-sign-in">
                            "Sign in again"
                        </a>
                    </p>
                }
            });
            Some(view! { <Problem text/> {again} }.into_any())
        } else {
            query
                .get("done")
                .and_then(|c| notice_text(&c))
                .map(|text| view! { <Notice text/> }.into_any())
        }
    };
    view! {
        <section class="space-y-6">
            <p>
                <a href="/inbox" class="text-sm text-indigo-700 underline">"← Back to the inbox"</a>
            </p>
            {message}
            <Suspense fallback=|| view! { <p class="text-slate-600">"Loading the gate…"</p> }>
                {move || Suspend::new(async move {
                    match gate.await {
                        Ok(DetailView::NotApprover) => view! { <NotApprover/> }.into_any(),
                        Ok(DetailView::NotFound) => {
                            view! {
                                <p class="rounded border border-slate-300 bg-white p-6 text-slate-700">
                                    "There is no gate waiting for you at this address. It may have been decided or expired."
                                </p>
                            }
                                .into_any()
                        }
                        Ok(DetailView::Gate(detail)) => view! { <GateView detail=*detail/> }.into_any(),
                        Err(e) => view! { <LoadError error=e.to_string()/> }.into_any(),
                    }
                })}
            </Suspense>
        </section>
    }
}

#[component]
fn Field(label: &'static str, children: Children) -> impl IntoView {
    view! {
        <div class="grid grid-cols-3 gap-2 border-t border-slate-200 py-2">
            <dt class="font-medium text-slate-700">{label}</dt>
            <dd class="col-span-2">{children()}</dd>
        </div>
    }
}

#[component]
fn GateView(detail: GateDetail) -> impl IntoView {
    let action = format!("/inbox/{}/decision", detail.row.step_id);
    let waiting = detail.status == "needs_approval";
    let signing = detail.signature.clone();
    let passkey = signing.as_ref().map(|_| "approve");
    let step_attr = detail.row.step_id.clone();
    let row = detail.row;
    let evidence = if detail.evidence.is_empty() {
        view! { <span class="text-slate-600">"none cited"</span> }.into_any()
    } else {
        view! {
            <ul class="list-inside list-disc font-mono">
                {detail.evidence.into_iter().map(|id| view! { <li>{id}</li> }).collect_view()}
            </ul>
        }
        .into_any()
    };
    let reversibility = match &detail.compensate {
        Some(tool) => format!("{} — undone by {tool}", detail.effect),
        None => format!("{} — no compensating tool", detail.effect),
    };
    let mut conditions = vec![format!(
        "{} of {} approval(s) given",
        detail.approvals_given, detail.approvals_needed
    )];
    if detail.four_eyes {
        conditions.push("four eyes: not the creator of the agent's credential".into());
    }
    if let Some(minutes) = detail.step_up_minutes {
        conditions.push(format!("needs a sign-in within the last {minutes} minutes"));
    }
    if detail.signature.is_some() {
        conditions.push("each approval is a passkey signature".into());
    }
    view! {
        <article class="space-y-6" data-testid="gate-detail">
            <header class="space-y-1">
                <h1 class="text-2xl font-semibold">
                    <span class="font-mono">{row.tool.clone()}</span>
                    {row.amount.clone().map(|a| view! { <span data-testid="gate-amount">{format!(" · {a}")}</span> })}
                </h1>
                <p class="text-slate-700">
                    {row.target.clone().unwrap_or_default()} " · " {row.expires.clone()} " · waiting since "
                    {row.waiting_since.clone()}
                </p>
            </header>
            <dl class="rounded border border-slate-200 bg-white px-4 py-2 text-sm">
                <Field label="Model's reason">
                    <p data-testid="gate-reason">{detail.reason.clone()}</p>
                </Field>
                <Field label="Evidence">{evidence}</Field>
                <Field label="Policy rule">
                    <code>{detail.rule.clone().unwrap_or_else(|| "—".into())}</code>
                </Field>
                <Field label="Reversibility">{reversibility}</Field>
                <Field label="Conditions">{conditions.join("; ")}</Field>
                <Field label="Run">
                    <code>{detail.run_id.clone()}</code>
                </Field>
                <Field label="Status">{detail.status.clone()}</Field>
            </dl>
            <section class="space-y-2">
                <h2 class="text-lg font-semibold">"Inputs exactly as they will be sent"</h2>
                <pre
                    data-testid="gate-inputs"
                    class="overflow-x-auto rounded border border-slate-200 bg-slate-900 p-4 text-sm text-slate-100"
                >
                    {detail.inputs.clone()}
                </pre>
                <p class="text-xs text-slate-600">
                    "Canonical JSON (RFC 8785); your approval binds " <code>{detail.inputs_hash.clone()}</code>
                </p>
            </section>
            {waiting
                .then(|| {
                    view! {
            <form
                method="post"
                action=action
                data-passkey=passkey
                data-step=step_attr.clone()
                class="space-y-3 rounded border border-slate-200 bg-white p-4"
            >
                <h2 class="text-lg font-semibold">"Decide"</h2>
                <label for="reason" class="block text-sm font-medium text-slate-800">
                    "Reason (required, recorded in the audit trail)"
                </label>
                <textarea
                    id="reason"
                    name="reason"
                    required
                    rows="3"
                    class="w-full rounded border border-slate-500 p-2 focus:outline-none focus:ring-2 focus:ring-indigo-500"
                ></textarea>
                {signing.clone().map(|needs| view! { <crate::passkeys::SignatureFields needs/> })}
                <div class="flex gap-3">
                    <button
                        type="submit"
                        id="approve"
                        name="verdict"
                        value="approved"
                        data-testid="approve"
                        class="rounded bg-emerald-700 px-4 py-2 text-sm font-medium text-white hover:bg-emerald-800 focus:outline-none focus:ring-2 focus:ring-emerald-500 focus:ring-offset-2"
                    >
                        "Approve"
                    </button>
                    <button
                        type="submit"
                        id="reject"
                        name="verdict"
                        value="rejected"
                        data-testid="reject"
                        class="rounded bg-red-700 px-4 py-2 text-sm font-medium text-white hover:bg-red-800 focus:outline-none focus:ring-2 focus:ring-red-500 focus:ring-offset-2"
                    >
                        "Reject"
                    </button>
                </div>
            </form>
                    }
                })}
            <section class="space-y-2">
                <h2 class="text-lg font-semibold">"History"</h2>
                <table class="w-full border-collapse rounded border border-slate-200 bg-white text-left text-sm">
                    <thead class="bg-slate-100">
                        <tr>
                            <th scope="col" class="px-3 py-2">"Event"</th>
                            <th scope="col" class="px-3 py-2">"Time"</th>
                            <th scope="col" class="px-3 py-2">"Actor"</th>
                        </tr>
                    </thead>
                    <tbody>
                        {detail
                            .history
                            .into_iter()
                            .map(|h| {
                                view! {
                                    <tr data-testid="history-row" class="border-t border-slate-200">
                                        <td class="px-3 py-2">{h.event}</td>
                                        <td class="px-3 py-2">{h.at}</td>
                                        <td class="px-3 py-2" title=h.actor_id>{h.actor}</td>
                                    </tr>
                                }
                            })
                            .collect_view()}
                    </tbody>
                </table>
            </section>
        </article>
    }
}

/// Any path the router does not know.
#[component]
pub fn NotFound() -> impl IntoView {
    #[cfg(feature = "ssr")]
    {
        if let Some(resp) = use_context::<leptos_axum::ResponseOptions>() {
            resp.set_status(http::StatusCode::NOT_FOUND);
        }
    }
    view! { <EmptyPage title="Not found" empty="There is no page at this address."/> }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(id: &str, tool: &str, minor: Option<i64>, currency: &str, exponent: u32) -> GateRow {
        GateRow {
            step_id: id.into(),
            tool: tool.into(),
            amount: None,
            amount_minor: minor,
            currency: Some(currency.into()),
            exponent,
            target: None,
            expires: String::new(),
            waiting_since: String::new(),
        }
    }

    #[test]
    fn totals_are_exact_in_minor_units_per_currency() {
        assert_eq!(minor_text(123_456_789, 2, "EUR"), "1,234,567.89 EUR");
        assert_eq!(minor_text(5, 2, "EUR"), "0.05 EUR");
        assert_eq!(minor_text(1_500, 0, "JPY"), "1,500 JPY");
        assert_eq!(minor_text(1_234, 3, "KWD"), "1.234 KWD");
        let rows = [
            gate("a", "payment.schedule", Some(120_000), "EUR", 2),
            gate("b", "payment.schedule", Some(130_050), "EUR", 2),
            gate("c", "payment.schedule", None, "EUR", 2),
            gate("d", "invoice.hold", Some(1), "EUR", 2),
        ];
        let ticked = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            selection_text(&rows, &ticked(&["a", "b", "c"])),
            "3 selected (payment.schedule) · total 2,500.50 EUR (1 without an amount)"
        );
        assert!(selection_text(&rows, &ticked(&["a", "d"])).contains("one tool"));
        assert!(selection_text(&rows, &ticked(&[])).starts_with("Tick gates"));
    }
}
