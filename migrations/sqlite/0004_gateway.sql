-- Countersign schema v4: the gateway's runs, steps, keys, approvals and demo targets.
-- Same tables and columns in both dialects. Timestamps are Unix ms, JSON is canonical TEXT.

-- A run opened for an MCP session (or an agent's direct calls) is found again by this key:
-- sha256(agent credential id, session id). NULL for runs opened any other way.
ALTER TABLE runs ADD COLUMN session_key TEXT;
CREATE UNIQUE INDEX runs_session_key ON runs (session_key);
-- Where the task came from (user, schedule, monitor, external): policies read it.
ALTER TABLE runs ADD COLUMN origin TEXT NOT NULL DEFAULT 'user';
-- A planned run (plan.submit) is executed by the executor workers, step by step in seq order;
-- other runs' steps run when their agent calls.
ALTER TABLE runs ADD COLUMN planned BOOLEAN NOT NULL DEFAULT FALSE;
-- Why a run stopped (cancel reason, emergency stop, failure).
ALTER TABLE runs ADD COLUMN reason TEXT NOT NULL DEFAULT '';

-- A write's identity inside its run: sha256(run, tool, inputs hash). Two identical writes in
-- one run are one step (and one key), however many callers race to create it. NULL for reads,
-- which run every time.
ALTER TABLE steps ADD COLUMN dedupe TEXT;
CREATE UNIQUE INDEX steps_dedupe ON steps (dedupe);
-- When a gate opened for this step stops accepting approvals.
ALTER TABLE steps ADD COLUMN expires_at BIGINT;
-- The agent credential that proposed the step.
ALTER TABLE steps ADD COLUMN agent_id TEXT;
-- Executor lease: the worker holding the step and until when (Unix ms). An expired lease on
-- a pending step lets another worker claim it; a running step whose worker vanished is
-- reconciled by asking the target by key.
ALTER TABLE steps ADD COLUMN claimed_by TEXT;
ALTER TABLE steps ADD COLUMN lease_until BIGINT;
CREATE INDEX steps_run ON steps (run_id, seq);

-- The key-to-result table in front of every adapter: a key is reserved before the call,
-- and the outcome stored under it. Same key + other inputs is refused (idempotency.mismatch).
CREATE TABLE idempotency (
    idem_key     TEXT PRIMARY KEY NOT NULL,
    step_id      TEXT NOT NULL REFERENCES steps (id),
    inputs_hash  TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('in_flight', 'done', 'failed', 'unknown')),
    result       TEXT,
    owner        TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);

-- Approvals (and rejections) of gated steps, bound to the step's inputs hash. Only the
-- token's hash is stored.
CREATE TABLE approvals (
    id           TEXT PRIMARY KEY NOT NULL,
    step_id      TEXT NOT NULL REFERENCES steps (id),
    inputs_hash  TEXT NOT NULL,
    decision     TEXT NOT NULL CHECK (decision IN ('approved', 'rejected')),
    approver_iss TEXT NOT NULL,
    approver_sub TEXT NOT NULL,
    reason       TEXT NOT NULL,
    token_hash   TEXT NOT NULL UNIQUE,
    decided_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    UNIQUE (step_id, approver_iss, approver_sub)
);
CREATE INDEX approvals_step ON approvals (step_id);

-- State of the built-in demo target systems (finance ERP, StillOn): objects by kind and id,
-- versioned so a change underneath is visible, and the effects they applied, by key.
CREATE TABLE demo_objects (
    system   TEXT NOT NULL,
    kind     TEXT NOT NULL,
    id       TEXT NOT NULL,
    tenant   TEXT NOT NULL,
    data     TEXT NOT NULL,
    version  BIGINT NOT NULL,
    PRIMARY KEY (system, kind, id)
);
CREATE TABLE demo_effects (
    system      TEXT NOT NULL,
    idem_key    TEXT NOT NULL,
    operation   TEXT NOT NULL,
    request     TEXT NOT NULL,
    result      TEXT NOT NULL,
    at          BIGINT NOT NULL,
    PRIMARY KEY (system, idem_key)
);

-- Process-wide switches (the emergency stop), one row per name.
CREATE TABLE switches (
    name      TEXT PRIMARY KEY NOT NULL,
    value     TEXT NOT NULL,
    set_by    TEXT NOT NULL,
    set_at    BIGINT NOT NULL
);
