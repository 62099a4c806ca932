//! The admin page's forms: registry proposals and their decisions, agent credentials, the
//! emergency stop and ending a person's sessions. Each handler checks the admin role and the
//! request's origin itself (see the module doc of `super`), and changes nothing but through the
//! store's audited operations.

use super::{back, cross_origin, field, fields, identity, stop_form};
use crate::AppState;
use crate::auth::pages::{escape, page};
use crate::auth::{Admin as AdminRole, RequireRole};
use crate::stop::{self};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use countersign_core::policy::TaskOrigin;
use countersign_core::registry::Span;
use countersign_core::store::{
    ApproveOutcome, Change, ChangeOp, CreateAgentError, ListingChange, NewAgent, NewProposal,
    ProposalError, SettingChange, ToolSetting,
};
use countersign_core::{AppRole, Person, RoleName, StoreError};
use std::collections::BTreeSet;

/// The listing changes that turn `current` into `wanted` (pairs of role, tool).
pub fn listing_changes(
    current: &BTreeSet<(String, String)>,
    wanted: &BTreeSet<(String, String)>,
) -> Vec<ListingChange> {
    let added = wanted
        .difference(current)
        .map(|(role, tool)| ListingChange {
            tool: tool.clone(),
            role: role.clone(),
            op: ChangeOp::Add,
        });
    let removed = current
        .difference(wanted)
        .map(|(role, tool)| ListingChange {
            tool: tool.clone(),
            role: role.clone(),
            op: ChangeOp::Remove,
        });
    let mut all: Vec<ListingChange> = added.chain(removed).collect();
    all.sort();
    all
}

/// What every proposal form starts from: its required `note`, and the registry of version
/// `base` — which must still be the version in force (else the form is stale).
pub(super) async fn proposal_base(
    state: &AppState,
    form: &[(String, String)],
) -> Result<(i64, String, countersign_core::Registry), Response> {
    let note = field(form, "note").trim().to_string();
    if note.is_empty() {
        return Err(back(None, Some("note")));
    }
    let Ok(base) = field(form, "base").parse::<i64>() else {
        return Err(back(None, Some("stale")));
    };
    let current = match state.store.current_bundle().await {
        Ok(Some((v, sources))) if v == base => sources,
        Ok(_) => return Err(back(None, Some("stale"))),
        Err(e) => {
            tracing::error!(error = %e, "admin: reading the registry failed");
            return Err(back(None, Some("unavailable")));
        }
    };
    let Ok(registry) = countersign_core::Registry::from_sources(&current.registry_sources()) else {
        return Err(back(None, Some("invalid")));
    };
    Ok((base, note, registry))
}

/// `POST /admin/proposals` (form: `base`, `note`, `cell=role|tool` for every ticked box):
/// proposes the difference between the ticked matrix and version `base`.
pub async fn propose(
    State(state): State<AppState>,
    admin: RequireRole<AdminRole>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = cross_origin(&state, &headers) {
        return refused;
    }
    let person = admin.0;
    let form = fields(&body);
    let (base, note, registry) = match proposal_base(&state, &form).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    let listed: BTreeSet<(String, String)> = registry
        .listing()
        .iter()
        .flat_map(|(role, tools)| tools.iter().map(move |t| (role.to_string(), t.to_string())))
        .collect();
    let wanted: BTreeSet<(String, String)> = form
        .iter()
        .filter(|(k, _)| k == "cell")
        .filter_map(|(_, v)| v.split_once('|'))
        .map(|(role, tool)| (role.to_string(), tool.to_string()))
        .collect();
    let changes = listing_changes(&listed, &wanted);
    if changes.is_empty() {
        return back(None, Some("no_change"));
    }
    let changes = changes.into_iter().map(Change::from).collect();
    propose_changes(&state, &person, base, changes, &note).await
}

/// The setting changes that turn `tool`'s settings in force into the form's values: one per
/// setting whose field is present and differs. Approval settings of a tool without
/// approval settings are not offered, so their fields are ignored.
pub fn setting_changes(
    tool: &countersign_core::registry::Tool,
    form: &[(String, String)],
) -> Vec<SettingChange> {
    ToolSetting::ALL
        .iter()
        .filter(|s| !s.in_approval() || tool.approval.is_some())
        .filter_map(|s| {
            let (_, wanted) = form.iter().find(|(k, _)| k == s.key())?;
            let wanted = wanted.trim();
            let current = s.value_of(tool);
            (wanted != current).then(|| SettingChange {
                tool: tool.name.to_string(),
                setting: *s,
                from: current,
                to: wanted.to_string(),
            })
        })
        .collect()
}

