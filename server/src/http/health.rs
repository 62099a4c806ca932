//! `/healthz`: 200 when the database answers, 503 otherwise; reports the registry version
//! in force so operators (and tests) can see a reload land.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::AppState;

/// How long the database may take to answer a health probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Reports whether the server can reach its database.
pub async fn healthz(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let backend = state.store.backend().as_str();
    match tokio::time::timeout(PROBE_TIMEOUT, state.store.ping()).await {
        Ok(Ok(())) => (
            StatusCode::OK,
            Json(json!({
                "status": "ok",
                "database": backend,
                "registry_version": state.registry.version(),
            })),
        ),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "health probe: database unavailable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable", "database": backend})),
            )
        }
        Err(_) => {
            tracing::warn!("health probe: database timed out");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable", "database": backend})),
            )
        }
    }
}
