//! A run as stored: its lifecycle, what opens one, and its row.

use serde::{Deserialize, Serialize};

use super::error::StoreError;

/// The lifecycle of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Steps may still be proposed or executed.
    Active,
    /// Every step reached a final state successfully.
    Done,
    /// A step failed and the run stopped.
    Failed,
    /// Cancelled by its agent or a person.
    Cancelled,
    /// Halted by the emergency stop.
    Stopped,
}

impl RunStatus {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Stopped => "stopped",
        }
    }

    /// Parses the stored text.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "active" => Self::Active,
            "done" => Self::Done,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            "stopped" => Self::Stopped,
            _ => return None,
        })
    }
}

/// What is needed to open a run.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// The tenant every step of the run is confined to.
    pub tenant: String,
    /// Who the run acts for (never its approver).
    pub principal: String,
    /// The agent credential that opened it, if an agent did.
    pub agent_id: Option<String>,
    /// The task, as the agent or person stated it.
    pub task: String,
    /// Where the task came from (`user`, `schedule`, `monitor`, `external`).
    pub origin: String,
    /// A plan the executor runs step by step (`plan.submit`), not an agent's direct calls.
    pub planned: bool,
}

/// A stored run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Run {
    /// Run id (UUID text).
    pub id: String,
    /// Tenant.
    pub tenant: String,
    /// Who the run acts for.
    pub principal: String,
    /// Opening agent credential.
    pub agent_id: Option<String>,
    /// Task text.
    pub task: String,
    /// Lifecycle status.
    pub status: RunStatus,
    /// Set when a step failed closed on changed state and the plan must be redone.
    pub replan: bool,
    /// Where the task came from (`user`, `schedule`, `monitor`, `external`).
    pub origin: String,
    /// Executed by the executor workers, step by step.
    pub planned: bool,
    /// Why it stopped, if it did.
    pub reason: String,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
}

#[derive(sqlx::FromRow)]
pub(super) struct RunRow {
    id: String,
    tenant: String,
    principal: String,
    agent_id: Option<String>,
    task: String,
    status: String,
    replan: bool,
    origin: String,
    planned: bool,
    reason: String,
    created_at: i64,
    updated_at: i64,
}

impl TryFrom<RunRow> for Run {
    type Error = StoreError;
    fn try_from(r: RunRow) -> Result<Self, StoreError> {
        let status = RunStatus::parse(&r.status)
            .ok_or_else(|| StoreError::Conflict(format!("unknown run status {:?}", r.status)))?;
        Ok(Run {
            id: r.id,
            tenant: r.tenant,
            principal: r.principal,
            agent_id: r.agent_id,
            task: r.task,
            status,
            replan: r.replan,
            origin: r.origin,
            planned: r.planned,
            reason: r.reason,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

pub(super) const RUN_COLUMNS: &str = "id, tenant, principal, agent_id, task, status, replan, origin, planned, reason, created_at, updated_at";
