//! The demo sign-in: asked for (`demo_sign_in`), loopback only, no issuer configured, never
//! through a proxy. Pick a seeded person.
//!
//! Invariant: a request that carries `Forwarded`, `Via`, `X-Real-IP` or any `X-Forwarded-*`
//! header came through a proxy, whatever address it arrived from, and is refused (403): a
//! reverse proxy that forwards to 127.0.0.1 must not turn the demo people into anyone's
//! accounts. (A proxy that adds none of them is not seen: the loopback public URL and the
//! opt-in are the other two locks.)

use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use countersign_core::{AppRole, Person};
use serde::Deserialize;
use tower_sessions::Session;

use super::pages::{escape, page};
use super::pending::local_next;
use super::session::Mode;
use crate::AppState;

/// The issuer recorded for demo people.
pub const DEMO_ISSUER: &str = "urn:countersign:demo";

/// The seeded demo people: (sub, name, roles, tenant). Ada administers tenant acme; Bob also
/// holds the platform role (the global stop, approving registry changes); Gus administers
/// another tenant, globex.
pub const DEMO_USERS: [(&str, &str, &[AppRole], &str); 7] = [
    ("ana", "Ana (AP clerk)", &[AppRole::Approver], "acme"),
    ("pat", "Pat (AP clerk)", &[AppRole::Approver], "acme"),
    ("max", "Max (manager)", &[AppRole::Manager], "acme"),
    ("ada", "Ada (admin)", &[AppRole::Admin], "acme"),
    (
        "bob",
        "Bob (platform admin)",
        &[AppRole::Admin, AppRole::PlatformAdmin],
        "acme",
    ),
    ("aud", "Aud (auditor)", &[AppRole::Auditor], "acme"),
    ("gus", "Gus (admin, globex)", &[AppRole::Admin], "globex"),
];

/// The display name of demo person `sub` when `iss` is the demo issuer.
pub fn demo_name(iss: &str, sub: &str) -> Option<&'static str> {
    (iss == DEMO_ISSUER)
        .then(|| {
            DEMO_USERS
                .iter()
                .find(|(s, ..)| *s == sub)
                .map(|(_, name, ..)| *name)
        })
        .flatten()
}

/// The page shown when nobody can sign in.
pub fn off_page() -> Response {
    page(
        StatusCode::FORBIDDEN,
        "Sign-in is not configured",
        "No OpenID Connect issuer is configured (COUNTERSIGN_OIDC_ISSUER, \
         COUNTERSIGN_OIDC_CLIENT_ID, COUNTERSIGN_OIDC_CLIENT_SECRET). The demo sign-in is off \
         unless asked for (COUNTERSIGN_DEMO_SIGN_IN=true, as `make run` does), and even then \
         only available when the server listens on a loopback address and its public URL is on a \
         loopback host (not behind a reverse proxy).",
        false,
    )
}

/// Whether a proxy says it forwarded this request (`Forwarded`, `X-Forwarded-*`, `Via`,
/// `X-Real-IP`). A heuristic only: a proxy that adds none of them is not seen, which is why
/// the demo sign-in also needs a loopback public URL and an explicit opt-in.
fn forwarded(headers: &HeaderMap) -> bool {
    headers.keys().any(|name| {
        let name = name.as_str();
        matches!(name, "forwarded" | "via" | "x-real-ip") || name.starts_with("x-forwarded-")
    })
}

fn refuse(mode: &Mode, headers: &HeaderMap) -> Option<Response> {
    match mode {
        Mode::Demo if forwarded(headers) => Some(page(
            StatusCode::FORBIDDEN,
            "Demo sign-in refused",
            "This request came through a proxy. The demo sign-in is only for a browser on the \
             same machine as the server.",
            false,
        )),
        Mode::Demo => None,
        Mode::Off => Some(off_page()),
        Mode::Oidc(_) => Some(page(
            StatusCode::NOT_FOUND,
            "Demo sign-in is off",
            "This server signs in through its OpenID Connect provider. \
             <a href=\"/auth/login\">Sign in</a>.",
            false,
        )),
    }
}

#[derive(Deserialize)]
pub(super) struct ListQuery {
    next: Option<String>,
}

pub(super) async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    if let Some(resp) = refuse(&state.auth.mode, &headers) {
        return resp;
    }
    let next = escape(&local_next(q.next.as_deref()));
    let buttons: String = DEMO_USERS
        .iter()
        .map(|(sub, name, roles, tenant)| {
            let roles: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
            format!(
                "<li><form method=\"post\" action=\"/auth/demo\">\
                 <input type=\"hidden\" name=\"user\" value=\"{sub}\">\
                 <input type=\"hidden\" name=\"next\" value=\"{next}\">\
                 <button type=\"submit\" class=\"rounded border border-slate-300 bg-white px-4 py-2\">\
                 Sign in as {name}</button> <span>{roles}, tenant {tenant}</span></form></li>",
                name = escape(name),
                roles = roles.join(" + "),
            )
        })
        .collect();
    page(
        StatusCode::OK,
        "Demo sign-in",
        &format!(
            "<p>No identity provider is configured, so this loopback-only server offers seeded \
             demo people. Pick one.</p><ul class=\"space-y-2\">{buttons}</ul>"
        ),
        true,
    )
}

#[derive(Deserialize)]
pub(super) struct SignInForm {
    user: String,
    next: Option<String>,
}

pub(super) async fn sign_in(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Form(form): Form<SignInForm>,
) -> Response {
    if let Some(resp) = refuse(&state.auth.mode, &headers) {
        return resp;
    }
    let Some((sub, name, roles, tenant)) = DEMO_USERS.iter().find(|u| u.0 == form.user) else {
        return page(
            StatusCode::BAD_REQUEST,
            "Unknown demo user",
            "Pick one of the listed people. <a href=\"/auth/demo\">Back</a>.",
            true,
        );
    };
    let person = Person {
        iss: DEMO_ISSUER.into(),
        sub: (*sub).into(),
        name: (*name).into(),
        email: Some(format!("{sub}@demo.invalid")),
        roles: roles.to_vec(),
        tenant: Some((*tenant).into()),
        auth_time: state.store.clock().now_ms(),
        auth_time_unknown: false,
    };
    if let Err(resp) = state.auth.sign_in(&session, &person, None).await {
        return resp;
    }
    Redirect::to(&local_next(form.next.as_deref())).into_response()
}
