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
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::store::{Pool, Store, StoreError};

mod chain;
mod check;
pub mod checkpoint;
mod full;
pub mod merkle;
pub mod note;
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

const COLUMNS: &str =
    "chain, seq, pos, at, event, run_id, step_id, tool, actor, rule, record, prev, hash";

/// The statement [`Store::audit_for_step`] runs (binds: step id, run id, limit); public so
/// a test can ask each backend's planner how it reads it.
pub fn audit_for_step_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM audit WHERE step_id = $1 AND run_id = $2
          ORDER BY pos DESC LIMIT $3"
    )
}

/// Records per page when counting a run's failures in a row.
pub(crate) const FAILURE_PAGE: i64 = 16;

/// A scalar subquery: the newest `{limit}` ([`FAILURE_PAGE`]) records of run `{run}` as
/// `pos:event`, comma-separated, newest first (events are plain words); NULL when it has none.
/// Read by [`parse_recent_events`].
pub(crate) const RECENT_EVENTS_SQL: &str = "(SELECT string_agg(x.pos || ':' || x.event, ','
       ORDER BY x.pos DESC) FROM (SELECT pos, event FROM audit WHERE run_id = {run}
       ORDER BY pos DESC LIMIT {limit}) x)";

/// [`RECENT_EVENTS_SQL`]'s text as `(pos, event)` pairs; `None` if it is not that shape.
pub(crate) fn parse_recent_events(text: Option<&str>) -> Option<Vec<(i64, String)>> {
    let Some(text) = text else {
        return Some(Vec::new());
    };
    text.split(',')
        .map(|item| {
            let (seq, event) = item.split_once(':')?;
            Some((seq.parse().ok()?, event.to_string()))
        })
        .collect()
}

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

    /// Records of `chain` with `seq >= from`, in order, at most `limit`.
    pub async fn audit_records(
        &self,
        chain: &str,
        from: i64,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM audit WHERE chain = $1 AND seq >= $2 ORDER BY seq LIMIT $3"
        );
        let rows: Vec<AuditRecord> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(chain)
                .bind(from)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        Ok(rows)
    }

    /// Records of every chain with `pos >= from`, in the order they were written, at most
    /// `limit`.
    pub async fn audit_in_order(
        &self,
        from: i64,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM audit WHERE pos >= $1 ORDER BY pos LIMIT $2");
        let rows: Vec<AuditRecord> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(from)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        Ok(rows)
    }

    /// A run's records, in the order they were written.
    pub async fn audit_for_run(&self, run_id: &str) -> Result<Vec<AuditRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM audit WHERE run_id = $1 ORDER BY pos");
        let rows: Vec<AuditRecord> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(run_id).fetch_all(p).await?
        });
        Ok(rows)
    }

    /// The newest `limit` records of step `step_id` (of run `run_id`), in the order they were
    /// written, through the `(step_id, pos)` index: what a gate's history shows, however long
    /// its run's trail (one MCP session is one run), its latest request and decision included.
    pub async fn audit_for_step(
        &self,
        run_id: &str,
        step_id: &str,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let sql = audit_for_step_sql();
        let mut rows: Vec<AuditRecord> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(step_id)
                .bind(run_id)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        rows.reverse();
        Ok(rows)
    }

    /// How many attempts of run `run_id` failed in a row since its last success (looking at
    /// no more than `limit` outcome records, newest first).
    ///
    /// Reads the run's records newest first, a page at a time, through the `(run_id, seq)`
    /// index alone, and stops at the first success or after `limit` outcomes: the cost
    /// follows the run's recent records, never the size of the whole log. (Filtering on
    /// `event` in SQL let the planner combine the `(event, seq)` index, which holds every
    /// success of every run: its cost grew with the log, measured in `docs/benchmarks.md`.)
    pub async fn failures_in_a_row(&self, run_id: &str, limit: i64) -> Result<i64, StoreError> {
        self.failures_in_a_row_from(run_id, limit, None).await
    }

    /// [`Store::failures_in_a_row`] starting from `newest`, the run's newest records as
    /// `(seq, event)`, newest first, as [`RECENT_EVENTS_SQL`] reads them (a full page is
    /// [`FAILURE_PAGE`] long); further pages are read only when that one does not decide.
    pub async fn failures_in_a_row_from(
        &self,
        run_id: &str,
        limit: i64,
        mut newest: Option<Vec<(i64, String)>>,
    ) -> Result<i64, StoreError> {
        let mut before = i64::MAX;
        // Every outcome met before a success is a failure: one count serves for both.
        let mut failed = 0_i64;
        while failed < limit {
            let page: Vec<(i64, String)> = match newest.take() {
                Some(page) => page,
                None => crate::store::on_pool!(self, |p| {
                    sqlx::query_as(
                        "SELECT pos, event FROM audit WHERE run_id = $1 AND pos < $2
                         ORDER BY pos DESC LIMIT $3",
                    )
                    .bind(run_id)
                    .bind(before)
                    .bind(FAILURE_PAGE)
                    .fetch_all(p)
                    .await?
                }),
            };
            for (seq, event) in &page {
                before = *seq;
                if event == AuditEvent::Succeeded.as_str()
                    || event == AuditEvent::Reconciled.as_str()
                {
                    return Ok(failed);
                }
                if event == AuditEvent::Failed.as_str() {
                    failed += 1;
                    if failed >= limit {
                        break;
                    }
                }
            }
            if (page.len() as i64) < FAILURE_PAGE {
                break;
            }
        }
        Ok(failed)
    }

    /// Verifies every stored chain in pages (without checkpoints: see
    /// [`Store::verify_audit_full`]); returns the number of records.
    pub async fn verify_audit(&self) -> Result<Result<i64, ChainBreak>, StoreError> {
        let mut total = 0;
        for chain in self.audit_chain_names().await? {
            let v = ChainVerifier::new(1, GENESIS)
                .chain(&chain)
                .threads(default_threads());
            match self.verify_audit_with(v).await? {
                Ok(n) => total += n,
                Err(b) => return Ok(Err(b)),
            }
        }
        if let Some(b) = self.audit_orphans().await? {
            return Ok(Err(b));
        }
        Ok(Ok(total))
    }

    /// Every chain with a head row, by name (empty chains included).
    pub async fn audit_chain_names(&self) -> Result<Vec<String>, StoreError> {
        let rows: Vec<String> = crate::store::on_pool!(self, |p| {
            sqlx::query_scalar("SELECT chain FROM audit_chains ORDER BY chain")
                .fetch_all(p)
                .await?
        });
        Ok(rows)
    }

    /// A chain's head row: its last record's `(seq, hash)` (`(0, GENESIS)` while empty), if
    /// it has one.
    pub async fn audit_chain_head(&self, chain: &str) -> Result<Option<(i64, String)>, StoreError> {
        let row: Option<(i64, String)> = crate::store::on_pool!(self, |p| {
            sqlx::query_as("SELECT seq, hash FROM audit_chains WHERE chain = $1")
                .bind(chain)
                .fetch_optional(p)
                .await?
        });
        Ok(row)
    }

    /// A break when records are stored outside every chain's walk: in a chain without a head
    /// row, or below record 1 (the database refuses both; only someone who removed its
    /// constraints could write them, and per-run readers would show them unverified).
    pub(crate) async fn audit_orphans(&self) -> Result<Option<ChainBreak>, StoreError> {
        let row: Option<(String, i64)> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT a.chain, a.seq FROM audit a
                  WHERE a.seq < 1
                     OR NOT EXISTS (SELECT 1 FROM audit_chains h WHERE h.chain = a.chain)
                  LIMIT 1",
            )
            .fetch_optional(p)
            .await?
        });
        Ok(row.map(|(chain, seq)| ChainBreak {
            reason: if seq < 1 {
                "a record is stored below record 1, outside the chain".into()
            } else {
                "records are stored in a chain that has no head: outside every verified chain"
                    .into()
            },
            chain,
            seq,
        }))
    }

    /// Feeds the stored records of `v`'s chain from its next `seq` on, in pages, through `v`,
    /// then checks that the chain ends where its head row says.
    pub async fn verify_audit_with(
        &self,
        mut v: ChainVerifier,
    ) -> Result<Result<i64, ChainBreak>, StoreError> {
        const PAGE: i64 = 10_000;
        let chain = v.chain_name().to_string();
        if chain.is_empty() {
            return Err(StoreError::Conflict(
                "verifying the store needs the chain to verify".into(),
            ));
        }
        loop {
            let page = self.audit_records(&chain, v.next_seq(), PAGE).await?;
            if page.is_empty() {
                break;
            }
            if let Err(b) = v.push_all(&page) {
                return Ok(Err(b));
            }
        }
        let last = v.next_seq() - 1;
        let head = self.audit_chain_head(&chain).await?;
        if head.is_none() && last > 0 {
            return Ok(Err(ChainBreak {
                chain,
                seq: last,
                reason: "the chain's records have no head row: it was removed".into(),
            }));
        }
        if let Some((seq, hash)) = head
            && (seq != last || (seq > 0 && hash != v.last_hash()))
        {
            return Ok(Err(ChainBreak {
                chain,
                seq: last + 1,
                reason: if seq > last {
                    format!(
                        "missing: the chain ends at record {last} but its head is record {seq}; the \
                         tail was truncated"
                    )
                } else {
                    format!(
                        "the chain's head says record {seq} ({hash}), not its last record {last}"
                    )
                },
            }));
        }
        Ok(v.finish())
    }
}

