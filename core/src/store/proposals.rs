//! Proposed registry changes: the two-admin review of the role × tool listing and of each
//! tool's effect class and gate settings.
//!
//! An admin proposes adding or removing tools for roles, or changing a tool's settings
//! ([`ToolSetting`]: effect class, gate, approval expiry, step-up age, four eyes, second
//! approver threshold), against a base registry version; a second admin approves (a new
//! registry version is stored) or rejects it.
//!
//! # Invariants (each fails closed)
//!
//! * A proposal is checked when it is made: every change names an existing tool and role,
//!   adds only what is not listed and removes only what is, changes a setting from the value
//!   in force to a different well-formed value (approval settings only where the tool has
//!   approval settings), and the changed bundle loads (a tool left with no role, a gated tool
//!   without approvers, … are refused). Nothing is stored otherwise. Approval applies the
//!   same checks again.
//! * The proposer never approves their own proposal ([`ApproveOutcome::OwnProposal`]); the
//!   refusal is audited.
//! * Approval re-checks, inside one transaction that also stores the new version, that the
//!   base version is still the newest one; otherwise the proposal becomes `superseded` and
//!   nothing is applied. The transaction takes the system audit chain's head (Postgres
//!   row lock; SQLite `BEGIN IMMEDIATE`), so two approvals cannot both apply against one base.
//! * Only a `proposed` proposal changes status, exactly once; every status change commits
//!   together with its audit record (event `operational`, rule `admin.proposal.*`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use uuid::Uuid;

mod changes;
pub use changes::{
    BundleChange, Change, ChangeOp, ListingChange, SettingChange, ToolSetting, apply_changes,
};

use super::registry::changes as version_diff;
use super::{Pool, Store, StoreError, on_pool};
use crate::audit::{AuditEvent, NewAuditRecord};
use crate::bundle::{Bundle, BundleSources};
use crate::store::audit_append::append_in_tx;

/// Where a proposal stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposalStatus {
    /// Waiting for a second admin.
    Proposed,
    /// Applied as a new registry version.
    Approved,
    /// Refused by a second admin.
    Rejected,
    /// Its base version was no longer current when it was approved; never applied.
    Superseded,
}

impl ProposalStatus {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Proposed => "proposed",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Superseded => "superseded",
        }
    }

    /// Parses the stored text.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "proposed" => Self::Proposed,
            "approved" => Self::Approved,
            "rejected" => Self::Rejected,
            "superseded" => Self::Superseded,
            _ => return None,
        })
    }
}

/// A stored proposal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Proposal {
    /// Id.
    pub id: String,
    /// The proposer's identity, `iss#sub`.
    pub proposer: String,
    /// The proposer's display name.
    pub proposer_name: String,
    /// Unix ms.
    pub created_at: i64,
    /// The registry version the changes were made against.
    pub base_version: i64,
    /// The changes, sorted.
    pub changes: Vec<Change>,
    /// Why (the proposer's words).
    pub note: String,
    /// Status.
    pub status: ProposalStatus,
    /// Who approved or rejected it (`iss#sub`), or who triggered its supersession.
    pub decided_by: Option<String>,
    /// When, Unix ms.
    pub decided_at: Option<i64>,
    /// The decision's reason.
    pub decision_reason: Option<String>,
    /// The registry version it created, when approved.
    pub applied_version: Option<i64>,
}

#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    proposer: String,
    proposer_name: String,
    created_at: i64,
    base_version: i64,
    changes: String,
    note: String,
    status: String,
    decided_by: Option<String>,
    decided_at: Option<i64>,
    decision_reason: Option<String>,
    applied_version: Option<i64>,
}

impl TryFrom<Row> for Proposal {
    type Error = StoreError;
    fn try_from(r: Row) -> Result<Self, StoreError> {
        let status = ProposalStatus::parse(&r.status)
            .ok_or_else(|| StoreError::Conflict(format!("unknown proposal status {}", r.status)))?;
        let changes = serde_json::from_str(&r.changes)
            .map_err(|e| StoreError::Conflict(format!("proposal {}: changes: {e}", r.id)))?;
        Ok(Self {
            id: r.id,
            proposer: r.proposer,
            proposer_name: r.proposer_name,
            created_at: r.created_at,
            base_version: r.base_version,
            changes,
            note: r.note,
            status,
            decided_by: r.decided_by,
            decided_at: r.decided_at,
            decision_reason: r.decision_reason,
            applied_version: r.applied_version,
        })
    }
}

const COLUMNS: &str = "id, proposer, proposer_name, created_at, base_version, changes, note, \
                       status, decided_by, decided_at, decision_reason, applied_version";

