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
pub mod sessions;
pub mod store;

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use countersign_core::{AppRole, Person, Store};
use serde::Deserialize;
use tower_sessions::cookie::SameSite;
use tower_sessions::{Expiry, Session, SessionManagerLayer};

use crate::AppState;
use crate::config::Config;
pub use countersign_app::DemoSignIn;
use oidc::{IdpSession, Oidc};
use pages::page;
use pending::{PendingLogin, constant_time_eq};
use store::{DbSessionStore, EXPIRES_AT};

const PERSON: &str = "person";
const SEEN: &str = "seen";
/// The session data key of what the provider answered at sign-in ([`IdpSession`]).
const IDP: &str = "idp";
/// How stale the last-seen mark may get before a request rewrites it.
const SEEN_GRANULARITY_MS: i64 = 60 * 1000;

/// How people sign in on this server.
#[derive(Debug)]
pub enum Mode {
    /// Through the configured OpenID Connect provider.
    Oidc(Box<Oidc>),
    /// Loopback only, no issuer configured: pick a seeded demo user.
    Demo,
    /// No issuer and not on loopback: nobody can sign in.
    Off,
}

/// Sign-in settings and state shared by the handlers.
#[derive(Debug)]
pub struct Auth {
    /// The sign-in mode.
    pub mode: Mode,
    store: Store,
    origin: String,
    idle_ms: i64,
    max_ms: i64,
    recheck_ms: i64,
    cookie_secure: bool,
    /// One re-check at a time per session on this server (see [`Auth::recheck`]).
    rechecks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The sign-in mode `config` allows: OIDC if an issuer is set; otherwise the demo sign-in
/// only when asked for (`demo_sign_in`) on a loopback listen address with a loopback public
/// URL.
pub fn mode_for(config: &Config, store: &Store) -> Result<Mode, oidc::SignInError> {
    match &config.oidc {
        Some(oidc) => {
            let redirect = config
                .public_url
                .join("/auth/callback")
                .map_err(|e| oidc::SignInError::Discovery(format!("redirect URI: {e}")))?;
            Ok(Mode::Oidc(Box::new(Oidc::new(
                oidc.clone(),
                redirect.as_str(),
                store.clock().clone(),
                std::time::Duration::from_secs(u64::from(config.session_max_hours) * 3600),
            )?)))
        }
        // Behind a reverse proxy (a public URL off loopback) the listen address says nothing
        // about who can reach the server: no demo sign-in there.
        None if config.demo_sign_in
            && config.listen.ip().is_loopback()
            && loopback_host(&config.public_url) =>
        {
            Ok(Mode::Demo)
        }
        None => Ok(Mode::Off),
    }
}

/// Whether `url` names a loopback host.
fn loopback_host(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// Whether cookies must be `Secure`: always, except for plain http on a loopback host.
pub fn cookie_secure(public_url: &url::Url) -> bool {
    !(public_url.scheme() == "http" && loopback_host(public_url))
}

impl Auth {
    /// Builds the sign-in state for `config` over `store`.
    pub fn new(config: &Config, store: Store) -> Result<Self, oidc::SignInError> {
        let mode = mode_for(config, &store)?;
        Ok(Self {
            mode,
            origin: config.public_url.origin().ascii_serialization(),
            idle_ms: i64::from(config.session_idle_minutes) * 60 * 1000,
            max_ms: i64::from(config.session_max_hours) * 3600 * 1000,
            recheck_ms: config
                .oidc
                .as_ref()
                .map_or(i64::MAX, |o| i64::from(o.recheck_minutes) * 60 * 1000),
            cookie_secure: cookie_secure(&config.public_url),
            rechecks: std::sync::Mutex::default(),
            store,
        })
    }

    /// The session cookie's name.
    pub fn cookie_name(&self) -> &'static str {
        if self.cookie_secure {
            "__Host-countersign"
        } else {
            "countersign"
        }
    }

    /// The session layer (database store, cookie attributes as in the module invariants).
    pub fn session_layer(&self) -> SessionManagerLayer<DbSessionStore> {
        SessionManagerLayer::new(DbSessionStore::new(self.store.clone()))
            .with_name(self.cookie_name())
            .with_http_only(true)
            .with_same_site(SameSite::Lax)
            .with_secure(self.cookie_secure)
            .with_path("/")
            .with_expiry(Expiry::OnSessionEnd)
    }

    /// The person signed in on `session`, if the session is live. An expired session is
    /// deleted; a live one has its last-seen mark refreshed, unless the request is a page's
    /// background refresh (`activity` false), which never keeps an idle session alive. A
    /// session signed in through the provider is re-checked with it every
    /// `oidc_recheck_minutes` ([`Self::recheck`]).
    pub async fn current(&self, session: &Session, activity: bool) -> Option<Person> {
        let person: Person = session.get(PERSON).await.ok().flatten()?;
        let seen: i64 = session.get(SEEN).await.ok().flatten().unwrap_or(0);
        let now = self.store.clock().now_ms();
        if now >= person.auth_time.saturating_add(self.max_ms)
            || now >= seen.saturating_add(self.idle_ms)
        {
            end(session, "expired").await;
            return None;
        }
        let person = self.recheck(session, person, now).await?;
        if activity && now - seen >= SEEN_GRANULARITY_MS && session.insert(SEEN, now).await.is_err()
        {
            return None;
        }
        Some(person)
    }

    /// Re-derives the person's roles and tenant from the provider when the last check is
    /// `oidc_recheck_minutes` old. Fails closed: a session signed in through the provider
    /// without what a re-check needs, a provider that refuses or does not answer, or a
    /// tenant that changed ends the session; changed roles replace the session's.
    async fn recheck(&self, session: &Session, person: Person, now: i64) -> Option<Person> {
        let Mode::Oidc(oidc) = &self.mode else {
            return Some(person);
        };
        let Some(idp) = session.get::<IdpSession>(IDP).await.ok().flatten() else {
            end(session, "no provider tokens to re-check with").await;
            return None;
        };
        if now.saturating_sub(idp.checked_at) < self.recheck_ms {
            return Some(person);
        }
        // One re-check at a time per session: pages ask in parallel, and a provider that
        // rotates refresh tokens refuses the second use of one. The one that waited takes
        // what the first stored.
        let id = session.id().map(|id| id.to_string()).unwrap_or_default();
        let lock = self.recheck_lock(&id);
        let _turn = lock.lock().await;
        if let Some((stored, stored_idp)) = self.stored(&id).await
            && stored_idp.checked_at > idp.checked_at
        {
            self.release_lock(&id, &lock);
            let adopted = async {
                session.insert(PERSON, &stored).await?;
                session.insert(IDP, &stored_idp).await
            }
            .await;
            return adopted.is_ok().then_some(stored);
        }
        let rechecked = self.rechecked(oidc, session, person, &idp).await;
        self.release_lock(&id, &lock);
        rechecked
    }

    fn recheck_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.rechecks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(id.to_string()).or_default().clone()
    }

