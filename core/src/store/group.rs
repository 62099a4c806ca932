//! Group commit for the audit chains.
//!
//! Every audit append needs its chain's head, so appenders of one chain are serialised (the
//! chain's head row locked on Postgres; SQLite's single writer) and each one holds that lock
//! through its own COMMIT: alone, a chain advances one fsync at a time however many callers
//! wait. The committer collects the step transitions and audit appends that callers submit
//! concurrently and commits them together — one transaction, one head lock, one head read, one
//! INSERT of all the batch's records and one COMMIT for the batch. There is one committer task
//! per chain (started with its first job): different chains' batches commit concurrently.
//!
//! Invariants:
//! * A job's writes (status change, key state, its audit records) commit atomically, and its
//!   records are contiguous in the chain in the order the job lists them.
//! * A job's answer is sent only after COMMIT returned. If a batch fails, nothing of it is
//!   committed and every job of it is re-run alone, so one failing job cannot fail another —
//!   unless its connection failed after the COMMIT (or the one-trip statement) went out and
//!   the server's answer never came: then it may have committed or may still commit, and
//!   every job of it is answered [`StoreError::OutcomeUnknown`], none re-run (a re-run could
//!   write its records twice). What it wrote, if anything, looks as after a crash.
//! * Jobs of a batch see each other's writes in batch order, exactly as if committed one
//!   after the other (a second transition of the same step sees the first's status).
//! * Lock order: a batch appends to one chain and locks its head row before any other row,
//!   here and in [`Store::transition_alone`]; transitions without records take no head, never
//!   come here (they are written alone) and touch one row. So batches, lone transitions and
//!   other processes' batches cannot deadlock.
//! * Other processes (workers, replicas) lock the same head rows: whole batches of one chain
//!   interleave, never parts of one.
//! * One round trip (Postgres): a batch of transitions of distinct steps (reads' rows written
//!   with their outcome included) and appends is sealed on the chain head this committer last
//!   wrote or read, and written by one autocommitted statement (`countersign_commit_batch`,
//!   migrations 13 and 24) that takes the same append lock first and writes nothing unless the
//!   chain's last record is still that head, every transition moves and every read's row is
//!   written (its guard holding, its run position free). A refusal because another process moved the head names the
//!   head it found (migration 17): the batch is sealed again on it and sent again, up to
//!   [`ONE_TRIP_ATTEMPTS`] times in all; any other refusal (or the last) sends the batch down
//!   the multi-statement path (which reads the head under the lock). Each attempt is checked
//!   by the function under the head lock, so a stale head can never be extended, and the rows
//!   written are the ones that path writes (its bulk UPDATE and its reads' INSERT are the same
//!   SQL functions; a lone transition's UPDATE, `transition_sql`, and a lone read's INSERT,
//!   `INSERT_MOVED_SQL`, write the same columns). A one-trip statement
//!   whose connection broke is looked up by its last record: found, it is answered as
//!   written; not found, its outcome is unknown (it may still be waiting for the lock or its
//!   flush at the server) and it is never retried.
//! * If the committer is gone (runtime shutting down), callers fall back to their own
//!   transaction; nothing is lost, nothing is applied twice by the fallback unless the
//!   committer died between COMMIT and its answer (then a transition finds its step moved
//!   and reports `None`, as a lost race would).
//!
//! Durability: every batch COMMITs synchronously (Postgres `synchronous_commit` on, SQLite's
//! WAL with `synchronous = FULL`): a job is answered only after its batch is on disk, and the
//! chain's head lock is held through that flush. Batches of one chain are therefore one flush
//! apart; the callers that wait meanwhile join the next batch. (A pipelined variant — COMMIT
//! without the flush, a shared flush barrier before answering, a pool of unflushed
//! connections — was measured against this on 2026-12-06 and paid under 10 % on every figure:
//! removed, docs/performance.md.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::commit_queue::{CommitQueue, Done, Job, Submitted, Work};
use super::lean_pool::LeanPool;
use super::steps::{apply_transition, reserve_with, seal_records};
use super::{Pool, Store, StoreError, Transition};
use crate::audit::{AuditRecord, ChainHead};
use crate::store::audit_append::{hold_head, insert_all_pg, insert_all_sqlite, seal_next};

