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

use chrono::{DateTime, FixedOffset, NaiveTime};
use serde_json::Value;

use super::input::{MONEY_FIELD, money_member};
use super::types::{AuthorizationCondition, Request, StandingAuthorization};

/// The argument holding a reservation's requested time of day, `HH:MM` (seed 004's
/// `requested_time: 20:00`), read as wall-clock time on the date and in the UTC offset of the
/// resource's current start.
pub const SHIFT_ARGUMENT: &str = "requested_time";
/// The resource attribute holding its current start (RFC 3339, with the venue's offset).
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
            // A bound on what may be spent: a negative amount (a refund, a reversal) is not
            // "below" it; it is outside what the grant speaks of.
            money_member(args, amount, "args.amount").is_ok_and(|minor| (0..=*max).contains(&minor))
        }
        AuthorizationCondition::Currency(code) => req
            .arguments
            .get("currency")
            .and_then(Value::as_str)
            .is_some_and(|c| c == code),
        AuthorizationCondition::OnlyArguments(allowed) => req
            .arguments
            .as_object()
            .is_some_and(|args| args.keys().all(|k| allowed.iter().any(|a| a == k))),
    }
}

fn shift_within(req: &Request, max_minutes: u32) -> bool {
    let Some(requested) = req
        .arguments
        .get(SHIFT_ARGUMENT)
        .and_then(Value::as_str)
        .and_then(|t| NaiveTime::parse_from_str(t, "%H:%M").ok())
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
        // The requested time on the reservation's own date, in its own offset: a move
        // across midnight reads as a shift of almost a day, outside any grant.
        let Some(new_start) = current
            .date_naive()
            .and_time(requested)
            .and_local_timezone(*current.offset())
            .single()
        else {
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

fn parse_instant(text: &str) -> Option<DateTime<FixedOffset>> {
    DateTime::parse_from_rfc3339(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Effect, Gate};
    use crate::policy::types::{
        ApprovalState, AuthorizationCondition, Principal, PrincipalKind, ResourceFact, TaskOrigin,
        ToolFacts,
    };
    use serde_json::json;

    fn request(requested: Value, starts_at: Value) -> Request {
        let now = DateTime::from_timestamp(1_781_170_937, 0).unwrap_or_default();
        Request {
            principal: Principal {
                kind: PrincipalKind::Agent,
                id: "a".into(),
                role: "worker.travel".into(),
                tenant: "t".into(),
                acts_for: None,
            },
            tool: ToolFacts {
                name: "reservation.modify".into(),
                effect: Effect::Write,
                gate: Gate::Policy,
                listed_for_role: true,
            },
            schema_errors: vec![],
            arguments: json!({ "requested_time": requested }),
            resources: vec![ResourceFact {
                kind: "reservation".into(),
                id: "1".into(),
                tenant: "t".into(),
                owner: None,
                attrs: json!({ "starts_at": starts_at })
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            }],
            task_origin: TaskOrigin::User,
            approval: ApprovalState::None,
            now,
            authorizations: vec![],
        }
    }

    fn within(requested: Value, starts_at: Value) -> bool {
        holds(
            &AuthorizationCondition::MaxShiftMinutes(30),
            &request(requested, starts_at),
        )
    }

    #[test]
    fn shifts_are_measured_on_the_reservations_date_and_offset() {
        assert!(within(json!("20:00"), json!("2026-06-11T19:30:00+02:00")));
        assert!(within(json!("19:00"), json!("2026-06-11T19:30:00Z")));
        assert!(!within(json!("20:01"), json!("2026-06-11T19:30:00Z")));
        assert!(!within(json!("20:00"), json!("2026-06-11T19:29:59Z")));
        // Across midnight: almost a day, never within a grant.
        assert!(!within(json!("00:10"), json!("2026-06-11T23:50:00Z")));
    }

    #[test]
    fn an_amount_bound_covers_zero_to_the_bound_only() {
        let covered = |amount: Value| {
            let mut req = request(json!("20:00"), json!("2026-06-11T19:30:00Z"));
            req.arguments = json!({"amount": amount, "currency": "EUR"});
            holds(&AuthorizationCondition::MaxAmountMinor(200_000), &req)
        };
        assert!(covered(json!(1500)));
        assert!(covered(json!(2000.00)));
        assert!(!covered(json!(2000.01)));
        assert!(
            !covered(json!(-5)),
            "a negative amount is outside the grant"
        );
        assert!(!covered(json!("1500")));
        let in_currency = |currency: Value| {
            let mut req = request(json!("20:00"), json!("2026-06-11T19:30:00Z"));
            req.arguments = json!({"amount": 10, "currency": currency});
            holds(&AuthorizationCondition::Currency("EUR".into()), &req)
        };
        assert!(in_currency(json!("EUR")));
        assert!(!in_currency(json!("GBP")));
        assert!(!in_currency(json!("eur")));
        assert!(!in_currency(Value::Null));
    }

    #[test]
    fn unreadable_values_fail_closed() {
        assert!(!within(json!("8pm"), json!("2026-06-11T19:30:00Z")));
        assert!(!within(json!("20:00:00"), json!("2026-06-11T19:30:00Z")));
        assert!(!within(json!(2000), json!("2026-06-11T19:30:00Z")));
        assert!(!within(json!("20:00"), json!("19:30")));
        assert!(!within(json!("20:00"), json!(1_781_170_937)));
    }
}
