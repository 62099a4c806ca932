//! The admin page (`/admin`): the role × tool matrix with each tool's effect class and gate
//! settings (each editable as a proposal), registry change proposals and their review, registry versions with their diffs,
//! agent credentials, and the emergency stop.
//!
//! Invariants:
//! * [`load_admin`] returns data only to a signed-in person holding the `admin` role;
//!   everyone else gets [`AdminView::NotAdmin`] and nothing else (the page answers 403).
//! * Nothing changes here: every form posts to a server endpoint (`/admin/...`) that checks
//!   the admin role and the request's origin itself, behind the router's CSRF origin check.
//!   A change to the matrix or to a tool's settings is only ever a proposal; a second admin
//!   approves it.
//! * Messages shown after an action come from fixed codes ([`notice_text`], [`error_text`]);
//!   no text from the query string is ever shown.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

mod messages;
mod proposals;
mod stop;
mod style;
pub use messages::{error_text, notice_text};
use proposals::Proposals;
pub use proposals::{PreviewExample, PreviewView, ProposalRow, proposal_name};
pub use stop::StopState;
use stop::{EndSessions, StopSwitch};
use style::{BUTTON, CARD, H2, INPUT};

/// A registry (agent) role: one column of the matrix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleCol {
    /// Name.
    pub name: String,
    /// What the role is for.
    pub description: String,
}

/// One tool: a row of the matrix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolRow {
    /// Name.
    pub name: String,
    /// Title, if any.
    pub title: Option<String>,
    /// `read`, `write` or `irreversible`.
    pub effect: String,
    /// `never`, `always` or `policy`.
    pub gate: String,
    /// Approval settings in words (approver roles, expiry, step-up, four eyes…).
    pub approval: Vec<String>,
    /// The compensating tool, if any.
    pub compensate: Option<String>,
    /// Per role, in [`AdminData::roles`] order: whether the tool is listed for it.
    pub listed: Vec<bool>,
    /// The settings an admin may propose to change, as (form field / registry key, value in
    /// force; empty: unset). Approval settings appear only for tools that have them.
    pub settings: Vec<(String, String)>,
}

/// One stored registry version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRow {
    /// Version number.
    pub version: i64,
    /// Who stored it.
    pub created_by: String,
    /// UTC text.
    pub created: String,
    /// The readable diff against the previous version, one change per line.
    pub diff: Vec<String>,
}

/// One agent credential (never its token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRow {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Registry role.
    pub role: String,
    /// Tenant.
    pub tenant: String,
    /// Creator.
    pub created_by: String,
    /// UTC text.
    pub created: String,
    /// `active`, `expired` or `revoked`.
    pub state: String,
    /// The party its calls are made for; empty when unbound.
    pub acts_for: String,
    /// Where its tasks come from (`user`, `schedule`, `monitor`, `external`).
    pub origin: String,
    /// For an execution credential, its run; empty otherwise.
    pub run_id: String,
    /// For an execution credential, its run's task (people read it instead of the id).
    pub run_task: String,
}

/// Everything the admin page shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminData {
    /// The signed-in admin's name.
    pub me: String,
    /// Their tenant (the default for new credentials).
    pub tenant: String,
    /// The registry version in force.
    pub version: Option<i64>,
    /// Matrix columns.
    pub roles: Vec<RoleCol>,
    /// Matrix rows.
    pub tools: Vec<ToolRow>,
    /// Newest first.
    pub proposals: Vec<ProposalRow>,
    /// Newest first.
    pub versions: Vec<VersionRow>,
    /// Newest first.
    pub agents: Vec<AgentRow>,
    /// The emergency stop for every tenant, when on.
    pub stop: Option<StopState>,
    /// The emergency stop for the admin's tenant, when on.
    pub tenant_stop: Option<StopState>,
    /// Whether the admin holds the platform role (the stop for every tenant, approving
    /// registry changes).
    pub platform: bool,
}

/// The admin page as the signed-in person may see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminView {
    /// Not an admin: no data.
    NotAdmin,
    /// The page's data.
    Admin(Box<AdminData>),
}

/// Where the server's data comes from (provided as context by the server; server only).
#[cfg(feature = "ssr")]
pub trait AdminSource: Send + Sync + 'static {
    /// The page's data for `person` (an admin).
    fn overview<'a>(
        &'a self,
        person: &'a countersign_core::Person,
    ) -> crate::inbox::BoxFuture<'a, Result<AdminData, String>>;
}

