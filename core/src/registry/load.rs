//! Loading a registry from YAML: parse, merge, check, build — refusing on any problem and
//! reporting every problem at once.
//!
//! # Format
//!
//! ```yaml
//! providers:
//!   erp: {kind: builtin, description: Demo ERP}
//!   bank: {kind: http, base_url: "https://bank.example/api", allowed_hosts: [bank.example]}
//! roles:
//!   worker.finance: {description: Pays approved invoices, tools: [invoice.get]}
//! tools:
//!   payment.schedule:
//!     title: Schedule a supplier payment
//!     description: …
//!     version: 1                     # default 1
//!     effect: irreversible           # read | write | irreversible
//!     gate: always                   # never | always | policy
//!     roles: [worker.finance]
//!     approval: {approver_roles: [approver], expires: 72h, step_up_max_age: 15m,
//!                four_eyes: false, second_approval_above: 10000}
//!     handler: {provider: erp, operation: payments.schedule}   # or "erp.payments.schedule"
//!     compensate: …                  # verify: …, reconcile: … (tool names)
//!     redact: [iban, {field: contact_email, how: drop}]         # bare name = hash
//!     resources: {invoice_id: invoice}
//!     inputSchema: {…}               # closed, see `closure`
//!     outputSchema: {…}              # optional
//! ```
//!
//! # Rules (each broken rule is one [`Problem`])
//!
//! * YAML parses; the top level has only `tools`, `roles`, `providers`; every tool, role,
//!   approval, handler, redaction and provider has only its known keys (unknown keys are
//!   refused, like serde's `deny_unknown_fields`, but each one is reported with its path).
//! * Names follow the name alphabet ([`super::ToolName`]); a tool, role or provider defined
//!   in two files is refused.
//! * `effect` is `read`, `write` or `irreversible`; `gate` is `never`, `always` or `policy`;
//!   both are required. An irreversible tool is never `gate: never`.
//! * Every tool is listed for at least one role (on the tool or in a role's `tools`); every
//!   role named on a tool is declared under `roles:`; every tool a role names exists.
//! * A gated tool (`always` or `policy`) has at least one approver role; approver roles are
//!   people's app roles and may not be agent roles declared under `roles:`;
//!   `second_approval_above` needs a numeric `amount` argument.
//! * `compensate`, `verify` and `reconcile` name existing tools; `verify` and `reconcile`
//!   name read tools; read and irreversible tools have no `compensate`.
//! * The handler names a declared provider; an `http` provider has a `base_url`, an `mcp`
//!   provider a `url` (http or https, host listed in `allowed_hosts`), a `builtin` one neither.
//! * `resources` keys are top-level properties of the input schema; `redact` fields are
//!   non-empty and not repeated.
//! * The input schema passes [`super::closure`]; input and output schemas compile
//!   ([`crate::schema::compile`]).

pub use super::problems::{LoadError, Problem, Problems, Subject};
pub(crate) use super::problems::{Sink, ptr};
pub(crate) use super::tool_parts::{
    RoleTools, numeric_amount, parse_approval, parse_handler, parse_providers, parse_redact,
    parse_roles,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::closure::check_input_schema;
use super::model::{Approval, Handler, Provider, ProviderKind, Redaction, Registry, Role, Tool};
use super::names::is_valid_name;
use super::names::{ProviderName, RoleName, ToolName};
use crate::model::{Effect, Gate};
use crate::schema::Validators;

/// Reads a file, or every `*.yaml` / `*.yml` file of a folder in name order.
pub(crate) fn load_path(path: &Path) -> Result<Registry, LoadError> {
    let io = |source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    let mut files = Vec::new();
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).map_err(io)? {
            let p = entry.map_err(io)?.path();
            let yaml = p
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e == "yaml" || e == "yml");
            if yaml && p.is_file() {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut sources = Vec::with_capacity(files.len());
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|source| LoadError::Io {
            path: f.clone(),
            source,
        })?;
        sources.push((f.display().to_string(), text));
    }
    load_sources(&sources)
}

/// A YAML mapping being read field by field: every field's problem is reported at its own
/// path, and [`Fields::finish`] reports every unknown key.
pub(crate) struct Fields<'a> {
    pub(crate) map: &'a Map<String, Value>,
    pub(crate) base: String,
    pub(crate) known: &'static [&'static str],
}

