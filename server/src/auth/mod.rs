//! Dashboard sign-in, sessions and the request guards in front of the dashboard.
//!
//! Invariants (each fails closed):
//! * A person is signed in only through a verified OIDC ID token ([`oidc`]) or, when no issuer
//!   is configured AND the server listens on a loopback address, the demo sign-in. On any
//!   other bind without an issuer nobody can sign in.
//! * Sign-in state (`state`, `nonce`, PKCE verifier) is bound to the browser by a short-lived
//!   cookie ([`pending`]) and used once: the callback clears it whatever happens. Starting a
//!   sign-in writes nothing to the database.
//! * A successful sign-in replaces the session id (no fixation). Sessions live in the
//!   database; they end after `session_idle_minutes` without a request or
//!   `session_max_hours` after sign-in, by the injected clock; sign-out deletes the record.
//!   A session signed in through the provider is re-checked with it every
//!   `oidc_recheck_minutes`; a failed re-check or a changed tenant ends it ([`logout`] and
//!   [`sessions`] end sessions from elsewhere).
//! * The session cookie is `HttpOnly`, `SameSite=Lax`, `Path=/`, has no `Max-Age`, and is
//!   `Secure` with the `__Host-` prefix unless `public_url` is plain http on a loopback host.
//! * Every dashboard request (all paths except `/auth/*`, `/healthz`, `/metrics`, `/mcp`,
//!   `/pkg/*` and static files) needs a live session: pages redirect to sign-in, anything
//!   else gets 401. A person without a role gets 403 and no data.
//! * Every state-changing request (POST, PUT, PATCH, DELETE, …) except to `/mcp` (which has
//!   its own guard) and to the back-channel logout endpoint (whose signed logout token is its
//!   credential, [`logout`]) must carry an `Origin`, or failing that a `Referer`, whose origin
//!   equals `public_url`'s; otherwise 403.

mod demo;
pub mod logout;
pub mod oidc;
pub mod pages;
pub mod pending;
pub mod session;
pub mod sessions;
pub mod store;

use std::marker::PhantomData;

use axum::Router;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use countersign_core::{AppRole, Person};
use serde::Deserialize;
use tower_sessions::Session;

use crate::AppState;
pub use countersign_app::DemoSignIn;
pub use demo::demo_name;
use oidc::Oidc;
use pages::page;
pub use pending::local_next;
use pending::{PendingLogin, constant_time_eq};
pub use session::{Auth, Mode, cookie_secure, mode_for};

/// The signed-in person, for handlers behind [`gate`] (401 otherwise).
#[derive(Debug, Clone)]
pub struct CurrentUser(pub Person);

impl<S: Send + Sync> FromRequestParts<S> for CurrentUser {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        person_from_parts(parts)
            .map(CurrentUser)
            .ok_or_else(|| (StatusCode::UNAUTHORIZED, "sign in first").into_response())
    }
}

/// The person [`gate`] put on the request, if any. Leptos server functions reach the same
/// value through `countersign_app::signed_in()`.
pub fn person_from_parts(parts: &Parts) -> Option<Person> {
    parts.extensions.get::<Person>().cloned()
}

/// A role marker for [`RequireRole`].
pub trait RoleMarker: Send + Sync {
    /// The role required.
    const ROLE: AppRole;
}

macro_rules! role_marker {
    ($name:ident, $role:expr) => {
        #[doc = concat!("Requires the `", stringify!($name), "` role.")]
        #[derive(Debug)]
        pub struct $name;
        impl RoleMarker for $name {
            const ROLE: AppRole = $role;
        }
    };
}
role_marker!(Approver, AppRole::Approver);
role_marker!(Manager, AppRole::Manager);
role_marker!(Admin, AppRole::Admin);
role_marker!(Auditor, AppRole::Auditor);

/// The signed-in person, who must hold `R::ROLE` (403 otherwise, 401 when signed out).
#[derive(Debug)]
pub struct RequireRole<R: RoleMarker>(pub Person, PhantomData<R>);

impl<S: Send + Sync, R: RoleMarker> FromRequestParts<S> for RequireRole<R> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let CurrentUser(person) = CurrentUser::from_request_parts(parts, state).await?;
        if person.has_role(R::ROLE) {
            Ok(Self(person, PhantomData))
        } else {
            Err((
                StatusCode::FORBIDDEN,
                format!("this needs the {} role", R::ROLE.as_str()),
            )
                .into_response())
        }
    }
}

/// `/auth/*` routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/auth/login", get(login))
        .route("/auth/callback", get(callback))
        .route("/auth/logout", post(logout::logout))
        .route(logout::SIGNED_OUT_PATH, get(logout::signed_out))
        .route(logout::BACKCHANNEL_PATH, post(logout::backchannel))
        .route("/auth/me", get(me))
        .route("/auth/demo", get(demo::list).post(demo::sign_in))
}

