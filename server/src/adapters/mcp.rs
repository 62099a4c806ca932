//! The `mcp` adapter: a tool proxied to an upstream MCP server (streamable HTTP) at the
//! provider's `url`, spoken as plain JSON-RPC over the same outbound client as [`super::http`].
//!
//! Wire contract: `initialize` (revision [`PROTOCOL`]) + `notifications/initialized` once per
//! upstream session (re-done when the upstream forgets the session: HTTP 404), then per call
//! `tools/call {name: operation, arguments: canonical arguments, _meta: {idempotency_key,
//! trace_id, tenant, approval?}}`. Answers may be JSON or an SSE stream.
//! `structuredContent` is the result (else the first text content, parsed as JSON when it is
//! a JSON object or array, so redaction applies to its fields); `isError: true` → rejected
//! (`code` from `structuredContent.code`, else `upstream.error`); a JSON-RPC error saying the
//! call was never dispatched (parse error, invalid request, unknown method, invalid params)
//! → rejected (`upstream.<code>`); any other JSON-RPC error (an internal error, a server's
//! own code: the handler may have failed after acting) → effect unknown.
//!
//! Invariants (all fail closed):
//! * The upstream's own descriptions are never trusted: this adapter never asks for
//!   `tools/list`, so names, descriptions, schemas and annotations agents see come from the
//!   registry alone; only `tools/call` is sent, for the operation the registry names.
//! * The same outbound rules as the http adapter: the `url`'s host must be on
//!   `allowed_hosts` (checked before every request; otherwise [`AdapterError::Refused`] and
//!   no connection), no redirects, no proxy, bounded time and answer size.
//! * The key Countersign derived travels in `_meta.idempotency_key`; an upstream that
//!   honours it answers a repeat with its first result.
//! * One call takes at most the adapter timeout (kept under the pipeline's own limit), waiting
//!   for a session included: running out before `tools/call` was sent is
//!   [`AdapterError::Unavailable`] (nothing sent), after it [`AdapterError::Timeout`].
//! * Upstream servers offer no standard lookup by key: [`Adapter::lookup`] answers "cannot
//!   tell" (an error), never "did not happen". They expose no facts (`None`).

use countersign_core::policy::ResourceFact;
use countersign_core::registry::Provider;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde_json::{Map, Value, json};
use tokio::sync::Mutex;
use url::Url;

use super::contract::{Adapter, AdapterError, AdapterSettings, BoxFuture, Invocation};
use super::http::{AllowList, SetupError, client, read_body, send_error};

/// The MCP revision spoken upstream.
pub const PROTOCOL: &str = "2025-06-18";

/// A live upstream session.
#[derive(Debug, Clone)]
struct Session {
    /// `Mcp-Session-Id`, when the upstream issued one.
    id: Option<String>,
    /// The revision the upstream agreed to.
    protocol: String,
}

/// A provider of kind `mcp`.
#[derive(Debug)]
pub struct McpAdapter {
    url: Url,
    allow: AllowList,
    client: reqwest::Client,
    session: Mutex<Option<Session>>,
    next_id: std::sync::atomic::AtomicU64,
    /// The most one `invoke` may take, waiting for a session included.
    budget: std::time::Duration,
}

/// What one JSON-RPC exchange produced.
enum Reply {
    /// The `result` member.
    Result(Value),
    /// The `error` member.
    Error { code: i64, message: String },
    /// The upstream does not know the session (HTTP 404): initialise again.
    SessionGone,
}

impl McpAdapter {
    /// The adapter for `provider` (its `url` must be http(s) on `allowed_hosts`).
    pub fn new(provider: &Provider, settings: &AdapterSettings) -> Result<Self, SetupError> {
        let text = provider
            .url
            .as_deref()
            .ok_or_else(|| SetupError::Url("an mcp provider needs url".into()))?;
        let url = Url::parse(text).map_err(|e| SetupError::Url(e.to_string()))?;
        let allow = AllowList::of(provider);
        allow.check(&url)?;
        Ok(Self {
            url,
            allow,
            client: client(settings)?,
            session: Mutex::new(None),
            next_id: std::sync::atomic::AtomicU64::new(1),
            // Inside the pipeline's own limit, so that this adapter, not the pipeline's
            // timer, says whether the call was sent.
            budget: settings.timeout.min(
                crate::adapters::ADAPTER_TIMEOUT.saturating_sub(std::time::Duration::from_secs(1)),
            ),
        })
    }