/// `POST /admin/tools/settings` (form: `base`, `tool`, `note`, and a field per setting,
/// named by [`ToolSetting::key`]): proposes the settings that differ from version `base`.
pub async fn propose_settings(
    State(state): State<AppState>,
    admin: RequireRole<AdminRole>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = cross_origin(&state, &headers) {
        return refused;
    }
    let person = admin.0;
    let form = fields(&body);
    let (base, note, registry) = match proposal_base(&state, &form).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    let Some(tool) = countersign_core::ToolName::parse(field(&form, "tool"))
        .ok()
        .and_then(|t| registry.tool(&t))
    else {
        return back(None, Some("not_found"));
    };
    let changes = setting_changes(tool, &form);
    if changes.is_empty() {
        return back(None, Some("no_change"));
    }
    let changes = changes.into_iter().map(Change::from).collect();
    propose_changes(&state, &person, base, changes, &note).await
}

/// Proposes `changes` against `base` as `person`; the redirect says how it went.
pub async fn propose_changes(
    state: &AppState,
    person: &Person,
    base: i64,
    changes: Vec<Change>,
    note: &str,
) -> Response {
    let result = state
        .store
        .propose(&NewProposal {
            proposer: identity(person),
            proposer_name: person.name.clone(),
            base_version: base,
            changes,
            note: note.to_string(),
        })
        .await;
    match result {
        Ok(p) => {
            tracing::info!(proposal = %p.id, sub = %person.sub, "registry change proposed");
            back(Some("proposed"), None)
        }
        Err(ProposalError::Stale { .. }) => back(None, Some("stale")),
        Err(ProposalError::Invalid(why)) => {
            tracing::info!(%why, "admin: proposal refused");
            back(None, Some("invalid"))
        }
        Err(ProposalError::NotFound) => back(None, Some("not_found")),
        Err(ProposalError::Store(e)) => {
            tracing::error!(error = %e, "admin: storing a proposal failed");
            back(None, Some("unavailable"))
        }
    }
}

/// `POST /admin/proposals/{id}/decision` (form: `verdict` = `approve` | `reject`, `reason`,
/// required to reject).
pub async fn decide(
    State(state): State<AppState>,
    admin: RequireRole<AdminRole>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = cross_origin(&state, &headers) {
        return refused;
    }
    let person = admin.0;
    let me = identity(&person);
    let form = fields(&body);
    let reason = field(&form, "reason").trim().to_string();
    let failed = |e: ProposalError| match e {
        ProposalError::NotFound => back(None, Some("not_found")),
        ProposalError::Stale { .. } => back(Some("superseded"), None),
        ProposalError::Invalid(why) => {
            tracing::warn!(%why, "admin: a proposal no longer applies");
            back(None, Some("invalid"))
        }
        ProposalError::Store(e) => {
            tracing::error!(error = %e, "admin: deciding a proposal failed");
            back(None, Some("unavailable"))
        }
    };
    match field(&form, "verdict") {
        // The registry is every tenant's: only a platform admin applies a change to it.
        "approve" => match state
            .store
            .approve_proposal(&id, &me, &reason, person.has_role(AppRole::PlatformAdmin))
            .await
        {
            Ok(ApproveOutcome::Applied { version }) => {
                // In force here at once; other replicas pick it up on their next poll.
                state.registry.refresh(&state.store).await;
                tracing::info!(proposal = %id, version, sub = %person.sub, "registry change approved");
                back(Some("approved"), None)
            }
            Ok(ApproveOutcome::Superseded { .. }) => back(Some("superseded"), None),
            Ok(ApproveOutcome::OwnProposal) => back(None, Some("own")),
            Ok(ApproveOutcome::NotPlatform) => back(None, Some("platform")),
            Ok(ApproveOutcome::NotPending(_)) => back(None, Some("not_pending")),
            Err(e) => failed(e),
        },
        "reject" => {
            if reason.is_empty() {
                return back(None, Some("reason"));
            }
            match state.store.reject_proposal(&id, &me, &reason).await {
                Ok(Ok(_)) => back(Some("rejected"), None),
                Ok(Err(_)) => back(None, Some("not_pending")),
                Err(e) => failed(e),
            }
        }
        _ => back(None, Some("verdict")),
    }
}