/// At most this many jobs share one transaction.
const MAX_BATCH: usize = 128;

/// Attempts of a one-trip batch whose head another process moved (each sealed again on the
/// head its refusal names) before it takes the long path.
const ONE_TRIP_ATTEMPTS: usize = 3;

/// The `tracing` target of the committer's per-batch timings, emitted at debug level: jobs in
/// the batch, how long they waited for it on average and how long its statements took (the
/// append lock held; microseconds). Off unless a subscriber enables it (the executor
/// benchmark's profile does).
pub const TIMING: &str = "countersign::committer::timing";

/// Microseconds of `d`, for [`TIMING`].
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The committer a store holds as its [`CommitQueue`]: one task per audit chain.
pub(crate) struct Committer {
    /// Each chain's task, started when its first job comes.
    chains: Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Job>>>>,
    shared: Arc<Shared>,
}

/// What the chains' committer tasks share.
struct Shared {
    store: Store,
    /// Batches written in one round trip so far (Postgres).
    one_trips: Arc<AtomicU64>,
}

/// How a one-trip batch ended ([`Store::commit_one_trip_pg`]).
enum OneTrip {
    /// Written: the answers and the head after it.
    Written(Vec<Done>, ChainHead),
    /// The server refused it: nothing of it is written.
    Refused(sqlx::Error),
}

/// What a chain's committer knows of its chain between batches.
struct Chain {
    /// The chain's name.
    name: String,
    /// The head as this committer last wrote or read it, while it trusts it.
    head: Option<ChainHead>,
    /// Batches written in one round trip ([`Committer::one_trips`]).
    one_trips: Arc<AtomicU64>,
}

impl Committer {
    /// The committer over `store` (which must not itself have a committer); each chain's task
    /// starts with its first job.
    pub(crate) fn start(store: Store) -> Self {
        Self {
            chains: Arc::default(),
            shared: Arc::new(Shared {
                store,
                one_trips: Arc::new(AtomicU64::new(0)),
            }),
        }
    }

    /// Queues `work` on chain `chain`'s committer, starting it with its first job; the
    /// answer, or `None` when the committer is gone.
    async fn queue(&self, chain: String, work: Work) -> Option<Result<Done, StoreError>> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            work,
            reply,
            submitted: Instant::now(),
        };
        {
            let mut chains = self.chains.lock().ok()?;
            let jobs = chains.entry(chain.clone()).or_insert_with(|| {
                let (jobs, rx) = mpsc::unbounded_channel();
                let chain = Chain {
                    name: chain,
                    head: None,
                    one_trips: self.shared.one_trips.clone(),
                };
                tokio::spawn(run(self.shared.clone(), rx, chain));
                jobs
            });
            jobs.send(job).ok()?;
        }
        answer.await.ok()
    }
}

impl CommitQueue for Committer {
    fn submit(&self, chain: String, work: Work) -> Submitted<'_> {
        Box::pin(self.queue(chain, work))
    }

    fn one_trips(&self) -> u64 {
        self.shared.one_trips.load(Ordering::Relaxed)
    }
}

