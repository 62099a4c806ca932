//! What a caller declares about a call — the model and prompt revision it says it runs, and
//! the W3C `traceparent` it sent — read bounded from `_meta` and the HTTP header. Recorded as
//! the agent's word (never trusted for a decision); the trace id follows the call's records
//! and is sent to the target.

use serde_json::{Value, json};

/// What a caller declares about the call: recorded as declared, never trusted for a decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance {
    /// The model id the agent says it runs.
    pub model: Option<String>,
    /// The prompt revision the agent says it runs.
    pub prompt_revision: Option<String>,
    /// The trace id of a W3C `traceparent` the client sent (32 lowercase hex digits).
    pub trace_id: Option<String>,
}

/// How much of a declared text is kept.
const DECLARED_MAX: usize = 200;

impl Provenance {
    /// Reads `_meta.model`, `_meta.prompt_revision` and a `traceparent` (from `_meta` or the
    /// HTTP header): each bounded; a malformed `traceparent` is ignored.
    pub fn read(meta: impl Fn(&str) -> Option<String>, header: Option<&str>) -> Self {
        let bounded = |t: String| -> Option<String> {
            let t: String = t.trim().chars().take(DECLARED_MAX).collect();
            (!t.is_empty()).then_some(t)
        };
        Self {
            model: meta("model").and_then(bounded),
            prompt_revision: meta("prompt_revision").and_then(bounded),
            // A malformed `_meta.traceparent` does not hide a valid header.
            trace_id: meta("traceparent")
                .as_deref()
                .and_then(traceparent_trace_id)
                .or_else(|| header.and_then(traceparent_trace_id)),
        }
    }

    /// The `declared` detail of a record: what the agent said, marked as its word.
    pub(crate) fn declared(&self) -> Option<Value> {
        (self.model.is_some() || self.prompt_revision.is_some()).then(|| {
            json!({"model": self.model, "prompt_revision": self.prompt_revision,
                   "source": "declared by the agent, not verified"})
        })
    }
}

/// The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`); `None` when it is
/// malformed or the all-zero id.
pub fn traceparent_trace_id(header: &str) -> Option<String> {
    let mut parts = header.trim().split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let well_formed = hex(version, 2)
        && version != "ff"
        && hex(trace, 32)
        && hex(parent, 16)
        && hex(flags, 2)
        && trace.bytes().any(|b| b != b'0')
        && (version != "00" || parts.next().is_none());
    well_formed.then(|| trace.to_string())
}
