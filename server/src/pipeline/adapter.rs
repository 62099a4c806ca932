//! Stage 9: the adapter, under the step's key, with the approval reference (its outcome is
//! recorded by stages 10–12, `outcome`). The state the
//! step was planned on must still hold before the call, and an accepted call's effect must
//! show on read-back ([revalidation]; either failure fails closed); a timed-out call becomes
//! `unknown` or retryable by its effect, never a success. The outcome is recorded with the
//! step's status, the key's stored result and the audit records in one transaction.

use super::answer::Answer;
use super::answer::Internal;
use super::ctx::Ctx;
use super::failpoint::failpoint;
use super::key::Taken;
use super::outcome::finish;
use super::revalidation::fail_closed;
use std::time::{Duration, Instant};

use countersign_core::store::Run;
use serde_json::Value;

use crate::adapters::{ADAPTER_TIMEOUT, AdapterError, Invocation};

/// Calls the tool's adapter for the taken step (or Countersign's own run tools) and records
/// the outcome.
pub(super) async fn call(
    ctx: &Ctx<'_>,
    run: &Run,
    taken: Taken,
    approval_token: Option<String>,
    acts_for: Option<String>,
    arguments: Value,
) -> Result<Answer, Internal> {
    let Taken { step, opening } = taken;
    let provider = ctx.tool.handler.provider.as_str();
    let adapter = ctx.loaded.adapters.get(provider);
    if adapter.is_none() && provider != crate::runs::PROVIDER {
        let failure = AdapterError::Refused(format!("provider {provider} is not served"));
        return finish(ctx, &step, opening, Err(failure), Duration::ZERO).await;
    }
    let invocation = Invocation {
        tool: ctx.tool.name.as_str().to_string(),
        operation: ctx.tool.handler.operation.clone(),
        arguments,
        idem_key: step.idem_key.clone(),
        approval_token,
        trace_id: ctx.trace.clone(),
        tenant: run.tenant.clone(),
        acts_for,
        resend: step.attempts > 1,
    };
    // [revalidation] The state the step was planned on must still hold (fails closed, the
    // adapter is not called).
    if adapter.is_some()
        && let Err(failure) =
            crate::revalidate::before(ctx.loaded, ctx.tool, &step, &invocation).await
    {
        return fail_closed(ctx, &step, opening, failure, None).await;
    }
    failpoint("before_call");
    let began = Instant::now();
    let outcome = match adapter {
        Some(adapter) => {
            match tokio::time::timeout(ADAPTER_TIMEOUT, adapter.invoke(&invocation)).await {
                Ok(result) => result,
                Err(_) => Err(AdapterError::Timeout),
            }
        }
        None => crate::runs::invoke(ctx.state, ctx.caller, &invocation).await,
    };
    failpoint("after_call");
    // [revalidation] Read back: an accepted call whose effect does not show is not a success.
    if let Ok(result) = &outcome
        && adapter.is_some()
        && let Err(failure) =
            crate::revalidate::after(ctx.loaded, ctx.tool, &invocation, result).await
    {
        return fail_closed(ctx, &step, opening, failure, Some(result)).await;
    }
    finish(ctx, &step, opening, outcome, began.elapsed()).await
}