/// `POST /admin/agents` (form: `name`, `role`, `tenant`, optional `expires` like `30d`):
/// creates a credential and shows its token once; with `oauth_issuer` (one of
/// `agent_oauth_issuers`) and `oauth_client`, registers that OAuth client instead.
pub async fn create_agent(
    State(state): State<AppState>,
    admin: RequireRole<AdminRole>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = cross_origin(&state, &headers) {
        return refused;
    }
    let person = admin.0;
    let form = fields(&body);
    let role = field(&form, "role").trim().to_string();
    let known = state.registry.current().is_some_and(|l| {
        RoleName::parse(&role)
            .ok()
            .is_some_and(|r| l.bundle.registry.role(&r).is_some())
    });
    if !known {
        return back(None, Some("agent"));
    }
    // An admin creates credentials in their own tenant only.
    let tenant = match (field(&form, "tenant").trim(), &person.tenant) {
        ("", Some(mine)) => mine.clone(),
        (t, Some(mine)) if t == mine => t.to_string(),
        _ => return back(None, Some("agent")),
    };
    let expires_at = match field(&form, "expires").trim() {
        "" => None,
        text => match Span::parse(text) {
            Ok(span) => Some(state.store.clock().now_ms() + span.to_chrono().num_milliseconds()),
            Err(_) => return back(None, Some("agent")),
        },
    };
    let Some((acts_for, origin)) = binding_fields(&form) else {
        return back(None, Some("agent"));
    };
    let new = NewAgent {
        name: field(&form, "name").trim().to_string(),
        role,
        tenant,
        created_by: format!("person:{}", identity(&person)),
        expires_at,
        acts_for,
        origin,
    };
    let (issuer, client) = (
        field(&form, "oauth_issuer").trim(),
        field(&form, "oauth_client").trim(),
    );
    if !issuer.is_empty() || !client.is_empty() {
        return register_oauth_client(&state, &person, &new, issuer, client).await;
    }
    let created = state.store.create_agent(&new).await;
    match created {
        Ok((cred, token)) => {
            tracing::info!(credential = %cred.id, sub = %person.sub, "agent credential created");
            page(
                StatusCode::OK,
                "Agent credential created",
                &format!(
                    "<p>Credential <strong>{name}</strong> (role <code>{role}</code>, tenant \
                     {tenant}) was created. Its token is shown <strong>once</strong>; it is not \
                     stored and cannot be shown again. Copy it into the agent's secret store \
                     now.</p><p><label for=\"token\">Token</label><br>\
                     <input id=\"token\" data-testid=\"agent-token\" readonly size=\"60\" \
                     value=\"{token}\"></p><p><a href=\"/admin\">Back to admin</a></p>",
                    name = escape(&cred.name),
                    role = escape(&cred.role),
                    tenant = escape(&cred.tenant),
                    token = escape(token.reveal()),
                ),
                state.auth.demo(),
            )
        }
        Err(e) => {
            tracing::info!(error = %e, "admin: credential refused");
            back(None, Some("agent"))
        }
    }
}

/// Registers OAuth client `client` of `issuer` (a configured issuer) as the agent `new`.
async fn register_oauth_client(
    state: &AppState,
    person: &Person,
    new: &NewAgent,
    issuer: &str,
    client: &str,
) -> Response {
    let trusted = state
        .config
        .agent_auth
        .oauth_issuers
        .iter()
        .any(|i| i == issuer);
    if !trusted || client.is_empty() {
        return back(None, Some("agent"));
    }
    match state.store.register_oauth_agent(new, issuer, client).await {
        Ok(cred) => {
            tracing::info!(credential = %cred.id, sub = %person.sub, "OAuth client registered");
            page(
                StatusCode::OK,
                "OAuth client registered",
                &format!(
                    "<p>Client <code>{client}</code> of <code>{issuer}</code> is now agent \
                     <strong>{name}</strong> (role <code>{role}</code>, tenant {tenant}). It \
                     presents that authorization server's access tokens for this server's \
                     <code>/mcp</code>; no token is shown here.</p>\
                     <p><a href=\"/admin\">Back to admin</a></p>",
                    client = escape(client),
                    issuer = escape(issuer),
                    name = escape(&cred.name),
                    role = escape(&cred.role),
                    tenant = escape(&cred.tenant),
                ),
                state.auth.demo(),
            )
        }
        Err(e) => {
            tracing::info!(error = %e, "admin: OAuth registration refused");
            back(None, Some("agent"))
        }
    }
}