/// The context value the server provides to pages and server functions.
#[cfg(feature = "ssr")]
#[derive(Clone)]
pub struct Admin(pub std::sync::Arc<dyn AdminSource>);

/// The admin page's data, for a signed-in admin only.
#[leptos::server]
pub async fn load_admin() -> Result<AdminView, ServerFnError> {
    let Some(person) = crate::signed_in() else {
        return Err(ServerFnError::new("sign in first"));
    };
    if !person.has_role(countersign_core::AppRole::Admin) {
        return Ok(AdminView::NotAdmin);
    }
    let source = use_context::<Admin>()
        .ok_or_else(|| ServerFnError::new("the admin page is not available"))?;
    source
        .0
        .overview(&person)
        .await
        .map(|d| AdminView::Admin(Box::new(d)))
        .map_err(ServerFnError::new)
}

/// `/admin`.
#[component]
pub fn AdminPage() -> impl IntoView {
    let data = Resource::new(|| (), |_| load_admin());
    let query = crate::query::use_page_query();
    let message = move || {
        if let Some(text) = query.get("error").and_then(|c| error_text(&c)) {
            Some(
                view! {
                    <p role="alert" data-testid="error" class="rounded border border-red-300 bg-red-50 p-3 font-medium text-red-900">
                        {text}
                    </p>
                }
                .into_any(),
            )
        } else {
            query.get("done").and_then(|c| notice_text(&c)).map(|text| {
                view! {
                    <p role="status" data-testid="notice" class="rounded border border-emerald-300 bg-emerald-50 p-3 text-emerald-900">
                        {text}
                    </p>
                }
                .into_any()
            })
        }
    };
    view! {
        <section class="space-y-8">
            <h1 class="text-2xl font-semibold">"Admin"</h1>
            {message}
            <Suspense fallback=|| view! { <p class="text-slate-600">"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match data.await {
                        Ok(AdminView::NotAdmin) => {
                            #[cfg(feature = "ssr")]
                            {
                                if let Some(resp) = use_context::<leptos_axum::ResponseOptions>() {
                                    resp.set_status(http::StatusCode::FORBIDDEN);
                                }
                            }
                            view! {
                                <p data-testid="not-admin" class="rounded border border-slate-300 bg-white p-6 text-slate-700">
                                    "This page is for admins. Your account does not hold the admin role, so nothing is shown."
                                </p>
                            }
                                .into_any()
                        }
                        Ok(AdminView::Admin(d)) => view! { <AdminBody data=*d/> }.into_any(),
                        Err(e) => {
                            view! {
                                <p role="alert" class="rounded border border-red-300 bg-red-50 p-3 text-red-900">
                                    "The admin page could not be loaded: " {e.to_string()}
                                </p>
                            }
                                .into_any()
                        }
                    }
                })}
            </Suspense>
        </section>
    }
}

#[component]
fn AdminBody(data: AdminData) -> AnyView {
    let AdminData {
        me,
        tenant,
        version,
        roles,
        tools,
        proposals,
        versions,
        agents,
        stop,
        tenant_stop,
        platform,
    } = data;
    let role_names: Vec<String> = roles.iter().map(|r| r.name.clone()).collect();
    view! {
        <p class="text-sm text-slate-600">
            "Signed in as " {me} ". Registry version in force: "
            <span data-testid="registry-version">
                {version.map_or_else(|| "none".to_string(), |v| v.to_string())}
            </span>
        </p>
        <StopSwitch tenant=tenant.clone() tenant_stop stop platform/>
        <Matrix version roles tools=tools.clone()/>
        <ToolSettings version tools/>
        <Proposals proposals platform/>
        <Versions versions/>
        <Agents agents roles=role_names tenant/>
        <EndSessions/>
    }
    .into_any()
}

