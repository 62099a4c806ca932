-- Countersign schema v17 (postgres dialect): every tenant-scoped table carries its tenant, and
-- its primary and unique keys start with it (issue 39, item 5: ready to distribute by tenant,
-- e.g. Citus with `tenant` as the distribution column). Keep in step with
-- migrations/sqlite/0017_tenant_keys.sql (same columns; SQLite keeps its keys: one file has
-- nothing to distribute).
--
-- * `steps`, `idempotency`, `approvals`, `step_duties` and `stop_revocations` gain `tenant`,
--   filled from their parent row (a step's run, a key's / approval's / duty's step, a
--   revocation's credential). Writers derive it the same way, in the statement that writes
--   the row, so it cannot disagree with the parent; the composite foreign keys below refuse a
--   row whose tenant differs from its parent's.
-- * Keys: (tenant, id) for runs, steps, credentials, approvals, grants; (tenant, idem_key) for
--   keys; every unique constraint starts with the tenant. The audit tables start with `chain`,
--   which is the tenant (or `_system` / `_legacy`).
-- * Plain (non-unique) indexes on the bare ids keep today's look-ups by id fast on one
--   Postgres. Under distribution they are per shard; a look-up without the tenant then asks
--   every shard (docs/deploy.md).
-- * Global tables (no tenant; reference tables when distributed): registry_versions,
--   registry_proposals, switches, audit_tree_heads, audit_checkpoints (legacy),
--   tower_sessions.session, and the demo ERP's own demo_objects / demo_effects (the stand-in
--   target system, keyed its own way). `audit_chains` is keyed by the chain (the tenant).
--   Test: core/tests/it/catalog.rs.

-- 1. The tenant column where it was missing, filled from the parent row.
ALTER TABLE steps ADD COLUMN tenant TEXT;
UPDATE steps SET tenant = runs.tenant FROM runs WHERE runs.id = steps.run_id;
ALTER TABLE steps ALTER COLUMN tenant SET NOT NULL;
ALTER TABLE idempotency ADD COLUMN tenant TEXT;
UPDATE idempotency SET tenant = steps.tenant FROM steps WHERE steps.id = idempotency.step_id;
ALTER TABLE idempotency ALTER COLUMN tenant SET NOT NULL;
ALTER TABLE approvals ADD COLUMN tenant TEXT;
UPDATE approvals SET tenant = steps.tenant FROM steps WHERE steps.id = approvals.step_id;
ALTER TABLE approvals ALTER COLUMN tenant SET NOT NULL;
ALTER TABLE step_duties ADD COLUMN tenant TEXT;
UPDATE step_duties SET tenant = steps.tenant FROM steps WHERE steps.id = step_duties.step_id;
ALTER TABLE step_duties ALTER COLUMN tenant SET NOT NULL;
ALTER TABLE stop_revocations ADD COLUMN tenant TEXT;
UPDATE stop_revocations SET tenant = agent_credentials.tenant FROM agent_credentials
 WHERE agent_credentials.id = stop_revocations.agent_id;
-- A revocation of a credential that no longer exists could never be restored: it goes (the
-- table had no foreign key until now; it has one below).
DELETE FROM stop_revocations WHERE tenant IS NULL;
ALTER TABLE stop_revocations ALTER COLUMN tenant SET NOT NULL;

-- 2. Foreign keys and keys that do not start with the tenant go.
ALTER TABLE agent_credentials DROP CONSTRAINT agent_credentials_run_id_fkey;
ALTER TABLE runs DROP CONSTRAINT runs_agent_id_fkey;
ALTER TABLE steps DROP CONSTRAINT steps_run_id_fkey;
ALTER TABLE idempotency DROP CONSTRAINT idempotency_step_id_fkey;
ALTER TABLE approvals DROP CONSTRAINT approvals_step_id_fkey;
ALTER TABLE step_duties DROP CONSTRAINT step_duties_step_id_fkey,
    DROP CONSTRAINT step_duties_reviewed_by_fkey, DROP CONSTRAINT step_duties_assignee_fkey;
ALTER TABLE agent_credentials DROP CONSTRAINT agent_credentials_pkey,
    DROP CONSTRAINT agent_credentials_token_hash_key;