    fn id(&self) -> u64 {
        self.next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Posts one JSON-RPC message; `None` id = a notification.
    async fn post(
        &self,
        session: Option<&Session>,
        method: &str,
        params: Value,
        id: Option<u64>,
    ) -> Result<(StatusCode, Option<String>, Option<Reply>), AdapterError> {
        self.allow
            .check(&self.url)
            .map_err(|e| AdapterError::Refused(e.to_string()))?;
        let mut body = json!({"jsonrpc": "2.0", "method": method, "params": params});
        if let Some(id) = id {
            body["id"] = json!(id);
        }
        let mut req = self
            .client
            .post(self.url.clone())
            .header(ACCEPT, "application/json, text/event-stream")
            .json(&body);
        if let Some(s) = session {
            if let Some(sid) = &s.id {
                req = req.header("Mcp-Session-Id", sid);
            }
            req = req.header("MCP-Protocol-Version", &s.protocol);
        }
        let resp = req.send().await.map_err(|e| send_error(&e))?;
        let status = resp.status();
        let sid = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if status == StatusCode::NOT_FOUND && session.is_some_and(|s| s.id.is_some()) {
            return Ok((status, sid, Some(Reply::SessionGone)));
        }
        let Some(id) = id else {
            return Ok((status, sid, None));
        };
        if !status.is_success() {
            return Err(
                if status == StatusCode::SERVICE_UNAVAILABLE
                    || status == StatusCode::TOO_MANY_REQUESTS
                {
                    AdapterError::Unavailable(format!("upstream MCP server answered {status}"))
                } else if status.is_server_error() {
                    // The request arrived: a crash or a lost answer leaves the effect unknown.
                    AdapterError::Timeout
                } else {
                    AdapterError::Rejected {
                        code: format!("upstream.http.{}", status.as_u16()),
                        message: format!("the upstream MCP server answered {status}"),
                    }
                },
            );
        }
        let sse = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let body = read_body(resp).await?;
        let message = if sse {
            find_in_sse(&body, id)
        } else {
            serde_json::from_slice::<Value>(&body).ok()
        };
        let Some(message) = message else {
            tracing::info!(method, "upstream MCP answer unreadable");
            return Err(AdapterError::Timeout);
        };
        let reply = if let Some(result) = message.get("result") {
            Reply::Result(result.clone())
        } else if let Some(error) = message.get("error") {
            Reply::Error {
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect(),
            }
        } else {
            return Err(AdapterError::Timeout);
        };
        Ok((status, sid, Some(reply)))
    }

    /// `initialize` + `notifications/initialized`. Nothing has an effect yet, so any failure
    /// here is [`AdapterError::Unavailable`].
    async fn initialize(&self) -> Result<Session, AdapterError> {
        let params = json!({
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "countersign", "version": env!("CARGO_PKG_VERSION")},
        });
        let unavailable = |e: AdapterError| match e {
            AdapterError::Refused(m) => AdapterError::Refused(m),
            other => AdapterError::Unavailable(format!("upstream initialize failed: {other}")),
        };
        let (_, sid, reply) = self
            .post(None, "initialize", params, Some(self.id()))
            .await
            .map_err(unavailable)?;
        let result = match reply {
            Some(Reply::Result(r)) => r,
            _ => {
                return Err(AdapterError::Unavailable(
                    "upstream refused initialize".into(),
                ));
            }
        };
        let protocol = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or(PROTOCOL)
            .to_string();
        // It is sent back as a header on every call: only a revision date (YYYY-MM-DD) is
        // usable; anything else would break every later call of this session.
        if !is_revision(&protocol) {
            return Err(AdapterError::Unavailable(
                "upstream answered initialize with an unusable protocolVersion".into(),
            ));
        }
        let session = Session { id: sid, protocol };
        self.post(Some(&session), "notifications/initialized", json!({}), None)
            .await
            .map_err(unavailable)?;
        Ok(session)
    }

