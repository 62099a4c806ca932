//! Stage 4a: the run a call belongs to (its own named run, else its MCP session's).

use super::answer::Internal;
use super::ctx::Ctx;
use countersign_core::StoreError;
use countersign_core::store::{NewRun, Run};
use sha2::{Digest, Sha256};

/// The run this call belongs to: the caller's own run named in `_meta.run_id`, else the run
/// of its MCP session (or of its direct calls when it has no session).
pub(super) async fn resolve_run(ctx: &Ctx<'_>, requested: Option<&str>) -> Result<Run, Internal> {
    let credential = &ctx.caller.credential;
    if let Some(id) = requested {
        match ctx.state.store.get_run(id).await {
            Ok(run) if run.agent_id.as_deref() == Some(credential.id.as_str()) => return Ok(run),
            Ok(_) | Err(StoreError::NotFound) => {
                tracing::info!(agent = %credential.id, "ignoring _meta.run_id the caller does not own");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let mut h = Sha256::new();
    h.update(credential.id.as_bytes());
    h.update([0]);
    h.update(ctx.caller.session.as_deref().unwrap_or("direct").as_bytes());
    let session_key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let task = match &ctx.caller.session {
        Some(_) => format!("MCP session of agent {}", credential.name),
        None => format!("direct calls of agent {}", credential.name),
    };
    let run = ctx
        .state
        .store
        .session_run(
            &session_key,
            &NewRun {
                tenant: credential.tenant.clone(),
                principal: format!("agent:{}", credential.id),
                agent_id: Some(credential.id.clone()),
                task,
                // The operator's word on where this agent's tasks come from; never the model's.
                origin: credential.origin.clone(),
                planned: false,
            },
        )
        .await?;
    if let Some(key) = ctx
        .caller
        .admission
        .as_ref()
        .and_then(|a| a.hint_key.as_deref())
    {
        ctx.state
            .store
            .remember_call_hint(key, &credential.id, &run.id);
    }
    Ok(run)
}
