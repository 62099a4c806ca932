//! What a store hands the group committer (`group`): a step transition or an audit record
//! to write, and what was written. The committer is built on the store; the store knows it
//! only through [`CommitQueue`].

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use tokio::sync::oneshot;

use super::error::StoreError;
use super::step_model::Transition;
use crate::audit::{AuditEvent, AuditRecord, NewAuditRecord};

/// What a caller asks the committer to write.
#[derive(Debug)]
pub(crate) enum Work {
    /// A step transition with its records ([`Store::transition`](super::Store::transition)).
    Transition(Box<Transition>),
    /// One audit record ([`Store::append_audit`](super::Store::append_audit)).
    Append(Box<NewAuditRecord>, AuditEvent),
}

/// What was written.
#[derive(Debug)]
pub(crate) enum Done {
    /// The transition's records, or `None` when the step was not in its `from` statuses; and
    /// whether it reserved its key ([`Transition::reserve`]).
    Moved(Option<Vec<AuditRecord>>, bool),
    /// The appended record.
    Appended(Box<AuditRecord>),
}

/// A submitted job, waiting in its chain's queue.
pub(crate) struct Job {
    pub(crate) work: Work,
    pub(crate) reply: oneshot::Sender<Result<Done, StoreError>>,
    /// When the caller submitted it (for the committer's timings).
    pub(crate) submitted: Instant,
}

/// A committer's answer to one submitted job, once its batch committed durably; `None` when
/// the committer is gone.
pub(crate) type Submitted<'a> =
    Pin<Box<dyn Future<Output = Option<Result<Done, StoreError>>> + Send + 'a>>;

/// The group committer as a store holds it.
pub(crate) trait CommitQueue: Send + Sync {
    /// Submits `work` to chain `chain`'s committer (every record of it joins that chain);
    /// `None` when the committer is gone (the caller writes alone).
    fn submit(&self, chain: String, work: Work) -> Submitted<'_>;

    /// Batches this committer wrote in one round trip.
    fn one_trips(&self) -> u64;
}