/// One chain's committer: batches of its jobs, one after the other. Chains' committers run
/// concurrently: each locks only its own chain's head.
async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Job>, mut chain: Chain) {
    let store = &shared.store;
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let began = Instant::now();
        // (Field values are computed only when a subscriber enables the target.)
        let timed = |jobs: &[Job]| {
            tracing::debug!(
                target: TIMING,
                batch_jobs = jobs.len() as u64,
                batch_queued_us = micros(
                    jobs.iter()
                        .map(|j| began.saturating_duration_since(j.submitted))
                        .sum()
                ) / jobs.len().max(1) as u64,
                batch_us = micros(began.elapsed()),
                "committer batch"
            );
        };
        match store.commit_batch(&jobs, &mut chain).await {
            Err(StoreError::OutcomeUnknown(why)) => unknown(jobs, &why),
            Ok(done) => {
                timed(&jobs);
                for (job, done) in jobs.into_iter().zip(done) {
                    let _ = job.reply.send(Ok(done));
                }
            }
            Err(e) if jobs.len() == 1 => {
                if let Some(job) = jobs.pop() {
                    let _ = job.reply.send(Err(e));
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, jobs = jobs.len(), "batch failed; committing its jobs one by one");
                for job in jobs {
                    let done = store
                        .commit_batch(std::slice::from_ref(&job), &mut chain)
                        .await;
                    let _ = job
                        .reply
                        .send(done.and_then(|mut d| d.pop().ok_or(StoreError::NotFound)));
                }
            }
        }
    }
}

/// Answers every job of a batch whose outcome is unknown with that, and re-runs none of them:
/// a re-run could write its records (or a transition's) a second time.
fn unknown(jobs: Vec<Job>, why: &str) {
    tracing::warn!(
        jobs = jobs.len(),
        error = why,
        "committer batch: outcome unknown"
    );
    for job in jobs {
        let _ = job
            .reply
            .send(Err(StoreError::OutcomeUnknown(why.to_string())));
    }
}

/// A transition job's answer; its records (if it moved) join the batch's INSERT.
fn moved(sealed: &mut Vec<AuditRecord>, records: Option<Vec<AuditRecord>>, reserved: bool) -> Done {
    if let Some(records) = &records {
        sealed.extend(records.iter().cloned());
    }
    Done::Moved(records, reserved)
}

/// An append job's answer; its record joins the batch's INSERT.
fn appended(sealed: &mut Vec<AuditRecord>, record: AuditRecord) -> Done {
    sealed.push(record.clone());
    Done::Appended(Box::new(record))
}

