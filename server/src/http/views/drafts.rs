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
//!   a second admin with the platform role approves, after reading its impact preview. A
//!   manager may file the advisor's draft (and only that): its note names the tenant whose
//!   evidence it rests on, since the registry is every tenant's.
//! * Each answers with a redirect carrying a fixed code, never free text (a reload files
//!   nothing twice: the page it lands on is a GET).

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
use crate::auth::CurrentUser;
use crate::auth::pages::{escape, page};
use crate::http::admin::{coded_redirect, cross_origin, field, fields, identity};

fn refused(status: StatusCode, title: &str, why: &str) -> Response {
    page(status, title, &format!("<p>{}</p>", escape(why)), false)
}

/// Where the draft form goes back to.
const GATES: &str = "/gates";

/// Where the promote form goes back to.
const ADMIN: &str = "/admin";

/// Back to `page` with a fixed code.
fn back(page: &str, done: Option<&str>, error: Option<&str>) -> Response {
    coded_redirect(page, done, error)
}

/// Files `sources` as a proposal by `person` with `note`; back to `page` with `done`, or
/// with the refusal's code.
async fn file(
    state: &AppState,
    person: &Person,
    sources: &BundleSources,
    note: &str,
    (page, done): (&str, &str),
) -> Response {
    match state
        .store
        .import_or_propose(sources, &identity(person), note)
        .await
    {
        Ok(BundleImport::Proposed(p)) => {
            tracing::info!(proposal = %p.id, sub = %person.sub, "proposal drafted");
            back(page, Some(done), None)
        }
        Ok(BundleImport::Unchanged(_) | BundleImport::Applied(_)) => {
            back(page, None, Some("no_change"))
        }
        Err(ProposalError::Store(e)) => {
            tracing::error!(error = %e, "drafting a proposal failed");
            back(page, None, Some("unavailable"))
        }
        Err(ProposalError::Stale { .. }) => back(page, None, Some("stale")),
        Err(e) => {
            tracing::info!(error = %e, "a drafted proposal was refused");
            back(page, None, Some("invalid"))
        }
    }
}

async fn current_sources(state: &AppState, page: &str) -> Result<BundleSources, Response> {
    match state.store.current_bundle().await {
        Ok(Some((_, sources))) => Ok(sources),
        Ok(None) => Err(back(page, None, Some("invalid"))),
        Err(e) => {
            tracing::error!(error = %e, "drafting: reading the registry failed");
            Err(back(page, None, Some("unavailable")))
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
    if let Some(refusal) = cross_origin(&state, &headers) {
        return refusal;
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
    let form = fields(&body);
    let (tool, rule) = (field(&form, "tool").trim(), field(&form, "rule").trim());
    let views = Views(state.clone(), FullCheck::default());
    let offered = match views.gate_advice(&tenant).await {
        Ok(advice) => advice
            .iter()
            .any(|r| r.tool == tool && r.rule == rule && r.draft.is_some()),
        Err(e) => {
            tracing::error!(error = %e, "drafting: reading the gates failed");
            return back(GATES, None, Some("unavailable"));
        }
    };
    let loaded = state.registry.current();
    let Some(draft) = loaded
        .as_ref()
        .and_then(|l| super::draft_for(&l.bundle, tool, rule))
        .filter(|_| offered)
    else {
        return back(GATES, None, Some("not_offered"));
    };
    let sources = match current_sources(&state, GATES).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match drafted(&sources, tool, &draft) {
        Ok(edited) => {
            // Drafted from one tenant's evidence, for the registry every tenant shares: said so.
            let note = format!(
                "gate advisor, on tenant {tenant}'s last {} days: {}",
                countersign_app::metrics::WINDOW_DAYS,
                draft.words(tool)
            );
            file(&state, &person, &edited, &note, (GATES, "drafted")).await
        }
        Err(why) => {
            tracing::info!(%why, "the advisor's draft could not be made");
            back(GATES, None, Some("not_offered"))
        }
    }
}

/// `POST /admin/shadow/promote` (form: `id`): files a proposal that enforces shadow rule `id`.
pub async fn promote(
    State(state): State<AppState>,
    CurrentUser(person): CurrentUser,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refusal) = cross_origin(&state, &headers) {
        return refusal;
    }
    if !person.has_role(AppRole::Admin) {
        return refused(
            StatusCode::FORBIDDEN,
            "Not allowed",
            "Proposing to enforce a shadow rule needs the admin role.",
        );
    }
    let form = fields(&body);
    let id = field(&form, "id").trim();
    let sources = match current_sources(&state, ADMIN).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match enforce_shadow(&sources, id) {
        Ok(edited) => {
            let note = format!("enforce shadow rule {id}");
            file(&state, &person, &edited, &note, (ADMIN, "proposed")).await
        }
        Err(why) => {
            tracing::info!(%why, "enforcing a shadow rule: not proposed");
            back(ADMIN, None, Some("not_shadow"))
        }
    }
}
