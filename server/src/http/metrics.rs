//! `GET /metrics`: the gateway's counters (`crate::metrics`) and two gauges in the Prometheus
//! text format.
//!
//! Access: with `metrics_token` configured, a scrape must send `Authorization: Bearer TOKEN`
//! (anything else is 401, nothing counted or read); the comparison is of SHA-256 digests, so
//! its time does not depend on how much of the token matched. Without it `/metrics` is open:
//! keep it on an internal network (the server warns at start when it listens beyond loopback).

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use countersign_core::StepStatus;

use crate::AppState;

/// Whether `headers` carry the bearer token `expected` (digests compared, see the module doc).
fn scrape_allowed(expected: &countersign_core::Secret<String>, headers: &HeaderMap) -> bool {
    use sha2::{Digest, Sha256};
    // The scheme is case-insensitive (RFC 9110 §11.1).
    let Some(sent) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token)
    else {
        return false;
    };
    Sha256::digest(sent.as_bytes()) == Sha256::digest(expected.expose().as_bytes())
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(expected) = &state.config.metrics_token
        && !scrape_allowed(expected, &headers)
    {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"metrics\"")],
        )
            .into_response();
    }
    let mut text = state.metrics.render();
    for (name, help, status) in [
        (
            "countersign_gate_queue_depth",
            "Steps waiting for a person's approval.",
            StepStatus::NeedsApproval,
        ),
        (
            "countersign_steps_unknown",
            "Steps whose outcome is being reconciled with the target.",
            StepStatus::Unknown,
        ),
    ] {
        match state.store.count_steps(status).await {
            Ok(n) => {
                let _ = write!(
                    text,
                    "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {n}\n"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics: counting steps failed");
                return StatusCode::SERVICE_UNAVAILABLE.into_response();
            }
        }
    }
    if let Some(n) = state.metrics.mcp_sessions().await {
        let _ = write!(
            text,
            "# HELP countersign_mcp_sessions MCP sessions open in this process.\n\
             # TYPE countersign_mcp_sessions gauge\ncountersign_mcp_sessions {n}\n"
        );
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
