//! The registry's data: tools, roles, providers, approval settings and the derived role →
//! tools listing, as a loaded registry holds them (only the loader, `super::load`, builds one).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::names::{ProviderName, RoleName, ToolName};
use super::span::Span;
use crate::model::{Effect, Gate};
use crate::schema::{SchemaError, Validators};

/// The approval expiry when a tool does not set one: 72 hours.
pub const DEFAULT_APPROVAL_EXPIRY: Span = Span::hours(72);

/// A loaded, checked registry. Cheap to clone (validators are shared).
#[derive(Debug, Clone)]
pub struct Registry {
    pub(super) tools: BTreeMap<ToolName, Tool>,
    pub(super) roles: BTreeMap<RoleName, Role>,
    pub(super) providers: BTreeMap<ProviderName, Provider>,
    // INVARIANT: derived from the tools' `roles` at load; every key is a declared role and
    // every value a tool whose `roles` contains that key.
    pub(super) listing: BTreeMap<RoleName, BTreeSet<ToolName>>,
    // INVARIANT: one compiled input validator per tool, compiled once at load.
    pub(super) validators: Arc<Validators>,
}

impl PartialEq for Registry {
    /// Equal content; the compiled validators follow from the schemas.
    fn eq(&self, other: &Self) -> bool {
        self.tools == other.tools && self.roles == other.roles && self.providers == other.providers
    }
}

impl Eq for Registry {}

/// One tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    /// Its name, as listed to agents.
    pub name: ToolName,
    /// A short human title (MCP `title`).
    pub title: Option<String>,
    /// What it does, for agents and reviewers.
    pub description: String,
    /// The tool definition's own version, bumped by whoever changes it.
    pub version: u32,
    /// What it does to the world.
    pub effect: Effect,
    /// When a person must countersign it.
    pub gate: Gate,
    /// Every role it is listed for (the derived listing; never empty).
    pub roles: BTreeSet<RoleName>,
    /// Approval settings, when set.
    pub approval: Option<Approval>,
    /// Which provider runs it, resolved server-side.
    pub handler: Handler,
    /// The tool that undoes it.
    pub compensate: Option<ToolName>,
    /// The read tool that reads back its effect.
    pub verify: Option<ToolName>,
    /// The read tool that finds its outcome by idempotency key after a timeout.
    pub reconcile: Option<ToolName>,
    /// Fields hashed or dropped in audit records and in results.
    pub redact: Vec<Redaction>,
    /// Argument name → entity kind it identifies (`invoice_id` → `invoice`), so policy can
    /// fetch facts about the resource.
    pub resources: BTreeMap<String, String>,
    /// The closed JSON Schema (draft 2020-12) of its arguments.
    pub input_schema: Value,
    /// The JSON Schema of its result, if declared.
    pub output_schema: Option<Value>,
    /// Derived from the handler's provider: whether it reaches outside systems.
    pub open_world: bool,
    /// JSON pointers (inside `input_schema`) of the per-step exemptions (see
    /// [`super::PER_STEP_MARKER`]); empty for every tool but plan submission.
    pub per_step_paths: Vec<String>,
    /// `review: required`: a planned step of this tool waits until a model reviewer's
    /// credential (never the planner's) approves its exact inputs; only then does it go on to
    /// its gate. Direct calls are not planned and are not reviewed.
    pub review_required: bool,
}

/// Approval settings of a gated tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    /// App roles of the people who may approve (never an agent role).
    pub approver_roles: BTreeSet<RoleName>,
    /// How long an approval stays valid (default 72 h); expired fails closed.
    pub expires: Span,
    /// How recently the approver must have authenticated strongly, if required.
    pub step_up_max_age: Option<Span>,
    /// Two distinct approvers are always needed.
    pub four_eyes: bool,
    /// Above this value of the `amount` argument, a second, distinct approver is needed.
    pub second_approval_above: Option<serde_json::Number>,
    /// The gate asks the party the agent acts for to confirm the step themselves (seed 004:
    /// the traveller decides about their own dinner): only that party may approve. Otherwise
    /// the gate is a countersignature, which that party may never give.
    pub party_confirms: bool,
    /// What undoing a wrong call costs, in approvals (one person's review of one gate): the
    /// `k` of seed 000's break-even, read by the gate advisor. Advice only; never enforced.
    pub reversal_cost: Option<serde_json::Number>,
    /// `signature: required`: every approval is a passkey signature over the gate's exact
    /// inputs, verified before it counts (rejections need none).
    pub signature_required: bool,
}

/// Which provider runs a tool, and which of its operations.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Handler {
    /// The provider (declared under `providers:`).
    pub provider: ProviderName,
    /// The provider's operation (`payments.schedule`).
    pub operation: String,
}

/// How a field is redacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RedactHow {
    /// Replaced by a keyed hash: equal values still compare equal.
    Hash,
    /// Removed.
    Drop,
}

