-- Countersign schema v22 (sqlite dialect): escalations, what only a person can settle (issue 36).
-- Keep in step with the other dialect.
--
-- Tenant-scoped (keys start with the tenant). At most one open row per (step, kind): a step left `unknown` past reconciliation ('unknown'), a write
-- whose undo needs a person ('undo'), or an effect nobody can undo here ('manual').
-- first_*: the first of two people settling an unknown of an irreversible tool.
-- undo_step / undo_by / undo_at: the compensation a person's undo started (at most one at a
-- time; freed only when it never ran).
-- closed_*: how it ended (settled, not_happened, undone, acknowledged, reconciled).
CREATE TABLE escalations (
    id              TEXT NOT NULL,
    tenant          TEXT NOT NULL,
    run_id          TEXT NOT NULL,
    step_id         TEXT NOT NULL,
    kind            TEXT NOT NULL,
    reason          TEXT NOT NULL,
    opened_at       BIGINT NOT NULL,
    first_by        TEXT,
    first_outcome   TEXT,
    first_reference TEXT,
    first_at        BIGINT,
    undo_step       TEXT,
    undo_by         TEXT,
    undo_at         BIGINT,
    closed_at       BIGINT,
    closed_by       TEXT,
    resolution      TEXT,
    note            TEXT,
    PRIMARY KEY (tenant, id)
);
-- One OPEN escalation per (step, kind): a step that goes unknown again after reconciliation
-- settled it is escalated again.
CREATE UNIQUE INDEX escalations_open_step ON escalations (tenant, step_id, kind)
 WHERE closed_at IS NULL;
CREATE INDEX escalations_open ON escalations (tenant, opened_at) WHERE closed_at IS NULL;
CREATE INDEX escalations_step ON escalations (step_id);
CREATE INDEX escalations_id ON escalations (id);

-- people: the display name each signed-in person last had (display only: pages name people, not
-- subjects; never consulted for a decision). Written at sign-in.
CREATE TABLE people (
    tenant  TEXT NOT NULL,
    iss     TEXT NOT NULL,
    sub     TEXT NOT NULL,
    name    TEXT NOT NULL,
    seen_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, iss, sub)
);
