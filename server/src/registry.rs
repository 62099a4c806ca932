//! The live registry: the newest bundle version (registry + policies) in the database,
//! loaded at start and swapped in when another process imports a new one — no restart.
//!
//! Invariants:
//! * The database is the source of truth. `COUNTERSIGN_REGISTRY` only seeds a database that
//!   holds no version yet; it never overrides a stored one.
//! * A stored version that fails to load (for instance written by a newer build) never
//!   replaces the one in use: the server keeps the last good bundle and logs the problem.
//!   With no good bundle at all, no tool is listed for anyone (fail closed).

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use countersign_core::Store;
use countersign_core::bundle::{Bundle, BundleError, BundleSources};
use countersign_core::store::ImportError;

use crate::adapters::{AdapterSettings, Adapters, builtin, stillon};

/// Who the start-up import is recorded as.
pub const CONFIG_IMPORTER: &str = "config:COUNTERSIGN_REGISTRY";

/// One loaded version.
#[derive(Debug)]
pub struct Loaded {
    /// Version number in `registry_versions`.
    pub version: i64,
    /// The registry and the policy engine built from it.
    pub bundle: Bundle,
    /// An adapter for each provider the registry names (the HOW of every tool).
    pub adapters: Adapters,
}

/// Why the registry could not be made ready at start.
#[derive(Debug, thiserror::Error)]
pub enum RegistryStartError {
    /// The configured file or folder does not load.
    #[error(
        "COUNTERSIGN_REGISTRY: {path} is invalid ({count} problem(s); `countersign registry validate {path}` lists them all); first: {first}"
    )]
    Invalid {
        /// The configured path.
        path: String,
        /// How many problems.
        count: usize,
        /// The first problem.
        first: String,
    },
    /// The database failed.
    #[error("COUNTERSIGN_DATABASE_URL: {0}")]
    Store(String),
}

/// The bundle currently in force, shared by every request and worker.
#[derive(Debug, Default)]
pub struct LiveRegistry {
    current: RwLock<Option<Arc<Loaded>>>,
    adapter_settings: AdapterSettings,
}

impl LiveRegistry {
    /// Seeds an empty database from `seed` (if given), then loads the newest version.
    pub async fn bootstrap(
        store: &Store,
        seed: Option<&Path>,
        adapter_settings: AdapterSettings,
    ) -> Result<Arc<Self>, RegistryStartError> {
        let stored = store
            .registry_version()
            .await
            .map_err(|e| RegistryStartError::Store(e.to_string()))?;
        if stored.is_none()
            && let Some(path) = seed
        {
            let invalid = |problems: Vec<String>| RegistryStartError::Invalid {
                path: path.display().to_string(),
                count: problems.len(),
                first: problems.first().cloned().unwrap_or_default(),
            };
            let sources = BundleSources::read(path).map_err(|e| invalid(problem_lines(&e)))?;
            let version = store
                .import_bundle(&sources, CONFIG_IMPORTER)
                .await
                .map_err(|e| invalid(import_problem_lines(&e)))?;
            tracing::info!(version, path = %path.display(), "registry imported from configuration");
        }
        let live = Arc::new(Self {
            current: RwLock::default(),
            adapter_settings,
        });
        live.refresh(store).await;
        Ok(live)
    }

    /// The bundle in force, if any.
    pub fn current(&self) -> Option<Arc<Loaded>> {
        self.current
            .read()
            .map(|g| g.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// The version in force, if any.
    pub fn version(&self) -> Option<i64> {
        self.current().map(|l| l.version)
    }

    /// Loads the newest stored version if it differs from the one in force. Returns whether
    /// a new version was swapped in.
    pub async fn refresh(&self, store: &Store) -> bool {
        let newest = match store.registry_version().await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "registry poll failed; keeping the bundle in force");
                return false;
            }
        };
        if newest.is_none() || newest == self.version() {
            return false;
        }
        let (version, sources) = match store.current_bundle().await {
            Ok(Some(v)) => v,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(error = %e, "registry read failed; keeping the bundle in force");
                return false;
            }
        };
        match Bundle::load(sources) {
            Ok(bundle) => {
                let (adapters, unserved) =
                    Adapters::for_registry(&bundle.registry, store, &self.adapter_settings);
                for u in &unserved {
                    tracing::warn!(%u, "provider not served: its tools fail closed");
                }
                if adapters.get(builtin::ERP).is_some()
                    && let Err(e) = builtin::seed_erp(store).await
                {
                    tracing::warn!(error = %e, "seeding the demo ERP failed");
                }
                if adapters.get(stillon::STILLON).is_some()
                    && let Err(e) = stillon::seed_stillon(store).await
                {
                    tracing::warn!(error = %e, "seeding the demo StillOn systems failed");
                }
                let loaded = Arc::new(Loaded {
                    version,
                    bundle,
                    adapters,
                });
                match self.current.write() {
                    Ok(mut g) => *g = Some(loaded),
                    Err(e) => *e.into_inner() = Some(loaded),
                }
                tracing::info!(version, "registry version in force");
                true
            }
            Err(e) => {
                tracing::error!(version, problems = %e, "stored registry version does not load; keeping the bundle in force");
                false
            }
        }
    }

    /// Polls the database every `every` and swaps in new versions, until the task is dropped.
    pub fn spawn_watcher(
        self: &Arc<Self>,
        store: Store,
        every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let live = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                live.refresh(&store).await;
            }
        })
    }
}

/// Every problem in a bundle error, one line each (an I/O error is one problem).
pub fn problem_lines(e: &BundleError) -> Vec<String> {
    match e.problems() {
        [] => vec![e.to_string()],
        problems => problems.iter().map(ToString::to_string).collect(),
    }
}

fn import_problem_lines(e: &ImportError) -> Vec<String> {
    match e {
        ImportError::Invalid(b) => problem_lines(b),
        ImportError::NoAuthor | ImportError::Store(_) => vec![e.to_string()],
    }
}