impl Store {
    /// The redaction key fingerprint recorded last (by [`Store::record_redaction_key`]).
    pub async fn last_redaction_key_fingerprint(&self) -> Result<Option<String>, StoreError> {
        // Records are canonical JSON, so the member is spelled exactly so.
        let rows: Vec<(String,)> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT record FROM audit WHERE event = 'operational' \
                 AND record LIKE '%\"kind\":\"redaction_key\"%' ORDER BY pos DESC LIMIT 1",
            )
            .fetch_all(p)
            .await?
        });
        let Some((text,)) = rows.into_iter().next() else {
            return Ok(None);
        };
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| StoreError::Conflict(format!("stored audit record: {e}")))?;
        Ok(value
            .pointer("/detail/fingerprint")
            .and_then(Value::as_str)
            .map(str::to_string))
    }

    /// Records `fingerprint` as an `operational` event `{kind: "redaction_key", fingerprint}`
    /// when it differs from the last one recorded (a first key, or a rotation). Returns the
    /// record appended, if any.
    pub async fn record_redaction_key(
        &self,
        fingerprint: &str,
        key_id: &str,
        actor: &str,
    ) -> Result<Option<AuditRecord>, StoreError> {
        let last = self.last_redaction_key_fingerprint().await?;
        if last.as_deref() == Some(fingerprint) {
            return Ok(None);
        }
        let mut detail = Map::new();
        detail.insert("kind".into(), json!("redaction_key"));
        detail.insert("fingerprint".into(), json!(fingerprint));
        detail.insert("key_id".into(), json!(key_id));
        detail.insert("previous".into(), json!(last));
        self.append_audit(&NewAuditRecord {
            event: Some(AuditEvent::Operational),
            actor: Some(actor.to_string()),
            detail,
            ..NewAuditRecord::default()
        })
        .await
        .map(Some)
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
    fn get(&self, run: &str) -> Option<String> {
        self.0.lock().ok()?.get(run).cloned()
    }

    fn put(&self, run: &str, tenant: &str) {
        if let Ok(mut map) = self.0.lock() {
            if map.len() >= RUN_TENANTS_KEPT {
                map.clear();
            }
            map.insert(run.to_string(), tenant.to_string());
        }
    }
}

