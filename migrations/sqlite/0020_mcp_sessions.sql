-- Countersign schema v20 (sqlite dialect): MCP sessions in the database, so that any replica
-- serves any session (issue 31). Keep in step with the other dialect.
--
-- A row is a session an agent's `initialize` opened: who opened it (the credential, within its
-- tenant), the client's initialize parameters (JSON: what a replica that has not seen the
-- session replays to restore it), when it opened, when a request last touched it (refreshed at
-- most once a minute per replica) and when it ended (DELETE /mcp on any replica). A session is
-- live while it has not ended and was touched within the idle limit
-- (server/src/mcp/sessions.rs); the per-agent session cap counts live rows.
CREATE TABLE mcp_sessions (
    tenant     TEXT NOT NULL,
    id         TEXT NOT NULL,
    agent_id   TEXT NOT NULL,
    params     TEXT NOT NULL,
    opened_at  BIGINT NOT NULL,
    seen_at    BIGINT NOT NULL,
    ended_at   BIGINT,
    PRIMARY KEY (tenant, id)
);
-- The cap: an agent's sessions not ended.
CREATE INDEX mcp_sessions_agent_open ON mcp_sessions (tenant, agent_id, seen_at)
 WHERE ended_at IS NULL;
-- Every replica polls for sessions ended elsewhere.
CREATE INDEX mcp_sessions_ended ON mcp_sessions (ended_at) WHERE ended_at IS NOT NULL;
-- The sweep of old rows.
CREATE INDEX mcp_sessions_seen ON mcp_sessions (seen_at);
