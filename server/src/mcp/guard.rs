//! The door in front of `/mcp`: `Origin` allow-list, then bearer authentication.
//!
//! Invariants:
//! * Every request is checked, not only `initialize`: a credential revoked or expired
//!   mid-session is refused on its next request.
//! * A refusal tells the caller nothing beyond 401 or 403; the reason goes to the server log,
//!   and the token never does (it lives in [`AgentToken`]'s `Secret`).
//! * Only a request that passes carries an [`AgentCredential`] in its extensions; the MCP
//!   handler reads the caller's role and tenant from there and nowhere else. Its
//!   `Authorization` header is removed first, so the token goes no further than this module.
//! * An MCP session belongs to the agent whose `initialize` opened it: a request naming
//!   another agent's session (to resume its stream, end it or send into it) is answered as
//!   for a session that does not exist (404), whatever token it carries.
//! * One agent credential holds at most [`MAX_SESSIONS_PER_AGENT`] live sessions on all
//!   replicas together (counted in the database, plus this process's `initialize` requests
//!   under way): a further `initialize` is refused (429) until it ends one, so one token
//!   cannot grow the servers' memory without bound. Only `initialize` opens a session: a session-less
//!   POST is read before rmcp sees it and counts as opening one when it is `initialize` or
//!   cannot be read as one JSON object naming another method (a batch, not JSON, a repeated
//!   `method`: fail closed). A 2026-07-28 request or `server/discover` opens none and meets no
//!   limit, and a POST at a session-less revision (its `MCP-Protocol-Version` header) names no
//!   session whatever header it carries — unless it is an `initialize`, which rmcp always
//!   takes into a session: that keeps its session and every check of it. A slot taken for an `initialize` is given back however the request ends (the
//!   client may go away before its answer).
//! * Ending a session answers 204 (rmcp answers 202, which the official Python SDK logs as a
//!   failed termination) when it ended it or it was the caller's session here; 404 when it
//!   was no live session of the caller's anywhere.
//! * Sessions live in the database ([`super::sessions`]): this process's owner map is a
//!   cache, and rmcp restores a session it has not seen only through the session store, which
//!   answers only for the caller's own live sessions.
//! * The call context read with the authentication ([`Admission::prefetched`]) is chosen by an
//!   in-memory hint and grants nothing: it is read in the same statement as the credential,
//!   only for the agent the token proves to be, and the pipeline uses it only for the run the
//!   call resolves to on its own; otherwise it reads the context itself.

pub use crate::pipeline::Admission;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, ORIGIN, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use countersign_core::agents::AgentToken;
use countersign_core::store::{AgentCredential, ContextHint};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::sessions::{self, Done, Known, Owners, Reservation, Scope};
use crate::AppState;
use crate::config::parse_origin;
use crate::oauth::Refused;

/// The challenge sent with every 401.
pub const CHALLENGE: &str = r#"Bearer realm="countersign""#;

/// Why a request to `/mcp` was turned away before reaching the protocol.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("origin not allowed")]
    Origin,
    /// 401 with this `WWW-Authenticate` challenge.
    #[error("unauthorized")]
    Unauthorized(String),
    /// 403 with this `WWW-Authenticate` challenge (an access token without the scope).
    #[error("insufficient scope")]
    InsufficientScope(String),
    #[error("internal error")]
    Internal,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Self::Origin => {
                (StatusCode::FORBIDDEN, Json(json!({"error": "forbidden"}))).into_response()
            }
            Self::Unauthorized(challenge) => (
                StatusCode::UNAUTHORIZED,
                [(WWW_AUTHENTICATE, header_value(challenge))],
                Json(json!({"error": "unauthorized"})),
            )
                .into_response(),
            Self::InsufficientScope(challenge) => (
                StatusCode::FORBIDDEN,
                [(WWW_AUTHENTICATE, header_value(challenge))],
                Json(json!({"error": "insufficient_scope"})),
            )
                .into_response(),
            Self::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"error": "internal error"})),
            )
                .into_response(),
        }
    }
}

/// `text` as a header value (a challenge built from configuration; the plain one if not).
fn header_value(text: String) -> HeaderValue {
    HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static(CHALLENGE))
}

/// The MCP session header.
const SESSION_HEADER: &str = "mcp-session-id";

pub use super::sessions::MAX_SESSIONS_PER_AGENT;

