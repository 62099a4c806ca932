//! Countersign's dashboard: the Leptos components shared by server rendering and the
//! hydrated browser bundle.
//!
//! With the `ssr` feature the server renders every page and server functions call
//! `countersign-core`; with `hydrate` the same components compile to wasm and take over
//! the server-rendered HTML. Nothing in the `hydrate` build pulls sqlx, cedar or rmcp.

pub mod admin;
pub mod inbox;
pub mod pages;

use leptos::prelude::*;
use leptos_meta::{MetaTags, Stylesheet, Title, provide_meta_context};
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::{SsrMode, path};

/// Request marker the server sets while the demo sign-in is on; the shell then shows
/// [`DEMO_BANNER`] on every page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DemoSignIn;

/// The banner shown on every page while the demo sign-in is on.
pub const DEMO_BANNER: &str = "Demo sign-in: not for production";

/// The signed-in person of the current request (server rendering and server functions),
/// as the server's session gate put it on the request. `None` when signed out: callers
/// must then show and do nothing.
#[cfg(feature = "ssr")]
pub fn signed_in() -> Option<countersign_core::Person> {
    use_context::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<countersign_core::Person>().cloned())
}

#[cfg(feature = "ssr")]
fn demo_sign_in() -> bool {
    use_context::<http::request::Parts>()
        .is_some_and(|parts| parts.extensions.get::<DemoSignIn>().is_some())
}

#[cfg(not(feature = "ssr"))]
fn demo_sign_in() -> bool {
    false
}

/// The HTML document around [`App`], rendered by the server.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    // After <App/>: hydration walks the body from its first child through App's nodes only.
    let banner = demo_sign_in().then(|| {
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
            </head>
            <body class="min-h-screen bg-slate-50 text-slate-900 antialiased">
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
            <Header/>
            <main id="main" class="mx-auto max-w-6xl px-4 py-8">
                <Routes fallback=|| view! { <pages::NotFound/> }>
                    <Route path=path!("/") view=pages::Home/>
                    <Route path=path!("/inbox") view=pages::Inbox ssr=SsrMode::Async/>
                    <Route path=path!("/inbox/:id") view=pages::GatePage ssr=SsrMode::Async/>
                    <Route path=path!("/runs") view=pages::Runs/>
                    <Route path=path!("/audit") view=pages::Audit/>
                    <Route path=path!("/gates") view=pages::Metrics/>
                    <Route path=path!("/admin") view=admin::AdminPage ssr=SsrMode::Async/>
                </Routes>
            </main>
        </Router>
    }
}

/// The navigation entries, in order: (path, label).
pub const NAV: [(&str, &str); 5] = [
    ("/inbox", "Inbox"),
    ("/runs", "Runs"),
    ("/audit", "Audit"),
    ("/gates", "Metrics"),
    ("/admin", "Admin"),
];

#[component]
fn Header() -> impl IntoView {
    view! {
        <header class="border-b border-slate-200 bg-white">
            <div class="mx-auto flex max-w-6xl items-center gap-8 px-4 py-3">
                <A href="/" attr:class="text-lg font-semibold tracking-tight text-indigo-700">
                    "Countersign"
                </A>
                <nav aria-label="Main">
                    <ul class="flex gap-1">
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
