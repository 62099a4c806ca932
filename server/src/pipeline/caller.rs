//! Who calls and what they propose: an authenticated agent (or an executor worker on a planned
//! step's credential), what was read with its authentication ([`Admission`]: by the `/mcp`
//! guard, or by the executor with its claim), and one proposed call.

use crate::provenance::Provenance;
use countersign_core::store::{AgentCredential, CallContext};
use serde_json::{Map, Value};
/// Who is calling: an authenticated agent, and its MCP session if it has one.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The credential the request authenticated with.
    pub credential: AgentCredential,
    /// The MCP session id, when the transport has one.
    pub session: Option<String>,
    /// The executor worker running a planned step on the credential's behalf, if any.
    pub executor: Option<String>,
    /// What the `/mcp` guard read with the authentication, if anything.
    pub admission: Option<Admission>,
}

/// One proposed call.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// Tool name as the caller gave it.
    pub tool: String,
    /// Arguments as given.
    pub arguments: Map<String, Value>,
    /// `_meta.run_id`: used only when the caller's credential owns that run.
    pub run_id: Option<String>,
    /// `_meta.step_id`: the step this call means (its state is reported; different inputs
    /// are refused as `idempotency.mismatch`).
    pub step_id: Option<String>,
    /// What the agent says about itself (`_meta.model`, `_meta.prompt_revision`) and the
    /// W3C `traceparent` it sent, if any.
    pub provenance: Provenance,
}

/// The executor name compensation steps run under (they run in the run that failed).
pub const COMPENSATOR: &str = "compensator";

/// What the guard hands the handler beside the credential.
#[derive(Debug, Clone)]
pub struct Admission {
    /// Where the pipeline remembers this session's agent and run (`Store::call_hint`);
    /// `None` without an MCP session.
    pub hint_key: Option<String>,
    /// The context read with the authentication, for the run named (used only when the
    /// call resolves to exactly that run).
    pub prefetched: Option<(String, CallContext)>,
}
