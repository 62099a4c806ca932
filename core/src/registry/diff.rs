//! What changed between two registries, as readable lines for a reviewing admin and for the
//! stored version history.
//!
//! Lines start with `+` (added), `-` (removed) or `~` (changed). Role changes are computed
//! from the derived role → tools listing, so a tool gained by a role shows as
//! `+ role worker.finance lists payment.schedule` whichever side of the YAML declared it.
//! Schema changes are listed per JSON pointer (at most [`MAX_SCHEMA_LINES`] per schema).

use std::collections::BTreeSet;
use std::fmt;

use serde_json::Value;

use super::closure::escape_segment;
use super::load::gate_str;
use super::model::{Approval, Provider, Registry, Tool};

/// Most lines reported for one changed schema.
pub const MAX_SCHEMA_LINES: usize = 20;

/// The changes from one registry to another.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryDiff {
    lines: Vec<String>,
}

impl RegistryDiff {
    /// One line per change.
    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// No change at all.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }
}

impl fmt::Display for RegistryDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.lines.join("\n"))
    }
}

/// Lists what changed from `old` to `new`.
pub fn diff(old: &Registry, new: &Registry) -> RegistryDiff {
    let mut lines = Vec::new();

    for (name, p) in &new.providers {
        match old.providers.get(name) {
            None => lines.push(format!("+ provider {name} ({})", p.kind.as_str())),
            Some(o) if o != p => lines.push(format!(
                "~ provider {name}: {} -> {}",
                provider_summary(o),
                provider_summary(p)
            )),
            Some(_) => {}
        }
    }
    for name in old
        .providers
        .keys()
        .filter(|n| !new.providers.contains_key(*n))
    {
        lines.push(format!("- provider {name}"));
    }

    for (name, r) in &new.roles {
        match old.roles.get(name) {
            None => lines.push(format!("+ role {name}")),
            Some(o) if o.description != r.description => {
                lines.push(format!("~ role {name}: description changed"));
            }
            Some(_) => {}
        }
    }
    for name in old.roles.keys().filter(|n| !new.roles.contains_key(*n)) {
        lines.push(format!("- role {name}"));
    }
    let empty = BTreeSet::new();
    let roles: BTreeSet<_> = old.listing.keys().chain(new.listing.keys()).collect();
    for role in roles {
        let before = old.listing.get(role).unwrap_or(&empty);
        let after = new.listing.get(role).unwrap_or(&empty);
        for t in after.difference(before) {
            lines.push(format!("+ role {role} lists {t}"));
        }
        for t in before.difference(after) {
            lines.push(format!("- role {role} no longer lists {t}"));
        }
    }

    for (name, t) in &new.tools {
        match old.tools.get(name) {
            None => lines.push(format!(
                "+ tool {name} ({}, gate {})",
                t.effect.as_str(),
                gate_str(t.gate)
            )),
            Some(o) => tool_changes(o, t, &mut lines),
        }
    }
    for name in old.tools.keys().filter(|n| !new.tools.contains_key(*n)) {
        lines.push(format!("- tool {name}"));
    }
    RegistryDiff { lines }
}

fn provider_summary(p: &Provider) -> String {
    let mut s = p.kind.as_str().to_string();
    if let Some(u) = p.base_url.as_ref().or(p.url.as_ref()) {
        s.push(' ');
        s.push_str(u);
    }
    if !p.allowed_hosts.is_empty() {
        let hosts: Vec<&str> = p.allowed_hosts.iter().map(String::as_str).collect();
        s.push_str(&format!(" hosts [{}]", hosts.join(", ")));
    }
    s.push_str(if p.open_world {
        " open-world"
    } else {
        " closed-world"
    });
    s
}

fn opt_name<T: fmt::Display>(v: &Option<T>) -> String {
    v.as_ref()
        .map_or_else(|| "none".to_string(), ToString::to_string)
}

