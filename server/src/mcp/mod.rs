//! `/mcp`: the MCP streamable-HTTP endpoint agents call tools through.
//!
//! Owns the protocol surface: [`guard`] (Origin allow-list and bearer auth on every request),
//! the rmcp service mounted at `/mcp`, `tools/list` filtered to the caller's role, and the
//! front of the `tools/call` pipeline ([`call`]).
//!
//! Invariants:
//! * The caller's role and tenant come only from the [`AgentCredential`] the guard put in the
//!   request's extensions, re-read on every request; never from the MCP session or the client.
//! * A tool not listed for the role does not exist for it: it is absent from `tools/list`,
//!   and `tools/call` on it answers with [`unknown_tool`], byte for byte what a tool that
//!   exists nowhere gets.
//! * With no bundle in force, no tool exists for anyone (fail closed).
//! * Internal errors reach the agent as an opaque "internal error", their cause only the log.
//! * Only the protocol revisions in [`PROTOCOL_REVISIONS`] are spoken: 2025-06-18 and
//!   2025-11-25 with the `initialize` handshake and a session, and 2026-07-28 without either
//!   (`server/discover`, then each request stands alone, its revision and client in its
//!   `_meta`; rmcp routes it and answers it as plain JSON). Every revision reaches the same
//!   handler: the same guard, role-filtered listing, pipeline and refusals. A session-less
//!   call belongs to the agent's session-less run ([`crate::pipeline`]).

pub mod call;
pub mod guard;
pub mod sessions;

pub use call::{internal_error, unknown_tool};
use std::borrow::Cow;
use std::sync::Arc;

use axum::Router;
use countersign_core::RoleName;
use countersign_core::store::AgentCredential;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, InitializeResult, JsonObject,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};

use crate::AppState;

/// The path the endpoint is served at.
pub const PATH: &str = "/mcp";

/// The MCP revisions the gateway speaks, oldest first.
pub const PROTOCOL_REVISIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

/// How many tools one `tools/list` page holds.
pub const TOOLS_PAGE_SIZE: usize = 50;

/// The `/mcp` routes with the guard in front, ready to merge into the main router.
pub fn routes(state: AppState) -> Router<AppState> {
    let handler_state = state.clone();
    let config_of_state = state.config.clone();
    let sessions = Arc::new(LocalSessionManager::default());
    state.metrics.track_mcp_sessions(&sessions);
    let owners = Arc::new(sessions::Owners::default());
    let mut config = transport_config(&state);
    config.session_store = Some(Arc::new(sessions::DbSessions::new(
        state.store.clone(),
        owners.clone(),
    )));
    sessions::spawn_ended_poll(
        state.store.clone(),
        sessions.clone(),
        owners.clone(),
        state.shutdown.clone(),
    );
    let max_body = config.max_request_body_bytes;
    let service = StreamableHttpService::new(
        move || Ok(Gateway::new(handler_state.clone())),
        sessions.clone(),
        config,
    );
    let oauth = match crate::oauth::ResourceServer::from_config(&state.config, &state.store, PATH) {
        Ok(oauth) => oauth,
        Err(e) => {
            // INVARIANT: only an HTTP client that cannot be built lands here; OAuth then
            // admits nobody (fail closed) and says why.
            tracing::error!(error = %e, "mcp: the OAuth resource server could not start");
            None
        }
    };
    let guarded = guard::GuardState {
        app: state,
        owners,
        sessions,
        max_body,
        oauth,
    };
    let metadata = [
        crate::oauth::METADATA_ROOT.to_string(),
        format!("{}{PATH}", crate::oauth::METADATA_ROOT),
    ]
    .into_iter()
    .fold(Router::new(), |r, path| {
        let config = config_of_state.clone();
        r.route(
            &path,
            axum::routing::get(move || async move { crate::oauth::metadata(&config, PATH) }),
        )
    });
    Router::new()
        .route_service(PATH, service)
        .layer(axum::middleware::from_fn_with_state(guarded, guard::guard))
        .merge(metadata)
}

/// rmcp's transport settings: `Host` checked against the public URL's host and loopback;
/// `Origin` is checked by [`guard`] (with the configured allow-list) before rmcp sees it.
fn transport_config(state: &AppState) -> StreamableHttpServerConfig {
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if let Some(host) = state.config.public_url.host_str() {
        hosts.push(host.to_string());
    }
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .disable_allowed_origins()
        // A session-less (2026-07-28) answer that is one message comes as `application/json`,
        // not an event stream (rmcp falls back to a stream when a handler sends more).
        .with_json_response(true);
    // Shutdown ends every session and its stream (see `Application::run_until`).
    config.cancellation_token = state.shutdown.clone();
    config
}

/// The MCP server handler: one per session, all sharing the application state.
#[derive(Clone, Debug)]
pub struct Gateway {
    state: AppState,
}

impl Gateway {
    /// A handler over `state`.
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

/// The credential the guard authenticated for this request.
fn credential(context: &RequestContext<RoleServer>) -> Result<AgentCredential, ErrorData> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<AgentCredential>())
        .cloned()
        .ok_or_else(|| {
            // INVARIANT: the guard runs in front of every /mcp request; reaching here means
            // the router was wired without it.
            tracing::error!("mcp: request reached the handler without a credential");
            internal_error()
        })
}

