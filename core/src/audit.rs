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

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use std::collections::BTreeMap;

use crate::canonical::{CanonicalError, canonicalize};
use crate::store::{Pool, Store, StoreError};

mod check;
pub mod checkpoint;

use check::check_record;
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

/// The first broken link of a chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("audit chain broken at record {seq}: {reason}")]
pub struct ChainBreak {
    /// The `seq` of the first bad record (or where a missing one should be).
    pub seq: i64,
    /// What is wrong.
    pub reason: String,
}

/// `sha256:` + hex of SHA-256 over `text`.
pub fn hash_text(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    out.push_str(&crate::keys::hex(&digest));
    out
}

pub(crate) fn body(
    new: &NewAuditRecord,
    event: AuditEvent,
    seq: i64,
    at: i64,
    prev: &str,
) -> Value {
    json!({
        "seq": seq,
        "at": at,
        "event": event.as_str(),
        "run_id": new.run_id,
        "step_id": new.step_id,
        "tool": new.tool,
        "actor": new.actor,
        "rule": new.rule,
        "detail": Value::Object(new.detail.clone()),
        "prev": prev,
    })
}

/// Builds the record that appending `new` as `event` at `seq`, time `at`, after a record
/// hashed `prev` stores: its canonical text and hash. Pure (no database); the append path
/// and tools that build chains offline (the benchmark) share it.
///
/// # Errors
/// `detail` holds a value with no canonical form.
pub fn seal(
    new: &NewAuditRecord,
    event: AuditEvent,
    seq: i64,
    at: i64,
    prev: &str,
) -> Result<AuditRecord, CanonicalError> {
    let record = canonicalize(&body(new, event, seq, at, prev))?;
    let hash = hash_text(&record);
    Ok(AuditRecord {
        seq,
        at,
        event: event.as_str().to_string(),
        run_id: new.run_id.clone(),
        step_id: new.step_id.clone(),
        tool: new.tool.clone(),
        actor: new.actor.clone(),
        rule: new.rule.clone(),
        record,
        prev: prev.to_string(),
        hash,
    })
}

/// Checks a chain given in `seq` order, starting at `expected_prev` (use [`GENESIS`] for a
/// whole chain) and `first_seq`. Returns how many records were verified. Uses up to
/// [`default_threads`] threads for the per-record checks (see [`ChainVerifier::push_all`]).
pub fn verify(
    records: &[AuditRecord],
    first_seq: i64,
    expected_prev: &str,
) -> Result<i64, ChainBreak> {
    verify_with_threads(records, first_seq, expected_prev, default_threads())
}

/// [`verify`] on exactly `threads` threads (1 = all on the calling thread).
pub fn verify_with_threads(
    records: &[AuditRecord],
    first_seq: i64,
    expected_prev: &str,
    threads: usize,
) -> Result<i64, ChainBreak> {
    let mut v = ChainVerifier::new(first_seq, expected_prev).threads(threads);
    v.push_all(records)?;
    v.finish()
}

/// The machine's available parallelism, at most 8 (1 when unknown).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// Below this many records per thread, threads cost more than they save.
const MIN_RECORDS_PER_THREAD: usize = 2_048;

/// What the parallel pass proved of one record.
#[derive(Debug, Clone, Copy, Default)]
struct Proven {
    /// [`check_record`] passes at the record's own `seq` after its own `prev` (its hash,
    /// canonical form and columns).
    consistent: bool,
    /// It directly follows the record before it in the slice: `seq` one more, `prev` that
    /// record's `hash`. Never set for the first record of a chunk (its predecessor is in
    /// another chunk) nor for the first of the slice.
    linked: bool,
}

/// [`Proven`] for each record, computed in `threads` contiguous chunks. Position and link
/// across chunks, and checkpoints, are left to the sequential pass.
fn prove(records: &[AuditRecord], threads: usize) -> Vec<Proven> {
    let one = |chunk: &[AuditRecord]| -> Vec<Proven> {
        let mut before: Option<&AuditRecord> = None;
        chunk
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if let Some(next) = chunk.get(i + 1) {
                    touch(next);
                }
                let linked =
                    before.is_some_and(|b| b.seq.checked_add(1) == Some(r.seq) && b.hash == r.prev);
                before = Some(r);
                Proven {
                    consistent: check_record(r, r.seq, &r.prev).is_ok(),
                    linked,
                }
            })
            .collect()
    };
    let threads = threads
        .max(1)
        .min(records.len() / MIN_RECORDS_PER_THREAD)
        .max(1);
    if threads == 1 {
        return one(records);
    }
    let size = records.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = records
            .chunks(size)
            .map(|chunk| scope.spawn(move || one(chunk)))
            .collect();
        let mut out = Vec::with_capacity(records.len());
        for h in handles {
            match h.join() {
                Ok(part) => out.extend(part),
                // A panicking check proves nothing: every record of that chunk is re-checked
                // sequentially (fail closed, same first break).
                Err(_) => out.resize(out.len() + size, Proven::default()),
            }
        }
        out.truncate(records.len());
        out
    })
}

