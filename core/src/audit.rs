//! The audit trail: one append-only hash chain per tenant (and `_system` for records of no
//! tenant, `_legacy` for those written before chains per tenant), each record holding the hash
//! of the one before it in its chain, so that changing, deleting, reordering, moving or
//! truncating records is detectable; and signed checkpoints over every chain's head
//! ([`tree_head`]).
//!
//! Invariants:
//! * A record's `hash` is `sha256:` + SHA-256 of its canonical JSON (RFC 8785), and that JSON
//!   embeds `seq`, `prev` and (format [`RECORD_VERSION`]) its `chain`; the text stored is
//!   exactly the text hashed. The [`LEGACY_CHAIN`]'s records keep format 1 (no chain, no
//!   version) byte for byte; nothing is sealed onto it (the database refuses it).
//! * A record's chain is its tenant's ([`chain_of_tenant`]): named by the record, else its
//!   run's (looked up once per run and cached), else [`SYSTEM_CHAIN`]; a record naming another
//!   tenant than its run's, or a reserved name, is refused ([`Store::chain_for`]).
//! * `seq` starts at 1 in each chain and is its head's `seq + 1`; `(chain, seq)` is the key.
//!   The database refuses a record that does not extend its chain's head row (`audit_chains`)
//!   and moves the head with it (migration 0016); appenders lock only their chain's head row
//!   ([`hold_head!`]), so tenants append concurrently and a transaction appends to one chain.
//! * `at` never decreases along a chain: an appender holding the head seals at max(now, the
//!   head's `at`) ([`ChainHead::at_for`]), so a time range is a range of the write order
//!   (`pos`, the readers' order; not hashed) within a clock skew across chains.
//! * The database refuses UPDATE, DELETE (and TRUNCATE on Postgres) on the table; this module
//!   only ever INSERTs.
//! * [`verify`] / [`ChainVerifier`] fail closed: the first record that does not parse, is not
//!   canonical, does not match its stored hash, skips a `seq`, does not link to its
//!   predecessor, stands in another chain or whose columns disagree with its hashed text is
//!   named; a chain that ends short of its head row, or has none, is broken too. Canonical
//!   form and columns are checked without allocating ([`check`]); [`ChainVerifier::push_all`]
//!   runs the per-record checks on several threads over contiguous chunks, then walks the
//!   chain sequentially, so the first break and its reason are those of record-by-record
//!   verification.
//! * A signed checkpoint pins the hash at its `seq` in each chain it covers: a chain that no
//!   longer has it there, or ends before it, is broken even if it links perfectly.
//! * The record format (what [`seal`] builds) is written in one place; every append seals
//!   through [`seal_next!`] (alone, in a step transition, or in a group-commit batch,
//!   [`crate::store`]'s committer).
//! * Callers pass values already redacted ([`crate::redact`]); nothing here sees secrets.

pub use chain::{
    ChainBreak, ChainVerifier, default_threads, hash_text, seal, verify, verify_with_threads,
};
pub use read::audit_for_step_sql;
pub(crate) use read::{FAILURE_PAGE, RECENT_EVENTS_SQL, parse_recent_events};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::store::{Pool, Store, StoreError};

mod chain;
mod check;
pub mod checkpoint;
mod full;
pub mod merkle;
pub mod note;
mod read;
mod redaction;
mod tenants;
pub mod tree_head;

/// Test access to the two halves of the per-record text check (see `check`'s invariant).
#[cfg(feature = "test-support")]
pub use check::fast_and_general;

/// `prev` of the first record.
pub const GENESIS: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// The chain of records that belong to no tenant (operational events of the platform).
pub const SYSTEM_CHAIN: &str = "_system";

/// The chain records written before chains per tenant (schema < 16) were moved into, byte for
/// byte: the database refuses appends to it (migration 0016).
pub const LEGACY_CHAIN: &str = "_legacy";

/// The record format [`seal`] writes: the version 2 body names its chain and its version
/// (`"chain"`, `"v":2`); version 1 (the [`LEGACY_CHAIN`]'s records) names neither.
pub const RECORD_VERSION: i64 = 2;

/// The chain a record of `tenant` (or of none) belongs to. Tenants are named by people and
/// identity providers; a name starting with `_` would collide with the reserved chains
/// ([`SYSTEM_CHAIN`], [`LEGACY_CHAIN`]) and is refused (fail closed: no record is written).
pub fn chain_of_tenant(tenant: Option<&str>) -> Result<String, StoreError> {
    match tenant {
        None => Ok(SYSTEM_CHAIN.to_string()),
        Some(t) if t.is_empty() || t.starts_with('_') => Err(StoreError::Conflict(format!(
            "tenant {t:?} cannot have an audit chain: names starting with '_' (and the empty \
             name) are reserved"
        ))),
        Some(t) => Ok(t.to_string()),
    }
}