impl Store {
    /// The one chain `records` join (see [`NewAuditRecord::tenant`]); [`SYSTEM_CHAIN`] when
    /// there are none.
    ///
    /// # Errors
    /// They belong to different chains (a transaction appends to one chain), a record names a
    /// tenant other than its run's, or a tenant name is reserved ([`chain_of_tenant`]).
    pub(crate) async fn chain_for(
        &self,
        records: &[&NewAuditRecord],
    ) -> Result<String, StoreError> {
        let mut chain: Option<String> = None;
        for new in records {
            let this = self.chain_of(new).await?;
            match &chain {
                Some(have) if *have != this => {
                    return Err(StoreError::Conflict(format!(
                        "a transaction appends to one audit chain, not to {have:?} and {this:?}"
                    )));
                }
                Some(_) => {}
                None => chain = Some(this),
            }
        }
        Ok(chain.unwrap_or_else(|| SYSTEM_CHAIN.to_string()))
    }

    /// The chain of one record: its tenant's, else its run's tenant's, else [`SYSTEM_CHAIN`].
    async fn chain_of(&self, new: &NewAuditRecord) -> Result<String, StoreError> {
        let run_tenant = match &new.run_id {
            Some(run) => self.run_tenant(run).await?,
            None => None,
        };
        match (new.tenant.as_deref(), run_tenant.as_deref()) {
            (Some(named), Some(run)) if named != run => Err(StoreError::Conflict(format!(
                "an audit record names tenant {named:?} but its run belongs to {run:?}"
            ))),
            (Some(t), _) | (None, Some(t)) => chain_of_tenant(Some(t)),
            (None, None) => chain_of_tenant(None),
        }
    }

    /// The tenant of run `run_id`; `None` when no such run is stored (a record may name a run
    /// that was never written, e.g. a refused call's).
    async fn run_tenant(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        if let Some(t) = self.run_tenants.get(run_id) {
            return Ok(Some(t));
        }
        let tenant: Option<String> = crate::store::on_pool!(self, |p| {
            sqlx::query_scalar("SELECT tenant FROM runs WHERE id = $1")
                .bind(run_id)
                .fetch_optional(p)
                .await?
        });
        if let Some(t) = &tenant {
            self.run_tenants.put(run_id, t);
        }
        Ok(tenant)
    }
}