impl<'a> Fields<'a> {
    pub(crate) fn new(
        value: &'a Value,
        base: String,
        known: &'static [&'static str],
        sink: &mut Sink<'_>,
    ) -> Option<Self> {
        match value {
            Value::Object(map) => Some(Self { map, base, known }),
            other => {
                sink.push(
                    base,
                    format!("expected a mapping, found {}", kind_of(other)),
                );
                None
            }
        }
    }

    pub(crate) fn raw(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn opt<T: DeserializeOwned>(&self, key: &str, sink: &mut Sink<'_>) -> Option<T> {
        let value = self.raw(key)?;
        match serde_json::from_value::<T>(value.clone()) {
            Ok(v) => Some(v),
            Err(e) => {
                sink.push(ptr(&self.base, key), e.to_string());
                None
            }
        }
    }

    pub(crate) fn req<T: DeserializeOwned>(&self, key: &str, sink: &mut Sink<'_>) -> Option<T> {
        if self.raw(key).is_none() {
            sink.push(self.base.clone(), format!("missing required key `{key}`"));
            return None;
        }
        self.opt(key, sink)
    }

    pub(crate) fn finish(&self, sink: &mut Sink<'_>) {
        for key in self.map.keys() {
            if !self.known.contains(&key.as_str()) {
                sink.push(
                    ptr(&self.base, key),
                    format!("unknown key `{key}` (known: {})", self.known.join(", ")),
                );
            }
        }
    }
}

pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// One entity as found in a source.
pub(crate) struct Raw {
    pub(crate) source: String,
    pub(crate) value: Value,
}

pub(crate) const TOP_KEYS: &[&str] = &["tools", "roles", "providers"];
pub(crate) const TOOL_KEYS: &[&str] = &[
    "title",
    "description",
    "version",
    "effect",
    "gate",
    "review",
    "roles",
    "approval",
    "handler",
    "compensate",
    "verify",
    "reconcile",
    "redact",
    "resources",
    "inputSchema",
    "outputSchema",
];
pub(crate) const APPROVAL_KEYS: &[&str] = &[
    "approver_roles",
    "expires",
    "step_up_max_age",
    "four_eyes",
    "second_approval_above",
    "party_confirms",
    "reversal_cost",
    "signature",
];
pub(crate) const HANDLER_KEYS: &[&str] = &["provider", "operation"];
pub(crate) const REDACT_KEYS: &[&str] = &["field", "how"];
pub(crate) const ROLE_KEYS: &[&str] = &["description", "tools"];
pub(crate) const PROVIDER_KEYS: &[&str] = &[
    "kind",
    "description",
    "base_url",
    "url",
    "allowed_hosts",
    "open_world",
];

pub(crate) fn gate_str(g: Gate) -> &'static str {
    match g {
        Gate::Never => "never",
        Gate::Always => "always",
        Gate::Policy => "policy",
    }
}

pub(crate) fn parse_gate(s: &str) -> Option<Gate> {
    [Gate::Never, Gate::Always, Gate::Policy]
        .into_iter()
        .find(|g| gate_str(*g) == s)
}

pub(crate) fn parse_provider_kind(s: &str) -> Option<ProviderKind> {
    [ProviderKind::Http, ProviderKind::Mcp, ProviderKind::Builtin]
        .into_iter()
        .find(|k| k.as_str() == s)
}

/// A tool as parsed, before cross-references are resolved.
pub(crate) struct Draft {
    source: String,
    name: ToolName,
    title: Option<String>,
    description: Option<String>,
    version: u32,
    effect: Option<Effect>,
    gate: Option<Gate>,
    roles: Vec<(usize, RoleName)>,
    approval: Option<Approval>,
    handler: Option<Handler>,
    compensate: Option<ToolName>,
    verify: Option<ToolName>,
    reconcile: Option<ToolName>,
    redact: Vec<Redaction>,
    resources: BTreeMap<String, String>,
    input_schema: Option<Value>,
    output_schema: Option<Value>,
    per_step_paths: Vec<String>,
    review_required: bool,
}

