//! The approval inbox: what the pages show, the server functions that load it, and the pure
//! formatting both sides share.
//!
//! Invariants:
//! * The server functions return data only to a signed-in person holding the `approver`
//!   role; everyone else gets [`InboxView::NotApprover`] / [`DetailView::NotApprover`] and no
//!   gate. Which gates a person sees (tenant, the tool's approver roles) is decided by the
//!   server's [`InboxSource`], the same check the JSON API and the decision endpoint use.
//! * Decisions are not made here: the detail page posts a plain HTML form to the server's
//!   decision endpoint, which runs the same checks as `POST /api/steps/{id}/decision`.
//! * Messages shown after a decision come from fixed codes ([`notice_text`], [`error_text`]);
//!   no text from the query string is ever shown.

use serde::{Deserialize, Serialize};

/// One waiting gate in the list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRow {
    /// The step id.
    pub step_id: String,
    /// Registry tool.
    pub tool: String,
    /// Amount with currency, e.g. `4,180.00 EUR`, when the inputs carry one.
    pub amount: Option<String>,
    /// The amount in exact minor units of `currency` (for a selection's total).
    pub amount_minor: Option<i64>,
    /// The amount's currency.
    pub currency: Option<String>,
    /// The currency's minor-unit exponent (2 for EUR).
    pub exponent: u32,
    /// What the call acts on (invoice, supplier…), e.g. `invoice INV-1`.
    pub target: Option<String>,
    /// Countdown text, e.g. `expires in 71 h`.
    pub expires: String,
    /// When the gate opened, UTC text.
    pub waiting_since: String,
}

/// One audit record of a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRow {
    /// Event name (`proposed`, `needs_approval`, `approved`…).
    pub event: String,
    /// UTC text.
    pub at: String,
    /// Who acted, in words (agent and person names).
    pub actor: String,
    /// Who acted, exactly as recorded (none for a record with no actor).
    pub actor_id: Option<String>,
}

/// Everything the detail page shows about one waiting gate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateDetail {
    /// The list row.
    pub row: GateRow,
    /// The run.
    pub run_id: String,
    /// Step status text.
    pub status: String,
    /// The canonical inputs, pretty-printed (same tokens, same order, same numbers).
    pub inputs: String,
    /// `sha256:` of the canonical inputs the approval binds.
    pub inputs_hash: String,
    /// The model's reason.
    pub reason: String,
    /// Evidence ids.
    pub evidence: Vec<String>,
    /// The policy rule that opened the gate.
    pub rule: Option<String>,
    /// Effect class (`read`, `write`, `irreversible`).
    pub effect: String,
    /// The compensating tool, if any.
    pub compensate: Option<String>,
    /// Distinct approvals needed.
    pub approvals_needed: u32,
    /// Approvals already given for these inputs.
    pub approvals_given: u32,
    /// The creator of the agent's credential may not approve.
    pub four_eyes: bool,
    /// A sign-in within this many minutes is required.
    pub step_up_minutes: Option<i64>,
    /// The step's audit records, oldest first.
    pub history: Vec<HistoryRow>,
    /// What approving signs, when the tool requires a passkey signature.
    pub signature: Option<SignatureNeeds>,
}

/// What a gate whose tool requires a signature shows beside its decision form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignatureNeeds {
    /// The signatures given for these inputs: "First signature: Ana Alvarez".
    pub given: Vec<String>,
    /// The signatures still needed: "Second signature: another approver".
    pub missing: Vec<String>,
    /// What the signature binds, from the canonical inputs (label, value; redacted per the
    /// tool's classification).
    pub shown: Vec<(String, String)>,
    /// The person holds an active passkey.
    pub has_passkey: bool,
}

/// The inbox list as the signed-in person may see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InboxView {
    /// The person is not an approver: no data.
    NotApprover,
    /// Waiting gates, oldest first.
    Gates(Vec<GateRow>),
}

/// One gate as the signed-in person may see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DetailView {
    /// The person is not an approver: no data.
    NotApprover,
    /// No such gate for this person (or no longer waiting).
    NotFound,
    /// The gate.
    Gate(Box<GateDetail>),
}

/// Where the server's data comes from (provided as context by the server; server only).
#[cfg(feature = "ssr")]
pub trait InboxSource: Send + Sync + 'static {
    /// Waiting gates `person` may decide, oldest first.
    fn gates<'a>(
        &'a self,
        person: &'a countersign_core::Person,
    ) -> BoxFuture<'a, Result<Vec<GateRow>, String>>;

    /// One gate `person` may see; `None` when not visible to them.
    fn gate<'a>(
        &'a self,
        person: &'a countersign_core::Person,
        step_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<GateDetail>, String>>;
}

/// A boxed, sendable future.
#[cfg(feature = "ssr")]
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// The context value the server provides to pages and server functions.
#[cfg(feature = "ssr")]
#[derive(Clone)]
pub struct Inbox(pub std::sync::Arc<dyn InboxSource>);

