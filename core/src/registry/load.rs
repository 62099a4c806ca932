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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::closure::{check_input_schema, escape_segment};
use super::model::{
    Approval, DEFAULT_APPROVAL_EXPIRY, Handler, Provider, ProviderKind, RedactHow, Redaction,
    Registry, Role, Tool,
};
use super::names::is_valid_name;
use super::names::{ProviderName, RoleName, ToolName};
use super::span::Span;
use crate::model::{Effect, Gate};
use crate::schema::Validators;

/// What a problem is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subject {
    /// The file as a whole (syntax, top-level keys).
    File,
    /// A tool, by the name written.
    Tool(String),
    /// A role, by the name written.
    Role(String),
    /// A provider, by the name written.
    Provider(String),
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File => f.write_str("file"),
            Self::Tool(n) => write!(f, "tool {n}"),
            Self::Role(n) => write!(f, "role {n}"),
            Self::Provider(n) => write!(f, "provider {n}"),
        }
    }
}

/// One reason a registry was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file (or source name) it was found in.
    pub source: String,
    /// The tool, role or provider it is about.
    pub subject: Subject,
    /// JSON pointer inside the subject's definition (`""` is the whole definition).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        write!(
            f,
            "{}: {} at {path}: {}",
            self.source, self.subject, self.message
        )
    }
}

/// Every problem found, one per line when displayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "registry refused, {} problem(s):", self.0.len())?;
        for p in &self.0 {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

/// Why a registry did not load.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file or folder could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// What was being read.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The registry broke rules; every problem is listed.
    #[error("{0}")]
    Invalid(Problems),
}

impl LoadError {
    /// The problems, when the registry was read but refused.
    pub fn problems(&self) -> &[Problem] {
        match self {
            Self::Io { .. } => &[],
            Self::Invalid(p) => &p.0,
        }
    }
}

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

/// Collects problems for one subject of one source.
struct Sink<'a> {
    problems: &'a mut Vec<Problem>,
    source: &'a str,
    subject: Subject,
}

impl Sink<'_> {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            source: self.source.to_string(),
            subject: self.subject.clone(),
            path: path.into(),
            message: message.into(),
        });
    }
}

fn ptr(base: &str, segment: &str) -> String {
    format!("{base}/{}", escape_segment(segment))
}

/// A YAML mapping being read field by field: every field's problem is reported at its own
/// path, and [`Fields::finish`] reports every unknown key.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    base: String,
    known: &'static [&'static str],
}

impl<'a> Fields<'a> {
    fn new(
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

    fn raw(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn opt<T: DeserializeOwned>(&self, key: &str, sink: &mut Sink<'_>) -> Option<T> {
        let value = self.raw(key)?;
        match serde_json::from_value::<T>(value.clone()) {
            Ok(v) => Some(v),
            Err(e) => {
                sink.push(ptr(&self.base, key), e.to_string());
                None
            }
        }
    }

    fn req<T: DeserializeOwned>(&self, key: &str, sink: &mut Sink<'_>) -> Option<T> {
        if self.raw(key).is_none() {
            sink.push(self.base.clone(), format!("missing required key `{key}`"));
            return None;
        }
        self.opt(key, sink)
    }

    fn finish(&self, sink: &mut Sink<'_>) {
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

fn kind_of(v: &Value) -> &'static str {
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
struct Raw {
    source: String,
    value: Value,
}

const TOP_KEYS: &[&str] = &["tools", "roles", "providers"];
const TOOL_KEYS: &[&str] = &[
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
const APPROVAL_KEYS: &[&str] = &[
    "approver_roles",
    "expires",
    "step_up_max_age",
    "four_eyes",
    "second_approval_above",
    "party_confirms",
];
const HANDLER_KEYS: &[&str] = &["provider", "operation"];
const REDACT_KEYS: &[&str] = &["field", "how"];
const ROLE_KEYS: &[&str] = &["description", "tools"];
const PROVIDER_KEYS: &[&str] = &[
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

fn parse_gate(s: &str) -> Option<Gate> {
    [Gate::Never, Gate::Always, Gate::Policy]
        .into_iter()
        .find(|g| gate_str(*g) == s)
}

fn parse_provider_kind(s: &str) -> Option<ProviderKind> {
    [ProviderKind::Http, ProviderKind::Mcp, ProviderKind::Builtin]
        .into_iter()
        .find(|k| k.as_str() == s)
}

/// A tool as parsed, before cross-references are resolved.
struct Draft {
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

fn parse_providers(
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

type RoleTools = BTreeMap<RoleName, Vec<(usize, String)>>;

fn parse_roles(
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

fn tool_ref(f: &Fields<'_>, key: &str, sink: &mut Sink<'_>) -> Option<ToolName> {
    let s: String = f.opt(key, sink)?;
    ToolName::parse(&s)
        .map_err(|e| sink.push(format!("/{key}"), e.to_string()))
        .ok()
}

fn parse_tool(name: &str, r: &Raw, problems: &mut Vec<Problem>) -> Option<Draft> {
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

fn parse_approval(v: &Value, sink: &mut Sink<'_>) -> Option<Approval> {
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
    })
}

fn valid_operation(op: &str) -> bool {
    !op.is_empty()
        && op.len() <= 128
        && op
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
}

fn parse_handler(v: &Value, sink: &mut Sink<'_>) -> Option<Handler> {
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

fn parse_redact(items: &[Value], sink: &mut Sink<'_>) -> Vec<Redaction> {
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

fn numeric_amount(schema: &Value) -> bool {
    let t = schema.pointer("/properties/amount/type");
    match t {
        Some(Value::String(s)) => s == "number" || s == "integer",
        _ => false,
    }
}

/// Cross-references: roles, tool references, providers, gates and approvals.
fn resolve(
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
