-- Countersign schema v23 (postgres dialect): passkeys that sign approvals (issue 38).
-- Keep in step with the other dialect.
--
-- passkeys: each person's registered WebAuthn credentials (tenant-scoped). cose_key is the
-- COSE public key as registered (base64url), also recorded in the registration's audit record
-- so that signatures verify from the audit trail alone. sign_count: the last counter seen.
-- Revoked keys stay (revoked_at, revoked_by): earlier signatures still name them.
CREATE TABLE passkeys (
    tenant        TEXT NOT NULL,
    credential_id TEXT NOT NULL,
    iss           TEXT NOT NULL,
    sub           TEXT NOT NULL,
    label         TEXT NOT NULL,
    cose_key      TEXT NOT NULL,
    sign_count    BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    last_used_at  BIGINT,
    revoked_at    BIGINT,
    revoked_by    TEXT,
    PRIMARY KEY (tenant, credential_id)
);
CREATE INDEX passkeys_person ON passkeys (tenant, iss, sub);

-- signing_nonces: server nonces a WebAuthn ceremony signs, each used at most once (used_at
-- is set by a conditional UPDATE) and only by the person and purpose it was issued for.
-- payload: what the challenge binds besides the nonce (JSON).
CREATE TABLE signing_nonces (
    tenant     TEXT NOT NULL,
    nonce      TEXT NOT NULL,
    purpose    TEXT NOT NULL,
    iss        TEXT NOT NULL,
    sub        TEXT NOT NULL,
    payload    TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    used_at    BIGINT,
    PRIMARY KEY (tenant, nonce)
);
CREATE INDEX signing_nonces_expiry ON signing_nonces (tenant, expires_at);

-- approvals.signature: the WebAuthn assertion a signed approval carries (JSON: credential id,
-- authenticator data, client data JSON, signature, nonce, what was signed), NULL when unsigned.
ALTER TABLE approvals ADD COLUMN signature TEXT;