/// Reads one byte of each of a record's heap strings so their cache misses overlap with the
/// work on the record before it (verify is otherwise bound by memory latency, not hashing).
fn touch(r: &AuditRecord) {
    let first = |s: &str| s.as_bytes().first().copied().unwrap_or(0);
    let opt = |s: &Option<String>| s.as_deref().map_or(0, first);
    std::hint::black_box(
        first(&r.record)
            ^ first(&r.hash)
            ^ first(&r.prev)
            ^ first(&r.event)
            ^ opt(&r.run_id)
            ^ opt(&r.step_id)
            ^ opt(&r.tool)
            ^ opt(&r.actor)
            ^ opt(&r.rule),
    );
}

/// A hash a signed checkpoint (stored, or read from a file) says the chain has at `seq`.
#[derive(Debug, Clone)]
struct Expectation {
    hash: String,
    source: String,
}

/// Verifies a chain record by record, in `seq` order, and checks it against checkpoint
/// hashes as it passes their `seq`.
///
/// INVARIANT (fails closed): the first problem met, in `seq` order, is reported; a checkpoint
/// whose `seq` lies beyond the last record pushed is a truncation, reported by
/// [`ChainVerifier::finish`] at the first missing record.
#[derive(Debug, Clone)]
pub struct ChainVerifier {
    next_seq: i64,
    prev: String,
    expected: BTreeMap<i64, Vec<Expectation>>,
    /// Highest `seq` at which a checkpoint matched (or `first_seq - 1`).
    last_matched: i64,
    count: i64,
    sparse: bool,
    skipped_checkpoints: usize,
    threads: usize,
}

impl ChainVerifier {
    /// Starts at `first_seq`, taking `prev` as the hash of the record before it.
    pub fn new(first_seq: i64, prev: &str) -> Self {
        Self {
            next_seq: first_seq,
            prev: prev.to_string(),
            expected: BTreeMap::new(),
            last_matched: first_seq.saturating_sub(1),
            count: 0,
            sparse: false,
            skipped_checkpoints: 0,
            threads: 1,
        }
    }