/// Paths that need no session.
fn exempt(path: &str) -> bool {
    let prefixed = |p: &str| path == p || path.starts_with(&format!("{p}/"));
    if ["/auth", "/healthz", "/metrics", "/mcp", "/pkg", "/assets"]
        .iter()
        .any(|p| prefixed(p))
    {
        return true;
    }
    // The metadata agents read before they hold any token (the root form and `/mcp`'s only).
    if path
        .strip_prefix(crate::oauth::METADATA_ROOT)
        .is_some_and(|rest| rest.is_empty() || rest == "/mcp")
    {
        return true;
    }
    // Static files copied from public/ (favicon and the like), which sit at the root: a
    // deeper path (`/runs/x.css`) is a page like any other.
    let Some(last) = path.strip_prefix('/').filter(|rest| !rest.contains('/')) else {
        return false;
    };
    [
        ".svg",
        ".png",
        ".ico",
        ".css",
        ".js",
        ".wasm",
        ".txt",
        ".webmanifest",
        ".woff2",
    ]
    .iter()
    .any(|ext| last.ends_with(ext))
}

fn login_redirect(next: &str) -> Response {
    let mut target = url::form_urlencoded::Serializer::new(String::new());
    target.append_pair("next", next);
    Redirect::to(&format!("/auth/login?{}", target.finish())).into_response()
}

/// Middleware: dashboard requests need a live session and a role.
pub async fn gate(
    State(state): State<AppState>,
    session: Session,
    mut request: axum::extract::Request,
    next: Next,
) -> Response {
    let auth = &state.auth;
    if auth.demo() {
        request.extensions_mut().insert(DemoSignIn);
    }
    let path = request.uri().path().to_string();
    if exempt(&path) {
        return next.run(request).await;
    }
    let activity = !path.starts_with(countersign_app::BACKGROUND_PREFIX);
    let Some(person) = auth.current(&session, activity).await else {
        // Pages redirect to sign-in; the JSON API answers 401 (a client, not a person).
        let page_request =
            matches!(*request.method(), Method::GET | Method::HEAD) && !path.starts_with("/api/");
        return if page_request {
            let next = request
                .uri()
                .path_and_query()
                .map_or("/".to_string(), |pq| pq.as_str().to_string());
            login_redirect(&local_next(Some(&next)))
        } else {
            (StatusCode::UNAUTHORIZED, "sign in first").into_response()
        };
    };
    if person.roles.is_empty() {
        return page(
            StatusCode::FORBIDDEN,
            "No access",
            &format!(
                "You are signed in as {} but your account has no Countersign role. Ask an \
                 administrator to add you to a group the role map knows.",
                pages::escape(&person.name)
            ),
            auth.demo(),
        );
    }
    request.extensions_mut().insert(person);
    next.run(request).await
}

/// Middleware: state-changing requests must come from `public_url`'s origin (or, behind a
/// loopback public URL, from `http://localhost` on its port).
pub async fn csrf(
    State(state): State<AppState>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    );
    let path = request.uri().path();
    let mcp = path == "/mcp" || path.starts_with("/mcp/");
    // The provider calls it server to server; its signed logout token is the credential.
    let backchannel = path == logout::BACKCHANNEL_PATH;
    if safe || mcp || backchannel || own_origin(&state, request.headers()) {
        return next.run(request).await;
    }
    page(
        StatusCode::FORBIDDEN,
        "Cross-origin request refused",
        "This request did not come from a Countersign page (its Origin or Referer is missing \
         or names another site), so it was not carried out.",
        state.auth.demo(),
    )
}

/// Whether a request's `Origin` (or, without it, `Referer`) is this server's: `public_url`'s
/// origin or, behind a loopback public URL, `http://localhost` on its port — the same server,
/// and the origin passkeys work on (browsers refuse WebAuthn on IP addresses). The CSRF layer
/// and every handler that repeats the check ask this.
pub fn own_origin(state: &AppState, headers: &HeaderMap) -> bool {
    same_origin(headers, &state.auth.origin)
        || state
            .config
            .relying_party()
            .is_some_and(|rp| same_origin(headers, &rp.origin))
}

/// Whether `Origin` (or, without it, `Referer`) names exactly `origin`.
pub fn same_origin(headers: &HeaderMap, origin: &str) -> bool {
    if let Some(value) = headers.get(header::ORIGIN) {
        return value.to_str().is_ok_and(|v| v == origin);
    }
    headers
        .get(header::REFERER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| url::Url::parse(v).ok())
        .is_some_and(|u| u.origin().ascii_serialization() == origin)
}

#[derive(Deserialize)]
struct LoginQuery {
    next: Option<String>,
    /// Present (any value): a step-up sign-in, the provider must authenticate the person now.
    fresh: Option<String>,
}

