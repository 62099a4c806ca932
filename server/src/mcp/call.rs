//! `tools/call` over MCP: reads the caller, `_meta.run_id`/`_meta.step_id`, what the agent
//! declares (`_meta.model`, `_meta.prompt_revision`, a `traceparent` in `_meta` or the HTTP
//! header) and the MCP session from the request, runs the [`crate::pipeline`], and turns its answer into an MCP
//! result. A key a client puts in `_meta` is ignored: Countersign derives every key itself.

use rmcp::ErrorData;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use serde_json::Value;

use crate::AppState;
use crate::pipeline::{self, Answer, CallRequest, Caller, Provenance};

/// Runs one `tools/call` for `caller`. `Err` only for a tool the role does not have
/// ([`unknown_tool`]) or an internal failure ([`internal_error`]); every other outcome is a
/// tool result, `isError` when refused or failed.
pub async fn call(
    state: &AppState,
    caller: &Caller,
    request: CallToolRequestParams,
    context_meta: &JsonObject,
    traceparent: Option<&str>,
) -> Result<CallToolResult, ErrorData> {
    // rmcp moves `_meta` into the request context; read the params' copy too, if any.
    let meta_text = |name: &str| -> Option<String> {
        context_meta
            .get(name)
            .or_else(|| request.meta.as_ref().and_then(|m| m.0.0.get(name)))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let call = CallRequest {
        tool: request.name.to_string(),
        arguments: request.arguments.clone().unwrap_or_default(),
        run_id: meta_text("run_id"),
        step_id: meta_text("step_id"),
        provenance: Provenance::read(meta_text, traceparent),
    };
    match pipeline::call(state, caller, call).await {
        Ok(Answer::UnknownTool) => Err(unknown_tool()),
        Ok(Answer::Result {
            error: false,
            structured,
        }) => Ok(CallToolResult::structured(structured)),
        Ok(Answer::Result {
            error: true,
            structured,
        }) => Ok(CallToolResult::structured_error(structured)),
        Err(e) => {
            tracing::error!(error = %e, "mcp: tools/call failed inside Countersign");
            Err(internal_error())
        }
    }
}

/// The answer to `tools/call` on a tool the caller's role does not have, whether or not it
/// exists for anyone. Carries no name, so both cases are the same bytes.
pub fn unknown_tool() -> ErrorData {
    ErrorData::invalid_params("Unknown tool", None)
}

/// The opaque answer for anything that went wrong inside Countersign.
pub fn internal_error() -> ErrorData {
    ErrorData::internal_error("internal error", None)
}
