//! The executor's one-trip read of a claimed planned step: its run, the credential it runs
//! on and that credential's call context, its duties, its planner's ends, and what the run's
//! outcome needs — one statement instead of six.

use super::agents::{AgentCredential, COLUMNS};
use super::run_model::{RUN_COLUMNS, RunRow};
use super::standing::{
    CONTEXT_COLUMNS, CONTEXT_CTE, CONTEXT_GRANTS_JOIN, ContextRow, ContextSql, context_from_rows,
};
use super::{CallContext, Run, StepDuties, Store, StoreError, on_pool};
use crate::audit::{FAILURE_PAGE, RECENT_EVENTS_SQL, parse_recent_events};
use sqlx::{FromRow, Row};

/// What [`Store::planned_call`] reads.
#[derive(Debug, Clone)]
pub struct PlannedCall {
    /// The run.
    pub run: Run,
    /// Its agent's credential as stored, if the run names one that exists.
    pub agent: Option<AgentCredential>,
    /// That agent's context for the call.
    pub context: Option<CallContext>,
    /// The run's newest audit records as `(seq, event)`, newest first, for
    /// [`Store::failures_in_a_row_from`].
    pub recent_events: Option<Vec<(i64, String)>>,
    /// Steps of the run after position `step_seq` that are not done: while any is, the run
    /// is not done when that step ends.
    pub later_open: i64,
    /// The step's duties, when it has any (its credential is then the assignee's).
    pub duties: Option<StepDuties>,
    /// The run's agent (the planner) as `(revoked_at, expires_at)`, when it exists: a step
    /// on an execution credential stops with its planner's.
    pub planner_ends: Option<(Option<i64>, Option<i64>)>,
}

/// The `step_duties` columns, in [`StepDuties`]' order.
const DUTY_COLUMNS: &str =
    "step_id, review_required, reviewed_hash, reviewed_by, reviewed_at, assignee";

