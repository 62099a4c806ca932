//! One component per dashboard page. Pages that have no data yet say so plainly.

use leptos::prelude::*;

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

/// Gated calls waiting for a person.
#[component]
pub fn Inbox() -> impl IntoView {
    view! { <EmptyPage title="Approval inbox" empty="No gated calls are waiting for approval."/> }
}

/// Runs and their steps.
#[component]
pub fn Runs() -> impl IntoView {
    view! { <EmptyPage title="Runs" empty="No runs yet. Runs appear here when an agent calls a tool."/> }
}

/// The audit trail.
#[component]
pub fn Audit() -> impl IntoView {
    view! { <EmptyPage title="Audit" empty="The audit trail is empty."/> }
}

/// Gate metrics.
#[component]
pub fn Metrics() -> impl IntoView {
    view! { <EmptyPage title="Metrics" empty="No gate decisions recorded yet."/> }
}

/// Role × tool administration.
#[component]
pub fn Admin() -> impl IntoView {
    view! { <EmptyPage title="Admin" empty="No registry changes proposed."/> }
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
