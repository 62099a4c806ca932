-- The one-trip batch skips what a batch does not carry (issue 34). Measured with
-- pg_stat_statements (track = all) over 15 s of no-op reads at 16 clients (2026-12-07): every
-- batch called `countersign_move_steps` with empty arrays — a batch of reads or of appends
-- only has no transition to move — for 135–146 µs of Postgres time a batch (a fifth of an
-- appends-only batch's 720 µs), and ran the keys' INSERT over empty arrays. Both now run only
-- when the batch has rows for them. Same signature, same answers, same errors: a
-- replacement, safe during a rolling upgrade (docs/deploy.md). Its settings are named again
-- (CREATE OR REPLACE resets them; core/tests/it/catalog.rs checks them).
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
