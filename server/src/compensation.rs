//! Compensation: undoing the writes a failed run did, and escalating to a person what cannot be
//! undone here.
//!
//! Invariants:
//! * Compensation runs each earlier `done` write's registry `compensate` tool as a new step of
//!   the run, through the same pipeline (policy, gate, key) as any call, on the credential the
//!   undone step ran on — latest first.
//! * Nothing is left half-done in silence: an irreversible step, a write without a compensating
//!   tool, a compensation that cannot be built, fails or needs a person, and a failed step whose
//!   effect was applied but not confirmed, each become an audited `compensation.escalated`
//!   record, a webhook, a re-plan flag on the run, and an open escalation
//!   ([`crate::escalations`]) a person can act on.
//! * A compensation that needs approval is never left in the inbox of a failed run: it is
//!   cancelled, and the undo goes to the escalations page, where a person's approval of it
//!   goes through the same decision path as any gate.

use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::registry::Tool;
use countersign_core::store::{EscalationKind, NewStep, Step, Transition};
use countersign_core::{CanonicalJson, Effect, StepStatus, StoreError, ToolName};
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::pipeline;

/// A step ended without success: the run fails, and the steps after it are cancelled.
pub(crate) async fn fail_run(
    state: &AppState,
    run_id: &str,
    step: &Step,
    _answer: &crate::pipeline::Answer,
) -> Result<(), StoreError> {
    let reason = format!(
        "step {} ({}) ended {}{}",
        step.seq,
        step.tool,
        step.status.as_str(),
        step.rule
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    );
    crate::runs::cancel_run(
        state,
        run_id,
        "executor",
        &reason,
        countersign_core::store::RunStatus::Failed,
    )
    .await?;
    let compensated = compensate(state, run_id, step).await;
    // [duties] Its compensations ran (or failed): the run's execution credentials end with it.
    state.store.end_execution_credentials(run_id).await?;
    compensated
}

/// Undoes the writes that succeeded before `failed`, latest first, with each tool's registry
/// `compensate` tool — a new step of the run, through the same pipeline, under its own key.
/// An irreversible step, or a write without a compensating tool or whose compensation cannot
/// be built or fails, is escalated to a person (audited, run flagged for re-planning), never
/// silently left. So is `failed` itself when its effect was applied but not confirmed (a
/// read-back that found something else): what the target did is not known well enough to undo.
pub(crate) async fn compensate(
    state: &AppState,
    run_id: &str,
    failed: &Step,
) -> Result<(), StoreError> {
    let store = &state.store;
    let applied = failed
        .outcome
        .as_deref()
        .and_then(|o| serde_json::from_str::<Value>(o).ok())
        .and_then(|o| o.pointer("/answer/effect_applied").and_then(Value::as_bool))
        .unwrap_or(false);
    if applied {
        let why = "its effect was applied but the read-back did not confirm it; a person \
                   decides whether and how to undo it";
        record_compensation(state, run_id, failed, failed, &Err(Escalated::by_hand(why))).await?;
    }
    if state.registry.current().is_none() {
        return Ok(());
    }
    let mut done: Vec<Step> = store
        .steps_for_run(run_id)
        .await?
        .into_iter()
        .filter(|s| s.seq < failed.seq && s.status == StepStatus::Done && s.effect != Effect::Read)
        .collect();
    done.reverse();
    for step in done {
        let outcome = match compensator(state, &step) {
            Some(comp) => {
                let why = format!(
                    "Compensating step {} because step {} ({}) failed",
                    step.seq, failed.seq, failed.tool
                );
                run_compensation(state, &step, &why, &comp).await
            }
            None => Err(Escalated::by_hand(match step.effect {
                Effect::Irreversible => "irreversible: a person must decide",
                _ => "no compensate tool in the registry",
            })),
        };
        record_compensation(state, run_id, &step, failed, &outcome).await?;
    }
    Ok(())
}

/// Why compensation left `step` to a person, and whether a person may ask for its undo (the
/// compensation never reached the target, or failed in a way that may be tried again under
/// its key); otherwise it is handled by hand.
#[derive(Debug, Clone)]
pub(crate) struct Escalated {
    why: String,
    undo: bool,
}

impl Escalated {
    fn by_hand(why: impl Into<String>) -> Self {
        Self {
            why: why.into(),
            undo: false,
        }
    }
}

/// A write of `run`, which ended (failed, cancelled, stopped) while the write's outcome was
/// unknown, turned out `done` (reconciliation or people settled it): nothing undid it when the
/// run ended, so it goes to a person — an undo when its tool has a compensating tool, by hand
/// otherwise. Audited and told like any escalated compensation.
pub(crate) async fn left_after_end(
    state: &AppState,
    run: &countersign_core::store::Run,
    step: &Step,
) -> Result<(), StoreError> {
    if step.effect == Effect::Read || run.status == countersign_core::store::RunStatus::Done {
        return Ok(());
    }
    let why = Escalated {
        why: format!(
            "its outcome was settled as done after its run ended {}: nothing undid it",
            run.status.as_str()
        ),
        undo: true,
    };
    record_compensation(state, &run.id, step, step, &Err(why)).await
}

