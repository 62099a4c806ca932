//! The store: every row Countersign keeps, on SQLite (embedded default) or Postgres
//! (production), chosen at run time from the database URL.
//!
//! # How the two dialects share code without drifting
//!
//! * Queries are written once, as runtime `sqlx::query`/`query_as` strings using `$1`-style
//!   placeholders, which both SQLite and Postgres accept. The [`on_pool!`] macro expands one
//!   block of code once per backend, so the same text and the same Rust types are compiled
//!   against both drivers: a type or bind that one driver does not support fails to build.
//! * Column types are restricted to what both drivers decode identically: `TEXT`, `BIGINT`
//!   (timestamps are Unix milliseconds), `INTEGER`, `BOOLEAN`. JSON is stored as `TEXT`,
//!   because the audit chain and idempotency keys hash the exact canonical bytes and
//!   Postgres' `jsonb` would reorder them.
//! * DDL lives in `migrations/sqlite` and `migrations/postgres` with the same version
//!   numbers; the integration tests run every store test on both backends (Postgres is
//!   mandatory under `CI=true`), so a migration missing from one folder fails the suite.
//! * Where the dialects genuinely differ (the queue claim, `FOR UPDATE SKIP LOCKED`), the
//!   code matches on [`Backend`] explicitly and both arms are tested.

mod ablations;
mod agents;
pub(crate) mod audit_append;
mod bulk;
mod caches;
mod commit_queue;
mod demo;
mod directory;
mod duties;
mod error;
mod escalations;
pub(crate) mod group;
mod handle;
mod imports;
mod lean_pool;
mod leases;
mod mcp_sessions;
mod oauth_agents;
mod passkeys;
mod planned;
mod proposals;
mod recorded;
mod registry;
mod run_model;
mod runs;
mod standing;
mod step_model;
pub(crate) mod steps;
mod stops;
mod transition_sql;
mod views;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

use crate::clock::Clock;
use crate::secret::Secret;
use lean_pool::PING_AFTER_IDLE;
/// The store's pool (public for the benches' baselines, which must pay what the store pays).
pub use lean_pool::{LeanPool, LeanTx};

pub use ablations::Ablations;
pub use agents::{AgentCredential, AuthError, ContextHint, CreateAgentError, NewAgent};
pub use demo::{Applied, DemoEffect, DemoObject, ObjectWrite, demo_lookup_sql};
pub use directory::MAX_DISPLAY_NAME;
pub use duties::{REVIEW_APPROVED_RULE, ReviewError, StepDuties};
pub use error::StoreError;
pub(crate) use error::{answered, at_most_one, sent_maybe};
pub use escalations::{
    ACKNOWLEDGED_RULE, Escalation, EscalationKind, FIRST_SETTLEMENT_RULE, OPENED_RULE,
    RECONCILED_RULE, Resolution, SETTLED_RULE, SettleOutcome, UNDO_RELEASED_RULE, UNDO_RULE,
    UNDO_STARTED_RULE, WITHDRAWN_RULE,
};
pub use group::TIMING as COMMITTER_TIMING;
pub use handle::{Backend, Store};
pub(crate) use handle::{Pool, on_pool};
pub use imports::BundleImport;
pub use oauth_agents::OAuthRegistration;
pub use passkeys::{
    NonceTaken, PASSKEY_REGISTERED_RULE, PASSKEY_REMOVED_RULE, PASSKEY_REVOKED_RULE, Passkey,
};
pub use planned::PlannedCall;
pub use proposals::{
    ApproveOutcome, BundleChange, Change, ChangeOp, ListingChange, NewProposal, Proposal,
    ProposalError, ProposalStatus, SettingChange, ToolSetting, apply_changes,
};
pub use registry::{ImportError, RegistryVersion, registry_sha256};
pub use run_model::{NewRun, Run, RunStatus};
pub use standing::{
    CallContext, GRANTED_RULE, NewStanding, REVOKED_RULE, Standing, StandingError, StandingState,
};
pub use steps::{
    KeyClaim, KeyRecord, KeyState, NEXT_POSITION_SQL, NewStep, Reservation, RunGuard, Step,
    Transition,
};
pub use stops::{StopScope, tenant_switch};
pub use views::{AuditCursor, AuditFilter, approver_parts};

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/postgres");

