-- One active credential per name, held by the database: two creations at once can no longer
-- both succeed (and `revoke NAME` then miss one). Active duplicates made before this index
-- existed are ended first, keeping the newest of each name (fail closed: a revoked duplicate
-- is refused on its next request; the operator issues a new one if it was needed).
UPDATE agent_credentials SET revoked_at = created_at
 WHERE revoked_at IS NULL
   AND EXISTS (SELECT 1 FROM agent_credentials newer
                WHERE newer.name = agent_credentials.name
                  AND newer.revoked_at IS NULL
                  AND (newer.created_at > agent_credentials.created_at
                       OR (newer.created_at = agent_credentials.created_at
                           AND newer.id > agent_credentials.id)));
CREATE UNIQUE INDEX agent_credentials_active_name ON agent_credentials (name)
 WHERE revoked_at IS NULL;
