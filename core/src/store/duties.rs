//! Separation of duties for planned steps (table `step_duties`, migration 0014): the model
//! review a step waits for, and the execution credential it runs on.
//!
//! Invariants (each fails closed):
//! * A step whose duties say `review_required` is not claimed by an executor
//!   ([`Store::claim_step`]) until a reviewer approved exactly its current inputs
//!   (`reviewed_hash = inputs_hash`); the executor checks it again before it runs
//!   ([`StepDuties::awaits_review`]).
//! * A review is recorded only by [`Store::review_step`]: for a pending step that requires
//!   one and has none, naming the step's current inputs hash, by a credential of the step's
//!   tenant that is neither the run's agent (the planner) nor the step's proposer nor an
//!   execution credential. It commits with its audit record (`validated`, rule
//!   `review.approved`) in one transaction, and only if the step still is as read.
//! * An execution credential is minted for one run and one role ([`Store::mint_execution`]):
//!   its token is never shown nor kept (nobody can present it), it inherits the planner's
//!   creator, party, origin and expiry (so the accountable people stay the same), its
//!   creation is audited in the run's trail, and the database revokes it when its run ends
//!   done, cancelled or stopped (trigger `runs_end_revokes_execution_credentials`); a failed
//!   run's are revoked once its compensations ran ([`Store::end_execution_credentials`]).
//! * A run whose step waits for a review past the run's wall-time bound is stopped by a sweep
//!   ([`Store::overdue_reviews`]): an unclaimed step never meets the executor's bound check.
//! * Duties are written before the run is sealed as planned ([`Store::seal_plan`]): no
//!   executor claims a step of a run whose duties are not all written.

use serde_json::{Map, json};

use super::steps::{STEP_COLUMNS, StepRow};
use super::{
    AgentCredential, CreateAgentError, NewAgent, Pool, Run, Step, Store, StoreError, on_pool,
};
use crate::audit::{AuditEvent, NewAuditRecord};
use crate::model::StepStatus;
use crate::policy::TaskOrigin;
use crate::store::standing::write_audited;

/// The audit rule of a model reviewer's approval.
pub const REVIEW_APPROVED_RULE: &str = "review.approved";

/// What separation of duties asks of one planned step.
#[derive(Debug, Clone, PartialEq, Eq, Default, sqlx::FromRow)]
pub struct StepDuties {
    /// The step.
    pub step_id: String,
    /// A model reviewer must approve its exact inputs before it runs.
    pub review_required: bool,
    /// The inputs hash a reviewer approved.
    pub reviewed_hash: Option<String>,
    /// The reviewer's credential id.
    pub reviewed_by: Option<String>,
    /// When (Unix ms).
    pub reviewed_at: Option<i64>,
    /// The execution credential it runs on.
    pub assignee: Option<String>,
}

impl StepDuties {
    /// Whether the step still waits for a reviewer: review required and no approval of
    /// exactly `inputs_hash`.
    pub fn awaits_review(&self, inputs_hash: &str) -> bool {
        self.review_required && self.reviewed_hash.as_deref() != Some(inputs_hash)
    }
}

