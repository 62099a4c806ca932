//! The scenario file: its format (actors, steps, expectations), parsed from YAML, and the
//! demo systems' write operations the cross-cutting checks look at.

use crate::adapters::builtin::{ERP, FaultMode};
use crate::adapters::stillon::{HOLD_OPERATION, STILLON};
use countersign_core::Store;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// The issuer recorded for people who decide outside the dashboard (`approver_role` actors).
pub const IN_APP_ISSUER: &str = "urn:countersign:scenario-app";

/// Operations of the demo systems that change state (their effects are what the
/// cross-cutting checks look at).
pub fn write_operations(system: &str) -> &'static [&'static str] {
    match system {
        ERP => &[
            "notes.draft",
            "notes.discard",
            "invoices.hold",
            "payments.schedule",
            "suppliers.update_iban",
        ],
        STILLON => &[
            HOLD_OPERATION,
            "dining.reservation.modify",
            "dining.reservation.cancel",
            "calendar.update",
            "calendar.revert",
            "mobility.ride.adjust",
            "messaging.send",
        ],
        _ => &[],
    }
}

/// The demo systems whose effects the cross-cutting checks read.
pub(super) const SYSTEMS: [&str; 2] = [ERP, STILLON];

/// A scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name (shown in failures).
    pub name: String,
    /// The seed document it comes from (`000`, `002`, …), informational.
    #[serde(default)]
    pub seed: Option<String>,
    /// What it shows.
    #[serde(default)]
    pub description: String,
    /// Agents (`role`) and people (`person`: a demo sign-in name), by the name steps use.
    pub actors: BTreeMap<String, Actor>,
    /// What happens, in order.
    pub steps: Vec<Action>,
    /// What must be true afterwards.
    pub expect: Expect,
}

/// An agent (bearer token in `role`) or a person (demo sign-in).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Actor {
    /// Agent role (registry role name).
    #[serde(default)]
    pub role: Option<String>,
    /// Demo person (`ana`, `pat`, …).
    #[serde(default)]
    pub person: Option<String>,
    /// The agent's tenant (default `acme`).
    #[serde(default)]
    pub tenant: Option<String>,
    /// An agent's calls are made for this party (seed 004: the traveller `user-123`), whose
    /// records and standing authorizations apply.
    #[serde(default)]
    pub acts_for: Option<String>,
    /// A person who decides outside the dashboard (StillOn's traveller, in their own app),
    /// holding this approver role. Their decisions go through the store's decision path with
    /// the gate rules of the registry in force (role, expiry, four eyes, self-approval are
    /// checked there); `person` is their subject.
    #[serde(default)]
    pub approver_role: Option<String>,
    /// Who an agent's credential is recorded as created by (default `scenario:NAME`), e.g.
    /// `person:urn:countersign:demo#ada`, so that four eyes can tell its creator apart.
    #[serde(default)]
    pub created_by: Option<String>,
}

/// One step of a script: exactly one of `call`, `decide`, `form`, `fault`, `set`, `wait`,
/// `advance`, `sleep_ms`, `effects`, `objects`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// What this step is for (shown in failures).
    #[serde(default)]
    pub note: Option<String>,
    /// The actor doing it (`call`, `decide`).
    #[serde(default, rename = "as")]
    pub actor: Option<String>,
    /// `tools/call` of this tool (`plan.submit`, `step.approve`, … included).
    #[serde(default)]
    pub call: Option<String>,
    /// Its arguments (`${var}` substituted; a string that is exactly `${var}` takes the
    /// saved value with its JSON type).
    #[serde(default)]
    pub arguments: Option<Value>,
    /// Its `_meta`.
    #[serde(default)]
    pub meta: Option<Value>,
    /// A person's decision on a waiting step through `POST /api/steps/{id}/decision`.
    #[serde(default)]
    pub decide: Option<Decide>,
    /// A person posts one of the pages' forms (the gate advisor's draft, …).
    #[serde(default)]
    pub form: Option<FormPost>,
    /// A fault injected into a demo system's operation.
    #[serde(default)]
    pub fault: Option<FaultSpec>,
    /// The world changes outside Countersign: fields of a demo system's record are set (a
    /// flight's new estimated arrival, a slot someone else booked).
    #[serde(default)]
    pub set: Option<SetSpec>,
    /// Wait (real time) until a step or a run reaches a status.
    #[serde(default)]
    pub wait: Option<Wait>,
    /// Advance the server's clock (`72h`, `15m`, `1s`, combined: `72h1s`).
    #[serde(default)]
    pub advance: Option<String>,
    /// Sleep (real time), to give workers a chance to do what they must not.
    #[serde(default)]
    pub sleep_ms: Option<u64>,
    /// Check effect counts at this point (e.g. nothing paid before the approval).
    #[serde(default)]
    pub effects: Vec<EffectCount>,
    /// Check demo systems' records at this point.
    #[serde(default)]
    pub objects: Vec<ObjectCheck>,
    /// Checks on the reply (MCP: `structuredContent`; decide: the JSON body).
    #[serde(default)]
    pub reply: Option<ReplyCheck>,
    /// Saves values of the reply: variable → JSON pointer.
    #[serde(default)]
    pub save: BTreeMap<String, String>,
}