#[component]
fn Matrix(version: Option<i64>, roles: Vec<RoleCol>, tools: Vec<ToolRow>) -> AnyView {
    let header = roles
        .iter()
        .map(|r| {
            view! {
                <th scope="col" class="px-2 py-2 align-bottom font-mono text-xs" title=r.description.clone()>
                    {r.name.clone()}
                </th>
            }
        })
        .collect_view();
    let rows = tools
        .into_iter()
        .map(|t| {
            let cells = roles
                .iter()
                .zip(t.listed.iter())
                .map(|(r, listed)| {
                    let value = format!("{}|{}", r.name, t.name);
                    let label = format!("{} may use {}", r.name, t.name);
                    view! {
                        <td class="px-2 py-1 text-center">
                            <input
                                type="checkbox"
                                name="cell"
                                value=value.clone()
                                checked=*listed
                                aria-label=label
                                data-testid=format!("cell:{value}")
                                class="h-4 w-4 accent-indigo-700"
                            />
                        </td>
                    }
                })
                .collect_view();
            let approval = if t.approval.is_empty() {
                "—".to_string()
            } else {
                t.approval.join("; ")
            };
            view! {
                <tr class="border-t border-slate-200" data-testid="tool-row" data-tool=t.name.clone()>
                    <th scope="row" class="px-2 py-1 text-left font-normal">
                        <span class="font-mono">{t.name.clone()}</span>
                        <span class="block text-xs text-slate-600">{t.title.clone().unwrap_or_default()}</span>
                    </th>
                    <td class="whitespace-nowrap px-2 py-1" data-testid="effect">{t.effect.clone()}</td>
                    <td class="whitespace-nowrap px-2 py-1" data-testid="gate">{t.gate.clone()}</td>
                    <td class="px-2 py-1 text-xs">
                        {approval}
                        {t.compensate.clone().map(|c| format!("; compensated by {c}"))}
                    </td>
                    {cells}
                </tr>
            }
            .into_any()
        })
        .collect_view();
    view! {
        <section aria-labelledby="matrix-h" class=CARD>
            <h2 id="matrix-h" class=H2>"Roles and tools"</h2>
            <p class="text-sm text-slate-600">
                "A tool not ticked for a role does not exist for that role's agents. Changes are proposed here and \
                 take effect only when a second admin approves them."
            </p>
            <form method="post" action="/admin/proposals" class="space-y-3" data-testid="admin-matrix">
                <input type="hidden" name="base" value=version.unwrap_or(0).to_string()/>
                <div class="overflow-x-auto">
                    <table class="border-collapse text-sm">
                        <caption class="sr-only">"Which role may use which tool, with each tool's effect and gate"</caption>
                        <thead class="bg-slate-100">
                            <tr>
                                <th scope="col" class="px-2 py-2 text-left">"Tool"</th>
                                <th scope="col" class="px-2 py-2 text-left">"Effect"</th>
                                <th scope="col" class="px-2 py-2 text-left">"Gate"</th>
                                <th scope="col" class="px-2 py-2 text-left">"Approval"</th>
                                {header}
                            </tr>
                        </thead>
                        <tbody>{rows}</tbody>
                    </table>
                </div>
                <label class="flex flex-col text-sm">
                    "Why (required)"
                    <textarea name="note" required rows="2" class=INPUT data-testid="proposal-note"></textarea>
                </label>
                <button type="submit" class=BUTTON data-testid="propose">"Propose this change"</button>
            </form>
        </section>
    }
    .into_any()
}

/// The choices a setting's field offers, when it is a closed set.
fn setting_choices(key: &str) -> Option<&'static [&'static str]> {
    match key {
        "effect" => Some(&["read", "write", "irreversible"]),
        "gate" => Some(&["never", "always", "policy"]),
        "four_eyes" => Some(&["false", "true"]),
        _ => None,
    }
}

/// What a setting's field is called on the page.
fn setting_label(key: &str) -> &'static str {
    match key {
        "effect" => "Effect class",
        "gate" => "Gate",
        "expires" => "Approval valid for (e.g. 72h)",
        "step_up_max_age" => "Sign-in at most this old (e.g. 15m; empty: no step-up)",
        "four_eyes" => "Four eyes (two distinct approvers)",
        "second_approval_above" => "Second approver above amount (empty: never)",
        "reversal_cost" => "Reversal cost in approvals (gate advisor; empty: unset)",
        "signature" => "Passkey signature on each approval (required / none)",
        _ => "Setting",
    }
}

