//! The SQL of a step's moves: the prepared insert, the guarded transition (one statement that
//! moves the step, writes its key and appends its records), the key reservation, and the retry
//! of a statement that met another writer.

use super::StoreError;

/// [reads] The INSERT of a prepared step's row as prepared, its position the run's next;
/// returns the position. Binds: see [`prepared_insert`].
pub(crate) const PREPARED_INSERT_SQL: &str = "INSERT INTO steps (tenant, id, run_id, seq, role,
        tool, effect, inputs, inputs_hash, idem_key, status, attempts, reason, evidence,
        observed, trace_id, not_before, created_at, updated_at, agent_id)
     VALUES ((SELECT tenant FROM runs WHERE id = $2), $1, $2, COALESCE((SELECT seq FROM steps WHERE run_id = $2 ORDER BY seq DESC LIMIT 1), 0) + 1, $3, $4,
        $5, $6, $7, $8, $9, 0, $10, $11, $12, $13, $14, $15, $15, $16)
     RETURNING CAST(seq AS BIGINT)";

/// Binds a prepared [`Step`] to [`PREPARED_INSERT_SQL`].
macro_rules! prepared_insert {
    ($q:expr, $step:expr) => {{
        let step: &$crate::store::Step = $step;
        $q.bind(&step.id)
            .bind(&step.run_id)
            .bind(&step.role)
            .bind(&step.tool)
            .bind(step.effect.as_str())
            .bind(&step.inputs)
            .bind(&step.inputs_hash)
            .bind(&step.idem_key)
            .bind(step.status.as_str())
            .bind(&step.reason)
            .bind(&step.evidence)
            .bind(&step.observed)
            .bind(&step.trace_id)
            .bind(step.not_before)
            .bind(step.created_at)
            .bind(&step.agent_id)
    }};
}
pub(crate) use prepared_insert;

/// Runs `attempt` up to eight times while it collides (a conflict, or SQLite busy); any other
/// outcome is returned as it is.
pub(crate) async fn retry_collisions<T, F, Fut>(what: &str, mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut last = None;
    for _ in 0..8 {
        match attempt().await {
            Err(StoreError::Conflict(msg)) => last = Some(msg),
            Err(StoreError::Database(e)) if crate::store::audit_append::is_busy(&e) => {
                last = Some(e.to_string())
            }
            other => return other,
        }
    }
    Err(StoreError::Conflict(format!(
        "{what} kept colliding: {}",
        last.unwrap_or_default()
    )))
}

/// [reads] The INSERT of a prepared step's row already moved by a transition (status,
/// attempts, decision, rule, outcome, expiry, approval), written only while the transition's
/// [`RunGuard`] holds (`$24`–`$26`, as in [`transition_sql`]).
pub(crate) static INSERT_MOVED_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    INSERT_MOVED_TEMPLATE.replace(
        "{switched}",
        &super::stops::switch_set_sql("$26", "(SELECT tenant FROM runs WHERE runs.id = $2)"),
    )
});

pub(crate) const INSERT_MOVED_TEMPLATE: &str =
    "INSERT INTO steps (tenant, id, run_id, seq, role, tool, effect,
        inputs, inputs_hash, idem_key, status, attempts, reason, evidence, observed, trace_id,
        not_before, created_at, updated_at, agent_id, decision, rule, outcome, expires_at,
        approval)
     SELECT (SELECT tenant FROM runs WHERE runs.id = $2), $1, $2, COALESCE((SELECT seq FROM steps WHERE run_id = $2 ORDER BY seq DESC LIMIT 1), 0) + 1, $3, $4,
        $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23
      WHERE ($24 IS NULL OR EXISTS (SELECT 1 FROM runs
                WHERE runs.id = $24 AND (runs.status = 'active' OR runs.status = $25)))
        AND ($26 IS NULL OR NOT {switched})";

/// The UPDATE of a transition leaving one of `from` statuses (`$15…`); `$11`–`$13` are the
/// [`RunGuard`] (run id, its second accepted status, switch name; NULL = unchecked), `$14`
/// the worker whose lease on the step ends ([`Transition::release`]; NULL = none).
pub(crate) fn transition_sql(from: usize) -> String {
    let placeholders: Vec<String> = (0..from).map(|i| format!("${}", i + 15)).collect();
    // Both CASEs read the row as it was: the lease ends only if it is still `$14`'s.
    format!(
        "UPDATE steps SET status = COALESCE($1, status), decision = COALESCE($2, decision),
            rule = COALESCE($3, rule), outcome = COALESCE($4, outcome),
            expires_at = COALESCE($5, expires_at), approval = COALESCE($6, approval),
            attempts = attempts + $7, updated_at = $8,
            not_before = COALESCE($10, not_before),
            claimed_by = CASE WHEN claimed_by = $14 THEN NULL ELSE claimed_by END,
            lease_until = CASE WHEN claimed_by = $14 THEN NULL ELSE lease_until END
         WHERE id = $9 AND status IN ({})
           AND ($11 IS NULL OR EXISTS (SELECT 1 FROM runs
                WHERE runs.id = $11 AND (runs.status = 'active' OR runs.status = $12)))
           AND ($13 IS NULL OR NOT {})",
        if placeholders.is_empty() {
            "NULL".to_string()
        } else {
            placeholders.join(", ")
        },
        super::stops::switch_set_sql("$13", "steps.tenant")
    )
}

