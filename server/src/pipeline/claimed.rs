//! The executor's entry: a planned step claimed by a worker runs on its own credential.

use super::answer::Answer;
use super::answer::Flow;
use super::answer::Internal;
use super::answer::err;
use super::answer::next;
use super::caller::Admission;
use super::caller::COMPENSATOR;
use super::caller::Caller;
use super::ctx::Ctx;
use super::ctx::detail;
use super::execute::execute;
use super::schema::schema_errors;
use crate::AppState;
use crate::provenance::Provenance;
use crate::registry::Loaded;
use countersign_core::Store;
use countersign_core::audit::{AuditEvent, NewAuditRecord};
use countersign_core::registry::Tool;
use countersign_core::store::{
    AgentCredential, AuthError, CallContext, Run, Step, StepDuties, Transition,
};
use countersign_core::{CanonicalJson, RoleName, Rule, StepStatus, StoreError};
use serde_json::{Map, Value, json};
use std::ops::ControlFlow::{Break, Continue};
use std::sync::atomic::AtomicBool;

/// What an executor read with its claim ([`Store::planned_call`]).
///
/// [`Store::planned_call`]: countersign_core::Store::planned_call
#[derive(Debug, Clone, Default)]
pub struct Prefetched {
    /// The credential the step runs on, as stored (its assignee, else the run's agent).
    pub agent: Option<AgentCredential>,
    /// That credential's call context.
    pub context: Option<CallContext>,
    /// The step's duties, if it has any.
    pub duties: Option<StepDuties>,
    /// The run's agent as `(revoked_at, expires_at)`, if it was read.
    pub planner_ends: Option<(Option<i64>, Option<i64>)>,
}

/// Executes a step an executor worker claimed from a planned run: the same policy, gate,
/// key and adapter path as an agent's call, on the credential of the step's role minted for
/// its run (never another role's credential with its role swapped).
pub async fn execute_claimed(
    state: &AppState,
    step: Step,
    worker: &str,
) -> Result<Answer, Internal> {
    let run = state.store.get_run(&step.run_id).await?;
    execute_claimed_in(state, run, step, worker, None, None).await
}

/// [`execute_claimed`] with the step's run as the caller read it after the claim (its status
/// is read again before the step starts) and, if it read them too ([`Store::planned_call`]),
/// the step's credential as stored, its call context and the step's duties; the credential
/// and context are used only when it is the one the duties name. `closed_done` is set when the step's closing
/// transition moved it to `done` and ended `worker`'s lease in the same write (no release
/// needs to follow).
///
/// [`Store::planned_call`]: countersign_core::Store::planned_call
pub async fn execute_claimed_in(
    state: &AppState,
    run: Run,
    step: Step,
    worker: &str,
    prefetched: Option<Prefetched>,
    closed_done: Option<&AtomicBool>,
) -> Result<Answer, Internal> {
    let store = &state.store;
    let Some(loaded) = state.registry.current() else {
        return Err(Internal("no registry in force".into()));
    };
    let prefetched = match prefetched {
        Some(p) => p,
        None => Prefetched {
            duties: store.step_duties(&step.id).await?,
            ..Prefetched::default()
        },
    };
    let duties = prefetched.duties.clone();
    let (credential, context) =
        next!(step_credential(state, &run, &step, worker, prefetched).await);
    let tool = next!(planned_tool(state, &loaded, &step, worker, duties.as_ref()).await);
    let caller = Caller {
        credential,
        session: None,
        executor: Some(worker.to_string()),
        // The context read with the run, for this run only (`execute` checks the run id).
        admission: context.map(|context| Admission {
            hint_key: None,
            prefetched: Some((run.id.clone(), context)),
        }),
    };
    let ctx = Ctx {
        state,
        caller: &caller,
        loaded: &loaded,
        tool,
        trace_id: uuid::Uuid::new_v4().to_string(),
        // The planned step's trace, from its proposal on.
        trace: step
            .trace_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        provenance: Provenance::default(),
        closed_done,
    };
    let canonical = CanonicalJson::from_canonical_text(&step.inputs)
        .map_err(|e| Internal(format!("stored inputs: {e}")))?;
    execute(&ctx, &run, step, false, true, &canonical).await
}

/// [duties] The step's own credential — the execution credential minted for its run and role,
/// else (a step planned before duties existed) the run's agent — and its call context when the
/// claim read it. Refused (`agent.revoked`, `agent.expired`, `agent.role_mismatch`) when it or
/// its planner's is revoked or expired, or when it is not of the step's role and run.
async fn step_credential(
    state: &AppState,
    run: &Run,
    step: &Step,
    worker: &str,
    prefetched: Prefetched,
) -> Flow<(AgentCredential, Option<CallContext>)> {
    let store = &state.store;
    let agent_id = match prefetched.duties.as_ref().and_then(|d| d.assignee.clone()) {
        Some(assignee) => assignee,
        None => run
            .agent_id
            .clone()
            .ok_or_else(|| Internal(format!("planned run {} has no agent", run.id)))?,
    };
    let (agent, context) = match (prefetched.agent, prefetched.context) {
        (Some(agent), context) if agent.id == agent_id => (agent, context),
        _ => (store.get_agent(&agent_id).await?, None),
    };
    // [credentials] A planned step acts with its own credential: once that is revoked or
    // expired (its run ended, its planner's lapsed), nothing more runs on it (the same check
    // the guard makes on every request).
    let credential = match store.check_credential(agent) {
        Ok(credential) => credential,
        Err(AuthError::Expired(_)) => {
            return refused(store, step, worker, AGENT_EXPIRED, Map::new()).await;
        }
        Err(AuthError::Revoked(_) | AuthError::Unknown) => {
            return refused(store, step, worker, AGENT_REVOKED, Map::new()).await;
        }
    };
    // [credentials] A step on an execution credential stops with its planner's.
    if run.agent_id.as_deref() != Some(agent_id.as_str())
        && let Some(rule) = planner_ended(store, run, prefetched.planner_ends).await?
    {
        return refused(store, step, worker, rule, Map::new()).await;
    }
    // INVARIANT: no role is ever swapped in: the credential holds the step's role, and an
    // execution credential is its own run's.
    if credential.role != step.role
        || credential
            .run_id
            .as_deref()
            .is_some_and(|r| r != run.id.as_str())
    {
        let mut extra = Map::new();
        extra.insert("credential_role".into(), json!(credential.role));
        extra.insert("step_role".into(), json!(step.role));
        return refused(store, step, worker, CREDENTIAL_ROLE, extra).await;
    }
    Ok(Continue((credential, context)))
}

