//! What the caller hears: the answers of the pipeline's stages, how a stage hands on or
//! ends the call ([`Flow`], [`next!`]), and an internal failure (never shown to the caller).

use countersign_core::store::Step;
use countersign_core::{StepStatus, StoreError};
use serde_json::{Value, json};
/// What the caller hears.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The tool does not exist for this role.
    UnknownTool,
    /// A tool result: `error` = refused or failed; `structured` = the structured content.
    Result {
        /// Whether the result is an error result.
        error: bool,
        /// Structured content.
        structured: Value,
    },
}

/// An internal failure; the caller only ever hears "internal error".
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Internal(pub(super) String);

impl From<StoreError> for Internal {
    fn from(e: StoreError) -> Self {
        Internal(format!("store: {e}"))
    }
}

pub(super) fn ok(structured: Value) -> Answer {
    Answer::Result {
        error: false,
        structured,
    }
}

pub(super) fn err(structured: Value) -> Answer {
    Answer::Result {
        error: true,
        structured,
    }
}

/// What a stage hands on: `Continue` with what the next stage needs, or `Break` with the
/// call's answer.
pub(super) type Flow<T> = Result<std::ops::ControlFlow<Answer, T>, Internal>;

/// Takes a stage's [`Flow`]: its value, or returns its answer from the calling function.
macro_rules! next {
    ($flow:expr) => {
        match $flow? {
            std::ops::ControlFlow::Continue(value) => value,
            std::ops::ControlFlow::Break(answer) => return Ok(answer),
        }
    };
}
pub(super) use next;

pub(super) fn waiting(step: &Step) -> Answer {
    ok(json!({
        "status": "needs_approval",
        "step_id": step.id,
        "expires_at": step.expires_at.map(rfc3339),
        "rule": step.rule,
    }))
}

pub(super) fn expired(step: &Step) -> Answer {
    err(json!({"status": "expired", "step_id": step.id, "rule": APPROVAL_EXPIRED}))
}

/// The stored outcome of a finished step, as the caller first heard it.
pub fn stored_outcome(step: &Step) -> Answer {
    let parsed = step
        .outcome
        .as_deref()
        .and_then(|o| serde_json::from_str::<Value>(o).ok());
    match parsed {
        Some(Value::Object(mut o)) => {
            let error = o.remove("error").and_then(|e| e.as_bool()).unwrap_or(false);
            let structured = o.remove("answer").unwrap_or(Value::Null);
            Answer::Result { error, structured }
        }
        _ => match step.status {
            StepStatus::Unknown => ok(json!({"status": "unknown", "step_id": step.id})),
            _ => err(json!({"status": step.status.as_str(), "step_id": step.id,
                            "rule": step.rule})),
        },
    }
}

/// The text stored in `steps.outcome` for `answer`.
pub(super) fn outcome_text(answer: &Answer) -> Option<String> {
    match answer {
        Answer::Result { error, structured } => {
            Some(json!({"error": error, "answer": structured}).to_string())
        }
        Answer::UnknownTool => None,
    }
}

pub(super) fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// The gate's window closed before anyone approved.
pub const APPROVAL_EXPIRED: &str = "approval.expired";