/// A form's `acts_for` (empty: nobody) and `origin` (empty: `user`); `None` for an origin
/// that is not one.
pub(super) fn binding_fields(form: &[(String, String)]) -> Option<(Option<String>, TaskOrigin)> {
    let acts_for = Some(field(form, "acts_for").trim())
        .filter(|p| !p.is_empty())
        .map(str::to_string);
    let origin = match field(form, "origin").trim() {
        "" => TaskOrigin::User,
        text => TaskOrigin::parse(text)?,
    };
    Some((acts_for, origin))
}

/// `None` when credential `id` is of `admin`'s tenant; otherwise the answer: another
/// tenant's credential does not exist for this admin.
pub(super) async fn own_tenants_agent(
    state: &AppState,
    admin: &Person,
    id: &str,
) -> Option<Response> {
    match state.store.get_agent(id).await {
        Ok(cred) if admin.tenant.as_ref() == Some(&cred.tenant) => None,
        Ok(_) | Err(StoreError::NotFound) => Some(back(None, Some("not_found"))),
        Err(e) => {
            tracing::error!(error = %e, "admin: reading the credential failed");
            Some(back(None, Some("unavailable")))
        }
    }
}

/// `POST /admin/agents/{id}/binding` (form: `acts_for`, empty to unbind; `origin`): who the
/// credential's calls are made for and where its tasks come from, audited (`agent.bound`).
/// Also the API for scripts: a same-origin form post with an admin session.
pub async fn bind_agent(
    State(state): State<AppState>,
    admin: RequireRole<AdminRole>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = cross_origin(&state, &headers) {
        return refused;
    }
    if let Some(refused) = own_tenants_agent(&state, &admin.0, &id).await {
        return refused;
    }
    let Some((acts_for, origin)) = binding_fields(&fields(&body)) else {
        return back(None, Some("binding"));
    };
    let by = format!("person:{}", identity(&admin.0));
    match state
        .store
        .bind_agent(&id, acts_for.as_deref(), origin, &by)
        .await
    {
        Ok(cred) => {
            tracing::info!(credential = %cred.id, sub = %admin.0.sub, "agent credential bound");
            back(Some("bound"), None)
        }
        Err(CreateAgentError::Store(e)) => {
            tracing::error!(error = %e, "admin: binding failed");
            back(None, Some("unavailable"))
        }
        Err(e) => {
            tracing::info!(error = %e, "admin: binding refused");
            back(None, Some("binding"))
        }
    }
}

/// `POST /admin/agents/{id}/revoke`.
pub async fn revoke_agent(
    State(state): State<AppState>,
    admin: RequireRole<AdminRole>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = cross_origin(&state, &headers) {
        return refused;
    }
    if let Some(refused) = own_tenants_agent(&state, &admin.0, &id).await {
        return refused;
    }
    let by = format!("person:{}", identity(&admin.0));
    match state.store.revoke_agent(&id, &by).await {
        Ok(cred) => {
            tracing::info!(credential = %cred.id, sub = %admin.0.sub, "agent credential revoked");
            back(Some("revoked"), None)
        }
        Err(StoreError::NotFound) => back(None, Some("not_found")),
        Err(e) => {
            tracing::error!(error = %e, "admin: revoking failed");
            back(None, Some("unavailable"))
        }
    }
}

