//! Standing authorizations: whether one covers a call.
//!
//! Owns the matching of [`StandingAuthorization`] data against a [`Request`]. The engine
//! decides *when* a match may change a decision (only a policy-level `require_approval` or
//! `no_permit`); this module only answers "does this grant cover this call, now?".
//!
//! INVARIANT (fails closed): a grant covers a call only if it is held by the call's party,
//! names exactly this tool, has not expired (`now < expires_at`), and every one of its
//! conditions can be checked and holds. A condition that cannot be evaluated (a missing or
//! malformed argument or attribute) does not hold. A grant with no conditions covers every
//! call of its tool for its party until it expires.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::input::{MONEY_FIELD, money_member};
use super::types::{AuthorizationCondition, Request, StandingAuthorization};

/// The argument holding a reservation's new start (RFC 3339).
pub const SHIFT_ARGUMENT: &str = "new_start";
/// The resource attribute holding its current start (RFC 3339).
pub const SHIFT_RESOURCE_ATTR: &str = "starts_at";

/// The first grant (in the request's order) that covers the call.
pub(crate) fn covering(req: &Request) -> Option<&StandingAuthorization> {
    req.authorizations.iter().find(|grant| covers(grant, req))
}

fn covers(grant: &StandingAuthorization, req: &Request) -> bool {
    grant.principal == req.principal.party()
        && grant.tool == req.tool.name
        && req.now < grant.expires_at
        && grant.conditions.iter().all(|c| holds(c, req))
}

fn holds(condition: &AuthorizationCondition, req: &Request) -> bool {
    match condition {
        AuthorizationCondition::OwnsResource => {
            !req.resources.is_empty()
                && req
                    .resources
                    .iter()
                    .all(|r| r.owner.as_deref() == Some(req.principal.party()))
        }
        AuthorizationCondition::MaxShiftMinutes(max) => shift_within(req, *max),
        AuthorizationCondition::MaxAmountMinor(max) => {
            let Some(args) = req.arguments.as_object() else {
                return false;
            };
            let Some(amount) = args.get(MONEY_FIELD) else {
                return false;
            };
            money_member(args, amount, "args.amount").is_ok_and(|minor| minor <= *max)
        }
        AuthorizationCondition::OnlyArguments(allowed) => req
            .arguments
            .as_object()
            .is_some_and(|args| args.keys().all(|k| allowed.iter().any(|a| a == k))),
    }
}

fn shift_within(req: &Request, max_minutes: u32) -> bool {
    let Some(new_start) = req
        .arguments
        .get(SHIFT_ARGUMENT)
        .and_then(Value::as_str)
        .and_then(parse_instant)
    else {
        return false;
    };
    let mut checked = 0usize;
    for resource in &req.resources {
        let Some(current) = resource.attrs.get(SHIFT_RESOURCE_ATTR) else {
            continue;
        };
        let Some(current) = current.as_str().and_then(parse_instant) else {
            return false;
        };
        let shift_seconds = (new_start - current).num_seconds().unsigned_abs();
        if shift_seconds > u64::from(max_minutes) * 60 {
            return false;
        }
        checked += 1;
    }
    checked > 0
}

fn parse_instant(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}