impl Store {
    /// Writes `jobs` in one transaction, in order, committed durably; one answer per job.
    ///
    /// `chain.head`: the chain head this committer last wrote or read, if it still trusts it. On
    /// Postgres a batch sealed on it goes in one round trip ([`Store::commit_one_trip_pg`]),
    /// which writes nothing unless the head is still that one and every transition moves;
    /// otherwise (or without a cache) the batch takes the multi-statement path, which reads
    /// the head under the lock. Either path leaves `chain.head` at the head after its batch, or
    /// `None` when it failed.
    async fn commit_batch(&self, jobs: &[Job], chain: &mut Chain) -> Result<Vec<Done>, StoreError> {
        macro_rules! batch_in {
            ($pool:expr, $begin:expr, $lock:expr, $insert:path) => {{
                let mut tx = $pool.begin_with($begin).await?;
                let mut head: Option<crate::audit::ChainHead> = None;
                // The append lock first, before any row lock (see the module invariants).
                hold_head!(&mut *tx, $lock, &mut head, &chain.name);
                let mut out = Vec::with_capacity(jobs.len());
                // Every record of the batch, sealed in chain order; inserted in one go.
                let mut sealed: Vec<AuditRecord> = Vec::new();
                for job in jobs {
                    let now = self.clock.now_ms();
                    out.push(match &job.work {
                        Work::Transition(t) => {
                            let records =
                                apply_transition!(&mut *tx, $lock, &mut head, &chain.name, t, now);
                            let reserved = records.is_some() && reserve_with!(&mut *tx, t, now);
                            moved(&mut sealed, records, reserved)
                        }
                        Work::Append(new, event) => {
                            let h = hold_head!(&mut *tx, $lock, &mut head, &chain.name);
                            appended(&mut sealed, seal_next!(h, new, *event, now))
                        }
                    });
                }
                $insert(&mut *tx, &sealed).await?;
                tx.commit().await.map_err(StoreError::from_commit)?;
                chain.head = head;
                out
            }};
        }
        let done = match &self.pool {
            Pool::Sqlite(p) => {
                batch_in!(p, "BEGIN IMMEDIATE", false, insert_all_sqlite)
            }
            Pool::Postgres(p) => {
                // BEGIN and the append lock stay two statements: sent as one simple query, a
                // lock that fails (lock or statement timeout, cancel) would leave the
                // connection in an aborted transaction that sqlx does not roll back (it counts
                // the transaction as begun only once the whole query succeeded).
                if let Some(mut head) = chain.head.take()
                    && !self.ablations.no_one_trip
                    && super::bulk::one_trip_applicable(jobs, !self.ablations.no_one_trip_reads)
                {
                    for attempt in 1..=ONE_TRIP_ATTEMPTS {
                        match self.commit_one_trip_pg(p, jobs, head).await? {
                            OneTrip::Written(done, head) => {
                                chain.head = Some(head);
                                chain.one_trips.fetch_add(1, Ordering::Relaxed);
                                return Ok(done);
                            }
                            // Another process moved the head: sealed again on the head the
                            // refusal names, the batch goes in one trip again.
                            OneTrip::Refused(e)
                                if attempt < ONE_TRIP_ATTEMPTS
                                    && let Some(moved) =
                                        super::bulk::moved_head(&e, &chain.name) =>
                            {
                                tracing::debug!(error = %e, attempt, "one-trip batch met a moved head; sealed again on it");
                                head = moved;
                            }
                            // The server refused it: nothing of it is written (one statement).
                            OneTrip::Refused(e) if super::bulk::is_one_trip_refusal(&e) => {
                                tracing::debug!(error = %e, "one-trip batch refused; the long path");
                                break;
                            }
                            // A read's step took a position another step of its run took
                            // meanwhile: the long path numbers it again.
                            OneTrip::Refused(e)
                                if e.as_database_error()
                                    .is_some_and(|d| d.is_unique_violation()) =>
                            {
                                tracing::debug!(error = %e, "one-trip batch met a taken position; the long path");
                                break;
                            }
                            OneTrip::Refused(e) => {
                                tracing::warn!(error = %e, "one-trip batch failed; the long path");
                                break;
                            }
                        }
                    }
                }
                if super::bulk::applicable(jobs) {
                    let (done, head) = self.commit_bulk_pg(p, jobs, &chain.name).await?;
                    chain.head = Some(head);
                    done
                } else {
                    batch_in!(p, "BEGIN", true, insert_all_pg)
                }
            }
        };
        Ok(done)
    }

    /// Postgres: [`Store::commit_batch`] for a batch whose jobs touch distinct steps — its
    /// transitions in two statements at most, bar refused reads ([`super::bulk`]), then its
    /// records sealed in job order and inserted at once: the same rows and the same chain as
    /// one-by-one.
    async fn commit_bulk_pg(
        &self,
        pool: &LeanPool<sqlx::Postgres>,
        jobs: &[Job],
        chain: &str,
    ) -> Result<(Vec<Done>, ChainHead), StoreError> {
        let mut tx = pool.begin_with("BEGIN").await?;
        let mut head: Option<crate::audit::ChainHead> = None;
        // The append lock first, before any row lock (see the module invariants).
        hold_head!(&mut *tx, true, &mut head, chain);
        let now = self.clock.now_ms();
        let went = super::bulk::apply(&mut tx, jobs, now).await?;
        let mut out = Vec::with_capacity(jobs.len());
        let mut sealed: Vec<AuditRecord> = Vec::new();
        for (job, went) in jobs.iter().zip(went) {
            out.push(match &job.work {
                Work::Transition(t) if went => {
                    let records = seal_records!(&mut *tx, true, &mut head, chain, t, now);
                    let reserved = reserve_with!(&mut *tx, t, now);
                    moved(&mut sealed, Some(records), reserved)
                }
                Work::Transition(_) => moved(&mut sealed, None, false),
                Work::Append(new, event) => {
                    let h = hold_head!(&mut *tx, true, &mut head, chain);
                    appended(&mut sealed, seal_next!(h, new, *event, now))
                }
            });
        }
        insert_all_pg(&mut tx, &sealed).await?;
        tx.commit().await.map_err(StoreError::from_commit)?;
        let head = head.ok_or_else(|| StoreError::Conflict("audit head not held".into()))?;
        Ok((out, head))
    }

