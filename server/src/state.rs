//! What every handler, worker and CLI verb shares: the database, the configuration, the
//! registry in force, the counters, sign-in, the redaction keys and the shutdown signal.

use std::sync::Arc;

use std::net::SocketAddr;

use countersign_core::redact::RedactionKey;
use countersign_core::store::ConnectOptions;
use countersign_core::{Clock, Store, StoreError};
use leptos::config::LeptosOptions;

use crate::auth::Auth;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::registry::LiveRegistry;

/// Shared state every handler can reach: one allocation behind one reference count. axum
/// clones the state for every request (the `/mcp` guard's and each handler's); its parts
/// hold strings (the Leptos options) and a cancellation token whose clones take a lock, so a
/// clone of the parts themselves cost allocations and locks per request.
#[derive(Clone, Debug)]
pub struct AppState(Arc<AppParts>);

impl AppState {
    /// The state of these parts.
    pub fn new(parts: AppParts) -> Self {
        Self(Arc::new(parts))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppParts;

    fn deref(&self) -> &AppParts {
        &self.0
    }
}

/// What [`AppState`] holds.
#[derive(Debug)]
pub struct AppParts {
    /// The database.
    pub store: Store,
    /// Leptos rendering options.
    pub leptos: LeptosOptions,
    /// The validated configuration.
    pub config: Arc<Config>,
    /// The registry and policies in force.
    pub registry: Arc<LiveRegistry>,
    /// Gateway counters for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Dashboard sign-in and sessions.
    pub auth: Arc<Auth>,
    /// The HMAC key redacted values are hashed with (config `redaction_key`). `None`: they are
    /// keyed by [`AppParts::shown_key`], a random key of this process (equal values compare
    /// equal only within one process's records; fine on loopback for trying things out).
    pub redaction: Option<Arc<RedactionKey>>,
    /// The key values an agent is shown hashed are keyed with (`redacted:hmac-sha256:…`):
    /// derived from the configured `redaction_key` under its own label (so it never shows the
    /// audit's own digest), else a random key of this process — never an unkeyed hash, which
    /// a dictionary of IBANs would reverse.
    pub shown_key: Arc<RedactionKey>,
    /// Cancelled when the process shuts down: ends every MCP session (and its SSE stream),
    /// which would otherwise hold the graceful shutdown open.
    pub shutdown: tokio_util::sync::CancellationToken,
}

impl axum::extract::FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos.clone()
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The database was unreachable, malformed or failed to migrate.
    #[error("COUNTERSIGN_DATABASE_URL: {0}")]
    Database(#[from] StoreError),
    /// The listen address could not be bound.
    #[error("COUNTERSIGN_LISTEN: cannot listen on {addr}: {source}")]
    Bind {
        /// The configured address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The registry could not be made ready.
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryStartError),
    /// Sign-in could not be set up.
    #[error("COUNTERSIGN_OIDC_*: {0}")]
    Auth(#[from] crate::auth::oidc::SignInError),
    /// Serving failed.
    #[error("server error: {0}")]
    Serve(#[source] std::io::Error),
    /// No random key could be made for what agents are shown hashed.
    #[error("the operating system's random source failed: {0}")]
    Random(String),
}

/// Connects to the database named in `config` and applies pending migrations.
pub async fn connect_and_migrate(
    config: &Config,
    clock: Arc<dyn Clock>,
) -> Result<Store, StoreError> {
    let options = ConnectOptions {
        ablations: config.store_ablations,
        ..ConnectOptions::default()
    };
    let store = Store::connect(&config.database_url, &options, clock).await?;
    store.migrate().await?;
    Ok(store)
}
