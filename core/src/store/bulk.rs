//! Postgres: a committer batch's step writes in a fixed number of statements.
//!
//! The committer ([`super::group`]) holds the audit append lock for the whole of a batch, so
//! every round trip inside a batch delays every other caller in the process. Applied one by
//! one, a batch of N transitions costs N statements (plus one per key update); here it costs
//! at most two, whatever N is: one INSERT for the read steps written with their outcome, and
//! one statement updating every other transition and, for those that moved, their keys —
//! plus one INSERT per refused read (rare: a cancel or a stop raced it).
//!
//! Invariants (the same results as applying the jobs one after the other):
//! * Only used when no two jobs of the batch touch the same step ([`applicable`]); otherwise
//!   the batch is applied one job at a time, where a later job sees an earlier one's write.
//!   Jobs on different steps do not read each other's rows, so their order does not matter
//!   for which of them move.
//! * A transition moves only from its `from` statuses and only while its [`super::RunGuard`]
//!   holds, checked in the statement that writes it; one that does not move writes nothing,
//!   except a refused read, whose row is written as prepared (as [`super::steps`] does alone).
//! * Read steps of one run inserted together take consecutive positions after the run's last
//!   step, in job order.
//! * The caller seals the moved jobs' audit records in job order after this returns, so the
//!   chain is exactly what one-by-one application would have written.

use std::collections::HashSet;

use super::commit_queue::{Job, Work};
use super::lean_pool::LeanPool;
use super::steps::{PREPARED_INSERT_SQL, prepared_insert};
use super::{Step, Transition};
use crate::audit::AuditRecord;

/// Whether [`apply`] should write `jobs`: at least two transitions (one alone is cheaper as
/// its plain statement: measured, `docs/benchmarks.md`), no two on the same step, and every
/// row written is the transition's own step.
pub(crate) fn applicable(jobs: &[Job]) -> bool {
    let mut seen = HashSet::new();
    let distinct = jobs.iter().all(|job| match &job.work {
        Work::Transition(t) => seen.insert(t.step_id.as_str()) && writes_own_row(t),
        Work::Append(..) => true,
    });
    distinct && seen.len() >= 2
}

/// Writes every transition of `jobs` (see the module doc) inside open transaction `tx` at
/// time `now`; one entry per job: whether that job's transition moved its step (`true` for an
/// append, which moves nothing).
pub(crate) async fn apply(
    tx: &mut sqlx::PgConnection,
    jobs: &[Job],
    now: i64,
) -> Result<Vec<bool>, sqlx::Error> {
    let transitions: Vec<(usize, &Transition)> = jobs
        .iter()
        .enumerate()
        .filter_map(|(i, job)| match &job.work {
            Work::Transition(t) => Some((i, t.as_ref())),
            Work::Append(..) => None,
        })
        .collect();
    let (updates, inserts) = split_reads(transitions.iter().map(|(_, t)| *t));

    let mut moved: HashSet<String> = HashSet::new();
    if !inserts.is_empty() {
        moved.extend(insert_moved(tx, &inserts, now).await?);
        // A read its guard refused is kept as prepared, so the caller can record why.
        for (t, step) in &inserts {
            if !moved.contains(&t.step_id) {
                prepared_insert!(sqlx::query(PREPARED_INSERT_SQL), step)
                    .execute(&mut *tx)
                    .await?;
            }
        }
    }
    if !updates.is_empty() {
        moved.extend(update_moved(tx, &updates, now).await?);
    }
    Ok(jobs
        .iter()
        .map(|job| match &job.work {
            Work::Transition(t) => moved.contains(&t.step_id),
            Work::Append(..) => true,
        })
        .collect())
}

/// One nullable text column of a batch's rows.
type Column = Vec<Option<String>>;