DROP INDEX agent_credentials_active_name;
ALTER TABLE runs DROP CONSTRAINT runs_pkey;
DROP INDEX runs_session_key;
ALTER TABLE steps DROP CONSTRAINT steps_pkey, DROP CONSTRAINT steps_idem_key_key,
    DROP CONSTRAINT steps_run_id_seq_key;
DROP INDEX steps_dedupe;
ALTER TABLE idempotency DROP CONSTRAINT idempotency_pkey;
ALTER TABLE approvals DROP CONSTRAINT approvals_pkey, DROP CONSTRAINT approvals_token_hash_key,
    DROP CONSTRAINT approvals_step_id_approver_iss_approver_sub_key;
ALTER TABLE step_duties DROP CONSTRAINT step_duties_pkey;
ALTER TABLE stop_revocations DROP CONSTRAINT stop_revocations_pkey;
ALTER TABLE standing_authorizations DROP CONSTRAINT standing_authorizations_pkey;

-- 3. Tenant-first keys.
ALTER TABLE agent_credentials ADD PRIMARY KEY (tenant, id),
    ADD CONSTRAINT agent_credentials_token_hash_key UNIQUE (tenant, token_hash);
CREATE UNIQUE INDEX agent_credentials_active_name ON agent_credentials (tenant, name)
    WHERE revoked_at IS NULL;
ALTER TABLE runs ADD PRIMARY KEY (tenant, id);
CREATE UNIQUE INDEX runs_session_key ON runs (tenant, session_key) WHERE session_key IS NOT NULL;
ALTER TABLE steps ADD PRIMARY KEY (tenant, id),
    ADD CONSTRAINT steps_idem_key_key UNIQUE (tenant, idem_key),
    ADD CONSTRAINT steps_run_id_seq_key UNIQUE (tenant, run_id, seq);
CREATE UNIQUE INDEX steps_dedupe ON steps (tenant, dedupe) WHERE dedupe IS NOT NULL;
ALTER TABLE idempotency ADD PRIMARY KEY (tenant, idem_key);
ALTER TABLE approvals ADD PRIMARY KEY (tenant, id),
    ADD CONSTRAINT approvals_token_hash_key UNIQUE (tenant, token_hash),
    ADD CONSTRAINT approvals_one_per_approver UNIQUE (tenant, step_id, approver_iss, approver_sub);
ALTER TABLE step_duties ADD PRIMARY KEY (tenant, step_id);
ALTER TABLE stop_revocations ADD PRIMARY KEY (tenant, switch, agent_id);
ALTER TABLE standing_authorizations ADD PRIMARY KEY (tenant, id);

-- 4. Foreign keys within a tenant: a child's tenant is its parent's.
ALTER TABLE agent_credentials ADD CONSTRAINT agent_credentials_run_fkey
    FOREIGN KEY (tenant, run_id) REFERENCES runs (tenant, id);
ALTER TABLE runs ADD CONSTRAINT runs_agent_fkey
    FOREIGN KEY (tenant, agent_id) REFERENCES agent_credentials (tenant, id);
ALTER TABLE steps ADD CONSTRAINT steps_run_fkey
    FOREIGN KEY (tenant, run_id) REFERENCES runs (tenant, id);
ALTER TABLE idempotency ADD CONSTRAINT idempotency_step_fkey
    FOREIGN KEY (tenant, step_id) REFERENCES steps (tenant, id);
ALTER TABLE approvals ADD CONSTRAINT approvals_step_fkey
    FOREIGN KEY (tenant, step_id) REFERENCES steps (tenant, id);
ALTER TABLE step_duties ADD CONSTRAINT step_duties_step_fkey
    FOREIGN KEY (tenant, step_id) REFERENCES steps (tenant, id),
    ADD CONSTRAINT step_duties_reviewer_fkey
    FOREIGN KEY (tenant, reviewed_by) REFERENCES agent_credentials (tenant, id),
    ADD CONSTRAINT step_duties_assignee_fkey
    FOREIGN KEY (tenant, assignee) REFERENCES agent_credentials (tenant, id);
ALTER TABLE stop_revocations ADD CONSTRAINT stop_revocations_agent_fkey
    FOREIGN KEY (tenant, agent_id) REFERENCES agent_credentials (tenant, id);