async fn login(State(state): State<AppState>, Query(q): Query<LoginQuery>) -> Response {
    let auth = &state.auth;
    let next = local_next(q.next.as_deref());
    match &auth.mode {
        Mode::Demo => {
            let mut target = url::form_urlencoded::Serializer::new(String::new());
            target.append_pair("next", &next);
            Redirect::to(&format!("/auth/demo?{}", target.finish())).into_response()
        }
        Mode::Off => demo::off_page(),
        Mode::Oidc(oidc) => {
            let pending = PendingLogin::new(auth.store.clock().now_ms(), next);
            match oidc.begin(&pending, q.fresh.is_some()).await {
                Ok(url) => {
                    let mut resp = Redirect::to(&url).into_response();
                    if let Some(cookie) = pending::set_cookie(&pending, auth.cookie_secure) {
                        resp.headers_mut().append(header::SET_COOKIE, cookie);
                    }
                    resp
                }
                Err(e) => {
                    tracing::error!(error = %e, "sign-in could not start");
                    page(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "Sign-in unavailable",
                        &format!("{}. Try again later.", pages::escape(&e.public())),
                        false,
                    )
                }
            }
        }
    }
}

#[derive(Deserialize)]
struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    iss: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

fn refused(reason: &str) -> Response {
    page(
        StatusCode::BAD_REQUEST,
        "Sign-in refused",
        &format!(
            "{}. Nothing was signed in. <a href=\"/auth/login\">Start again</a>.",
            pages::escape(reason)
        ),
        false,
    )
}

async fn callback(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Query(q): Query<CallbackQuery>,
) -> Response {
    let Mode::Oidc(oidc) = &state.auth.mode else {
        return page(
            StatusCode::NOT_FOUND,
            "Not found",
            "This server does not sign in with OpenID Connect.",
            state.auth.demo(),
        );
    };
    let secure = state.auth.cookie_secure;
    let pending = pending::from_headers(&headers, secure)
        .filter(|p| !p.expired(state.auth.store.clock().now_ms()));
    let mut resp = finish_sign_in(&state, oidc, &session, pending, q).await;
    // Single use: the pending sign-in is gone whatever happened.
    resp.headers_mut()
        .append(header::SET_COOKIE, pending::clear_cookie(secure));
    resp
}

/// The callback's checks in order, for the pending sign-in this browser carries.
async fn finish_sign_in(
    state: &AppState,
    oidc: &Oidc,
    session: &Session,
    pending: Option<PendingLogin>,
    q: CallbackQuery,
) -> Response {
    let Some(pending) = pending else {
        return refused(
            "No sign-in is in progress in this browser (it expired, was already completed, or \
             cookies are blocked)",
        );
    };
    // The state first: an error response carries it too (RFC 6749 §4.1.2.1), and nothing a
    // response says counts before it is known to answer this browser's own request.
    let Some(returned_state) = q.state else {
        return refused("The response has no state");
    };
    if !constant_time_eq(returned_state.as_bytes(), pending.state().as_bytes()) {
        return refused("The response's state does not match this browser's sign-in");
    }
    if let Some(error) = q.error {
        // The provider's words go to the log only; the page names a registered code at most.
        tracing::info!(%error, description = ?q.error_description, "sign-in refused by the identity provider");
        let known = PROVIDER_ERRORS.contains(&error.as_str());
        return refused(&format!(
            "The identity provider did not sign you in ({})",
            if known {
                error.as_str()
            } else {
                "an unlisted error"
            }
        ));
    }
    let Some(code) = q.code else {
        return refused("The response has no code");
    };
    match oidc.finish(&pending, code, q.iss.as_deref()).await {
        Ok((person, idp)) => {
            if let Err(resp) = state.auth.sign_in(session, &person, Some(&idp)).await {
                return resp;
            }
            tracing::info!(iss = %person.iss, sub = %person.sub, roles = ?person.roles, "signed in");
            Redirect::to(&local_next(Some(&pending.next))).into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "sign-in refused");
            refused(&e.public())
        }
    }
}

/// The error codes of an authorization response (RFC 6749 §4.1.2.1, OpenID Connect Core
/// §3.1.2.6) a sign-in page may name; any other code is not shown.
const PROVIDER_ERRORS: [&str; 12] = [
    "invalid_request",
    "unauthorized_client",
    "access_denied",
    "unsupported_response_type",
    "invalid_scope",
    "server_error",
    "temporarily_unavailable",
    "interaction_required",
    "login_required",
    "account_selection_required",
    "consent_required",
    "invalid_request_uri",
];

/// The signed-in person as JSON (401 when signed out).
async fn me(State(state): State<AppState>, session: Session) -> Response {
    match state.auth.current(&session, true).await {
        Some(person) => axum::Json(person).into_response(),
        None => (StatusCode::UNAUTHORIZED, "not signed in").into_response(),
    }
}