/// The guard's three columns: run id, its second accepted status, the blocking switch.
fn guard_columns<'a>(ts: impl Iterator<Item = &'a Transition>) -> (Column, Column, Column) {
    let mut run = Vec::new();
    let mut failed = Vec::new();
    let mut switch = Vec::new();
    for t in ts {
        let g = t.guard.as_ref();
        run.push(g.map(|g| g.run_id.clone()));
        failed.push(g.and_then(|g| g.allow_failed.then(|| "failed".to_string())));
        switch.push(g.and_then(|g| g.unless_switch.clone()));
    }
    (run, failed, switch)
}

/// `transitions` split, in order, into those of steps already written (UPDATEs) and reads
/// written with their outcome (INSERTs, with the row each writes).
fn split_reads<'a>(
    transitions: impl Iterator<Item = &'a Transition>,
) -> (Vec<&'a Transition>, Vec<(&'a Transition, &'a Step)>) {
    let mut updates = Vec::new();
    let mut inserts = Vec::new();
    for t in transitions {
        match t.insert.as_deref() {
            Some(step) => inserts.push((t, step)),
            None => updates.push(t),
        }
    }
    (updates, inserts)
}

/// The read steps' rows of `inserts`, written already moved, as the JSON array
/// `countersign_insert_moved` (migration 18) takes, on either batch path: one object a row,
/// in job order (`ord`).
fn reads_json(inserts: &[(&Transition, &Step)]) -> Result<String, sqlx::Error> {
    let rows: Vec<ReadRow<'_>> = inserts
        .iter()
        .enumerate()
        .map(|(ord, (t, s))| {
            let g = t.guard.as_ref();
            ReadRow {
                ord,
                id: &s.id,
                run_id: &s.run_id,
                role: &s.role,
                tool: &s.tool,
                effect: s.effect.as_str(),
                inputs: &s.inputs,
                inputs_hash: &s.inputs_hash,
                idem_key: &s.idem_key,
                status: t.to.unwrap_or(s.status).as_str(),
                attempts: i64::from(t.bump_attempts),
                reason: &s.reason,
                evidence: &s.evidence,
                observed: s.observed.as_deref(),
                trace_id: s.trace_id.as_deref(),
                not_before: t.not_before.unwrap_or(s.not_before),
                created_at: s.created_at,
                agent_id: s.agent_id.as_deref(),
                decision: t.decision.as_deref(),
                rule: t.rule.as_deref(),
                outcome: t.outcome.as_deref(),
                expires_at: t.expires_at,
                approval: t.approval.as_deref(),
                guard_run: g.map(|g| g.run_id.as_str()),
                guard_failed: g.and_then(|g| g.allow_failed.then_some("failed")),
                guard_switch: g.and_then(|g| g.unless_switch.as_deref()),
            }
        })
        .collect();
    serde_json::to_string(&rows).map_err(|e| sqlx::Error::Encode(Box::new(e)))
}

/// One read's row as `countersign_insert_moved` takes it (borrowed: no copy of its inputs).
#[derive(serde::Serialize)]
struct ReadRow<'a> {
    ord: usize,
    id: &'a str,
    run_id: &'a str,
    role: &'a str,
    tool: &'a str,
    effect: &'a str,
    inputs: &'a str,
    inputs_hash: &'a str,
    idem_key: &'a str,
    status: &'a str,
    attempts: i64,
    reason: &'a str,
    evidence: &'a str,
    observed: Option<&'a str>,
    trace_id: Option<&'a str>,
    not_before: i64,
    created_at: i64,
    agent_id: Option<&'a str>,
    decision: Option<&'a str>,
    rule: Option<&'a str>,
    outcome: Option<&'a str>,
    expires_at: Option<i64>,
    approval: Option<&'a str>,
    guard_run: Option<&'a str>,
    guard_failed: Option<&'a str>,
    guard_switch: Option<&'a str>,
}

/// The read steps' rows, written already moved (`countersign_insert_moved`); returns the ids
/// written (the others' guards refused them).
async fn insert_moved(
    tx: &mut sqlx::PgConnection,
    inserts: &[(&Transition, &Step)],
    now: i64,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT * FROM countersign_insert_moved($1, $2::json)")
        .bind(now)
        .bind(reads_json(inserts)?)
        .fetch_all(&mut *tx)
        .await
}