/// A form a person posts, as the page would (same origin, signed in).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormPost {
    /// The path (`/gates/draft`).
    pub path: String,
    /// The fields (`${var}` substituted).
    pub fields: BTreeMap<String, String>,
}

/// A person's decision.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decide {
    /// The step id (usually `${var}`).
    pub step: String,
    /// `approved` or `rejected`.
    pub verdict: String,
    /// Why.
    pub reason: String,
}

/// A fault for [`inject_fault`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// Demo system (default `erp`).
    #[serde(default)]
    pub system: Option<String>,
    /// Its operation (`payments.schedule`, …).
    pub operation: String,
    /// What happens.
    pub mode: FaultMode,
    /// How many calls (default 1).
    #[serde(default)]
    pub times: Option<u32>,
}

/// Fields of a demo record set from outside (JSON pointer → value).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetSpec {
    /// Demo system (default `erp`).
    #[serde(default)]
    pub system: Option<String>,
    /// Record kind (`flight`, `restaurant`, …).
    pub kind: String,
    /// Record id.
    pub id: String,
    /// JSON pointer → new value (the parent must exist).
    pub fields: BTreeMap<String, Value>,
}

/// Checks on a demo system's record.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectCheck {
    /// Demo system (default `erp`).
    #[serde(default)]
    pub system: Option<String>,
    /// Record kind.
    pub kind: String,
    /// Record id (`${var}` substituted).
    pub id: String,
    /// Checks on its JSON.
    #[serde(default)]
    pub is: ReplyCheck,
}

/// Wait for a step's (or a run's) status.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wait {
    /// The step id (usually `${var}`); exactly one of `step`, `run`.
    #[serde(default)]
    pub step: Option<String>,
    /// The run id.
    #[serde(default)]
    pub run: Option<String>,
    /// The status (`done`, `needs_approval`, …).
    pub status: String,
    /// At most this long (default 20 s).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Checks on one reply.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplyCheck {
    /// MCP `result.isError`.
    #[serde(default)]
    pub is_error: Option<bool>,
    /// A JSON-RPC error code instead of a result (e.g. -32602 for a tool that does not exist).
    #[serde(default)]
    pub rpc_error: Option<i64>,
    /// HTTP status of a decision.
    #[serde(default)]
    pub http: Option<u16>,
    /// JSON pointer → value (`${var}` substituted).
    #[serde(default)]
    pub equal: BTreeMap<String, Value>,
    /// JSON pointer → value it must differ from.
    #[serde(default)]
    pub not_equal: BTreeMap<String, Value>,
    /// JSON pointer → string prefix.
    #[serde(default)]
    pub prefix: BTreeMap<String, String>,
    /// JSON pointer → substring.
    #[serde(default)]
    pub contains: BTreeMap<String, String>,
    /// Pointers that must be present.
    #[serde(default)]
    pub present: Vec<String>,
    /// Tool names that must be listed for the actor (`tools/list`), checked before the call.
    #[serde(default)]
    pub listed: Vec<String>,
    /// Tool names that must not be listed for the actor.
    #[serde(default)]
    pub not_listed: Vec<String>,
}

/// What must be true after the steps.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Effects per operation at a demo system.
    #[serde(default)]
    pub effects: Vec<EffectCount>,
    /// Steps' final statuses.
    #[serde(default)]
    pub steps: Vec<StepState>,
    /// Runs' final statuses.
    #[serde(default)]
    pub runs: Vec<RunState>,
    /// Demo systems' records at the end.
    #[serde(default)]
    pub objects: Vec<ObjectCheck>,
    /// Audit records.
    #[serde(default)]
    pub audit: Vec<AuditExpect>,
    /// Strings that appear in no audit record (an IBAN in clear, the injected text's IBAN).
    #[serde(default)]
    pub never_in_audit: Vec<String>,
    /// The hash chain verifies (default true).
    #[serde(default = "yes")]
    pub chain_verifies: bool,
    /// Every effect of a gated step has an approval recorded before it (default true).
    #[serde(default = "yes")]
    pub no_unapproved_effects: bool,
    /// At most one effect per idempotency key (default true).
    #[serde(default = "yes")]
    pub one_effect_per_key: bool,
}