/// Each tool's effect class and gate settings, editable as a proposal a second admin approves.
#[component]
fn ToolSettings(version: Option<i64>, tools: Vec<ToolRow>) -> AnyView {
    let base = version.unwrap_or(0).to_string();
    let items = tools
        .into_iter()
        .map(|t| {
            let fields = t
                .settings
                .iter()
                .map(|(key, value)| {
                    let id = format!("setting-{}-{key}", t.name);
                    let label = setting_label(key);
                    let input = match setting_choices(key) {
                        Some(choices) => {
                            let options = choices
                                .iter()
                                .map(|c| {
                                    let selected = *c == value.as_str();
                                    view! { <option value=*c selected=selected>{*c}</option> }
                                })
                                .collect_view();
                            view! {
                                <select id=id.clone() name=key.clone() class=INPUT data-testid=format!("setting:{key}")>
                                    {options}
                                </select>
                            }
                            .into_any()
                        }
                        None => view! {
                            <input
                                id=id.clone()
                                name=key.clone()
                                value=value.clone()
                                class=INPUT
                                data-testid=format!("setting:{key}")
                            />
                        }
                        .into_any(),
                    };
                    view! {
                        <div class="flex flex-col text-sm">
                            <label for=id>{label}</label>
                            {input}
                        </div>
                    }
                })
                .collect_view();
            let note_id = format!("settings-note-{}", t.name);
            view! {
                <details class="rounded border border-slate-200 p-2" data-testid="tool-settings" data-tool=t.name.clone()>
                    <summary class="cursor-pointer text-sm">
                        <span class="font-mono">{t.name.clone()}</span>
                        {format!(" · {} · gate {}", t.effect, t.gate)}
                    </summary>
                    <form method="post" action="/admin/tools/settings" class="mt-2 space-y-2">
                        <input type="hidden" name="base" value=base.clone()/>
                        <input type="hidden" name="tool" value=t.name.clone()/>
                        <div class="flex flex-wrap items-end gap-3">{fields}</div>
                        <div class="flex flex-col text-sm">
                            <label for=note_id.clone()>"Why (required)"</label>
                            <textarea id=note_id name="note" required rows="2" class=INPUT data-testid="settings-note"></textarea>
                        </div>
                        <button type="submit" class=BUTTON data-testid="propose-settings">
                            "Propose these settings"
                        </button>
                    </form>
                </details>
            }
        })
        .collect_view();
    view! {
        <section aria-labelledby="settings-h" class=CARD>
            <h2 id="settings-h" class=H2>"Tool settings"</h2>
            <p class="text-sm text-slate-600">
                "Effect class and gate settings per tool. A change is a proposal: it takes effect only when a \
                 second admin approves it. A tool without approval settings cannot be gated from here."
            </p>
            {items}
        </section>
    }
    .into_any()
}

#[component]
fn Versions(versions: Vec<VersionRow>) -> AnyView {
    let items = versions
        .into_iter()
        .map(|v| {
            view! {
                <li class=CARD data-testid="version">
                    <p class="text-sm">
                        <span class="font-semibold">{format!("Version {}", v.version)}</span>
                        " · " {v.created} " · " {v.created_by}
                    </p>
                    <pre class="overflow-x-auto whitespace-pre-wrap text-xs">{v.diff.join("\n")}</pre>
                </li>
            }
        })
        .collect_view();
    view! {
        <section aria-labelledby="versions-h" class="space-y-3">
            <h2 id="versions-h" class=H2>"Registry versions"</h2>
            <ul class="space-y-3">{items}</ul>
        </section>
    }
    .into_any()
}

