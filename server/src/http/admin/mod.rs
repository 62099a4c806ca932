//! The admin page's server side: the data behind `/admin` ([`countersign_app::admin`]) and
//! the HTML form endpoints that propose and review registry changes, create and revoke agent
//! credentials, and turn the emergency stop on and off.
//!
//! Invariants (each fails closed):
//! * Every endpoint here needs a live session holding the `admin` role ([`RequireRole`]:
//!   401 signed out, 403 otherwise) and a same-origin `Origin`/`Referer` (checked here and by
//!   the router's CSRF layer in front); a refused request changes nothing.
//! * A matrix change or a tool settings change (effect class, gate, approval settings) is
//!   only ever a proposal against the version the admin saw; it applies
//!   when a *different* admin holding the platform role approves it (the registry is every
//!   tenant's) and its base version is still current
//!   ([`Store::approve_proposal`]); then this server swaps the new version in at once (other
//!   replicas within [`crate::REGISTRY_POLL`]), so `tools/list` changes without a restart.
//! * Propose, approve, reject, supersede and a refused self-approval are audited (event
//!   `operational`, rule `admin.proposal.*`), as are the emergency stop and its lifting.
//! * An admin acts within their tenant: its credentials, its emergency stop. The stop for
//!   every tenant needs the platform role; a form naming no scope is refused.
//! * A new credential's token appears once, in the response to its creation, and is never
//!   stored; redirects carry fixed codes only, never free text.

mod forms;
pub use forms::{
    bind_agent, create_agent, decide, end_sessions, lift, propose, propose_settings, revoke_agent,
    stop,
};
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use countersign_app::admin::{
    Admin, AdminData, AdminSource, AgentRow, PreviewExample, PreviewView, ProposalRow, RoleCol,
    StopState, ToolRow, VersionRow,
};
use countersign_app::inbox::BoxFuture;
use countersign_core::store::{Change, ChangeOp, ProposalStatus, StopScope, ToolSetting};
use countersign_core::{AppRole, Gate, Person, Store, StoreError};

use crate::AppState;
use crate::auth::pages::page;
use crate::preview::{Preview, PreviewError};
use crate::stop::EMERGENCY_STOP;

/// How many proposals, versions the page lists.
const LIST_LIMIT: i64 = 50;

/// How many pending proposals (the newest) the page previews.
const MAX_PREVIEWS: usize = 5;

/// How many examples per transition the page shows.
const PREVIEW_EXAMPLES: usize = 3;

/// A preview as the page shows it (or why there is none).
fn preview_view(preview: Result<Preview, PreviewError>) -> PreviewView {
    let p = match preview {
        Ok(p) => p,
        Err(PreviewError::Store(e)) => {
            tracing::error!(error = %e, "admin: an impact preview failed");
            return PreviewView {
                error: Some("the database did not answer".into()),
                ..PreviewView::default()
            };
        }
        Err(e) => {
            return PreviewView {
                error: Some(e.to_string()),
                ..PreviewView::default()
            };
        }
    };
    let counts = |m: &std::collections::BTreeMap<String, usize>| {
        m.iter()
            .map(|(t, n)| format!("{t} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let r = p.report;
    PreviewView {
        days: p.days,
        scope: p
            .tenant
            .map_or_else(|| "every tenant".into(), |t| format!("tenant {t}")),
        replayed: r.replayed,
        changed: r.changed,
        approximate: r.approximate,
        rule_changed: r.rule_changed,
        transitions: r.transitions.into_iter().collect(),
        by_tool: r
            .by_tool
            .iter()
            .map(|(k, v)| (k.clone(), counts(v)))
            .collect(),
        by_rule: r
            .by_rule
            .iter()
            .map(|(k, v)| (k.clone(), counts(v)))
            .collect(),
        examples: r
            .examples
            .into_iter()
            .flat_map(|(transition, examples)| {
                examples
                    .into_iter()
                    .take(PREVIEW_EXAMPLES)
                    .map(move |e| PreviewExample {
                        transition: transition.clone(),
                        tool: e.tool,
                        rules: format!(
                            "{} → {}",
                            e.from_rule.as_deref().unwrap_or("no rule"),
                            e.to_rule.as_deref().unwrap_or("no rule")
                        ),
                        run_id: e.run_id.unwrap_or_default(),
                        record: e
                            .record
                            .map(|(chain, seq)| format!("{chain}#{seq}"))
                            .unwrap_or_default(),
                    })
            })
            .collect(),
        error: None,
    }
}

/// How long the page reuses a proposal's impact preview (while the version in force is the
/// same): a preview replays a month of calls, and the page is reloaded after every action.
const PREVIEW_TTL_MS: i64 = 60_000;

/// Previews by (proposal, scope): the version in force they were made against, when, and the
/// preview.
type PreviewCache = std::sync::Mutex<
    std::collections::HashMap<(String, Option<String>), (Option<i64>, i64, PreviewView)>,
>;

/// The store-backed [`AdminSource`].
pub struct AdminBackend(pub AppState, PreviewCache);

/// The context value the router provides to the dashboard.
pub fn context(state: &AppState) -> Admin {
    Admin(Arc::new(AdminBackend(
        state.clone(),
        PreviewCache::default(),
    )))
}

/// `iss#sub`: how a person is recorded on proposals.
pub fn identity(person: &Person) -> String {
    format!("{}#{}", person.iss, person.sub)
}

fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || "unknown time".into(),
        |t| t.format("%Y-%m-%d %H:%M UTC").to_string(),
    )
}

fn gate_text(g: Gate) -> &'static str {
    match g {
        Gate::Never => "never",
        Gate::Always => "always",
        Gate::Policy => "policy",
    }
}

