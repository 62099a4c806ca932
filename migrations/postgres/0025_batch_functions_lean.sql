-- Two replacements of batch functions (issue 34), each with the same signature, answers and
-- errors: the one-trip batch skips what a batch does not carry, and a read's row takes its run
-- position by key (below).
--
-- The one-trip batch skips what a batch does not carry. Measured with
-- pg_stat_statements (track = all) over 15 s of no-op reads at 16 clients (2026-12-07): every
-- batch called `countersign_move_steps` with empty arrays — a batch of reads or of appends
-- only has no transition to move — for 135–146 µs of Postgres time a batch (a fifth of an
-- appends-only batch's 720 µs), and ran the keys' INSERT over empty arrays. Both now run only
-- when the batch has rows for them. Same signature, same answers, same errors: a
-- replacement, safe during a rolling upgrade (docs/deploy.md). Its settings are named again
-- (CREATE OR REPLACE resets them; core/tests/it/catalog.rs checks the plan cache mode of every
-- batch function).
CREATE OR REPLACE FUNCTION countersign_commit_batch(
    chain_id text, last_seq bigint, last_hash text, now_ms bigint, durable boolean,
    t_id text[], t_status text[], t_decision text[], t_rule text[], t_outcome text[],
    t_expires_at int8[], t_approval text[], t_bump int8[], t_not_before int8[],
    t_from text[], t_guard_run text[], t_guard_failed text[], t_guard_switch text[],
    t_key_state text[], t_key_result text[], t_release text[],
    k_step text[], k_key text[], k_hash text[], k_owner text[],
    r_seq int8[], r_at int8[], r_event text[], r_run_id text[], r_step_id text[],
    r_tool text[], r_actor text[], r_rule text[], r_record text[], r_prev text[],
    r_hash text[], t_inserts json)
RETURNS text LANGUAGE plpgsql VOLATILE
-- CREATE OR REPLACE resets a function's settings to the ones it names: migrations 17 and 24's.
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
AS $fn$
DECLARE
    seen_seq bigint;
    seen_hash text;
    seen_at bigint;
    n_moved bigint;
    n_inserted bigint;
    n_reserved bigint;
BEGIN
    IF durable THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    SELECT h.seq, h.hash, h.at INTO seen_seq, seen_hash, seen_at FROM audit_chains h
     WHERE h.chain = chain_id FOR UPDATE;
    IF seen_seq IS DISTINCT FROM last_seq OR seen_hash IS DISTINCT FROM last_hash THEN
        -- The head it found, so that the caller can seal the batch again on it.
        RAISE EXCEPTION 'countersign: the audit head moved' USING ERRCODE = 'CS001',
            DETAIL = COALESCE(seen_seq || ' ' || seen_at || ' ' || seen_hash, '');
    END IF;
    IF COALESCE(cardinality(t_id), 0) > 0 THEN
        SELECT count(*) INTO n_moved FROM countersign_move_steps(now_ms, t_id, t_status,
            t_decision, t_rule, t_outcome, t_expires_at, t_approval, t_bump, t_not_before,
            t_from, t_guard_run, t_guard_failed, t_guard_switch, t_key_state, t_key_result,
            t_release);
        IF n_moved <> cardinality(t_id) THEN
            RAISE EXCEPTION 'countersign: a transition did not move' USING ERRCODE = 'CS002';
        END IF;
    END IF;
    IF t_inserts IS NOT NULL AND json_array_length(t_inserts) > 0 THEN
        SELECT count(*) INTO n_inserted FROM countersign_insert_moved(now_ms, t_inserts);
        IF n_inserted <> json_array_length(t_inserts) THEN
            RAISE EXCEPTION 'countersign: a read was refused' USING ERRCODE = 'CS002';
        END IF;
    END IF;
    IF COALESCE(cardinality(k_key), 0) > 0 THEN
        INSERT INTO idempotency (tenant, idem_key, step_id, inputs_hash, state, result, owner,
                                 created_at, updated_at)
        SELECT (SELECT s.tenant FROM steps s WHERE s.id = k.step), k.idem, k.step, k.inputs,
               'in_flight', NULL, k.who, now_ms, now_ms
          FROM UNNEST(k_key, k_step, k_hash, k_owner) AS k(idem, step, inputs, who)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS n_reserved = ROW_COUNT;
        IF n_reserved <> cardinality(k_key) THEN
            RAISE EXCEPTION 'countersign: a key exists already' USING ERRCODE = 'CS003';
        END IF;
    END IF;
    INSERT INTO audit (chain, seq, at, event, run_id, step_id, tool, actor, rule, record, prev,
                       hash)
    SELECT chain_id, r.* FROM UNNEST(r_seq, r_at, r_event, r_run_id, r_step_id, r_tool,
                                     r_actor, r_rule, r_record, r_prev, r_hash) AS r;
    RETURN current_setting('synchronous_commit');
END
$fn$;

-- A read's run position, as the Rust statements now take it (core/src/store/steps.rs,
-- `NEXT_POSITION_SQL`): the run's last step by the `(run_id, seq)` index, not MAX(seq). A
-- generic plan of `MAX(seq) … WHERE run_id = $1` was seen reading every step of the run (the
-- write benchmark, docs/performance.md); here the plan (generic, forced) happened to stop at
-- the first entry, but the form decides that now, not the statistics. Same rows, same answers.
CREATE OR REPLACE FUNCTION countersign_insert_moved(now_ms bigint, rows_json json)
RETURNS SETOF text LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $fn$
BEGIN
    RETURN QUERY INSERT INTO steps (tenant, id, run_id, seq, role, tool, effect, inputs,
        inputs_hash, idem_key, status, attempts, reason, evidence, observed, trace_id,
        not_before, created_at, updated_at, agent_id, decision, rule, outcome, expires_at,
        approval)
     SELECT (SELECT runs.tenant FROM runs WHERE runs.id = v.run_id), v.id, v.run_id,
        COALESCE((SELECT s.seq FROM steps s WHERE s.run_id = v.run_id
                  ORDER BY s.seq DESC LIMIT 1), 0)
          + row_number() OVER (PARTITION BY v.run_id ORDER BY v.ord),
        v.role, v.tool, v.effect, v.inputs, v.inputs_hash, v.idem_key, v.status, v.attempts,
        v.reason, v.evidence, v.observed, v.trace_id, v.not_before, v.created_at, now_ms,
        v.agent_id, v.decision, v.rule, v.outcome, v.expires_at, v.approval
     FROM json_to_recordset(rows_json) AS v(ord bigint, id text, run_id text, role text,
          tool text, effect text, inputs text, inputs_hash text, idem_key text, status text,
          attempts bigint, reason text, evidence text, observed text, trace_id text,
          not_before bigint, created_at bigint, agent_id text, decision text, rule text,
          outcome text, expires_at bigint, approval text, guard_run text, guard_failed text,
          guard_switch text)
     WHERE (v.guard_run IS NULL OR EXISTS (SELECT 1 FROM runs
               WHERE runs.id = v.guard_run
                 AND (runs.status = 'active' OR runs.status = v.guard_failed)))
       AND (v.guard_switch IS NULL OR NOT EXISTS (SELECT 1 FROM switches
               WHERE name = v.guard_switch
                  OR name = v.guard_switch || ':'
                            || (SELECT runs.tenant FROM runs WHERE runs.id = v.run_id)))
     RETURNING steps.id;
END
$fn$;