/// `POST /admin/sessions/end` (form: `person` = `ISS#SUB`): ends every session of that person
/// signed in for the admin's tenant, effective at their next request (audited), as
/// `countersign end-sessions --tenant T`.
pub async fn end_sessions(
    State(state): State<AppState>,
    admin: RequireRole<AdminRole>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = cross_origin(&state, &headers) {
        return refused;
    }
    let form = fields(&body);
    let person = field(&form, "person").trim();
    // An issuer URL holds no `#`; a subject may.
    let Some((iss, sub)) = person
        .strip_prefix("person:")
        .unwrap_or(person)
        .split_once('#')
        .filter(|(iss, sub)| !iss.is_empty() && !sub.is_empty())
    else {
        return back(None, Some("person"));
    };
    let Some(tenant) = admin.0.tenant.as_deref().filter(|t| !t.is_empty()) else {
        return back(None, Some("scope"));
    };
    let by = format!("person:{}", identity(&admin.0));
    match crate::auth::sessions::end_sessions(
        &state.store,
        &crate::auth::sessions::Which {
            iss,
            sub: Some(sub),
            tenant: Some(tenant),
            sid: None,
            signed_in_by: None,
        },
        &by,
    )
    .await
    {
        Ok(n) => {
            tracing::info!(%by, person = %format!("{iss}#{sub}"), sessions = n, "sessions ended");
            back(Some("sessions_ended"), None)
        }
        Err(e) => {
            tracing::error!(error = %e, "admin: ending sessions failed");
            back(None, Some("unavailable"))
        }
    }
}

/// `POST /admin/stop` (form: `scope` = `tenant` | `platform`, `reason`): the emergency stop
/// of the admin's tenant, or of every tenant (a platform admin's), exactly as `countersign
/// stop [--tenant T]`.
pub async fn stop(
    State(state): State<AppState>,
    admin: RequireRole<AdminRole>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = cross_origin(&state, &headers) {
        return refused;
    }
    let form = fields(&body);
    let (scope, reason) = match stop_form(&admin.0, &form) {
        Ok(s) => s,
        Err(code) => return back(None, Some(code)),
    };
    let by = format!("person:{}", identity(&admin.0));
    match stop::emergency_stop(&state, &scope, &by, &reason).await {
        Ok(n) => {
            tracing::warn!(%by, runs = n, ?scope, "emergency stop on");
            back(Some("stopped"), None)
        }
        Err(e) => {
            tracing::error!(error = %e, "admin: emergency stop failed");
            back(None, Some("unavailable"))
        }
    }
}

/// `POST /admin/stop/lift` (form: `scope`, `reason`, `restore` = `1` to restore the
/// credentials the stop revoked): lifts that stop, as `countersign stop --lift [--tenant T]
/// [--restore]`.
pub async fn lift(
    State(state): State<AppState>,
    admin: RequireRole<AdminRole>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = cross_origin(&state, &headers) {
        return refused;
    }
    let form = fields(&body);
    let (scope, reason) = match stop_form(&admin.0, &form) {
        Ok(s) => s,
        Err(code) => return back(None, Some(code)),
    };
    let restore = field(&form, "restore") == "1";
    let by = format!("person:{}", identity(&admin.0));
    match stop::lift_emergency_stop(&state, &scope, &by, &reason, restore).await {
        Ok(_) => back(Some("lifted"), None),
        Err(e) => {
            tracing::error!(error = %e, "admin: lifting the emergency stop failed");
            back(None, Some("unavailable"))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::threshold_text;

    use super::*;

    fn set(pairs: &[(&str, &str)]) -> BTreeSet<(String, String)> {
        pairs
            .iter()
            .map(|(r, t)| ((*r).to_string(), (*t).to_string()))
            .collect()
    }

    #[test]
    fn listing_changes_are_the_two_set_differences_sorted() {
        let current = set(&[("planner", "invoice.get"), ("reviewer", "invoice.get")]);
        let wanted = set(&[("planner", "invoice.get"), ("planner", "po.get")]);
        let changes = listing_changes(&current, &wanted);
        assert_eq!(
            changes.iter().map(ToString::to_string).collect::<Vec<_>>(),
            vec![
                "- invoice.get no longer for role reviewer",
                "+ po.get for role planner",
            ]
        );
        assert!(listing_changes(&current, &current).is_empty());
    }

    #[test]
    fn thresholds_carry_the_one_currency_the_schema_allows() {
        let n = serde_json::Number::from(10_000);
        let eur = serde_json::json!({"properties": {"currency": {"enum": ["EUR"]}}});
        assert_eq!(threshold_text(&n, &eur), "10,000.00 EUR");
        let two = serde_json::json!({"properties": {"currency": {"enum": ["EUR", "USD"]}}});
        assert_eq!(threshold_text(&n, &two), "10,000.00 in the call's currency");
        assert_eq!(
            threshold_text(&n, &serde_json::json!({})),
            "10,000.00 in the call's currency"
        );
    }
}
