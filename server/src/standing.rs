//! Who a call is made for, and the standing authorizations that party holds.
//!
//! * The party: the credential's `acts_for`, which an operator sets (`agent-token create
//!   --acts-for`, `agent-token bind`, the admin page or its form `POST /admin/agents/{id}/binding`),
//!   each change audited (`agent.bound`): the person that credential's runs act for (seed
//!   004: the StillOn agents act for the traveller).
//! * The grants: table `standing_authorizations` ([`countersign_core::store::Standing`]),
//!   managed with `countersign standing grant|list|revoke`, each change audited.
//!
//! Invariants (fail closed):
//! * No binding → no `acts_for` (the policy engine then checks ownership against the agent
//!   itself, which owns nothing).
//! * Both are read for a call by [`Store::call_context`] (on `/mcp` with the credential check),
//!   which applies exactly these rules.
//! * Only grants of the credential's tenant, held by the call's party, not revoked and not
//!   expired at the call's instant, with readable conditions, are handed to the engine
//!   ([`Store::standing_for`]); the engine alone decides whether one covers the call and never
//!   lets one lift a deny or a floor. A grant that does not cover it (out of its bounds,
//!   another tool) leaves the call at its gate.

use countersign_core::policy::{AuthorizationCondition, StandingAuthorization};
use countersign_core::store::{NewStanding, StandingError};
use countersign_core::{Store, StoreError};

/// Who the demo's seeded grants are recorded as granted by.
pub const SEEDER: &str = "seed:stillon";

/// Stores `grant` for `tenant` unless a grant with its id exists (revoked or not: a revoked
/// demo grant stays revoked). Audited when stored.
pub async fn seed_grant(
    store: &Store,
    tenant: &str,
    grant: &StandingAuthorization,
) -> Result<(), StoreError> {
    store
        .seed_standing(&NewStanding {
            id: Some(grant.id.clone()),
            tenant: tenant.to_string(),
            party: grant.principal.clone(),
            tool: grant.tool.clone(),
            conditions: grant.conditions.clone(),
            expires_at: grant.expires_at.timestamp_millis(),
            reason:
                "seed 004: the traveller lets a reservation of theirs move by at most 30 minutes"
                    .into(),
            granted_by: SEEDER.into(),
        })
        .await
        .map_err(|e| match e {
            StandingError::Store(e) => e,
            other => StoreError::Conflict(other.to_string()),
        })?;
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