    fn release_lock(&self, id: &str, lock: &Arc<tokio::sync::Mutex<()>>) {
        let mut locks = self.rechecks.lock().unwrap_or_else(|p| p.into_inner());
        // Nobody else holds or waits for it (the map's and this caller's references).
        if Arc::strong_count(lock) <= 2 {
            locks.remove(id);
        }
    }

    /// The person and provider tokens as the session's row holds them now.
    async fn stored(&self, id: &str) -> Option<(Person, IdpSession)> {
        let bytes = self.store.session_load(id).await.ok().flatten()?;
        let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        let person = serde_json::from_value(value.get(PERSON)?.clone()).ok()?;
        let idp = serde_json::from_value(value.get(IDP)?.clone()).ok()?;
        Some((person, idp))
    }

    /// Asks the provider and applies its answer to the session (see [`Auth::recheck`]).
    async fn rechecked(
        &self,
        oidc: &Oidc,
        session: &Session,
        person: Person,
        idp: &IdpSession,
    ) -> Option<Person> {
        let (current, idp) = match oidc.recheck(idp, &person).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(iss = %person.iss, sub = %person.sub, error = %e, "re-check with the identity provider failed; session ended");
                end(session, "re-check failed").await;
                return None;
            }
        };
        if current.tenant != person.tenant {
            tracing::warn!(iss = %person.iss, sub = %person.sub, from = ?person.tenant, to = ?current.tenant, "tenant changed at the identity provider; session ended");
            end(session, "tenant changed").await;
            return None;
        }
        if current.roles != person.roles {
            tracing::info!(iss = %person.iss, sub = %person.sub, from = ?person.roles, to = ?current.roles, "roles changed at the identity provider");
        }
        let stored = async {
            session.insert(PERSON, &current).await?;
            session.insert(IDP, &idp).await
        }
        .await;
        if stored.is_err() {
            end(session, "re-check could not be stored").await;
            return None;
        }
        Some(current)
    }

    async fn sign_in(
        &self,
        session: &Session,
        person: &Person,
        idp: Option<&IdpSession>,
    ) -> Result<(), Response> {
        let now = self.store.clock().now_ms();
        let result = async {
            session.cycle_id().await?;
            session.clear().await;
            session.insert(PERSON, person).await?;
            if let Some(idp) = idp {
                session.insert(IDP, idp).await?;
            }
            session.insert(SEEN, now).await?;
            session
                .insert(EXPIRES_AT, person.auth_time.saturating_add(self.max_ms))
                .await
        }
        .await;
        result.map_err(|e| {
            tracing::error!(error = %e, "could not store a session");
            page(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Sign-in failed",
                "The session could not be stored. Try again.",
                self.demo(),
            )
        })
    }

    /// Whether the demo sign-in is on (pages then show the demo banner).
    pub fn demo(&self) -> bool {
        matches!(self.mode, Mode::Demo)
    }
}

/// Deletes `session` (it ended: `why`, for the log when that fails).
async fn end(session: &Session, why: &str) {
    if let Err(e) = session.flush().await {
        tracing::warn!(error = %e, why, "could not delete an ended session");
    }
}

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
    if ["/auth", "/healthz", "/metrics", "/mcp", "/pkg"]
        .iter()
        .any(|p| prefixed(p))
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

/// Only local paths are accepted as `next`; anything else becomes `/`.
pub fn local_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.contains('\\')
                && !n.chars().any(char::is_control)
                && !n.starts_with("/auth/") =>
        {
            n.to_string()
        }
        _ => "/".to_string(),
    }
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

/// Middleware: state-changing requests must come from `public_url`'s origin.
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
    if safe || mcp || backchannel || same_origin(request.headers(), &state.auth.origin) {
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
