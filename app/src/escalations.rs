//! The escalations page: what only a person can settle — an outcome reconciliation cannot
//! settle, an undo that needs a person, an effect nothing here can undo — and the forms that act
//! on them.
//!
//! Invariants:
//! * The server function returns rows only to a signed-in approver or admin with a tenant
//!   ([`crate::access::person_with`]); which escalations a person sees (tenant, the escalated
//!   tool's approver roles) is decided by the server's [`EscalationSource`], the same check its
//!   action endpoint makes.
//! * Actions are plain HTML forms posted to the server's endpoint, which checks everything
//!   again; the page offers only the actions the escalation's kind allows.
//! * Messages shown after an action come from fixed codes ([`notice_text`], [`error_text`]);
//!   no text from the query string is ever shown.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::access::{Refused, RefusedNote};

/// Where an escalation's actions post: `/escalations/{id}`.
pub const ACTION_PREFIX: &str = "/escalations/";

/// One open escalation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EscalationRow {
    /// Its id (the form's target).
    pub id: String,
    /// `unknown`, `undo` or `manual`.
    pub kind: String,
    /// The tool, e.g. `payment.schedule`.
    pub tool: String,
    /// What the call acts on and its amount, in words.
    pub what: String,
    /// The run's task.
    pub run_task: String,
    /// The run's id (a link).
    pub run_id: String,
    /// The step's position in its run.
    pub seq: i64,
    /// `read`, `write` or `irreversible`.
    pub effect: String,
    /// Why it needs a person.
    pub reason: String,
    /// When it opened, UTC text.
    pub opened: String,
    /// Settling needs two people.
    pub two_people: bool,
    /// The first settlement, in words, when one person has settled it.
    pub first: Option<String>,
    /// The undo that ran, in words.
    pub undo: Option<String>,
}

/// What the page shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EscalationsView {
    /// Not for this person.
    Refused(Refused),
    /// The open escalations this person may act on, oldest first.
    Rows(Vec<EscalationRow>),
}

/// The server's side of the page.
#[cfg(feature = "ssr")]
pub trait EscalationSource: Send + Sync + 'static {
    /// The open escalations `person` may act on.
    fn open<'a>(
        &'a self,
        person: &'a countersign_core::Person,
    ) -> crate::inbox::BoxFuture<'a, Result<Vec<EscalationRow>, String>>;
}

/// The context value the server provides.
#[cfg(feature = "ssr")]
#[derive(Clone)]
pub struct Escalations(pub std::sync::Arc<dyn EscalationSource>);

/// Loads the page's rows.
#[leptos::server]
pub async fn load_escalations() -> Result<EscalationsView, ServerFnError> {
    use countersign_core::AppRole;
    let (person, _) = match crate::access::person_with(&[AppRole::Approver, AppRole::Admin])? {
        Ok(p) => p,
        Err(why) => return Ok(EscalationsView::Refused(why)),
    };
    let source = use_context::<Escalations>()
        .ok_or_else(|| ServerFnError::new("escalations are not available"))?;
    source
        .0
        .open(&person)
        .await
        .map(EscalationsView::Rows)
        .map_err(ServerFnError::new)
}

/// The message after an action that went through.
pub fn notice_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "settled" => "Settled. The step's outcome is recorded with your reference.",
        "first" => {
            "Your settlement is recorded. This tool is irreversible: a second person must \
             confirm the same outcome and reference before the step is settled."
        }
        "undone" => "The undo ran and is done. The escalation is closed.",
        "undo_ended" => {
            "The undo ran but did not finish (see the run). It will not run again; acknowledge \
             the escalation once the effect is handled."
        }
        "acknowledged" => "Acknowledged. The escalation is closed.",
        _ => return None,
    })
}

