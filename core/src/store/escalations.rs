//! Escalations: what only a person can settle — a step left `unknown` that reconciliation
//! cannot settle, a write whose undo needs a person, an effect nobody can undo here.
//!
//! Invariants:
//! * At most one open escalation per (step, kind) (a partial unique index): opening one that
//!   is open writes nothing; a step escalated again after its escalation closed gets a new
//!   one. Opening is audited (`escalation.opened`) in the same transaction as the row.
//! * Every write here takes its audit chain's head first, then the escalation row (the lock
//!   order of every audited write), and writes its record in the same transaction.
//! * An escalation closes once: every closing write is conditional on `closed_at IS NULL`, and
//!   its audit record is written in the same transaction — a close that lost a race writes
//!   neither the row nor the record.
//! * Settling an unknown moves its step out of `unknown` only ([`Store::settle_escalated`]):
//!   the step's transition, its audit records and the close are one transaction, so a step the
//!   reconciler settled meanwhile is not touched and the escalation is not closed by it.
//! * A first settlement (the first of two people, for irreversible tools) is recorded once:
//!   conditional on no first settlement and the escalation open, audited in the same
//!   transaction. Who may settle, and whether two people are needed, is the caller's check;
//!   the store only never lets the first settler's row be replaced.
//! * An undo is started at most once at a time per escalation: [`Store::claim_undo`] sets
//!   `undo_step` (audited, naming the person) only while it is empty and the escalation open;
//!   [`Store::release_undo`] empties it (audited) only for the step it names, which the caller
//!   has seen cancelled before it ran.
//! * A first settlement is withdrawn ([`Store::withdraw_first_settlement`], audited) only as
//!   recorded (same person, still open), so the two-person rule starts over; it is never
//!   replaced in place.

use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::{Pool, Step, Store, StoreError, Transition, on_pool};
use crate::audit::{AuditEvent, NewAuditRecord};
use crate::store::audit_append::{
    InsertRecords, hold_head, insert_all_pg, insert_all_sqlite, seal_next,
};
use crate::store::steps::apply_transition;

/// The audit rule of an escalation being opened.
pub const OPENED_RULE: &str = "escalation.opened";
/// The audit rule of the first of two people settling an unknown.
pub const FIRST_SETTLEMENT_RULE: &str = "escalation.first_settlement";
/// The audit rule of an unknown settled by people.
pub const SETTLED_RULE: &str = "escalation.settled";
/// The audit rule of an escalation a person acknowledged.
pub const ACKNOWLEDGED_RULE: &str = "escalation.acknowledged";
/// The audit rule of an undo a person started and that is done.
pub const UNDO_RULE: &str = "escalation.undo";
/// The audit rule of a person starting an undo.
pub const UNDO_STARTED_RULE: &str = "escalation.undo_started";
/// The audit rule of an undo freed because it never ran.
pub const UNDO_RELEASED_RULE: &str = "escalation.undo_released";
/// The audit rule of a first settlement withdrawn (a second person disagreed).
pub const WITHDRAWN_RULE: &str = "escalation.first_withdrawn";
/// The audit rule of an escalation closed because reconciliation settled its step.
pub const RECONCILED_RULE: &str = "escalation.reconciled";

/// What needs a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EscalationKind {
    /// A step left `unknown` that reconciliation could not settle.
    Unknown,
    /// A write whose compensation needs a person (it exists, but needed approval or failed).
    Undo,
    /// An effect nothing here can undo (irreversible, no compensating tool, unconfirmed).
    Manual,
}

impl EscalationKind {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Undo => "undo",
            Self::Manual => "manual",
        }
    }

    /// Parses the stored text.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "unknown" => Self::Unknown,
            "undo" => Self::Undo,
            "manual" => Self::Manual,
            _ => return None,
        })
    }
}

/// How an escalation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// People confirmed the call happened (with the target's reference).
    Settled,
    /// People confirmed the call never happened at the target.
    NotHappened,
    /// The undo ran.
    Undone,
    /// A person took it from here, outside Countersign.
    Acknowledged,
    /// Reconciliation settled the step before any person did.
    Reconciled,
}

