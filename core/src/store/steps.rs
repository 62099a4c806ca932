//! Steps, their idempotency keys and their transitions.
//!
//! Invariants:
//! * A write's identity in its run is (run, tool, inputs hash): the `dedupe` column is unique,
//!   so however many callers race to open the same write, one step (one seq, one key) exists.
//! * `idem_key = sha256(run_id, seq, canonical inputs)` is derived here, never taken from a
//!   caller, and is unique across all steps.
//! * A key is reserved (a row in `idempotency`) before any adapter runs; only the reserver
//!   executes. A stored key whose inputs hash differs from the caller's is a mismatch.
//! * A transition names the statuses it may leave; if the step moved meanwhile nothing is
//!   written. The status change, the key's state and the audit records commit together.
//! * A step's id is a UUID of version 7 ([`new_step_id`]): unique, and later than every id
//!   this process made before, so the indexes keyed by it grow at their end.

pub use super::step_model::{
    KeyClaim, KeyRecord, KeyState, NewStep, Reservation, RunGuard, Step, Transition,
};
pub(crate) use super::step_model::{
    KeyRow, RUN_DONE, STEP_COLUMNS, StepAndRunDone, StepRow, dedupe_of,
};
pub(crate) use super::transition_sql::{
    INSERT_MOVED_SQL, PREPARED_INSERT_SQL, RESERVE_SQL, apply_transition, prepared_insert,
    reserve_with, retry_collisions, seal_records, transition_sql,
};
use uuid::Uuid;

use super::{Pool, Store, StoreError, on_pool};
use crate::audit::AuditRecord;
use crate::keys::{IdemKey, InputsHash};
use crate::model::{Effect, StepStatus};
use crate::store::audit_append::{hold_head, insert_all_pg, insert_all_sqlite};

/// The next position in run `$1`: its last step's, by the `(run_id, seq)` index, plus one.
/// Written as ORDER BY … LIMIT 1, not MAX: Postgres's generic plan for `MAX(seq) … WHERE
/// run_id = $1` (chosen after five executions while the table was small, and kept) read every
/// step of the run through the index, 0.4 ms a call in a run of a few thousand steps and
/// growing with it; this form stops at the first entry in any plan (docs/performance.md).
/// Public so that a test can plan it as the server does.
pub const NEXT_POSITION_SQL: &str = "SELECT CAST(COALESCE((SELECT seq FROM steps WHERE run_id = $1 \
     ORDER BY seq DESC LIMIT 1), 0) + 1 AS BIGINT)";

/// A new step's id: a version 7 UUID (RFC 9562: the Unix time in milliseconds, then a counter
/// started at random each millisecond, then random bits), later than every id this process
/// made before. Ids in time order keep the indexes keyed by a step's id (its primary key,
/// the id look-up, the audit's `(step_id, pos)`) growing at their end: with random (version
/// 4) ids every new step wrote into a random leaf page of each, on Postgres and SQLite alike
/// (docs/performance.md). The id is no secret: who may see or move a step is decided by role
/// and tenant, never by knowing its id.
pub(crate) fn new_step_id() -> String {
    Uuid::now_v7().to_string()
}

impl Store {
    /// [reads] A read's step as it will be stored, without writing it: a read has no effect
    /// to guard, so its row is written with its outcome ([`Transition::insert`]) or, on a path
    /// that parks or refuses it first, by [`Store::insert_prepared`]. Its key comes from its own
    /// id ([`IdemKey::for_read`]); its position is taken when the row is written (`seq` 0 here).
    pub fn prepare_read(&self, new: &NewStep) -> Result<Step, StoreError> {
        if new.effect != Effect::Read {
            return Err(StoreError::Conflict(format!(
                "{} is not a read: its step opens before it runs",
                new.tool
            )));
        }
        let evidence = serde_json::to_string(&new.evidence)
            .map_err(|e| StoreError::Conflict(format!("evidence: {e}")))?;
        let now = self.clock.now_ms();
        let id = new_step_id();
        let key = IdemKey::for_read(&id, &new.inputs);
        Ok(Step {
            id,
            run_id: new.run_id.clone(),
            seq: 0,
            role: new.role.clone(),
            tool: new.tool.clone(),
            effect: new.effect,
            inputs: new.inputs.as_str().to_string(),
            inputs_hash: InputsHash::of(&new.inputs).to_string(),
            idem_key: key.to_string(),
            status: new.status,
            attempts: 0,
            decision: None,
            rule: None,
            approval: None,
            outcome: None,
            reason: new.reason.clone(),
            evidence,
            observed: new.observed.clone(),
            trace_id: Some(new.trace_id.clone()),
            not_before: 0,
            expires_at: None,
            agent_id: new.agent_id.clone(),
            created_at: now,
            updated_at: now,
        })
    }