/// The columns of a batch's step transitions, as `countersign_move_steps` takes them (the
/// batch UPDATE of the multi-statement path and of [`commit_one_trip`] alike).
struct Moves {
    id: Column,
    status: Column,
    decision: Column,
    rule: Column,
    outcome: Column,
    expires_at: Vec<Option<i64>>,
    approval: Column,
    bump: Vec<i64>,
    not_before: Vec<Option<i64>>,
    from: Vec<String>,
    guard_run: Column,
    guard_failed: Column,
    guard_switch: Column,
    key_state: Column,
    key_result: Column,
    release: Column,
}

impl Moves {
    fn of(updates: &[&Transition]) -> Self {
        macro_rules! col {
            ($e:expr) => {
                updates.iter().map($e).collect::<Vec<_>>()
            };
        }
        let (guard_run, guard_failed, guard_switch) = guard_columns(updates.iter().copied());
        Self {
            id: col!(|t| Some(t.step_id.clone())),
            status: col!(|t| t.to.map(|s| s.as_str().to_string())),
            decision: col!(|t| t.decision.clone()),
            rule: col!(|t| t.rule.clone()),
            outcome: col!(|t| t.outcome.clone()),
            expires_at: col!(|t| t.expires_at),
            approval: col!(|t| t.approval.clone()),
            bump: col!(|t| i64::from(t.bump_attempts)),
            not_before: col!(|t| t.not_before),
            // Statuses are plain words, so a comma-joined list is one row's set of `from`
            // statuses (an empty `from` is the empty set: nothing moves, as alone).
            from: col!(|t| t
                .from
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(",")),
            guard_run,
            guard_failed,
            guard_switch,
            key_state: col!(|t| t.key.as_ref().map(|(state, _)| state.as_str().to_string())),
            key_result: col!(|t| t.key.as_ref().and_then(|(_, result)| result.clone())),
            release: col!(|t| t.release.clone()),
        }
    }
}

/// Binds `$m`'s columns, in `countersign_move_steps`'s order, to query `$q`.
macro_rules! bind_moves {
    ($q:expr, $m:expr) => {{
        let m: &Moves = $m;
        $q.bind(&m.id)
            .bind(&m.status)
            .bind(&m.decision)
            .bind(&m.rule)
            .bind(&m.outcome)
            .bind(&m.expires_at)
            .bind(&m.approval)
            .bind(&m.bump)
            .bind(&m.not_before)
            .bind(&m.from)
            .bind(&m.guard_run)
            .bind(&m.guard_failed)
            .bind(&m.guard_switch)
            .bind(&m.key_state)
            .bind(&m.key_result)
            .bind(&m.release)
    }};
}

/// Every other transition in one UPDATE, and the keys of those that moved in the same
/// statement (`countersign_move_steps`, migration 13); returns the ids of the steps that
/// moved.
async fn update_moved(
    tx: &mut sqlx::PgConnection,
    updates: &[&Transition],
    now: i64,
) -> Result<Vec<String>, sqlx::Error> {
    let moves = Moves::of(updates);
    let q = sqlx::query_scalar(
        "SELECT * FROM countersign_move_steps($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
                                              $12, $13, $14, $15, $16, $17)",
    )
    .bind(now);
    bind_moves!(q, &moves).fetch_all(&mut *tx).await
}

/// Whether [`commit_one_trip`] can write `jobs`: transitions of distinct steps and appends;
/// a read written with its outcome (its own step's row, no key) only when `reads`.
pub(crate) fn one_trip_applicable(jobs: &[Job], reads: bool) -> bool {
    let mut seen = HashSet::new();
    jobs.iter().all(|job| match &job.work {
        Work::Transition(t) => {
            seen.insert(t.step_id.as_str()) && (t.insert.is_none() || (reads && writes_own_row(t)))
        }
        Work::Append(..) => true,
    })
}