/// How many times an append retries after losing a race for the next `seq`.
const APPEND_ATTEMPTS: usize = 8;

/// What happened. Every attempt of every step appends one or more of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditEvent {
    /// A call or plan step was proposed.
    Proposed,
    /// Its arguments passed the schema.
    Validated,
    /// Policy decided.
    Decided,
    /// Parked at a gate.
    WaitingApproval,
    /// A person approved.
    Approved,
    /// A person (or the model reviewer) rejected.
    Rejected,
    /// A gate expired.
    Expired,
    /// Execution started.
    Started,
    /// The target confirmed the effect.
    Succeeded,
    /// The call failed.
    Failed,
    /// An irreversible call timed out after being sent.
    Unknown,
    /// Reconciliation settled an unknown outcome.
    Reconciled,
    /// A compensating call ran.
    Compensated,
    /// Cancelled before it ran.
    Cancelled,
    /// Refused before any handler ran.
    Refused,
    /// An operational event (key rotation, emergency stop, registry change).
    Operational,
}

impl AuditEvent {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Proposed => "proposed",
            Self::Validated => "validated",
            Self::Decided => "decided",
            Self::WaitingApproval => "waiting_approval",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Expired => "expired",
            Self::Started => "started",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
            Self::Reconciled => "reconciled",
            Self::Compensated => "compensated",
            Self::Cancelled => "cancelled",
            Self::Refused => "refused",
            Self::Operational => "operational",
        }
    }
}

/// A record to append. `detail` holds the rest of DESIGN §4's record (inputs, approval,
/// outcome, usage…), already redacted.
#[derive(Debug, Clone, Default)]
pub struct NewAuditRecord {
    /// What happened.
    pub event: Option<AuditEvent>,
    /// Run, if any.
    pub run_id: Option<String>,
    /// Step, if any.
    pub step_id: Option<String>,
    /// Tool, if any.
    pub tool: Option<String>,
    /// Who acted: role, agent, model, prompt revision, or a person's `iss`+`sub`.
    pub actor: Option<String>,
    /// The deciding policy rule, if any.
    pub rule: Option<String>,
    /// Everything else, as JSON.
    pub detail: Map<String, Value>,
    /// The tenant whose chain the record joins. When `None`, the tenant of `run_id`'s run,
    /// else [`SYSTEM_CHAIN`]. A record of a run may not name another tenant (refused).
    pub tenant: Option<String>,
}

/// A stored record (and one line of `audit export`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
#[serde(deny_unknown_fields)]
pub struct AuditRecord {
    /// The chain: a tenant, [`SYSTEM_CHAIN`] or [`LEGACY_CHAIN`] (an export written before
    /// chains per tenant has no such member: its records are the legacy chain's).
    #[serde(default = "legacy_chain")]
    pub chain: String,
    /// Position in the chain, from 1.
    pub seq: i64,
    /// Where the record stands in the order records were written, across chains: for readers
    /// only (not hashed, proves nothing); 0 for a record not read back from the database.
    #[serde(default)]
    pub pos: i64,
    /// Unix ms.
    pub at: i64,
    /// Event text.
    pub event: String,
    /// Run id.
    pub run_id: Option<String>,
    /// Step id.
    pub step_id: Option<String>,
    /// Tool.
    pub tool: Option<String>,
    /// Actor.
    pub actor: Option<String>,
    /// Rule.
    pub rule: Option<String>,
    /// The canonical JSON that `hash` covers.
    pub record: String,
    /// Hash of the previous record.
    pub prev: String,
    /// `sha256:` + hex SHA-256 of `record`.
    pub hash: String,
}

fn legacy_chain() -> String {
    LEGACY_CHAIN.to_string()
}

/// What an appender holding the append lock knows of the chain: the next record's `seq`, the
/// hash it links to, and the earliest `at` it may carry.
///
/// INVARIANT (time order): `at` never decreases along `seq`. Every append seals its record at
/// [`ChainHead::at_for`]`(now)` = max(now, the head record's `at`), so a clock that steps back
/// (NTP, another replica's skew, a test clock) repeats the head's time instead of writing an
/// earlier one. The audit search turns a time range into a `seq` range on the strength of
/// this ([`crate::store::AuditFilter`]). Records written before this rule (schema < 9) may
/// hold small inversions; nothing rewrites them (the chain is append-only and hashed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChainHead {
    /// The chain.
    pub(crate) chain: String,
    /// The next record's `seq`.
    pub(crate) seq: i64,
    /// The hash the next record links to.
    pub(crate) prev: String,
    /// The head record's `at` (`i64::MIN` for an empty chain).
    pub(crate) at: i64,
}

