//! The bench's upstream MCP server: one read tool, `lookup`, that answers at once. It runs in
//! its own process (this bench binary started again with `BENCH_UPSTREAM=1`), so the same
//! clients can call it directly and through Countersign (a provider of kind `mcp`).

use std::sync::Arc;

use axum::Router;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::json;

/// The upstream's one tool.
pub const TOOL: &str = "lookup";

#[derive(Clone)]
struct Lookup;

impl ServerHandler for Lookup {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("bench-upstream", "0"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({
            "type": "object", "additionalProperties": false, "required": ["id"],
            "properties": {"id": {"type": "string", "maxLength": 40}}
        });
        let tool = Tool::new(
            TOOL,
            "Looks a record up (answers at once).",
            Arc::new(schema.as_object().cloned().unwrap_or_default()),
        )
        .with_annotations(ToolAnnotations::new().read_only(true));
        Ok(ListToolsResult::with_all_items(vec![tool]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let id = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("id"))
            .cloned()
            .unwrap_or_default();
        Ok(CallToolResult::structured(json!({"id": id, "found": true})).into())
    }
}

/// Serves until killed; prints `listening <addr>` first.
pub async fn serve() {
    let service = StreamableHttpService::new(
        || Ok(Lookup),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    use axum::serve::ListenerExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("listening {}", listener.local_addr().unwrap());
    // As Countersign's own listener: without TCP_NODELAY an SSE answer's last segment waits
    // for the client's delayed ACK (~40 ms a call).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, Router::new().route_service("/mcp", service))
        .await
        .unwrap();
}