/// What the guard works with: the application, and what this process knows of MCP sessions
/// (the database holds them: [`super::sessions`]).
#[derive(Clone)]
pub struct GuardState {
    /// The application.
    pub app: AppState,
    /// The owners of the sessions this process serves.
    pub owners: Arc<Owners>,
    /// rmcp's sessions in this process (to forget owners of sessions that ended).
    pub sessions: Arc<LocalSessionManager>,
    /// The largest POST body rmcp accepts (the guard reads no more of a session-less one).
    pub max_body: usize,
    /// `/mcp` as an OAuth resource server, when `agent_oauth_issuers` is set.
    pub oauth: Option<Arc<crate::oauth::ResourceServer>>,
}

/// Axum middleware: checks `Origin`, authenticates the bearer token, keeps each session to
/// the agent that opened it, and stores the credential in the request's extensions.
pub async fn guard(State(state): State<GuardState>, req: Request, next: Next) -> Response {
    let (credential, admission) = match admit(&state, req.headers()).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal.into_response(),
    };
    let scope = Scope::new(&credential.tenant, &credential.id);
    let (mut req, session, opening) = match read_session(&state, req).await {
        Ok(read) => read,
        Err(unread) => return unread,
    };
    let known = match &session {
        Some(id) => match check_session(&state, &scope, id).await {
            Ok(known) => known,
            Err(refused) => return refused,
        },
        None => Known::Unknown,
    };
    let slot = if opening {
        match reserve_slot(&state, &scope).await {
            Ok(slot) => Some(slot),
            Err(refused) => return refused,
        }
    } else {
        None
    };
    let ending = req.method() == axum::http::Method::DELETE;
    // The token has done its job: nothing behind the guard (rmcp, handlers, their logs) ever
    // holds it.
    req.headers_mut().remove(AUTHORIZATION);
    req.extensions_mut().insert(credential);
    req.extensions_mut().insert(admission);
    if let Some(slot) = slot {
        // rmcp opens the session and the guard keeps it (or closes it) in a task of its own:
        // a client going away mid-request cannot leave a session half kept.
        let opened = tokio::spawn(open_session(state, scope, next, req, slot));
        return opened
            .await
            .unwrap_or_else(|_| Refusal::Internal.into_response());
    }
    let response = scope.run(next.run(req)).await;
    let response = match &session {
        Some(id) => ended_meanwhile(&state, &scope, id, response).await,
        None => response,
    };
    if ending && response.status() == StatusCode::ACCEPTED {
        if let Some(id) = &session {
            state.owners.remove(id);
        }
        return ended(&known, scope.done());
    }
    response
}

/// rmcp's `response` to a request in session `id`: a 500 because the session was gone by
/// the time rmcp handed the message over (rmcp's "get session", "accept message", … errors:
/// a message rmcp could not hand to a session reached none) becomes 404 when the session is
/// over — what the next request will be told, not a server fault the client would retry.
/// Only a failed request pays for the check (nothing is looked up on the way in).
async fn ended_meanwhile(
    state: &GuardState,
    scope: &Scope,
    id: &str,
    response: Response,
) -> Response {
    if response.status() == StatusCode::INTERNAL_SERVER_ERROR
        && session_over(state, scope, id).await
    {
        tracing::info!(session = %id, "mcp: a request's session ended while it was handed over");
        return session_not_found();
    }
    response
}

/// Whether session `id` is over: no longer served here, and not a live session of the
/// caller's in the database. A copy closed here while its row lives (shutdown, rmcp's idle
/// timeout, a worker that failed) is not over: the next request restores it; nor when the
/// database cannot be asked.
async fn session_over(state: &GuardState, scope: &Scope, id: &str) -> bool {
    if sessions::served_here(&state.sessions, id).await {
        return false;
    }
    matches!(
        sessions::touch(&state.app.store, scope.tenant(), id, scope.agent()).await,
        Ok(None)
    )
}

/// The session a request names, and whether it opens one. A POST without a session, or at a
/// session-less revision, is read first ([`opens_session`]). A session-less request has no
/// session, whatever header it carries (rmcp routes it past every session); an `initialize`
/// is never session-less to rmcp, so one naming a session keeps it, and its checks.
async fn read_session(
    state: &GuardState,
    req: Request,
) -> Result<(Request, Option<String>, bool), Response> {
    let named = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let post = req.method() == axum::http::Method::POST;
    if !post || (named.is_some() && !session_less(req.headers())) {
        return Ok((req, named, false));
    }
    let (req, opens) = opens_session(req, state.max_body).await?;
    Ok(match named {
        Some(id) if opens => (req, Some(id), false),
        Some(_) => (req, None, false),
        None => (req, None, opens),
    })
}

