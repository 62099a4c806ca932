-- Countersign schema v21 (postgres dialect): agents that authenticate with OAuth access tokens
-- (issue 32). Keep in step with the other dialect.
--
-- An agent credential registered for a client of an authorization server names it: the
-- issuer (exactly as configured in agent_oauth_issuers) and the token's client_id.
-- Such a credential has no usable token of its own (its token_hash is of a token never shown);
-- everything else about it — role, tenant, creator, revocation, audit — is a credential's.
ALTER TABLE agent_credentials ADD COLUMN oauth_issuer TEXT;
ALTER TABLE agent_credentials ADD COLUMN oauth_client TEXT;
CREATE INDEX agent_credentials_oauth ON agent_credentials (oauth_issuer, oauth_client)
 WHERE oauth_issuer IS NOT NULL;
