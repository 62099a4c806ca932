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
//! * One agent credential holds at most [`MAX_SESSIONS_PER_AGENT`] live sessions in a
//!   process: a further `initialize` is refused (429) until it ends one, so one token cannot
//!   grow the server's memory without bound. Only `initialize` opens a session: a session-less
//!   POST is read before rmcp sees it and counts as opening one when it is `initialize` or
//!   cannot be read as one JSON object naming another method (a batch, not JSON, a repeated
//!   `method`: fail closed). A 2026-07-28 request or `server/discover` opens none and meets no
//!   limit. A slot taken for an `initialize` is given back however the request ends (the
//!   client may go away before its answer).
//! * Ending a session answers 204 (rmcp answers 202, which the official Python SDK logs as a
//!   failed termination); nothing else about the answer changes.
//! * The call context read with the authentication ([`Admission::prefetched`]) is chosen by an
//!   in-memory hint and grants nothing: it is read in the same statement as the credential,
//!   only for the agent the token proves to be, and the pipeline uses it only for the run the
//!   call resolves to on its own; otherwise it reads the context itself.

pub use crate::pipeline::Admission;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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

use crate::AppState;
use crate::config::parse_origin;

/// The challenge sent with every 401.
pub const CHALLENGE: &str = r#"Bearer realm="countersign""#;

/// Why a request to `/mcp` was turned away before reaching the protocol.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("origin not allowed")]
    Origin,
    #[error("unauthorized")]
    Unauthorized,
    #[error("internal error")]
    Internal,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Self::Origin => {
                (StatusCode::FORBIDDEN, Json(json!({"error": "forbidden"}))).into_response()
            }
            Self::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                [(WWW_AUTHENTICATE, HeaderValue::from_static(CHALLENGE))],
                Json(json!({"error": "unauthorized"})),
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

/// The MCP session header.
const SESSION_HEADER: &str = "mcp-session-id";

/// The most live MCP sessions one agent credential may hold in this process.
pub const MAX_SESSIONS_PER_AGENT: usize = 32;

/// What the guard works with: the application, and which agent opened each of this
/// process's MCP sessions.
#[derive(Clone)]
pub struct GuardState {
    /// The application.
    pub app: AppState,
    /// The sessions' owners.
    pub owners: Arc<SessionOwners>,
    /// rmcp's sessions (to forget owners of sessions that ended).
    pub sessions: Arc<LocalSessionManager>,
    /// The largest POST body rmcp accepts (the guard reads no more of a session-less one).
    pub max_body: usize,
}

/// Session id → the id of the agent credential that opened it, and per agent the
/// `initialize` requests under way (counted against the limit before their session exists).
#[derive(Debug, Default)]
pub struct SessionOwners(
    Mutex<HashMap<String, String>>,
    Mutex<HashMap<String, usize>>,
);

impl SessionOwners {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        match self.0.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn opening(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        match self.1.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Takes one of `agent`'s session slots for an `initialize` under way, if one is free
    /// (`held` sessions are live already).
    fn reserve(&self, agent: &str, held: usize) -> bool {
        let mut opening = self.opening();
        let pending = opening.entry(agent.to_string()).or_default();
        if held + *pending >= MAX_SESSIONS_PER_AGENT {
            return false;
        }
        *pending += 1;
        true
    }

    /// Gives back a slot taken by [`SessionOwners::reserve`].
    fn release(&self, agent: &str) {
        let mut opening = self.opening();
        if let Some(n) = opening.get_mut(agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                opening.remove(agent);
            }
        }
    }
}

