//! Who a call is made for, and the standing authorizations that party holds.
//!
//! INTERIM STORAGE (for the lead to replace with proper tables): both live in `demo_objects`
//! under system [`SYSTEM`] (`countersign`):
//! * kind [`ACTS_FOR`], id = an agent credential id, data `{"party": "user-123"}`: the person
//!   that credential's runs act for (seed 004: the StillOn agents act for the traveller);
//! * kind [`GRANT`], id = the grant id, data = a [`StandingAuthorization`] as JSON.
//!
//! Invariants (fail closed):
//! * A binding or grant of another tenant than the credential's is ignored.
//! * No binding → no `acts_for` (the policy engine then checks ownership against the agent
//!   itself, which owns nothing).
//! * A grant that does not parse covers nothing; only grants held by the call's party are
//!   handed to the engine, which alone decides whether one covers the call (it never lifts a
//!   deny or a floor).

use countersign_core::policy::{AuthorizationCondition, StandingAuthorization};
use countersign_core::store::AgentCredential;
use countersign_core::{Store, StoreError};
use serde_json::{Value, json};

/// The pseudo-system the interim records live under.
pub const SYSTEM: &str = "countersign";
/// Kind of an agent → party binding.
pub const ACTS_FOR: &str = "acts_for";
/// Kind of a standing authorization.
pub const GRANT: &str = "standing_authorization";

/// The party `credential`'s calls are made for, and the grants that party holds.
pub async fn party_of(
    store: &Store,
    credential: &AgentCredential,
) -> Result<(Option<String>, Vec<StandingAuthorization>), StoreError> {
    let party = store
        .demo_get(SYSTEM, ACTS_FOR, &credential.id)
        .await?
        .filter(|o| o.tenant == credential.tenant)
        .and_then(|o| serde_json::from_str::<Value>(&o.data).ok())
        .and_then(|v| v.get("party").and_then(Value::as_str).map(str::to_string));
    let held_by = party.clone().unwrap_or_else(|| credential.id.clone());
    let grants = store
        .demo_list(SYSTEM, GRANT)
        .await?
        .into_iter()
        .filter(|o| o.tenant == credential.tenant)
        .filter_map(|o| serde_json::from_str::<StandingAuthorization>(&o.data).ok())
        .filter(|g| g.principal == held_by)
        .collect();
    Ok((party, grants))
}

/// Records that `credential_id`'s calls are made for `party` (tenant `tenant`).
pub async fn bind_party(
    store: &Store,
    credential_id: &str,
    tenant: &str,
    party: &str,
) -> Result<(), StoreError> {
    store
        .demo_put(
            SYSTEM,
            ACTS_FOR,
            credential_id,
            tenant,
            &json!({ "party": party }).to_string(),
        )
        .await?;
    Ok(())
}

/// Stores `grant` for `tenant` unless a grant with its id exists.
pub async fn seed_grant(
    store: &Store,
    tenant: &str,
    grant: &StandingAuthorization,
) -> Result<(), StoreError> {
    let data = serde_json::to_string(grant).map_err(|e| StoreError::Conflict(e.to_string()))?;
    store
        .demo_seed(SYSTEM, GRANT, &grant.id, tenant, &data)
        .await?;
    Ok(())
}

/// Seed 004's grant: `party` lets a reservation of theirs be moved by at most 30 minutes
/// without asking (until the end of 2099).
pub fn reservation_shift_grant(party: &str) -> StandingAuthorization {
    StandingAuthorization {
        id: format!("SA-{party}-dining-shift-30"),
        principal: party.to_string(),
        tool: "reservation.modify".into(),
        conditions: vec![
            AuthorizationCondition::OwnsResource,
            AuthorizationCondition::MaxShiftMinutes(30),
            AuthorizationCondition::OnlyArguments(vec![
                "reservation_id".into(),
                "requested_time".into(),
                "reason".into(),
            ]),
        ],
        expires_at: chrono::DateTime::from_timestamp(4_102_444_800, 0).unwrap_or_default(),
    }
}