/// The MCP description of a registry tool.
fn describe(tool: &countersign_core::registry::Tool) -> Tool {
    let schema = |v: &serde_json::Value| -> Arc<JsonObject> {
        Arc::new(v.as_object().cloned().unwrap_or_default())
    };
    let derived = tool.annotations();
    let annotations = ToolAnnotations::new()
        .read_only(derived.read_only_hint)
        .destructive(derived.destructive_hint)
        .idempotent(derived.idempotent_hint)
        .open_world(derived.open_world_hint);
    let mut out = Tool::new(
        tool.name.as_str().to_string(),
        tool.description.clone(),
        schema(&tool.input_schema),
    )
    .with_annotations(annotations);
    if let Some(title) = &tool.title {
        out = out.with_title(title.clone());
    }
    if let Some(output) = &tool.output_schema {
        out = out.with_raw_output_schema(schema(&with_status_envelope(output)));
    }
    out
}

/// A tool's output schema as Countersign answers it: the tool's own result, or one of the
/// gateway's status answers (waiting for approval, in flight, unknown), which a client that
/// validates `structuredContent` against `outputSchema` must also accept.
fn with_status_envelope(output: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "anyOf": [
            output,
            {
                "type": "object",
                "required": ["status"],
                "properties": {
                    "status": {"type": "string", "enum": [
                        "needs_approval", "in_flight", "unknown", "denied", "invalid",
                        "refused", "failed", "expired", "cancelled"]},
                    "step_id": {"type": "string"},
                    "expires_at": {"type": ["string", "null"]},
                    "rule": {"type": ["string", "null"]},
                    "message": {"type": "string"}
                }
            }
        ]
    })
}

/// One page of `items` (sorted by `name`): those after `cursor`, at most `size`, and the cursor
/// of the next page when more follow. The cursor is the last name served, so a page stays
/// consistent when the registry changes between requests (no tool is served twice).
fn page<T>(
    items: impl Iterator<Item = T>,
    name: impl Fn(&T) -> &str,
    cursor: Option<&str>,
    size: usize,
) -> (Vec<T>, Option<String>) {
    let mut rest = items.filter(|item| cursor.is_none_or(|c| name(item) > c));
    let page: Vec<T> = rest.by_ref().take(size).collect();
    let more = rest.next().is_some();
    let next = if more {
        page.last().map(|item| name(item).to_string())
    } else {
        None
    };
    (page, next)
}

impl ServerHandler for Gateway {
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(PROTOCOL_REVISIONS)
    }

    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "countersign",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Countersign lists the tools your role may call. Writes may wait for a person's \
                 approval; results say so.",
            )
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let credential = credential(&context)?;
        let cursor = request.and_then(|r| r.cursor);
        let role = RoleName::parse(&credential.role);
        let (tools, next_cursor) = match (self.state.registry.current(), role) {
            (Some(loaded), Ok(role)) => {
                let (page, next) = page(
                    loaded.bundle.registry.tools_for_role(&role),
                    |t| t.name.as_str(),
                    cursor.as_deref(),
                    TOOLS_PAGE_SIZE,
                );
                (page.into_iter().map(describe).collect(), next)
            }
            _ => (Vec::new(), None),
        };
        let mut result = ListToolsResult::with_all_items(tools);
        result.next_cursor = next_cursor;
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let credential = credential(&context)?;
        // A session-less (2026-07-28) request has no session whatever header it carries: rmcp
        // checks none on that path, so a made-up `Mcp-Session-Id` would let the client pick
        // (and multiply) its runs.
        let session_less = context
            .meta
            .protocol_version()
            .is_some_and(|v| !v.has_initialize());
        let session = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .filter(|_| !session_less)
            .map(str::to_string);
        let admission = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<crate::pipeline::Admission>())
            .cloned()
            .filter(|_| !session_less);
        let traceparent = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("traceparent"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let caller = crate::pipeline::Caller {
            credential,
            session,
            executor: None,
            admission,
        };
        call::call(
            &self.state,
            &caller,
            request,
            &context.meta.0.0,
            traceparent.as_deref(),
        )
        .await
        .map(CallToolResponse::from)
    }
}

#[cfg(test)]
mod tests {
    use super::page;

    #[test]
    fn pages_follow_the_cursor_and_end_without_one() {
        let names = ["a", "b", "c", "d", "e"];
        fn id<'b>(s: &'b &str) -> &'b str {
            s
        }
        let (first, next) = page(names.iter().copied(), id, None, 2);
        assert_eq!((first, next.as_deref()), (vec!["a", "b"], Some("b")));
        let (second, next) = page(names.iter().copied(), id, Some("b"), 2);
        assert_eq!((second, next.as_deref()), (vec!["c", "d"], Some("d")));
        let (last, next) = page(names.iter().copied(), id, Some("d"), 2);
        assert_eq!((last, next), (vec!["e"], None));
        let (exact, next) = page(names.iter().copied(), id, None, 5);
        assert_eq!((exact.len(), next), (5, None));
        let (none, next) = page(names.iter().copied(), id, Some("z"), 2);
        assert_eq!((none.len(), next), (0, None));
    }
}