/// Loads and merges `(source name, YAML text)` pairs.
pub(crate) fn load_sources(sources: &[(String, String)]) -> Result<Registry, LoadError> {
    let mut problems = Vec::new();
    let mut raw_tools: BTreeMap<String, Raw> = BTreeMap::new();
    let mut raw_roles: BTreeMap<String, Raw> = BTreeMap::new();
    let mut raw_providers: BTreeMap<String, Raw> = BTreeMap::new();

    for (source, text) in sources {
        let mut sink = Sink {
            problems: &mut problems,
            source,
            subject: Subject::File,
        };
        let doc: Value = match serde_norway::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                sink.push("", format!("not valid YAML: {e}"));
                continue;
            }
        };
        if doc.is_null() {
            continue; // an empty file contributes nothing
        }
        let Some(top) = Fields::new(&doc, String::new(), TOP_KEYS, &mut sink) else {
            continue;
        };
        top.finish(&mut sink);
        for (key, into, subject) in [
            (
                "tools",
                &mut raw_tools,
                Subject::Tool as fn(String) -> Subject,
            ),
            ("roles", &mut raw_roles, Subject::Role),
            ("providers", &mut raw_providers, Subject::Provider),
        ] {
            let Some(section) = top.raw(key) else {
                continue;
            };
            let Value::Object(entries) = section else {
                sink.push(
                    format!("/{key}"),
                    format!("expected a mapping of names, found {}", kind_of(section)),
                );
                continue;
            };
            for (name, value) in entries {
                if let Some(first) = into.get(name) {
                    sink.problems.push(Problem {
                        source: source.clone(),
                        subject: subject(name.clone()),
                        path: String::new(),
                        message: format!("defined twice: in {} and in {source}", first.source),
                    });
                    continue;
                }
                into.insert(
                    name.clone(),
                    Raw {
                        source: source.clone(),
                        value: value.clone(),
                    },
                );
            }
        }
    }

    let providers = parse_providers(&raw_providers, &mut problems);
    let (roles, role_tools) = parse_roles(&raw_roles, &mut problems);
    let drafts: Vec<Draft> = raw_tools
        .iter()
        .filter_map(|(name, raw)| parse_tool(name, raw, &mut problems))
        .collect();

    let tools = resolve(
        drafts,
        &raw_tools,
        &raw_roles,
        &roles,
        &role_tools,
        &providers,
        &mut problems,
    );

    let validators = Validators::compile(
        tools
            .values()
            .map(|t| (&t.name, &t.input_schema, t.output_schema.as_ref())),
    );
    let validators = match validators {
        Ok(v) => Some(v),
        Err(failures) => {
            for (tool, e) in failures {
                let source = raw_tools
                    .get(tool.as_str())
                    .map(|r| r.source.clone())
                    .unwrap_or_default();
                problems.push(Problem {
                    source,
                    subject: Subject::Tool(tool.to_string()),
                    path: e.path,
                    message: format!("schema does not compile: {}", e.message),
                });
            }
            None
        }
    };

    match validators {
        Some(validators) if problems.is_empty() => {
            let mut listing: BTreeMap<RoleName, BTreeSet<ToolName>> =
                roles.keys().map(|r| (r.clone(), BTreeSet::new())).collect();
            for tool in tools.values() {
                for role in &tool.roles {
                    listing
                        .entry(role.clone())
                        .or_default()
                        .insert(tool.name.clone());
                }
            }
            Ok(Registry {
                tools,
                roles,
                providers,
                listing,
                validators: Arc::new(validators),
            })
        }
        _ => {
            // Grouped by file and subject; discovery order within a subject.
            problems.sort_by(|a, b| (&a.source, &a.subject).cmp(&(&b.source, &b.subject)));
            Err(LoadError::Invalid(Problems(problems)))
        }
    }
}

pub(crate) fn tool_ref(f: &Fields<'_>, key: &str, sink: &mut Sink<'_>) -> Option<ToolName> {
    let s: String = f.opt(key, sink)?;
    ToolName::parse(&s)
        .map_err(|e| sink.push(format!("/{key}"), e.to_string()))
        .ok()
}