    /// The current session, initialising one if there is none.
    async fn session(&self, fresh: bool) -> Result<Session, AdapterError> {
        let mut guard = self.session.lock().await;
        if !fresh && let Some(s) = guard.as_ref() {
            return Ok(s.clone());
        }
        let s = self.initialize().await?;
        *guard = Some(s.clone());
        Ok(s)
    }
}

/// Whether `v` is an MCP revision: `YYYY-MM-DD`.
fn is_revision(v: &str) -> bool {
    let b = v.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        })
}

/// The JSON-RPC message with `id` among the `data:` lines of an SSE body.
fn find_in_sse(body: &[u8], id: u64) -> Option<Value> {
    let text = String::from_utf8_lossy(body);
    let mut data = String::new();
    let mut found = None;
    let mut flush = |data: &mut String| {
        if let Ok(msg) = serde_json::from_str::<Value>(data)
            && msg.get("id") == Some(&json!(id))
        {
            found = Some(msg);
        }
        data.clear();
    };
    for line in text.lines() {
        if line.is_empty() {
            flush(&mut data);
        } else if let Some(rest) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
        }
    }
    flush(&mut data);
    found
}

/// A `tools/call` result as the adapter's outcome.
fn call_outcome(result: &Value) -> Result<Value, AdapterError> {
    let text = result
        .get("content")
        .and_then(Value::as_array)
        .and_then(|items| {
            items
                .iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("text"))
        })
        .and_then(|c| c.get("text"))
        .and_then(Value::as_str);
    let structured = result.get("structuredContent").filter(|v| !v.is_null());
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let code = structured
            .and_then(|s| s.get("code"))
            .and_then(Value::as_str)
            .unwrap_or("upstream.error");
        let message = structured
            .and_then(|s| s.get("message"))
            .and_then(Value::as_str)
            .or(text)
            .unwrap_or("the upstream tool reported an error");
        return Err(AdapterError::Rejected {
            code: code.chars().take(100).collect(),
            message: message.chars().take(200).collect(),
        });
    }
    if let Some(s) = structured {
        return Ok(s.clone());
    }
    Ok(match text {
        Some(t) => serde_json::from_str::<Value>(t)
            .ok()
            .filter(|v| v.is_object() || v.is_array())
            .unwrap_or_else(|| json!({"text": t})),
        None => json!({}),
    })
}

/// What a JSON-RPC error to `tools/call` says about the effect: only the codes that mean the
/// call never reached a handler are a rejection.
fn rpc_error(code: i64, message: String) -> AdapterError {
    const NEVER_DISPATCHED: [i64; 4] = [-32700, -32600, -32601, -32602];
    if NEVER_DISPATCHED.contains(&code) {
        AdapterError::Rejected {
            code: format!("upstream.{code}"),
            message,
        }
    } else {
        tracing::info!(code, "upstream MCP error after dispatch; effect unknown");
        AdapterError::Timeout
    }
}