    /// Lets [`ChainVerifier::push_all`] check records on up to `n` threads.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n.max(1);
        self
    }

    /// Checks the next records, in order: the same checks and the same first break as
    /// [`ChainVerifier::push`] on each in turn. The per-record work (SHA-256, canonical form,
    /// columns, the link to the record before it in the same chunk) runs on up to
    /// [`ChainVerifier::threads`] threads over contiguous chunks; the chain itself (`seq`
    /// order, each `prev` = the hash before it, checkpoints) is then walked sequentially. A record found inconsistent, or met at another position or after
    /// another hash than it states, goes through the full sequential check, which names the
    /// break exactly as [`ChainVerifier::push`] would.
    ///
    /// # Errors
    /// The first thing wrong, named by its `seq`.
    pub fn push_all(&mut self, records: &[AuditRecord]) -> Result<(), ChainBreak> {
        let proven = prove(records, self.threads);
        // `self.prev` is brought up to date lazily: while records pass on the fast path the
        // current `prev` is the hash of `records[accepted]`, copied into `self.prev` before
        // anything reads it.
        let mut accepted: Option<usize> = None;
        for (i, (r, p)) in records.iter().zip(proven).enumerate() {
            // Fast path: proven consistent and linked to the record just accepted (so at the
            // expected position after the expected hash), no checkpoint due at this `seq`,
            // not a sparse export: exactly what `push_with` would accept, without touching
            // the record again.
            // (`linked` is never set for the first record, and every record before `i` was
            // accepted or the loop has returned: so `records[i - 1]` is the one just accepted.)
            if p.consistent
                && p.linked
                && !self.sparse
                && self.next_seq < i64::MAX
                && (self.expected.is_empty() || !self.expected.contains_key(&self.next_seq))
            {
                self.next_seq += 1;
                self.count += 1;
                accepted = Some(i);
                continue;
            }
            if let Some(a) = accepted.take() {
                self.prev.clone_from(&records[a].hash);
            }
            self.push_with(r, p.consistent)?;
            accepted = Some(i);
        }
        if let Some(a) = accepted {
            self.prev.clone_from(&records[a].hash);
        }
        Ok(())
    }

    /// Accepts gaps in `seq` (an export of one run's records): across a gap the next
    /// record's `prev` is taken as given, so a record missing there cannot be detected.
    pub fn sparse(mut self) -> Self {
        self.sparse = true;
        self
    }

    /// The `seq` the next record must have.
    pub fn next_seq(&self) -> i64 {
        self.next_seq
    }

    /// Checkpoints that could not be checked (before the first record, or in a gap).
    pub fn skipped_checkpoints(&self) -> usize {
        self.skipped_checkpoints
    }

    /// Checkpoints for records after the last one pushed so far (a sparse export that ends
    /// before them never compares them; a whole chain refuses them at [`Self::finish`]).
    pub fn pending_checkpoints(&self) -> usize {
        self.expected.values().map(Vec::len).sum()
    }

    /// Requires the chain to hold `hash` at `seq` (`source` names the checkpoint in
    /// messages). Call before pushing records.
    ///
    /// # Errors
    /// The checkpoint is for the record just before the first one and `prev` differs.
    pub fn expect(
        &mut self,
        seq: i64,
        hash: &str,
        source: impl Into<String>,
    ) -> Result<(), ChainBreak> {
        let source = source.into();
        if self.next_seq.checked_sub(1) == Some(seq) && self.count == 0 {
            if hash != self.prev {
                return Err(ChainBreak {
                    seq: self.next_seq,
                    reason: format!(
                        "its prev {} is not the hash {hash} that {source} signed for record {seq}",
                        self.prev
                    ),
                });
            }
            return Ok(());
        }
        if seq < self.next_seq {
            self.skipped_checkpoints += 1;
            return Ok(());
        }
        self.expected.entry(seq).or_default().push(Expectation {
            hash: hash.to_string(),
            source,
        });
        Ok(())
    }

    /// Checks the next record.
    ///
    /// # Errors
    /// The first thing wrong with it, named by its `seq`.
    pub fn push(&mut self, r: &AuditRecord) -> Result<(), ChainBreak> {
        self.push_with(r, false)
    }

    /// [`ChainVerifier::push`]; `consistent` = `check_record(r, r.seq, &r.prev)` is known to
    /// pass, so when `r` is at its expected position after the expected hash the check is
    /// skipped (it would be the very same check).
    fn push_with(&mut self, r: &AuditRecord, consistent: bool) -> Result<(), ChainBreak> {
        let seq = self.next_seq;
        if self.sparse && r.seq > seq {
            // A gap: checkpoints inside it cannot be checked, except one right before `r`.
            let gap: Vec<i64> = self.expected.range(..r.seq).map(|(s, _)| *s).collect();
            for s in gap {
                let Some(exps) = self.expected.remove(&s) else {
                    continue;
                };
                if s == r.seq - 1 {
                    for e in exps {
                        if e.hash != r.prev {
                            return Err(ChainBreak {
                                seq: r.seq,
                                reason: format!(
                                    "its prev {} is not the hash {} that {} signed for record {s}",
                                    r.prev, e.hash, e.source
                                ),
                            });
                        }
                    }
                } else {
                    self.skipped_checkpoints += exps.len();
                }
            }
            self.next_seq = r.seq;
            self.prev.clone_from(&r.prev);
        }
        let seq = if self.sparse { self.next_seq } else { seq };
        // INVARIANT (fails closed): no record is accepted at the last `seq` an `i64` holds,
        // so `next_seq` never overflows (the fast path of `push_all` stops short of it too).
        let Some(after) = seq.checked_add(1) else {
            return Err(ChainBreak {
                seq,
                reason: "its seq is the largest a chain can hold: nothing can follow it".into(),
            });
        };
        if !(consistent && r.seq == seq && r.prev == self.prev) {
            check_record(r, seq, &self.prev).map_err(|reason| ChainBreak { seq, reason })?;
        }
        if let Some(exps) = self.expected.remove(&seq) {
            for e in exps {
                if e.hash != r.hash {
                    return Err(ChainBreak {
                        seq: self.last_matched.saturating_add(1),
                        reason: format!(
                            "record {seq} hashes to {} but {} signed {}: a record in {}..={seq} \
                             was rewritten",
                            r.hash,
                            e.source,
                            e.hash,
                            self.last_matched.saturating_add(1)
                        ),
                    });
                }
            }
            self.last_matched = seq;
        }
        self.prev.clone_from(&r.hash);
        self.next_seq = after;
        self.count += 1;
        Ok(())
    }

    /// Ends the chain; returns how many records were verified.
    ///
    /// # Errors
    /// A checkpoint lies beyond the last record: the chain was truncated (except for a
    /// sparse export, which may end anywhere).
    pub fn finish(self) -> Result<i64, ChainBreak> {
        if let Some((seq, exps)) = self.expected.iter().next()
            && !self.sparse
        {
            let source = exps
                .first()
                .map(|e| e.source.as_str())
                .unwrap_or("a checkpoint");
            return Err(ChainBreak {
                seq: self.next_seq,
                reason: format!(
                    "missing: the chain ends at record {} but {source} signed record {seq}; \
                     the tail was truncated",
                    self.next_seq.saturating_sub(1)
                ),
            });
        }
        Ok(self.count)
    }
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
