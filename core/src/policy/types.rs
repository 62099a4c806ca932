//! The policy engine's vocabulary: what a decision is asked about ([`Request`]) and what it
//! answers ([`Decision`], [`DecisionReport`]).
//!
//! These types are the engine's own; callers (the pipeline, the policy tables) map registry
//! and store data onto them, so the engine never depends on how the registry is written.

use std::borrow::Cow;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::model::{Effect, Gate};

/// The name of the rule a decision rests on, e.g. `role.tool_not_listed` or `amount.ceiling`.
///
/// Built-in floors use the associated constants; policies name theirs with `@rule("…")`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Rule(Cow<'static, str>);

impl Rule {
    /// The tool is not in the caller's role listing.
    pub const TOOL_NOT_LISTED: Rule = Rule(Cow::Borrowed("role.tool_not_listed"));
    /// The arguments failed the tool's closed input schema.
    pub const INPUT_SCHEMA: Rule = Rule(Cow::Borrowed("input.schema"));
    /// A resource the call points at belongs to another tenant.
    pub const TENANT_MISMATCH: Rule = Rule(Cow::Borrowed("tenant.mismatch"));
    /// The request could not be evaluated, or a policy raised an error.
    pub const POLICY_ERROR: Rule = Rule(Cow::Borrowed("policy.error"));
    /// No permit policy matched.
    pub const NO_PERMIT: Rule = Rule(Cow::Borrowed("policy.no_permit"));
    /// A forbid policy matched that names no rule (the loader refuses those; kept for
    /// completeness of the mapping).
    pub const FORBID: Rule = Rule(Cow::Borrowed("policy.forbid"));
    /// Irreversible tools always need a person.
    pub const IRREVERSIBLE_ALWAYS: Rule = Rule(Cow::Borrowed("irreversible.always"));
    /// Tools with `gate: always` always need a person.
    pub const GATE_ALWAYS: Rule = Rule(Cow::Borrowed("gate.always"));

    /// Parses a rule name: two or more dot-separated segments of `[a-z0-9_]`, each starting
    /// with a letter.
    pub fn parse(s: &str) -> Option<Self> {
        let mut segments = 0;
        for segment in s.split('.') {
            let mut chars = segment.chars();
            let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
            let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !(first_ok && rest_ok) {
                return None;
            }
            segments += 1;
        }
        (segments >= 2).then(|| Self(Cow::Owned(s.to_owned())))
    }

    /// The rule's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the engine rules. Every arm but `Allow` names why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", content = "reason", rename_all = "snake_case")]
pub enum Decision {
    /// Run it.
    Allow,
    /// Run it: the standing authorization with this id covers it.
    AllowWithinAuthorization(String),
    /// Park it until a person approves exactly these inputs.
    RequireApproval(Rule),
    /// Never run it.
    Deny(Rule),
}

impl Decision {
    /// The rule named, if any.
    pub fn rule(&self) -> Option<&Rule> {
        match self {
            Self::Allow | Self::AllowWithinAuthorization(_) => None,
            Self::RequireApproval(rule) | Self::Deny(rule) => Some(rule),
        }
    }

    /// Its kind: `allow` (within an authorization too), `require_approval` or `deny`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Allow | Self::AllowWithinAuthorization(_) => "allow",
            Self::RequireApproval(_) => "require_approval",
            Self::Deny(_) => "deny",
        }
    }

    /// Whether the call may run without a person.
    pub fn runs_unattended(&self) -> bool {
        match self {
            Self::Allow | Self::AllowWithinAuthorization(_) => true,
            Self::RequireApproval(_) | Self::Deny(_) => false,
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Allow => f.write_str("allow"),
            Self::AllowWithinAuthorization(id) => write!(f, "allow_within_authorization({id})"),
            Self::RequireApproval(rule) => write!(f, "require_approval({rule})"),
            Self::Deny(rule) => write!(f, "deny({rule})"),
        }
    }
}

/// A decision with its evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionReport {
    /// The ruling.
    pub decision: Decision,
    /// The `@id`s of the Cedar policies that determined it, sorted (empty for a floor that
    /// ruled before Cedar ran, or when no permit matched).
    pub policy_ids: Vec<String>,
    /// Evaluation errors, if any (any error makes the decision `deny(policy.error)`).
    pub errors: Vec<String>,
    /// The shadow rules that would have decided more strictly (allow < require approval <
    /// deny), in `@id` order. Never part of `decision`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shadow: Vec<ShadowHit>,
}

/// What a shadow rule (`@shadow`) would have decided had it been enforced — the policies in
/// force plus that one — where that is stricter than the decision in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowHit {
    /// The shadow policy's `@id`.
    pub id: String,
    /// Its `@rule`.
    pub rule: String,
    /// What would have been decided.
    pub would: Decision,
}

/// Whether the caller is an agent credential or a signed-in person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrincipalKind {
    /// An agent credential (Cedar type `Agent`).
    Agent,
    /// A person (Cedar type `Human`).
    Human,
}