    /// Writes a [`Store::prepare_read`] step's row as prepared; the step with its position.
    pub async fn insert_prepared(&self, step: &Step) -> Result<Step, StoreError> {
        let seq: i64 = on_pool!(self, |p| {
            prepared_insert!(sqlx::query_scalar(PREPARED_INSERT_SQL), step)
                .fetch_one(p)
                .await?
        });
        Ok(Step {
            seq,
            ..step.clone()
        })
    }

    /// Opens a step, or for a write returns the identical one already open in its run
    /// (`false` = it existed).
    pub async fn open_step(&self, new: &NewStep) -> Result<(Step, bool), StoreError> {
        let inputs_hash = InputsHash::of(&new.inputs);
        let dedupe = match new.effect {
            Effect::Read => None,
            Effect::Write | Effect::Irreversible => {
                Some(dedupe_of(&new.run_id, &new.tool, &inputs_hash))
            }
        };
        if let Some(d) = &dedupe
            && let Some(step) = self.step_by_dedupe(d).await?
        {
            return Ok((step, false));
        }
        let evidence = serde_json::to_string(&new.evidence)
            .map_err(|e| StoreError::Conflict(format!("evidence: {e}")))?;
        for _ in 0..32 {
            let now = self.clock.now_ms();
            let id = new_step_id();
            // [reads] A read has no effect and its key guards nothing: it is derived from
            // the step's own id, so the row opens in one statement that takes the next
            // position itself. A write's key is derived from its position (the run's order),
            // which is read first.
            let read = dedupe.is_none();
            let seq: i64 = if read {
                0
            } else {
                on_pool!(self, |p| {
                    sqlx::query_scalar(NEXT_POSITION_SQL)
                        .bind(&new.run_id)
                        .fetch_one(p)
                        .await?
                })
            };
            let key = if read {
                IdemKey::for_read(&id, &new.inputs)
            } else {
                IdemKey::derive(&new.run_id, seq.max(0) as u64, &new.inputs)
            };
            let insert =
                "INSERT INTO steps (tenant, id, run_id, seq, role, tool, effect, inputs,
                    inputs_hash, idem_key, status, attempts, reason, evidence, observed,
                    trace_id, not_before, created_at, updated_at, dedupe, agent_id)
                 VALUES ((SELECT tenant FROM runs WHERE id = $2), $1, $2, CASE WHEN $3 > 0 THEN $3 ELSE
                        COALESCE((SELECT seq FROM steps WHERE run_id = $2 ORDER BY seq DESC LIMIT 1), 0) + 1 END,
                    $4, $5, $6, $7, $8, $9, $10, 0, $11, $12, $13, $14, 0, $15, $15, $16, $17)
                 ON CONFLICT DO NOTHING
                 RETURNING CAST(seq AS BIGINT)";
            macro_rules! bound {
                ($q:expr) => {
                    $q.bind(&id)
                        .bind(&new.run_id)
                        .bind(seq)
                        .bind(&new.role)
                        .bind(&new.tool)
                        .bind(new.effect.as_str())
                        .bind(new.inputs.as_str())
                        .bind(inputs_hash.to_string())
                        .bind(key.to_string())
                        .bind(new.status.as_str())
                        .bind(&new.reason)
                        .bind(&evidence)
                        .bind(&new.observed)
                        .bind(&new.trace_id)
                        .bind(now)
                        .bind(&dedupe)
                        .bind(&new.agent_id)
                };
            }
            let taken: Option<i64> = match &self.pool {
                Pool::Postgres(p) => bound!(sqlx::query_scalar(insert)).fetch_optional(p).await?,
                Pool::Sqlite(p) => bound!(sqlx::query_scalar(insert)).fetch_optional(p).await?,
            };
            if let Some(seq) = taken {
                let step = Step {
                    id,
                    run_id: new.run_id.clone(),
                    seq,
                    role: new.role.clone(),
                    tool: new.tool.clone(),
                    effect: new.effect,
                    inputs: new.inputs.as_str().to_string(),
                    inputs_hash: inputs_hash.to_string(),
                    idem_key: key.to_string(),
                    status: new.status,
                    attempts: 0,
                    decision: None,
                    rule: None,
                    approval: None,
                    outcome: None,
                    reason: new.reason.clone(),
                    evidence,
                    observed: new.observed.clone(),
                    trace_id: Some(new.trace_id.clone()),
                    not_before: 0,
                    expires_at: None,
                    agent_id: new.agent_id.clone(),
                    created_at: now,
                    updated_at: now,
                };
                return Ok((step, true));
            }
            if let Some(d) = &dedupe
                && let Some(step) = self.step_by_dedupe(d).await?
            {
                return Ok((step, false));
            }
            // Another step took this seq: try the next one.
        }
        Err(StoreError::Conflict(
            "could not find a free step position".into(),
        ))
    }

    async fn step_by_dedupe(&self, dedupe: &str) -> Result<Option<Step>, StoreError> {
        let sql = format!("SELECT {STEP_COLUMNS} FROM steps WHERE dedupe = $1");
        let row: Option<StepRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(dedupe).fetch_optional(p).await?
        });
        row.map(Step::try_from).transpose()
    }

    /// One step.
    pub async fn get_step(&self, id: &str) -> Result<Step, StoreError> {
        let sql = format!("SELECT {STEP_COLUMNS} FROM steps WHERE id = $1");
        let row: StepRow = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(id).fetch_one(p).await?
        });
        row.try_into()
    }

    /// The read step of `run_id` that `agent`'s repeat of a gated read call in `role`
    /// continues: the same agent, role, tool and inputs hash, parked at its gate with the
    /// window still open, or approved and not yet run (`pending` after its gate window
    /// opened). The newest such step; `None` otherwise (a new read is opened).
    pub async fn gated_read(
        &self,
        run_id: &str,
        agent: &str,
        role: &str,
        tool: &str,
        inputs_hash: &str,
    ) -> Result<Option<Step>, StoreError> {
        let sql = format!(
            "SELECT {STEP_COLUMNS} FROM steps
              WHERE run_id = $1 AND agent_id = $2 AND role = $3 AND tool = $4
                AND inputs_hash = $5 AND effect = 'read' AND expires_at IS NOT NULL
                AND ((status = 'needs_approval' AND expires_at > $6) OR status = 'pending')
              ORDER BY seq DESC LIMIT 1"
        );
        let now = self.clock.now_ms();
        let row: Option<StepRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(run_id)
                .bind(agent)
                .bind(role)
                .bind(tool)
                .bind(inputs_hash)
                .bind(now)
                .fetch_optional(p)
                .await?
        });
        row.map(Step::try_from).transpose()
    }

    /// One step, and whether every step of its run is done: what settling a step after its
    /// execution needs, in one read.
    pub async fn step_and_run_done(&self, id: &str) -> Result<(Step, bool), StoreError> {
        let sql = format!("SELECT {STEP_COLUMNS}, {RUN_DONE} FROM steps WHERE id = $1");
        let row: StepAndRunDone = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(id).fetch_one(p).await?
        });
        Ok((row.step.try_into()?, row.run_done))
    }

    /// A run's steps in order.
    pub async fn steps_for_run(&self, run_id: &str) -> Result<Vec<Step>, StoreError> {
        let sql = format!("SELECT {STEP_COLUMNS} FROM steps WHERE run_id = $1 ORDER BY seq");
        let rows: Vec<StepRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(run_id).fetch_all(p).await?
        });
        rows.into_iter().map(Step::try_from).collect()
    }

    /// Steps in `status`, oldest first, at most `limit`.
    pub async fn steps_in_status(
        &self,
        status: StepStatus,
        limit: i64,
    ) -> Result<Vec<Step>, StoreError> {
        let sql = format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE status = $1 ORDER BY updated_at, id LIMIT $2"
        );
        let rows: Vec<StepRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(status.as_str())
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        rows.into_iter().map(Step::try_from).collect()
    }

    /// Steps of `tools` waiting for approval in runs of `tenant`, oldest first (`updated_at`,
    /// `id`), at most `limit`: the inbox's list, one query whatever the number of gates or
    /// tenants. The tools are filtered before the limit, so gates of tools a person cannot
    /// approve never hide the ones they can. No tools: nothing.
    pub async fn waiting_for_tenant(
        &self,
        tenant: &str,
        tools: &[String],
        limit: i64,
    ) -> Result<Vec<Step>, StoreError> {
        if tools.is_empty() {
            return Ok(Vec::new());
        }
        let listed: Vec<String> = (0..tools.len()).map(|i| format!("${}", i + 3)).collect();
        let sql = format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE status = 'needs_approval' \
             AND tool IN ({}) \
             AND EXISTS (SELECT 1 FROM runs r WHERE r.id = steps.run_id AND r.tenant = $1) \
             ORDER BY updated_at, id LIMIT $2",
            listed.join(", ")
        );
        let rows: Vec<StepRow> = on_pool!(self, |p| {
            let mut q = sqlx::query_as(&sql).bind(tenant).bind(limit);
            for tool in tools {
                q = q.bind(tool);
            }
            q.fetch_all(p).await?
        });
        rows.into_iter().map(Step::try_from).collect()
    }

    /// How many steps are in `status`.
    pub async fn count_steps(&self, status: StepStatus) -> Result<i64, StoreError> {
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar("SELECT COUNT(*) FROM steps WHERE status = $1")
                .bind(status.as_str())
                .fetch_one(p)
                .await?
        }))
    }

    /// Reserves `idem_key` for `step_id`'s call, or reports who holds it. (The pipeline
    /// reserves a step's key with the transition that takes it: [`Transition::reserve`].)
    pub async fn reserve_key(
        &self,
        idem_key: &str,
        step_id: &str,
        inputs_hash: &str,
        owner: &str,
    ) -> Result<Reservation, StoreError> {
        let now = self.clock.now_ms();
        let sql = RESERVE_SQL;
        macro_rules! reserve {
            ($p:expr) => {
                sqlx::query(sql)
                    .bind(idem_key)
                    .bind(step_id)
                    .bind(inputs_hash)
                    .bind(owner)
                    .bind(now)
                    .execute($p)
                    .await?
                    .rows_affected()
            };
        }
        // [durability] Committed durably, after the step was taken (`running`) in a commit of
        // its own: a crash between the two leaves a running step without a key, which the
        // reconciler asks the target about by key. Other callers see the reservation as soon
        // as it commits, so duplicates are still refused.
        let n = match &self.pool {
            Pool::Postgres(p) => reserve!(p),
            Pool::Sqlite(p) => reserve!(p),
        };
        if n == 1 {
            return Ok(Reservation::Reserved);
        }
        match self.get_key(idem_key).await? {
            Some(row) => Ok(Reservation::Existing(row)),
            None => Err(StoreError::Conflict("key raced and vanished".into())),
        }
    }

    /// Takes a key over from `from` (a failed call being retried, an unknown one being
    /// reconciled) for `owner`. `false` when it is no longer in `from`.
    pub async fn take_over_key(
        &self,
        idem_key: &str,
        from: KeyState,
        owner: &str,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now_ms();
        let n = on_pool!(self, |p| {
            sqlx::query(
                "UPDATE idempotency SET state = 'in_flight', owner = $1, updated_at = $2
                 WHERE idem_key = $3 AND state = $4",
            )
            .bind(owner)
            .bind(now)
            .bind(idem_key)
            .bind(from.as_str())
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(n == 1)
    }

    /// The key's row, if reserved.
    pub async fn get_key(&self, idem_key: &str) -> Result<Option<KeyRecord>, StoreError> {
        let row: Option<KeyRow> = on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT idem_key, step_id, inputs_hash, state, result, owner, updated_at
                 FROM idempotency WHERE idem_key = $1",
            )
            .bind(idem_key)
            .fetch_optional(p)
            .await?
        });
        row.map(KeyRecord::try_from).transpose()
    }

    /// Applies `t` in one transaction: the status change (only from `t.from`), the key's new
    /// state and the audit records. `None` when the step was not in `t.from` (nothing written).
    pub async fn transition(
        &self,
        t: &Transition,
    ) -> Result<Option<(Step, Vec<AuditRecord>)>, StoreError> {
        match self.transition_records(t).await? {
            Some((records, _)) => Ok(Some((self.get_step(&t.step_id).await?, records))),
            None => Ok(None),
        }
    }

    /// [`Store::transition`] without reading the step back: `true` when it moved.
    pub async fn move_step(&self, t: &Transition) -> Result<bool, StoreError> {
        Ok(self.transition_records(t).await?.is_some())
    }

    /// [`Store::move_step`] for a transition that takes a step and reserves its key
    /// ([`Transition::reserve`]) in the same transaction: `None` when it did not move (nothing
    /// written); otherwise whether the key was reserved now — `false` means it existed
    /// already (an earlier attempt's: [`Store::get_key`] tells where it stands).
    pub async fn start_step(&self, t: &Transition) -> Result<Option<bool>, StoreError> {
        Ok(self
            .transition_records(t)
            .await?
            .map(|(_, reserved)| reserved))
    }

    async fn transition_records(
        &self,
        t: &Transition,
    ) -> Result<Option<(Vec<AuditRecord>, bool)>, StoreError> {
        retry_collisions("step transition", || self.try_transition(t)).await
    }

    async fn try_transition(
        &self,
        t: &Transition,
    ) -> Result<Option<(Vec<AuditRecord>, bool)>, StoreError> {
        // A transition without records takes no chain head and touches one row: written
        // alone, so no chain's committer locks another tenant's step (lock order).
        if t.records.is_empty() {
            return self.transition_alone(t).await;
        }
        let chain = self
            .chain_for(&t.records.iter().map(|(_, r)| r).collect::<Vec<_>>())
            .await?;
        if let Some(c) = &self.committer
            && let Some(done) = c
                .submit(
                    chain,
                    super::commit_queue::Work::Transition(Box::new(t.clone())),
                )
                .await
        {
            return match done? {
                super::commit_queue::Done::Moved(moved, reserved) => {
                    Ok(moved.map(|m| (m, reserved)))
                }
                super::commit_queue::Done::Appended(_) => Err(StoreError::Conflict(
                    "committer answered out of kind".into(),
                )),
            };
        }
        self.transition_alone(t).await
    }

    /// [`Store::transition`] in its own transaction (no committer, or it has stopped).
    pub(crate) async fn transition_alone(
        &self,
        t: &Transition,
    ) -> Result<Option<(Vec<AuditRecord>, bool)>, StoreError> {
        let now = self.clock.now_ms();
        let chain = self
            .chain_for(&t.records.iter().map(|(_, r)| r).collect::<Vec<_>>())
            .await?;
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr, $insert:path) => {{
                let mut tx = $pool.begin_with($begin).await?;
                let mut head: Option<crate::audit::ChainHead> = None;
                if !t.records.is_empty() {
                    // The append lock before any row lock (see `group`): no lock cycles.
                    hold_head!(&mut *tx, $lock, &mut head, &chain);
                }
                let moved = apply_transition!(&mut *tx, $lock, &mut head, &chain, t, now);
                if let Some(records) = &moved {
                    let reserved = reserve_with!(&mut *tx, t, now);
                    $insert(&mut *tx, records).await?;
                    tx.commit().await?;
                    moved.map(|m| (m, reserved))
                } else {
                    if t.insert.is_some() {
                        // The prepared row was written (refused by the guard): keep it.
                        tx.commit().await?;
                    } else {
                        tx.rollback().await?;
                    }
                    None
                }
            }};
        }
        Ok(match &self.pool {
            Pool::Sqlite(p) => {
                run_in!(p, "BEGIN IMMEDIATE", false, insert_all_sqlite)
            }
            Pool::Postgres(p) => {
                run_in!(p, "BEGIN", true, insert_all_pg)
            }
        })
    }
}

