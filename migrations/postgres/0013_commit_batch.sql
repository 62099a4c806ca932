-- A committer batch in one round trip (core/src/store/bulk.rs, `commit_one_trip`).
--
-- Both in PL/pgSQL, which keeps each statement's plan for the session (an SQL-language
-- function is planned again at every call).
-- `countersign_move_steps` is the batch UPDATE of step transitions (and the keys of those that
-- moved) that the multi-statement path runs too, so both paths write the same rows.
-- `countersign_commit_batch` takes the audit append lock, checks that the chain head is the
-- one the caller sealed the batch's records on, moves every step and inserts the records; if
-- the head moved, any transition did not move or a key it reserves exists, it raises and
-- nothing of it is written (the
-- caller then runs the batch on the multi-statement path, which reads the head itself).
-- `durable` makes its COMMIT wait for the WAL flush (on a session that does not otherwise); it
-- returns the `synchronous_commit` its COMMIT runs under.
CREATE FUNCTION countersign_move_steps(
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
          AND (v.guard_switch IS NULL
               OR NOT EXISTS (SELECT 1 FROM switches WHERE name = v.guard_switch))
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

CREATE FUNCTION countersign_commit_batch(
    lock_key bigint, last_seq bigint, last_hash text, now_ms bigint, durable boolean,
    t_id text[], t_status text[], t_decision text[], t_rule text[], t_outcome text[],
    t_expires_at int8[], t_approval text[], t_bump int8[], t_not_before int8[],
    t_from text[], t_guard_run text[], t_guard_failed text[], t_guard_switch text[],
    t_key_state text[], t_key_result text[], t_release text[],
    k_step text[], k_key text[], k_hash text[], k_owner text[],
    r_seq int8[], r_at int8[], r_event text[], r_run_id text[], r_step_id text[],
    r_tool text[], r_actor text[], r_rule text[], r_record text[], r_prev text[],
    r_hash text[])
RETURNS text LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    seen_seq bigint;
    seen_hash text;
    n_moved bigint;
    n_reserved bigint;
BEGIN
    -- Durable: this transaction's COMMIT waits for the WAL flush, whatever the session says.
    IF durable THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    PERFORM pg_advisory_xact_lock(lock_key);
    SELECT a.seq, a.hash INTO seen_seq, seen_hash FROM audit a ORDER BY a.seq DESC LIMIT 1;
    IF seen_seq IS DISTINCT FROM last_seq OR seen_hash IS DISTINCT FROM last_hash THEN
        RAISE EXCEPTION 'countersign: the audit head moved' USING ERRCODE = 'CS001';
    END IF;
    SELECT count(*) INTO n_moved FROM countersign_move_steps(now_ms, t_id, t_status,
        t_decision, t_rule, t_outcome, t_expires_at, t_approval, t_bump, t_not_before, t_from,
        t_guard_run, t_guard_failed, t_guard_switch, t_key_state, t_key_result, t_release);
    IF n_moved <> COALESCE(cardinality(t_id), 0) THEN
        RAISE EXCEPTION 'countersign: a transition did not move' USING ERRCODE = 'CS002';
    END IF;
    -- The keys of the steps taken with their transition: all reserved now, or nothing.
    INSERT INTO idempotency (idem_key, step_id, inputs_hash, state, result, owner, created_at,
                             updated_at)
    SELECT k.idem, k.step, k.inputs, 'in_flight', NULL, k.who, now_ms, now_ms
      FROM UNNEST(k_key, k_step, k_hash, k_owner) AS k(idem, step, inputs, who)
    ON CONFLICT (idem_key) DO NOTHING;
    GET DIAGNOSTICS n_reserved = ROW_COUNT;
    IF n_reserved <> COALESCE(cardinality(k_key), 0) THEN
        RAISE EXCEPTION 'countersign: a key exists already' USING ERRCODE = 'CS003';
    END IF;
    INSERT INTO audit (seq, at, event, run_id, step_id, tool, actor, rule, record, prev, hash)
    SELECT * FROM UNNEST(r_seq, r_at, r_event, r_run_id, r_step_id, r_tool, r_actor, r_rule,
                         r_record, r_prev, r_hash);
    -- How this transaction's COMMIT will wait: anything but `off` waits for the local flush.
    RETURN current_setting('synchronous_commit');
END
$fn$;