impl Store {
    /// What an executor reads before a planned step of run `run_id`, in ONE statement: the
    /// run, the step's duties (at position `step_seq`), the credential it runs on as stored
    /// — its assignee, else the run's agent — (not checked: see [`Store::check_credential`]),
    /// that agent's [`CallContext`] ([`Store::call_context`] with the credential's tenant
    /// and id; `None` without a credential), the run's newest audit records (the first
    /// page [`Store::failures_in_a_row`] reads) and how many of its steps after `step_seq`
    /// are not done. [`StoreError::NotFound`] when the run does not
    /// exist.
    pub async fn planned_call(
        &self,
        run_id: &str,
        step_seq: i64,
        switch: &str,
    ) -> Result<PlannedCall, StoreError> {
        let now = self.clock.now_ms();
        let sql = ContextSql {
            tenant: "(SELECT tenant FROM c)",
            switch: "$2",
            // The party and grants are the run's agent's (the planner's, read live; an
            // execution credential acts for whoever its planner acts for now).
            agent: "COALESCE((SELECT id FROM pc), (SELECT id FROM c))",
            now: "$3",
        }
        .fill(&format!(
            "WITH r AS (SELECT {RUN_COLUMNS}, {recent} AS recent_events,
                             (SELECT COUNT(*) FROM steps s WHERE s.run_id = runs.id
                                 AND s.seq > $4 AND s.status <> 'done') AS later_open
                              FROM runs WHERE id = $1),
                      d AS (SELECT {DUTY_COLUMNS} FROM step_duties
                             WHERE step_id = (SELECT id FROM steps
                                               WHERE run_id = $1 AND seq = $4)),
                      pc AS (SELECT id, revoked_at, expires_at FROM agent_credentials
                              WHERE id = (SELECT agent_id FROM r)),
                      c AS (SELECT {COLUMNS} FROM agent_credentials
                             WHERE id = COALESCE((SELECT assignee FROM d),
                                                 (SELECT agent_id FROM r))),
                      {CONTEXT_CTE}
                 SELECT r.*, c.id AS c_id, c.name AS c_name, c.role AS c_role,
                        c.tenant AS c_tenant, c.created_by AS c_created_by,
                        c.created_at AS c_created_at, c.expires_at AS c_expires_at,
                        c.revoked_at AS c_revoked_at, c.acts_for AS c_acts_for,
                        c.origin AS c_origin, c.run_id AS c_run_id, {CONTEXT_COLUMNS},
                        (SELECT step_id FROM d) AS d_step_id,
                        (SELECT review_required FROM d) AS d_review_required,
                        (SELECT reviewed_hash FROM d) AS d_reviewed_hash,
                        (SELECT reviewed_by FROM d) AS d_reviewed_by,
                        (SELECT reviewed_at FROM d) AS d_reviewed_at,
                        (SELECT assignee FROM d) AS d_assignee,
                        (SELECT id FROM pc) AS pc_id,
                        (SELECT revoked_at FROM pc) AS pc_revoked_at,
                        (SELECT expires_at FROM pc) AS pc_expires_at
                   FROM r LEFT JOIN c ON 1 = 1 {CONTEXT_GRANTS_JOIN}
                  ORDER BY s.granted_at, s.id",
            recent = RECENT_EVENTS_SQL
                .replace("{run}", "runs.id")
                .replace("{limit}", &FAILURE_PAGE.to_string()),
        ));
        macro_rules! decode {
            ($rows:expr) => {{
                let mut run: Option<RunRow> = None;
                let mut agent: Option<AgentCredential> = None;
                let mut ctx: Vec<ContextRow> = Vec::new();
                let mut recent: Option<String> = None;
                let mut later_open: i64 = 0;
                let mut duties: Option<StepDuties> = None;
                let mut planner_ends: Option<(Option<i64>, Option<i64>)> = None;
                for r in $rows {
                    if run.is_none() {
                        run = Some(RunRow::from_row(&r)?);
                        recent = r.try_get("recent_events")?;
                        later_open = r.try_get("later_open")?;
                        let planner: Option<String> = r.try_get("pc_id")?;
                        if planner.is_some() {
                            planner_ends =
                                Some((r.try_get("pc_revoked_at")?, r.try_get("pc_expires_at")?));
                        }
                        let step_id: Option<String> = r.try_get("d_step_id")?;
                        if let Some(step_id) = step_id {
                            let review: Option<bool> = r.try_get("d_review_required")?;
                            duties = Some(StepDuties {
                                step_id,
                                review_required: review.unwrap_or(true),
                                reviewed_hash: r.try_get("d_reviewed_hash")?,
                                reviewed_by: r.try_get("d_reviewed_by")?,
                                reviewed_at: r.try_get("d_reviewed_at")?,
                                assignee: r.try_get("d_assignee")?,
                            });
                        }
                        let id: Option<String> = r.try_get(14)?;
                        if let Some(id) = id {
                            agent = Some(AgentCredential {
                                id,
                                name: r.try_get(15)?,
                                role: r.try_get(16)?,
                                tenant: r.try_get(17)?,
                                created_by: r.try_get(18)?,
                                created_at: r.try_get(19)?,
                                expires_at: r.try_get(20)?,
                                revoked_at: r.try_get(21)?,
                                acts_for: r.try_get(22)?,
                                origin: r.try_get(23)?,
                                run_id: r.try_get(24)?,
                            });
                        }
                    }
                    ctx.push((
                        r.try_get(25)?,
                        r.try_get(26)?,
                        r.try_get(27)?,
                        r.try_get(28)?,
                        r.try_get(29)?,
                        r.try_get(30)?,
                        r.try_get(31)?,
                        r.try_get(32)?,
                        r.try_get(33)?,
                        r.try_get(34)?,
                        r.try_get(35)?,
                        r.try_get(36)?,
                        r.try_get(37)?,
                        r.try_get(38)?,
                        r.try_get(39)?,
                    ));
                }
                (run, agent, ctx, recent, later_open, duties, planner_ends)
            }};
        }
        let (run, agent, rows, recent, later_open, duties, planner_ends) = on_pool!(self, |p| {
            let rows = sqlx::query(&sql)
                .bind(run_id)
                .bind(switch)
                .bind(now)
                .bind(step_seq)
                .fetch_all(p)
                .await?;
            decode!(rows)
        });
        let run: Run = run.ok_or(StoreError::NotFound)?.try_into()?;
        let context = match &agent {
            Some(a) => {
                let holder = run.agent_id.as_deref().unwrap_or(a.id.as_str());
                context_from_rows(run_id, rows, &a.tenant, holder, now)?
            }
            None => None,
        };
        Ok(PlannedCall {
            run,
            agent,
            context,
            recent_events: parse_recent_events(recent.as_deref()),
            later_open,
            duties,
            planner_ends,
        })
    }
}