impl Resolution {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Settled => "settled",
            Self::NotHappened => "not_happened",
            Self::Undone => "undone",
            Self::Acknowledged => "acknowledged",
            Self::Reconciled => "reconciled",
        }
    }
}

/// A stored escalation.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Escalation {
    /// Its id.
    pub id: String,
    /// The run's tenant.
    pub tenant: String,
    /// The run.
    pub run_id: String,
    /// The step that needs a person.
    pub step_id: String,
    /// `unknown`, `undo` or `manual` ([`EscalationKind`]).
    pub kind: String,
    /// Why, in words.
    pub reason: String,
    /// Unix ms.
    pub opened_at: i64,
    /// The first of two people settling it (`person:ISS#SUB`).
    pub first_by: Option<String>,
    /// Their outcome (`happened` / `not_happened`).
    pub first_outcome: Option<String>,
    /// Their reference at the target.
    pub first_reference: Option<String>,
    /// Unix ms.
    pub first_at: Option<i64>,
    /// The compensation step a person's undo started.
    pub undo_step: Option<String>,
    /// Who started it.
    pub undo_by: Option<String>,
    /// Unix ms.
    pub undo_at: Option<i64>,
    /// Unix ms; `None` while open.
    pub closed_at: Option<i64>,
    /// Who closed it.
    pub closed_by: Option<String>,
    /// How ([`Resolution`]).
    pub resolution: Option<String>,
    /// The closer's note.
    pub note: Option<String>,
}

impl Escalation {
    /// Its kind (an unreadable one is treated as needing a person by hand).
    pub fn kind(&self) -> EscalationKind {
        EscalationKind::parse(&self.kind).unwrap_or(EscalationKind::Manual)
    }
}

const COLUMNS: &str = "id, tenant, run_id, step_id, kind, reason, opened_at, first_by, \
     first_outcome, first_reference, first_at, undo_step, undo_by, undo_at, closed_at, \
     closed_by, resolution, note";

/// What [`Store::settle_escalated`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettleOutcome {
    /// The step moved and the escalation closed.
    Settled,
    /// The step was no longer `unknown` (reconciled meanwhile): nothing written.
    StepMoved,
    /// The escalation was closed already, or its first settlement changed meanwhile: nothing
    /// written.
    AlreadyClosed,
}

fn record(esc: &Escalation, actor: &str, rule: &str, detail: Map<String, Value>) -> NewAuditRecord {
    let mut detail = detail;
    detail.insert("escalation_id".into(), json!(esc.id));
    detail.insert("kind".into(), json!(esc.kind));
    NewAuditRecord {
        event: Some(AuditEvent::Operational),
        run_id: Some(esc.run_id.clone()),
        step_id: Some(esc.step_id.clone()),
        tool: None,
        actor: Some(actor.to_string()),
        rule: Some(rule.to_string()),
        detail,
        tenant: None,
    }
}

