//! Shared domain vocabulary: effect classes, gates, step statuses and policy decisions.
//!
//! These are exhaustive enums; code matching on them lists every arm (no `_ =>`), so a
//! new variant is a compile error everywhere it matters.

use serde::{Deserialize, Serialize};

/// What a tool does to the world. Data the orchestrator reads, never prose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Reads only; safe to retry.
    Read,
    /// Changes state that can be undone (a compensating tool exists or the change is benign).
    Write,
    /// Cannot be undone once it has happened (a payment, a sent message).
    Irreversible,
}

impl Effect {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Irreversible => "irreversible",
        }
    }

    /// Parses the stored text.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "read" => Some(Self::Read),
            "write" => Some(Self::Write),
            "irreversible" => Some(Self::Irreversible),
            _ => None,
        }
    }
}

/// When a person must countersign a call of the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// Never gated (policy may still deny).
    Never,
    /// Always gated.
    Always,
    /// Policy decides per call.
    Policy,
}

/// The status of one step of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Waiting to be executed.
    Pending,
    /// Claimed by a worker.
    Running,
    /// Parked at a gate until a person decides.
    NeedsApproval,
    /// Executed; the outcome is stored.
    Done,
    /// Failed; retryable when the effect allows and attempts remain.
    Failed,
    /// Refused by policy or validation; never runs.
    Refused,
    /// An irreversible call timed out after being sent; must be reconciled by key.
    Unknown,
    /// Cancelled before it ran.
    Cancelled,
    /// Its gate expired; fails closed.
    Expired,
}

impl StepStatus {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::NeedsApproval => "needs_approval",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Refused => "refused",
            Self::Unknown => "unknown",
            Self::Cancelled => "cancelled",
            Self::Expired => "expired",
        }
    }

    /// Parses the stored text.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "needs_approval" => Self::NeedsApproval,
            "done" => Self::Done,
            "failed" => Self::Failed,
            "refused" => Self::Refused,
            "unknown" => Self::Unknown,
            "cancelled" => Self::Cancelled,
            "expired" => Self::Expired,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_text_round_trips() {
        for e in [Effect::Read, Effect::Write, Effect::Irreversible] {
            assert_eq!(Effect::parse(e.as_str()), Some(e));
        }
        assert_eq!(Effect::parse("destructive"), None);
        for s in [
            StepStatus::Pending,
            StepStatus::Running,
            StepStatus::NeedsApproval,
            StepStatus::Done,
            StepStatus::Failed,
            StepStatus::Refused,
            StepStatus::Unknown,
            StepStatus::Cancelled,
            StepStatus::Expired,
        ] {
            assert_eq!(StepStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(StepStatus::parse("paused"), None);
    }
}
