//! Appending to the audit trail: reading and locking a chain's head, sealing records at it and
//! inserting them, alone or inside the transaction of a step's transition, a proposal, a grant
//! or a group-commit batch (`group`). The record format and the chain math are
//! [`crate::audit`]'s; this module only persists what they seal.
//!
//! Invariants:
//! * Every append seals through [`seal_next!`] at a head read under its chain's lock
//!   ([`hold_head!`]: Postgres `FOR UPDATE`; SQLite callers began with `BEGIN IMMEDIATE`), and
//!   the database refuses a record that does not extend its chain's head row (migration 0016).
//! * A transaction appends to one chain: asking for a second chain's head fails before
//!   anything is written (the lock order that keeps writers of different chains from
//!   deadlocking).
//! * Only INSERTs: nothing here updates or deletes a record.

use crate::audit::{AuditEvent, AuditRecord, NewAuditRecord, SYSTEM_CHAIN, chain_of_tenant};
use crate::store::{Pool, Store, StoreError};

/// How many times an append retries after losing a race for the next `seq`.
const APPEND_ATTEMPTS: usize = 8;

/// The head of chain `$chain` (`&str`) inside transaction `$tx`, its row locked until the
/// transaction ends when `$lock` (Postgres: `SELECT … FOR UPDATE`; SQLite callers must have begun
/// with `BEGIN IMMEDIATE`, the single write lock). A chain without a head row gets an empty one
/// first (seq 0, [`GENESIS`](crate::audit::GENESIS)). Evaluates to a `ChainHead`; `?` propagates
/// errors.
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
/// [`ChainHead`](crate::audit::ChainHead)) and advances the head without writing it: the caller
/// inserts the sealed records (in order, with [`insert_all_pg`] or [`insert_all_sqlite`]) before
/// its COMMIT. Evaluates to the `AuditRecord`.
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
            *slot = Some($crate::store::audit_append::chain_head!($tx, $lock, chain));
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
        let head = $crate::store::audit_append::hold_head!($tx, $lock, &mut head, $chain);
        let sealed = $crate::store::audit_append::seal_next!(head, $new, $event, $at);
        $crate::store::audit_append::InsertRecords::insert_records(
            &mut *$tx,
            std::slice::from_ref(&sealed),
        )
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
                    crate::store::commit_queue::Work::Append(Box::new(new.clone()), event),
                )
                .await
        {
            return match done? {
                crate::store::commit_queue::Done::Appended(r) => Ok(*r),
                crate::store::commit_queue::Done::Moved(..) => Err(StoreError::Conflict(
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

/// Whether `e` is SQLite's busy / locked answer (another writer held the lock past the busy
/// timeout): an append that met it may try again.
pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.message().contains("database is locked") || d.message().contains("busy"))
}

// Which chain a record joins: its tenant's, else its run's tenant's (looked up once per run
// and cached), else the system chain. Fail closed: a record naming a tenant other than its
// run's, records of one transaction spanning chains, and reserved tenant names are refused.
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
            (Some(t), _) | (None, Some(t)) => Ok(chain_of_tenant(Some(t))?),
            (None, None) => Ok(chain_of_tenant(None)?),
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
            self.run_tenants.put(run_id, t.to_string());
        }
        Ok(tenant)
    }
}