impl Store {
    /// Opens an escalation of `kind` for `step` (once per step and kind), audited. Returns it
    /// when this call opened it, `None` when it was open (or closed) already.
    pub async fn open_escalation(
        &self,
        step: &Step,
        kind: EscalationKind,
        reason: &str,
        actor: &str,
    ) -> Result<Option<Escalation>, StoreError> {
        let tenant = self.get_run(&step.run_id).await?.tenant;
        let esc = Escalation {
            id: Uuid::new_v4().to_string(),
            tenant,
            run_id: step.run_id.clone(),
            step_id: step.id.clone(),
            kind: kind.as_str().into(),
            reason: reason.to_string(),
            opened_at: self.clock.now_ms(),
            first_by: None,
            first_outcome: None,
            first_reference: None,
            first_at: None,
            undo_step: None,
            undo_by: None,
            undo_at: None,
            closed_at: None,
            closed_by: None,
            resolution: None,
            note: None,
        };
        let mut detail = Map::new();
        detail.insert("reason".into(), json!(reason));
        let mut new = record(&esc, actor, OPENED_RULE, detail);
        new.tool = Some(step.tool.clone());
        let chain = self.chain_for(&[&new]).await?;
        let now = esc.opened_at;
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr) => {{
                let mut tx = $pool.begin_with($begin).await?;
                let mut head: Option<crate::audit::ChainHead> = None;
                let head = hold_head!(&mut *tx, $lock, &mut head, &chain);
                let n = sqlx::query(
                    "INSERT INTO escalations (id, tenant, run_id, step_id, kind, reason, opened_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (tenant, step_id, kind) WHERE closed_at IS NULL DO NOTHING",
                )
                .bind(&esc.id)
                .bind(&esc.tenant)
                .bind(&esc.run_id)
                .bind(&esc.step_id)
                .bind(&esc.kind)
                .bind(&esc.reason)
                .bind(esc.opened_at)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if n == 1 {
                    let sealed = seal_next!(head, &new, AuditEvent::Operational, now);
                    InsertRecords::insert_records(&mut *tx, std::slice::from_ref(&sealed)).await?;
                    tx.commit().await?;
                } else {
                    tx.rollback().await?;
                }
                n == 1
            }};
        }
        let opened = match &self.pool {
            Pool::Sqlite(p) => run_in!(p, "BEGIN IMMEDIATE", false),
            Pool::Postgres(p) => run_in!(p, "BEGIN", true),
        };
        Ok(opened.then_some(esc))
    }

    /// The open escalations of `tenant`, oldest first (at most `limit`).
    pub async fn open_escalations(
        &self,
        tenant: &str,
        limit: i64,
    ) -> Result<Vec<Escalation>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM escalations WHERE tenant = $1 AND closed_at IS NULL
             ORDER BY opened_at, id LIMIT $2"
        );
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(tenant)
                .bind(limit)
                .fetch_all(p)
                .await?
        }))
    }

    /// The escalations of `run_id`, oldest first.
    pub async fn escalations_of_run(&self, run_id: &str) -> Result<Vec<Escalation>, StoreError> {
        let sql =
            format!("SELECT {COLUMNS} FROM escalations WHERE run_id = $1 ORDER BY opened_at, id");
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(run_id).fetch_all(p).await?
        }))
    }

    /// One escalation.
    pub async fn get_escalation(&self, id: &str) -> Result<Escalation, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM escalations WHERE id = $1");
        let row: Option<Escalation> = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(id).fetch_optional(p).await?
        });
        row.ok_or(StoreError::NotFound)
    }

    /// The open escalation of `kind` for `step_id`, if any.
    pub async fn open_escalation_of_step(
        &self,
        step_id: &str,
        kind: EscalationKind,
    ) -> Result<Option<Escalation>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM escalations
              WHERE step_id = $1 AND kind = $2 AND closed_at IS NULL"
        );
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(step_id)
                .bind(kind.as_str())
                .fetch_optional(p)
                .await?
        }))
    }

    /// Records the first of two people settling `esc` (`outcome`, `reference`), audited.
    /// `false` when a first settlement exists already or the escalation closed (nothing
    /// written).
    pub async fn record_first_settlement(
        &self,
        esc: &Escalation,
        by: &str,
        outcome: &str,
        reference: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let mut detail = Map::new();
        detail.insert("outcome".into(), json!(outcome));
        detail.insert("reference".into(), json!(reference));
        detail.insert("reason".into(), json!(reason));
        let new = record(esc, by, FIRST_SETTLEMENT_RULE, detail);
        self.update_audited(
            "UPDATE escalations SET first_by = $1, first_outcome = $2, first_reference = $3,
                 first_at = $4
             WHERE id = $5 AND first_by IS NULL AND closed_at IS NULL",
            &[by, outcome, reference],
            &esc.id,
            &new,
        )
        .await
    }

    /// Withdraws the first settlement `first_by` recorded on `esc` because `by` disagreed with
    /// it (audited). `false` when it is no longer as recorded (nothing written).
    pub async fn withdraw_first_settlement(
        &self,
        esc: &Escalation,
        first_by: &str,
        by: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let mut detail = Map::new();
        detail.insert("first_by".into(), json!(first_by));
        detail.insert("first_outcome".into(), json!(esc.first_outcome));
        detail.insert("first_reference".into(), json!(esc.first_reference));
        detail.insert("reason".into(), json!(reason));
        let new = record(esc, by, WITHDRAWN_RULE, detail);
        self.update_audited(
            "UPDATE escalations SET first_by = NULL, first_outcome = NULL,
                 first_reference = NULL, first_at = $4
             WHERE first_by = $1 AND COALESCE(first_outcome, '') = $2
               AND COALESCE(first_reference, '') = $3 AND id = $5 AND closed_at IS NULL",
            &[
                first_by,
                esc.first_outcome.as_deref().unwrap_or(""),
                esc.first_reference.as_deref().unwrap_or(""),
            ],
            &esc.id,
            &new,
        )
        .await
    }

    /// Closes `esc` as `resolution` by `by` with `note`, with its audit record in the same
    /// transaction, while its undo is still `esc.undo_step` as read. `false` when it was closed
    /// already or an undo was started or freed meanwhile (nothing written).
    pub async fn close_escalation(
        &self,
        esc: &Escalation,
        by: &str,
        resolution: Resolution,
        note: &str,
        detail: Map<String, Value>,
    ) -> Result<bool, StoreError> {
        let rule = match resolution {
            Resolution::Acknowledged => ACKNOWLEDGED_RULE,
            Resolution::Undone => UNDO_RULE,
            Resolution::Reconciled => RECONCILED_RULE,
            Resolution::Settled | Resolution::NotHappened => SETTLED_RULE,
        };
        let mut detail = detail;
        detail.insert("resolution".into(), json!(resolution.as_str()));
        detail.insert("note".into(), json!(note));
        let new = record(esc, by, rule, detail);
        self.update_audited(
            "UPDATE escalations SET closed_by = $1, resolution = $2, note = $3, closed_at = $5
             WHERE id = $6 AND closed_at IS NULL AND COALESCE(undo_step, '') = $4",
            &[
                by,
                resolution.as_str(),
                note,
                esc.undo_step.as_deref().unwrap_or(""),
            ],
            &esc.id,
            &new,
        )
        .await
    }

    /// Runs `sql` (the `texts` parameters, then now, then the id) under its chain's head and,
    /// when it changed exactly one row, appends `new` in the same transaction.
    async fn update_audited(
        &self,
        sql: &str,
        texts: &[&str],
        id: &str,
        new: &NewAuditRecord,
    ) -> Result<bool, StoreError> {
        let chain = self.chain_for(&[new]).await?;
        let now = self.clock.now_ms();
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr) => {{
                let mut tx = $pool.begin_with($begin).await?;
                let mut head: Option<crate::audit::ChainHead> = None;
                let head = hold_head!(&mut *tx, $lock, &mut head, &chain);
                let mut q = sqlx::query(sql);
                for t in texts {
                    q = q.bind(*t);
                }
                let n = q
                    .bind(now)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if n == 1 {
                    let sealed = seal_next!(head, new, AuditEvent::Operational, now);
                    InsertRecords::insert_records(&mut *tx, std::slice::from_ref(&sealed)).await?;
                    tx.commit().await?;
                } else {
                    tx.rollback().await?;
                }
                n == 1
            }};
        }
        Ok(match &self.pool {
            Pool::Sqlite(p) => run_in!(p, "BEGIN IMMEDIATE", false),
            Pool::Postgres(p) => run_in!(p, "BEGIN", true),
        })
    }

    /// Claims `esc`'s undo for compensation step `step_id`, started by `by` (audited).
    /// `false` when an undo was started already or the escalation closed (nothing written).
    pub async fn claim_undo(
        &self,
        esc: &Escalation,
        step_id: &str,
        by: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let mut detail = Map::new();
        detail.insert("compensation_step".into(), json!(step_id));
        detail.insert("reason".into(), json!(reason));
        let new = record(esc, by, UNDO_STARTED_RULE, detail);
        self.update_audited(
            "UPDATE escalations SET undo_step = $1, undo_by = $2, undo_at = $3
             WHERE id = $4 AND undo_step IS NULL AND closed_at IS NULL",
            &[step_id, by],
            &esc.id,
            &new,
        )
        .await
    }

    /// Frees `esc`'s undo claimed for `step_id`, whose compensation never ran (it was
    /// cancelled before it ran: `why`), so that the undo may be asked again (audited).
    pub async fn release_undo(
        &self,
        esc: &Escalation,
        step_id: &str,
        by: &str,
        why: &str,
    ) -> Result<bool, StoreError> {
        let mut detail = Map::new();
        detail.insert("compensation_step".into(), json!(step_id));
        detail.insert("reason".into(), json!(why));
        let new = record(esc, by, UNDO_RELEASED_RULE, detail);
        self.update_audited(
            "UPDATE escalations SET undo_step = NULL, undo_by = NULL, undo_at = $2
             WHERE undo_step = $1 AND id = $3 AND closed_at IS NULL",
            &[step_id],
            &esc.id,
            &new,
        )
        .await
    }

    /// Settles `esc`'s `unknown` step with transition `t` (from `unknown` only; its records
    /// carry the people and the reference) and closes `esc` as `resolution` by `by`, in one
    /// transaction — only while its first settlement is still as read in `esc` (a confirmation
    /// never confirms a settlement withdrawn or replaced meanwhile).
    pub async fn settle_escalated(
        &self,
        esc: &Escalation,
        t: &Transition,
        by: &str,
        resolution: Resolution,
        note: &str,
    ) -> Result<SettleOutcome, StoreError> {
        debug_assert_eq!(t.from, vec![crate::model::StepStatus::Unknown]);
        let now = self.clock.now_ms();
        let chain = self
            .chain_for(&t.records.iter().map(|(_, r)| r).collect::<Vec<_>>())
            .await?;
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr, $insert:path) => {{
                let mut tx = $pool.begin_with($begin).await?;
                let mut head: Option<crate::audit::ChainHead> = None;
                // The append lock before any row lock: no lock cycles.
                hold_head!(&mut *tx, $lock, &mut head, &chain);
                match apply_transition!(&mut *tx, $lock, &mut head, &chain, t, now) {
                    None => {
                        tx.rollback().await?;
                        SettleOutcome::StepMoved
                    }
                    Some(records) => {
                        let closed = sqlx::query(
                            "UPDATE escalations SET closed_by = $1, resolution = $2, note = $3,
                                 closed_at = $4
                             WHERE id = $5 AND closed_at IS NULL
                               AND COALESCE(first_by, '') = $6
                               AND COALESCE(first_outcome, '') = $7
                               AND COALESCE(first_reference, '') = $8",
                        )
                        .bind(by)
                        .bind(resolution.as_str())
                        .bind(note)
                        .bind(now)
                        .bind(&esc.id)
                        .bind(esc.first_by.as_deref().unwrap_or(""))
                        .bind(esc.first_outcome.as_deref().unwrap_or(""))
                        .bind(esc.first_reference.as_deref().unwrap_or(""))
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                        if closed == 1 {
                            $insert(&mut *tx, &records).await?;
                            tx.commit().await?;
                            SettleOutcome::Settled
                        } else {
                            tx.rollback().await?;
                            SettleOutcome::AlreadyClosed
                        }
                    }
                }
            }};
        }
        Ok(match &self.pool {
            Pool::Sqlite(p) => run_in!(p, "BEGIN IMMEDIATE", false, insert_all_sqlite),
            Pool::Postgres(p) => run_in!(p, "BEGIN", true, insert_all_pg),
        })
    }
}
