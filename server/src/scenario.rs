//! Scenarios as data: scripted agents and people play a YAML script against a running server
//! over its real interfaces (MCP over streamable HTTP for agents, the approval API behind the
//! demo sign-in for people), then expectations are checked on the audit trail and on the
//! demo target systems' effects — never on prose.
//!
//! A scenario file (`examples/*/scenarios/*.yaml`) has `actors` (agents with a role, people
//! by demo sign-in name), `steps` (tool calls, plan submissions, reviewer calls, human
//! decisions, fault injections, waits for a step status, clock advances) and `expect`.
//!
//! Invariants of the runner (it is a test instrument, so it fails loudly, never silently):
//! * an expectation that cannot be evaluated (unknown variable, unreadable record, store
//!   error) is a failed check, never a passed one;
//! * the cross-cutting guarantees are on by default and must be switched off explicitly:
//!   the audit chain verifies, no gated step has an effect without a recorded approval, and
//!   no idempotency key has more than one effect;
//! * agents never choose idempotency keys: the runner sends what the script says, and the
//!   gateway stamps keys (scripts may send a client key to show that it is ignored);
//! * agents behave as well-behaved MCP clients: every session opened is ended with
//!   `DELETE /mcp` when the play ends, finished or not (check `sessions closed`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use countersign_core::Store;
use countersign_core::store::NewAgent;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::adapters::builtin::{ERP, Fault, FaultMode, inject_fault};
use crate::adapters::stillon::{HOLD_OPERATION, STILLON};

const PROTOCOL: &str = "2025-06-18";

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
const SYSTEMS: [&str; 2] = [ERP, STILLON];

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
}

/// One step of a script: exactly one of `call`, `decide`, `fault`, `set`, `wait`,
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

fn yes() -> bool {
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

/// One checked expectation.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub ok: bool,
    /// What was seen when it did not.
    pub detail: String,
}

/// The outcome of a scenario.
#[derive(Debug, Clone)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Every expectation checked.
    pub checks: Vec<Check>,
    /// Saved variables (run and step ids, …).
    pub vars: BTreeMap<String, Value>,
}

impl Report {
    /// The failed checks.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.ok).collect()
    }
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

/// An MCP session of one agent over streamable HTTP.
struct Session {
    http: reqwest::Client,
    url: String,
    token: String,
    session: Option<String>,
    next_id: u64,
}

impl Session {
    async fn connect(http: &reqwest::Client, base: &str, token: &str) -> Result<Self, String> {
        let mut s = Self {
            http: http.clone(),
            url: format!("{base}/mcp"),
            token: token.to_string(),
            session: None,
            next_id: 1,
        };
        let init = s
            .request(
                "initialize",
                json!({"protocolVersion": PROTOCOL, "capabilities": {},
                       "clientInfo": {"name": "countersign-scenario", "version": "0"}}),
            )
            .await?;
        if init.get("result").is_none() {
            return Err(format!("initialize failed: {init}"));
        }
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let resp = s
            .post(&note)
            .send()
            .await
            .map_err(|e| format!("initialized: {e}"))?;
        if resp.status() != reqwest::StatusCode::ACCEPTED {
            return Err(format!("initialized answered {}", resp.status()));
        }
        Ok(s)
    }

    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("Accept", "application/json, text/event-stream")
            .json(body);
        if let Some(session) = &self.session {
            req = req
                .header("Mcp-Session-Id", session)
                .header("MCP-Protocol-Version", PROTOCOL);
        }
        req
    }

    async fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let resp = self
            .post(&body)
            .send()
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        if resp.status() != reqwest::StatusCode::OK {
            return Err(format!("{method}: HTTP {}", resp.status()));
        }
        if let Some(session) = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            self.session = Some(session.to_string());
        }
        read_response(resp, id).await
    }

    /// Ends the session (`DELETE /mcp` with its id): the server answers 202 and forgets it.
    /// A session the server no longer has (404) or a credential it no longer accepts (401:
    /// revoked or expired during the play) has nothing left to close from this side.
    async fn close(self) -> Result<(), String> {
        let Some(session) = &self.session else {
            return Ok(());
        };
        let resp = self
            .http
            .delete(&self.url)
            .bearer_auth(&self.token)
            .header("Mcp-Session-Id", session)
            .header("MCP-Protocol-Version", PROTOCOL)
            .send()
            .await
            .map_err(|e| format!("closing the session: {e}"))?;
        match resp.status() {
            reqwest::StatusCode::ACCEPTED
            | reqwest::StatusCode::NOT_FOUND
            | reqwest::StatusCode::UNAUTHORIZED => Ok(()),
            other => Err(format!("closing the session answered {other}")),
        }
    }

    async fn tool_names(&mut self) -> Result<Vec<String>, String> {
        let list = self.request("tools/list", json!({})).await?;
        let tools = list["result"]["tools"]
            .as_array()
            .ok_or_else(|| format!("tools/list: {list}"))?;
        Ok(tools
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_string))
            .collect())
    }
}