/// The registry's compensating tool for `step`, when it is a write whose tool names one.
pub(crate) fn compensator(state: &AppState, step: &Step) -> Option<Tool> {
    let loaded = state.registry.current()?;
    let registry = &loaded.bundle.registry;
    let tool = ToolName::parse(&step.tool)
        .ok()
        .and_then(|n| registry.tool(&n))?;
    if step.effect != Effect::Write {
        return None;
    }
    registry.tool(tool.compensate.as_ref()?).cloned()
}

/// Audits what compensation did about `step` after `failed`: the compensating step
/// (`compensation.done`) or why a person must decide (`compensation.escalated`, and the run
/// is flagged for re-planning, the webhooks are told and an escalation is opened: an undo
/// when `step` is a write with a compensating tool, by hand otherwise).
async fn record_compensation(
    state: &AppState,
    run_id: &str,
    step: &Step,
    failed: &Step,
    outcome: &Result<String, Escalated>,
) -> Result<(), StoreError> {
    let (rule, detail_value) = match outcome {
        Ok(comp_id) => ("compensation.done", json!({"compensation_step": comp_id})),
        Err(e) => ("compensation.escalated", json!({"escalated": e.why})),
    };
    let mut detail = Map::new();
    detail.insert("after_failed_step".into(), json!(failed.id));
    detail.insert("outcome".into(), detail_value);
    state
        .store
        .append_audit(&NewAuditRecord {
            event: Some(AuditEvent::Compensated),
            run_id: Some(run_id.to_string()),
            step_id: Some(step.id.clone()),
            tool: Some(step.tool.clone()),
            actor: Some("executor".into()),
            rule: Some(rule.into()),
            detail,
            tenant: None,
        })
        .await?;
    if let Err(e) = outcome {
        state.store.mark_replan(run_id).await?;
        crate::notify::compensation_escalated(state, step, &failed.id);
        // The failed step itself (applied, unconfirmed) is never undone by its compensator:
        // what the target did is not known well enough.
        let unconfirmed = step.id == failed.id && step.status != StepStatus::Done;
        let kind = if e.undo && !unconfirmed && compensator(state, step).is_some() {
            EscalationKind::Undo
        } else {
            EscalationKind::Manual
        };
        state
            .store
            .open_escalation(step, kind, &e.why, "executor")
            .await?;
    }
    Ok(())
}

/// Builds, opens and runs the compensation of `step` with `comp` ([`compensation_args`],
/// [`open_compensation`] on the credential `step` ran on, [`execute_compensation`]). One that
/// needs a person's approval is cancelled (its run has failed: no worker would run it) and
/// answered as an error, for the escalation, as one a person may ask to run; so is one that
/// failed in a way its key lets be tried again. Returns the new step's id.
async fn run_compensation(
    state: &AppState,
    step: &Step,
    why: &str,
    comp: &Tool,
) -> Result<String, Escalated> {
    let args = compensation_args(state, step, why, comp).map_err(Escalated::by_hand)?;
    // [duties] A compensation runs on the credential the step it undoes ran on.
    let assignee = state
        .store
        .step_duties(&step.id)
        .await
        .map_err(|e| Escalated::by_hand(e.to_string()))?
        .and_then(|d| d.assignee);
    let (comp_step, _) = open_compensation(state, step, comp, &args, assignee.as_deref())
        .await
        .map_err(Escalated::by_hand)?;
    let id = comp_step.id.clone();
    let key = comp_step.idem_key.clone();
    match execute_compensation(state, comp_step)
        .await
        .map_err(Escalated::by_hand)?
    {
        StepStatus::Done => Ok(id),
        StepStatus::NeedsApproval => {
            cancel_for_escalation(state, step, &id, comp, "executor")
                .await
                .map_err(Escalated::by_hand)?;
            Err(Escalated {
                why: format!(
                    "its compensation ({}) ended needs_approval, and its run has ended: a \
                     person decides the undo",
                    comp.name
                ),
                undo: true,
            })
        }
        other => {
            // Failed under a key that may be tried again (the target never took it): a person
            // may ask for it; anything else the target answered is final.
            let again = other == StepStatus::Failed
                && match state.store.get_key(&key).await {
                    Ok(None) => true,
                    Ok(Some(k)) => k.state == countersign_core::store::KeyState::Failed,
                    Err(_) => false,
                };
            Err(Escalated {
                why: format!("its compensation ({}) ended {}", comp.name, other.as_str()),
                undo: again,
            })
        }
    }
}