impl Store {
    /// Ends run `run_id` as `status` (with `reason`) — when it is still active — and applies
    /// `cancels`, the transitions of its steps that never ran, in ONE transaction: no reader
    /// sees the run ended while one of its unstarted steps still looks runnable, nor a step
    /// cancelled under a run that still looks active. Returns whether the run was ended here
    /// and how many cancels moved their step; a cancel whose step has left its `from`
    /// statuses meanwhile writes nothing, as with [`Store::transition`].
    pub async fn end_run(
        &self,
        run_id: &str,
        status: super::RunStatus,
        reason: &str,
        cancels: &[Transition],
    ) -> Result<(bool, usize), StoreError> {
        retry_collisions("ending a run", || {
            self.try_end_run(run_id, status, reason, cancels)
        })
        .await
    }

    async fn try_end_run(
        &self,
        run_id: &str,
        status: super::RunStatus,
        reason: &str,
        cancels: &[Transition],
    ) -> Result<(bool, usize), StoreError> {
        let now = self.clock.now_ms();
        let chain = self
            .chain_for(
                &cancels
                    .iter()
                    .flat_map(|t| t.records.iter().map(|(_, r)| r))
                    .collect::<Vec<_>>(),
            )
            .await?;
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr, $insert:path) => {{
                let mut tx = $pool.begin_with($begin).await?;
                let mut head: Option<crate::audit::ChainHead> = None;
                if cancels.iter().any(|t| !t.records.is_empty()) {
                    // The append lock before any row lock (see `group`): no lock cycles.
                    hold_head!(&mut *tx, $lock, &mut head, &chain);
                }
                let ended = sqlx::query(
                    "UPDATE runs SET status = $1, reason = $2, updated_at = $3
                     WHERE id = $4 AND status = 'active'",
                )
                .bind(status.as_str())
                .bind(reason)
                .bind(now)
                .bind(run_id)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1;
                let mut moved = 0;
                let mut records = Vec::new();
                for t in cancels {
                    if let Some(sealed) =
                        apply_transition!(&mut *tx, $lock, &mut head, &chain, t, now)
                    {
                        moved += 1;
                        records.extend(sealed);
                    }
                }
                if !records.is_empty() {
                    $insert(&mut *tx, &records).await?;
                }
                tx.commit().await?;
                (ended, moved)
            }};
        }
        Ok(match &self.pool {
            Pool::Sqlite(p) => {
                run_in!(p, "BEGIN IMMEDIATE", false, insert_all_sqlite)
            }
            Pool::Postgres(p) => {
                run_in!(p, "BEGIN", true, insert_all_pg)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::CanonicalJson;

    #[test]
    fn step_ids_are_version_7_and_each_sorts_after_the_one_before() {
        let ids: Vec<String> = (0..2_000).map(|_| new_step_id()).collect();
        for id in &ids {
            assert_eq!(Uuid::parse_str(id).unwrap().get_version_num(), 7, "{id}");
        }
        // As text (how the indexes compare them), each later than the one before.
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn dedupe_separates_runs_tools_and_inputs() {
        let a = InputsHash::of(&CanonicalJson::from_value(&serde_json::json!({"x": 1})).unwrap());
        let b = InputsHash::of(&CanonicalJson::from_value(&serde_json::json!({"x": 2})).unwrap());
        let base = dedupe_of("r1", "t", &a);
        assert_eq!(base, dedupe_of("r1", "t", &a));
        assert_ne!(base, dedupe_of("r2", "t", &a));
        assert_ne!(base, dedupe_of("r1", "u", &a));
        assert_ne!(base, dedupe_of("r1", "t", &b));
    }
}