/// Axum middleware: checks `Origin`, authenticates the bearer token, keeps each session to
/// the agent that opened it, and stores the credential in the request's extensions.
pub async fn guard(State(state): State<GuardState>, mut req: Request, next: Next) -> Response {
    let (credential, admission) = match admit(&state.app, req.headers()).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal.into_response(),
    };
    let session = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let foreign = session.as_ref().is_some_and(|id| {
        state
            .owners
            .lock()
            .get(id)
            .is_some_and(|owner| *owner != credential.id)
    });
    if foreign {
        tracing::info!(agent = %credential.id, "mcp: request names another agent's session");
        return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    }
    let agent = credential.id.clone();
    let opening = if session.is_none() && req.method() == axum::http::Method::POST {
        let (read, opens) = match opens_session(req, state.max_body).await {
            Ok(read) => read,
            Err(unread) => return unread,
        };
        req = read;
        opens
    } else {
        false
    };
    let reserved = if opening {
        let held = sessions_held(&state, &agent).await;
        match Reservation::take(&state.owners, &agent, held) {
            Some(slot) => Some(slot),
            None => return session_limit_reached(&agent),
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
    let mut response = next.run(req).await;
    if ending && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    if !response.status().is_success() {
        return response;
    }
    match (&session, response.headers().get(SESSION_HEADER)) {
        // `initialize` opened a session: it is this agent's.
        (None, Some(opened)) => {
            if let Ok(opened) = opened.to_str() {
                let opened = opened.to_string();
                let live = state.sessions.sessions.read().await.len();
                let owned = {
                    let mut owners = state.owners.lock();
                    owners.insert(opened, agent.clone());
                    owners.len()
                };
                if owned > 2 * live + 64 {
                    forget_ended(&state).await;
                }
            }
        }
        (Some(id), _) if ending => {
            state.owners.lock().remove(id);
        }
        _ => {}
    }
    // The slot reserved for an `initialize` is now a recorded session (or was never used):
    // `reserved` gives it back as it drops.
    drop(reserved);
    response
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

/// A slot of [`SessionOwners`] taken for an `initialize` under way, given back when dropped:
/// on every way out of the guard, including the client going away mid-request.
struct Reservation {
    owners: Arc<SessionOwners>,
    agent: String,
}

impl Reservation {
    /// One of `agent`'s slots, if one is free (`held` sessions are live already).
    fn take(owners: &Arc<SessionOwners>, agent: &str, held: usize) -> Option<Self> {
        owners.reserve(agent, held).then(|| Self {
            owners: owners.clone(),
            agent: agent.to_string(),
        })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.owners.release(&self.agent);
    }
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

/// How many of this process's live MCP sessions `agent` opened (owners of sessions that
/// ended by themselves are forgotten first when the count reaches the limit).
async fn sessions_held(state: &GuardState, agent: &str) -> usize {
    let count = || {
        state
            .owners
            .lock()
            .values()
            .filter(|owner| *owner == agent)
            .count()
    };
    let held = count();
    if held < MAX_SESSIONS_PER_AGENT {
        return held;
    }
    forget_ended(state).await;
    count()
}

/// Forgets the owners of sessions that ended by themselves (rmcp's idle timeout).
async fn forget_ended(state: &GuardState) {
    let live: std::collections::HashSet<String> = state
        .sessions
        .sessions
        .read()
        .await
        .keys()
        .map(|k| k.to_string())
        .collect();
    state.owners.lock().retain(|id, _| live.contains(id));
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
    state: &AppState,
    headers: &HeaderMap,
) -> Result<(AgentCredential, Admission), Refusal> {
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
    let Some(token) = bearer(headers) else {
        tracing::info!("mcp: request without a bearer token");
        return Err(Refusal::Unauthorized);
    };
    // [perf] When this session's calls were seen before, the call's context (its run, the
    // stop, the party and its grants) is read in the same statement as the credential.
    let hint_key = headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
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
            Err(Refusal::Unauthorized)
        }
        Err(e) => {
            tracing::error!(error = %e, "mcp: authenticating an agent failed");
            Err(Refusal::Internal)
        }
    }
}

/// The token of an `Authorization: Bearer …` header; `None` when absent or malformed.
fn bearer(headers: &HeaderMap) -> Option<AgentToken> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty())
        .then(|| AgentToken::presented(token))
}