impl AdminBackend {
    /// Proposal `p`'s impact preview over `scope`'s calls, reused for [`PREVIEW_TTL_MS`]
    /// while the version in force is unchanged.
    async fn preview(
        &self,
        p: &countersign_core::store::Proposal,
        scope: Option<&str>,
    ) -> PreviewView {
        let store = &self.0.store;
        let key = (p.id.clone(), scope.map(str::to_string));
        let (version, now) = (self.0.registry.version(), store.clock().now_ms());
        let cache = |c: &PreviewCache| {
            let mut held = c.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            held.retain(|_, (v, at, _)| *v == version && now - *at < PREVIEW_TTL_MS);
            held.get(&key).map(|(_, _, view)| view.clone())
        };
        if let Some(view) = cache(&self.1) {
            return view;
        }
        let view = preview_view(
            crate::preview::preview_changes(
                store,
                scope,
                Some(p.base_version),
                &p.changes,
                crate::preview::Window::Days(crate::preview::DEFAULT_DAYS),
            )
            .await,
        );
        if view.error.is_none() {
            self.1
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(key, (version, now, view.clone()));
        }
        view
    }

    async fn load(&self, person: &Person) -> Result<AdminData, StoreError> {
        let state = &self.0;
        let store = &state.store;
        let now = store.clock().now_ms();
        let loaded = state.registry.current();
        let (roles, tools) = match &loaded {
            Some(l) => {
                let reg = &l.bundle.registry;
                let roles: Vec<RoleCol> = reg
                    .roles()
                    .map(|r| RoleCol {
                        name: r.name.to_string(),
                        description: r.description.clone(),
                    })
                    .collect();
                let tools = reg
                    .tools()
                    .map(|t| {
                        let mut approval = Vec::new();
                        if let Some(a) = &t.approval {
                            let who: Vec<String> =
                                a.approver_roles.iter().map(ToString::to_string).collect();
                            approval.push(format!("approvers: {}", who.join(", ")));
                            approval.push(format!("expires after {}", a.expires));
                            if let Some(s) = a.step_up_max_age {
                                approval.push(format!("sign-in within {s}"));
                            }
                            if a.four_eyes {
                                approval.push("four eyes".into());
                            }
                            if let Some(n) = &a.second_approval_above {
                                approval.push(format!(
                                    "second approver above {}",
                                    threshold_text(n, &t.input_schema)
                                ));
                            }
                        }
                        ToolRow {
                            name: t.name.to_string(),
                            title: t.title.clone(),
                            effect: t.effect.as_str().to_string(),
                            gate: gate_text(t.gate).to_string(),
                            approval,
                            compensate: t.compensate.as_ref().map(ToString::to_string),
                            listed: reg.roles().map(|r| t.roles.contains(&r.name)).collect(),
                            settings: ToolSetting::ALL
                                .iter()
                                .filter(|s| !s.in_approval() || t.approval.is_some())
                                .map(|s| (s.key().to_string(), s.value_of(t)))
                                .collect(),
                        }
                    })
                    .collect();
                (roles, tools)
            }
            None => (Vec::new(), Vec::new()),
        };
        let me = identity(person);
        // The platform's view of a change to every tenant's registry; a tenant admin's
        // preview reads their own tenant's calls only.
        let scope = (!person.has_role(AppRole::PlatformAdmin))
            .then(|| person.tenant.clone().unwrap_or_default());
        let listed = store.list_proposals(LIST_LIMIT).await?;
        let mut previews = std::collections::HashMap::new();
        for p in listed
            .iter()
            .filter(|p| p.status == ProposalStatus::Proposed)
            .take(MAX_PREVIEWS)
        {
            previews.insert(p.id.clone(), self.preview(p, scope.as_deref()).await);
        }
        let proposals = listed
            .into_iter()
            .map(|p| ProposalRow {
                preview: previews.remove(&p.id),
                mine: p.proposer == me,
                decision: p.decided_by.as_ref().map(|by| {
                    format!(
                        "{} by {by} at {}{}",
                        p.status.as_str(),
                        p.decided_at.map(utc).unwrap_or_default(),
                        p.decision_reason
                            .as_deref()
                            .filter(|r| !r.is_empty())
                            .map(|r| format!(": {r}"))
                            .unwrap_or_default()
                    )
                }),
                id: p.id,
                proposer: p.proposer_name,
                created: utc(p.created_at),
                base_version: p.base_version,
                changes: p.changes.iter().flat_map(diff_lines).collect(),
                note: p.note,
                status: p.status.as_str().to_string(),
                applied_version: p.applied_version,
            })
            .collect();
        let versions = store
            .registry_versions(LIST_LIMIT)
            .await?
            .into_iter()
            .map(|v| VersionRow {
                version: v.version,
                created_by: v.created_by,
                created: utc(v.created_at),
                diff: v.diff.lines().map(str::to_owned).collect(),
            })
            .collect();
        // Credentials are per tenant: an admin sees (and manages) their own tenant's only.
        let tasks: std::collections::HashMap<String, String> = match person.tenant.as_deref() {
            Some(t) => store
                .list_runs(t, RUN_TASKS)
                .await?
                .into_iter()
                .map(|r| (r.id, r.task))
                .collect(),
            None => std::collections::HashMap::new(),
        };
        let agents = store
            .list_agents()
            .await?
            .into_iter()
            .filter(|a| person.tenant.as_ref() == Some(&a.tenant))
            .map(|a| AgentRow {
                state: match (a.revoked_at, a.expires_at) {
                    (Some(_), _) => "revoked",
                    (None, Some(t)) if t <= now => "expired",
                    (None, _) => "active",
                }
                .to_string(),
                id: a.id,
                name: a.name,
                role: a.role,
                tenant: a.tenant,
                created_by: a.created_by,
                created: utc(a.created_at),
                acts_for: a.acts_for.unwrap_or_default(),
                origin: a.origin,
                run_task: a
                    .run_id
                    .as_ref()
                    .map(|r| {
                        tasks
                            .get(r)
                            .cloned()
                            .unwrap_or_else(|| r.chars().take(8).collect())
                    })
                    .unwrap_or_default(),
                run_id: a.run_id.unwrap_or_default(),
            })
            .collect();
        let stop = stop_state(store, &StopScope::Platform).await?;
        let tenant_stop = match &person.tenant {
            Some(t) => stop_state(store, &StopScope::Tenant(t.clone())).await?,
            None => None,
        };
        Ok(AdminData {
            me: person.name.clone(),
            tenant: person.tenant.clone().unwrap_or_default(),
            version: loaded.as_ref().map(|l| l.version),
            roles,
            tools,
            proposals,
            versions,
            agents,
            stop,
            tenant_stop,
            platform: person.has_role(AppRole::PlatformAdmin),
        })
    }
}

