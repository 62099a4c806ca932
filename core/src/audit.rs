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
//!   tenant than its run's, or a reserved name, is refused (`Store::chain_for`, in the store's
//!   `audit_append`).
//! * `seq` starts at 1 in each chain and is its head's `seq + 1`; `(chain, seq)` is the key.
//!   The database refuses a record that does not extend its chain's head row (`audit_chains`)
//!   and moves the head with it (migration 0016); appenders lock only their chain's head row
//!   (`crate::store`'s `audit_append`), so tenants append concurrently and a transaction
//!   appends to one chain.
//! * `at` never decreases along a chain: an appender holding the head seals at max(now, the
//!   head's `at`) ([`ChainHead::at_for`]), so a time range is a range of the write order
//!   (`pos`, the readers' order; not hashed) within a clock skew across chains.
//! * The database refuses UPDATE, DELETE (and TRUNCATE on Postgres) on the table; the
//!   appenders only ever INSERT.
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
//!   through `seal_next!` (alone, in a step transition, or in a group-commit batch,
//!   [`crate::store`]'s committer).
//! * Callers pass values already redacted ([`crate::redact`]); nothing here sees secrets.
//!
//! Layers (issue 35): `record` (the types, no storage) ← `check` ← `chain` (the math);
//! `merkle` and `note` stand alone; `crate::store::audit_append` persists what `chain` seals
//! (and resolves which chain a record joins); the `impl Store` readers here (`read`,
//! `redaction`, `full`, `tree_head`, `checkpoint`'s storage) sit on the store and nothing in
//! the store uses them; the group committer (`crate::store::group`) is above every writer.

pub use chain::{
    ChainBreak, ChainVerifier, default_threads, hash_text, seal, verify, verify_with_threads,
};
pub use read::audit_for_step_sql;
pub(crate) use read::{FAILURE_PAGE, RECENT_EVENTS_SQL, parse_recent_events};
pub(crate) use record::ChainHead;
pub use record::{
    AuditEvent, AuditRecord, GENESIS, LEGACY_CHAIN, NewAuditRecord, RECORD_VERSION, ReservedTenant,
    SYSTEM_CHAIN, chain_of_tenant,
};

mod chain;
mod check;
pub mod checkpoint;
mod full;
pub mod members;
pub mod merkle;
pub mod note;
mod read;
mod record;
mod redaction;
pub mod tree_head;

/// Test access to the two halves of the per-record text check (see `check`'s invariant).
#[cfg(feature = "test-support")]
pub use check::fast_and_general;
