//! Reading the parts of a registry file beside the tools themselves: providers, roles, and a
//! tool's approval settings, handler and redaction rules.

use super::load::{
    APPROVAL_KEYS, Fields, HANDLER_KEYS, PROVIDER_KEYS, REDACT_KEYS, ROLE_KEYS, Raw,
    parse_provider_kind,
};
use super::model::{
    Approval, DEFAULT_APPROVAL_EXPIRY, Handler, Provider, ProviderKind, RedactHow, Redaction, Role,
};
use super::names::{ProviderName, RoleName};
use super::problems::{Problem, Sink, Subject};
use super::span::Span;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

pub(crate) fn parse_providers(
    raw: &BTreeMap<String, Raw>,
    problems: &mut Vec<Problem>,
) -> BTreeMap<ProviderName, Provider> {
    let mut out = BTreeMap::new();
    for (name, r) in raw {
        let mut sink = Sink {
            problems,
            source: &r.source,
            subject: Subject::Provider(name.clone()),
        };
        let parsed_name = ProviderName::parse(name).map_err(|e| sink.push("", e.to_string()));
        let Some(f) = Fields::new(&r.value, String::new(), PROVIDER_KEYS, &mut sink) else {
            continue;
        };
        f.finish(&mut sink);
        let kind = f.req::<String>("kind", &mut sink).and_then(|k| {
            let parsed = parse_provider_kind(&k);
            if parsed.is_none() {
                sink.push(
                    "/kind",
                    format!("unknown provider kind `{k}` (http, mcp, builtin)"),
                );
            }
            parsed
        });
        let description: Option<String> = f.opt("description", &mut sink);
        let base_url: Option<String> = f.opt("base_url", &mut sink);
        let url: Option<String> = f.opt("url", &mut sink);
        let allowed_hosts: BTreeSet<String> = f
            .opt::<Vec<String>>("allowed_hosts", &mut sink)
            .unwrap_or_default()
            .into_iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        let open_world: Option<bool> = f.opt("open_world", &mut sink);
        let Some(kind) = kind else { continue };
        let (needs, forbids) = match kind {
            ProviderKind::Http => (Some("base_url"), Some("url")),
            ProviderKind::Mcp => (Some("url"), Some("base_url")),
            ProviderKind::Builtin => (None, None),
        };
        let endpoint = match kind {
            ProviderKind::Http => base_url.as_ref(),
            ProviderKind::Mcp => url.as_ref(),
            ProviderKind::Builtin => None,
        };
        if let Some(key) = needs
            && f.raw(key).is_none()
        {
            sink.push("", format!("a `{}` provider needs `{key}`", kind.as_str()));
        }
        for key in forbids.into_iter().chain(match kind {
            ProviderKind::Builtin => vec!["base_url", "url", "allowed_hosts"],
            ProviderKind::Http | ProviderKind::Mcp => vec![],
        }) {
            if f.raw(key).is_some() {
                sink.push(
                    format!("/{key}"),
                    format!("a `{}` provider has no `{key}`", kind.as_str()),
                );
            }
        }
        if let (Some(key), Some(endpoint)) = (needs, endpoint) {
            match url::Url::parse(endpoint) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => match u.host_str() {
                    Some(host) if allowed_hosts.contains(&host.to_ascii_lowercase()) => {}
                    Some(host) => sink.push(
                        "/allowed_hosts",
                        format!("the host of `{key}` ({host}) must be listed in `allowed_hosts`"),
                    ),
                    None => sink.push(format!("/{key}"), "the URL has no host"),
                },
                Ok(u) => sink.push(
                    format!("/{key}"),
                    format!("scheme `{}` is not http or https", u.scheme()),
                ),
                Err(e) => sink.push(format!("/{key}"), format!("not a URL: {e}")),
            }
        }
        if let Ok(name) = parsed_name {
            let open_world = open_world.unwrap_or(match kind {
                ProviderKind::Builtin => false,
                ProviderKind::Http | ProviderKind::Mcp => true,
            });
            out.insert(
                name.clone(),
                Provider {
                    name,
                    kind,
                    description,
                    base_url,
                    url,
                    allowed_hosts,
                    open_world,
                },
            );
        }
    }
    out
}

pub(crate) type RoleTools = BTreeMap<RoleName, Vec<(usize, String)>>;

pub(crate) fn parse_roles(
    raw: &BTreeMap<String, Raw>,
    problems: &mut Vec<Problem>,
) -> (BTreeMap<RoleName, Role>, RoleTools) {
    let mut roles = BTreeMap::new();
    let mut role_tools = BTreeMap::new();
    for (name, r) in raw {
        let mut sink = Sink {
            problems,
            source: &r.source,
            subject: Subject::Role(name.clone()),
        };
        let parsed_name = RoleName::parse(name).map_err(|e| sink.push("", e.to_string()));
        let Some(f) = Fields::new(&r.value, String::new(), ROLE_KEYS, &mut sink) else {
            continue;
        };
        f.finish(&mut sink);
        let description: Option<String> = f.req("description", &mut sink);
        if description.as_deref().is_some_and(|d| d.trim().is_empty()) {
            sink.push("/description", "the description is empty");
        }
        let tools: Vec<String> = f.opt("tools", &mut sink).unwrap_or_default();
        if let Ok(name) = parsed_name {
            role_tools.insert(name.clone(), tools.into_iter().enumerate().collect());
            roles.insert(
                name.clone(),
                Role {
                    name,
                    description: description.unwrap_or_default(),
                },
            );
        }
    }
    (roles, role_tools)
}