pub(crate) fn parse_tool(name: &str, r: &Raw, problems: &mut Vec<Problem>) -> Option<Draft> {
    let mut sink = Sink {
        problems,
        source: &r.source,
        subject: Subject::Tool(name.to_string()),
    };
    let parsed_name = ToolName::parse(name).map_err(|e| sink.push("", e.to_string()));
    let f = Fields::new(&r.value, String::new(), TOOL_KEYS, &mut sink)?;
    f.finish(&mut sink);

    let title: Option<String> = f.opt("title", &mut sink);
    let description: Option<String> = f.req("description", &mut sink);
    if description.as_deref().is_some_and(|d| d.trim().is_empty()) {
        sink.push("/description", "the description is empty");
    }
    let version: u32 = f.opt("version", &mut sink).unwrap_or(1);
    if version == 0 {
        sink.push("/version", "versions start at 1");
    }
    let effect = f.req::<String>("effect", &mut sink).and_then(|e| {
        let parsed = Effect::parse(&e);
        if parsed.is_none() {
            sink.push(
                "/effect",
                format!("unknown effect class `{e}` (read, write, irreversible)"),
            );
        }
        parsed
    });
    let gate = f.req::<String>("gate", &mut sink).and_then(|g| {
        let parsed = parse_gate(&g);
        if parsed.is_none() {
            sink.push(
                "/gate",
                format!("unknown gate `{g}` (never, always, policy)"),
            );
        }
        parsed
    });
    let roles = f
        .opt::<Vec<String>>("roles", &mut sink)
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| match RoleName::parse(&r) {
            Ok(r) => Some((i, r)),
            Err(e) => {
                sink.push(format!("/roles/{i}"), e.to_string());
                None
            }
        })
        .collect();
    let approval = f.raw("approval").and_then(|v| parse_approval(v, &mut sink));
    let review_required = match f.opt::<String>("review", &mut sink).as_deref() {
        None | Some("none") => false,
        Some("required") => true,
        Some(other) => {
            sink.push(
                "/review",
                format!("unknown review `{other}` (required, none)"),
            );
            false
        }
    };
    let handler = match f.raw("handler") {
        None => {
            sink.push("", "missing required key `handler`");
            None
        }
        Some(v) => parse_handler(v, &mut sink),
    };
    let compensate = tool_ref(&f, "compensate", &mut sink);
    let verify = tool_ref(&f, "verify", &mut sink);
    let reconcile = tool_ref(&f, "reconcile", &mut sink);
    let redact = f
        .opt::<Vec<Value>>("redact", &mut sink)
        .map(|items| parse_redact(&items, &mut sink))
        .unwrap_or_default();
    let resources: BTreeMap<String, String> = f.opt("resources", &mut sink).unwrap_or_default();
    for (arg, kind) in &resources {
        if !is_valid_name(kind) {
            sink.push(
                ptr("/resources", arg),
                format!("entity kind {kind:?} is not a valid name"),
            );
        }
    }
    let input_schema = match f.raw("inputSchema") {
        None => {
            sink.push("", "missing required key `inputSchema`");
            None
        }
        Some(v) => Some(v.clone()),
    };
    let output_schema = f.raw("outputSchema").cloned();
    let mut per_step_paths = Vec::new();
    if let Some(schema) = &input_schema {
        let report = check_input_schema(schema);
        for issue in report.issues {
            sink.push(format!("/inputSchema{}", issue.pointer), issue.message);
        }
        per_step_paths = report.per_step_paths;
    }

    Some(Draft {
        source: r.source.clone(),
        name: parsed_name.ok()?,
        title,
        description,
        version,
        effect,
        gate,
        roles,
        approval,
        handler,
        compensate,
        verify,
        reconcile,
        redact,
        resources,
        input_schema,
        output_schema,
        per_step_paths,
        review_required,
    })
}

