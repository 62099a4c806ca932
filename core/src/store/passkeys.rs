//! Passkeys and signing nonces: who may sign approvals with which key, and the server's
//! single-use challenges.
//!
//! Invariants:
//! * A passkey's registration, removal (by its owner) and revocation (by an admin) are each
//!   stored in one transaction with their audit record, which carries the COSE public key: the
//!   audit trail alone tells which key was a person's when, so signatures verify offline.
//! * A passkey is looked up by tenant, credential id AND person: another person's credential
//!   is no credential of this person. A revoked passkey signs nothing.
//! * A sign counter only moves by a conditional UPDATE from the value the verifier read: two
//!   assertions racing on one counter cannot both be accepted.
//! * A nonce is taken at most once (conditional UPDATE on `used_at IS NULL`), only by the
//!   person and for the purpose it was issued for, and only before it expires.

use serde_json::{Map, Value, json};

use super::{Pool, Store, StoreError, on_pool};
use crate::approvals::Approver;
use crate::audit::{AuditEvent, NewAuditRecord};
use crate::signing::webauthn::{Registered, RelyingParty, b64};
use crate::store::audit_append::{InsertRecords, hold_head, seal_next};

/// The audit rule of a registration.
pub const PASSKEY_REGISTERED_RULE: &str = "passkey.registered";
/// The audit rule of a removal by its owner.
pub const PASSKEY_REMOVED_RULE: &str = "passkey.removed";
/// The audit rule of a revocation by an admin.
pub const PASSKEY_REVOKED_RULE: &str = "passkey.revoked";

/// A registered passkey.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct Passkey {
    /// Tenant.
    pub tenant: String,
    /// Credential id (base64url).
    pub credential_id: String,
    /// Owner's issuer.
    pub iss: String,
    /// Owner's subject.
    pub sub: String,
    /// The owner's name for it.
    pub label: String,
    /// COSE public key (base64url), as registered.
    pub cose_key: String,
    /// Last counter seen.
    pub sign_count: i64,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms of its last signature.
    pub last_used_at: Option<i64>,
    /// Unix ms, once removed or revoked.
    pub revoked_at: Option<i64>,
    /// Who removed or revoked it.
    pub revoked_by: Option<String>,
}

const COLUMNS: &str = "tenant, credential_id, iss, sub, label, cose_key, sign_count, created_at, \
     last_used_at, revoked_at, revoked_by";

/// What taking a nonce found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NonceTaken {
    /// Taken now: its payload.
    Fresh(Value),
    /// Taken before: a replay.
    Used,
    /// Past its expiry.
    Expired,
    /// No such nonce for this person and purpose.
    Unknown,
}

fn passkey_record(tenant: &str, actor: &str, rule: &str, key: &Passkey) -> NewAuditRecord {
    let mut detail = Map::new();
    detail.insert("credential_id".into(), json!(key.credential_id));
    detail.insert("cose_key".into(), json!(key.cose_key));
    detail.insert("iss".into(), json!(key.iss));
    detail.insert("sub".into(), json!(key.sub));
    detail.insert("label".into(), json!(key.label));
    NewAuditRecord {
        event: Some(AuditEvent::Operational),
        run_id: None,
        step_id: None,
        tool: None,
        actor: Some(actor.to_string()),
        rule: Some(rule.to_string()),
        detail,
        tenant: Some(tenant.to_string()),
    }
}