/// Applies transition `$t` inside open transaction `$tx` at time `$now`: the status change
/// (only from `t.from`), the key and the records (sealed at `$head`, an
/// `&mut Option<ChainHead>` of chain `$chain` taken with `hold_head!` when first needed).
/// Evaluates to
/// `Some(records)`, or `None` when the step was not in `t.from` (nothing written). The
/// records are sealed, not yet inserted: the caller inserts them before its COMMIT.
macro_rules! apply_transition {
    ($tx:expr, $lock:expr, $head:expr, $chain:expr, $t:expr, $now:expr) => {{
        let t: &$crate::store::Transition = $t;
        let now: i64 = $now;
        let n: u64 = match &t.insert {
            Some(step) => {
                let step: &$crate::store::Step = step;
                let n = sqlx::query($crate::store::steps::INSERT_MOVED_SQL.as_str())
                    .bind(&step.id)
                    .bind(&step.run_id)
                    .bind(&step.role)
                    .bind(&step.tool)
                    .bind(step.effect.as_str())
                    .bind(&step.inputs)
                    .bind(&step.inputs_hash)
                    .bind(&step.idem_key)
                    .bind(t.to.unwrap_or(step.status).as_str())
                    .bind(i64::from(t.bump_attempts))
                    .bind(&step.reason)
                    .bind(&step.evidence)
                    .bind(&step.observed)
                    .bind(&step.trace_id)
                    .bind(t.not_before.unwrap_or(step.not_before))
                    .bind(step.created_at)
                    .bind(now)
                    .bind(&step.agent_id)
                    .bind(&t.decision)
                    .bind(&t.rule)
                    .bind(&t.outcome)
                    .bind(t.expires_at)
                    .bind(&t.approval)
                    .bind(t.guard.as_ref().map(|g| g.run_id.as_str()))
                    .bind(
                        t.guard
                            .as_ref()
                            .and_then(|g| g.allow_failed.then_some("failed")),
                    )
                    .bind(t.guard.as_ref().and_then(|g| g.unless_switch.as_deref()))
                    .execute(&mut *$tx)
                    .await?
                    .rows_affected();
                if n != 1 {
                    // Refused by the guard: the row as prepared, for the caller to record.
                    $crate::store::steps::prepared_insert!(
                        sqlx::query($crate::store::steps::PREPARED_INSERT_SQL),
                        step
                    )
                    .execute(&mut *$tx)
                    .await?;
                }
                n
            }
            None => {
                let sql = $crate::store::steps::transition_sql(t.from.len());
                let mut q = sqlx::query(&sql)
                    .bind(t.to.map(|s| s.as_str()))
                    .bind(&t.decision)
                    .bind(&t.rule)
                    .bind(&t.outcome)
                    .bind(t.expires_at)
                    .bind(&t.approval)
                    .bind(i64::from(t.bump_attempts))
                    .bind(now)
                    .bind(&t.step_id)
                    .bind(t.not_before)
                    .bind(t.guard.as_ref().map(|g| g.run_id.as_str()))
                    .bind(
                        t.guard
                            .as_ref()
                            .and_then(|g| g.allow_failed.then_some("failed")),
                    )
                    .bind(t.guard.as_ref().and_then(|g| g.unless_switch.as_deref()))
                    .bind(t.release.as_deref());
                for f in &t.from {
                    q = q.bind(f.as_str());
                }
                q.execute(&mut *$tx).await?.rows_affected()
            }
        };
        if n != 1 {
            None
        } else {
            if let Some((state, result)) = &t.key {
                sqlx::query(
                    "UPDATE idempotency SET state = $1, result = COALESCE($2, result),
                        updated_at = $3
                     WHERE step_id = $4",
                )
                .bind(state.as_str())
                .bind(result)
                .bind(now)
                .bind(&t.step_id)
                .execute(&mut *$tx)
                .await?;
            }
            Some($crate::store::steps::seal_records!(
                $tx, $lock, $head, $chain, t, now
            ))
        }
    }};
}
pub(crate) use apply_transition;

/// The INSERT of a key reserved with its step's transition ([`Transition::reserve`]); a key
/// that exists is left as it is.
pub(crate) const RESERVE_SQL: &str = "INSERT INTO idempotency (tenant, idem_key, step_id,
        inputs_hash, state, result, owner, created_at, updated_at)
     VALUES ((SELECT tenant FROM steps WHERE id = $2), $1, $2, $3, 'in_flight', NULL, $4, $5, $5)
     ON CONFLICT DO NOTHING";

/// Inside open transaction `$tx`, after transition `$t` moved its step: reserves its key if it
/// asks to ([`Transition::reserve`]). Evaluates to whether a key was reserved now (`false`
/// without a claim or when the key existed).
macro_rules! reserve_with {
    ($tx:expr, $t:expr, $now:expr) => {{
        let t: &$crate::store::Transition = $t;
        match &t.reserve {
            Some(k) => {
                sqlx::query($crate::store::steps::RESERVE_SQL)
                    .bind(&k.idem_key)
                    .bind(&t.step_id)
                    .bind(&k.inputs_hash)
                    .bind(&k.owner)
                    .bind($now)
                    .execute(&mut *$tx)
                    .await?
                    .rows_affected()
                    == 1
            }
            None => false,
        }
    }};
}
pub(crate) use reserve_with;

/// Seals a moved transition `$t`'s records at the chain head `$head` (taken with `hold_head!`
/// when first needed), in order, at time `$now`; evaluates to the sealed records (not yet
/// inserted).
macro_rules! seal_records {
    ($tx:expr, $lock:expr, $head:expr, $chain:expr, $t:expr, $now:expr) => {{
        let t: &$crate::store::Transition = $t;
        let mut records = Vec::with_capacity(t.records.len());
        for (event, new) in &t.records {
            let head = $crate::store::audit_append::hold_head!($tx, $lock, $head, $chain);
            records.push($crate::store::audit_append::seal_next!(
                head, new, *event, $now
            ));
        }
        records
    }};
}
pub(crate) use seal_records;
