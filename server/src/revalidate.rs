//! Revalidation at execution (seed 004, issue 5): the world moves while an agent thinks, so a
//! step's assumptions are checked again at the boundary, and what a target says it did is read
//! back instead of trusted.
//!
//! * Before the call ([`before`]): a step that carries `observed` state (`[{field, value}]`,
//!   from `plan.submit`) is re-read through its tool's `verify` read tool — the same provider
//!   path, with the step's arguments that the verify tool's input schema names (the resource
//!   ids; after the call, a verify tool taking an `idempotency_key` gets the call's key) — and
//!   each observed `field`, a dotted path into the read result (`slots.2000`), must
//!   still hold `value` (strings compare as text; numbers and booleans by their JSON text).
//! * After a successful call ([`after`]): for tools with a `verify` tool, the state is read back
//!   and must reflect the call's intent. The comparison rule: every argument whose name is a
//!   top-level field of the read result (or that the adapter maps to a dotted path of it with
//!   [`crate::adapters::Adapter::readback_aliases`]: `requested_time` ↔ `time`, an invoice
//!   hold's `amount` ↔ `hold.amount`), and every
//!   top-level field of the target's own answer that the read result also has (`status:
//!   cancelled`), must be equal in the read (`8472` equals `"8472"`).
//!
//! Invariants (fail closed):
//! * Any mismatch, an observed state that cannot be parsed, an observed state on a tool with no
//!   verify tool, or a verify read that fails → the call is not reported as a success. Before
//!   the call that means it never happens ([`STATE_CHANGED`], [`STATE_UNVERIFIED`]); after it,
//!   the effect has happened and is never retried ([`STATE_CHANGED`] again — the state is not
//!   what the step was to make it — or [`READBACK_UNCONFIRMED`]); [`Failure::check`] says
//!   which ([`BEFORE_CALL`], [`READ_BACK`]). Either way the pipeline records the step `failed`
//!   with the rule, the check and the fields, and flags the run for re-planning.
//! * The verify read is Countersign's own read: it carries the step's tenant and party and a key
//!   derived from the step's (`<key>:verify:before|after`); it never mutates.

use serde_json::{Map, Value, json};

use crate::adapters::ADAPTER_TIMEOUT;
use crate::adapters::{AdapterError, Invocation};
use crate::registry::Loaded;
use countersign_core::registry::Tool;
use countersign_core::store::Step;

/// An observed field no longer holds: nothing was called.
pub const STATE_CHANGED: &str = "state.changed";
/// The observed state could not be re-read: nothing was called.
pub const STATE_UNVERIFIED: &str = "state.unverified";
/// The read-back could not be made: the effect happened, success is not reported.
pub const READBACK_UNCONFIRMED: &str = "readback.unconfirmed";

/// A verify tool argument that finds an effect by the key it was sent under (`payment.lookup`):
/// filled with the call's key when reading back.
pub const LOOKUP_KEY_ARGUMENT: &str = "idempotency_key";

/// [`Failure::check`] of the re-read before the call (nothing was called).
pub const BEFORE_CALL: &str = "before_call";
/// [`Failure::check`] of the read-back after an accepted call (the effect happened).
pub const READ_BACK: &str = "read_back";

/// Why a step fails closed.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The rule recorded on the step and in the audit.
    pub rule: &'static str,
    /// Which check failed: [`BEFORE_CALL`] or [`READ_BACK`].
    pub check: &'static str,
    /// For people.
    pub message: String,
    /// The fields that did not hold: `{field, expected, current}`.
    pub fields: Vec<Value>,
}

impl Failure {
    fn new(rule: &'static str, check: &'static str, message: impl Into<String>) -> Self {
        Self {
            rule,
            check,
            message: message.into(),
            fields: Vec::new(),
        }
    }
}

/// Re-reads the step's observed state before its call. `Ok` when there is nothing to check or
/// everything still holds.
pub async fn before(
    loaded: &Loaded,
    tool: &Tool,
    step: &Step,
    call: &Invocation,
) -> Result<(), Failure> {
    let Some(text) = step.observed.as_deref() else {
        return Ok(());
    };
    let observed = parse_observed(text)?;
    if observed.is_empty() {
        return Ok(());
    }
    let current = read(loaded, tool, call, "before")
        .await
        .map_err(|e| Failure::new(STATE_UNVERIFIED, BEFORE_CALL, e))?;
    let mut fields = Vec::new();
    for (field, value) in &observed {
        let now = path(&current, field);
        if now.is_none_or(|v| !holds(v, value)) {
            fields.push(json!({"field": field, "expected": value, "current": now}));
        }
    }
    if fields.is_empty() {
        return Ok(());
    }
    Err(Failure {
        rule: STATE_CHANGED,
        check: BEFORE_CALL,
        message: "the state this step was planned on has changed; it was not executed".into(),
        fields,
    })
}

