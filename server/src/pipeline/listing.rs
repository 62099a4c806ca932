//! Stage 2: the role's listing. A tool the caller's role does not list does not exist for it:
//! unknown and unlisted get the same answer and the same record.

use super::answer::Answer;
use super::answer::Internal;
use super::caller::Caller;
use super::ctx::bounded;
use super::ctx::detail;
use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::registry::Tool;
use countersign_core::{RoleName, Rule};
use serde_json::json;

use crate::AppState;
use crate::registry::Loaded;

/// The registry in force and `requested` as the caller's role lists it; `None` when the role
/// lists no such tool (or no registry is in force, or the role is no role).
pub(super) fn listed<'a>(
    loaded: Option<&'a Loaded>,
    caller: &Caller,
    requested: &str,
) -> Option<(&'a Loaded, &'a Tool)> {
    let loaded = loaded?;
    let role = RoleName::parse(&caller.credential.role).ok()?;
    let tool = loaded.bundle.registry.tool_for_role(&role, requested)?;
    Some((loaded, tool))
}

/// Records the refusal of an unlisted tool and answers as if it did not exist.
pub(super) async fn refuse_unlisted(
    state: &AppState,
    caller: &Caller,
    requested: &str,
) -> Result<Answer, Internal> {
    let credential = &caller.credential;
    let record = NewAuditRecord {
        event: Some(AuditEvent::Refused),
        run_id: None,
        step_id: None,
        tool: None,
        actor: Some(format!(
            "agent:{} role:{} tenant:{}",
            credential.id, credential.role, credential.tenant
        )),
        rule: Some(Rule::TOOL_NOT_LISTED.as_str().into()),
        detail: detail(&[("requested_tool", json!(bounded(requested)))]),
        tenant: Some(credential.tenant.clone()),
    };
    state.store.append_audit(&record).await?;
    Ok(Answer::UnknownTool)
}