/// One of the caller's session slots for an `initialize`, or the 429 (or 500) answer.
async fn reserve_slot(state: &GuardState, scope: &Scope) -> Result<Reservation, Response> {
    // The slot first, then the count (see `Reservation::take`).
    let (slot, pending) = Reservation::take(&state.owners, scope.agent());
    let held = match sessions::held(&state.app.store, scope.tenant(), scope.agent()).await {
        Ok(held) => held,
        Err(e) => {
            tracing::error!(error = %e, "mcp: counting an agent's sessions failed");
            return Err(Refusal::Internal.into_response());
        }
    };
    if held + pending > MAX_SESSIONS_PER_AGENT {
        return Err(session_limit_reached(scope.agent()));
    }
    Ok(slot)
}

/// Serves an `initialize` under `slot`: the session rmcp opens is the caller's, recorded in
/// the database, or not opened at all (closed, its row ended, 500).
async fn open_session(
    state: GuardState,
    scope: Arc<Scope>,
    next: Next,
    req: Request,
    slot: Reservation,
) -> Response {
    let response = scope.run(next.run(req)).await;
    let opened = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let (true, Some(opened)) = (response.status().is_success(), opened) {
        if scope.done().opened != Some(true) {
            tracing::error!("mcp: an opened session could not be recorded; closing it");
            sessions::close_here(&state.sessions, &state.owners, &opened).await;
            sessions::end_row(&state.app.store, scope.tenant(), &opened, scope.agent()).await;
            return Refusal::Internal.into_response();
        }
        state.owners.insert(&opened, scope.agent());
    }
    // The slot is now a recorded session (or was never used).
    drop(slot);
    response
}

/// The answer to `DELETE /mcp` once rmcp has closed this process's copy: 204 when the
/// session ended in the database now or was this agent's here (ended elsewhere a moment
/// ago), 404 when it was no live session of this agent anywhere, 500 when the database could
/// not be asked.
fn ended(known: &Known, done: Done) -> Response {
    if done.failed {
        return Refusal::Internal.into_response();
    }
    match (done.ended, known) {
        (Some(true), _) | (_, Known::Own { .. }) => StatusCode::NO_CONTENT.into_response(),
        _ => session_not_found(),
    }
}

/// Whether the request names, in its `MCP-Protocol-Version` header, a revision without the
/// `initialize` handshake (2026-07-28 on).
fn session_less(headers: &HeaderMap) -> bool {
    headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            serde_json::from_value::<rmcp::model::ProtocolVersion>(serde_json::Value::String(
                v.to_string(),
            ))
            .ok()
        })
        .is_some_and(|v| !v.has_initialize())
}

/// rmcp's answer for a session that does not exist (or is not the caller's).
fn session_not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
}

/// The answer to an `initialize` over the limit (429).
fn session_limit_reached(agent: &str) -> Response {
    tracing::info!(agent = %agent, "mcp: session limit reached");
    (
        StatusCode::TOO_MANY_REQUESTS,
        Json(json!({"error": format!(
            "this credential holds {MAX_SESSIONS_PER_AGENT} open MCP sessions; end one \
             (DELETE /mcp) before opening another"
        )})),
    )
        .into_response()
}

/// Reads a session-less POST's body to tell whether it opens a session: `true` unless it is
/// one JSON object whose method is not `initialize` (a batch, a body that is not JSON or
/// names `method` twice counts as opening: the limit applies). Gives the request back whole
/// for rmcp; a body larger than rmcp accepts is refused here as rmcp would (413), one that
/// cannot be read (the client went away) with 400.
async fn opens_session(req: Request, max_body: usize) -> Result<(Request, bool), Response> {
    /// The one field read.
    #[derive(serde::Deserialize)]
    struct Message {
        method: Option<String>,
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, max_body).await {
        Ok(bytes) => bytes,
        Err(e) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return Err(if too_large {
                (StatusCode::PAYLOAD_TOO_LARGE, "Payload Too Large").into_response()
            } else {
                (StatusCode::BAD_REQUEST, "Bad Request: unreadable body").into_response()
            });
        }
    };
    // Only an object is a message rmcp serves (serde would also read `Message` from an array).
    let object = bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let opens = match serde_json::from_slice::<Message>(&bytes) {
        Ok(Message {
            method: Some(method),
        }) if object => method == "initialize",
        _ => true,
    };
    Ok((
        Request::from_parts(parts, axum::body::Body::from(bytes)),
        opens,
    ))
}