/// Reads back after a successful call and checks the call's intent is reflected.
pub async fn after(
    loaded: &Loaded,
    tool: &Tool,
    call: &Invocation,
    result: &Value,
) -> Result<(), Failure> {
    if tool.verify.is_none() {
        return Ok(());
    }
    let current = read(loaded, tool, call, "after")
        .await
        .map_err(|e| Failure::new(READBACK_UNCONFIRMED, READ_BACK, e))?;
    let aliases = loaded
        .adapters
        .get(tool.handler.provider.as_str())
        .map(|a| a.readback_aliases(&call.operation))
        .unwrap_or(&[]);
    let mut expected: Vec<(String, Value)> = Vec::new();
    if let Some(args) = call.arguments.as_object() {
        for (name, value) in args {
            let field = aliases
                .iter()
                .find(|(arg, _)| arg == name)
                .map_or(name.as_str(), |(_, f)| f);
            if path(&current, field).is_some() {
                expected.push((field.to_string(), value.clone()));
            }
        }
    }
    if let Some(answer) = result.as_object() {
        for (name, value) in answer {
            if current.get(name).is_some() && !expected.iter().any(|(f, _)| f == name) {
                expected.push((name.clone(), value.clone()));
            }
        }
    }
    let mut fields = Vec::new();
    for (field, want) in &expected {
        let now = path(&current, field);
        if now.is_none_or(|v| !equal(v, want)) {
            fields.push(json!({"field": field, "expected": want, "current": now}));
        }
    }
    if fields.is_empty() {
        return Ok(());
    }
    Err(Failure {
        rule: STATE_CHANGED,
        check: READ_BACK,
        message: "the target accepted the call but its state does not show it; the step is \
                  not reported as a success and the run needs a new plan"
            .into(),
        fields,
    })
}

fn parse_observed(text: &str) -> Result<Vec<(String, String)>, Failure> {
    let unreadable = || {
        Failure::new(
            STATE_CHANGED,
            BEFORE_CALL,
            "the observed state is unreadable",
        )
    };
    let items: Vec<Value> = serde_json::from_str(text).map_err(|_| unreadable())?;
    items
        .iter()
        .map(|o| match (o.get("field"), o.get("value")) {
            (Some(Value::String(f)), Some(Value::String(v))) => Ok((f.clone(), v.clone())),
            _ => Err(unreadable()),
        })
        .collect()
}