    /// Postgres: [`Store::commit_batch`] in one round trip for a batch of transitions of
    /// distinct steps and appends ([`super::bulk::one_trip_applicable`]): its records
    /// sealed in job order at `head` as if every transition moves, then written by
    /// `countersign_commit_batch` only if that head is still the chain's and every transition
    /// does move — the rows and the chain the multi-statement path would have written.
    ///
    /// If the statement fails without the server's word (the connection broke, or the
    /// server ended the session), it may have committed, or may still: the batch's last
    /// record, read back, tells only that it did (a `seq` holds one record, never removed).
    /// Found, the batch is reported written; not found (or no record, or the look-up failed),
    /// [`StoreError::OutcomeUnknown`], which nobody retries — it is never written twice.
    async fn commit_one_trip_pg(
        &self,
        pool: &LeanPool<sqlx::Postgres>,
        jobs: &[Job],
        mut head: ChainHead,
    ) -> Result<OneTrip, StoreError> {
        let last = (head.seq - 1, head.prev.clone());
        let chain = head.chain.clone();
        let now = self.clock.now_ms();
        let mut out = Vec::with_capacity(jobs.len());
        let mut sealed: Vec<AuditRecord> = Vec::new();
        let mut transitions: Vec<&Transition> = Vec::new();
        for job in jobs {
            out.push(match &job.work {
                Work::Transition(t) => {
                    transitions.push(t);
                    let mut records = Vec::with_capacity(t.records.len());
                    for (event, new) in &t.records {
                        records.push(seal_next!(&mut head, new, *event, now));
                    }
                    // Written only if every claimed key is reserved (else the long path).
                    moved(&mut sealed, Some(records), t.reserve.is_some())
                }
                Work::Append(new, event) => {
                    appended(&mut sealed, seal_next!(&mut head, new, *event, now))
                }
            });
        }
        match super::bulk::commit_one_trip(
            pool,
            &chain,
            (last.0, last.1.as_str()),
            &transitions,
            &sealed,
            now,
        )
        .await
        {
            Ok(()) => {}
            // The server aborted it: nothing of it is written.
            Err(e) if super::answered(&e) => return Ok(OneTrip::Refused(e)),
            // It never left: the long path may write it.
            Err(e) if !super::sent_maybe(&e) => return Err(StoreError::Database(e)),
            Err(e) => {
                // Found, it committed. Not found, it may still commit (the server can be
                // waiting for the append lock or its flush after the client saw the error):
                // unknown, never retried.
                let unknown_because = |why: &dyn std::fmt::Display| {
                    StoreError::OutcomeUnknown(format!(
                        "a one-trip batch's connection failed ({e}); {why}"
                    ))
                };
                let Some(newest) = sealed.last() else {
                    return Err(unknown_because(&"it has no record to look up"));
                };
                let stored: Option<String> =
                    sqlx::query_scalar("SELECT hash FROM audit WHERE chain = $1 AND seq = $2")
                        .bind(&newest.chain)
                        .bind(newest.seq)
                        .fetch_optional(pool)
                        .await
                        .map_err(|l| unknown_because(&format_args!("its look-up failed: {l}")))?;
                if stored.as_deref() != Some(newest.hash.as_str()) {
                    return Err(unknown_because(&"not committed yet"));
                }
                tracing::warn!(error = %e, "one-trip batch committed before its connection failed");
                // Visible means committed; a synchronous COMMIT is visible only once
                // flushed.
            }
        }
        Ok(OneTrip::Written(out, head))
    }
}