#[cfg(feature = "ssr")]
fn approver() -> Result<Option<countersign_core::Person>, leptos::prelude::ServerFnError> {
    let Some(person) = crate::signed_in() else {
        return Err(leptos::prelude::ServerFnError::new("sign in first"));
    };
    Ok(person
        .has_role(countersign_core::AppRole::Approver)
        .then_some(person))
}

#[cfg(feature = "ssr")]
fn source() -> Result<Inbox, leptos::prelude::ServerFnError> {
    leptos::prelude::use_context::<Inbox>()
        .ok_or_else(|| leptos::prelude::ServerFnError::new("the inbox is not available"))
}

/// The waiting gates the signed-in approver may decide.
#[leptos::server]
pub async fn load_gates() -> Result<InboxView, leptos::prelude::ServerFnError> {
    let Some(person) = approver()? else {
        return Ok(InboxView::NotApprover);
    };
    let source = source()?;
    source
        .0
        .gates(&person)
        .await
        .map(InboxView::Gates)
        .map_err(leptos::prelude::ServerFnError::new)
}

/// [`load_gates`] for the inbox's own refresh every few seconds: the same answer, but a
/// background request ([`crate::BACKGROUND_PREFIX`]) the server does not count as the
/// person's activity, so an open inbox does not keep an idle session alive.
#[leptos::server(prefix = "/api/background", endpoint = "gates")]
pub async fn refresh_gates() -> Result<InboxView, leptos::prelude::ServerFnError> {
    load_gates().await
}

/// One gate the signed-in approver may see.
#[leptos::server]
pub async fn load_gate(step_id: String) -> Result<DetailView, leptos::prelude::ServerFnError> {
    let Some(person) = approver()? else {
        return Ok(DetailView::NotApprover);
    };
    let source = source()?;
    match source.0.gate(&person, &step_id).await {
        Ok(Some(detail)) => Ok(DetailView::Gate(Box::new(detail))),
        Ok(None) => Ok(DetailView::NotFound),
        Err(e) => Err(leptos::prelude::ServerFnError::new(e)),
    }
}

/// `digits` (ASCII digits) with a comma every three from the right: `1234567` → `1,234,567`.
pub fn group_thousands(digits: &str) -> String {
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    grouped
}

/// `1234567.5` → `1,234,567.50`; `None` for anything that is not a finite number.
pub fn format_amount(amount: f64, currency: Option<&str>) -> Option<String> {
    if !amount.is_finite() {
        return None;
    }
    let fixed = format!("{:.2}", amount.abs());
    let (int, frac) = fixed.split_once('.')?;
    let grouped = group_thousands(int);
    let sign = if amount < 0.0 && fixed != "0.00" {
        "-"
    } else {
        ""
    };
    Some(match currency {
        Some(c) if !c.is_empty() => format!("{sign}{grouped}.{frac} {c}"),
        _ => format!("{sign}{grouped}.{frac}"),
    })
}

/// Countdown text for a gate closing at `expires_at`, seen at `now` (both Unix ms).
pub fn expires_text(expires_at: Option<i64>, now: i64) -> String {
    let Some(at) = expires_at else {
        return "no expiry".into();
    };
    let left = at.saturating_sub(now);
    if left <= 0 {
        return "expired".into();
    }
    let minutes = left / 60_000;
    if minutes >= 120 {
        format!("expires in {} h", minutes / 60)
    } else if minutes >= 1 {
        format!("expires in {minutes} min")
    } else {
        "expires in under a minute".into()
    }
}

/// Pretty-prints canonical JSON text: only whitespace is added outside strings, so the
/// tokens, their order and every number stay exactly as they will be sent.
pub fn pretty_canonical(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = text.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    };
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                let close = if c == '{' { '}' } else { ']' };
                if chars.peek() == Some(&close) {
                    if let Some(close) = chars.next() {
                        out.push(close);
                    }
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            _ => out.push(c),
        }
    }
    out
}

/// The message for a `?done=` code after a decision.
pub fn notice_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "approved" => "Approved. The agent's next call runs the step exactly as shown.",
        "recorded" => {
            "Your approval is recorded. This step needs a second approver before it can run."
        }
        "rejected" => "Rejected. The step will never run.",
        _ => return None,
    })
}