/// The arguments of `step`'s compensation with `comp`, validated against its schema: each of
/// `comp`'s input properties taken from `step`'s result — its `previous_<name>` first (the
/// value the target replaced: undoing restores it), else `<name>` — else from its inputs;
/// `reason` is `why`.
pub(crate) fn compensation_args(
    state: &AppState,
    step: &Step,
    why: &str,
    comp: &Tool,
) -> Result<Value, String> {
    let inputs: Value = serde_json::from_str(&step.inputs).unwrap_or(Value::Null);
    let result: Value = step
        .outcome
        .as_deref()
        .and_then(|o| serde_json::from_str::<Value>(o).ok())
        .and_then(|o| o.get("answer").cloned())
        .unwrap_or(Value::Null);
    let mut args = Map::new();
    if let Some(props) = comp
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
    {
        for name in props.keys() {
            let previous = result.get(format!("previous_{name}").as_str());
            let current = result.get(name).or_else(|| inputs.get(name));
            if name == "reason" {
                args.insert(name.clone(), json!(why));
            } else if let Some(v) = previous.or(current) {
                args.insert(name.clone(), v.clone());
            }
        }
    }
    let args = Value::Object(args);
    let Some(loaded) = state.registry.current() else {
        return Err("no registry in force".into());
    };
    if let Err(errors) = loaded.bundle.registry.validate(&comp.name, &args) {
        return Err(format!(
            "compensation arguments do not fit {}: {}",
            comp.name,
            errors
                .iter()
                .map(|e| format!("{} {}", e.path, e.message))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    Ok(args)
}

/// Opens (pending) the compensation of `step` with `comp` and `args`, to run on credential
/// `assignee` (the step's duties). Returns the step and whether this call opened it (the same
/// inputs in the same run open the same step).
pub(crate) async fn open_compensation(
    state: &AppState,
    step: &Step,
    comp: &Tool,
    args: &Value,
    assignee: Option<&str>,
) -> Result<(Step, bool), String> {
    let store = &state.store;
    let canonical = CanonicalJson::from_value(args).map_err(|e| e.to_string())?;
    let (comp_step, opened) = store
        .open_step(&NewStep {
            run_id: step.run_id.clone(),
            role: step.role.clone(),
            tool: comp.name.as_str().to_string(),
            effect: comp.effect,
            inputs: canonical,
            agent_id: step.agent_id.clone(),
            reason: format!("compensates step {}", step.seq),
            evidence: vec![step.id.clone()],
            observed: None,
            trace_id: uuid::Uuid::new_v4().to_string(),
            status: StepStatus::Pending,
        })
        .await
        .map_err(|e| e.to_string())?;
    if opened && let Some(assignee) = assignee {
        store
            .set_step_duties(&comp_step.id, false, Some(assignee))
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok((comp_step, opened))
}

/// Runs compensation step `comp_step` once through the pipeline (as the compensator) and
/// reads back its status.
pub(crate) async fn execute_compensation(
    state: &AppState,
    comp_step: Step,
) -> Result<StepStatus, String> {
    let id = comp_step.id.clone();
    pipeline::execute_claimed(state, comp_step, pipeline::COMPENSATOR)
        .await
        .map_err(|e| e.to_string())?;
    Ok(state
        .store
        .get_step(&id)
        .await
        .map_err(|e| e.to_string())?
        .status)
}

/// Cancels compensation step `id` (of `step`'s run, at `needs_approval`, or still `pending`
/// when an escalation's undo did not get to run it): its run has ended, so the undo goes to a
/// person on the escalations page instead of the inbox.
pub(crate) async fn cancel_for_escalation(
    state: &AppState,
    step: &Step,
    id: &str,
    comp: &Tool,
    actor: &str,
) -> Result<(), String> {
    let mut detail = Map::new();
    let why = if actor == "executor" {
        "the undo needs a person; escalated"
    } else {
        "the person's undo did not get to run it"
    };
    detail.insert("reason".into(), json!(why));
    state
        .store
        .transition(&Transition {
            step_id: id.to_string(),
            from: vec![StepStatus::NeedsApproval, StepStatus::Pending],
            to: Some(StepStatus::Cancelled),
            rule: Some("compensation.escalated".into()),
            records: vec![(
                AuditEvent::Cancelled,
                NewAuditRecord {
                    event: Some(AuditEvent::Cancelled),
                    run_id: Some(step.run_id.clone()),
                    step_id: Some(id.to_string()),
                    tool: Some(comp.name.as_str().to_string()),
                    actor: Some(actor.to_string()),
                    rule: Some("compensation.escalated".into()),
                    detail,
                    tenant: None,
                },
            )],
            ..Transition::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}