/// Why the run's planner can no longer have its plan run (revoked, gone, or expired), if so;
/// `ends` is its `(revoked_at, expires_at)` when the claim read them.
async fn planner_ended(
    store: &Store,
    run: &Run,
    ends: Option<(Option<i64>, Option<i64>)>,
) -> Result<Option<&'static str>, Internal> {
    let Some(planner) = run.agent_id.as_deref() else {
        return Ok(None);
    };
    let ends = match ends {
        Some(ends) => Some(ends),
        None => match store.get_agent(planner).await {
            Ok(p) => Some((p.revoked_at, p.expires_at)),
            Err(StoreError::NotFound) => None,
            Err(e) => return Err(e.into()),
        },
    };
    let now = store.clock().now_ms();
    Ok(match ends {
        None | Some((Some(_), _)) => Some(AGENT_REVOKED),
        Some((None, Some(until))) if until <= now => Some(AGENT_EXPIRED),
        Some((None, _)) => None,
    })
}

/// The step's tool as the registry in force lists it for the step's role, when the step may
/// still run on it: reviewed where its tool (or its duties) ask for a model review, and its
/// stored inputs valid under the schema in force now (a registry that tightened a tool's
/// schema since planning refuses the planned inputs as it would a direct call).
async fn planned_tool<'a>(
    state: &AppState,
    loaded: &'a Loaded,
    step: &Step,
    worker: &str,
    duties: Option<&StepDuties>,
) -> Flow<&'a Tool> {
    let store = &state.store;
    let role = RoleName::parse(&step.role).map_err(|e| Internal(e.to_string()))?;
    let Some(tool) = loaded.bundle.registry.tool_for_role(&role, &step.tool) else {
        // The registry changed since planning: the tool no longer exists for this role.
        let rule = Rule::TOOL_NOT_LISTED.as_str();
        return refused(store, step, worker, rule, Map::new()).await;
    };
    // [review] The claim already skips a step that waits for its review; this also refuses a
    // step planned before its tool asked for review: it was never reviewed.
    let reviewed =
        duties.is_some_and(|d| d.reviewed_hash.as_deref() == Some(step.inputs_hash.as_str()));
    let review_asked = tool.review_required || duties.is_some_and(|d| d.review_required);
    if review_asked && !reviewed && worker != COMPENSATOR {
        return refused(store, step, worker, REVIEW_REQUIRED, Map::new()).await;
    }
    let stored: Value =
        serde_json::from_str(&step.inputs).map_err(|e| Internal(format!("stored inputs: {e}")))?;
    if let Err(errors) = loaded.bundle.registry.validate(&tool.name, &stored) {
        let errors = detail(&[("errors", json!(schema_errors(&errors)))]);
        return refused(store, step, worker, Rule::INPUT_SCHEMA.as_str(), errors).await;
    }
    Ok(Continue(tool))
}

/// [`refuse_claimed`] as a stage's end.
async fn refused<T>(
    store: &Store,
    step: &Step,
    worker: &str,
    rule: &str,
    extra: Map<String, Value>,
) -> Flow<T> {
    Ok(Break(
        refuse_claimed(store, step, worker, rule, extra).await?,
    ))
}

/// Refuses a claimed planned step before it starts (`rule`, with `extra` in its record).
pub(super) async fn refuse_claimed(
    store: &countersign_core::Store,
    step: &Step,
    worker: &str,
    rule: &str,
    extra: Map<String, Value>,
) -> Result<Answer, Internal> {
    let record = NewAuditRecord {
        event: Some(AuditEvent::Refused),
        run_id: Some(step.run_id.clone()),
        step_id: Some(step.id.clone()),
        tool: Some(step.tool.clone()),
        actor: Some(format!("executor:{worker}")),
        rule: Some(rule.into()),
        detail: extra,
        tenant: None,
    };
    store
        .transition(&Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending],
            to: Some(StepStatus::Refused),
            rule: Some(rule.into()),
            records: vec![(AuditEvent::Refused, record)],
            ..Transition::default()
        })
        .await?;
    Ok(err(json!({"status": "refused", "rule": rule})))
}

/// A planned step's agent credential was revoked before the step started.
pub const AGENT_REVOKED: &str = "agent.revoked";

/// A planned step's agent credential expired before the step started.
pub const AGENT_EXPIRED: &str = "agent.expired";

/// A planned step of a tool that asks for review was not reviewed for these inputs.
pub const REVIEW_REQUIRED: &str = "review.required";

/// A planned step's credential is not of its role (or of its run): nothing swaps a role in.
pub const CREDENTIAL_ROLE: &str = "agent.role_mismatch";