impl Adapter for McpAdapter {
    fn invoke<'a>(&'a self, call: &'a Invocation) -> BoxFuture<'a, Result<Value, AdapterError>> {
        Box::pin(async move {
            let mut meta = Map::new();
            meta.insert("idempotency_key".into(), json!(call.idem_key));
            meta.insert("trace_id".into(), json!(call.trace_id));
            meta.insert("tenant".into(), json!(call.tenant));
            if let Some(approval) = &call.approval_token {
                meta.insert("approval".into(), json!(approval));
            }
            let params = json!({
                "name": call.operation,
                "arguments": call.arguments,
                "_meta": meta,
            });
            // One deadline for the whole call: running out while waiting for a session (another
            // call initialising it, or this one) means nothing was sent; during `tools/call`, it
            // may have been.
            let deadline = tokio::time::Instant::now() + self.budget;
            let mut fresh = false;
            loop {
                let session = tokio::time::timeout_at(deadline, self.session(fresh))
                    .await
                    .map_err(|_| {
                        AdapterError::Unavailable(
                            "no upstream MCP session in time; nothing was sent".into(),
                        )
                    })??;
                let (_, _, reply) = tokio::time::timeout_at(
                    deadline,
                    self.post(
                        Some(&session),
                        "tools/call",
                        params.clone(),
                        Some(self.id()),
                    ),
                )
                .await
                .map_err(|_| AdapterError::Timeout)??;
                return match reply {
                    Some(Reply::Result(result)) => call_outcome(&result),
                    Some(Reply::Error { code, message }) => Err(rpc_error(code, message)),
                    // The upstream rejected the session before looking at the call: once more
                    // on a fresh one.
                    Some(Reply::SessionGone) if !fresh => {
                        fresh = true;
                        continue;
                    }
                    Some(Reply::SessionGone) | None => Err(AdapterError::Unavailable(
                        "the upstream MCP server lost the session".into(),
                    )),
                };
            }
        })
    }

    fn lookup<'a>(
        &'a self,
        _tenant: &'a str,
        _idem_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, AdapterError>> {
        Box::pin(async {
            Err(AdapterError::Unavailable(
                "upstream MCP servers offer no lookup by key; reconcile with the tool's \
                 `reconcile` read"
                    .into(),
            ))
        })
    }

    fn facts<'a>(
        &'a self,
        _kind: &'a str,
        _id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceFact>, AdapterError>> {
        Box::pin(async { Ok(None) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_bodies_yield_the_message_with_the_id() {
        let body = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n\n\
                     data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"ok\":true}}\n\n";
        assert_eq!(find_in_sse(body, 7).unwrap()["result"]["ok"], true);
        assert!(find_in_sse(body, 8).is_none());
    }

    #[test]
    fn error_results_are_rejections_and_structured_content_wins() {
        let err = call_outcome(&json!({"isError": true,
            "content": [{"type": "text", "text": "card declined"}]}));
        assert_eq!(
            err,
            Err(AdapterError::Rejected {
                code: "upstream.error".into(),
                message: "card declined".into()
            })
        );
        let ok = call_outcome(&json!({"content": [{"type": "text", "text": "{\"a\":1}"}],
            "structuredContent": {"b": 2}}));
        assert_eq!(ok, Ok(json!({"b": 2})));
        let text = call_outcome(&json!({"content": [{"type": "text", "text": "done"}]}));
        assert_eq!(text, Ok(json!({"text": "done"})));
        // A JSON array in text is the result itself, so redaction sees its fields.
        let list = call_outcome(&json!({"content": [{"type": "text",
            "text": "[{\"email\":\"x@y.example\"}]"}]}));
        assert_eq!(list, Ok(json!([{"email": "x@y.example"}])));
    }

    #[test]
    fn only_revision_dates_are_usable_protocol_versions() {
        assert!(is_revision("2025-06-18"));
        for bad in [
            "2025-06-18\u{1}",
            "2025-06-1",
            "latest",
            "2025/06/18",
            "",
            "2025-06-18 ",
        ] {
            assert!(!is_revision(bad), "{bad:?}");
        }
    }

    #[test]
    fn only_json_rpc_errors_before_dispatch_are_rejections() {
        for code in [-32700, -32600, -32601, -32602] {
            assert!(
                matches!(rpc_error(code, "no".into()), AdapterError::Rejected { .. }),
                "{code}"
            );
        }
        // An internal error (a handler that threw, maybe after acting) or a server's own code.
        for code in [-32603, -32001, 0, 1] {
            assert_eq!(
                rpc_error(code, "boom".into()),
                AdapterError::Timeout,
                "{code}"
            );
        }
    }
}