/// How the page's diff view shows one change: its sign and its words.
/// The stop of `scope` while it is on, with how many credentials it revoked.
async fn stop_state(store: &Store, scope: &StopScope) -> Result<Option<StopState>, StoreError> {
    let switch = scope.switch(EMERGENCY_STOP);
    let Some((reason, by, at)) = store.switch_detail(&switch).await? else {
        return Ok(None);
    };
    Ok(Some(StopState {
        reason,
        by,
        since: utc(at),
        revoked: store.stop_revocations(&switch).await?.len(),
    }))
}

/// A stop or lift form's scope ([`stop_scope`]) and its required reason; otherwise the error
/// code to answer with.
fn stop_form(
    person: &Person,
    form: &[(String, String)],
) -> Result<(StopScope, String), &'static str> {
    let scope = stop_scope(person, form)?;
    let reason = field(form, "reason").trim().to_string();
    if reason.is_empty() {
        return Err("reason");
    }
    Ok((scope, reason))
}

/// The stop a form names (`scope` = `tenant`, the admin's own, or `platform`, every tenant:
/// a platform admin's only); otherwise the error code to answer with.
fn stop_scope(person: &Person, form: &[(String, String)]) -> Result<StopScope, &'static str> {
    match field(form, "scope") {
        "platform" if person.has_role(AppRole::PlatformAdmin) => Ok(StopScope::Platform),
        "platform" => Err("platform"),
        "tenant" => match person.tenant.as_deref().map(str::trim) {
            Some(t) if !t.is_empty() => Ok(StopScope::Tenant(t.to_string())),
            _ => Err("scope"),
        },
        _ => Err("scope"),
    }
}

