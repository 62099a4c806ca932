//! The proposals `/gates` drafts (issue 33): the gate advisor's "move this step to the model
//! reviewer", and enforcing a shadow rule.
//!
//! Invariants (each fails closed):
//! * Same-origin form posts only; the advisor's draft needs the manager or admin role and a
//!   tenant, enforcing a shadow rule the admin role.
//! * A draft is offered only where the advisor, recomputed now over the person's tenant,
//!   recommends the model reviewer and a draft can be made ([`super::draft_for`]); anything
//!   else is refused and nothing is filed.
//! * Nothing is applied here: each is filed as a registry proposal (audited by the store) that
//!   a second admin with the platform role approves, after reading its impact preview.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use countersign_core::bundle::BundleSources;
use countersign_core::bundle::edit::{demote_to_shadow, enforce_shadow, require_review};
use countersign_core::store::{
    BundleImport, Change, ProposalError, SettingChange, ToolSetting, apply_changes,
};
use countersign_core::{AppRole, Person};

use super::advice::Draft;
use super::{FullCheck, Views};
use crate::AppState;
use crate::auth::pages::{escape, page};
use crate::auth::{CurrentUser, same_origin};
use crate::http::admin::identity;

fn field<'a>(form: &'a [(String, String)], name: &str) -> &'a str {
    form.iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.trim())
}

fn refused(status: StatusCode, title: &str, why: &str) -> Response {
    page(status, title, &format!("<p>{}</p>", escape(why)), false)
}

fn cross_origin(state: &AppState, headers: &HeaderMap) -> bool {
    !same_origin(
        headers,
        &state.config.public_url.origin().ascii_serialization(),
    )
}

/// Files `sources` as a proposal by `person`; the page that says so.
async fn file(state: &AppState, person: &Person, sources: &BundleSources, note: &str) -> Response {
    match state
        .store
        .import_or_propose(sources, &identity(person), note)
        .await
    {
        Ok(BundleImport::Proposed(p)) => {
            tracing::info!(proposal = %p.id, sub = %person.sub, "proposal drafted");
            page(
                StatusCode::OK,
                "Proposal drafted",
                &format!(
                    "<p>Proposal <span class=\"font-mono\">{}</span> is filed: {}. Nothing \
                     changes until an admin reviews its impact preview on the admin page and a \
                     second admin approves it.</p><p><a class=\"underline\" href=\"/gates\">Back \
                     to the gate metrics</a></p>",
                    escape(&p.id),
                    escape(note)
                ),
                false,
            )
        }
        Ok(BundleImport::Unchanged(_) | BundleImport::Applied(_)) => refused(
            StatusCode::CONFLICT,
            "Nothing to draft",
            "The registry already says this.",
        ),
        Err(ProposalError::Store(e)) => {
            tracing::error!(error = %e, "drafting a proposal failed");
            refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "Not drafted",
                "The database did not answer. Nothing was filed; try again.",
            )
        }
        Err(e) => refused(StatusCode::CONFLICT, "Not drafted", &e.to_string()),
    }
}

async fn current_sources(state: &AppState) -> Result<BundleSources, Response> {
    match state.store.current_bundle().await {
        Ok(Some((_, sources))) => Ok(sources),
        Ok(None) => Err(refused(
            StatusCode::CONFLICT,
            "Not drafted",
            "There is no registry yet.",
        )),
        Err(e) => {
            tracing::error!(error = %e, "drafting: reading the registry failed");
            Err(refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "Not drafted",
                "The database did not answer.",
            ))
        }
    }
}

/// The bundle texts a draft proposes.
fn drafted(sources: &BundleSources, tool: &str, draft: &Draft) -> Result<BundleSources, String> {
    let gated = match draft {
        Draft::Demote(ids) => demote_to_shadow(sources, ids)?,
        Draft::GateToPolicy => apply_changes(
            sources,
            &[Change::Setting(SettingChange {
                tool: tool.to_string(),
                setting: ToolSetting::Gate,
                from: "always".into(),
                to: "policy".into(),
            })],
        )?,
    };
    require_review(&gated, tool)
}

/// `POST /gates/draft` (form: `tool`, `rule`): files the advisor's draft for that gate.
pub async fn draft(
    State(state): State<AppState>,
    CurrentUser(person): CurrentUser,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if cross_origin(&state, &headers) {
        return refused(
            StatusCode::FORBIDDEN,
            "Cross-origin request refused",
            "This request did not come from a Countersign page, so it was not carried out.",
        );
    }
    let allowed = [AppRole::Manager, AppRole::Admin]
        .iter()
        .any(|r| person.has_role(*r));
    let Some(tenant) = person.tenant.clone().filter(|t| allowed && !t.is_empty()) else {
        return refused(
            StatusCode::FORBIDDEN,
            "Not allowed",
            "Drafting a proposal from the gate advisor needs the manager or admin role.",
        );
    };
    let form: Vec<(String, String)> = url::form_urlencoded::parse(&body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let (tool, rule) = (field(&form, "tool"), field(&form, "rule"));
    let views = Views(state.clone(), FullCheck::default());
    let offered = match views.gate_metrics(&tenant, false).await {
        Ok(data) => data
            .advice
            .iter()
            .any(|r| r.tool == tool && r.rule == rule && r.draft.is_some()),
        Err(e) => {
            tracing::error!(error = %e, "drafting: reading the gates failed");
            return refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "Not drafted",
                "The database did not answer.",
            );
        }
    };
    let loaded = state.registry.current();
    let Some(draft) = loaded
        .as_ref()
        .and_then(|l| super::draft_for(&l.bundle, tool, rule))
        .filter(|_| offered)
    else {
        return refused(
            StatusCode::CONFLICT,
            "Not drafted",
            "The advisor does not recommend a change for this gate now.",
        );
    };
    let sources = match current_sources(&state).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match drafted(&sources, tool, &draft) {
        Ok(edited) => {
            let note = format!("gate advisor: {}", draft.words(tool));
            file(&state, &person, &edited, &note).await
        }
        Err(why) => refused(StatusCode::CONFLICT, "Not drafted", &why),
    }
}

/// `POST /admin/shadow/promote` (form: `id`): files a proposal that enforces shadow rule `id`.
pub async fn promote(
    State(state): State<AppState>,
    CurrentUser(person): CurrentUser,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if cross_origin(&state, &headers) {
        return refused(
            StatusCode::FORBIDDEN,
            "Cross-origin request refused",
            "This request did not come from a Countersign page, so it was not carried out.",
        );
    }
    if !person.has_role(AppRole::Admin) {
        return refused(
            StatusCode::FORBIDDEN,
            "Not allowed",
            "Proposing to enforce a shadow rule needs the admin role.",
        );
    }
    let form: Vec<(String, String)> = url::form_urlencoded::parse(&body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let id = field(&form, "id");
    let sources = match current_sources(&state).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match enforce_shadow(&sources, id) {
        Ok(edited) => {
            let note = format!("enforce shadow rule {id}");
            file(&state, &person, &edited, &note).await
        }
        Err(why) => refused(StatusCode::CONFLICT, "Not proposed", &why),
    }
}
