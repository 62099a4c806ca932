//! The tool registry: which tools exist, what each does to the world, who may see it, when a
//! person must countersign it, and which provider runs it.
//!
//! The registry is the permission model: a tool not listed for a role does not exist for
//! that role. It is loaded from YAML (one file, or a folder of `*.yaml` files merged) by
//! [`Registry::from_yaml_str`], [`Registry::from_sources`] or [`Registry::from_path`].
//!
//! # Invariants (the loader fails closed)
//!
//! A [`Registry`] value only exists when loading found **no** problem; loading collects
//! every problem at once, each naming its tool (or role, provider, file) and the JSON
//! pointer inside it. Among the rules (see [`load`] and [`closure`] for all of them):
//!
//! * every tool's `inputSchema` is closed and bounded ([`closure`]) and compiles as a
//!   draft 2020-12 schema with format checking ([`crate::schema`]);
//! * every tool is listed for at least one declared role; every role a tool names is
//!   declared under `roles:`; every tool a role names exists;
//! * `compensate`, `verify` and `reconcile` name existing tools (`verify` and `reconcile`
//!   read-only ones); an irreversible tool is never `gate: never`;
//! * every handler names a declared provider.
//!
//! The role → tools listing is derived once, at load, from both places a pairing can be
//! written (`roles:` on a tool, `tools:` on a role) and is the single source of truth:
//! [`Registry::tools_for_role`], [`Registry::tool_for_role`] and [`Tool::roles`] all read it.
//! Export ([`Registry::to_yaml`]) writes every pairing on the tool, so load → export → load
//! gives an equal registry.

pub mod closure;
mod diff;
mod export;
pub mod load;
mod model;
mod names;
mod problems;
mod span;
mod tool_parts;

use std::path::Path;

pub use closure::PER_STEP_MARKER;
pub use diff::{RegistryDiff, diff};
pub use export::ExportError;
pub use load::{LoadError, Problem, Problems, Subject};
pub use model::{
    Approval, DEFAULT_APPROVAL_EXPIRY, Handler, Provider, ProviderKind, RedactHow, Redaction,
    Registry, Role, Tool, ToolAnnotations,
};
pub use names::{MAX_NAME_LEN, NameError, ProviderName, RoleName, ToolName};
pub use span::{Span, SpanError};

impl Registry {
    /// Loads one YAML document. See [`load`] for the rules.
    pub fn from_yaml_str(text: &str) -> Result<Self, LoadError> {
        load::load_sources(&[("registry".to_string(), text.to_string())])
    }

    /// Loads several YAML documents (source name, text) merged into one registry; a tool,
    /// role or provider defined in two of them is a problem.
    pub fn from_sources(sources: &[(String, String)]) -> Result<Self, LoadError> {
        load::load_sources(sources)
    }

    /// Loads a YAML file, or every `*.yaml` / `*.yml` file of a folder (not recursive),
    /// merged in file-name order.
    pub fn from_path(path: &Path) -> Result<Self, LoadError> {
        load::load_path(path)
    }

    /// The registry as one YAML document that loads back to an equal registry.
    pub fn to_yaml(&self) -> Result<String, ExportError> {
        export::to_yaml(self)
    }
}