/// A change's lines in the proposal's diff view: one, or for a whole bundle its digest and
/// then each line of its summary.
fn diff_lines(change: &Change) -> Vec<(char, String)> {
    let words = match change {
        Change::Listing(c) => match c.op {
            ChangeOp::Add => format!("+ {} for {}", c.tool, c.role),
            ChangeOp::Remove => format!("- {} no longer for {}", c.tool, c.role),
        },
        Change::Setting(c) => c.to_string(),
        Change::Bundle(b) => {
            let mut lines = vec![(
                '~',
                format!(
                    "~ the whole bundle, from `registry import` (sha256 {})",
                    b.sha256
                ),
            )];
            lines.extend(b.summary.lines().map(|l| {
                let sign = l
                    .chars()
                    .next()
                    .filter(|c| "+-~".contains(*c))
                    .unwrap_or('~');
                (sign, l.to_string())
            }));
            return lines;
        }
    };
    vec![(change.sign(), words)]
}

impl AdminSource for AdminBackend {
    fn overview<'a>(&'a self, person: &'a Person) -> BoxFuture<'a, Result<AdminData, String>> {
        Box::pin(async move {
            self.load(person).await.map_err(|e| {
                tracing::error!(error = %e, "admin: loading the page failed");
                "the database did not answer".to_string()
            })
        })
    }
}

/// The form's fields, every value of repeated names kept in order.
pub(crate) fn fields(body: &Bytes) -> Vec<(String, String)> {
    url::form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// The first value of field `name` (empty when absent).
pub(crate) fn field<'a>(fields: &'a [(String, String)], name: &str) -> &'a str {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

fn back(done: Option<&str>, error: Option<&str>) -> Response {
    coded_redirect("/admin", done, error)
}

/// A redirect to `page` carrying a fixed `?error=` code, else a fixed `?done=` code (never
/// free text: the page shows only the sentences of codes it knows).
/// How many of a tenant's newest runs the admin page names execution credentials by.
const RUN_TASKS: i64 = 500;

pub(crate) fn coded_redirect(page: &str, done: Option<&str>, error: Option<&str>) -> Response {
    let target = match (done, error) {
        (_, Some(e)) => format!("{page}?error={e}"),
        (Some(d), None) => format!("{page}?done={d}"),
        (None, None) => page.to_string(),
    };
    Redirect::to(&target).into_response()
}

/// The explicit origin check every endpoint here repeats (the CSRF layer runs first); the
/// metrics page's forms (`views::drafts`) use it too.
pub(crate) fn cross_origin(state: &AppState, headers: &HeaderMap) -> Option<Response> {
    (!crate::auth::own_origin(state, headers)).then(|| {
        page(
            StatusCode::FORBIDDEN,
            "Cross-origin request refused",
            "This request did not come from a Countersign page, so it was not carried out.",
            false,
        )
    })
}

/// A tool's second-approval threshold as an amount with its currency: the one currency the
/// tool's `currency` argument allows (`10,000.00 EUR`), or "in the call's currency" when its
/// schema allows several (or names none).
fn threshold_text(threshold: &serde_json::Number, input_schema: &serde_json::Value) -> String {
    let currencies = input_schema
        .pointer("/properties/currency/enum")
        .and_then(serde_json::Value::as_array)
        .map(|v| {
            v.iter()
                .filter_map(serde_json::Value::as_str)
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let one = match currencies.as_slice() {
        [only] => Some(*only),
        _ => None,
    };
    match threshold
        .as_f64()
        .and_then(|a| countersign_app::inbox::format_amount(a, one))
    {
        Some(text) if one.is_some() => text,
        Some(text) => format!("{text} in the call's currency"),
        None => threshold.to_string(),
    }
}
