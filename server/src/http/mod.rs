//! The HTTP surface: the dashboard (Leptos SSR), static assets, `/mcp` and operational
//! endpoints.

mod admin;
mod approvals;
mod escalations;
mod headers;
mod health;
mod inbox;
mod metrics;
mod names;
mod passkeys;
mod render;
mod signature;
pub mod views;

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::get;
use countersign_app::{App, shell};
use leptos_axum::{AxumRouteListing, LeptosRoutes, generate_route_list};
use tower_http::trace::TraceLayer;

use crate::{AppState, auth};

/// The dashboard's routes, generated once per process.
///
/// `generate_route_list` renders the app with resource loading switched off through a
/// process-global flag (leptos_server's `SuppressResourceLoad`): a resource first polled by
/// any page render while another thread generates the list waits forever (leptos issue
/// #4773). Generating the list once, before the first router exists, means no page can be
/// rendering while it runs, however many routers a process builds (the integration tests
/// build one per test, in parallel).
fn routes() -> Vec<AxumRouteListing> {
    static ROUTES: std::sync::OnceLock<Vec<AxumRouteListing>> = std::sync::OnceLock::new();
    ROUTES.get_or_init(|| generate_route_list(App)).clone()
}

/// Builds the router over `state`.
pub fn router(state: AppState) -> Router {
    let routes = routes();
    let options = state.leptos.clone();
    let sessions = state.auth.session_layer();
    let https = state.config.public_url.scheme() == "https";
    let inbox = inbox::context(&state);
    let escalations = escalations::context(&state);
    let admin = admin::context(&state);
    let passkeys = passkeys::context(&state);
    let (runs, audit, metrics) = views::contexts(&state);
    // The pages and their server functions, each request kept on its own reactive owner
    // (`render`); the other routes never touch Leptos and do without that wrapper.
    let pages = Router::new()
        .leptos_routes_with_context(
            &state,
            routes,
            move || {
                render::remember_owner();
                leptos::prelude::provide_context(inbox.clone());
                leptos::prelude::provide_context(escalations.clone());
                leptos::prelude::provide_context(admin.clone());
                leptos::prelude::provide_context(passkeys.clone());
                leptos::prelude::provide_context(runs.clone());
                leptos::prelude::provide_context(audit.clone());
                leptos::prelude::provide_context(metrics.clone());
            },
            move || shell(options.clone()),
        )
        .layer(axum::middleware::from_fn(render::pin_owner));
    // Layers run outside-in: trace, security headers, session, CSRF origin check, session
    // gate.
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/metrics", get(metrics::metrics))
        .route("/api/gates", get(approvals::pending))
        .route("/api/gates/batch", axum::routing::post(approvals::batch))
        .route(
            "/api/steps/{id}/decision",
            axum::routing::post(approvals::decide),
        )
        .route(
            "/inbox/{id}/decision",
            axum::routing::post(inbox::decide_form),
        )
        .route("/inbox/batch", axum::routing::post(inbox::batch_form))
        .route(
            "/inbox/batch/challenge",
            axum::routing::post(inbox::batch_challenge),
        )
        .route(
            "/escalations/{id}",
            axum::routing::post(escalations::act_form),
        )
        .route("/admin/proposals", axum::routing::post(admin::propose))
        .route(
            "/admin/tools/settings",
            axum::routing::post(admin::propose_settings),
        )
        .route(
            "/admin/proposals/{id}/decision",
            axum::routing::post(admin::decide),
        )
        .route(
            "/admin/agents/{id}/binding",
            axum::routing::post(admin::bind_agent),
        )
        .route("/admin/agents", axum::routing::post(admin::create_agent))
        .route(
            "/admin/agents/{id}/revoke",
            axum::routing::post(admin::revoke_agent),
        )
        .route("/admin/stop", axum::routing::post(admin::stop))
        .route(
            "/admin/sessions/end",
            axum::routing::post(admin::end_sessions),
        )
        .route("/admin/stop/lift", axum::routing::post(admin::lift))
        .route(
            "/api/steps/{id}/challenge",
            axum::routing::post(passkeys::challenge),
        )
        .route(
            "/api/gates/batch/challenge",
            axum::routing::post(passkeys::batch_challenge),
        )
        .route(
            "/api/passkeys/options",
            axum::routing::post(passkeys::options),
        )
        .route("/api/passkeys", axum::routing::post(passkeys::register))
        .route(
            "/passkeys/register",
            axum::routing::post(passkeys::register_form),
        )
        .route(
            "/passkeys/{id}/remove",
            axum::routing::post(passkeys::remove_form),
        )
        .route(
            "/admin/passkeys/{id}/revoke",
            axum::routing::post(passkeys::revoke_form),
        )
        .route("/assets/passkeys.js", get(passkeys::script))
        .route("/audit/export.jsonl", get(views::export))
        .route("/gates/draft", axum::routing::post(views::draft))
        .route("/admin/shadow/promote", axum::routing::post(views::promote))
        .merge(crate::mcp::routes(state.clone()))
        .merge(auth::routes())
        .merge(pages)
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(shell))
        .layer(from_fn_with_state(state.clone(), auth::gate))
        .layer(from_fn_with_state(state.clone(), auth::csrf))
        .layer(sessions)
        .layer(from_fn_with_state(https, headers::security_headers))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