fn approval_summary(a: &Option<Approval>) -> String {
    match a {
        None => "none".into(),
        Some(a) => {
            let roles: Vec<&str> = a.approver_roles.iter().map(|r| r.as_str()).collect();
            let mut s = format!("approvers [{}], expires {}", roles.join(", "), a.expires);
            if let Some(m) = a.step_up_max_age {
                s.push_str(&format!(", step-up {m}"));
            }
            if a.four_eyes {
                s.push_str(", four eyes");
            }
            if a.party_confirms {
                s.push_str(", confirmed by the party");
            }
            if let Some(n) = &a.second_approval_above {
                s.push_str(&format!(", second approval above {n}"));
            }
            if let Some(k) = &a.reversal_cost {
                s.push_str(&format!(", reversal cost {k} approvals"));
            }
            if a.signature_required {
                s.push_str(", signed with a passkey");
            }
            s
        }
    }
}

fn tool_changes(o: &Tool, t: &Tool, lines: &mut Vec<String>) {
    let name = &t.name;
    let mut field = |what: &str, before: String, after: String| {
        if before != after {
            lines.push(format!("~ tool {name}: {what} {before} -> {after}"));
        }
    };
    field("effect", o.effect.as_str().into(), t.effect.as_str().into());
    field("gate", gate_str(o.gate).into(), gate_str(t.gate).into());
    let review = |t: &Tool| {
        if t.review_required {
            "required"
        } else {
            "none"
        }
        .to_string()
    };
    field("review", review(o), review(t));
    field("version", o.version.to_string(), t.version.to_string());
    field("title", opt_name(&o.title), opt_name(&t.title));
    if o.description != t.description {
        field("description", "(old text)".into(), "(new text)".into());
    }
    field(
        "approval",
        approval_summary(&o.approval),
        approval_summary(&t.approval),
    );
    field(
        "handler",
        format!("{}/{}", o.handler.provider, o.handler.operation),
        format!("{}/{}", t.handler.provider, t.handler.operation),
    );
    field(
        "compensate",
        opt_name(&o.compensate),
        opt_name(&t.compensate),
    );
    field("verify", opt_name(&o.verify), opt_name(&t.verify));
    field("reconcile", opt_name(&o.reconcile), opt_name(&t.reconcile));
    let redact = |t: &Tool| {
        let parts: Vec<String> = t
            .redact
            .iter()
            .map(|r| format!("{}:{}", r.field, r.how.as_str()))
            .collect();
        format!("[{}]", parts.join(", "))
    };
    field("redact", redact(o), redact(t));
    let resources = |t: &Tool| {
        let parts: Vec<String> = t
            .resources
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        format!("[{}]", parts.join(", "))
    };
    field("resources", resources(o), resources(t));
    schema_changes(
        name.as_str(),
        "inputSchema",
        Some(&o.input_schema),
        Some(&t.input_schema),
        lines,
    );
    schema_changes(
        name.as_str(),
        "outputSchema",
        o.output_schema.as_ref(),
        t.output_schema.as_ref(),
        lines,
    );
}

fn schema_changes(
    tool: &str,
    which: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    lines: &mut Vec<String>,
) {
    let mut changes = Vec::new();
    match (old, new) {
        (None, None) => {}
        (None, Some(_)) => changes.push("added".to_string()),
        (Some(_), None) => changes.push("removed".to_string()),
        (Some(a), Some(b)) => json_changes("", a, b, &mut changes),
    }
    let total = changes.len();
    for c in changes.into_iter().take(MAX_SCHEMA_LINES) {
        lines.push(format!("~ tool {tool}: {which}{c}"));
    }
    if total > MAX_SCHEMA_LINES {
        lines.push(format!(
            "~ tool {tool}: {which} … and {} more change(s)",
            total - MAX_SCHEMA_LINES
        ));
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        let mut out: String = s.chars().take(60).collect();
        out.push('…');
        out
    } else {
        s
    }
}

fn json_changes(ptr: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = format!("{ptr}/{}", escape_segment(k));
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) => json_changes(&p, va, vb, out),
                    (None, Some(vb)) => out.push(format!(" {p}: added {}", short(vb))),
                    (Some(_), None) => out.push(format!(" {p}: removed")),
                    (None, None) => {}
                }
            }
        }
        _ if a == b => {}
        _ => {
            let shown = if ptr.is_empty() { "/" } else { ptr };
            out.push(format!(" {shown}: {} -> {}", short(a), short(b)));
        }
    }
}
