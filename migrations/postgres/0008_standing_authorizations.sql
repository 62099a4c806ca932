-- Countersign schema v8 (postgres dialect): standing authorizations. Keep in step with the other dialect.
-- A party (the person an agent acts for, e.g. a traveller) lets calls of one tool run without
-- asking, under conditions, until an instant (seed 004: "move my reservation by at most 30
-- minutes"). Rows are never edited except to stamp a revocation once; granting and revoking
-- each commit with their audit record. The policy engine decides whether a grant covers a call.
-- conditions: JSON array of countersign_core::policy::AuthorizationCondition
--   ("owns_resource", {"max_shift_minutes": 30}, {"max_amount_minor": 100000},
--    {"only_arguments": ["reservation_id", ...]}).
-- expires_at, granted_at, revoked_at: Unix ms.

CREATE TABLE standing_authorizations (
    id             TEXT PRIMARY KEY NOT NULL,
    tenant         TEXT NOT NULL,
    party          TEXT NOT NULL,
    tool           TEXT NOT NULL,
    conditions     TEXT NOT NULL,
    expires_at     BIGINT NOT NULL,
    reason         TEXT NOT NULL,
    granted_by     TEXT NOT NULL,
    granted_at     BIGINT NOT NULL,
    revoked_at     BIGINT,
    revoked_by     TEXT,
    revoke_reason  TEXT,
    CHECK ((revoked_at IS NULL AND revoked_by IS NULL AND revoke_reason IS NULL)
        OR (revoked_at IS NOT NULL AND revoked_by IS NOT NULL AND revoke_reason IS NOT NULL))
);

CREATE INDEX standing_authorizations_holder ON standing_authorizations (tenant, party, tool);
