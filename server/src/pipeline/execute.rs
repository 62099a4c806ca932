//! Stages 5–12 for a step that may run: policy, gate, key, adapter, outcome.

use super::adapter;
use super::answer::Answer;
use super::answer::Internal;
use super::answer::next;
use super::ctx::Ctx;
use super::gate;
use super::halt::cancel_halted;
use super::halt::halt_guard;
use super::halt::halt_rule;
use super::halt::write_prepared;
use super::key;
use super::key::Start;
use super::policy::Decided;
use super::policy::decide;
use countersign_core::CanonicalJson;
use countersign_core::store::CallContext;
use countersign_core::store::{Run, Step};

/// Runs `step` through policy, gate, key and adapter. `fresh`: the step was made by this
/// very call (so no approval can name it yet). `written`: its row exists; a prepared read's
/// (`false`, [`Store::prepare_read`]) is written by its closing transition, or here first
/// when it is parked or refused before it runs.
///
/// [`Store::prepare_read`]: countersign_core::Store::prepare_read
pub(super) async fn execute(
    ctx: &Ctx<'_>,
    run: &Run,
    step: Step,
    fresh: bool,
    written: bool,
    canonical: &CanonicalJson,
) -> Result<Answer, Internal> {
    // [stop] A step starts only in an active run and while the emergency stop is off, read
    // now, not when the call began (a cancel may have raced it).
    let world = world(ctx, run).await?;
    if let Some(rule) = halt_rule(
        &halt_guard(ctx, &run.id),
        world.run_status,
        world.switch_set,
    ) {
        let step = write_prepared(ctx, step, written).await?;
        return cancel_halted(ctx, &step, rule).await;
    }
    let arguments = canonical
        .to_value()
        .map_err(|e| Internal(format!("canonical arguments: {e}")))?;
    // 5. Policy, decided here whatever was decided before.
    let decided = decide(ctx, run, &step, fresh, canonical, &arguments, &world).await?;
    // A prepared read that is refused or parked is written now (it does not run).
    let (step, written) = if decided.stops_here() {
        (write_prepared(ctx, step, written).await?, true)
    } else {
        (step, written)
    };
    // Deny: refused for good. 6. Gate: parked unless an approval binds exactly these inputs.
    let decided = next!(gate::refuse_or_park(ctx, run, &step, decided).await);
    // 7. Take the step and reserve its key (or find an earlier attempt's).
    let Decided {
        name,
        rule,
        approval,
        record,
        movable,
        ..
    } = decided;
    let start = Start {
        name,
        rule,
        record,
        movable,
    };
    let taken = next!(key::take(ctx, run, step, start, written).await);
    // 9–12. The adapter under the key, with the approval reference; its outcome recorded.
    let approval = approval.map(|a| a.id);
    adapter::call(ctx, run, taken, approval, world.party, arguments).await
}

/// One read of the world for this call: the run's status, the stop, the party the credential
/// acts for and the grants it holds ([stillon] seed 004: ownership and the ≤ 30-minute grant
/// are checked against the traveller) — what the executor read with its claim, when it did.
/// Compensations run in the run that failed (that is why they run); Countersign's own run
/// tools start nothing, so a stop leaves agents able to look and to cancel.
async fn world(ctx: &Ctx<'_>, run: &Run) -> Result<CallContext, Internal> {
    let prefetched = ctx
        .caller
        .admission
        .as_ref()
        .and_then(|a| a.prefetched.as_ref())
        .filter(|(run_id, _)| *run_id == run.id)
        .map(|(_, context)| context.clone());
    if let Some(world) = prefetched {
        return Ok(world);
    }
    let store = &ctx.state.store;
    let credential = &ctx.caller.credential;
    Ok(store
        .call_context(
            &run.id,
            super::halt::EMERGENCY_STOP,
            &credential.tenant,
            // An execution credential acts for whoever its run's planner acts for now.
            match (&credential.run_id, &run.agent_id) {
                (Some(_), Some(planner)) => planner,
                _ => &credential.id,
            },
            store.clock().now_ms(),
        )
        .await?)
}