/// What session `id`, named by the request in `scope`, is: refused (404) when it is another
/// agent's, or not live in the database; the database is asked when this process has not
/// tied the session to the caller yet, and then at most every `TOUCH_EVERY`.
async fn check_session(state: &GuardState, scope: &Scope, id: &str) -> Result<Known, Response> {
    let (tenant, agent) = (scope.tenant(), scope.agent());
    let known = state.owners.known(id, agent);
    match known {
        Known::Foreign => {
            tracing::info!(agent = %agent, "mcp: request names another agent's session");
            return Err(session_not_found());
        }
        Known::Own { touch: false } => return Ok(known),
        Known::Unknown | Known::Own { touch: true } => {}
    }
    match sessions::touch(&state.app.store, tenant, id, agent).await {
        Ok(Some(params)) => {
            state.owners.insert(id, agent);
            scope.stash(id, params);
            Ok(Known::Own { touch: false })
        }
        Ok(None) => {
            if known != Known::Unknown {
                // Ended elsewhere, or idle: this process's copy goes too.
                sessions::close_here(&state.sessions, &state.owners, id).await;
            }
            tracing::info!(agent = %agent, "mcp: request names no live session of its agent");
            Err(session_not_found())
        }
        Err(e) => {
            tracing::error!(error = %e, "mcp: reading a session failed");
            Err(Refusal::Internal.into_response())
        }
    }
}

/// The key [`Admission::hint_key`] is: a digest of the token's hash and the MCP session id, so
/// the guard can look up what the session's calls were before it authenticates.
fn hint_key(token: &AgentToken, session: &str) -> String {
    let mut h = Sha256::new();
    h.update(token.hash().as_bytes());
    h.update([0]);
    h.update(session.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

async fn admit(
    guard: &GuardState,
    headers: &HeaderMap,
) -> Result<(AgentCredential, Admission), Refusal> {
    let state = &guard.app;
    let challenge = || match &guard.oauth {
        Some(rs) => rs.challenge(),
        None => CHALLENGE.to_string(),
    };
    if let Some(origin) = headers.get(ORIGIN) {
        let allowed = origin
            .to_str()
            .ok()
            .and_then(parse_origin)
            .is_some_and(|o| state.config.allowed_origins.contains(&o));
        if !allowed {
            tracing::info!(origin = ?origin, "mcp: request from an origin not allowed");
            return Err(Refusal::Origin);
        }
    }
    let Some(presented) = bearer(headers) else {
        tracing::info!("mcp: request without a bearer token");
        return Err(Refusal::Unauthorized(challenge()));
    };
    let ours = presented.starts_with(countersign_core::agents::TOKEN_PREFIX);
    let kinds = &state.config.agent_auth;
    match (&guard.oauth, ours) {
        (_, true) if kinds.countersign_tokens => {}
        (Some(rs), false) => {
            return match rs.admit(&state.store, presented).await {
                Ok(credential) => Ok((
                    credential,
                    Admission {
                        hint_key: None,
                        prefetched: None,
                    },
                )),
                Err(Refused::Unauthorized) => Err(Refusal::Unauthorized(challenge())),
                Err(Refused::InsufficientScope) => {
                    Err(Refusal::InsufficientScope(rs.insufficient_scope()))
                }
                Err(Refused::Internal) => Err(Refusal::Internal),
            };
        }
        _ => {
            tracing::info!("mcp: a kind of token this server does not accept");
            return Err(Refusal::Unauthorized(challenge()));
        }
    }
    let token = AgentToken::presented(presented);
    // [perf] When this session's calls were seen before, the call's context (its run, the
    // stop, the party and its grants) is read in the same statement as the credential.
    // (A session-less request has no session to hint at: its admission would be dropped.)
    let hint_key = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|_| !session_less(headers))
        .map(|session| hint_key(&token, session));
    let hint = hint_key.as_deref().and_then(|k| state.store.call_hint(k));
    let checked = match &hint {
        Some((agent_id, run_id)) => state
            .store
            .authenticate_for_call(
                &token,
                &ContextHint {
                    agent_id,
                    run_id,
                    switch: crate::pipeline::EMERGENCY_STOP,
                },
            )
            .await
            .map(|(checked, context)| {
                let prefetched = context.map(|c| (run_id.clone(), c));
                (checked, prefetched)
            }),
        None => state
            .store
            .authenticate_agent(&token)
            .await
            .map(|c| (c, None)),
    };
    match checked.map(|(c, prefetched)| {
        c.map(|credential| {
            (
                credential,
                Admission {
                    hint_key,
                    prefetched,
                },
            )
        })
    }) {
        Ok(Ok(admitted)) => Ok(admitted),
        Ok(Err(reason)) => {
            tracing::info!(%reason, "mcp: agent credential refused");
            Err(Refusal::Unauthorized(challenge()))
        }
        Err(e) => {
            tracing::error!(error = %e, "mcp: authenticating an agent failed");
            Err(Refusal::Internal)
        }
    }
}

/// The token of an `Authorization: Bearer …` header; `None` when absent or malformed.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}
