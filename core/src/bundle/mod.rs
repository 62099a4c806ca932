//! A bundle: the registry, the Cedar policies and the Cedar entity schema, loaded and checked
//! together so they cannot drift apart.
//!
//! # Who owns what
//!
//! * The **registry** owns which tools exist, who sees them (the role listing, enforced by
//!   the engine's `role.tool_not_listed` floor), their effect, gate and argument schema.
//! * The **entity schema** (`*.cedarschema`, hand-written) owns only the resource entity
//!   types (`Invoice`, `Reservation`, …) and any shared types. It declares no actions and
//!   none of the engine's names (`Role`, `Agent`, `Human`, `Tool`, `Call`).
//! * The **action declarations are generated** from the registry ([`generate`]): one action
//!   per tool, applying to `[Agent, Human]` × `[Tool, <the tool's resource kinds>]`, with
//!   `context.args` typed from the tool's closed `inputSchema` (`amount` as `amount_minor`).
//!   The engine loads *engine declarations + entity schema + generated actions*
//!   ([`Bundle::cedar_schema`]).
//! * The **policies** (`*.cedar`) add forbids and approval requirements. They never restate
//!   listings.
//!
//! # Where a listed tool's permit comes from
//!
//! Cedar stays default-deny: no matching permit is `deny(policy.no_permit)`. A bundle with
//! policies states its base permit explicitly, once, conventionally
//!
//! ```cedar
//! @id("base.listed")
//! permit (principal, action, resource);
//! ```
//!
//! read as "the registry listing is the allow-list; Cedar adds forbids and approval
//! requirements". It is written, not generated, so that a reader of the policy file sees
//! where every allow comes from and an author can narrow it (to one tenant, one origin, …);
//! forgetting it fails closed (every call is `policy.no_permit`), never open. Because the
//! listing floor runs before Cedar, an unconstrained base permit cannot reach a tool the
//! caller's role does not list.
//!
//! # A registry-only bundle (empty policies)
//!
//! When the policy text holds no policy at all (empty, or only comments) — for instance a
//! bundle read from a single `.yaml` file — the bundle generates its own policy set, and
//! every listed, schema-valid, same-tenant call is decided by the floors and the gate:
//!
//! * `gate: never` → `allow` (`registry.listed`);
//! * `gate: always` → `require_approval(gate.always)`; effect `irreversible` →
//!   `require_approval(irreversible.always)` (the engine's floors);
//! * `gate: policy` → `require_approval(gate.no_policy)`: the registry asked a policy to
//!   decide when a person countersigns, and there is none, so a person always does.
//!
//! Standing authorizations lift `gate.no_policy` like any policy-level approval. If the
//! entity schema is empty too, each resource kind gets the minimal entity type
//! `{ tenant: String, owner?: String }` (what the engine always sets); a written entity
//! schema must declare every kind itself.
//!
//! # Refusals (all reported at once, [`BundleError`])
//!
//! Every registry problem ([`crate::registry::load`]); every policy that does not parse or
//! breaks the annotation convention ([`crate::policy`]); the entity schema not parsing,
//! declaring an action, or redeclaring an engine name; a resource kind in a tool's
//! `resources:` without an entity type; an input schema the generator cannot type
//! ([`generate`]); a policy whose scope names an action that is not a registry tool; and
//! every error Cedar's strict validator reports against the generated schema. Checks that
//! need a loaded registry (the last four) run only when the registry loads.

pub mod edit;
pub mod generate;
mod sources;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use cedar_policy::{ActionConstraint, EntityUid, PolicySet, Schema, SchemaFragment};

use crate::model::Gate;
use crate::policy::{self, Annotated, PolicyEngine, PolicyLoadError, ToolFacts};
use crate::registry::{LoadError, Problem, Registry, RoleName, Subject};

pub use sources::{BundleSources, POLICY_FILE, REGISTRY_FILE, SCHEMA_FILE};