/// Why a review was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// No such step for this reviewer (another tenant, not planned).
    #[error("no such step")]
    NotFound,
    /// The reviewer is the run's planner, the step's proposer or an execution credential.
    #[error("a step is never reviewed by the credential that planned or proposed it")]
    OwnPlan,
    /// The inputs named are not the step's (they changed, or the reviewer saw others).
    #[error("the step's inputs are not the ones reviewed (inputs_hash differs): nothing recorded")]
    InputsChanged,
    /// The step needs no review, has one, or is no longer pending.
    #[error("step is {0}, not waiting for a model review")]
    NotWaiting(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

const COLUMNS: &str = "step_id, review_required, reviewed_hash, reviewed_by, reviewed_at, assignee";

impl Store {
    /// Mints the execution credential of `run`'s steps in `role` (see the module's
    /// invariants), named `exec:<run>:<role>`.
    pub async fn mint_execution(
        &self,
        run: &Run,
        role: &str,
        planner: &AgentCredential,
    ) -> Result<AgentCredential, CreateAgentError> {
        let new = NewAgent {
            name: format!("exec:{}:{role}", run.id),
            role: role.to_string(),
            tenant: run.tenant.clone(),
            created_by: planner.created_by.clone(),
            expires_at: planner.expires_at,
            acts_for: planner.acts_for.clone(),
            origin: TaskOrigin::parse(&planner.origin).unwrap_or(TaskOrigin::External),
        };
        // The token is dropped here: it was never shown, so nobody can present it.
        let (cred, _token) = self.insert_agent(&new, Some(&run.id), None).await?;
        Ok(cred)
    }

    /// Revokes every execution credential of `run_id` that is not revoked yet (a failed run's,
    /// once its compensations ran). Returns how many.
    pub async fn end_execution_credentials(&self, run_id: &str) -> Result<u64, StoreError> {
        let now = self.clock.now_ms();
        Ok(on_pool!(self, |p| {
            sqlx::query(
                "UPDATE agent_credentials SET revoked_at = $1
                  WHERE run_id = $2 AND revoked_at IS NULL",
            )
            .bind(now)
            .bind(run_id)
            .execute(p)
            .await?
            .rows_affected()
        }))
    }

    /// Pending steps still waiting for their model review in active planned runs created
    /// before `created_before` (Unix ms), oldest run first, at most `limit`: an executor never
    /// claims them, so the run's wall-time bound is enforced on them by a sweep instead.
    pub async fn overdue_reviews(
        &self,
        created_before: i64,
        limit: i64,
    ) -> Result<Vec<Step>, StoreError> {
        let sql = format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE id IN (
               SELECT s.id FROM steps s JOIN runs r ON r.id = s.run_id
                 JOIN step_duties d ON d.step_id = s.id
                WHERE r.status = 'active' AND r.planned AND r.created_at < $1
                  AND s.status = 'pending' AND d.review_required
                  AND (d.reviewed_hash IS NULL OR d.reviewed_hash <> s.inputs_hash))
             ORDER BY created_at, seq LIMIT $2"
        );
        let rows: Vec<StepRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(created_before)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        rows.into_iter().map(Step::try_from).collect()
    }

    /// Planned steps in `status` that credential `caller` of `tenant` may list, oldest first
    /// (`updated_at`, `id`), at most `limit`: steps of runs it planned, steps assigned to it,
    /// or — `reviewer` — every planned step of its tenant; only run `run_id` when given. Every
    /// filter is in the query, before its limit: another tenant's or another worker's steps
    /// never take a place in the page.
    pub async fn listable_steps(
        &self,
        status: StepStatus,
        tenant: &str,
        caller: &str,
        reviewer: bool,
        run_id: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Step>, StoreError> {
        let sql = format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE id IN (
               SELECT s.id FROM steps s JOIN runs r ON r.id = s.run_id
                 LEFT JOIN step_duties d ON d.step_id = s.id
                WHERE s.status = $1 AND r.tenant = $2 AND r.planned
                  AND (CAST($3 AS TEXT) IS NULL OR s.run_id = $3)
                  AND (r.agent_id = $4 OR d.assignee = $4 OR $5))
             ORDER BY updated_at, id LIMIT $6"
        );
        let rows: Vec<StepRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(status.as_str())
                .bind(tenant)
                .bind(run_id)
                .bind(caller)
                .bind(reviewer)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        rows.into_iter().map(Step::try_from).collect()
    }

    /// Writes `step_id`'s duties (once; a second write for the same step is refused).
    pub async fn set_step_duties(
        &self,
        step_id: &str,
        review_required: bool,
        assignee: Option<&str>,
    ) -> Result<(), StoreError> {
        on_pool!(self, |p| {
            sqlx::query(
                "INSERT INTO step_duties (tenant, step_id, review_required, assignee)
                 VALUES ((SELECT tenant FROM steps WHERE id = $1), $1, $2, $3)",
            )
            .bind(step_id)
            .bind(review_required)
            .bind(assignee)
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(())
    }

    /// [duties] Puts step `step_id` on credential `assignee`, replacing the one its duties
    /// named (a person's undo of a failed run's write runs its compensation again on a
    /// credential minted for that undo).
    pub async fn assign_step(&self, step_id: &str, assignee: &str) -> Result<(), StoreError> {
        let n = on_pool!(self, |p| {
            sqlx::query("UPDATE step_duties SET assignee = $2 WHERE step_id = $1")
                .bind(step_id)
                .bind(assignee)
                .execute(p)
                .await?
                .rows_affected()
        });
        if n == 0 {
            self.set_step_duties(step_id, false, Some(assignee)).await?;
        }
        Ok(())
    }

    /// Marks `run_id` as planned: from now on its steps are the executor's to claim. Called
    /// once every step and its duties are written. [`StoreError::Conflict`] when the run is
    /// no longer active (stopped meanwhile): its execution credentials are ended.
    pub async fn seal_plan(&self, run_id: &str) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        let sealed = on_pool!(self, |p| {
            sqlx::query(
                "UPDATE runs SET planned = TRUE, updated_at = $1 WHERE id = $2 AND status = 'active'",
            )
            .bind(now)
            .bind(run_id)
            .execute(p)
            .await?
            .rows_affected()
        });
        if sealed != 1 {
            self.end_execution_credentials(run_id).await?;
            return Err(StoreError::Conflict(format!(
                "run {run_id} ended before its plan was sealed"
            )));
        }
        Ok(())
    }

    /// A step's duties; `None` when it has none (not planned, or planned before duties).
    pub async fn step_duties(&self, step_id: &str) -> Result<Option<StepDuties>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM step_duties WHERE step_id = $1");
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(step_id).fetch_optional(p).await?
        }))
    }

    /// Records `reviewer`'s approval of `step_id` as a model review of exactly `inputs_hash`
    /// (see the module's invariants), with `reason` in its audit record.
    pub async fn review_step(
        &self,
        step_id: &str,
        inputs_hash: &str,
        reviewer: &AgentCredential,
        reason: &str,
    ) -> Result<StepDuties, ReviewError> {
        let step = match self.get_step(step_id).await {
            Ok(s) => s,
            Err(StoreError::NotFound) => return Err(ReviewError::NotFound),
            Err(e) => return Err(e.into()),
        };
        let run = self.get_run(&step.run_id).await?;
        if run.tenant != reviewer.tenant || !run.planned {
            return Err(ReviewError::NotFound);
        }
        // INVARIANT: the planner (and the proposer, and any execution credential) never
        // reviews: the reviewer must be another identity.
        if run.agent_id.as_deref() == Some(reviewer.id.as_str())
            || step.agent_id.as_deref() == Some(reviewer.id.as_str())
            || reviewer.run_id.is_some()
        {
            return Err(ReviewError::OwnPlan);
        }
        if step.inputs_hash != inputs_hash {
            return Err(ReviewError::InputsChanged);
        }
        let duties = self.step_duties(step_id).await?.unwrap_or_default();
        if step.status != StepStatus::Pending || !duties.awaits_review(inputs_hash) {
            let why = if duties.review_required {
                step.status.as_str().to_string()
            } else {
                format!("{} and needs no model review", step.status.as_str())
            };
            return Err(ReviewError::NotWaiting(why));
        }
        let now = self.clock.now_ms();
        let mut detail = Map::new();
        detail.insert("review".into(), json!("approve"));
        detail.insert("reason".into(), json!(reason));
        detail.insert("inputs_hash".into(), json!(inputs_hash));
        detail.insert("reviewer".into(), json!(reviewer.name));
        let audit = NewAuditRecord {
            event: Some(AuditEvent::Validated),
            run_id: Some(step.run_id.clone()),
            step_id: Some(step.id.clone()),
            tool: Some(step.tool.clone()),
            actor: Some(format!("agent:{} role:{}", reviewer.id, reviewer.role)),
            rule: Some(REVIEW_APPROVED_RULE.into()),
            detail,
            tenant: None,
        };
        // Only while the step is pending with exactly these inputs and no review yet.
        let written = write_audited!(
            self,
            audit,
            AuditEvent::Validated,
            now,
            sqlx::query(
                "UPDATE step_duties SET reviewed_hash = $1, reviewed_by = $2, reviewed_at = $3
                  WHERE step_id = $4 AND review_required AND reviewed_hash IS NULL
                    AND EXISTS (SELECT 1 FROM steps s WHERE s.id = $4
                                   AND s.status = 'pending' AND s.inputs_hash = $1)",
            )
            .bind(inputs_hash)
            .bind(&reviewer.id)
            .bind(now)
            .bind(step_id)
        );
        if !written {
            let now_status = self.get_step(step_id).await?.status;
            return Err(ReviewError::NotWaiting(now_status.as_str().into()));
        }
        Ok(self.step_duties(step_id).await?.unwrap_or_default())
    }
}
