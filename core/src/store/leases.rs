//! A worker's claim on a planned step: the lease that makes one worker the step's executor,
//! its release, and the steps whose outcome a worker must reconcile.
//!
//! Invariants:
//! * A step is claimed only while pending, due, unleased (or its lease expired) and every
//!   earlier step of its run is done; a claim writes the lease in the statement that checks
//!   all of it.
//! * A lease ends only if it is still the releasing worker's.

use super::step_model::{RUN_DONE, STEP_COLUMNS, Step, StepAndRunDone, StepRow};
use super::{Pool, Store, StoreError, on_pool};

impl Store {
    /// Claims the next executable step of a planned, active run for `worker` until
    /// `lease_until`: pending, due, not leased by a live worker, and every earlier step of its
    /// run done (an unknown or failed step blocks the rest); none while switch `unless_switch`
    /// (the emergency stop) is set. Returns the claimed row as the claim wrote it (no read
    /// back). Postgres claims with `FOR UPDATE SKIP LOCKED`, so workers never wait on each
    /// other; SQLite's single writer serialises the one statement.
    ///
    /// The scan walks `steps_claim` (`not_before, created_at, seq` of pending steps) in the
    /// ORDER BY's own order and stops at the first claimable row.
    ///
    /// [durability] The claim commits durably, like every statement of the store (a claim
    /// lost in a crash would only leave its step pending and unleased for a worker to take
    /// again).
    pub async fn claim_step(
        &self,
        worker: &str,
        lease_until: i64,
        unless_switch: Option<&str>,
    ) -> Result<Option<Step>, StoreError> {
        let now = self.clock.now_ms();
        let sql = self.claim_statement();
        macro_rules! claim {
            ($p:expr) => {
                sqlx::query_as::<_, StepRow>(&sql)
                    .bind(worker)
                    .bind(lease_until)
                    .bind(now)
                    .bind(unless_switch)
                    .fetch_optional($p)
                    .await?
            };
        }
        let row: Option<StepRow> = match &self.pool {
            Pool::Postgres(p) => claim!(p),
            Pool::Sqlite(p) => claim!(p),
        };
        row.map(Step::try_from).transpose()
    }

    /// The statement [`Store::claim_step`] runs on this store's backend (`$1` worker, `$2`
    /// lease until, `$3` now, `$4` the switch that blocks claims), for benchmarks that compare
    /// a bare loop of it with the executor.
    ///
    /// On Postgres it calls `countersign_claim_step` (migration 26): the same statement inside
    /// a function whose settings leave the planner one plan, the walk of `steps_claim` in the
    /// ORDER BY's order; planned from statistics, the statement read every pending step of
    /// every active run for each claim under some of them (docs/performance.md).
    pub fn claim_statement(&self) -> String {
        match self.pool {
            Pool::Postgres(_) => {
                format!("SELECT {STEP_COLUMNS} FROM countersign_claim_step($1, $2, $3, $4)")
            }
            // The same statement as migration 26's function (a change to one is a change to
            // both: the function through a new migration).
            Pool::Sqlite(_) => format!(
                "UPDATE steps SET claimed_by = $1, lease_until = $2 WHERE id = (
                   SELECT s.id FROM steps s JOIN runs r ON r.id = s.run_id
                   WHERE s.status = 'pending' AND r.planned AND r.status = 'active'
                     AND s.not_before <= $3 AND (s.lease_until IS NULL OR s.lease_until < $3)
                     AND NOT EXISTS (SELECT 1 FROM steps e WHERE e.run_id = s.run_id
                                     AND e.seq < s.seq AND e.status <> 'done')
                     AND NOT {switched}
                     AND NOT EXISTS (SELECT 1 FROM step_duties d WHERE d.step_id = s.id
                                     AND d.review_required
                                     AND (d.reviewed_hash IS NULL
                                          OR d.reviewed_hash <> s.inputs_hash))
                   ORDER BY s.not_before, s.created_at, s.seq LIMIT 1)
                 RETURNING {STEP_COLUMNS}",
                switched = super::stops::switch_set_sql("$4", "r.tenant"),
            ),
        }
    }

    /// Ends `worker`'s lease on a step (after executing it, whatever the outcome).
    ///
    /// [durability] Committed durably (a release lost in a crash would leave a lease that
    /// expires by itself; only a pending step looks at leases).
    pub async fn release_step(&self, id: &str, worker: &str) -> Result<(), StoreError> {
        let sql = "UPDATE steps SET claimed_by = NULL, lease_until = NULL
                   WHERE id = $1 AND claimed_by = $2";
        match &self.pool {
            Pool::Postgres(p) => {
                sqlx::query(sql).bind(id).bind(worker).execute(p).await?;
            }
            Pool::Sqlite(p) => {
                sqlx::query(sql).bind(id).bind(worker).execute(p).await?;
            }
        }
        Ok(())
    }

    /// Ends `worker`'s lease on a step and reads what settling it needs: the step, and whether
    /// every step of its run is done ([`Store::release_step`] then
    /// [`Store::step_and_run_done`], in one statement on Postgres).
    ///
    /// [durability] As [`Store::release_step`]; what is read back is committed state.
    pub async fn release_and_settle(
        &self,
        id: &str,
        worker: &str,
    ) -> Result<(Step, bool), StoreError> {
        // On SQLite the two statements.
        let Pool::Postgres(p) = &self.pool else {
            self.release_step(id, worker).await?;
            return self.step_and_run_done(id).await;
        };
        // Both CASEs read the row as it was: the lease is dropped only if it is still ours.
        let sql = format!(
            "UPDATE steps SET
                 claimed_by = CASE WHEN claimed_by = $2 THEN NULL ELSE claimed_by END,
                 lease_until = CASE WHEN claimed_by = $2 THEN NULL ELSE lease_until END
             WHERE id = $1
             RETURNING {STEP_COLUMNS}, {RUN_DONE}"
        );
        let row: StepAndRunDone = sqlx::query_as(&sql)
            .bind(id)
            .bind(worker)
            .fetch_one(p)
            .await?;
        Ok((row.step.try_into()?, row.run_done))
    }

    /// Drops any worker's lease on a step (the reconciler, after its worker vanished).
    pub async fn clear_lease(&self, id: &str) -> Result<(), StoreError> {
        on_pool!(self, |p| {
            sqlx::query("UPDATE steps SET claimed_by = NULL, lease_until = NULL WHERE id = $1")
                .bind(id)
                .execute(p)
                .await?
                .rows_affected()
        });
        Ok(())
    }

    /// Steps whose outcome must be asked of the target: `unknown` ones, and `running` ones
    /// untouched since before `stale_before` (their worker or server died mid-call), oldest
    /// first, up to `limit` of them after `after` (`(updated_at, id)` of the last one of the
    /// page before), so a pass can walk past steps it cannot settle yet.
    pub async fn steps_to_reconcile(
        &self,
        stale_before: i64,
        after: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Vec<Step>, StoreError> {
        let sql = format!(
            "SELECT {STEP_COLUMNS} FROM steps
             WHERE (status = 'unknown' OR (status = 'running' AND updated_at < $1))
               AND ($2 IS NULL OR updated_at > $2 OR (updated_at = $2 AND id > $3))
             ORDER BY updated_at, id LIMIT $4"
        );
        let (at, id) = after.map_or((None, ""), |(at, id)| (Some(at), id));
        let rows: Vec<StepRow> = on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(stale_before)
                .bind(at)
                .bind(id)
                .bind(limit)
                .fetch_all(p)
                .await?
        });
        rows.into_iter().map(Step::try_from).collect()
    }
}
