-- Countersign schema v15 (sqlite dialect): emergency stops per tenant. Keep in step with the
-- other dialect.
-- A stop for one tenant is the switch row `emergency_stop:<tenant>` beside the platform-wide
-- `emergency_stop` (core/src/store/stops.rs); every switch check reads both.
-- stop_revocations: the credentials a stop revoked (with the revoked_at it wrote), so that
-- lifting the stop can restore them, explicitly and audited.

CREATE TABLE stop_revocations (
    switch      TEXT NOT NULL,
    agent_id    TEXT NOT NULL,
    revoked_at  BIGINT NOT NULL,
    PRIMARY KEY (switch, agent_id)
);