impl ChainHead {
    /// The time a record sealed now at this head carries: `now`, or the head's own time when
    /// the clock reads earlier (see the time-order invariant).
    pub(crate) fn at_for(&self, now: i64) -> i64 {
        now.max(self.at)
    }

    /// Moves the head past `sealed`.
    pub(crate) fn advance(&mut self, sealed: &AuditRecord) {
        self.seq = sealed.seq + 1;
        self.prev.clone_from(&sealed.hash);
        self.at = sealed.at;
    }
}

/// The head of chain `$chain` (`&str`) inside transaction `$tx`, its row locked until the
/// transaction ends when `$lock` (Postgres: `SELECT … FOR UPDATE`; SQLite callers must have
/// begun with `BEGIN IMMEDIATE`, the single write lock). A chain without a head row gets an
/// empty one first (seq 0, [`GENESIS`]). Evaluates to a `ChainHead`; `?` propagates errors.
macro_rules! chain_head {
    ($tx:expr, $lock:expr, $chain:expr) => {{
        let chain: &str = $chain;
        let read = if $lock {
            "SELECT seq, hash, at FROM audit_chains WHERE chain = $1 FOR UPDATE"
        } else {
            "SELECT seq, hash, at FROM audit_chains WHERE chain = $1"
        };
        let mut head: Option<(i64, String, i64)> = sqlx::query_as(read)
            .bind(chain)
            .fetch_optional(&mut *$tx)
            .await?;
        if head.is_none() {
            sqlx::query(
                "INSERT INTO audit_chains (chain, seq, hash, at) VALUES ($1, 0, $2, $3)
                 ON CONFLICT (chain) DO NOTHING",
            )
            .bind(chain)
            .bind($crate::audit::GENESIS)
            .bind(i64::MIN)
            .execute(&mut *$tx)
            .await?;
            head = sqlx::query_as(read)
                .bind(chain)
                .fetch_optional(&mut *$tx)
                .await?;
        }
        match head {
            Some((seq, prev, at)) => $crate::audit::ChainHead {
                chain: chain.to_string(),
                seq: seq + 1,
                prev,
                at,
            },
            None => {
                return Err($crate::store::StoreError::Conflict(format!(
                    "audit chain {chain:?} has no head"
                ))
                .into());
            }
        }
    }};
}
pub(crate) use chain_head;

/// Seals `$new` at `$head` (`&mut ChainHead`) at time `$at` (clamped to the head's, see
/// [`ChainHead`]) and advances the head without writing it: the caller inserts the sealed
/// records (in order, with [`insert_all_pg`] or [`insert_all_sqlite`]) before its COMMIT.
/// Evaluates to the `AuditRecord`.
macro_rules! seal_next {
    ($head:expr, $new:expr, $event:expr, $at:expr) => {{
        let head: &mut $crate::audit::ChainHead = $head;
        let at: i64 = head.at_for($at);
        let sealed = $crate::audit::seal(&head.chain, $new, $event, head.seq, at, &head.prev)
            .map_err(|e| $crate::store::StoreError::Conflict(format!("audit record: {e}")))?;
        head.advance(&sealed);
        sealed
    }};
}
pub(crate) use seal_next;

/// The columns an INSERT of sealed records writes, in this order (`pos` is the database's).
pub(crate) const INSERT_COLUMNS: &str =
    "chain, seq, at, event, run_id, step_id, tool, actor, rule, record, prev, hash";

/// Binds the columns of `$records` (`&[AuditRecord]`) to Postgres query `$q` as eleven
/// arrays, in the table's order after the chain (`seq, at, event, run_id, step_id, tool,
/// actor, rule, record, prev, hash`).
macro_rules! bind_record_arrays {
    ($q:expr, $records:expr) => {{
        let records: &[$crate::audit::AuditRecord] = $records;
        let text = |f: fn(&$crate::audit::AuditRecord) -> &str| {
            records.iter().map(|r| f(r).to_string()).collect::<Vec<_>>()
        };
        let maybe = |f: fn(&$crate::audit::AuditRecord) -> &Option<String>| {
            records.iter().map(|r| f(r).clone()).collect::<Vec<_>>()
        };
        $q.bind(records.iter().map(|r| r.seq).collect::<Vec<_>>())
            .bind(records.iter().map(|r| r.at).collect::<Vec<_>>())
            .bind(text(|r| &r.event))
            .bind(maybe(|r| &r.run_id))
            .bind(maybe(|r| &r.step_id))
            .bind(maybe(|r| &r.tool))
            .bind(maybe(|r| &r.actor))
            .bind(maybe(|r| &r.rule))
            .bind(text(|r| &r.record))
            .bind(text(|r| &r.prev))
            .bind(text(|r| &r.hash))
    }};
}
pub(crate) use bind_record_arrays;

