//! The handle every component reaches the database through ([`Store`]), the two pools it may
//! hold, and the seam to the group committer ([`CommitQueue`]): the committer is built on top
//! of the store (`group`), the store only knows that a queue takes its writes.
//!
//! Invariants:
//! * [`on_pool!`] expands one block of code once per backend, so a query is written once and
//!   compiled against both drivers.
//! * The committer's seam is the only way a store hands a write to another task; a store
//!   without one (inside the committer) writes alone.

use std::sync::Arc;

use sqlx::{Postgres, Sqlite};

use super::caches::Bounded;
use super::commit_queue::CommitQueue;
use super::lean_pool::LeanPool;
use super::run_model::Run;
use crate::clock::Clock;

/// How many sessions' runs a store remembers ([`Store::session_run`]).
pub(crate) const SESSION_RUNS_KEPT: usize = 50_000;

/// How many sessions' call hints a store remembers ([`Store::call_hint`]).
pub(crate) const CALL_HINTS_KEPT: usize = 50_000;

/// How many runs' tenants a store remembers (the audit chain of their records).
pub(crate) const RUN_TENANTS_KEPT: usize = 65_536;

/// Expands `$body` once per backend with `$pool` bound to the concrete pool (a
/// [`LeanPool`]: a statement run on it hands its connection back without a round trip).
macro_rules! on_pool {
    ($store:expr, |$pool:ident| $body:expr) => {
        match &$store.pool {
            $crate::store::Pool::Sqlite($pool) => $body,
            $crate::store::Pool::Postgres($pool) => $body,
        }
    };
}
pub(crate) use on_pool;

/// Which database a [`Store`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// An embedded SQLite file: one process, one writer.
    Sqlite,
    /// A Postgres server: many replicas and workers.
    Postgres,
}

impl Backend {
    /// The backend a database URL names, if any.
    pub fn from_url(url: &str) -> Option<Self> {
        if url.starts_with("sqlite:") {
            Some(Self::Sqlite)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Some(Self::Postgres)
        } else {
            None
        }
    }

    /// A short lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }
}

#[derive(Clone)]
pub(crate) enum Pool {
    Sqlite(LeanPool<Sqlite>),
    Postgres(LeanPool<Postgres>),
}

/// The handle every component uses to reach the database. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pub(crate) pool: Pool,
    pub(crate) clock: Arc<dyn Clock>,
    /// Group commit of transitions and audit appends (`group`'s committer, behind
    /// [`CommitQueue`]); `None` inside the committer itself.
    pub(crate) committer: Option<Arc<dyn CommitQueue>>,
    /// Runs of MCP sessions already looked up ([`Store::session_run`]); a session key names
    /// at most one run for ever. Shared by clones.
    pub(crate) session_runs: Bounded<Run>,
    /// [`Store::call_hint`]: which agent and run an MCP session's calls were last seen to be,
    /// keyed by what the `/mcp` guard can compute before it authenticates. A hint only
    /// chooses what is read with the authentication; it grants nothing.
    pub(crate) call_hints: Bounded<(String, String)>,
    /// Tenants of runs (a run's tenant never changes), so that a step's records find their
    /// audit chain without a query after the run's first. Shared by clones.
    pub(crate) run_tenants: Bounded<String>,
    /// Write-path mechanisms turned off (benchmarks only).
    pub(crate) ablations: super::ablations::Ablations,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// A store over `pool` without a committer (every write alone) and with empty caches.
    pub(crate) fn alone(pool: Pool, clock: Arc<dyn Clock>) -> Self {
        Self {
            pool,
            clock,
            committer: None,
            session_runs: Bounded::new(SESSION_RUNS_KEPT),
            call_hints: Bounded::new(CALL_HINTS_KEPT),
            run_tenants: Bounded::new(RUN_TENANTS_KEPT),
            ablations: super::ablations::Ablations::default(),
        }
    }

    /// Which backend this store uses.
    pub fn backend(&self) -> Backend {
        match &self.pool {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// The clock this store stamps rows with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Committer batches this store wrote in one round trip (Postgres; see [`crate::store`]'s
    /// group commit). For tests and diagnostics.
    pub fn one_trip_batches(&self) -> u64 {
        self.committer.as_ref().map_or(0, |c| c.one_trips())
    }
}
