//! The audit chain: one append-only sequence of records, each holding the hash of the one
//! before it, so that changing, deleting, reordering or truncating records is detectable.
//!
//! Invariants:
//! * A record's `hash` is `sha256:` + SHA-256 of its canonical JSON (RFC 8785), and that JSON
//!   embeds `seq` and `prev`; the text stored is exactly the text hashed.
//! * `seq` starts at 1 and is the head's `seq + 1`; it is the table's primary key, so two
//!   appenders that read the same head collide and one retries — the chain never forks.
//!   On Postgres appenders also take a transaction-scoped advisory lock to avoid the retry.
//! * The database refuses UPDATE, DELETE (and TRUNCATE on Postgres) on the table (migration
//!   0001 triggers); this module only ever INSERTs.
//! * [`verify`] fails closed: the first record that does not parse, is not canonical, does
//!   not match its stored hash, skips a `seq` or does not link to its predecessor is named.
//! * Callers pass values already redacted ([`crate::redact`]); nothing here sees secrets.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::canonical::canonicalize;
use crate::store::{Pool, Store, StoreError};

/// `prev` of the first record.
pub const GENESIS: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// Advisory-lock key serialising Postgres appenders ("cs-audit" in ASCII).
pub(crate) const PG_AUDIT_LOCK: i64 = 0x0063_732d_6175_6469;

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

/// A stored record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
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
    for b in digest.iter() {
        out.push_str(&format!("{b:02x}"));
    }
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

/// Checks a chain given in `seq` order, starting at `expected_prev` (use [`GENESIS`] for a
/// whole chain) and `first_seq`. Returns how many records were verified.
pub fn verify<'a>(
    records: impl IntoIterator<Item = &'a AuditRecord>,
    first_seq: i64,
    expected_prev: &str,
) -> Result<i64, ChainBreak> {
    let mut prev = expected_prev.to_string();
    let mut count = 0;
    for (seq, r) in (first_seq..).zip(records) {
        let fail = |reason: String| ChainBreak { seq, reason };
        if r.seq != seq {
            return Err(fail(format!("expected record {seq}, found {}", r.seq)));
        }
        let parsed: Value = serde_json::from_str(&r.record)
            .map_err(|e| fail(format!("record is not JSON: {e}")))?;
        let canonical = canonicalize(&parsed).map_err(|e| fail(e.to_string()))?;
        if canonical != r.record {
            return Err(fail("record text is not canonical".into()));
        }
        if hash_text(&r.record) != r.hash {
            return Err(fail("stored hash does not match the record".into()));
        }
        if r.prev != prev || parsed.get("prev").and_then(Value::as_str) != Some(prev.as_str()) {
            return Err(fail("does not link to the previous record".into()));
        }
        let embedded = |k: &str| parsed.get(k).cloned().unwrap_or(Value::Null);
        if embedded("seq") != json!(r.seq)
            || embedded("at") != json!(r.at)
            || embedded("event") != json!(r.event)
            || embedded("run_id") != json!(r.run_id)
            || embedded("step_id") != json!(r.step_id)
            || embedded("tool") != json!(r.tool)
            || embedded("actor") != json!(r.actor)
            || embedded("rule") != json!(r.rule)
        {
            return Err(fail("columns disagree with the hashed record".into()));
        }
        prev = r.hash.clone();
        count += 1;
    }
    Ok(count)
}

/// Appends one record inside an open transaction `$tx` (`&mut *tx`); `$lock` = take the
/// Postgres advisory lock first (SQLite callers must have begun with `BEGIN IMMEDIATE`).
/// Evaluates to `AuditRecord`; `?` propagates errors. Shared by [`Store::append_audit`] and
/// the step transitions that commit a status change and its records together.
macro_rules! append_in_tx {
    ($tx:expr, $lock:expr, $new:expr, $event:expr, $at:expr) => {{
        let new: &$crate::audit::NewAuditRecord = $new;
        let event: $crate::audit::AuditEvent = $event;
        let at: i64 = $at;
        if $lock {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind($crate::audit::PG_AUDIT_LOCK)
                .execute(&mut *$tx)
                .await?;
        }
        let head: Option<(i64, String)> =
            sqlx::query_as("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1")
                .fetch_optional(&mut *$tx)
                .await?;
        let (seq, prev) = match head {
            Some((s, h)) => (s + 1, h),
            None => (1, $crate::audit::GENESIS.to_string()),
        };
        let record = $crate::canonical::canonicalize(&$crate::audit::body(new, event, seq, at, &prev))
            .map_err(|e| $crate::store::StoreError::Conflict(format!("audit record: {e}")))?;
        let hash = $crate::audit::hash_text(&record);
        sqlx::query(
            "INSERT INTO audit (seq, at, event, run_id, step_id, tool, actor, rule, record, prev, hash)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(seq)
        .bind(at)
        .bind(event.as_str())
        .bind(&new.run_id)
        .bind(&new.step_id)
        .bind(&new.tool)
        .bind(&new.actor)
        .bind(&new.rule)
        .bind(&record)
        .bind(&prev)
        .bind(&hash)
        .execute(&mut *$tx)
        .await?;
        $crate::audit::AuditRecord {
            seq,
            at,
            event: event.as_str().to_string(),
            run_id: new.run_id.clone(),
            step_id: new.step_id.clone(),
            tool: new.tool.clone(),
            actor: new.actor.clone(),
            rule: new.rule.clone(),
            record,
            prev,
            hash,
        }
    }};
}
pub(crate) use append_in_tx;

const COLUMNS: &str = "seq, at, event, run_id, step_id, tool, actor, rule, record, prev, hash";

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

    /// Verifies the whole stored chain in pages; returns the number of records.
    pub async fn verify_audit(&self) -> Result<Result<i64, ChainBreak>, StoreError> {
        const PAGE: i64 = 10_000;
        let mut prev = GENESIS.to_string();
        let mut next = 1;
        let mut total = 0;
        loop {
            let page = self.audit_records(next, PAGE).await?;
            let Some(last) = page.last() else {
                return Ok(Ok(total));
            };
            let last_hash = last.hash.clone();
            match verify(&page, next, &prev) {
                Ok(n) => total += n,
                Err(b) => return Ok(Err(b)),
            }
            next += page.len() as i64;
            prev = last_hash;
        }
    }
}

pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.message().contains("database is locked") || d.message().contains("busy"))
}