/// What is needed to propose.
#[derive(Debug, Clone)]
pub struct NewProposal {
    /// `iss#sub` of the proposer.
    pub proposer: String,
    /// Display name.
    pub proposer_name: String,
    /// The version the changes were made against (must be the newest).
    pub base_version: i64,
    /// The changes (at least one).
    pub changes: Vec<Change>,
    /// Why.
    pub note: String,
}

/// Why a proposal or a decision was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProposalError {
    /// The changes do not apply to the base version, or the result does not load.
    #[error("{0}")]
    Invalid(String),
    /// The base version is not the newest version: reload and propose again.
    #[error("registry version {base} is not current (current: {current:?})")]
    Stale {
        /// The version proposed against.
        base: i64,
        /// The newest version.
        current: Option<i64>,
    },
    /// No such proposal.
    #[error("no such proposal")]
    NotFound,
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What approving did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApproveOutcome {
    /// Applied: the new registry version.
    Applied {
        /// The version stored.
        version: i64,
    },
    /// The base version was no longer current: the proposal is now superseded.
    Superseded {
        /// The newest version.
        current: Option<i64>,
    },
    /// The approver proposed it: refused (and audited); nothing changed.
    OwnProposal,
    /// The approver does not hold the platform role the registry (every tenant's) needs:
    /// refused (and audited); nothing changed.
    NotPlatform,
    /// It was not waiting any more.
    NotPending(ProposalStatus),
}

fn audit_detail(p: &Proposal, action: &str) -> Map<String, Value> {
    let mut detail = Map::new();
    detail.insert("kind".into(), json!("registry_proposal"));
    detail.insert("action".into(), json!(action));
    detail.insert("proposal".into(), json!(p.id));
    detail.insert("proposer".into(), json!(p.proposer));
    detail.insert("base_version".into(), json!(p.base_version));
    detail.insert(
        "changes".into(),
        Value::Array(p.changes.iter().map(Change::audit_json).collect()),
    );
    detail
}

fn audit_record(
    p: &Proposal,
    action: &str,
    actor: &str,
    extra: &[(&str, Value)],
) -> NewAuditRecord {
    let mut detail = audit_detail(p, action);
    for (k, v) in extra {
        detail.insert((*k).to_string(), v.clone());
    }
    NewAuditRecord {
        event: Some(AuditEvent::Operational),
        run_id: None,
        step_id: None,
        tool: None,
        actor: Some(format!("person:{actor}")),
        rule: Some(format!("admin.proposal.{action}")),
        detail,
        tenant: None,
    }
}

impl Store {
    /// Stores a proposal after checking it applies to `base_version`, which must be the
    /// newest version; the `proposed` audit record commits with it.
    pub async fn propose(&self, new: &NewProposal) -> Result<Proposal, ProposalError> {
        if new.proposer.trim().is_empty() {
            return Err(ProposalError::Invalid(
                "a proposal must name its proposer".into(),
            ));
        }
        let current = self.current_bundle().await?;
        let Some((version, sources)) = current else {
            return Err(ProposalError::Stale {
                base: new.base_version,
                current: None,
            });
        };
        if version != new.base_version {
            return Err(ProposalError::Stale {
                base: new.base_version,
                current: Some(version),
            });
        }
        let mut changes = new.changes.clone();
        changes.sort();
        changes.dedup();
        apply_changes(&sources, &changes).map_err(ProposalError::Invalid)?;
        let proposal = Proposal {
            id: Uuid::new_v4().to_string(),
            proposer: new.proposer.clone(),
            proposer_name: new.proposer_name.clone(),
            created_at: self.clock.now_ms(),
            base_version: new.base_version,
            changes,
            note: new.note.trim().to_string(),
            status: ProposalStatus::Proposed,
            decided_by: None,
            decided_at: None,
            decision_reason: None,
            applied_version: None,
        };
        let changes_json = serde_json::to_string(&proposal.changes)
            .map_err(|e| ProposalError::Invalid(e.to_string()))?;
        let record = audit_record(
            &proposal,
            "proposed",
            &proposal.proposer,
            &[("note", json!(proposal.note))],
        );
        self.insert_proposal(&proposal, &changes_json, &record)
            .await?;
        Ok(proposal)
    }