/// The message after a refused action.
pub fn error_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "reason" => "A reason is required. Nothing was done.",
        "reference" => {
            "Give the target's reference for the call (at most 200 characters). Nothing was done."
        }
        "action" => "That action does not apply to this escalation. Nothing was done.",
        "step_up" => "This tool needs a recent sign-in. Sign in again, then act. Nothing was done.",
        "own_run" => "The run acts for you: another person must act on it.",
        "accountable" => {
            "You are accountable for this agent's work (you created its credential, or it acts \
             for you): another person must act on it. Your attempt was recorded."
        }
        "raced" => "Someone else acted on this escalation at the same moment. Look at it again.",
        "same_settler" => {
            "You recorded the first settlement: a second, different person must confirm it."
        }
        "disagrees" => {
            "The first person recorded another outcome or reference. Nothing was settled, and \
             their settlement is withdrawn: two people must now agree on what happened."
        }
        "undo_ran" => "The undo ran already; acknowledge what is left.",
        "undo_failed" => "The undo could not run. Nothing was changed at the target.",
        "decide" => {
            "Your approval of the undo was refused (see the audit trail for why). Nothing ran."
        }
        "closed" => "This escalation is closed already.",
        "not_found" => "There is no such escalation for you.",
        "unavailable" => "The database did not answer. Try again.",
        _ => return None,
    })
}

/// What each kind means, for people.
fn kind_text(kind: &str) -> &'static str {
    match kind {
        "unknown" => "Outcome unknown",
        "undo" => "Undo needs a person",
        _ => "Needs handling by hand",
    }
}

/// The escalations page.
#[component]
pub fn EscalationsPage() -> impl IntoView {
    let rows = Resource::new(|| (), |_| load_escalations());
    let message = crate::query::coded_message(error_text, notice_text);
    view! {
        <section class="space-y-4">
            <h1 class="text-2xl font-semibold">"Escalations"</h1>
            <p class="text-slate-700">
                "What Countersign could not settle or undo by itself. Each action is recorded in the audit trail."
            </p>
            {message}
            <Suspense fallback=|| view! { <p class="text-slate-600">"Loading escalations…"</p> }>
                {move || Suspend::new(async move {
                    match rows.await {
                        Ok(EscalationsView::Refused(why)) => {
                            view! { <RefusedNote why page="The escalations page" roles="approvers and admins"/> }
                                .into_any()
                        }
                        Ok(EscalationsView::Rows(rows)) if rows.is_empty() => {
                            view! { <p data-testid="no-escalations" class="rounded border border-slate-300 bg-white p-6 text-slate-700">"Nothing needs a person. Escalations appear here when an outcome cannot be settled or a failed run leaves an effect to undo."</p> }
                                .into_any()
                        }
                        Ok(EscalationsView::Rows(rows)) => {
                            rows.into_iter().map(|row| view! { <EscalationCard row/> }).collect_view().into_any()
                        }
                        Err(e) => {
                            view! { <p role="alert" class="rounded border border-red-300 bg-red-50 p-3 text-red-900">"The escalations could not be loaded: " {e.to_string()}</p> }
                                .into_any()
                        }
                    }
                })}
            </Suspense>
        </section>
    }
}