impl RedactHow {
    /// The YAML text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hash => "hash",
            Self::Drop => "drop",
        }
    }
}

/// One redaction rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Redaction {
    /// The field name (matched in arguments and results).
    pub field: String,
    /// How it is redacted.
    pub how: RedactHow,
}

/// A role agents act in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    /// The role's name.
    pub name: RoleName,
    /// What the role is for.
    pub description: String,
}

/// What kind of provider runs tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// A REST API at `base_url`.
    Http,
    /// An upstream MCP server at `url` (its annotations are never trusted).
    Mcp,
    /// Built into Countersign (demo systems and the run tools).
    Builtin,
}

impl ProviderKind {
    /// The YAML text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Mcp => "mcp",
            Self::Builtin => "builtin",
        }
    }
}

/// A target system adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    /// Its name.
    pub name: ProviderName,
    /// Its kind.
    pub kind: ProviderKind,
    /// What it is.
    pub description: Option<String>,
    /// Base URL (kind `http` only).
    pub base_url: Option<String>,
    /// Server URL (kind `mcp` only).
    pub url: Option<String>,
    /// Hosts the adapter may connect to (kinds `http` and `mcp`; includes the URL's host).
    pub allowed_hosts: BTreeSet<String>,
    /// Whether its tools reach systems outside the organisation (MCP `openWorldHint`);
    /// defaults to `false` for builtin providers and `true` otherwise.
    pub open_world: bool,
}

/// MCP tool annotations, derived from the effect class (never taken from upstream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolAnnotations {
    /// Only reads.
    pub read_only_hint: bool,
    /// May destroy or irreversibly change something.
    pub destructive_hint: bool,
    /// Repeating the same call has no further effect (Countersign keys every call).
    pub idempotent_hint: bool,
    /// Reaches systems outside the organisation.
    pub open_world_hint: bool,
}

impl Tool {
    /// The MCP annotations for this tool, derived from its effect class and provider.
    pub fn annotations(&self) -> ToolAnnotations {
        let (read_only_hint, destructive_hint) = match self.effect {
            Effect::Read => (true, false),
            Effect::Write => (false, false),
            Effect::Irreversible => (false, true),
        };
        ToolAnnotations {
            read_only_hint,
            destructive_hint,
            // Every call runs under a key Countersign derives: a repeat returns the stored
            // outcome instead of acting twice.
            idempotent_hint: true,
            open_world_hint: self.open_world,
        }
    }

    /// How long an approval of this tool stays valid.
    pub fn approval_expiry(&self) -> Span {
        self.approval
            .as_ref()
            .map_or(DEFAULT_APPROVAL_EXPIRY, |a| a.expires)
    }
}

impl Registry {
    /// Every tool, by name.
    pub fn tools(&self) -> impl Iterator<Item = &Tool> {
        self.tools.values()
    }

    /// A tool by name, whatever role asks. For the server's own use (executor, admin);
    /// agent-facing code must use [`Registry::tool_for_role`].
    pub fn tool(&self, name: &ToolName) -> Option<&Tool> {
        self.tools.get(name)
    }

    /// Every declared role.
    pub fn roles(&self) -> impl Iterator<Item = &Role> {
        self.roles.values()
    }

    /// A role by name.
    pub fn role(&self, name: &RoleName) -> Option<&Role> {
        self.roles.get(name)
    }

    /// Every declared provider.
    pub fn providers(&self) -> impl Iterator<Item = &Provider> {
        self.providers.values()
    }

    /// A provider by name.
    pub fn provider(&self, name: &ProviderName) -> Option<&Provider> {
        self.providers.get(name)
    }

    /// The tools listed for `role`, in name order; empty for an unknown role.
    pub fn tools_for_role(&self, role: &RoleName) -> impl Iterator<Item = &Tool> {
        self.listing
            .get(role)
            .into_iter()
            .flatten()
            .filter_map(|name| self.tools.get(name))
    }

    /// The tool `name` if it is listed for `role`. `None` both when the tool does not exist
    /// and when it is not listed: the caller cannot tell the two apart.
    pub fn tool_for_role(&self, role: &RoleName, name: &str) -> Option<&Tool> {
        let name = ToolName::parse(name).ok()?;
        let listed = self.listing.get(role)?.contains(&name);
        if listed { self.tools.get(&name) } else { None }
    }

    /// The derived role → tools listing.
    pub fn listing(&self) -> &BTreeMap<RoleName, BTreeSet<ToolName>> {
        &self.listing
    }

    /// The validators compiled at load.
    pub fn validators(&self) -> &Validators {
        &self.validators
    }

    /// Validates `arguments` against the input schema of `tool` (see
    /// [`Validators::validate`]).
    pub fn validate(&self, tool: &ToolName, arguments: &Value) -> Result<(), Vec<SchemaError>> {
        self.validators.validate(tool, arguments)
    }
}