/// The message for a `?error=` code after a refused decision.
pub fn error_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "reason" => "A reason is required. Nothing was decided.",
        "verdict" => "Choose approve or reject. Nothing was decided.",
        "step_up" => {
            "This tool needs a recent sign-in. Sign in again, then decide. Nothing was decided."
        }
        "creator" => {
            "You created the credential of the agent that proposed this step: you are \
             accountable for the proposal, so another approver must countersign it. You may \
             still reject it. Your attempt was recorded."
        }
        "acts_for" => {
            "The agent that proposed this step acts for you: a step made on your behalf needs \
             another approver. You may still reject it. Your attempt was recorded."
        }
        "not_party" => {
            "Only the person this agent acts for may confirm this step. You may still reject \
             it. Your attempt was recorded."
        }
        "four_eyes" => {
            "Four eyes: you created the credential of the agent that proposed this step, so \
             someone else must approve it."
        }
        "four_eyes_unknown" => {
            "Four eyes cannot be checked: the credential of the agent that proposed this step \
             was not created by a signed-in person, so nobody can approve it. An admin must \
             re-create the credential from the admin page; the step can still be rejected."
        }
        "self" => "You cannot approve a step of a run that acts for you.",
        "not_approver" => "You hold none of this tool's approver roles.",
        "already" => {
            "You already decided this step; a second approval must come from someone else."
        }
        "expired" => "The approval window closed. Nothing was decided.",
        "signature_missing" => {
            "This payment must be approved with your passkey's signature. Add a passkey on the \
             Passkeys page, then approve again here. Nothing was decided."
        }
        "signature_again" => {
            "The signing challenge was used already or expired. Approve again. Nothing was \
             decided."
        }
        "signature_invalid" => {
            "The signature did not verify for this gate. Nothing was decided; your attempt was \
             recorded."
        }
        "signature_credential" => {
            "That passkey is not one of yours, or it was revoked. Nothing was decided; your \
             attempt was recorded."
        }
        "signature_uv" => {
            "Your authenticator did not verify you (PIN or biometrics). Nothing was decided; \
             your attempt was recorded."
        }
        "signature_counter" => {
            "Your passkey's counter went backwards, as a copied key's would. Nothing was \
             decided; your attempt was recorded. Tell your administrator."
        }
        "signature_same" => {
            "You signed this payment already: the second signature must come from someone \
             else. Your attempt was recorded."
        }
        "signature_no_rp" => "Passkeys cannot work on this server's address. Nothing was decided.",
        "not_waiting" => "This step is no longer waiting for approval.",
        "not_found" => "There is no such gate waiting for you.",
        "batch_empty" => "Tick the gates to decide together first. Nothing was decided.",
        "batch_tools" => {
            "A batch decides gates of one tool: tick gates of a single tool. Nothing was decided."
        }
        "batch_refused" => "The batch was refused as a whole. Nothing was decided.",
        "batch_signature" => {
            "Your passkey's signature over the batch did not verify (it was used already, \
             expired, or the gates changed). Nothing was decided; the attempt was recorded. \
             Approve again."
        }
        "unavailable" => "The database did not answer. Nothing was decided; try again.",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_are_grouped_with_two_decimals_and_currency() {
        assert_eq!(
            format_amount(4180.0, Some("EUR")).as_deref(),
            Some("4,180.00 EUR")
        );
        assert_eq!(
            format_amount(1_234_567.5, Some("USD")).as_deref(),
            Some("1,234,567.50 USD")
        );
        assert_eq!(format_amount(999.999, None).as_deref(), Some("1,000.00"));
        assert_eq!(
            format_amount(-12.0, Some("EUR")).as_deref(),
            Some("-12.00 EUR")
        );
        assert_eq!(format_amount(f64::NAN, Some("EUR")), None);
    }

    #[test]
    fn countdown_rounds_down_and_says_expired() {
        let h = 3_600_000;
        assert_eq!(expires_text(Some(72 * h - 1), 0), "expires in 71 h");
        assert_eq!(expires_text(Some(90 * 60_000), 0), "expires in 90 min");
        assert_eq!(expires_text(Some(10), 0), "expires in under a minute");
        assert_eq!(expires_text(Some(10), 10), "expired");
        assert_eq!(expires_text(None, 10), "no expiry");
    }

    #[test]
    fn pretty_printing_adds_only_whitespace_outside_strings() {
        let canonical = r#"{"a":[],"amount":4180.5,"n":{"x":"{,:}\"]"},"z":[1,{}]}"#;
        let pretty = pretty_canonical(canonical);
        assert_eq!(
            pretty,
            "{\n  \"a\": [],\n  \"amount\": 4180.5,\n  \"n\": {\n    \"x\": \"{,:}\\\"]\"\n  },\n  \"z\": [\n    1,\n    {}\n  ]\n}"
        );
        let squeezed: String = {
            let mut s = String::new();
            let mut in_str = false;
            let mut esc = false;
            for c in pretty.chars() {
                if in_str {
                    s.push(c);
                    if esc {
                        esc = false
                    } else if c == '\\' {
                        esc = true
                    } else if c == '"' {
                        in_str = false
                    }
                } else if c == '"' {
                    in_str = true;
                    s.push(c);
                } else if !c.is_whitespace() {
                    s.push(c);
                }
            }
            s
        };
        assert_eq!(squeezed, canonical);
    }

    #[test]
    fn messages_come_only_from_known_codes() {
        assert!(error_text("step_up").is_some());
        assert_eq!(error_text("<script>"), None);
        assert_eq!(notice_text("anything"), None);
    }
}