/// The current state through the verify tool.
async fn read(
    loaded: &Loaded,
    tool: &Tool,
    call: &Invocation,
    phase: &str,
) -> Result<Value, String> {
    let Some(name) = &tool.verify else {
        return Err(format!(
            "{} has no verify tool to re-read state with",
            tool.name
        ));
    };
    let Some(verify) = loaded.bundle.registry.tool(name) else {
        return Err(format!("verify tool {name} is not in the registry"));
    };
    let Some(adapter) = loaded.adapters.get(verify.handler.provider.as_str()) else {
        return Err(format!("provider of {name} is not served"));
    };
    let names = verify
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut arguments: Map<String, Value> = call
        .arguments
        .as_object()
        .map(|args| {
            args.iter()
                .filter(|(k, _)| names.contains_key(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    // After the call, a verify tool that looks effects up by key gets the call's key.
    if phase == "after"
        && names.contains_key(LOOKUP_KEY_ARGUMENT)
        && !arguments.contains_key(LOOKUP_KEY_ARGUMENT)
    {
        arguments.insert(LOOKUP_KEY_ARGUMENT.into(), json!(call.idem_key));
    }
    let invocation = Invocation {
        tool: verify.name.as_str().to_string(),
        operation: verify.handler.operation.clone(),
        arguments: Value::Object(arguments),
        idem_key: format!("{}:verify:{phase}", call.idem_key),
        approval_token: None,
        trace_id: call.trace_id.clone(),
        tenant: call.tenant.clone(),
        acts_for: call.acts_for.clone(),
        resend: false,
    };
    match tokio::time::timeout(ADAPTER_TIMEOUT, adapter.invoke(&invocation)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(format!("re-reading through {name} failed: {}", short(&e))),
        Err(_) => Err(format!("re-reading through {name} timed out")),
    }
}

fn short(e: &AdapterError) -> String {
    match e {
        AdapterError::Rejected { code, .. } => format!("rejected ({code})"),
        AdapterError::Unavailable(_) => "unavailable".into(),
        AdapterError::Timeout => "timeout".into(),
        AdapterError::Refused(_) => "refused".into(),
    }
}

/// The value at a dotted path (`slots.2000`, `lines.0.amount`).
fn path<'a>(value: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(value, |v, seg| match v {
        Value::Object(m) => m.get(seg),
        Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

/// A scalar's text: strings as they are, numbers and booleans as JSON.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(_) | Value::Bool(_) => Some(v.to_string()),
        _ => None,
    }
}

/// Whether the current `now` is what was observed as `text`: the same text, or, for a number,
/// the same value however it was written (`4180.00` for `4180.0`).
fn holds(now: &Value, text: &str) -> bool {
    if scalar_text(now).as_deref() == Some(text) {
        return true;
    }
    let (Value::Number(n), Ok(Value::Number(t))) =
        (now, serde_json::from_str::<Value>(text.trim()))
    else {
        return false;
    };
    // Integers compare exactly; a fraction compares as f64 only with values an f64 holds
    // exactly (a long id above 2^53 is never "equal" by rounding).
    match (n.as_i128(), t.as_i128()) {
        (Some(a), Some(b)) => a == b,
        _ => matches!((exact_f64(n), exact_f64(&t)), (Some(a), Some(b)) if a == b),
    }
}

/// `n` as an f64 when that loses nothing.
fn exact_f64(n: &serde_json::Number) -> Option<f64> {
    const EXACT: i128 = 1 << 53;
    match n.as_i128() {
        Some(i) if i.abs() <= EXACT => n.as_f64(),
        Some(_) => None,
        None => n.as_f64().filter(|f| f.is_finite()),
    }
}

fn equal(a: &Value, b: &Value) -> bool {
    a == b || matches!((scalar_text(a), scalar_text(b)), (Some(x), Some(y)) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_scalars() {
        let v = json!({"slots": {"2000": "free"}, "lines": [{"n": 1}], "id": 8472});
        assert_eq!(path(&v, "slots.2000"), Some(&json!("free")));
        assert_eq!(path(&v, "lines.0.n"), Some(&json!(1)));
        assert_eq!(path(&v, "slots.2030"), None);
        assert_eq!(path(&v, "id.x"), None);
        assert!(equal(&json!(8472), &json!("8472")));
        assert!(!equal(&json!({"a": 1}), &json!("{\"a\":1}")));
        assert!(!equal(&json!("20:00"), &json!("19:30")));
        // An observed number holds however it was written; nothing else is coerced.
        assert!(holds(&json!(4180.0), "4180.00"));
        assert!(holds(&json!(4180.0), "4180"));
        assert!(holds(&json!(4180), "4180.0"));
        assert!(!holds(&json!(4180.0), "4180.01"));
        assert!(!holds(&json!("4180.0"), "4180.00"), "a string stays text");
        assert!(!holds(&json!(1.0), "NaN"));
        // Long ids: exact, never equal by rounding.
        assert!(holds(&json!(9_007_199_254_740_993_u64), "9007199254740993"));
        assert!(!holds(
            &json!(9_007_199_254_740_993_u64),
            "9007199254740992"
        ));
        assert!(!holds(
            &json!(9_007_199_254_740_993_u64),
            "9007199254740992.0"
        ));
        assert!(holds(&json!("free"), "free"));
        assert!(!holds(&json!({"a": 1}), "{\"a\":1}"));
    }

    #[test]
    fn observed_state_that_does_not_parse_fails_closed() {
        assert!(parse_observed("[{\"field\":\"time\",\"value\":\"19:30\"}]").is_ok());
        for bad in [
            "{}",
            "[{\"field\":\"time\"}]",
            "[{\"field\":1,\"value\":\"x\"}]",
            "nope",
        ] {
            assert_eq!(
                parse_observed(bad).map_err(|f| f.rule),
                Err(STATE_CHANGED),
                "{bad}"
            );
        }
    }
}
