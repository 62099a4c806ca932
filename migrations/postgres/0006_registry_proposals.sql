-- Countersign schema v6 (postgres dialect): proposed registry changes. Keep in step with the other dialect.
-- An admin proposes a change to the role x tool listing against a base registry version; a
-- second admin approves it (which stores a new registry version) or rejects it. A proposal
-- whose base version is no longer current when it is approved is superseded, never applied.
-- changes: JSON array of {"tool", "role", "op": "add"|"remove"}, in a stable order.

CREATE TABLE registry_proposals (
    id               TEXT PRIMARY KEY NOT NULL,
    proposer         TEXT NOT NULL,
    proposer_name    TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    base_version     BIGINT NOT NULL,
    changes          TEXT NOT NULL,
    note             TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('proposed', 'approved', 'rejected', 'superseded')),
    decided_by       TEXT,
    decided_at       BIGINT,
    decision_reason  TEXT,
    applied_version  BIGINT
);

CREATE INDEX registry_proposals_created ON registry_proposals (created_at);
