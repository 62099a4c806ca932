//! What an audit record is, before any database: the events, a record to append, a stored
//! record, the reserved chains and the head an appender seals at. Nothing here reads or writes
//! storage; the chain math is in `chain` and `check`, persistence in `crate::store`'s
//! `audit_append` and this folder's `impl Store` readers.
//!
//! Invariants:
//! * A tenant's chain is named after it; names starting with `_` (and the empty name) are the
//!   platform's ([`SYSTEM_CHAIN`], [`LEGACY_CHAIN`]) and no tenant may have them
//!   ([`chain_of_tenant`] refuses, fail closed).
//! * [`ChainHead::at_for`] never returns a time before the head's: `at` never decreases along
//!   a chain.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `prev` of the first record.
pub const GENESIS: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// The chain of records that belong to no tenant (operational events of the platform).
pub const SYSTEM_CHAIN: &str = "_system";

/// The chain records written before chains per tenant (schema < 16) were moved into, byte for
/// byte: the database refuses appends to it (migration 0016).
pub const LEGACY_CHAIN: &str = "_legacy";

/// The record format [`seal`](super::seal) writes: the version 2 body names its chain and
/// its version (`"chain"`, `"v":2`); version 1 (the [`LEGACY_CHAIN`]'s records) names
/// neither.
pub const RECORD_VERSION: i64 = 2;

/// The chain a record of `tenant` (or of none) belongs to. Tenants are named by people and
/// identity providers; a name starting with `_` would collide with the reserved chains
/// ([`SYSTEM_CHAIN`], [`LEGACY_CHAIN`]) and is refused (fail closed: no record is written).
pub fn chain_of_tenant(tenant: Option<&str>) -> Result<String, ReservedTenant> {
    match tenant {
        None => Ok(SYSTEM_CHAIN.to_string()),
        Some(t) if t.is_empty() || t.starts_with('_') => Err(ReservedTenant(t.to_string())),
        Some(t) => Ok(t.to_string()),
    }
}

/// A tenant name that cannot have an audit chain (reserved, see [`chain_of_tenant`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tenant {0:?} cannot have an audit chain: names starting with '_' (and the empty name) are \
     reserved"
)]
pub struct ReservedTenant(pub String);

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
    /// The tenant whose chain the record joins. When `None`, the tenant of `run_id`'s run,
    /// else [`SYSTEM_CHAIN`]. A record of a run may not name another tenant (refused).
    pub tenant: Option<String>,
}

/// A stored record (and one line of `audit export`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
#[serde(deny_unknown_fields)]
pub struct AuditRecord {
    /// The chain: a tenant, [`SYSTEM_CHAIN`] or [`LEGACY_CHAIN`] (an export written before
    /// chains per tenant has no such member: its records are the legacy chain's).
    #[serde(default = "legacy_chain")]
    pub chain: String,
    /// Position in the chain, from 1.
    pub seq: i64,
    /// Where the record stands in the order records were written, across chains: for readers
    /// only (not hashed, proves nothing); 0 for a record not read back from the database.
    #[serde(default)]
    pub pos: i64,
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

fn legacy_chain() -> String {
    LEGACY_CHAIN.to_string()
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
    /// The chain.
    pub(crate) chain: String,
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

    /// Moves the head past `sealed`.
    pub(crate) fn advance(&mut self, sealed: &AuditRecord) {
        self.seq = sealed.seq + 1;
        self.prev.clone_from(&sealed.hash);
        self.at = sealed.at;
    }
}
