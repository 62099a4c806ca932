//! An agent's MCP session over streamable HTTP, as a well-behaved client holds one.

use serde_json::{Value, json};

pub(super) const PROTOCOL: &str = "2025-06-18";

/// An MCP session of one agent over streamable HTTP.
pub(super) struct Session {
    pub(super) http: reqwest::Client,
    pub(super) url: String,
    pub(super) token: String,
    pub(super) session: Option<String>,
    pub(super) next_id: u64,
}

impl Session {
    pub(super) async fn connect(
        http: &reqwest::Client,
        base: &str,
        token: &str,
    ) -> Result<Self, String> {
        let mut s = Self {
            http: http.clone(),
            url: format!("{base}/mcp"),
            token: token.to_string(),
            session: None,
            next_id: 1,
        };
        let init = s
            .request(
                "initialize",
                json!({"protocolVersion": PROTOCOL, "capabilities": {},
                       "clientInfo": {"name": "countersign-scenario", "version": "0"}}),
            )
            .await?;
        if init.get("result").is_none() {
            return Err(format!("initialize failed: {init}"));
        }
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let resp = s
            .post(&note)
            .send()
            .await
            .map_err(|e| format!("initialized: {e}"))?;
        if resp.status() != reqwest::StatusCode::ACCEPTED {
            return Err(format!("initialized answered {}", resp.status()));
        }
        Ok(s)
    }

    pub(super) fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("Accept", "application/json, text/event-stream")
            .json(body);
        if let Some(session) = &self.session {
            req = req
                .header("Mcp-Session-Id", session)
                .header("MCP-Protocol-Version", PROTOCOL);
        }
        req
    }

    pub(super) async fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let resp = self
            .post(&body)
            .send()
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        if resp.status() != reqwest::StatusCode::OK {
            return Err(format!("{method}: HTTP {}", resp.status()));
        }
        if let Some(session) = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            self.session = Some(session.to_string());
        }
        read_response(resp, id).await
    }

    /// Ends the session (`DELETE /mcp` with its id): the server answers 204 and forgets it.
    /// A session the server no longer has (404) or a credential it no longer accepts (401:
    /// revoked or expired during the play) has nothing left to close from this side.
    pub(super) async fn close(self) -> Result<(), String> {
        let Some(session) = &self.session else {
            return Ok(());
        };
        let resp = self
            .http
            .delete(&self.url)
            .bearer_auth(&self.token)
            .header("Mcp-Session-Id", session)
            .header("MCP-Protocol-Version", PROTOCOL)
            .send()
            .await
            .map_err(|e| format!("closing the session: {e}"))?;
        match resp.status() {
            reqwest::StatusCode::NO_CONTENT
            | reqwest::StatusCode::NOT_FOUND
            | reqwest::StatusCode::UNAUTHORIZED => Ok(()),
            other => Err(format!("closing the session answered {other}")),
        }
    }

    pub(super) async fn tool_names(&mut self) -> Result<Vec<String>, String> {
        let list = self.request("tools/list", json!({})).await?;
        let tools = list["result"]["tools"]
            .as_array()
            .ok_or_else(|| format!("tools/list: {list}"))?;
        Ok(tools
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_string))
            .collect())
    }
}

/// The JSON-RPC response with `id`, from a JSON body or an SSE stream.
pub(super) async fn read_response(mut resp: reqwest::Response, id: u64) -> Result<Value, String> {
    let sse = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !sse {
        return resp.json().await.map_err(|e| format!("response: {e}"));
    }
    let mut buf = String::new();
    loop {
        let chunk = resp
            .chunk()
            .await
            .map_err(|e| format!("stream: {e}"))?
            .ok_or_else(|| format!("stream ended before response {id}: {buf}"))?;
        buf.push_str(&String::from_utf8_lossy(&chunk));
        for line in buf.lines() {
            if let Some(data) = line.strip_prefix("data:")
                && let Ok(msg) = serde_json::from_str::<Value>(data.trim())
                && msg["id"] == json!(id)
            {
                return Ok(msg);
            }
        }
    }
}