/// The source name of the generated declarations in problems.
pub const GENERATED: &str = "(generated from the registry)";

/// What a problem is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum BundleSubject {
    /// The file as a whole.
    File,
    /// A tool, by name.
    Tool(String),
    /// A role, by name.
    Role(String),
    /// A provider, by name.
    Provider(String),
    /// A policy, by `@id` (or Cedar's id when it has none).
    Policy(String),
    /// The Cedar entity schema.
    Schema,
}

impl fmt::Display for BundleSubject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File => f.write_str("file"),
            Self::Tool(n) => write!(f, "tool {n}"),
            Self::Role(n) => write!(f, "role {n}"),
            Self::Provider(n) => write!(f, "provider {n}"),
            Self::Policy(n) => write!(f, "policy {n}"),
            Self::Schema => f.write_str("schema"),
        }
    }
}

impl From<Subject> for BundleSubject {
    fn from(s: Subject) -> Self {
        match s {
            Subject::File => Self::File,
            Subject::Tool(n) => Self::Tool(n),
            Subject::Role(n) => Self::Role(n),
            Subject::Provider(n) => Self::Provider(n),
        }
    }
}

/// One reason a bundle was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleProblem {
    /// The file (or source name) it was found in.
    pub source: String,
    /// What it is about.
    pub subject: BundleSubject,
    /// Where inside the subject: a JSON pointer for registry entries, `line N` for policies
    /// and files; empty for the whole subject.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for BundleProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        // One problem per line: Cedar's multi-line messages are folded.
        let message = self
            .message
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        write!(f, "{}: {} at {path}: {message}", self.source, self.subject)
    }
}

/// Every problem found, one per line when displayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleProblems(pub Vec<BundleProblem>);

impl fmt::Display for BundleProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bundle refused, {} problem(s):", self.0.len())?;
        for p in &self.0 {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

/// Why a bundle was not read or not loaded.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A file or folder could not be read or written.
    #[error("cannot access {path}: {source}")]
    Io {
        /// What was being accessed.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The bundle broke rules; every problem is listed.
    #[error("{0}")]
    Invalid(BundleProblems),
}

impl BundleError {
    /// The problems, when the bundle was read but refused.
    pub fn problems(&self) -> &[BundleProblem] {
        match self {
            Self::Io { .. } => &[],
            Self::Invalid(p) => &p.0,
        }
    }

    /// Its problems on one line (`; `-separated), or the error itself when it has none.
    pub fn one_line(&self) -> String {
        let problems: Vec<String> = self.problems().iter().map(ToString::to_string).collect();
        if problems.is_empty() {
            self.to_string()
        } else {
            problems.join("; ")
        }
    }

    pub(crate) fn invalid(problems: Vec<BundleProblem>) -> Self {
        Self::Invalid(BundleProblems(problems))
    }

    pub(crate) fn one(source: String, message: &str) -> Self {
        Self::invalid(vec![BundleProblem {
            source,
            subject: BundleSubject::File,
            path: String::new(),
            message: message.to_owned(),
        }])
    }
}

impl From<Problem> for BundleProblem {
    fn from(p: Problem) -> Self {
        Self {
            source: p.source,
            subject: p.subject.into(),
            path: p.path,
            message: p.message,
        }
    }
}

impl From<LoadError> for BundleError {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::Io { path, source } => Self::Io { path, source },
            LoadError::Invalid(problems) => {
                Self::invalid(problems.0.into_iter().map(BundleProblem::from).collect())
            }
        }
    }
}

/// A loaded, mutually consistent registry and policy engine, with the texts they came from.
#[derive(Debug)]
pub struct Bundle {
    /// The registry.
    pub registry: Registry,
    /// The policy engine, loaded with [`Bundle::cedar_schema`].
    pub policy: PolicyEngine,
    /// The texts, exactly as given.
    pub sources: BundleSources,
    cedar_schema: String,
    registry_only: bool,
}