-- 5. Look-ups by bare id (one Postgres): plain indexes.
CREATE INDEX agent_credentials_id ON agent_credentials (id);
CREATE INDEX agent_credentials_token ON agent_credentials (token_hash);
CREATE INDEX runs_id ON runs (id);
CREATE INDEX runs_session ON runs (session_key) WHERE session_key IS NOT NULL;
CREATE INDEX steps_id ON steps (id);
-- A run's steps in order (the next position, the claim's "earlier step of the run", the
-- timeline): the unique key it used to ride on now starts with the tenant.
CREATE INDEX steps_run ON steps (run_id, seq);
CREATE INDEX steps_dedupe_key ON steps (dedupe) WHERE dedupe IS NOT NULL;
CREATE INDEX idempotency_key ON idempotency (idem_key);
CREATE INDEX approvals_id ON approvals (id);
CREATE INDEX approvals_token ON approvals (token_hash);
CREATE INDEX step_duties_step ON step_duties (step_id);
CREATE INDEX stop_revocations_switch ON stop_revocations (switch, agent_id);
CREATE INDEX standing_authorizations_id ON standing_authorizations (id);

-- 6. The one-trip batch (migration 16) reserves keys with their tenant, and a refusal because
-- the head moved (another process appended) names the head it found (`seq at hash`), so the
-- caller seals the batch again on it and retries in one trip instead of taking the long path
-- (core/src/store/group.rs).
CREATE OR REPLACE FUNCTION countersign_commit_batch(
    chain_id text, last_seq bigint, last_hash text, now_ms bigint, durable boolean,
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
    seen_at bigint;
    n_moved bigint;
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
    SELECT count(*) INTO n_moved FROM countersign_move_steps(now_ms, t_id, t_status,
        t_decision, t_rule, t_outcome, t_expires_at, t_approval, t_bump, t_not_before, t_from,
        t_guard_run, t_guard_failed, t_guard_switch, t_key_state, t_key_result, t_release);
    IF n_moved <> COALESCE(cardinality(t_id), 0) THEN
        RAISE EXCEPTION 'countersign: a transition did not move' USING ERRCODE = 'CS002';
    END IF;
    INSERT INTO idempotency (tenant, idem_key, step_id, inputs_hash, state, result, owner,
                             created_at, updated_at)
    SELECT (SELECT s.tenant FROM steps s WHERE s.id = k.step), k.idem, k.step, k.inputs,
           'in_flight', NULL, k.who, now_ms, now_ms
      FROM UNNEST(k_key, k_step, k_hash, k_owner) AS k(idem, step, inputs, who)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS n_reserved = ROW_COUNT;
    IF n_reserved <> COALESCE(cardinality(k_key), 0) THEN
        RAISE EXCEPTION 'countersign: a key exists already' USING ERRCODE = 'CS003';
    END IF;
    INSERT INTO audit (chain, seq, at, event, run_id, step_id, tool, actor, rule, record, prev,
                       hash)
    SELECT chain_id, r.* FROM UNNEST(r_seq, r_at, r_event, r_run_id, r_step_id, r_tool,
                                     r_actor, r_rule, r_record, r_prev, r_hash) AS r;
    RETURN current_setting('synchronous_commit');
END
$fn$;

-- 7. Generic plans for the batch functions (the audit trigger they fire runs under the same
-- setting; its statements take no parameters). A later CREATE OR REPLACE of either function
-- must repeat the setting: core/tests/it/catalog.rs checks it. Under the default `plan_cache_mode` Postgres kept
-- re-planning their statements on every call (a custom plan looked cheaper than the generic
-- one), which cost more than the rest of a small batch: measured on the 2-core VM, 0.28 ms
-- per `countersign_move_steps` call of nothing vs 0.07 ms, and a one-trip batch of 4 records
-- 0.63 ms vs 0.41 ms (docs/performance.md, "Audit appends with one chain per tenant"). Their statements take arrays and join on keys, so
-- one plan fits every batch.
ALTER FUNCTION countersign_move_steps(bigint, text[], text[], text[], text[], text[], int8[],
    text[], int8[], int8[], text[], text[], text[], text[], text[], text[], text[])
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION countersign_commit_batch(text, bigint, text, bigint, boolean, text[], text[],
    text[], text[], text[], int8[], text[], int8[], int8[], text[], text[], text[], text[],
    text[], text[], text[], text[], text[], text[], text[], int8[], int8[], text[], text[],
    text[], text[], text[], text[], text[], text[], text[])
    SET plan_cache_mode = force_generic_plan;