pub(crate) fn parse_approval(v: &Value, sink: &mut Sink<'_>) -> Option<Approval> {
    let f = Fields::new(v, "/approval".into(), APPROVAL_KEYS, sink)?;
    f.finish(sink);
    let approver_roles = f
        .opt::<Vec<String>>("approver_roles", sink)
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| {
            RoleName::parse(&r)
                .map_err(|e| sink.push(format!("/approval/approver_roles/{i}"), e.to_string()))
                .ok()
        })
        .collect();
    let expires: Option<Span> = f.opt("expires", sink);
    let step_up_max_age: Option<Span> = f.opt("step_up_max_age", sink);
    let four_eyes: Option<bool> = f.opt("four_eyes", sink);
    let party_confirms: Option<bool> = f.opt("party_confirms", sink);
    let second_approval_above: Option<serde_json::Number> = f.opt("second_approval_above", sink);
    if second_approval_above
        .as_ref()
        .and_then(serde_json::Number::as_f64)
        .is_some_and(|n| n < 0.0)
    {
        sink.push("/approval/second_approval_above", "must not be negative");
    }
    let reversal_cost: Option<serde_json::Number> = f.opt("reversal_cost", sink);
    if reversal_cost
        .as_ref()
        .and_then(serde_json::Number::as_f64)
        .is_some_and(|n| n < 0.0)
    {
        sink.push("/approval/reversal_cost", "must not be negative");
    }
    let signature: Option<String> = f.opt("signature", sink);
    let signature_required = match signature.as_deref() {
        None | Some("none") => false,
        Some("required") => true,
        Some(other) => {
            sink.push(
                "/approval/signature",
                format!("must be required or none, not {other:?}"),
            );
            false
        }
    };
    if party_confirms == Some(true) && second_approval_above.is_some() {
        sink.push(
            "/approval/party_confirms",
            "a party's own confirmation has one approver: it cannot ask for a second above an amount",
        );
    }
    Some(Approval {
        approver_roles,
        expires: expires.unwrap_or(DEFAULT_APPROVAL_EXPIRY),
        step_up_max_age,
        four_eyes: four_eyes.unwrap_or(false),
        second_approval_above,
        party_confirms: party_confirms.unwrap_or(false),
        reversal_cost,
        signature_required,
    })
}

pub(crate) fn valid_operation(op: &str) -> bool {
    !op.is_empty()
        && op.len() <= 128
        && op
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
}

pub(crate) fn parse_handler(v: &Value, sink: &mut Sink<'_>) -> Option<Handler> {
    let (provider, operation) = match v {
        // Short form from the seed: `erp.payments.schedule` = provider `erp`, operation
        // `payments.schedule`.
        Value::String(s) => match s.split_once('.') {
            Some((p, op)) => (p.to_string(), op.to_string()),
            None => {
                sink.push(
                    "/handler",
                    "write the handler as `provider.operation` or {provider, operation}",
                );
                return None;
            }
        },
        other => {
            let f = Fields::new(other, "/handler".into(), HANDLER_KEYS, sink)?;
            f.finish(sink);
            let provider: Option<String> = f.req("provider", sink);
            let operation: Option<String> = f.req("operation", sink);
            (provider?, operation?)
        }
    };
    let provider = ProviderName::parse(&provider)
        .map_err(|e| sink.push("/handler/provider", e.to_string()))
        .ok();
    if !valid_operation(&operation) {
        sink.push(
            "/handler/operation",
            "an operation is 1-128 characters of letters, digits, '.', '_', '-', '/'",
        );
        return None;
    }
    Some(Handler {
        provider: provider?,
        operation,
    })
}

pub(crate) fn parse_redact(items: &[Value], sink: &mut Sink<'_>) -> Vec<Redaction> {
    let mut out: Vec<Redaction> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("/redact/{i}");
        let parsed = match item {
            Value::String(field) => Some(Redaction {
                field: field.clone(),
                how: RedactHow::Hash,
            }),
            other => Fields::new(other, path.clone(), REDACT_KEYS, sink).and_then(|f| {
                f.finish(sink);
                let field: Option<String> = f.req("field", sink);
                let how = match f.opt::<String>("how", sink).as_deref() {
                    None | Some("hash") => Some(RedactHow::Hash),
                    Some("drop") => Some(RedactHow::Drop),
                    Some(other) => {
                        sink.push(
                            format!("{path}/how"),
                            format!("unknown `how` `{other}` (hash, drop)"),
                        );
                        None
                    }
                };
                Some(Redaction {
                    field: field?,
                    how: how?,
                })
            }),
        };
        let Some(r) = parsed else { continue };
        if r.field.trim().is_empty() {
            sink.push(path, "the field name is empty");
        } else if out.iter().any(|o| o.field == r.field) {
            sink.push(path, format!("`{}` is redacted twice", r.field));
        } else {
            out.push(r);
        }
    }
    out
}

pub(crate) fn numeric_amount(schema: &Value) -> bool {
    let t = schema.pointer("/properties/amount/type");
    match t {
        Some(Value::String(s)) => s == "number" || s == "integer",
        _ => false,
    }
}
