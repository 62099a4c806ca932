//! The audit chain: one append-only sequence of records, each holding the hash of the one
//! before it, so that changing, deleting, reordering or truncating records is detectable.
//!
//! Invariants:
//! * A record's `hash` is `sha256:` + SHA-256 of its canonical JSON (RFC 8785), and that JSON
//!   embeds `seq` and `prev`; the text stored is exactly the text hashed.
//! * `seq` starts at 1 and is the head's `seq + 1`; it is the table's primary key, so two
//!   appenders that read the same head collide and one retries — the chain never forks.
//!   On Postgres appenders also take a transaction-scoped advisory lock to avoid the retry.
//! * `at` never decreases along `seq`: an appender holding the head seals at max(now, the
//!   head's `at`) ([`ChainHead::at_for`]), so a time range is a `seq` range (the audit search
//!   relies on it). `at` is hashed like every field; only how it is chosen at append differs.
//! * The database refuses UPDATE, DELETE (and TRUNCATE on Postgres) on the table (migration
//!   0001 triggers); this module only ever INSERTs.
//! * [`verify`] / [`ChainVerifier`] fail closed: the first record that does not parse, is not
//!   canonical, does not match its stored hash, skips a `seq`, does not link to its
//!   predecessor or whose columns disagree with its hashed text is named. Canonical form and
//!   columns are checked without allocating ([`check`]): a record in the layout [`seal`]
//!   writes is matched piece by piece against its own columns, with only its `detail` value
//!   scanned ([`crate::canonical::check_canonical`]); any other goes through one general
//!   pass ([`crate::canonical::scan_canonical_object`]). Both are equivalent to
//!   re-canonicalising the parsed text. [`ChainVerifier::push_all`] (and so [`verify`] and
//!   the store's verification) runs those per-record checks, and the link of each record to
//!   its neighbour in the same chunk, on several threads over contiguous chunks, then walks
//!   the chain sequentially: a record proven consistent and linked to the record just
//!   accepted, with no checkpoint at its `seq`, is accepted without being read again; any
//!   other goes through the full sequential check, so the first break and its reason are the
//!   same as record-by-record verification.
//! * A signed checkpoint ([`checkpoint`]) pins the hash at its `seq`: a chain that no longer
//!   has it there, or ends before it, is broken even if it links perfectly.
//! * The record format (what [`seal`] builds) is written in one place, used by the
//!   `insert_sealed!` macro that every append goes through (alone, in a step transition, or
//!   in a group-commit batch, [`crate::store`]'s committer).
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

/// Test access to the two halves of the per-record text check (see `check`'s invariant).
#[cfg(feature = "test-support")]
pub use check::fast_and_general;

/// `prev` of the first record.
pub const GENESIS: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// Advisory-lock key serialising Postgres appenders ("cs-audit" in ASCII).
pub const PG_AUDIT_LOCK: i64 = 0x0063_732d_6175_6469;

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
}

/// A stored record (and one line of `audit export`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
#[serde(deny_unknown_fields)]
pub struct AuditRecord {
    /// Position in the chain, from 1.
    pub seq: i64,
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

    /// The chain's last record as `(seq, hash)`; `None` for an empty chain.
    pub(crate) fn last(&self) -> Option<(i64, String)> {
        (self.seq > 1).then(|| (self.seq - 1, self.prev.clone()))
    }

    /// Moves the head past `sealed`.
    pub(crate) fn advance(&mut self, sealed: &AuditRecord) {
        self.seq = sealed.seq + 1;
        self.prev.clone_from(&sealed.hash);
        self.at = sealed.at;
    }
}

/// The chain head seen inside transaction `$tx`. Callers must hold the append lock (Postgres
/// advisory lock, or SQLite's `BEGIN IMMEDIATE`).
macro_rules! chain_head {
    ($tx:expr) => {{
        let head: Option<(i64, String, i64)> =
            sqlx::query_as("SELECT seq, hash, at FROM audit ORDER BY seq DESC LIMIT 1")
                .fetch_optional(&mut *$tx)
                .await?;
        match head {
            Some((seq, prev, at)) => $crate::audit::ChainHead {
                seq: seq + 1,
                prev,
                at,
            },
            None => $crate::audit::ChainHead {
                seq: 1,
                prev: $crate::audit::GENESIS.to_string(),
                at: i64::MIN,
            },
        }
    }};
}
pub(crate) use chain_head;

