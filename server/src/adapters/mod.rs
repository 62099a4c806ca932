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

mod contract;
pub use contract::{
    ADAPTER_TIMEOUT, Adapter, AdapterError, AdapterSettings, BoxFuture, CONNECT_TIMEOUT,
    Invocation, OWN_PROVIDER,
};

pub mod builtin;
mod demo_kit;
pub mod http;
pub mod mcp;
pub mod recovery;
mod seed;
pub mod stillon;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use countersign_core::Store;
use countersign_core::registry::{ProviderKind, Registry};

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
            if name == OWN_PROVIDER {
                continue;
            }
            match provider.kind {
                ProviderKind::Builtin => match for_provider(&name, store) {
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

/// The adapter for a built-in provider name, if there is one.
fn for_provider(name: &str, store: &Store) -> Option<Arc<dyn Adapter>> {
    match name {
        builtin::ERP => Some(Arc::new(builtin::Erp {
            store: store.clone(),
        })),
        stillon::STILLON => Some(Arc::new(stillon::StillOn::new(store))),
        builtin::NOOP => Some(Arc::new(builtin::Noop)),
        _ => None,
    }
}
