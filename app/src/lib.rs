//! Countersign's dashboard: the Leptos components shared by server rendering and the
//! hydrated browser bundle.
//!
//! With the `ssr` feature the server renders every page and server functions call
//! `countersign-core`; with `hydrate` the same components compile to wasm and take over
//! the server-rendered HTML. Nothing in the `hydrate` build pulls sqlx, cedar or rmcp.

pub mod access;
pub mod admin;
pub mod audit;
pub mod escalations;
pub mod inbox;
pub mod metrics;
pub mod pages;
pub mod passkeys;
pub mod query;
pub mod runs;

pub use access::{BACKGROUND_PREFIX, DEMO_BANNER, DemoSignIn, Refused, RefusedNote};
#[cfg(feature = "ssr")]
pub use access::{person_with, signed_in};
use leptos::prelude::*;
use leptos_meta::{MetaTags, Stylesheet, Title, provide_meta_context};
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::{SsrMode, path};

#[cfg(feature = "ssr")]
fn demo_sign_in() -> bool {
    use_context::<http::request::Parts>()
        .is_some_and(|parts| parts.extensions.get::<DemoSignIn>().is_some())
}

#[cfg(not(feature = "ssr"))]
fn demo_sign_in() -> bool {
    false
}

/// The Content-Security-Policy of a page whose inline scripts carry `nonce`: inline scripts
/// run only with this response's nonce, script files only from this origin (the hydration
/// bundle under `/pkg/`), the wasm bundle may compile; no plugins, no `<base>` rewriting, no
/// framing. Styles are not restricted.
///
/// Invariant: an injected inline `<script>` or `on*=` attribute never runs, and an injected
/// `<script src>` runs only a file this server serves as JavaScript (`nosniff` keeps JSON
/// and text from running as script). Each response has its own random nonce (Leptos makes one
/// per request), so a nonce read from one page is useless on the next.
pub fn page_policy(nonce: &str) -> String {
    format!(
        "script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval'; object-src 'none'; \
         base-uri 'none'; frame-ancestors 'none'"
    )
}

/// Puts [`page_policy`] with this request's nonce on the response. Without a nonce (never
/// expected on the server) nothing is set here and the server's default policy — no
/// scripts at all — applies: the page stays readable but does not hydrate (fails closed).
#[cfg(feature = "ssr")]
fn set_page_policy() {
    let nonce = leptos::nonce::use_nonce();
    let resp = use_context::<leptos_axum::ResponseOptions>();
    if let (Some(nonce), Some(resp)) = (nonce, resp)
        && let Ok(value) = http::HeaderValue::from_str(&page_policy(&nonce))
    {
        resp.insert_header(http::header::CONTENT_SECURITY_POLICY, value);
    }
}

/// The HTML document around [`App`], rendered by the server.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    #[cfg(feature = "ssr")]
    set_page_policy();
    // After <App/>: hydration walks the body from its first child through App's nodes only.
    let demo = demo_sign_in();
    let banner = demo.then(|| {
        view! {
            <p
                role="note"
                data-testid="demo-banner"
                class="fixed inset-x-0 bottom-0 bg-amber-300 px-4 py-2 text-center text-sm font-semibold text-slate-900"
            >
                {DEMO_BANNER}
            </p>
        }
    });
    // The demo banner is fixed to the bottom: room for it, so it never covers content.
    let body_class = if demo {
        "min-h-screen bg-slate-50 pb-16 text-slate-900 antialiased"
    } else {
        "min-h-screen bg-slate-50 text-slate-900 antialiased"
    };
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <link rel="icon" type="image/svg+xml" href="/favicon.svg"/>
                <AutoReload options=options.clone()/>
                <HydrationScripts options/>
                <MetaTags/>
                // Runs the WebAuthn ceremonies of `data-passkey` forms (same origin, so the
                // page policy's 'self' allows it).
                <script src="/assets/passkeys.js" defer nonce=leptos::nonce::use_nonce()></script>
            </head>
            <body class=body_class>
                <App/>
                {banner}
            </body>
        </html>
    }
}

/// The dashboard: header, navigation and one page per area.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    view! {
        <Stylesheet id="leptos" href="/pkg/countersign.css"/>
        <Title text="Countersign"/>
        <Router>
            // First in the focus order: keyboard users skip the navigation.
            <a
                href="#main"
                class="sr-only focus:not-sr-only focus:absolute focus:left-2 focus:top-2 focus:z-50 focus:rounded focus:bg-white focus:px-3 focus:py-2 focus:text-indigo-800 focus:ring-2 focus:ring-indigo-500"
            >
                "Skip to the page content"
            </a>
            <Header/>
            <main id="main" tabindex="-1" class="mx-auto max-w-6xl px-4 py-8 focus:outline-none">
                <Routes fallback=|| view! { <pages::NotFound/> }>
                    <Route path=path!("/") view=pages::Home/>
                    <Route path=path!("/inbox") view=pages::Inbox ssr=SsrMode::Async/>
                    <Route path=path!("/inbox/:id") view=pages::GatePage ssr=SsrMode::Async/>
                    <Route path=path!("/escalations") view=escalations::EscalationsPage ssr=SsrMode::Async/>
                    <Route path=path!("/runs") view=runs::RunsPage ssr=SsrMode::Async/>
                    <Route path=path!("/runs/:id") view=runs::RunPage ssr=SsrMode::Async/>
                    <Route path=path!("/audit") view=audit::AuditPage ssr=SsrMode::Async/>
                    <Route path=path!("/gates") view=metrics::MetricsPage ssr=SsrMode::Async/>
                    <Route path=path!("/admin") view=admin::AdminPage ssr=SsrMode::Async/>
                    <Route path=path!("/passkeys") view=passkeys::PasskeysPage ssr=SsrMode::Async/>
                </Routes>
            </main>
        </Router>
    }
}

/// The navigation entries, in order: (path, label).
pub const NAV: [(&str, &str); 7] = [
    ("/inbox", "Inbox"),
    ("/escalations", "Escalations"),
    ("/runs", "Runs"),
    ("/audit", "Audit"),
    ("/gates", "Metrics"),
    ("/admin", "Admin"),
    ("/passkeys", "Passkeys"),
];

#[component]
fn Header() -> impl IntoView {
    view! {
        <header class="border-b border-slate-200 bg-white">
            <div class="mx-auto flex max-w-6xl flex-wrap items-center gap-x-8 gap-y-2 px-4 py-3">
                <A href="/" attr:class="text-lg font-semibold tracking-tight text-indigo-700">
                    "Countersign"
                </A>
                <nav aria-label="Main">
                    <ul class="flex flex-wrap gap-1">
                        {NAV
                            .iter()
                            .map(|(href, label)| {
                                view! {
                                    <li>
                                        <A
                                            href=*href
                                            attr:class="rounded px-3 py-2 text-sm font-medium text-slate-700 hover:bg-slate-100 aria-[current=page]:bg-indigo-50 aria-[current=page]:text-indigo-800"
                                        >
                                            {*label}
                                        </A>
                                    </li>
                                }
                            })
                            .collect_view()}
                    </ul>
                </nav>
            </div>
        </header>
    }
}

/// The wasm entry point: hydrates the server-rendered body.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(App);
}