/// One escalation and its actions.
#[component]
fn EscalationCard(row: EscalationRow) -> impl IntoView {
    let action = format!("{ACTION_PREFIX}{}", row.id);
    let reason_id = format!("reason-{}", row.id);
    let reference_id = format!("reference-{}", row.id);
    let heading = format!("{} — {} (step {})", kind_text(&row.kind), row.tool, row.seq);
    let run_href = format!("/runs/{}", row.run_id);
    let unknown = row.kind == "unknown";
    let undo = row.kind == "undo" && row.undo.is_none();
    let button = "rounded px-4 py-2 text-sm font-medium text-white focus:outline-none focus:ring-2 focus:ring-offset-2";
    view! {
        <article data-testid="escalation" data-kind=row.kind.clone() class="space-y-3 rounded border border-amber-300 bg-white p-4">
            <h2 class="text-lg font-semibold">{heading}</h2>
            <dl class="grid grid-cols-1 gap-x-6 gap-y-1 text-sm sm:grid-cols-[max-content_1fr]">
                <dt class="font-medium text-slate-700">"What"</dt>
                <dd data-testid="what">{row.what.clone()}</dd>
                <dt class="font-medium text-slate-700">"Run"</dt>
                <dd><a href=run_href class="text-indigo-800 underline" title=row.run_id.clone()>{row.run_task.clone()}</a></dd>
                <dt class="font-medium text-slate-700">"Effect"</dt>
                <dd>{row.effect.clone()}</dd>
                <dt class="font-medium text-slate-700">"Why"</dt>
                <dd data-testid="why">{row.reason.clone()}</dd>
                <dt class="font-medium text-slate-700">"Since"</dt>
                <dd>{row.opened.clone()}</dd>
            </dl>
            {row.first.clone().map(|f| view! { <p data-testid="first" class="rounded bg-amber-50 p-2 text-sm text-amber-900">{f}</p> })}
            {row.undo.clone().map(|u| view! { <p data-testid="undo-ran" class="rounded bg-amber-50 p-2 text-sm text-amber-900">{u}</p> })}
            <form method="post" action=action class="space-y-2">
                {unknown.then(|| {
                    let two = row.two_people.then_some(" This tool is irreversible: two different people must settle it the same way.");
                    view! {
                        <label for=reference_id.clone() class="block text-sm font-medium text-slate-800">
                            "The target's reference for the call (when it happened)"
                        </label>
                        <input id=reference_id.clone() name="reference" type="text" maxlength="200"
                            class="w-full rounded border border-slate-500 p-2 focus:outline-none focus:ring-2 focus:ring-indigo-500"/>
                        {two.map(|t| view! { <p class="text-sm text-slate-700">{t}</p> })}
                    }
                })}
                <label for=reason_id.clone() class="block text-sm font-medium text-slate-800">
                    "Reason (required, recorded in the audit trail)"
                </label>
                <textarea id=reason_id name="reason" required rows="2"
                    class="w-full rounded border border-slate-500 p-2 focus:outline-none focus:ring-2 focus:ring-indigo-500"></textarea>
                <div class="flex flex-wrap gap-3">
                    {unknown.then(|| view! {
                        <button type="submit" name="action" value="happened" data-testid="settle-happened"
                            class=format!("{button} bg-emerald-700 hover:bg-emerald-800 focus:ring-emerald-500")>
                            "It happened (settle with the reference)"
                        </button>
                        <button type="submit" name="action" value="not_happened" data-testid="settle-not-happened"
                            class=format!("{button} bg-slate-700 hover:bg-slate-800 focus:ring-slate-500")>
                            "It never happened"
                        </button>
                    })}
                    {undo.then(|| view! {
                        <button type="submit" name="action" value="undo" data-testid="undo"
                            class=format!("{button} bg-indigo-700 hover:bg-indigo-800 focus:ring-indigo-500")>
                            "Approve the undo (runs it once)"
                        </button>
                    })}
                    {(!unknown).then(|| view! {
                        <button type="submit" name="action" value="acknowledge" data-testid="acknowledge"
                            class=format!("{button} bg-slate-700 hover:bg-slate-800 focus:ring-slate-500")>
                            "Acknowledge (handled outside Countersign)"
                        </button>
                    })}
                </div>
            </form>
        </article>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_the_server_sends_has_a_message() {
        for code in ["settled", "first", "undone", "undo_ended", "acknowledged"] {
            assert!(notice_text(code).is_some(), "{code}");
        }
        for code in [
            "reason",
            "reference",
            "action",
            "step_up",
            "own_run",
            "accountable",
            "raced",
            "same_settler",
            "disagrees",
            "undo_ran",
            "undo_failed",
            "decide",
            "closed",
            "not_found",
            "unavailable",
        ] {
            assert!(error_text(code).is_some(), "{code}");
        }
        assert_eq!(error_text("<script>"), None);
    }
}
