//! Group commit for the audit chain.
//!
//! Every audit append needs the chain head, so appenders are serialised (the Postgres
//! advisory lock; SQLite's single writer) and each one holds that lock through its own COMMIT:
//! alone, the chain advances one fsync at a time however many callers wait. The committer
//! collects the step transitions and audit appends that callers submit concurrently and
//! commits them together — one transaction, one lock acquisition, one head read, one INSERT
//! of all the batch's records and one COMMIT for the batch.
//!
//! Invariants:
//! * A job's writes (status change, key state, its audit records) commit atomically, and its
//!   records are contiguous in the chain in the order the job lists them.
//! * A job's answer is sent only after COMMIT returned. If a batch fails, nothing of it is
//!   committed and every job of it is re-run alone, so one failing job cannot fail another.
//! * Jobs of a batch see each other's writes in batch order, exactly as if committed one
//!   after the other (a second transition of the same step sees the first's status).
//! * Lock order: the append lock is taken before any row lock, here and in
//!   [`Store::transition_alone`]; transitions without records take no append lock and touch
//!   one row. So batches, lone transitions and other processes' batches cannot deadlock.
//! * Other processes (workers, replicas) still take the same lock: whole batches interleave,
//!   never parts of one.
//! * If the committer is gone (runtime shutting down), callers fall back to their own
//!   transaction; nothing is lost, nothing is applied twice by the fallback unless the
//!   committer died between COMMIT and its answer (then a transition finds its step moved
//!   and reports `None`, as a lost race would).

use tokio::sync::{mpsc, oneshot};

use super::steps::apply_transition;
use super::{Pool, Store, StoreError, Transition};
use crate::audit::{AuditEvent, AuditRecord, NewAuditRecord, hold_head, seal_next};

/// At most this many jobs share one transaction.
const MAX_BATCH: usize = 128;

/// What a caller asks the committer to write.
#[derive(Debug)]
pub(crate) enum Work {
    /// A step transition with its records ([`Store::transition`]).
    Transition(Box<Transition>),
    /// One audit record ([`Store::append_audit`]).
    Append(NewAuditRecord, AuditEvent),
}

/// What was written.
#[derive(Debug)]
pub(crate) enum Done {
    /// The transition's records, or `None` when the step was not in its `from` statuses.
    Moved(Option<Vec<AuditRecord>>),
    /// The appended record.
    Appended(Box<AuditRecord>),
}

struct Job {
    work: Work,
    reply: oneshot::Sender<Result<Done, StoreError>>,
}

/// The handle stores hold; cloning shares the one committer task.
#[derive(Clone)]
pub(crate) struct Committer {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Committer {
    /// Starts the committer task over `store` (which must not itself have a committer).
    pub(crate) fn start(store: Store) -> Self {
        let (jobs, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(store, rx));
        Self { jobs }
    }

    /// Submits `work`; `None` when the committer is gone (the caller writes alone).
    pub(crate) async fn submit(&self, work: Work) -> Option<Result<Done, StoreError>> {
        let (reply, answer) = oneshot::channel();
        self.jobs.send(Job { work, reply }).ok()?;
        answer.await.ok()
    }
}

async fn run(store: Store, mut rx: mpsc::UnboundedReceiver<Job>) {
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        match store.commit_batch(&jobs).await {
            Ok(done) => {
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
                    let done = store.commit_batch(std::slice::from_ref(&job)).await;
                    let _ = job
                        .reply
                        .send(done.and_then(|mut d| d.pop().ok_or(StoreError::NotFound)));
                }
            }
        }
    }
}

impl Store {
    /// Writes `jobs` in one transaction, in order; one answer per job.
    async fn commit_batch(&self, jobs: &[Job]) -> Result<Vec<Done>, StoreError> {
        macro_rules! batch_in {
            ($pool:expr, $begin:expr, $lock:expr, $insert:path) => {{
                let mut tx = $pool.begin_with($begin).await?;
                let mut head: Option<crate::audit::ChainHead> = None;
                // The append lock first, before any row lock (see the module invariants).
                hold_head!(&mut *tx, $lock, &mut head);
                let mut out = Vec::with_capacity(jobs.len());
                // Every record of the batch, sealed in chain order; inserted in one go.
                let mut sealed: Vec<AuditRecord> = Vec::new();
                for job in jobs {
                    let now = self.clock.now_ms();
                    out.push(match &job.work {
                        Work::Transition(t) => {
                            let moved = apply_transition!(&mut *tx, $lock, &mut head, t, now);
                            if let Some(records) = &moved {
                                sealed.extend(records.iter().cloned());
                            }
                            Done::Moved(moved)
                        }
                        Work::Append(new, event) => {
                            let h = hold_head!(&mut *tx, $lock, &mut head);
                            let record = seal_next!(h, new, *event, now);
                            sealed.push(record.clone());
                            Done::Appended(Box::new(record))
                        }
                    });
                }
                $insert(&mut *tx, &sealed).await?;
                tx.commit().await?;
                out
            }};
        }
        Ok(match &self.pool {
            Pool::Sqlite(p) => {
                batch_in!(p, "BEGIN IMMEDIATE", false, crate::audit::insert_all_sqlite)
            }
            Pool::Postgres(p) => batch_in!(p, "BEGIN", true, crate::audit::insert_all_pg),
        })
    }
}