/// Options for [`Store::connect`].
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// How long to wait for the database before giving up.
    pub connect_timeout: Duration,
    /// Maximum pooled connections.
    pub max_connections: u32,
    /// Write-path mechanisms turned off (benchmarks only).
    pub ablations: Ablations,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            max_connections: 16,
            ablations: Ablations::default(),
        }
    }
}

/// `url` with any password replaced by `***`, safe to print: the userinfo password and every
/// query parameter whose name holds "password" (`?password=`, `?sslpassword=`, which the
/// drivers read as well).
pub fn redact_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "[unparseable URL]".to_string();
    };
    let secret = |k: &str| k.to_ascii_lowercase().contains("password");
    let in_query = parsed.query_pairs().any(|(k, _)| secret(&k));
    if parsed.password().is_none() && !in_query {
        return url.to_string();
    }
    // set_password only fails for URLs that cannot carry one.
    if parsed.password().is_some() && parsed.set_password(Some("***")).is_err() {
        return "[unprintable URL]".to_string();
    }
    if in_query {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let v = if secret(&k) {
                    "***".to_string()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// The pool settings of every Postgres pool the store opens (benchmarks build their
/// baselines' pools from it too, so both sides pay the same per-acquire cost).
///
/// sqlx pings a connection on every acquire by default: one more round trip before each
/// statement or transaction, about a quarter of a millisecond on loopback, on the path of
/// every call and every executed step. Here only a connection idle for
/// [`PING_AFTER_IDLE`] is pinged first (one a firewall or a server restart may have cut);
/// a connection that breaks in use fails that statement with an I/O error, which callers
/// already treat like any database error (the step stays where it was, the call answers
/// an internal error), and sqlx closes it rather than returning it to the pool.
pub fn pg_pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_AFTER_IDLE {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}

/// How every SQLite connection of the store is opened (the benches open their SQLite
/// baselines' pools with it too): WAL, a 10 s busy timeout, foreign keys on.
pub fn sqlite_connect_options(url: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    Ok(SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true)
        // Temporary tables and statement journals in memory: by default SQLite created and
        // unlinked a temp file (`etilqs_*`) in almost every write transaction (measured from
        // outside: 3–12 % of the CPU per call went away with it). Nothing durable lives there.
        .pragma("temp_store", "memory"))
}

impl Store {
    /// Connects to the database `url` names, creating a SQLite file (and its folder) if
    /// missing. Does not migrate; call [`Store::migrate`].
    pub async fn connect(
        url: &Secret<String>,
        options: &ConnectOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let raw = url.expose().as_str();
        let shown = redact_url(raw);
        let malformed = |source| StoreError::MalformedUrl {
            url: shown.clone(),
            source,
        };
        let connect = |source| StoreError::Connect {
            url: shown.clone(),
            source,
        };
        let pool = match Backend::from_url(raw) {
            Some(Backend::Sqlite) => {
                let opts = sqlite_connect_options(raw).map_err(malformed)?;
                if let Some(parent) = opts.get_filename().parent()
                    && !parent.as_os_str().is_empty()
                {
                    std::fs::create_dir_all(parent).map_err(|e| connect(sqlx::Error::Io(e)))?;
                }
                let pool = SqlitePoolOptions::new()
                    .max_connections(options.max_connections)
                    .acquire_timeout(options.connect_timeout)
                    .connect_with(opts)
                    .await
                    .map_err(connect)?;
                Pool::Sqlite(LeanPool::new(pool))
            }
            Some(Backend::Postgres) => {
                let mut opts = PgConnectOptions::from_str(raw).map_err(malformed)?;
                // Every statement here is a short indexed read or write, yet a page query's
                // LIMIT over a large index carries a plan cost above `jit_above_cost`: JIT
                // then compiles for ~200 ms to run a 5 ms query (the render bench's audit
                // page, docs/benchmarks.md). Off unless the URL's own `options` set it.
                if !opts.get_options().is_some_and(|o| o.contains("jit")) {
                    opts = opts.options([("jit", "off")]);
                }
                // Every commit waits for the WAL flush (a job is answered only once durable:
                // store::group), whatever the database's or role's default — unless the
                // URL's own `options` say otherwise (`remote_apply` with standbys, say).
                if !opts
                    .get_options()
                    .is_some_and(|o| o.contains("synchronous_commit"))
                {
                    opts = opts.options([("synchronous_commit", "on")]);
                }
                // One direct connection first: the pool's acquire timeout would hide the
                // cause ("connection refused", "password authentication failed").
                let probe = tokio::time::timeout(
                    options.connect_timeout,
                    sqlx::PgConnection::connect_with(&opts),
                )
                .await
                .map_err(|_| connect(sqlx::Error::PoolTimedOut))?
                .map_err(connect)?;
                let _ = probe.close().await;
                let pool = pg_pool_options()
                    .max_connections(options.max_connections)
                    .acquire_timeout(options.connect_timeout)
                    .connect_with(opts)
                    .await
                    .map_err(connect)?;
                Pool::Postgres(LeanPool::new(pool))
            }
            None => return Err(StoreError::UnsupportedUrl { url: shown }),
        };
        let alone = Self {
            ablations: options.ablations,
            ..Self::alone(pool, clock)
        };
        Ok(Self {
            committer: Some(Arc::new(group::Committer::start(alone.clone()))),
            ..alone
        })
    }

    /// Applies every migration not yet applied.
    ///
    /// A database that has a migration this binary does not know (a newer Countersign
    /// migrated it) is refused with [`StoreError::SchemaNewer`], before anything is applied:
    /// mixed versions run only while the older ones were started first (docs/deploy.md).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let known = match &self.pool {
            Pool::Sqlite(_) => &SQLITE_MIGRATIONS,
            Pool::Postgres(_) => &POSTGRES_MIGRATIONS,
        };
        let newest = self.latest_migration();
        let result = match &self.pool {
            Pool::Sqlite(p) => known.run(p.unparked()).await,
            Pool::Postgres(p) => known.run(p.unparked()).await,
        };
        match result {
            Ok(()) => Ok(()),
            Err(sqlx::migrate::MigrateError::VersionMissing(found)) => {
                Err(StoreError::SchemaNewer {
                    found,
                    known: newest,
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Applies the migrations up to `version` only (tests of upgrades: a database of an
    /// earlier schema).
    #[cfg(feature = "test-support")]
    pub async fn migrate_to(&self, version: i64) -> Result<(), StoreError> {
        let upto = |m: &Migrator| Migrator {
            migrations: m
                .migrations
                .iter()
                .filter(|x| x.version <= version)
                .cloned()
                .collect::<Vec<_>>()
                .into(),
            ignore_missing: m.ignore_missing,
            locking: m.locking,
            no_tx: m.no_tx,
        };
        match &self.pool {
            Pool::Sqlite(p) => upto(&SQLITE_MIGRATIONS).run(p.unparked()).await?,
            Pool::Postgres(p) => upto(&POSTGRES_MIGRATIONS).run(p.unparked()).await?,
        }
        Ok(())
    }

    /// The highest migration version applied, if any.
    pub async fn schema_version(&self) -> Result<Option<i64>, StoreError> {
        let v: Option<i64> = on_pool!(self, |p| {
            sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success = TRUE")
                .fetch_one(p)
                .await?
        });
        Ok(v)
    }

    /// The newest migration version this build carries.
    pub fn latest_migration(&self) -> i64 {
        let m = match &self.pool {
            Pool::Sqlite(_) => &SQLITE_MIGRATIONS,
            Pool::Postgres(_) => &POSTGRES_MIGRATIONS,
        };
        m.iter().map(|m| m.version).max().unwrap_or(0)
    }

    /// Round-trips a trivial query: the database is reachable and answering.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let one: i32 = on_pool!(self, |p| {
            sqlx::query_scalar("SELECT 1").fetch_one(p).await?
        });
        if one == 1 {
            Ok(())
        } else {
            Err(StoreError::Conflict("SELECT 1 did not return 1".into()))
        }
    }

    /// Runs one raw SQL statement and returns the rows it affected. For operators and
    /// tests (for instance, proving the audit table refuses UPDATE); never for user input.
    pub async fn execute_sql(&self, sql: &str) -> Result<u64, StoreError> {
        let n = on_pool!(self, |p| {
            sqlx::query(sql).execute(p).await?.rows_affected()
        });
        Ok(n)
    }

    /// The first column of every row of raw SQL query `sql`, as text (tests of the schema).
    #[cfg(feature = "test-support")]
    pub async fn query_strings(&self, sql: &str) -> Result<Vec<String>, StoreError> {
        let rows: Vec<String> = on_pool!(self, |p| { sqlx::query_scalar(sql).fetch_all(p).await? });
        Ok(rows)
    }

    /// Closes the pool, waiting for connections to be returned.
    pub async fn close(&self) {
        on_pool!(self, |p| p.close().await)
    }
}

#[cfg(feature = "test-support")]
pub mod testing;