/// The one chain of sealed `records`; `None` when there are none.
///
/// # Errors
/// They span several chains (a transaction appends to one chain).
pub(crate) fn one_chain(records: &[AuditRecord]) -> Result<Option<&str>, sqlx::Error> {
    let Some(first) = records.first() else {
        return Ok(None);
    };
    if records.iter().any(|r| r.chain != first.chain) {
        return Err(sqlx::Error::Protocol(
            "a transaction appends to one audit chain".into(),
        ));
    }
    Ok(Some(first.chain.as_str()))
}

/// Inserts sealed `records` (consecutive, in chain order, of one chain) in one statement
/// (Postgres). The database checks that they extend their chain's head and advances it.
pub(crate) async fn insert_all_pg(
    tx: &mut sqlx::PgConnection,
    records: &[AuditRecord],
) -> Result<(), sqlx::Error> {
    let Some(chain) = one_chain(records)? else {
        return Ok(());
    };
    let q = sqlx::query(
        "INSERT INTO audit (chain, seq, at, event, run_id, step_id, tool, actor, rule, record,
                            prev, hash)
         SELECT $1, r.* FROM UNNEST($2::int8[], $3::int8[], $4::text[], $5::text[], $6::text[],
                                    $7::text[], $8::text[], $9::text[], $10::text[],
                                    $11::text[], $12::text[]) AS r",
    )
    .bind(chain);
    bind_record_arrays!(q, records).execute(&mut *tx).await?;
    Ok(())
}

/// Inserts sealed `records` (consecutive, in chain order, of one chain) in as few statements
/// as SQLite's bound-parameter limit allows. The database checks that each extends its
/// chain's head and advances it.
pub(crate) async fn insert_all_sqlite(
    tx: &mut sqlx::SqliteConnection,
    records: &[AuditRecord],
) -> Result<(), sqlx::Error> {
    one_chain(records)?;
    for chunk in records.chunks(64) {
        let rows = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!("INSERT INTO audit ({INSERT_COLUMNS}) VALUES {rows}");
        let mut q = sqlx::query(&sql);
        for r in chunk {
            q = q
                .bind(&r.chain)
                .bind(r.seq)
                .bind(r.at)
                .bind(&r.event)
                .bind(&r.run_id)
                .bind(&r.step_id)
                .bind(&r.tool)
                .bind(&r.actor)
                .bind(&r.rule)
                .bind(&r.record)
                .bind(&r.prev)
                .bind(&r.hash);
        }
        q.execute(&mut *tx).await?;
    }
    Ok(())
}

/// Inserting sealed records on either backend's connection ([`insert_all_pg`],
/// [`insert_all_sqlite`]).
pub(crate) trait InsertRecords {
    /// Inserts `records` (consecutive, in chain order, of one chain).
    async fn insert_records(&mut self, records: &[AuditRecord]) -> Result<(), sqlx::Error>;
}

impl InsertRecords for sqlx::PgConnection {
    async fn insert_records(&mut self, records: &[AuditRecord]) -> Result<(), sqlx::Error> {
        insert_all_pg(self, records).await
    }
}

impl InsertRecords for sqlx::SqliteConnection {
    async fn insert_records(&mut self, records: &[AuditRecord]) -> Result<(), sqlx::Error> {
        insert_all_sqlite(self, records).await
    }
}