/// Seals `$new` at `$head` (`&mut ChainHead`) at time `$at` (clamped to the head's, see
/// [`ChainHead`]), inserts it and advances the head. Evaluates to the `AuditRecord`; `?`
/// propagates errors.
macro_rules! insert_sealed {
    ($tx:expr, $head:expr, $new:expr, $event:expr, $at:expr) => {{
        let head: &mut $crate::audit::ChainHead = $head;
        let new: &$crate::audit::NewAuditRecord = $new;
        let event: $crate::audit::AuditEvent = $event;
        let at: i64 = head.at_for($at);
        let sealed = $crate::audit::seal(new, event, head.seq, at, &head.prev)
            .map_err(|e| $crate::store::StoreError::Conflict(format!("audit record: {e}")))?;
        sqlx::query(
            "INSERT INTO audit (seq, at, event, run_id, step_id, tool, actor, rule, record, prev, hash)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(sealed.seq)
        .bind(sealed.at)
        .bind(&sealed.event)
        .bind(&sealed.run_id)
        .bind(&sealed.step_id)
        .bind(&sealed.tool)
        .bind(&sealed.actor)
        .bind(&sealed.rule)
        .bind(&sealed.record)
        .bind(&sealed.prev)
        .bind(&sealed.hash)
        .execute(&mut *$tx)
        .await?;
        head.advance(&sealed);
        sealed
    }};
}
pub(crate) use insert_sealed;

/// Seals `$new` at `$head` (`&mut ChainHead`) at time `$at` (clamped to the head's, see
/// [`ChainHead`]) and advances the head without writing it: the caller inserts the sealed
/// records (in order, with [`insert_all_pg`] or [`insert_all_sqlite`]) before its COMMIT.
/// Evaluates to the `AuditRecord`.
macro_rules! seal_next {
    ($head:expr, $new:expr, $event:expr, $at:expr) => {{
        let head: &mut $crate::audit::ChainHead = $head;
        let at: i64 = head.at_for($at);
        let sealed = $crate::audit::seal($new, $event, head.seq, at, &head.prev)
            .map_err(|e| $crate::store::StoreError::Conflict(format!("audit record: {e}")))?;
        head.advance(&sealed);
        sealed
    }};
}
pub(crate) use seal_next;

/// Binds the columns of `$records` (`&[AuditRecord]`) to Postgres query `$q` as eleven
/// arrays, in the table's order (`seq, at, event, run_id, step_id, tool, actor, rule, record,
/// prev, hash`).
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

/// Inserts sealed `records` (consecutive, in chain order) in one statement (Postgres).
pub(crate) async fn insert_all_pg(
    tx: &mut sqlx::PgConnection,
    records: &[AuditRecord],
) -> Result<(), sqlx::Error> {
    if records.is_empty() {
        return Ok(());
    }
    let q = sqlx::query(
        "INSERT INTO audit (seq, at, event, run_id, step_id, tool, actor, rule, record, prev, hash)
         SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::text[], $4::text[], $5::text[],
                              $6::text[], $7::text[], $8::text[], $9::text[], $10::text[],
                              $11::text[])",
    );
    bind_record_arrays!(q, records).execute(&mut *tx).await?;
    Ok(())
}

/// Inserts sealed `records` (consecutive, in chain order) in as few statements as SQLite's
/// bound-parameter limit allows.
pub(crate) async fn insert_all_sqlite(
    tx: &mut sqlx::SqliteConnection,
    records: &[AuditRecord],
) -> Result<(), sqlx::Error> {
    for chunk in records.chunks(64) {
        let rows = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO audit (seq, at, event, run_id, step_id, tool, actor, rule, record, prev, hash)
             VALUES {rows}"
        );
        let mut q = sqlx::query(&sql);
        for r in chunk {
            q = q
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

/// Takes the Postgres append lock when `$lock` (SQLite callers must have begun with
/// `BEGIN IMMEDIATE`) and reads the head into `$head` (`&mut Option<ChainHead>`) unless
/// this transaction already holds it. Evaluates to `&mut ChainHead`.
macro_rules! hold_head {
    ($tx:expr, $lock:expr, $head:expr) => {{
        let slot: &mut Option<$crate::audit::ChainHead> = $head;
        if slot.is_none() {
            if $lock {
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind($crate::audit::PG_AUDIT_LOCK)
                    .execute(&mut *$tx)
                    .await?;
            }
            *slot = Some($crate::audit::chain_head!($tx));
        }
        match slot.as_mut() {
            Some(h) => h,
            None => {
                return Err($crate::store::StoreError::Conflict(
                    "audit head not held".into(),
                ));
            }
        }
    }};
}
pub(crate) use hold_head;

/// Appends one record inside an open transaction `$tx` (`&mut *tx`); `$lock` = take the
/// Postgres advisory lock first (SQLite callers must have begun with `BEGIN IMMEDIATE`).
/// Evaluates to `AuditRecord`; `?` propagates errors. Used by [`Store::append_audit`]; step
/// transitions and the group committer ([`crate::store`]) use its parts directly.
macro_rules! append_in_tx {
    ($tx:expr, $lock:expr, $new:expr, $event:expr, $at:expr) => {{
        let mut head: Option<$crate::audit::ChainHead> = None;
        let head = $crate::audit::hold_head!($tx, $lock, &mut head);
        $crate::audit::insert_sealed!($tx, head, $new, $event, $at)
    }};
}
pub(crate) use append_in_tx;

const COLUMNS: &str = "seq, at, event, run_id, step_id, tool, actor, rule, record, prev, hash";

/// The statement [`Store::audit_for_step`] runs (binds: step id, run id, limit); public so
/// a test can ask each backend's planner how it reads it.
pub fn audit_for_step_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM audit WHERE step_id = $1 AND run_id = $2
          ORDER BY seq DESC LIMIT $3"
    )
}

