//! Adapters: HOW a tool call reaches its target system, resolved server-side from the
//! registry's `handler.provider`. The model never names one.
//!
//! Invariants:
//! * An adapter is only ever handed a call that passed the whole gateway pipeline (listing,
//!   schema, policy, gate, key reservation); it never decides anything about permission.
//! * Every invocation carries the key Countersign derived ([`Invocation::idem_key`]); an
//!   adapter passes it to targets that honour keys and never invents its own.
//! * Errors say what is known about the effect: [`AdapterError::Rejected`] and
//!   [`AdapterError::Unavailable`] mean nothing happened; [`AdapterError::Timeout`] means it may
//!   have. The pipeline turns a timed-out irreversible call into `unknown`, never a retry.
//! * A provider the registry names but no adapter serves fails the call closed.

pub mod builtin;
pub mod http;
pub mod mcp;
pub mod recovery;
pub mod stillon;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::Store;
use countersign_core::policy::ResourceFact;
use countersign_core::registry::{ProviderKind, Registry};
use serde_json::Value;

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

/// The adapters for every provider in a registry.
#[derive(Clone, Default)]
pub struct Adapters {
    by_provider: BTreeMap<String, Arc<dyn Adapter>>,
}

impl fmt::Debug for Adapters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.by_provider.keys()).finish()
    }
}

/// A provider the registry names that no adapter can serve.
#[derive(Debug, thiserror::Error)]
#[error("provider {provider}: {reason}")]
pub struct UnservedProvider {
    /// Provider name.
    pub provider: String,
    /// Why it cannot be served.
    pub reason: String,
}

impl Adapters {
    /// Builds an adapter for each provider of `registry`. Providers that cannot be served are
    /// returned alongside: their tools fail closed when called.
    pub fn for_registry(
        registry: &Registry,
        store: &Store,
        settings: &AdapterSettings,
    ) -> (Self, Vec<UnservedProvider>) {
        let mut by_provider: BTreeMap<String, Arc<dyn Adapter>> = BTreeMap::new();
        let mut unserved = Vec::new();
        for provider in registry.providers() {
            let name = provider.name.as_str().to_string();
            // Countersign's own run tools (plan.submit, run.*, step.*) are served by the
            // pipeline itself, not by an adapter.
            if name == crate::runs::PROVIDER {
                continue;
            }
            match provider.kind {
                ProviderKind::Builtin => match builtin::for_provider(&name, store) {
                    Some(adapter) => {
                        by_provider.insert(name, adapter);
                    }
                    None => unserved.push(UnservedProvider {
                        provider: name,
                        reason: "no built-in system has this name".into(),
                    }),
                },
                ProviderKind::Http => match http::HttpAdapter::new(provider, settings) {
                    Ok(adapter) => {
                        by_provider.insert(name, Arc::new(adapter));
                    }
                    Err(e) => unserved.push(UnservedProvider {
                        provider: name,
                        reason: e.to_string(),
                    }),
                },
                ProviderKind::Mcp => match mcp::McpAdapter::new(provider, settings) {
                    Ok(adapter) => {
                        by_provider.insert(name, Arc::new(adapter));
                    }
                    Err(e) => unserved.push(UnservedProvider {
                        provider: name,
                        reason: e.to_string(),
                    }),
                },
            }
        }
        (Self { by_provider }, unserved)
    }

    /// Adds (or replaces) the adapter for `provider`.
    pub fn insert(&mut self, provider: impl Into<String>, adapter: Arc<dyn Adapter>) {
        self.by_provider.insert(provider.into(), adapter);
    }

    /// The adapter serving `provider`.
    pub fn get(&self, provider: &str) -> Option<&Arc<dyn Adapter>> {
        self.by_provider.get(provider)
    }
}