#[component]
fn Agents(agents: Vec<AgentRow>, roles: Vec<String>, tenant: String) -> AnyView {
    let rows = agents
        .into_iter()
        .map(|a| {
            let bind = (a.state == "active" && a.run_id.is_empty()).then(|| {
                let action = format!("/admin/agents/{}/binding", a.id);
                let label = format!("Save binding of {}", a.name);
                let origins = ["user", "schedule", "monitor", "external"]
                    .into_iter()
                    .map(|o| view! { <option value=o selected=a.origin == o>{o}</option> })
                    .collect_view();
                view! {
                    <form method="post" action=action class="flex flex-wrap items-end gap-1" data-testid="bind-form">
                        <label class="flex flex-col text-xs">
                            "Acts for" <input name="acts_for" value=a.acts_for.clone() placeholder="nobody" class=INPUT/>
                        </label>
                        <label class="flex flex-col text-xs">
                            "Origin" <select name="origin" class=INPUT>{origins}</select>
                        </label>
                        <button
                            type="submit"
                            aria-label=label
                            data-testid="bind"
                            class="rounded border border-slate-400 bg-white px-2 py-1 text-xs font-medium hover:bg-slate-50 focus:outline-none focus:ring-2 focus:ring-slate-500"
                        >
                            "Save"
                        </button>
                    </form>
                }
            });
            let binding = if a.run_id.is_empty() {
                format!(
                    "acts for {} · origin {}",
                    if a.acts_for.is_empty() { "nobody" } else { a.acts_for.as_str() },
                    a.origin
                )
            } else {
                format!("execution credential of the run “{}”", a.run_task)
            };
            // An execution credential's name holds its run's id: shown by its run's task.
            let shown = if a.run_id.is_empty() {
                a.name.clone()
            } else {
                format!("the plan's {} credential", a.role)
            };
            let revoke = (a.state == "active").then(|| {
                let action = format!("/admin/agents/{}/revoke", a.id);
                let label = format!("Revoke {}", a.name);
                view! {
                    <form method="post" action=action>
                        <button
                            type="submit"
                            aria-label=label
                            data-testid="revoke"
                            class="rounded border border-red-400 bg-white px-2 py-1 text-xs font-medium text-red-900 hover:bg-red-50 focus:outline-none focus:ring-2 focus:ring-red-500"
                        >
                            "Revoke"
                        </button>
                    </form>
                }
            });
            view! {
                <tr class="border-t border-slate-200" data-testid="agent-row" data-agent=a.name.clone()>
                    <td class="px-2 py-1" title=a.name.clone()>{shown}</td>
                    <td class="px-2 py-1 font-mono">{a.role.clone()}</td>
                    <td class="px-2 py-1">{a.tenant.clone()}</td>
                    <td class="px-2 py-1" data-testid="agent-state">{a.state.clone()}</td>
                    <td class="px-2 py-1 text-xs">{a.created_by.clone()} " · " {a.created.clone()}</td>
                    <td class="px-2 py-1 text-xs" data-testid="agent-binding" title=a.run_id.clone()>{binding}{bind}</td>
                    <td class="px-2 py-1">{revoke}</td>
                </tr>
            }
            .into_any()
        })
        .collect_view();
    let options = roles
        .into_iter()
        .map(|r| view! { <option value=r.clone()>{r.clone()}</option> })
        .collect_view();
    view! {
        <section aria-labelledby="agents-h" class=CARD>
            <h2 id="agents-h" class=H2>"Agent credentials"</h2>
            <div class="overflow-x-auto">
            <table class="w-full border-collapse text-left text-sm">
                <caption class="sr-only">"Agent credentials, newest first"</caption>
                <thead class="bg-slate-100">
                    <tr>
                        <th scope="col" class="px-2 py-1">"Name"</th>
                        <th scope="col" class="px-2 py-1">"Role"</th>
                        <th scope="col" class="px-2 py-1">"Tenant"</th>
                        <th scope="col" class="px-2 py-1">"State"</th>
                        <th scope="col" class="px-2 py-1">"Created"</th>
                        <th scope="col" class="px-2 py-1">"Acts for"</th>
                        <th scope="col" class="px-2 py-1"><span class="sr-only">"Revoke"</span></th>
                    </tr>
                </thead>
                <tbody>{rows}</tbody>
            </table>
            </div>
            <form method="post" action="/admin/agents" class="flex flex-wrap items-end gap-2" data-testid="agent-form">
                <label class="flex flex-col text-sm">
                    "Name" <input name="name" required class=INPUT/>
                </label>
                <label class="flex flex-col text-sm">
                    "Role" <select name="role" class=INPUT>{options}</select>
                </label>
                <label class="flex flex-col text-sm">
                    "Tenant" <input name="tenant" required readonly value=tenant class=INPUT/>
                </label>
                <label class="flex flex-col text-sm">
                    "Expires after (e.g. 30d, optional)" <input name="expires" class=INPUT/>
                </label>
                <label class="flex flex-col text-sm">
                    "Acts for (party, optional)" <input name="acts_for" class=INPUT/>
                </label>
                <label class="flex flex-col text-sm">
                    "Task origin"
                    <select name="origin" class=INPUT>
                        <option value="user" selected>"user"</option>
                        <option value="schedule">"schedule"</option>
                        <option value="monitor">"monitor"</option>
                        <option value="external">"external (reads inbound content)"</option>
                    </select>
                </label>
                <label class="flex flex-col text-sm">
                    "OAuth issuer (optional)" <input name="oauth_issuer" type="url" class=INPUT/>
                </label>
                <label class="flex flex-col text-sm">
                    "OAuth client id (optional)" <input name="oauth_client" class=INPUT/>
                </label>
                <button type="submit" class=BUTTON>"Create credential"</button>
            </form>
            <p class="text-sm text-slate-600">"The token is shown once, on the next page. Store it in the agent's secret store. With an OAuth issuer and client id, the agent presents that authorization server's access tokens instead, and no token is shown."</p>
        </section>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_come_only_from_known_codes() {
        assert!(notice_text("proposed").is_some());
        assert!(error_text("own").is_some());
        assert_eq!(error_text("<script>"), None);
        assert_eq!(notice_text("anything"), None);
    }
}
