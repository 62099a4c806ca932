//! Signing out: the person's own sign-out (which also ends the provider's session when the
//! provider offers RP-initiated logout) and the provider's back-channel logout.
//!
//! Invariants:
//! * Sign-out deletes the session row before anything else; only then is the browser sent
//!   to the provider's `end_session_endpoint` (with the ID token as `id_token_hint` and
//!   `PUBLIC_URL/auth/signed-out` as where to come back), so "sign in" right after "sign
//!   out" asks the provider to authenticate the person again.
//! * `POST /auth/backchannel-logout` needs no session and no `Origin` (the provider calls
//!   it server to server): the signed logout token is its only credential
//!   ([`super::oidc::Oidc::logout_token`]). A refused token ends nothing and answers 400;
//!   a provider whose keys cannot be fetched gets 503 (it retries). A token ends only the
//!   sessions signed in by a minute after its `iat`: replayed later, it ends none begun since.

use axum::Form;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use tower_sessions::Session;

use super::oidc::{IdpSession, SignInError};
use super::pages::page;
use super::session::{IDP, Mode};
use super::sessions::{Which, end_sessions};
use crate::AppState;

/// Where the provider sends the browser back after an RP-initiated logout.
pub const SIGNED_OUT_PATH: &str = "/auth/signed-out";
/// How much later than a logout token's `iat` a session may have been signed in and still be
/// ended by it (clock differences); a session signed in later is not (a replay).
pub const LOGOUT_SKEW_MS: i64 = 60 * 1000;
/// The back-channel logout endpoint (register it at the provider).
pub const BACKCHANNEL_PATH: &str = "/auth/backchannel-logout";

/// `POST /auth/logout`.
pub(super) async fn logout(State(state): State<AppState>, session: Session) -> Response {
    let idp: Option<IdpSession> = session.get(IDP).await.ok().flatten();
    if let Err(e) = session.flush().await {
        tracing::error!(error = %e, "could not delete a session");
        return (StatusCode::INTERNAL_SERVER_ERROR, "sign-out failed").into_response();
    }
    if let (Mode::Oidc(oidc), Some(idp)) = (&state.auth.mode, idp) {
        let back = format!("{}{SIGNED_OUT_PATH}", state.auth.origin);
        if let Some(url) = oidc.end_session_url(&idp.id_token, &back).await {
            return Redirect::to(&url).into_response();
        }
    }
    Redirect::to(SIGNED_OUT_PATH).into_response()
}

/// `GET /auth/signed-out`.
pub(super) async fn signed_out(State(state): State<AppState>) -> Response {
    page(
        StatusCode::OK,
        "Signed out",
        "You are signed out of Countersign. <a href=\"/auth/login\">Sign in again</a>.",
        state.auth.demo(),
    )
}

#[derive(Deserialize)]
pub(super) struct LogoutTokenForm {
    logout_token: Option<String>,
}

/// `POST /auth/backchannel-logout` (OpenID Connect Back-Channel Logout 1.0 §2.5).
pub(super) async fn backchannel(
    State(state): State<AppState>,
    Form(form): Form<LogoutTokenForm>,
) -> Response {
    let Mode::Oidc(oidc) = &state.auth.mode else {
        return (
            StatusCode::NOT_FOUND,
            "this server does not sign in with OpenID Connect",
        )
            .into_response();
    };
    let Some(token) = form.logout_token else {
        return refused("no logout_token");
    };
    let subject = match oidc.logout_token(&token).await {
        Ok(subject) => subject,
        // The provider could not be asked for its keys: not the token's fault, and the
        // provider retries a 5xx.
        Err(e @ SignInError::Discovery(_)) => {
            tracing::error!(error = %e, "back-channel logout: the provider's keys are unavailable");
            return no_store(StatusCode::SERVICE_UNAVAILABLE.into_response());
        }
        Err(e) => {
            tracing::warn!(error = %e, "back-channel logout refused");
            return refused(&e.public());
        }
    };
    let which = Which {
        iss: &subject.iss,
        sub: subject.sub.as_deref(),
        tenant: None,
        sid: subject.sid.as_deref(),
        // A minute for the provider's clock and ours (and `iat`'s whole seconds) to differ.
        signed_in_by: Some(subject.issued_at + LOGOUT_SKEW_MS),
    };
    let by = format!("{} (back-channel logout)", subject.iss);
    match end_sessions(&state.store, &which, &by).await {
        Ok(n) => {
            tracing::info!(iss = %subject.iss, sub = ?subject.sub, sid = ?subject.sid, sessions = n, "back-channel logout");
            no_store(StatusCode::OK.into_response())
        }
        Err(e) => {
            tracing::error!(error = %e, "back-channel logout: ending sessions failed");
            no_store(StatusCode::SERVICE_UNAVAILABLE.into_response())
        }
    }
}

fn refused(description: &str) -> Response {
    no_store(
        (
            StatusCode::BAD_REQUEST,
            axum::Json(serde_json::json!({
                "error": "invalid_request",
                "error_description": description,
            })),
        )
            .into_response(),
    )
}

fn no_store(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}
