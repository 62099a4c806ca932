//! Who may see what on a page: the signed-in person as the server's session gate put them on
//! the request, a page's role check (a refusal renders a note and answers 403), and the markers
//! the server and the pages share (the demo sign-in, background requests).

use leptos::prelude::*;

/// Request marker the server sets while the demo sign-in is on; the shell then shows
/// [`DEMO_BANNER`] on every page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DemoSignIn;

/// The banner shown on every page while the demo sign-in is on.
pub const DEMO_BANNER: &str = "Demo sign-in: not for production";

/// Where the pages' background requests go (the inbox's refresh): the server lets them read
/// with the session but never counts them as the person's activity (the idle timeout runs on).
pub const BACKGROUND_PREFIX: &str = "/api/background/";

/// The signed-in person of the current request (server rendering and server functions),
/// as the server's session gate put it on the request. `None` when signed out: callers
/// must then show and do nothing.
#[cfg(feature = "ssr")]
pub fn signed_in() -> Option<countersign_core::Person> {
    use_context::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<countersign_core::Person>().cloned())
}

/// Why a page shows no data to the signed-in person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Refused {
    /// The person holds none of the page's roles.
    Role,
    /// The person's account names no tenant, so no tenant's work can be shown.
    Tenant,
}

/// The signed-in person if they hold one of `roles` and have a tenant; otherwise why not
/// (and the response becomes 403). Signed out is an error: the server's session gate
/// redirects pages to sign-in before they render, so this only meets direct calls.
#[cfg(feature = "ssr")]
pub fn person_with(
    roles: &[countersign_core::AppRole],
) -> Result<Result<(countersign_core::Person, String), Refused>, leptos::prelude::ServerFnError> {
    let Some(person) = signed_in() else {
        return Err(leptos::prelude::ServerFnError::new("sign in first"));
    };
    let refused = if !roles.iter().any(|r| person.has_role(*r)) {
        Some(Refused::Role)
    } else if person.tenant.as_deref().is_none_or(str::is_empty) {
        Some(Refused::Tenant)
    } else {
        None
    };
    if let Some(why) = refused {
        // A page rendered on the server answers 403; a server-function call from the
        // hydrated page answers 200 with the refusal, so the client can show it.
        let page_render = use_context::<http::request::Parts>()
            .is_some_and(|parts| !parts.uri.path().starts_with("/api/"));
        if page_render && let Some(resp) = use_context::<leptos_axum::ResponseOptions>() {
            resp.set_status(http::StatusCode::FORBIDDEN);
        }
        return Ok(Err(why));
    }
    let tenant = person.tenant.clone().unwrap_or_default();
    Ok(Ok((person, tenant)))
}

/// The note shown instead of a page's data when [`Refused`].
#[component]
pub fn RefusedNote(why: Refused, page: &'static str, roles: &'static str) -> impl IntoView {
    let text = match why {
        Refused::Role => format!(
            "{page} is for {roles}. Your account holds none of these roles, so nothing is shown."
        ),
        Refused::Tenant => format!(
            "Your account names no tenant, so {page} has nothing it may show you. Ask an \
             administrator to map your account to a tenant."
        ),
    };
    view! {
        <p
            data-testid="refused"
            role="alert"
            class="rounded border border-slate-300 bg-white p-6 text-slate-800"
        >
            {text}
        </p>
    }
}