/// The JSON-RPC response with `id`, from a JSON body or an SSE stream.
async fn read_response(mut resp: reqwest::Response, id: u64) -> Result<Value, String> {
    let sse = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !sse {
        return resp.json().await.map_err(|e| format!("response: {e}"));
    }
    let mut buf = String::new();
    loop {
        let chunk = resp
            .chunk()
            .await
            .map_err(|e| format!("stream: {e}"))?
            .ok_or_else(|| format!("stream ended before response {id}: {buf}"))?;
        buf.push_str(&String::from_utf8_lossy(&chunk));
        for line in buf.lines() {
            if let Some(data) = line.strip_prefix("data:")
                && let Ok(msg) = serde_json::from_str::<Value>(data.trim())
                && msg["id"] == json!(id)
            {
                return Ok(msg);
            }
        }
    }
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

/// Substitutes `${var}` in every string of `v`.
fn subst(v: &Value, vars: &BTreeMap<String, Value>) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) => {
            if let Some(name) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}'))
                && !name.contains("${")
            {
                return vars
                    .get(name)
                    .cloned()
                    .ok_or_else(|| format!("unknown variable {name}"));
            }
            Value::String(subst_str(s, vars)?)
        }
        Value::Array(a) => {
            Value::Array(a.iter().map(|x| subst(x, vars)).collect::<Result<_, _>>()?)
        }
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| Ok((k.clone(), subst(x, vars)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

fn subst_str(s: &str, vars: &BTreeMap<String, Value>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed ${{ in {s}"))?;
        let name = &after[..end];
        let value = vars
            .get(name)
            .ok_or_else(|| format!("unknown variable {name}"))?;
        match value {
            Value::String(t) => out.push_str(t),
            other => out.push_str(&other.to_string()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Numbers compare by value (4180 == 4180.0).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) if a.is_number() && b.is_number() => x == y,
        _ => a == b,
    }
}

/// Applies `check`'s pointer checks to `v`; the first failure.
fn check_value(
    check: &ReplyCheck,
    v: &Value,
    vars: &BTreeMap<String, Value>,
) -> Result<(), String> {
    for (ptr, want) in &check.equal {
        let want = subst(want, vars)?;
        match v.pointer(ptr) {
            Some(got) if same(got, &want) => {}
            got => return Err(format!("{ptr}: wanted {want}, got {got:?}")),
        }
    }
    for (ptr, unwanted) in &check.not_equal {
        let unwanted = subst(unwanted, vars)?;
        if v.pointer(ptr).is_some_and(|got| same(got, &unwanted)) {
            return Err(format!("{ptr}: must not be {unwanted}"));
        }
    }
    for (ptr, p) in &check.prefix {
        let p = subst_str(p, vars)?;
        match v.pointer(ptr).and_then(Value::as_str) {
            Some(got) if got.starts_with(&p) => {}
            got => return Err(format!("{ptr}: wanted prefix {p:?}, got {got:?}")),
        }
    }
    for (ptr, p) in &check.contains {
        let p = subst_str(p, vars)?;
        match v.pointer(ptr).and_then(Value::as_str) {
            Some(got) if got.contains(&p) => {}
            got => return Err(format!("{ptr}: wanted to contain {p:?}, got {got:?}")),
        }
    }
    for ptr in &check.present {
        if v.pointer(ptr).is_none_or(Value::is_null) {
            return Err(format!("{ptr}: missing"));
        }
    }
    Ok(())
}

struct Runner<'a, 'b> {
    target: &'b Target<'a>,
    http: reqwest::Client,
    scenario: &'b Scenario,
    tokens: BTreeMap<String, String>,
    sessions: BTreeMap<String, Session>,
    vars: BTreeMap<String, Value>,
}

/// Plays `scenario` against `target` and checks its expectations.
pub async fn run(scenario: &Scenario, target: &Target<'_>) -> Result<Report, ScenarioError> {
    let setup = |message: String| ScenarioError::Step {
        index: 0,
        what: "actors".into(),
        message,
    };
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| setup(e.to_string()))?;
    let mut runner = Runner {
        target,
        http,
        scenario,
        tokens: BTreeMap::new(),
        sessions: BTreeMap::new(),
        vars: BTreeMap::new(),
    };
    // Each scenario's agents are its own: names are unique among active credentials.
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    for (name, actor) in &scenario.actors {
        match (&actor.role, &actor.person) {
            (Some(role), None) => {
                if actor.approver_role.is_some() {
                    return Err(setup(format!("actor {name}: approver_role is for people")));
                }
                let (_, token) = target
                    .store
                    .create_agent(&NewAgent {
                        name: format!("{name}-{}", &nonce[..8]),
                        role: role.clone(),
                        tenant: actor.tenant.clone().unwrap_or_else(|| "acme".into()),
                        created_by: format!("scenario:{}", scenario.name),
                        expires_at: None,
                        // The operator's binding, made as the credential is created.
                        acts_for: actor.acts_for.clone(),
                        origin: countersign_core::policy::TaskOrigin::User,
                    })
                    .await
                    .map_err(|e| setup(format!("agent {name}: {e}")))?;
                runner
                    .tokens
                    .insert(name.clone(), token.reveal().to_string());
            }
            (None, Some(_)) if actor.acts_for.is_none() => {}
            _ => {
                return Err(setup(format!(
                    "actor {name}: exactly one of role, person (acts_for is for agents)"
                )));
            }
        }
    }
    let mut played = Ok(());
    for (i, action) in scenario.steps.iter().enumerate() {
        if let Err(message) = runner.step(action).await {
            played = Err(ScenarioError::Step {
                index: i + 1,
                what: action
                    .note
                    .clone()
                    .or_else(|| action.call.clone())
                    .unwrap_or_else(|| "step".into()),
                message,
            });
            break;
        }
    }
    // A well-behaved client ends its sessions (HTTP DELETE) rather than leaving the server to
    // expire them; played or not, every agent's session is closed.
    let closed = runner.close_sessions().await;
    played?;
    let mut checks = runner.expectations().await;
    checks.push(Check {
        name: "sessions closed".into(),
        ok: closed.is_ok(),
        detail: closed.err().unwrap_or_default(),
    });
    Ok(Report {
        scenario: scenario.name.clone(),
        checks,
        vars: runner.vars,
    })
}

impl Runner<'_, '_> {
    /// Ends every agent's MCP session with `DELETE /mcp`; the first failure, if any.
    async fn close_sessions(&mut self) -> Result<(), String> {
        let mut result = Ok(());
        for (actor, session) in std::mem::take(&mut self.sessions) {
            if let Err(e) = session.close().await
                && result.is_ok()
            {
                result = Err(format!("{actor}: {e}"));
            }
        }
        result
    }

    async fn session(&mut self, actor: &str) -> Result<&mut Session, String> {
        if !self.sessions.contains_key(actor) {
            let token = self
                .tokens
                .get(actor)
                .ok_or_else(|| format!("{actor} is not an agent of this scenario"))?;
            let s = Session::connect(&self.http, &self.target.url, token).await?;
            self.sessions.insert(actor.to_string(), s);
        }
        self.sessions
            .get_mut(actor)
            .ok_or_else(|| format!("no session for {actor}"))
    }

    fn save(&mut self, saves: &BTreeMap<String, String>, v: &Value) -> Result<(), String> {
        for (name, ptr) in saves {
            let got = v
                .pointer(ptr)
                .ok_or_else(|| format!("save {name}: nothing at {ptr} in {v}"))?;
            self.vars.insert(name.clone(), got.clone());
        }
        Ok(())
    }

    async fn step(&mut self, a: &Action) -> Result<(), String> {
        let check = a.reply.clone().unwrap_or_default();
        if let Some(tool) = &a.call {
            let actor = a.actor.as_deref().ok_or("a call needs `as`")?;
            let arguments = subst(a.arguments.as_ref().unwrap_or(&json!({})), &self.vars)?;
            let mut params = json!({"name": tool, "arguments": arguments});
            if let Some(meta) = &a.meta {
                params["_meta"] = subst(meta, &self.vars)?;
            }
            let session = self.session(actor).await?;
            if !check.listed.is_empty() || !check.not_listed.is_empty() {
                let names = session.tool_names().await?;
                for t in &check.listed {
                    if !names.contains(t) {
                        return Err(format!("{t} is not listed for {actor}: {names:?}"));
                    }
                }
                for t in &check.not_listed {
                    if names.contains(t) {
                        return Err(format!("{t} is listed for {actor}"));
                    }
                }
            }
            let reply = session.request("tools/call", params).await?;
            if let Some(code) = check.rpc_error {
                if reply["error"]["code"] != json!(code) {
                    return Err(format!("wanted JSON-RPC error {code}: {reply}"));
                }
                return Ok(());
            }
            if reply.get("result").is_none() {
                return Err(format!("no result: {reply}"));
            }
            let content = &reply["result"]["structuredContent"];
            if let Some(want) = check.is_error
                && reply["result"]["isError"] != json!(want)
            {
                return Err(format!("isError wanted {want}: {reply}"));
            }
            check_value(&check, content, &self.vars).map_err(|e| format!("{e} in {reply}"))?;
            return self.save(&a.save, content);
        }
        if let Some(d) = &a.decide {
            let actor = a.actor.as_deref().ok_or("a decision needs `as`")?;
            let person = self
                .scenario
                .actors
                .get(actor)
                .and_then(|x| x.person.clone())
                .ok_or_else(|| format!("{actor} is not a person of this scenario"))?;
            let step = subst_str(&d.step, &self.vars)?;
            let in_app = self
                .scenario
                .actors
                .get(actor)
                .and_then(|x| x.approver_role.clone());
            let (status, body) = match in_app {
                Some(role) => {
                    self.decide_in_app(&person, &role, &step, &d.verdict, &d.reason)
                        .await?
                }
                None => self.decide(&person, &step, &d.verdict, &d.reason).await?,
            };
            let want = check.http.unwrap_or(200);
            if status != want {
                return Err(format!("decision answered {status}, wanted {want}: {body}"));
            }
            check_value(&check, &body, &self.vars).map_err(|e| format!("{e} in {body}"))?;
            return self.save(&a.save, &body);
        }
        if let Some(f) = &a.fault {
            let system = f.system.as_deref().unwrap_or(ERP);
            let fault = Fault {
                mode: f.mode,
                times: f.times.unwrap_or(1),
            };
            return inject_fault(&self.target.store, system, &f.operation, &fault)
                .await
                .map_err(|e| format!("fault: {e}"));
        }
        if let Some(set) = &a.set {
            let system = set.system.as_deref().unwrap_or(ERP);
            let id = subst_str(&set.id, &self.vars)?;
            let store = &self.target.store;
            let obj = store
                .demo_get(system, &set.kind, &id)
                .await
                .map_err(|e| format!("set: {e}"))?
                .ok_or_else(|| format!("set: no {system} {} {id}", set.kind))?;
            let mut data: Value =
                serde_json::from_str(&obj.data).map_err(|e| format!("set: {e}"))?;
            for (ptr, value) in &set.fields {
                let value = subst(value, &self.vars)?;
                let slot = data
                    .pointer_mut(ptr)
                    .ok_or_else(|| format!("set: nothing at {ptr} in {}", obj.data))?;
                *slot = value;
            }
            return store
                .demo_put(system, &set.kind, &id, &obj.tenant, &data.to_string())
                .await
                .map(|_| ())
                .map_err(|e| format!("set: {e}"));
        }
        if let Some(w) = &a.wait
            && let Some(run) = &w.run
        {
            if w.step.is_some() {
                return Err("wait for a step or a run, not both".into());
            }
            let run = subst_str(run, &self.vars)?;
            let limit = Duration::from_millis(w.timeout_ms.unwrap_or(20_000));
            let began = Instant::now();
            loop {
                let now = self
                    .target
                    .store
                    .get_run(&run)
                    .await
                    .map_err(|e| format!("run {run}: {e}"))?;
                if now.status.as_str() == w.status {
                    return Ok(());
                }
                if began.elapsed() > limit {
                    return Err(format!(
                        "run {run} stuck at {}, wanted {}",
                        now.status.as_str(),
                        w.status
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if let Some(w) = &a.wait {
            let step = subst_str(
                w.step.as_deref().ok_or("wait needs step or run")?,
                &self.vars,
            )?;
            let limit = Duration::from_millis(w.timeout_ms.unwrap_or(20_000));
            let began = Instant::now();
            loop {
                let now = self
                    .target
                    .store
                    .get_step(&step)
                    .await
                    .map_err(|e| format!("step {step}: {e}"))?;
                if now.status.as_str() == w.status {
                    return Ok(());
                }
                if began.elapsed() > limit {
                    return Err(format!(
                        "step {step} ({}) stuck at {}, wanted {}",
                        now.tool,
                        now.status.as_str(),
                        w.status
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if let Some(text) = &a.advance {
            let by = parse_duration(text).ok_or_else(|| format!("bad duration {text}"))?;
            let advance = self
                .target
                .advance
                .ok_or("this server's clock cannot be advanced")?;
            advance(by);
            return Ok(());
        }
        if let Some(ms) = a.sleep_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            return Ok(());
        }
        if !a.effects.is_empty() {
            for ec in &a.effects {
                let system = ec.system.as_deref().unwrap_or(ERP);
                let got = self
                    .target
                    .store
                    .demo_effects(system, &ec.operation)
                    .await
                    .map_err(|e| format!("effects: {e}"))?;
                if got.len() != ec.count {
                    return Err(format!(
                        "{} effects of {system} {}, wanted {}",
                        got.len(),
                        ec.operation,
                        ec.count
                    ));
                }
            }
            return Ok(());
        }
        if !a.objects.is_empty() {
            for oc in &a.objects {
                self.object_check(oc).await?;
            }
            return Ok(());
        }
        Err(
            "a step needs one of call, decide, fault, set, wait, advance, sleep_ms, effects, objects"
                .into(),
        )
    }

    /// `oc` holds for the record as the demo system has it now.
    async fn object_check(&self, oc: &ObjectCheck) -> Result<(), String> {
        let system = oc.system.as_deref().unwrap_or(ERP);
        let id = subst_str(&oc.id, &self.vars)?;
        let obj = self
            .target
            .store
            .demo_get(system, &oc.kind, &id)
            .await
            .map_err(|e| format!("{system} {} {id}: {e}", oc.kind))?
            .ok_or_else(|| format!("no {system} {} {id}", oc.kind))?;
        let data: Value = serde_json::from_str(&obj.data).map_err(|e| e.to_string())?;
        check_value(&oc.is, &data, &self.vars)
            .map_err(|e| format!("{system} {} {id}: {e} in {data}", oc.kind))
    }

    /// A person outside the dashboard decides: the store's decision path, with the gate rules
    /// of the registry in force for the step's tool and inputs.
    async fn decide_in_app(
        &self,
        person: &str,
        role: &str,
        step: &str,
        verdict: &str,
        reason: &str,
    ) -> Result<(u16, Value), String> {
        use countersign_core::approvals::{Approver, Decider, Verdict};
        let store = &self.target.store;
        let verdict = match verdict {
            "approved" => Verdict::Approved,
            "rejected" => Verdict::Rejected,
            other => return Err(format!("verdict {other}: approved or rejected")),
        };
        let found = store.get_step(step).await.map_err(|e| e.to_string())?;
        let (_, sources) = store
            .current_bundle()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no registry in force")?;
        let bundle = countersign_core::Bundle::load(sources).map_err(|e| e.to_string())?;
        let tool = countersign_core::ToolName::parse(&found.tool)
            .ok()
            .and_then(|n| bundle.registry.tool(&n).cloned())
            .ok_or_else(|| format!("{} is not in the registry in force", found.tool))?;
        let inputs: Value = serde_json::from_str(&found.inputs).map_err(|e| e.to_string())?;
        let rules = crate::pipeline::gate_rules(&tool, &inputs);
        let decider = Decider {
            approver: Approver {
                iss: IN_APP_ISSUER.into(),
                sub: person.to_string(),
            },
            roles: vec![role.to_string()],
            auth_time: store.clock().now_ms(),
            auth_time_unknown: false,
        };
        match store
            .decide_step(step, &decider, &rules, verdict, reason)
            .await
        {
            Ok((approval, _)) => {
                let status = store
                    .get_step(step)
                    .await
                    .map(|s| s.status.as_str())
                    .unwrap_or("unknown");
                Ok((
                    200,
                    json!({"step_id": step, "decision": approval.decision, "status": status}),
                ))
            }
            Err(countersign_core::approvals::DecideError::Store(e)) => Err(e.to_string()),
            Err(e) => Ok((409, json!({"error": e.to_string()}))),
        }
    }

    /// Signs `person` in through the demo sign-in and posts the decision.
    async fn decide(
        &self,
        person: &str,
        step: &str,
        verdict: &str,
        reason: &str,
    ) -> Result<(u16, Value), String> {
        let base = &self.target.url;
        let origin = self.target.origin.as_deref().unwrap_or(base);
        let signed = self
            .http
            .post(format!("{base}/auth/demo"))
            .header("origin", origin)
            .form(&[("user", person)])
            .send()
            .await
            .map_err(|e| format!("sign-in: {e}"))?;
        if signed.status() != reqwest::StatusCode::SEE_OTHER {
            return Err(format!("demo sign-in of {person}: {}", signed.status()));
        }
        let cookie = signed
            .headers()
            .get_all(reqwest::header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|v| v.split(';').next())
            .collect::<Vec<_>>()
            .join("; ");
        let resp = self
            .http
            .post(format!("{base}/api/steps/{step}/decision"))
            .header("origin", origin)
            .header(reqwest::header::COOKIE, cookie)
            .json(&json!({"verdict": verdict, "reason": reason}))
            .send()
            .await
            .map_err(|e| format!("decision: {e}"))?;
        let status = resp.status().as_u16();
        let body = resp.json::<Value>().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    async fn expectations(&self) -> Vec<Check> {
        let mut checks = Vec::new();
        let store = &self.target.store;
        let e = &self.scenario.expect;
        let mut push = |name: String, r: Result<(), String>| {
            checks.push(Check {
                name,
                ok: r.is_ok(),
                detail: r.err().unwrap_or_default(),
            });
        };
        let records = match store.audit_records(1, 1_000_000).await {
            Ok(r) => r,
            Err(err) => {
                push("read the audit trail".into(), Err(err.to_string()));
                return checks;
            }
        };
        let parsed: Vec<Value> = records
            .iter()
            .map(|r| serde_json::from_str(&r.record).unwrap_or(Value::Null))
            .collect();

        for ec in &e.effects {
            let system = ec.system.as_deref().unwrap_or(ERP);
            let r = match store.demo_effects(system, &ec.operation).await {
                Ok(v) if v.len() == ec.count => Ok(()),
                Ok(v) => Err(format!("{} effects: {v:?}", v.len())),
                Err(err) => Err(err.to_string()),
            };
            push(
                format!("effects: {system} {} x{}", ec.operation, ec.count),
                r,
            );
        }

        for s in &e.steps {
            let r = async {
                let id = subst_str(&s.step, &self.vars)?;
                let step = store.get_step(&id).await.map_err(|e| e.to_string())?;
                if step.status.as_str() != s.status {
                    return Err(format!("{} is {}", step.tool, step.status.as_str()));
                }
                if let Some(rule) = &s.rule
                    && step.rule.as_deref() != Some(rule.as_str())
                {
                    return Err(format!("rule {:?}", step.rule));
                }
                Ok(())
            }
            .await;
            push(format!("step {} is {}", s.step, s.status), r);
        }

        for rs in &e.runs {
            let r = async {
                let id = subst_str(&rs.run, &self.vars)?;
                let run = store.get_run(&id).await.map_err(|e| e.to_string())?;
                if run.status.as_str() != rs.status {
                    return Err(format!("run is {}", run.status.as_str()));
                }
                if let Some(want) = rs.replan
                    && run.replan != want
                {
                    return Err(format!("replan is {}", run.replan));
                }
                Ok(())
            }
            .await;
            push(format!("run {} is {}", rs.run, rs.status), r);
        }

        for oc in &e.objects {
            let r = self.object_check(oc).await;
            push(
                format!(
                    "{} {} {}",
                    oc.system.as_deref().unwrap_or(ERP),
                    oc.kind,
                    oc.id
                ),
                r,
            );
        }

        for a in &e.audit {
            let r = self.audit_expect(a, &records, &parsed);
            push(format!("audit: {}", a.name), r);
        }

        for text in &e.never_in_audit {
            let hit = records.iter().find(|r| r.record.contains(text.as_str()));
            push(
                format!("never in the audit trail: {text}"),
                match hit {
                    None => Ok(()),
                    Some(r) => Err(format!("record {} ({}) has it", r.seq, r.event)),
                },
            );
        }

        if e.chain_verifies {
            let r = match store.verify_audit().await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(b)) => Err(b.to_string()),
                Err(err) => Err(err.to_string()),
            };
            push("the audit chain verifies".into(), r);
        }

        if e.no_unapproved_effects || e.one_effect_per_key {
            let mut effects = Vec::new();
            let mut failed = None;
            for system in SYSTEMS {
                for op in write_operations(system) {
                    match store.demo_effects(system, op).await {
                        Ok(v) => effects.extend(v),
                        Err(err) => failed = Some(err.to_string()),
                    }
                }
            }
            if let Some(err) = failed {
                push("read the effects".into(), Err(err));
            } else {
                if e.one_effect_per_key {
                    let mut seen = BTreeSet::new();
                    let dup = effects
                        .iter()
                        .find(|x| !seen.insert((x.system.clone(), x.idem_key.clone())));
                    push(
                        "at most one effect per idempotency key".into(),
                        match dup {
                            None => Ok(()),
                            Some(d) => Err(format!("{} twice under {}", d.operation, d.idem_key)),
                        },
                    );
                }
                if e.no_unapproved_effects {
                    let r = self.unapproved(&effects, &records).await;
                    push("no effect of a gated step without an approval".into(), r);
                }
            }
        }
        checks
    }

    /// Every effect's step (found by its key): if it ever waited for a person, an approval
    /// was recorded before the effect.
    async fn unapproved(
        &self,
        effects: &[countersign_core::store::DemoEffect],
        records: &[countersign_core::audit::AuditRecord],
    ) -> Result<(), String> {
        for fx in effects {
            // A StillOn hold is recorded under `<key>:hold`, part of the move under `<key>`.
            let idem_key = match fx.operation.as_str() {
                HOLD_OPERATION => fx.idem_key.strip_suffix(":hold").unwrap_or(&fx.idem_key),
                _ => fx.idem_key.as_str(),
            };
            let key = self
                .target
                .store
                .get_key(idem_key)
                .await
                .map_err(|e| e.to_string())?;
            let Some(key) = key else {
                return Err(format!(
                    "{} under {} has no key reserved by Countersign",
                    fx.operation, fx.idem_key
                ));
            };
            let of_step: Vec<_> = records
                .iter()
                .filter(|r| r.step_id.as_deref() == Some(key.step_id.as_str()))
                .collect();
            let gated = of_step.iter().any(|r| r.event == "waiting_approval");
            if !gated {
                continue;
            }
            let approved = of_step
                .iter()
                .any(|r| r.event == "approved" && r.at <= fx.at);
            let started_after = of_step.iter().any(|r| {
                r.event == "started"
                    && of_step
                        .iter()
                        .any(|a| a.event == "approved" && a.seq < r.seq)
            });
            if !(approved && started_after) {
                return Err(format!(
                    "{} of step {} has no approval before it",
                    fx.operation, key.step_id
                ));
            }
        }
        Ok(())
    }

    fn audit_expect(
        &self,
        a: &AuditExpect,
        records: &[countersign_core::audit::AuditRecord],
        parsed: &[Value],
    ) -> Result<(), String> {
        let f = &a.filter;
        let step = f
            .step
            .as_deref()
            .map(|s| subst_str(s, &self.vars))
            .transpose()?;
        let run = f
            .run
            .as_deref()
            .map(|s| subst_str(s, &self.vars))
            .transpose()?;
        let matching: Vec<(usize, &countersign_core::audit::AuditRecord)> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                f.event.as_deref().is_none_or(|e| r.event == e)
                    && (f.events.is_empty() || f.events.contains(&r.event))
                    && f.tool
                        .as_deref()
                        .is_none_or(|t| r.tool.as_deref() == Some(t))
                    && f.tool_prefix
                        .as_deref()
                        .is_none_or(|p| r.tool.as_deref().is_some_and(|t| t.starts_with(p)))
                    && step
                        .as_deref()
                        .is_none_or(|s| r.step_id.as_deref() == Some(s))
                    && run
                        .as_deref()
                        .is_none_or(|s| r.run_id.as_deref() == Some(s))
                    && f.rule
                        .as_deref()
                        .is_none_or(|x| r.rule.as_deref() == Some(x))
                    && f.actor
                        .as_deref()
                        .is_none_or(|x| r.actor.as_deref().is_some_and(|a| a.contains(x)))
            })
            .collect();
        let seen = || {
            matching
                .iter()
                .map(|(_, r)| format!("{}:{}:{:?}", r.seq, r.event, r.rule))
                .collect::<Vec<_>>()
        };
        if let Some(n) = a.count
            && matching.len() != n
        {
            return Err(format!(
                "{} records, wanted {n}: {:?}",
                matching.len(),
                seen()
            ));
        }
        let at_least = a.at_least.unwrap_or(usize::from(a.count.is_none()));
        if matching.len() < at_least {
            return Err(format!(
                "{} records, wanted at least {at_least}: {:?}",
                matching.len(),
                seen()
            ));
        }
        if let Some(seq) = &a.sequence {
            let got: Vec<&str> = matching.iter().map(|(_, r)| r.event.as_str()).collect();
            if got != seq.iter().map(String::as_str).collect::<Vec<_>>() {
                return Err(format!("events {got:?}, wanted {seq:?}"));
            }
        }
        for (i, r) in &matching {
            if let Some(actor) = &a.actor
                && !r
                    .actor
                    .as_deref()
                    .is_some_and(|x| x.contains(actor.as_str()))
            {
                return Err(format!("record {} actor {:?}", r.seq, r.actor));
            }
            if let Some(rule) = &a.rule
                && r.rule.as_deref() != Some(rule.as_str())
            {
                return Err(format!("record {} rule {:?}", r.seq, r.rule));
            }
            check_value(&a.record, &parsed[*i], &self.vars)
                .map_err(|e| format!("record {} ({}): {e}: {}", r.seq, r.event, r.record))?;
            for text in &a.not_containing {
                let text = subst_str(text, &self.vars)?;
                if r.record.contains(&text) {
                    return Err(format!("record {} contains {text}", r.seq));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn variables_keep_their_type_when_whole_and_interpolate_otherwise() {
        let mut vars = BTreeMap::new();
        vars.insert("amount".to_string(), json!(4180.0));
        vars.insert("id".to_string(), json!("INV-1"));
        let v = subst(&json!({"a": "${amount}", "b": "on ${id}"}), &vars).unwrap();
        assert_eq!(v, json!({"a": 4180.0, "b": "on INV-1"}));
        assert!(subst(&json!("${nope}"), &vars).is_err());
    }
}