impl PrincipalKind {
    /// The Cedar entity type name.
    pub fn cedar_type(self) -> &'static str {
        match self {
            Self::Agent => "Agent",
            Self::Human => "Human",
        }
    }
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// Agent or person.
    pub kind: PrincipalKind,
    /// The credential's or person's id.
    pub id: String,
    /// The role the call is made in (`worker.finance`, `concierge`, …).
    pub role: String,
    /// The tenant the caller is confined to.
    pub tenant: String,
    /// The person the run acts for, when an agent calls on someone's behalf. Ownership and
    /// standing authorizations are checked against this party (or `id` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acts_for: Option<String>,
}

impl Principal {
    /// The party the call is made for: `acts_for`, or the principal itself.
    pub fn party(&self) -> &str {
        self.acts_for.as_deref().unwrap_or(&self.id)
    }
}

/// What the registry says about the tool, for this caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFacts {
    /// Tool name, also the Cedar action id (`Action::"payment.schedule"`).
    pub name: String,
    /// Effect class.
    pub effect: Effect,
    /// Gate setting.
    pub gate: Gate,
    /// Whether the tool is in the caller's role listing.
    pub listed_for_role: bool,
}

/// A record the arguments point at, as observed from the target system.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceFact {
    /// Kind in snake case (`invoice`, `supplier`, `reservation`); the Cedar entity type is its
    /// UpperCamelCase form (`Invoice`, `PurchaseOrder`).
    pub kind: String,
    /// The record's id.
    pub id: String,
    /// The tenant it belongs to.
    pub tenant: String,
    /// Its owner (the party it belongs to), where the target system has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Further attributes policies may read (money as `amount` + `currency`, converted like
    /// arguments).
    #[serde(default)]
    pub attrs: Map<String, Value>,
}

/// Where the task that led to this call came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskOrigin {
    /// A person asked for it directly.
    User,
    /// A schedule started it.
    Schedule,
    /// A deterministic monitor detected a change (StillOn's disruption monitor).
    Monitor,
    /// Content from outside the organisation started it (an inbound e-mail or document):
    /// untrusted text may have steered the plan.
    External,
}

impl TaskOrigin {
    /// Every origin, in the order they are documented.
    pub const ALL: [Self; 4] = [Self::User, Self::Schedule, Self::Monitor, Self::External];

    /// The origin `text` names (`user`, `schedule`, `monitor`, `external`); `None` otherwise.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == text)
    }

    /// The text policies see in `context.call.task_origin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Schedule => "schedule",
            Self::Monitor => "monitor",
            Self::External => "external",
        }
    }
}

/// Where the step's approval stands. Policy input only: whether an approval really binds these
/// inputs is the gate's check, not the engine's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Never asked.
    None,
    /// Asked, not answered.
    Pending,
    /// Approved for these inputs.
    Approved,
    /// Rejected.
    Rejected,
    /// Asked and expired.
    Expired,
}

impl ApprovalState {
    /// The text policies see in `context.call.approval`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Expired => "expired",
        }
    }
}

/// One condition of a standing authorization. All of a grant's conditions must hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthorizationCondition {
    /// The call points at one or more resources, and every one is owned by the party.
    OwnsResource,
    /// The argument `requested_time` (`HH:MM`, wall-clock time on the date and in the UTC
    /// offset of the resource's `starts_at`) is within this many minutes of the `starts_at`
    /// attribute (RFC 3339) of every resource that has one, and at least one has.
    MaxShiftMinutes(u32),
    /// The argument `amount` (with `currency`) is between 0 and this many minor units.
    MaxAmountMinor(i64),
    /// The argument `currency` is exactly this code (an amount bound means nothing without
    /// it: 100.00 EUR is not 100.00 GBP).
    Currency(String),
    /// The arguments carry no member outside this list.
    OnlyArguments(Vec<String>),
}

/// A standing authorization: data saying a party lets calls of one tool run without asking,
/// under conditions, until it expires (seed 004: "move my reservation by ≤ 30 minutes").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StandingAuthorization {
    /// Its id, reported in [`Decision::AllowWithinAuthorization`].
    pub id: String,
    /// The party that holds it (compared with [`Principal::party`]).
    pub principal: String,
    /// The one tool it covers.
    pub tool: String,
    /// What must hold for it to cover a call.
    pub conditions: Vec<AuthorizationCondition>,
    /// From this instant on it covers nothing.
    pub expires_at: DateTime<Utc>,
}

/// Everything a decision is a function of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The caller.
    pub principal: Principal,
    /// The tool, as the registry describes it for this caller.
    pub tool: ToolFacts,
    /// Errors from validating the arguments against the tool's input schema; empty = valid.
    pub schema_errors: Vec<String>,
    /// The canonical arguments (a JSON object).
    pub arguments: Value,
    /// The records the arguments point at.
    pub resources: Vec<ResourceFact>,
    /// Where the task came from.
    pub task_origin: TaskOrigin,
    /// Where the step's approval stands.
    pub approval: ApprovalState,
    /// The instant of the decision (injected; the engine never reads a clock).
    pub now: DateTime<Utc>,
    /// The standing authorizations the party holds.
    pub authorizations: Vec<StandingAuthorization>,
}
