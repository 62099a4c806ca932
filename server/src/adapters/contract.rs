//! The contract between the pipeline and an adapter: one invocation, what its errors say about
//! the effect, the adapter trait, and the settings and bounds every outbound call keeps.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use countersign_core::policy::ResourceFact;
use serde_json::Value;

/// The provider name of Countersign's own run tools (`plan.submit`, `run.status`, …, in
/// `crate::runs`): served in-process, never by an adapter.
pub const OWN_PROVIDER: &str = "countersign";

/// How long one adapter call may take before it counts as timed out.
pub const ADAPTER_TIMEOUT: Duration = Duration::from_secs(20);

/// A boxed future, so adapters can sit behind `dyn`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One call to a target system, after every check passed.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The registry tool being executed.
    pub tool: String,
    /// The provider's operation (`payments.schedule`).
    pub operation: String,
    /// The canonical arguments, exactly as validated, hashed and (where gated) approved.
    pub arguments: Value,
    /// The idempotency key Countersign derived for this step.
    pub idem_key: String,
    /// The approval token, when a person approved this exact call.
    pub approval_token: Option<String>,
    /// Correlates the call across systems.
    pub trace_id: String,
    /// The tenant of the run (targets refuse other tenants' records).
    pub tenant: String,
    /// The party the call is made for (the run's `acts_for`), when known: targets whose
    /// records have owners refuse anyone else's (the built-in StillOn systems do; a target
    /// that sees `None` where an owner matters refuses).
    pub acts_for: Option<String>,
    /// This key was sent before (an earlier attempt of the step): a target answering "this
    /// key's first request is still running" then leaves the effect unknown.
    pub resend: bool,
}

/// What went wrong, and what is known about the effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    /// The target refused the call (a business rule, a missing record): nothing happened and
    /// repeating it will not help.
    #[error("rejected by the target ({code}): {message}")]
    Rejected {
        /// A short machine-readable reason (`not_found`, `conflict`, `state.changed`).
        code: String,
        /// The target's explanation, for people.
        message: String,
    },
    /// The call did not take effect (could not connect, target unavailable): retryable.
    #[error("target unavailable: {0}")]
    Unavailable(String),
    /// The call was sent and no answer came in time: it may or may not have happened.
    #[error("no answer from the target in time")]
    Timeout,
    /// The adapter refused to send it (outbound host not allowed, provider misconfigured).
    #[error("adapter refused the call: {0}")]
    Refused(String),
}

/// A way to reach one provider's target system.
pub trait Adapter: Send + Sync + fmt::Debug {
    /// Performs `call` once under its key; a target that has seen the key answers with the
    /// stored result instead of acting again.
    fn invoke<'a>(&'a self, call: &'a Invocation) -> BoxFuture<'a, Result<Value, AdapterError>>;

    /// Reconciliation: what the target recorded under `idem_key`. `Ok(Some)` = it happened
    /// (with its result), `Ok(None)` = the target confirms it never did, `Err` = cannot tell.
    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        idem_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, AdapterError>>;

    /// The record of `kind` with `id`, as facts policies may read (`None` when it does not
    /// exist). Targets that expose no facts answer `None`.
    fn facts<'a>(
        &'a self,
        kind: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceFact>, AdapterError>>;

    /// Read-back aliases for `operation`: (argument name, dotted path into the verify tool's
    /// result) pairs whose values must be equal after the call succeeded (`requested_time` ↔
    /// `time`).
    /// Arguments with the same name as a result field are compared without an alias (see
    /// `crate::revalidate`). Default: none.
    fn readback_aliases(&self, operation: &str) -> &'static [(&'static str, &'static str)] {
        let _ = operation;
        &[]
    }
}

/// How outbound adapters (`http`, `mcp`) behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdapterSettings {
    /// Total time one outbound call may take, connecting included; past it the call counts
    /// as [`AdapterError::Timeout`] (or [`AdapterError::Unavailable`] if it never connected).
    pub timeout: Duration,
    /// Time to establish the connection (never more than `timeout`).
    pub connect_timeout: Duration,
}

/// How long connecting may take at most.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl AdapterSettings {
    /// Settings with a total timeout of `timeout`.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            timeout,
            connect_timeout: timeout.min(CONNECT_TIMEOUT),
        }
    }
}

impl Default for AdapterSettings {
    fn default() -> Self {
        Self::with_timeout(Duration::from_secs(15))
    }
}
