-- Countersign schema v1 (SQLite dialect). Keep in step with migrations/postgres/0001_initial.sql:
-- same tables, same columns, same constraints; only types and trigger syntax differ.
-- Timestamps are Unix milliseconds (BIGINT); JSON is TEXT holding canonical bytes.

CREATE TABLE agent_credentials (
    id          TEXT PRIMARY KEY NOT NULL,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    token_hash  TEXT NOT NULL UNIQUE,
    created_by  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT,
    revoked_at  BIGINT
);

CREATE TABLE runs (
    id          TEXT PRIMARY KEY NOT NULL,
    tenant      TEXT NOT NULL,
    principal   TEXT NOT NULL,
    agent_id    TEXT REFERENCES agent_credentials (id),
    task        TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('active', 'done', 'failed', 'cancelled', 'stopped')),
    replan      BOOLEAN NOT NULL DEFAULT FALSE,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX runs_tenant_created ON runs (tenant, created_at);

CREATE TABLE steps (
    id           TEXT PRIMARY KEY NOT NULL,
    run_id       TEXT NOT NULL REFERENCES runs (id),
    seq          INTEGER NOT NULL,
    role         TEXT NOT NULL,
    tool         TEXT NOT NULL,
    effect       TEXT NOT NULL CHECK (effect IN ('read', 'write', 'irreversible')),
    inputs       TEXT NOT NULL,
    inputs_hash  TEXT NOT NULL,
    idem_key     TEXT NOT NULL UNIQUE,
    status       TEXT NOT NULL CHECK (status IN ('pending', 'running', 'needs_approval', 'done',
                                                 'failed', 'refused', 'unknown', 'cancelled', 'expired')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    decision     TEXT,
    rule         TEXT,
    approval     TEXT,
    outcome      TEXT,
    reason       TEXT NOT NULL DEFAULT '',
    evidence     TEXT NOT NULL DEFAULT '[]',
    observed     TEXT,
    trace_id     TEXT,
    not_before   BIGINT NOT NULL DEFAULT 0,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    UNIQUE (run_id, seq)
);
CREATE INDEX steps_queue ON steps (not_before, created_at) WHERE status = 'pending';
CREATE INDEX steps_status ON steps (status, updated_at);

-- The audit chain. seq is assigned by the appender (head + 1), never by a sequence, so a
-- gap or a fork is impossible: two appenders racing for the same seq collide on the key.
CREATE TABLE audit (
    seq      BIGINT PRIMARY KEY NOT NULL,
    at       BIGINT NOT NULL,
    event    TEXT NOT NULL,
    run_id   TEXT,
    step_id  TEXT,
    tool     TEXT,
    actor    TEXT,
    rule     TEXT,
    record   TEXT NOT NULL,
    prev     TEXT NOT NULL,
    hash     TEXT NOT NULL UNIQUE
);
CREATE INDEX audit_run ON audit (run_id, seq);
CREATE INDEX audit_at ON audit (at);

CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN
    SELECT RAISE(ABORT, 'audit is append-only: UPDATE refused');
END;

CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN
    SELECT RAISE(ABORT, 'audit is append-only: DELETE refused');
END;

-- Browser sessions, in the layout tower-sessions-sqlx-store's SqliteStore expects.
CREATE TABLE tower_sessions (
    id           TEXT PRIMARY KEY NOT NULL,
    data         BLOB NOT NULL,
    expiry_date  INTEGER NOT NULL
);
