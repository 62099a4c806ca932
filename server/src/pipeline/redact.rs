//! What the audit and the agent see of redacted values.

use crate::AppState;
use countersign_core::redact::{HASH_PREFIX, RedactionKey};
use countersign_core::registry::Tool;
use serde_json::{Map, Value, json};

/// The inputs as the audit records them: the tool's `redact` fields replaced by keyed HMAC
/// digests (config `redaction_key`; equal values still compare equal) or dropped. Without a
/// configured key, hashed fields are keyed by this process's random key ([`redacted`]): equal
/// only within one process's records. Never the clear value.
pub fn audit_inputs(state: &AppState, tool: &Tool, arguments: &Value) -> Value {
    use countersign_core::redact::{FieldSelector, How, RedactRule, redact};
    if tool.handler.provider.as_str() == crate::runs::PROVIDER
        && tool.handler.operation == "plan.submit"
    {
        return plan_audit_inputs(state, arguments);
    }
    let Some(key) = &state.redaction else {
        return redacted(&state.shown_key, tool, arguments);
    };
    let rules: Vec<RedactRule> = tool
        .redact
        .iter()
        .filter_map(|r| {
            Some(RedactRule {
                field: FieldSelector::parse(&r.field).ok()?,
                how: match r.how {
                    countersign_core::registry::RedactHow::Hash => How::Hash,
                    countersign_core::registry::RedactHow::Drop => How::Drop,
                },
            })
        })
        .collect();
    if rules.len() != tool.redact.len() {
        // A rule that does not parse: record nothing rather than something in clear.
        return json!({"withheld": "redaction rule did not parse"});
    }
    match redact(arguments, &rules, key) {
        Ok(r) => r.value,
        Err(_) => json!({"withheld": "value could not be redacted"}),
    }
}

/// A plan's inputs for the audit record: each step's `arguments` redacted by that step's own
/// tool (an IBAN in a planned `supplier.update_iban` is hashed like in a direct call). A step
/// whose tool is not in the registry in force keeps no arguments (fail closed).
pub(super) fn plan_audit_inputs(state: &AppState, arguments: &Value) -> Value {
    let mut out = arguments.clone();
    let loaded = state.registry.current();
    if let Some(steps) = out.get_mut("steps").and_then(Value::as_array_mut) {
        for step in steps {
            let tool = step
                .get("tool")
                .and_then(Value::as_str)
                .and_then(|n| countersign_core::ToolName::parse(n).ok())
                .and_then(|n| {
                    loaded
                        .as_ref()
                        .and_then(|l| l.bundle.registry.tool(&n).cloned())
                });
            let Some(obj) = step.as_object_mut() else {
                continue;
            };
            let shown = match (&tool, obj.get("arguments")) {
                (Some(t), Some(a)) if t.handler.provider.as_str() != crate::runs::PROVIDER => {
                    audit_inputs(state, t, a)
                }
                (_, None) => continue,
                _ => json!({"withheld": "no such tool to redact by"}),
            };
            obj.insert("arguments".into(), shown);
        }
    }
    out
}

/// `result` with the tool's `redact` fields hidden from the agent (hashed with `key`, the
/// server's [`crate::AppParts::shown_key`], when the rule says hash: equal values still compare
/// equal; dropped otherwise). A rule's field is
/// a bare member name (any depth) or a dotted path from the root (arrays transparent), as in
/// the audit's redaction; when two rules match one member, drop wins. A rule that does not
/// parse withholds the whole value (fail closed).
pub fn redacted(key: &RedactionKey, tool: &Tool, result: &Value) -> Value {
    use countersign_core::redact::FieldSelector;
    use countersign_core::registry::RedactHow;
    if tool.redact.is_empty() {
        return result.clone();
    }
    let Ok(rules) = tool
        .redact
        .iter()
        .map(|r| FieldSelector::parse(&r.field).map(|f| (f, r.how)))
        .collect::<Result<Vec<_>, _>>()
    else {
        return json!({"withheld": "redaction rule did not parse"});
    };
    fn walk<'a>(
        key: &RedactionKey,
        v: &'a Value,
        rules: &[(FieldSelector, RedactHow)],
        at: &mut Vec<&'a str>,
    ) -> Value {
        match v {
            Value::Object(map) => {
                let mut out = Map::new();
                for (k, v) in map {
                    at.push(k);
                    let mut hows = rules.iter().filter(|(f, _)| f.matches(at)).map(|(_, h)| *h);
                    match hows.next() {
                        None => {
                            out.insert(k.clone(), walk(key, v, rules, at));
                        }
                        Some(first) => {
                            if first == RedactHow::Hash && hows.all(|h| h == RedactHow::Hash) {
                                out.insert(k.clone(), json!(hash_value(key, v)));
                            }
                        }
                    }
                    at.pop();
                }
                Value::Object(out)
            }
            Value::Array(items) => {
                Value::Array(items.iter().map(|i| walk(key, i, rules, at)).collect())
            }
            other => other.clone(),
        }
    }
    walk(key, result, &rules, &mut Vec::new())
}

/// What an agent sees of a hashed value: `redacted:hmac-sha256:` and 128 bits of its keyed
/// digest (equal values compare equal; a dictionary of guesses needs the key). A value with
/// no canonical form shows nothing of itself.
pub(super) fn hash_value(key: &RedactionKey, v: &Value) -> String {
    match key.digest(v) {
        Ok(digest) => format!(
            "redacted:{}",
            digest.get(..HASH_PREFIX.len() + 32).unwrap_or(&digest)
        ),
        Err(_) => "redacted:withheld".to_string(),
    }
}