/// Whether a transition that writes its step's row (a read with its outcome) writes only
/// that: its own step, and no key (a read has none; the batch paths write none for it).
fn writes_own_row(t: &Transition) -> bool {
    t.insert
        .as_ref()
        .is_none_or(|s| s.id == t.step_id && t.key.is_none() && t.reserve.is_none())
}

/// The SQLSTATEs `countersign_commit_batch` raises when it wrote nothing because the batch
/// was sealed on a stale head (`CS001`), a transition did not move (`CS002`) or a key it
/// reserves exists already (`CS003`).
pub(crate) fn is_one_trip_refusal(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some("CS001" | "CS002" | "CS003")))
}

/// The head of `chain` a one-trip batch was refused on because the head had moved (another
/// process appended): the function names it (`seq at hash`, migration 17) so that the batch
/// can be sealed again on it. `None` for any other error or a detail that does not parse.
pub(crate) fn moved_head(e: &sqlx::Error, chain: &str) -> Option<crate::audit::ChainHead> {
    let db = e.as_database_error()?;
    if db.code().as_deref() != Some("CS001") {
        return None;
    }
    let detail = db
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?
        .detail()?;
    let mut parts = detail.splitn(3, ' ');
    let seq: i64 = parts.next()?.parse().ok()?;
    let at: i64 = parts.next()?.parse().ok()?;
    let hash = parts.next()?;
    (seq >= 0 && !hash.is_empty()).then(|| crate::audit::ChainHead {
        chain: chain.to_string(),
        seq: seq + 1,
        prev: hash.to_string(),
        at,
    })
}

/// Writes a batch in one autocommitted statement (`countersign_commit_batch`, migrations 13,
/// 16 and 24): under chain `chain`'s head lock, only if its head is still `last` (`(seq,
/// hash)`, `(0, GENESIS)` for an empty chain), every one of `transitions` moves (a read's row
/// written with its outcome is written, its guard holding), every key they claim
/// ([`Transition::reserve`]) is reserved and `records` (sealed after `last`, in chain order)
/// are inserted; otherwise it raises ([`is_one_trip_refusal`]) and writes nothing. Its COMMIT
/// waits for the WAL flush: the function is asked to make sure of it, whatever the session's
/// `synchronous_commit`.
pub(crate) async fn commit_one_trip(
    pool: &LeanPool<sqlx::Postgres>,
    chain: &str,
    last: (i64, &str),
    transitions: &[&Transition],
    records: &[AuditRecord],
    now: i64,
) -> Result<(), sqlx::Error> {
    let (updates, inserts) = split_reads(transitions.iter().copied());
    let moves = Moves::of(&updates);
    let claims: Vec<(&Transition, &super::steps::KeyClaim)> = transitions
        .iter()
        .filter_map(|t| t.reserve.as_ref().map(|k| (*t, k)))
        .collect();
    let q = sqlx::query_scalar::<_, String>(
        "SELECT countersign_commit_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,
            $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28,
            $29, $30, $31, $32, $33, $34, $35, $36, $37::json)",
    )
    .bind(chain)
    .bind(last.0)
    .bind(last.1)
    .bind(now)
    .bind(true);
    let claim = |f: fn(&Transition, &super::steps::KeyClaim) -> String| {
        claims.iter().map(|(t, k)| f(t, k)).collect::<Vec<_>>()
    };
    let q = bind_moves!(q, &moves)
        .bind(claim(|t, _| t.step_id.clone()))
        .bind(claim(|_, k| k.idem_key.clone()))
        .bind(claim(|_, k| k.inputs_hash.clone()))
        .bind(claim(|_, k| k.owner.clone()));
    // The function answers the `synchronous_commit` it committed under: `on`, as asked.
    let _setting = crate::store::audit_append::bind_record_arrays!(q, records)
        .bind(reads_json(&inserts)?)
        .fetch_one(pool)
        .await?;
    Ok(())
}
