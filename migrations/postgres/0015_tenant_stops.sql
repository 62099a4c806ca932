-- Countersign schema v15 (postgres dialect): emergency stops per tenant. Keep in step with
-- the other dialect.
-- A stop for one tenant is the switch row `emergency_stop:<tenant>` beside the platform-wide
-- `emergency_stop` (core/src/store/stops.rs); every switch check reads both, the batch UPDATE
-- of step transitions (`countersign_move_steps`, same signature as in migration 13) included.
-- stop_revocations: the credentials a stop revoked (with the revoked_at it wrote), so that
-- lifting the stop can restore them, explicitly and audited.

CREATE TABLE stop_revocations (
    switch      TEXT NOT NULL,
    agent_id    TEXT NOT NULL,
    revoked_at  BIGINT NOT NULL,
    PRIMARY KEY (switch, agent_id)
);

CREATE OR REPLACE FUNCTION countersign_move_steps(
    now_ms bigint, t_id text[], t_status text[], t_decision text[], t_rule text[],
    t_outcome text[], t_expires_at int8[], t_approval text[], t_bump int8[],
    t_not_before int8[], t_from text[], t_guard_run text[], t_guard_failed text[],
    t_guard_switch text[], t_key_state text[], t_key_result text[], t_release text[])
RETURNS SETOF text LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN QUERY WITH v AS (
        SELECT * FROM UNNEST(t_id, t_status, t_decision, t_rule, t_outcome, t_expires_at,
                             t_approval, t_bump, t_not_before, t_from, t_guard_run,
                             t_guard_failed, t_guard_switch, t_key_state, t_key_result,
                             t_release)
          AS v(id, status, decision, rule, outcome, expires_at, approval, bump, not_before,
               from_statuses, guard_run, guard_failed, guard_switch, key_state, key_result,
               release_by)
    ), moved AS (
        UPDATE steps SET status = COALESCE(v.status, steps.status),
            decision = COALESCE(v.decision, steps.decision),
            rule = COALESCE(v.rule, steps.rule),
            outcome = COALESCE(v.outcome, steps.outcome),
            expires_at = COALESCE(v.expires_at, steps.expires_at),
            approval = COALESCE(v.approval, steps.approval),
            attempts = steps.attempts + v.bump, updated_at = now_ms,
            not_before = COALESCE(v.not_before, steps.not_before),
            -- Both CASEs read the row as it was: a lease ends only if still `release_by`'s.
            claimed_by = CASE WHEN steps.claimed_by = v.release_by THEN NULL
                              ELSE steps.claimed_by END,
            lease_until = CASE WHEN steps.claimed_by = v.release_by THEN NULL
                               ELSE steps.lease_until END
        FROM v
        WHERE steps.id = v.id
          AND steps.status = ANY(string_to_array(v.from_statuses, ','))
          AND (v.guard_run IS NULL OR EXISTS (SELECT 1 FROM runs
                  WHERE runs.id = v.guard_run
                    AND (runs.status = 'active' OR runs.status = v.guard_failed)))
          -- The switch for every tenant, or for the step's run's tenant (stops.rs).
          AND (v.guard_switch IS NULL
               OR NOT EXISTS (SELECT 1 FROM switches
                   WHERE name = v.guard_switch
                      OR name = v.guard_switch || ':'
                                || (SELECT r.tenant FROM runs r WHERE r.id = steps.run_id)))
        RETURNING steps.id
    ), keys AS (
        UPDATE idempotency SET state = v.key_state,
            result = COALESCE(v.key_result, idempotency.result), updated_at = now_ms
        FROM v JOIN moved ON moved.id = v.id
        WHERE idempotency.step_id = v.id AND v.key_state IS NOT NULL
    )
    SELECT m.id FROM moved m;
END
$fn$;