impl Store {
    /// Stores `person`'s new passkey in `tenant`, audited with its public key and the relying
    /// party (RP id and origin) it was registered for. A credential id already registered in
    /// the tenant is refused (`Conflict`).
    pub async fn register_passkey(
        &self,
        tenant: &str,
        person: &Approver,
        label: &str,
        reg: &Registered,
        rp: &RelyingParty,
    ) -> Result<Passkey, StoreError> {
        let key = Passkey {
            tenant: tenant.to_string(),
            credential_id: b64(&reg.credential_id),
            iss: person.iss.clone(),
            sub: person.sub.clone(),
            label: label.to_string(),
            cose_key: b64(&reg.cose_key),
            sign_count: i64::from(reg.sign_count),
            created_at: self.clock.now_ms(),
            last_used_at: None,
            revoked_at: None,
            revoked_by: None,
        };
        let mut new = passkey_record(tenant, &person.actor(), PASSKEY_REGISTERED_RULE, &key);
        new.detail.insert("rp_id".into(), json!(rp.id));
        new.detail.insert("origin".into(), json!(rp.origin));
        let chain = self.chain_for(&[&new]).await?;
        let now = key.created_at;
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr) => {{
                let mut tx = $pool.begin_with($begin).await?;
                // The append lock before any row lock (see `store::group`).
                let mut head: Option<crate::audit::ChainHead> = None;
                let head = hold_head!(&mut *tx, $lock, &mut head, &chain);
                let n = sqlx::query(&format!(
                    "INSERT INTO passkeys ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
                     NULL, NULL, NULL) ON CONFLICT (tenant, credential_id) DO NOTHING"
                ))
                .bind(&key.tenant)
                .bind(&key.credential_id)
                .bind(&key.iss)
                .bind(&key.sub)
                .bind(&key.label)
                .bind(&key.cose_key)
                .bind(key.sign_count)
                .bind(key.created_at)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if n != 1 {
                    tx.rollback().await?;
                    return Err(StoreError::Conflict(
                        "this passkey is registered already".into(),
                    ));
                }
                let sealed = seal_next!(head, &new, AuditEvent::Operational, now);
                InsertRecords::insert_records(&mut *tx, std::slice::from_ref(&sealed)).await?;
                tx.commit().await?;
            }};
        }
        match &self.pool {
            Pool::Sqlite(p) => run_in!(p, "BEGIN IMMEDIATE", false),
            Pool::Postgres(p) => run_in!(p, "BEGIN", true),
        }
        Ok(key)
    }

    /// `person`'s passkeys in `tenant` (revoked ones too), newest first.
    pub async fn passkeys_of(
        &self,
        tenant: &str,
        person: &Approver,
    ) -> Result<Vec<Passkey>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM passkeys WHERE tenant = $1 AND iss = $2 AND sub = $3
             ORDER BY created_at DESC, credential_id"
        );
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(tenant)
                .bind(&person.iss)
                .bind(&person.sub)
                .fetch_all(p)
                .await?
        }))
    }

    /// Every passkey of `tenant` (the admin's view), newest first.
    pub async fn passkeys_of_tenant(&self, tenant: &str) -> Result<Vec<Passkey>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM passkeys WHERE tenant = $1
             ORDER BY created_at DESC, credential_id LIMIT 500"
        );
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql).bind(tenant).fetch_all(p).await?
        }))
    }

    /// `person`'s active (not revoked) passkey `credential_id` in `tenant`, if any.
    pub async fn active_passkey(
        &self,
        tenant: &str,
        person: &Approver,
        credential_id: &str,
    ) -> Result<Option<Passkey>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM passkeys WHERE tenant = $1 AND credential_id = $2
             AND iss = $3 AND sub = $4 AND revoked_at IS NULL"
        );
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(tenant)
                .bind(credential_id)
                .bind(&person.iss)
                .bind(&person.sub)
                .fetch_optional(p)
                .await?
        }))
    }

    /// Ends passkey `credential_id` of `tenant`: by its owner (`owner` = `Some(person)`, who
    /// must own it) or by an admin (`None`). Audited with the key. `false` when there was no
    /// such active passkey (for this owner).
    pub async fn revoke_passkey(
        &self,
        tenant: &str,
        credential_id: &str,
        actor: &str,
        owner: Option<&Approver>,
    ) -> Result<bool, StoreError> {
        let Some(key) = self
            .passkeys_of_tenant_by_id(tenant, credential_id)
            .await?
            .filter(|k| k.revoked_at.is_none())
            .filter(|k| owner.is_none_or(|o| o.iss == k.iss && o.sub == k.sub))
        else {
            return Ok(false);
        };
        let rule = if owner.is_some() {
            PASSKEY_REMOVED_RULE
        } else {
            PASSKEY_REVOKED_RULE
        };
        let new = passkey_record(tenant, actor, rule, &key);
        let chain = self.chain_for(&[&new]).await?;
        macro_rules! run_in {
            ($pool:expr, $begin:expr, $lock:expr) => {{
                let mut tx = $pool.begin_with($begin).await?;
                // The append lock before the row (see `store::group`): a decision signed with
                // this key, which checks it under the same lock, lands wholly before or after.
                let mut head: Option<crate::audit::ChainHead> = None;
                let head = hold_head!(&mut *tx, $lock, &mut head, &chain);
                let now = self.clock.now_ms();
                let n = sqlx::query(
                    "UPDATE passkeys SET revoked_at = $3, revoked_by = $4
                     WHERE tenant = $1 AND credential_id = $2 AND revoked_at IS NULL",
                )
                .bind(tenant)
                .bind(credential_id)
                .bind(now)
                .bind(actor)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if n == 1 {
                    let sealed = seal_next!(head, &new, AuditEvent::Operational, now);
                    InsertRecords::insert_records(&mut *tx, std::slice::from_ref(&sealed)).await?;
                    tx.commit().await?;
                } else {
                    tx.rollback().await?;
                }
                n == 1
            }};
        }
        Ok(match &self.pool {
            Pool::Sqlite(p) => run_in!(p, "BEGIN IMMEDIATE", false),
            Pool::Postgres(p) => run_in!(p, "BEGIN", true),
        })
    }

    async fn passkeys_of_tenant_by_id(
        &self,
        tenant: &str,
        credential_id: &str,
    ) -> Result<Option<Passkey>, StoreError> {
        let sql =
            format!("SELECT {COLUMNS} FROM passkeys WHERE tenant = $1 AND credential_id = $2");
        Ok(on_pool!(self, |p| {
            sqlx::query_as(&sql)
                .bind(tenant)
                .bind(credential_id)
                .fetch_optional(p)
                .await?
        }))
    }

    /// Moves passkey `credential_id`'s counter from `from` to `to` if it still reads `from`
    /// and is active. `false` when another assertion (or a revocation) came first.
    pub async fn advance_sign_count(
        &self,
        tenant: &str,
        credential_id: &str,
        from: i64,
        to: i64,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now_ms();
        let n = on_pool!(self, |p| {
            sqlx::query(
                "UPDATE passkeys SET sign_count = $4, last_used_at = $5
                 WHERE tenant = $1 AND credential_id = $2 AND sign_count = $3
                   AND revoked_at IS NULL",
            )
            .bind(tenant)
            .bind(credential_id)
            .bind(from)
            .bind(to)
            .bind(now)
            .execute(p)
            .await?
            .rows_affected()
        });
        Ok(n == 1)
    }

    /// Issues a nonce for `person`'s ceremony `purpose` carrying `payload`, valid `ttl_ms`
    /// (long-expired nonces of the tenant are swept on the way).
    pub async fn issue_nonce(
        &self,
        tenant: &str,
        person: &Approver,
        purpose: &str,
        payload: &Value,
        ttl_ms: i64,
    ) -> Result<String, StoreError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw)
            .map_err(|e| StoreError::Conflict(format!("random source: {e}")))?;
        let nonce = b64(&raw);
        let now = self.clock.now_ms();
        let payload = payload.to_string();
        on_pool!(self, |p| {
            sqlx::query("DELETE FROM signing_nonces WHERE tenant = $1 AND expires_at < $2")
                .bind(tenant)
                .bind(now - SWEEP_AFTER_MS)
                .execute(p)
                .await?;
            sqlx::query(
                "INSERT INTO signing_nonces (tenant, nonce, purpose, iss, sub, payload,
                 created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(tenant)
            .bind(&nonce)
            .bind(purpose)
            .bind(&person.iss)
            .bind(&person.sub)
            .bind(&payload)
            .bind(now)
            .bind(now.saturating_add(ttl_ms))
            .execute(p)
            .await?;
        });
        Ok(nonce)
    }

    /// Takes `nonce` for `person`'s ceremony `purpose`: at most once, before it expires.
    pub async fn take_nonce(
        &self,
        tenant: &str,
        person: &Approver,
        purpose: &str,
        nonce: &str,
    ) -> Result<NonceTaken, StoreError> {
        let now = self.clock.now_ms();
        let row: Option<(String, i64, Option<i64>)> = on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT payload, expires_at, used_at FROM signing_nonces
                 WHERE tenant = $1 AND nonce = $2 AND iss = $3 AND sub = $4 AND purpose = $5",
            )
            .bind(tenant)
            .bind(nonce)
            .bind(&person.iss)
            .bind(&person.sub)
            .bind(purpose)
            .fetch_optional(p)
            .await?
        });
        let Some((payload, expires_at, used_at)) = row else {
            return Ok(NonceTaken::Unknown);
        };
        if used_at.is_some() {
            return Ok(NonceTaken::Used);
        }
        if now >= expires_at {
            return Ok(NonceTaken::Expired);
        }
        let n = on_pool!(self, |p| {
            sqlx::query(
                "UPDATE signing_nonces SET used_at = $3
                 WHERE tenant = $1 AND nonce = $2 AND used_at IS NULL",
            )
            .bind(tenant)
            .bind(nonce)
            .bind(now)
            .execute(p)
            .await?
            .rows_affected()
        });
        if n != 1 {
            return Ok(NonceTaken::Used);
        }
        Ok(serde_json::from_str(&payload).map_or(NonceTaken::Unknown, NonceTaken::Fresh))
    }
}

/// Nonces expired longer than this are deleted when new ones are issued (a day: a replay of
/// an older one finds no nonce and is refused as unknown).
const SWEEP_AFTER_MS: i64 = 24 * 60 * 60 * 1000;
