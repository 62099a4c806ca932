//! `GET /audit/export`: the audit trail as JSON lines, streamed a page at a time.

use crate::AppState;
use crate::auth::CurrentUser;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use countersign_app::audit::AuditQuery;
use countersign_core::AppRole;

use super::{filter_for, with_agent_names};
use crate::http::names::Names;

/// Records per query of the export.
const EXPORT_PAGE: i64 = 1_000;

/// `GET /audit/export.jsonl?…`: the records the search's filter matches, in chain order, as
/// JSON lines (the `countersign audit export` format).
pub async fn export(
    State(state): State<AppState>,
    CurrentUser(person): CurrentUser,
    Query(q): Query<AuditQuery>,
) -> Response {
    let allowed = [AppRole::Auditor, AppRole::Admin, AppRole::Manager]
        .iter()
        .any(|r| person.has_role(*r));
    let tenant = person.tenant.clone().filter(|t| !t.is_empty());
    let Some(tenant) = tenant.filter(|_| allowed) else {
        return (
            StatusCode::FORBIDDEN,
            "the audit export needs the auditor, admin or manager role and a tenant",
        )
            .into_response();
    };
    let names = match Names::load(&state.store, &tenant).await {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(error = %e, "audit export: reading agent names failed");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "the database did not answer",
            )
                .into_response();
        }
    };
    let q = with_agent_names(&names, &tenant, &q);
    let filter = match filter_for(&tenant, &q) {
        Ok(f) => f,
        Err(msg) => return (StatusCode::BAD_REQUEST, msg).into_response(),
    };
    tracing::info!(sub = %person.sub, tenant = %tenant, "audit export");
    let store = state.store.clone();
    let stream = futures_util::stream::unfold(Some(0i64), move |after| {
        let store = store.clone();
        let filter = filter.clone();
        async move {
            let after = after?;
            match store
                .audit_matching_after(&filter, after, EXPORT_PAGE)
                .await
            {
                Ok(page) if page.is_empty() => None,
                Ok(page) => {
                    let mut out = String::new();
                    let mut last = after;
                    for r in &page {
                        last = r.pos;
                        match serde_json::to_string(r) {
                            Ok(line) => {
                                out.push_str(&line);
                                out.push('\n');
                            }
                            Err(e) => {
                                return Some((Err(std::io::Error::other(e)), None));
                            }
                        }
                    }
                    Some((Ok(Bytes::from(out)), Some(last)))
                }
                Err(e) => {
                    tracing::error!(error = %e, "audit export: reading failed; stream cut");
                    Some((Err(std::io::Error::other(e.to_string())), None))
                }
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, "application/jsonl; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"audit.jsonl\"",
            ),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}
