//! The admin page's emergency-stop panels (the admin's tenant, and every tenant for a
//! platform admin) and the form that ends a person's sessions.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use super::style::{BUTTON, CARD, H2, INPUT};

#[component]
pub(super) fn StopSwitch(
    tenant: String,
    tenant_stop: Option<StopState>,
    stop: Option<StopState>,
    platform: bool,
) -> AnyView {
    let tenant_panel = StopPanel {
        scope: "tenant",
        title: format!("Tenant {tenant}"),
        covers: format!("every active run of tenant {tenant}"),
        state: tenant_stop,
        may_act: !tenant.is_empty(),
    };
    let platform_panel = StopPanel {
        scope: "platform",
        title: "Every tenant".to_string(),
        covers: "every active run of every tenant".to_string(),
        state: stop,
        may_act: platform,
    };
    view! {
        <section aria-labelledby="stop-h" class="space-y-3 rounded border-2 border-red-300 bg-red-50 p-4">
            <h2 id="stop-h" class=H2>"Emergency stop"</h2>
            {tenant_panel.render()}
            {platform_panel.render()}
        </section>
    }
    .into_any()
}

/// One scope of the emergency stop: its state, and the form to turn it on or lift it when
/// the admin may.
struct StopPanel {
    scope: &'static str,
    title: String,
    covers: String,
    state: Option<StopState>,
    may_act: bool,
}

impl StopPanel {
    fn render(self) -> AnyView {
        let StopPanel {
            scope,
            title,
            covers,
            state,
            may_act,
        } = self;
        let heading = format!("stop-{scope}-h");
        let body = match state {
            Some(s) => {
                let restore = (s.revoked > 0).then(|| {
                    view! {
                        <label class="flex items-center gap-2 text-sm">
                            <input type="checkbox" name="restore" value="1" data-testid=format!("restore-{scope}")/>
                            {format!(
                                "Restore the {} agent credential(s) this stop revoked",
                                s.revoked
                            )}
                        </label>
                    }
                });
                let form = may_act.then(|| {
                    view! {
                        <form method="post" action="/admin/stop/lift" class="flex flex-wrap items-end gap-2">
                            <input type="hidden" name="scope" value=scope/>
                            <label class="flex flex-col text-sm">
                                "Reason for lifting"
                                <input name="reason" required class=INPUT data-testid=format!("lift-reason-{scope}")/>
                            </label>
                            {restore}
                            <button type="submit" class=BUTTON data-testid=format!("lift-stop-{scope}")>
                                "Lift this stop"
                            </button>
                        </form>
                    }
                });
                view! {
                    <p data-testid=format!("stop-state-{scope}") data-stop="on" class="font-semibold text-red-900">
                        "ON since " {s.since} " (by " {s.by} "): " {s.reason}
                    </p>
                    {form}
                }
                .into_any()
            }
            None => {
                let form = may_act.then(|| {
                    view! {
                        <form method="post" action="/admin/stop" class="flex flex-wrap items-end gap-2">
                            <input type="hidden" name="scope" value=scope/>
                            <label class="flex flex-col text-sm">
                                "Reason"
                                <input name="reason" required class=INPUT data-testid=format!("stop-reason-{scope}")/>
                            </label>
                            <button
                                type="submit"
                                data-testid=format!("stop-button-{scope}")
                                class="rounded bg-red-700 px-3 py-1.5 text-sm font-medium text-white hover:bg-red-800 focus:outline-none focus:ring-2 focus:ring-red-500 focus:ring-offset-2"
                            >
                                "Emergency stop"
                            </button>
                        </form>
                    }
                });
                view! {
                    <p data-testid=format!("stop-state-{scope}") data-stop="off" class="text-slate-700">
                        {format!(
                            "Off. Turning it on prevents every step that has not started and \
                             stops {covers}, revoking its agent's credential; in-flight calls \
                             finish or are reconciled."
                        )}
                    </p>
                    {form}
                }
                .into_any()
            }
        };
        view! {
            <div class="space-y-2">
                <h3 id=heading class="font-semibold">{title}</h3>
                {body}
            </div>
        }
        .into_any()
    }
}

#[component]
pub(super) fn EndSessions() -> AnyView {
    view! {
        <section aria-labelledby="sessions-h" class=CARD>
            <h2 id="sessions-h" class=H2>"End a person's sessions"</h2>
            <p class="text-sm text-slate-700">
                "Someone left, or lost a role at the identity provider? End their sessions in your \
                 tenant now: their next request needs a new sign-in, which reads their roles afresh."
            </p>
            <form method="post" action="/admin/sessions/end" class="flex flex-wrap items-end gap-2">
                <label class="flex flex-col text-sm">
                    "Person (ISSUER#SUBJECT)"
                    <input name="person" required class=INPUT data-testid="end-sessions-person"/>
                </label>
                <button type="submit" class=BUTTON data-testid="end-sessions">"End their sessions"</button>
            </form>
        </section>
    }
    .into_any()
}

/// The emergency stop while it is on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopState {
    /// Why.
    pub reason: String,
    /// Who turned it on.
    pub by: String,
    /// Since when, UTC text.
    pub since: String,
    /// How many agent credentials it revoked that lifting it may restore.
    pub revoked: usize,
}