/// Cross-references: roles, tool references, providers, gates and approvals.
pub(crate) fn resolve(
    drafts: Vec<Draft>,
    raw_tools: &BTreeMap<String, Raw>,
    raw_roles: &BTreeMap<String, Raw>,
    roles: &BTreeMap<RoleName, Role>,
    role_tools: &RoleTools,
    providers: &BTreeMap<ProviderName, Provider>,
    problems: &mut Vec<Problem>,
) -> BTreeMap<ToolName, Tool> {
    // Role → tools as the roles wrote it; unknown tools are the role's problem.
    let mut listed_by_role: BTreeMap<&str, BTreeSet<RoleName>> = BTreeMap::new();
    for (role, tools) in role_tools {
        let source = raw_roles
            .get(role.as_str())
            .map(|r| r.source.clone())
            .unwrap_or_default();
        for (i, tool) in tools {
            if raw_tools.contains_key(tool.as_str()) {
                listed_by_role.entry(tool).or_default().insert(role.clone());
            } else {
                problems.push(Problem {
                    source: source.clone(),
                    subject: Subject::Role(role.to_string()),
                    path: format!("/tools/{i}"),
                    message: format!("names unknown tool `{tool}`"),
                });
            }
        }
    }
    let effects: BTreeMap<ToolName, Option<Effect>> =
        drafts.iter().map(|d| (d.name.clone(), d.effect)).collect();

    let mut out = BTreeMap::new();
    for d in drafts {
        let mut sink = Sink {
            problems,
            source: &d.source,
            subject: Subject::Tool(d.name.to_string()),
        };
        let mut tool_roles: BTreeSet<RoleName> = BTreeSet::new();
        for (i, role) in &d.roles {
            if roles.contains_key(role) {
                tool_roles.insert(role.clone());
            } else {
                sink.push(
                    format!("/roles/{i}"),
                    format!("role `{role}` is not declared under `roles:`"),
                );
            }
        }
        if let Some(by_roles) = listed_by_role.get(d.name.as_str()) {
            tool_roles.extend(by_roles.iter().cloned());
        }
        if tool_roles.is_empty() && d.roles.is_empty() {
            sink.push(
                "",
                "the tool has no role: list roles on the tool (`roles:`) or the tool in a role's `tools:`",
            );
        }

        for (key, target) in [
            ("compensate", &d.compensate),
            ("verify", &d.verify),
            ("reconcile", &d.reconcile),
        ] {
            let Some(target) = target else { continue };
            match effects.get(target) {
                None if !raw_tools.contains_key(target.as_str()) => {
                    sink.push(format!("/{key}"), format!("names unknown tool `{target}`"));
                }
                None | Some(None) => {} // the target has its own problems
                Some(Some(effect)) => {
                    let read = matches!(effect, Effect::Read);
                    if key != "compensate" && !read {
                        sink.push(
                            format!("/{key}"),
                            format!("`{target}` must be a read tool to {key}"),
                        );
                    }
                    if key == "compensate" && read {
                        sink.push(
                            "/compensate",
                            format!("`{target}` is a read tool: it cannot undo anything"),
                        );
                    }
                }
            }
        }
        if let (Some(effect), Some(_)) = (d.effect, &d.compensate) {
            match effect {
                Effect::Write => {}
                Effect::Read => sink.push("/compensate", "a read tool has nothing to compensate"),
                Effect::Irreversible => sink.push(
                    "/compensate",
                    "an irreversible tool cannot be compensated; if it can be undone, classify it `write`",
                ),
            }
        }

        if let (Some(Effect::Irreversible), Some(Gate::Never)) = (d.effect, d.gate) {
            sink.push("/gate", "an irreversible tool cannot be `gate: never`");
        }
        let gated = match d.gate {
            Some(Gate::Always | Gate::Policy) => true,
            Some(Gate::Never) | None => false,
        };
        match &d.approval {
            Some(a) => {
                if gated && a.approver_roles.is_empty() {
                    sink.push(
                        "/approval/approver_roles",
                        "a gated tool needs at least one approver role",
                    );
                }
                for (i, r) in a.approver_roles.iter().enumerate() {
                    if roles.contains_key(r) {
                        sink.push(
                            format!("/approval/approver_roles/{i}"),
                            format!("`{r}` is an agent role; approvers are people's app roles"),
                        );
                    }
                }
                let amount = d.input_schema.as_ref().is_some_and(numeric_amount);
                if a.second_approval_above.is_some() && !amount {
                    sink.push(
                        "/approval/second_approval_above",
                        "needs a numeric `amount` property in the input schema",
                    );
                }
            }
            None if gated => sink.push(
                "",
                "a gated tool needs `approval:` with at least one approver role",
            ),
            None => {}
        }

        if let Some(h) = &d.handler
            && !providers.contains_key(&h.provider)
        {
            sink.push(
                "/handler/provider",
                format!("names unknown provider `{}`", h.provider),
            );
        }
        if let Some(schema) = &d.input_schema {
            for arg in d.resources.keys() {
                if schema.pointer(&ptr("/properties", arg)).is_none() {
                    sink.push(
                        ptr("/resources", arg),
                        format!("`{arg}` is not a property of the input schema"),
                    );
                }
            }
        }

        let (Some(description), Some(effect), Some(gate), Some(handler), Some(input_schema)) =
            (d.description, d.effect, d.gate, d.handler, d.input_schema)
        else {
            continue;
        };
        let open_world = providers
            .get(&handler.provider)
            .is_some_and(|p| p.open_world);
        out.insert(
            d.name.clone(),
            Tool {
                name: d.name,
                title: d.title,
                description,
                version: d.version,
                effect,
                gate,
                roles: tool_roles,
                approval: d.approval,
                handler,
                compensate: d.compensate,
                verify: d.verify,
                reconcile: d.reconcile,
                redact: d.redact,
                resources: d.resources,
                input_schema,
                output_schema: d.output_schema,
                open_world,
                per_step_paths: d.per_step_paths,
                review_required: d.review_required,
            },
        );
    }
    out
}