/// The generated policies of a registry-only bundle (see the module doc).
fn registry_only_policies(registry: &Registry) -> String {
    let mut text = String::from(
        "// Generated by Countersign: a registry-only bundle.\n@id(\"registry.listed\")\npermit (principal, action, resource);\n",
    );
    let gated: Vec<String> = registry
        .tools()
        .filter(|t| matches!(t.gate, Gate::Policy))
        .map(|t| format!("Action::{}", generate::quote(t.name.as_str())))
        .collect();
    if !gated.is_empty() {
        text.push_str(&format!(
            "@id(\"registry.gate_policy\")\n@decision(\"require_approval\")\n@rule(\"gate.no_policy\")\npermit (principal, action in [{}], resource);\n",
            gated.join(", ")
        ));
    }
    text
}

impl Bundle {
    /// Loads and cross-checks `sources` (see the module doc for every rule).
    ///
    /// # Errors
    /// [`BundleError::Invalid`] listing every problem found.
    pub fn load(sources: BundleSources) -> Result<Bundle, BundleError> {
        let mut problems = Vec::new();

        // 1. The registry.
        let registry_sources = sources.registry_sources();
        let files = tool_files(&registry_sources);
        let registry = match Registry::from_sources(&registry_sources) {
            Ok(r) => Some(r),
            Err(e) => match BundleError::from(e) {
                BundleError::Invalid(p) => {
                    problems.extend(p.0);
                    None
                }
                io @ BundleError::Io { .. } => return Err(io),
            },
        };

        // 2. The policies, file by file: syntax and annotations.
        let mut annotated = Annotated::default();
        let mut policy_file: BTreeMap<String, (String, String)> = BTreeMap::new();
        for (file, text) in sources.policy_sources() {
            let parsed = match policy::parse_policies(&text) {
                Ok(p) => p,
                Err(e) => {
                    problems.push(BundleProblem {
                        source: file.clone(),
                        subject: BundleSubject::File,
                        path: String::new(),
                        message: e.to_string(),
                    });
                    continue;
                }
            };
            for p in parsed.policies() {
                if let Some(id) = p.annotation("id") {
                    policy_file.insert(id.to_owned(), (file.clone(), text.clone()));
                }
            }
            for e in annotated.add(&parsed) {
                let id = match &e {
                    PolicyLoadError::Annotation { policy, .. } => policy.clone(),
                    _ => String::new(),
                };
                let message = match &e {
                    PolicyLoadError::Annotation { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                problems.push(BundleProblem {
                    source: file.clone(),
                    path: line_of(&text, &id),
                    subject: BundleSubject::Policy(id),
                    message,
                });
            }
        }
        let policy_problem = |id: &str, message: String| {
            let (file, path) = match policy_file.get(id) {
                Some((file, text)) => (file.clone(), line_of(text, id)),
                None => (POLICY_FILE.to_owned(), String::new()),
            };
            BundleProblem {
                source: file,
                subject: BundleSubject::Policy(id.to_owned()),
                path,
                message,
            }
        };

        // 3. The entity schema: parses, no actions, no engine names.
        let schema_sources = sources.schema_sources();
        let schema_written = schema_sources.iter().any(|(_, t)| !t.trim().is_empty());
        let mut fragments_ok = true;
        for (file, text) in &schema_sources {
            match SchemaFragment::from_cedarschema_str(text) {
                Ok(_) => {}
                Err(e) => {
                    fragments_ok = false;
                    problems.push(BundleProblem {
                        source: file.clone(),
                        subject: BundleSubject::Schema,
                        path: String::new(),
                        message: e.to_string(),
                    });
                }
            }
        }
        let entity_text: String = schema_sources
            .iter()
            .map(|(_, t)| t.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let schema_file = schema_sources
            .iter()
            .map(|(f, _)| f.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let mut entity_types: Option<BTreeSet<String>> = None;
        if fragments_ok {
            let text = format!("{}\n{entity_text}", generate::ENGINE_DECLARATIONS);
            match Schema::from_cedarschema_str(&text) {
                Ok((schema, _)) => {
                    for action in schema.actions() {
                        problems.push(BundleProblem {
                            source: schema_file.clone(),
                            subject: BundleSubject::Schema,
                            path: String::new(),
                            message: format!(
                                "declares action {}: actions are generated from the registry, remove it",
                                action.id().unescaped()
                            ),
                        });
                    }
                    entity_types = Some(schema.entity_types().map(ToString::to_string).collect());
                }
                Err(e) => {
                    let mut message = e.to_string();
                    if generate::ENGINE_NAMES
                        .iter()
                        .any(|n| message.contains(&format!("`{n}`")))
                    {
                        message.push_str(&format!(
                            " ({} are declared by Countersign; do not declare them)",
                            generate::ENGINE_NAMES.join(", ")
                        ));
                    }
                    problems.push(BundleProblem {
                        source: schema_file.clone(),
                        subject: BundleSubject::Schema,
                        path: String::new(),
                        message,
                    });
                }
            }
        }

        let (Some(registry), Some(entity_types)) = (registry, entity_types) else {
            return Err(BundleError::invalid(problems));
        };

        // 4. Generated declarations: resource kinds and argument types.
        let mut actions_text = String::new();
        let mut extra_entities = String::new();
        let mut generated_kinds = BTreeSet::new();
        for tool in registry.tools() {
            let mut types = BTreeSet::new();
            let mut ok = true;
            for (arg, kind, ty) in generate::resource_types(tool) {
                let path = format!("/resources/{}", arg.replace('~', "~0").replace('/', "~1"));
                match ty {
                    Err(message) => {
                        ok = false;
                        problems.push(tool_problem(&files, tool, path, message));
                    }
                    Ok(ty) if entity_types.contains(&ty) => {
                        types.insert(ty);
                    }
                    Ok(ty) if !schema_written => {
                        if generated_kinds.insert(ty.clone()) {
                            extra_entities.push_str(&generate::minimal_entity(&ty));
                        }
                        types.insert(ty);
                    }
                    Ok(ty) => {
                        ok = false;
                        problems.push(tool_problem(
                            &files,
                            tool,
                            path,
                            format!(
                                "resource kind `{kind}` has no entity type `{ty}` in {schema_file}"
                            ),
                        ));
                    }
                }
            }
            match generate::action_declaration(tool, &types) {
                Ok(decl) if ok => actions_text.push_str(&decl),
                Ok(_) => {}
                Err(issues) => {
                    for i in issues {
                        problems.push(tool_problem(&files, tool, i.path, i.message));
                    }
                }
            }
        }

        // 5. Policies name only registry tools.
        let tools: BTreeSet<&str> = registry.tools().map(|t| t.name.as_str()).collect();
        let mut unknown_action_policies = BTreeSet::new();
        for p in annotated.policies.policies() {
            let named: Vec<EntityUid> = match p.action_constraint() {
                ActionConstraint::Any => Vec::new(),
                ActionConstraint::Eq(uid) => vec![uid],
                ActionConstraint::In(uids) => uids,
            };
            for uid in named {
                let name = uid.id().unescaped().to_owned();
                if uid.type_name().to_string() != "Action" || !tools.contains(name.as_str()) {
                    let id = p.id().to_string();
                    unknown_action_policies.insert(id.clone());
                    problems.push(policy_problem(
                        &id,
                        format!("names action `{name}`, which is not a tool in the registry"),
                    ));
                }
            }
        }

        if !problems.is_empty() {
            return Err(BundleError::invalid(problems));
        }

        // 6. The combined schema, and strict validation against it.
        let cedar_schema = format!(
            "{}\n{entity_text}\n// Generated by Countersign: minimal entity types.\n{extra_entities}\n// Generated by Countersign from the registry: one action per tool.\n{actions_text}",
            generate::ENGINE_DECLARATIONS
        );
        let schema = match Schema::from_cedarschema_str(&cedar_schema) {
            Ok((s, _)) => s,
            Err(e) => {
                return Err(BundleError::invalid(vec![BundleProblem {
                    source: GENERATED.to_owned(),
                    subject: BundleSubject::Schema,
                    path: String::new(),
                    message: e.to_string(),
                }]));
            }
        };
        let registry_only = annotated.len() == 0;
        if registry_only {
            let generated = registry_only_policies(&registry);
            let parsed = PolicySet::from_str(&generated).map_err(|e| {
                BundleError::one(GENERATED.to_owned(), &format!("generated policies: {e}"))
            })?;
            let errors = annotated.add(&parsed);
            if let Some(e) = errors.first() {
                return Err(BundleError::one(GENERATED.to_owned(), &e.to_string()));
            }
        }
        for e in policy::validate(&annotated.policies, &schema) {
            let id = e.policy_id().to_string();
            if unknown_action_policies.contains(&id) {
                continue;
            }
            problems.push(policy_problem(&id, e.to_string()));
        }
        if !problems.is_empty() {
            return Err(BundleError::invalid(problems));
        }
        let engine = PolicyEngine::assemble(annotated, &schema)
            .map_err(|e| BundleError::one(GENERATED.to_owned(), &format!("policy engine: {e}")))?;
        Ok(Bundle {
            registry,
            policy: engine,
            sources,
            cedar_schema,
            registry_only,
        })
    }

    /// The full Cedar schema the engine was loaded with: engine declarations, the entity
    /// schema, generated entity types (registry-only bundles) and the generated actions.
    pub fn cedar_schema(&self) -> &str {
        &self.cedar_schema
    }

    /// Whether the policy text held no policy, so the generated registry-only set decides.
    pub fn registry_only(&self) -> bool {
        self.registry_only
    }

    /// What the engine needs to know about `tool` for a caller in `role`: its effect and gate,
    /// and whether the registry lists it for the role. `None` when no such tool exists.
    pub fn tool_facts(&self, role: &RoleName, tool: &str) -> Option<ToolFacts> {
        let name = crate::registry::ToolName::parse(tool).ok()?;
        let t = self.registry.tool(&name)?;
        Some(ToolFacts {
            name: t.name.to_string(),
            effect: t.effect,
            gate: t.gate,
            listed_for_role: self.registry.tool_for_role(role, tool).is_some(),
        })
    }
}

fn tool_problem(
    files: &BTreeMap<String, String>,
    tool: &crate::registry::Tool,
    path: String,
    message: String,
) -> BundleProblem {
    BundleProblem {
        source: files
            .get(tool.name.as_str())
            .cloned()
            .unwrap_or_else(|| REGISTRY_FILE.to_owned()),
        subject: BundleSubject::Tool(tool.name.to_string()),
        path,
        message,
    }
}

/// Tool name → the registry file defining it.
fn tool_files(sources: &[(String, String)]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (file, text) in sources {
        let Ok(doc) = serde_norway::from_str::<serde_json::Value>(text) else {
            continue;
        };
        if let Some(tools) = doc.get("tools").and_then(serde_json::Value::as_object) {
            for name in tools.keys() {
                out.entry(name.clone()).or_insert_with(|| file.clone());
            }
        }
    }
    out
}

/// `line N` of the policy carrying `@id("<id>")` in `text`, or empty.
fn line_of(text: &str, id: &str) -> String {
    if id.is_empty() {
        return String::new();
    }
    let needle = format!("@id({})", generate::quote(id));
    text.lines()
        .position(|l| l.contains(&needle))
        .map(|n| format!("line {}", n + 1))
        .unwrap_or_default()
}