/// Records per page when counting a run's failures in a row.
pub(crate) const FAILURE_PAGE: i64 = 16;

/// A scalar subquery: the newest `{limit}` ([`FAILURE_PAGE`]) records of run `{run}` as
/// `seq:event`, comma-separated, newest first (events are plain words); NULL when it has none.
/// Read by [`parse_recent_events`].
pub(crate) const RECENT_EVENTS_SQL: &str = "(SELECT string_agg(x.seq || ':' || x.event, ','
       ORDER BY x.seq DESC) FROM (SELECT seq, event FROM audit WHERE run_id = {run}
       ORDER BY seq DESC LIMIT {limit}) x)";

/// [`RECENT_EVENTS_SQL`]'s text as `(seq, event)` pairs; `None` if it is not that shape.
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
        if let Some(c) = &self.committer
            && let Some(done) = c
                .submit(crate::store::group::Work::Append(new.clone(), event))
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
                let r = append_in_tx!(&mut *tx, $lock, new, event, at);
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

    /// Records with `seq >= from`, in order, at most `limit`.
    pub async fn audit_records(
        &self,
        from: i64,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM audit WHERE seq >= $1 ORDER BY seq LIMIT $2");
        let rows: Vec<AuditRecord> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(from)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        Ok(rows)
    }

    /// A run's records, in chain order.
    pub async fn audit_for_run(&self, run_id: &str) -> Result<Vec<AuditRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM audit WHERE run_id = $1 ORDER BY seq");
        let rows: Vec<AuditRecord> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(run_id).fetch_all(p).await?
        });
        Ok(rows)
    }

    /// The newest `limit` records of step `step_id` (of run `run_id`), in chain order, through
    /// the `(step_id, seq)` index: what a gate's history shows, however long its run's trail
    /// (one MCP session is one run), its latest request and decision included.
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
                        "SELECT seq, event FROM audit WHERE run_id = $1 AND seq < $2
                         ORDER BY seq DESC LIMIT $3",
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

    /// Verifies the whole stored chain in pages; returns the number of records.
    pub async fn verify_audit(&self) -> Result<Result<i64, ChainBreak>, StoreError> {
        self.verify_audit_with(ChainVerifier::new(1, GENESIS).threads(default_threads()))
            .await
    }

    /// Feeds the stored records from `v`'s next `seq` on, in pages, through `v`.
    pub async fn verify_audit_with(
        &self,
        mut v: ChainVerifier,
    ) -> Result<Result<i64, ChainBreak>, StoreError> {
        const PAGE: i64 = 10_000;
        // The chain starts at record 1: a row below it lies outside the chain, never walked
        // here yet shown by per-run readers, so the store as a whole does not verify.
        let below: (i64, Option<i64>) = crate::store::on_pool!(self, |p| {
            sqlx::query_as("SELECT COUNT(*), MIN(seq) FROM audit WHERE seq < 1")
                .fetch_one(p)
                .await?
        });
        if let (n @ 1.., Some(seq)) = below {
            return Ok(Err(ChainBreak {
                seq,
                reason: format!("{n} record(s) stored below record 1, outside the chain"),
            }));
        }
        loop {
            let page = self.audit_records(v.next_seq(), PAGE).await?;
            if page.is_empty() {
                return Ok(v.finish());
            }
            if let Err(b) = v.push_all(&page) {
                return Ok(Err(b));
            }
        }
    }
}

impl Store {
    /// The redaction key fingerprint recorded last (by [`Store::record_redaction_key`]).
    pub async fn last_redaction_key_fingerprint(&self) -> Result<Option<String>, StoreError> {
        // Records are canonical JSON, so the member is spelled exactly so.
        let rows: Vec<(String,)> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT record FROM audit WHERE event = 'operational' \
                 AND record LIKE '%\"kind\":\"redaction_key\"%' ORDER BY seq DESC LIMIT 1",
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