    async fn insert_proposal(
        &self,
        proposal: &Proposal,
        changes_json: &str,
        record: &NewAuditRecord,
    ) -> Result<(), StoreError> {
        let now = proposal.created_at;
        let chain = self.chain_for(&[record]).await?;
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr) => {{
                let mut tx = $pool.begin_with($begin).await?;
                sqlx::query(
                    "INSERT INTO registry_proposals
                       (id, proposer, proposer_name, created_at, base_version, changes, note, status)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, 'proposed')",
                )
                .bind(&proposal.id)
                .bind(&proposal.proposer)
                .bind(&proposal.proposer_name)
                .bind(now)
                .bind(proposal.base_version)
                .bind(changes_json)
                .bind(&proposal.note)
                .execute(&mut *tx)
                .await?;
                let _ = append_in_tx!(&mut *tx, $lock, &chain, record, AuditEvent::Operational, now);
                tx.commit().await?;
            }};
        }
        match &self.pool {
            Pool::Sqlite(p) => run_in!(p, "BEGIN IMMEDIATE", false),
            Pool::Postgres(p) => run_in!(p, "BEGIN", true),
        }
        Ok(())
    }

    /// One proposal.
    pub async fn get_proposal(&self, id: &str) -> Result<Proposal, ProposalError> {
        let sql = format!("SELECT {COLUMNS} FROM registry_proposals WHERE id = $1");
        let row: Option<Row> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(id)
                .fetch_optional(p)
                .await
                .map_err(StoreError::from)?
        });
        row.ok_or(ProposalError::NotFound)?
            .try_into()
            .map_err(ProposalError::Store)
    }

    /// The newest `limit` proposals, newest first.
    pub async fn list_proposals(&self, limit: i64) -> Result<Vec<Proposal>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM registry_proposals ORDER BY created_at DESC, id LIMIT $1"
        );
        let rows: Vec<Row> = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(limit).fetch_all(p).await?
        });
        rows.into_iter().map(Proposal::try_from).collect()
    }

    /// Rejects a waiting proposal. The proposer may withdraw their own this way.
    pub async fn reject_proposal(
        &self,
        id: &str,
        by: &str,
        reason: &str,
    ) -> Result<Result<Proposal, ProposalStatus>, ProposalError> {
        let proposal = self.get_proposal(id).await?;
        if proposal.status != ProposalStatus::Proposed {
            return Ok(Err(proposal.status));
        }
        let now = self.clock.now_ms();
        let record = audit_record(&proposal, "rejected", by, &[("reason", json!(reason))]);
        let moved = self
            .close_proposal(id, ProposalStatus::Rejected, by, reason, None, &record, now)
            .await?;
        if !moved {
            return Ok(Err(self.get_proposal(id).await?.status));
        }
        Ok(Ok(self.get_proposal(id).await?))
    }

    #[allow(clippy::too_many_arguments)]
    async fn close_proposal(
        &self,
        id: &str,
        to: ProposalStatus,
        by: &str,
        reason: &str,
        applied: Option<(i64, &BundleSources, &str, &str)>,
        record: &NewAuditRecord,
        now: i64,
    ) -> Result<bool, StoreError> {
        let chain = self.chain_for(&[record]).await?;
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr) => {{
                let mut tx = $pool.begin_with($begin).await?;
                // Serialises with every other decision on Postgres (registry decisions are
                // the system chain's), taken before any row lock (the chain's lock order);
                // SQLite's BEGIN IMMEDIATE already holds the single write lock.
                let mut head: Option<crate::audit::ChainHead> = None;
                crate::store::audit_append::hold_head!(&mut *tx, $lock, &mut head, &chain);
                if let Some((version, sources, created_by, diff)) = applied {
                    let newest: Option<i64> =
                        sqlx::query_scalar("SELECT MAX(version) FROM registry_versions")
                            .fetch_one(&mut *tx)
                            .await?;
                    if newest != Some(version - 1) {
                        tx.rollback().await?;
                        return Err(StoreError::Conflict(format!(
                            "registry version {} is no longer current",
                            version - 1
                        )));
                    }
                    sqlx::query(
                        "INSERT INTO registry_versions
                           (version, yaml, policies, policy_schema, sha256, created_by, created_at, diff)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    )
                    .bind(version)
                    .bind(&sources.registry_yaml)
                    .bind(&sources.policies)
                    .bind(&sources.policy_schema)
                    .bind(sources.sha256())
                    .bind(created_by)
                    .bind(now)
                    .bind(diff)
                    .execute(&mut *tx)
                    .await?;
                }
                let n = sqlx::query(
                    "UPDATE registry_proposals SET status = $1, decided_by = $2, decided_at = $3,
                        decision_reason = $4, applied_version = $5
                     WHERE id = $6 AND status = 'proposed'",
                )
                .bind(to.as_str())
                .bind(by)
                .bind(now)
                .bind(reason)
                .bind(applied.map(|a| a.0))
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if n != 1 {
                    tx.rollback().await?;
                    return Ok(false);
                }
                let h = crate::store::audit_append::hold_head!(&mut *tx, $lock, &mut head, &chain);
                let sealed = crate::store::audit_append::seal_next!(h, record, AuditEvent::Operational, now);
                crate::store::audit_append::InsertRecords::insert_records(&mut *tx, std::slice::from_ref(&sealed))
                    .await?;
                tx.commit().await?;
                true
            }};
        }
        let moved = match &self.pool {
            Pool::Sqlite(p) => run_in!(p, "BEGIN IMMEDIATE", false),
            Pool::Postgres(p) => run_in!(p, "BEGIN", true),
        };
        Ok(moved)
    }

    /// Approves a waiting proposal as `by` (`iss#sub`), who holds the platform role when
    /// `platform` (the operator's CLI does): refused for its proposer, then for anyone without
    /// the platform role (both audited); superseded when its base version is no longer the
    /// newest; otherwise stored as the next registry version, in one transaction with the
    /// status change and audit record.
    pub async fn approve_proposal(
        &self,
        id: &str,
        by: &str,
        reason: &str,
        platform: bool,
    ) -> Result<ApproveOutcome, ProposalError> {
        let proposal = self.get_proposal(id).await?;
        if proposal.status != ProposalStatus::Proposed {
            return Ok(ApproveOutcome::NotPending(proposal.status));
        }
        if proposal.proposer == by {
            self.append_audit(&audit_record(
                &proposal,
                "refused_own",
                by,
                &[(
                    "why",
                    json!("the proposer cannot approve their own proposal"),
                )],
            ))
            .await?;
            return Ok(ApproveOutcome::OwnProposal);
        }
        if !platform {
            self.append_audit(&audit_record(
                &proposal,
                "refused_platform",
                by,
                &[(
                    "why",
                    json!("applying a registry change needs the platform admin role"),
                )],
            ))
            .await?;
            return Ok(ApproveOutcome::NotPlatform);
        }
        let current = self.current_bundle().await?;
        let applied = match &current {
            Some((version, sources)) if *version == proposal.base_version => {
                let new_sources =
                    apply_changes(sources, &proposal.changes).map_err(ProposalError::Invalid)?;
                let new = Bundle::load(new_sources.clone())
                    .map_err(|e| ProposalError::Invalid(e.to_string()))?;
                let diff = version_diff(Some((*version, sources)), &new.registry, &new_sources)
                    .map_err(|e| ProposalError::Invalid(e.to_string()))?;
                Some((version + 1, new_sources, diff))
            }
            _ => None,
        };
        let now = self.clock.now_ms();
        if let Some((version, sources, diff)) = &applied {
            let created_by = format!(
                "admin:{by} (proposal {} by {})",
                proposal.id, proposal.proposer
            );
            let record = audit_record(
                &proposal,
                "approved",
                by,
                &[
                    ("reason", json!(reason)),
                    ("applied_version", json!(version)),
                ],
            );
            match self
                .close_proposal(
                    id,
                    ProposalStatus::Approved,
                    by,
                    reason,
                    Some((*version, sources, &created_by, diff)),
                    &record,
                    now,
                )
                .await
            {
                Ok(true) => return Ok(ApproveOutcome::Applied { version: *version }),
                Ok(false) => {
                    return Ok(ApproveOutcome::NotPending(
                        self.get_proposal(id).await?.status,
                    ));
                }
                // Another version was stored first: fall through to superseded.
                Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let newest = self.registry_version().await?;
        let record = audit_record(
            &proposal,
            "superseded",
            by,
            &[("current_version", json!(newest))],
        );
        let moved = self
            .close_proposal(
                id,
                ProposalStatus::Superseded,
                by,
                &format!(
                    "base version {} is no longer current ({})",
                    proposal.base_version,
                    newest.map_or("none".into(), |v| format!("now {v}"))
                ),
                None,
                &record,
                now,
            )
            .await?;
        if !moved {
            return Ok(ApproveOutcome::NotPending(
                self.get_proposal(id).await?.status,
            ));
        }
        Ok(ApproveOutcome::Superseded { current: newest })
    }

    /// A switch's value, who set it and when (Unix ms), if set.
    pub async fn switch_detail(
        &self,
        name: &str,
    ) -> Result<Option<(String, String, i64)>, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as("SELECT value, set_by, set_at FROM switches WHERE name = $1")
                .bind(name)
                .fetch_optional(p)
                .await?
        }))
    }
}
