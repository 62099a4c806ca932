//! The part of a gate's page that a signature-requiring tool adds: what approving signs, and
//! which signatures the gate has and still needs.

use countersign_app::inbox::SignatureNeeds;
use countersign_core::approvals::Approval;
use countersign_core::{Person, StoreError};
use serde_json::Value;

use super::super::names::Names;
use crate::AppState;

/// What a gate of a signature-requiring tool shows `person`: the fields its signature binds
/// (from the canonical inputs, redacted fields masked), the signatures it has for these
/// inputs (`counted`: the approvals the gate counts, signed ones only) and the ones it still
/// needs, and whether `person` holds a passkey. `None` for a tool that requires no signature.
#[allow(clippy::too_many_arguments)]
pub async fn signature_needs(
    state: &AppState,
    person: &Person,
    step: &countersign_core::store::Step,
    tool: &countersign_core::registry::Tool,
    rules: &countersign_core::approvals::GateRules,
    inputs: &Value,
    counted: &[Approval],
    names: &Names,
) -> Result<Option<SignatureNeeds>, StoreError> {
    if !rules.signature_required {
        return Ok(None);
    }
    let tenant = person.tenant.clone().unwrap_or_default();
    let signed: Vec<String> = counted
        .iter()
        .map(|a| names.person(&format!("person:{}#{}", a.approver_iss, a.approver_sub)))
        .collect();
    let needed = usize::try_from(rules.approvals_needed.max(1)).unwrap_or(1);
    let given = signed
        .iter()
        .enumerate()
        .map(|(i, who)| format!("{}: {who}", ordinal(i)))
        .collect();
    let missing = (signed.len()..needed)
        .map(|i| {
            if i == 0 {
                format!("{}: an approver", ordinal(i))
            } else {
                format!("{}: another approver", ordinal(i))
            }
        })
        .collect();
    let has_passkey = state
        .store
        .passkeys_of(&tenant, &person.approver())
        .await?
        .iter()
        .any(|k| k.revoked_at.is_none());
    Ok(Some(SignatureNeeds {
        given,
        missing,
        shown: shown_fields(tool, inputs, &step.inputs_hash),
        has_passkey,
    }))
}

fn ordinal(i: usize) -> &'static str {
    match i {
        0 => "First signature",
        1 => "Second signature",
        _ => "Further signature",
    }
}

/// The fields a payment's signature binds, in words, from its canonical inputs: amount,
/// payee, IBAN (masked where the tool redacts it), invoice, value date; and the inputs hash,
/// which binds every other member too.
fn shown_fields(
    tool: &countersign_core::registry::Tool,
    inputs: &Value,
    inputs_hash: &str,
) -> Vec<(String, String)> {
    let text = |k: &str| inputs.get(k).and_then(Value::as_str).map(str::to_string);
    let redacted = |k: &str| tool.redact.iter().any(|r| r.field == k);
    let mut out = Vec::new();
    if let Some(amount) = inputs.get("amount").and_then(Value::as_f64) {
        let currency = text("currency");
        if let Some(a) = countersign_app::inbox::format_amount(amount, currency.as_deref()) {
            out.push(("Amount".into(), a));
        }
    }
    for (key, label) in [
        ("payee", "Payee"),
        ("supplier_name", "Payee"),
        ("supplier_id", "Supplier"),
        ("iban", "IBAN"),
        ("invoice_id", "Invoice"),
        ("value_date", "Value date"),
    ] {
        if let Some(v) = text(key) {
            let shown = if redacted(key) { mask(&v) } else { v };
            out.push((label.into(), shown));
        }
    }
    out.push(("Inputs hash".into(), inputs_hash.to_string()));
    out
}

/// A redacted value as an approver may see it: its first four and last four characters.
fn mask(value: &str) -> String {
    let chars: Vec<char> = value.chars().filter(|c| !c.is_whitespace()).collect();
    if chars.len() <= 8 {
        return "••••".into();
    }
    let head: String = chars[..4].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head} •••• {tail}")
}