/// Locks chain `$chain`'s head (when `$lock`: Postgres; SQLite callers must have begun with
/// `BEGIN IMMEDIATE`) and reads it into `$head` (`&mut Option<ChainHead>`) unless this
/// transaction already holds it. Evaluates to `&mut ChainHead`.
///
/// INVARIANT (one chain per transaction): a transaction holding one chain's head that asks for
/// another's fails (nothing is written): every writer's locks are then one head row, then the
/// rows it changes — the lock order that keeps writers of different chains from deadlocking.
macro_rules! hold_head {
    ($tx:expr, $lock:expr, $head:expr, $chain:expr) => {{
        let slot: &mut Option<$crate::audit::ChainHead> = $head;
        let chain: &str = $chain;
        if slot.is_none() {
            *slot = Some($crate::audit::chain_head!($tx, $lock, chain));
        }
        match slot.as_mut() {
            Some(h) if h.chain == chain => h,
            Some(h) => {
                return Err($crate::store::StoreError::Conflict(format!(
                    "a transaction appends to one audit chain: holding {:?}, asked for {chain:?}",
                    h.chain
                ))
                .into());
            }
            None => {
                return Err(
                    $crate::store::StoreError::Conflict("audit head not held".into()).into(),
                );
            }
        }
    }};
}
pub(crate) use hold_head;

/// Appends one record to chain `$chain` inside an open transaction `$tx` (`&mut *tx`); `$lock`
/// = lock the head row first (Postgres; SQLite callers must have begun with `BEGIN
/// IMMEDIATE`). Evaluates to `AuditRecord`; `?` propagates errors.
macro_rules! append_in_tx {
    ($tx:expr, $lock:expr, $chain:expr, $new:expr, $event:expr, $at:expr) => {{
        let mut head: Option<$crate::audit::ChainHead> = None;
        let head = $crate::audit::hold_head!($tx, $lock, &mut head, $chain);
        let sealed = $crate::audit::seal_next!(head, $new, $event, $at);
        $crate::audit::InsertRecords::insert_records(&mut *$tx, std::slice::from_ref(&sealed))
            .await?;
        sealed
    }};
}
pub(crate) use append_in_tx;

impl Store {
    /// Appends one record at the head of the chain and returns it.
    pub async fn append_audit(&self, new: &NewAuditRecord) -> Result<AuditRecord, StoreError> {
        let event = new
            .event
            .ok_or_else(|| StoreError::Conflict("an audit record needs an event".into()))?;
        let mut last = None;
        for _ in 0..APPEND_ATTEMPTS {
            match self.try_append(new, event).await {
                Ok(r) => return Ok(r),
                Err(StoreError::Conflict(msg)) => last = Some(msg),
                Err(StoreError::Database(e)) if is_busy(&e) => last = Some(e.to_string()),
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict(format!(
            "audit append lost the race {APPEND_ATTEMPTS} times: {}",
            last.unwrap_or_default()
        )))
    }

    async fn try_append(
        &self,
        new: &NewAuditRecord,
        event: AuditEvent,
    ) -> Result<AuditRecord, StoreError> {
        let chain = self.chain_for(&[new]).await?;
        if let Some(c) = &self.committer
            && let Some(done) = c
                .submit(
                    chain.clone(),
                    crate::store::group::Work::Append(Box::new(new.clone()), event),
                )
                .await
        {
            return match done? {
                crate::store::group::Done::Appended(r) => Ok(*r),
                crate::store::group::Done::Moved(..) => Err(StoreError::Conflict(
                    "committer answered out of kind".into(),
                )),
            };
        }
        let at = self.clock.now_ms();
        macro_rules! append_in {
            ($pool:expr, $begin:expr, $lock:expr) => {{
                let mut tx = $pool.begin_with($begin).await?;
                let r = append_in_tx!(&mut *tx, $lock, &chain, new, event, at);
                tx.commit().await?;
                r
            }};
        }
        let r = match &self.pool {
            // SQLite: take the write lock up front (single writer); a deferred transaction
            // that reads the head and then writes would fail instead of waiting.
            Pool::Sqlite(p) => append_in!(p, "BEGIN IMMEDIATE", false),
            Pool::Postgres(p) => append_in!(p, "BEGIN", true),
        };
        Ok(r)
    }
}

pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.message().contains("database is locked") || d.message().contains("busy"))
}

/// The tenants of runs, as appenders looked them up (a run's tenant never changes), so that a
/// step's records find their chain without a query after the run's first. Bounded: cleared
/// when full.
#[derive(Clone, Default)]
pub(crate) struct RunTenants(
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
);

/// How many runs [`RunTenants`] remembers before it starts over.
const RUN_TENANTS_KEPT: usize = 65_536;

impl RunTenants {
    pub(super) fn get(&self, run: &str) -> Option<String> {
        self.0.lock().ok()?.get(run).cloned()
    }

    pub(super) fn put(&self, run: &str, tenant: &str) {
        if let Ok(mut map) = self.0.lock() {
            if map.len() >= RUN_TENANTS_KEPT {
                map.clear();
            }
            map.insert(run.to_string(), tenant.to_string());
        }
    }
}