pub(super) fn yes() -> bool {
    true
}

/// `count` effects of `operation` at `system`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EffectCount {
    /// Demo system (default `erp`).
    #[serde(default)]
    pub system: Option<String>,
    /// Operation.
    pub operation: String,
    /// Exactly this many.
    pub count: usize,
}

/// A step's status at the end.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepState {
    /// Step id (`${var}`).
    pub step: String,
    /// Status.
    pub status: String,
    /// Its rule, if any.
    #[serde(default)]
    pub rule: Option<String>,
}

/// A run's status at the end.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunState {
    /// Run id (`${var}`).
    pub run: String,
    /// Status (`done`, `failed`, …).
    pub status: String,
    /// Whether it is flagged for re-planning.
    #[serde(default)]
    pub replan: Option<bool>,
}

/// Which records an audit expectation is about.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditFilter {
    /// Event (`decided`, `approved`, `succeeded`, …).
    #[serde(default)]
    pub event: Option<String>,
    /// Events, any of.
    #[serde(default)]
    pub events: Vec<String>,
    /// Tool.
    #[serde(default)]
    pub tool: Option<String>,
    /// Tool name prefix (`supplier.`).
    #[serde(default)]
    pub tool_prefix: Option<String>,
    /// Step id (`${var}`).
    #[serde(default)]
    pub step: Option<String>,
    /// Run id (`${var}`).
    #[serde(default)]
    pub run: Option<String>,
    /// Rule.
    #[serde(default)]
    pub rule: Option<String>,
    /// Actor contains this.
    #[serde(default)]
    pub actor: Option<String>,
}

/// An expectation on the audit records matching `where`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditExpect {
    /// What it checks (shown in failures).
    pub name: String,
    /// Which records.
    #[serde(rename = "where", default)]
    pub filter: AuditFilter,
    /// Exactly this many match.
    #[serde(default)]
    pub count: Option<usize>,
    /// At least this many match (default 1 when `count` is not given).
    #[serde(default)]
    pub at_least: Option<usize>,
    /// The events of the matching records, in order, are exactly these.
    #[serde(default)]
    pub sequence: Option<Vec<String>>,
    /// Every matching record's actor contains this.
    #[serde(default)]
    pub actor: Option<String>,
    /// Every matching record's rule is this.
    #[serde(default)]
    pub rule: Option<String>,
    /// Checks on every matching record's JSON (`/detail/…`, `/actor`, …).
    #[serde(default)]
    pub record: ReplyCheck,
    /// Substrings no matching record contains.
    #[serde(default)]
    pub not_containing: Vec<String>,
}

/// How the runner reaches the server.
pub struct Target<'a> {
    /// Base URL (`http://127.0.0.1:8080`).
    pub url: String,
    /// The `Origin` a browser would send (the server's public URL origin); `None`: `url`.
    pub origin: Option<String>,
    /// The server's database (agents, faults, effects, audit).
    pub store: Store,
    /// Advances the server's clock (test servers); `None` refuses `advance` steps.
    pub advance: Option<&'a (dyn Fn(chrono::Duration) + Send + Sync)>,
}

/// Why a scenario could not be played to its end.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file is not a scenario.
    #[error("scenario file: {0}")]
    Parse(String),
    /// A step failed (its checks, or the server did not answer as a server must).
    #[error("step {index} ({what}): {message}")]
    Step {
        /// 1-based.
        index: usize,
        /// The step's note or kind.
        what: String,
        /// What went wrong.
        message: String,
    },
}

/// Parses a scenario from YAML text.
pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
    serde_norway::from_str(text).map_err(|e| ScenarioError::Parse(e.to_string()))
}

/// Reads and parses a scenario file.
pub fn load(path: &std::path::Path) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ScenarioError::Parse(format!("{}: {e}", path.display())))?;
    parse(&text).map_err(|e| ScenarioError::Parse(format!("{}: {e}", path.display())))
}

/// Parses `72h`, `15m`, `30s`, `72h1s`.
pub fn parse_duration(text: &str) -> Option<chrono::Duration> {
    let mut total = 0i64;
    let mut num = String::new();
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: i64 = num.parse().ok()?;
        num.clear();
        total += n * match c {
            'd' => 86_400,
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
    }
    if !num.is_empty() || total <= 0 {
        return None;
    }
    Some(chrono::Duration::seconds(total))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;

    #[test]
    fn durations_parse_and_refuse_nonsense() {
        assert_eq!(
            parse_duration("72h1s"),
            Some(chrono::Duration::seconds(72 * 3600 + 1))
        );
        assert_eq!(parse_duration("15m"), Some(chrono::Duration::minutes(15)));
        for bad in ["", "72", "1x", "0s", "h"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
