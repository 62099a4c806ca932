//! StillOn's deterministic recovery checks (seed 004), no model anywhere: the disruption
//! monitor (which of the traveller's plans a flight change made unreachable) and the check of
//! a proposal against the traveller's constraints, which are stored as data.
//!
//! Both are pure functions over the partner records (JSON as the StillOn systems hold them);
//! [`super::stillon`] serves them as the read operations `monitor.disruptions` and
//! `intent.check`.
//!
//! # The monitor
//! A flight of the traveller whose `estimated_arrival` differs from its `scheduled_arrival` is
//! a change. A ride with `after_flight` = that flight can pick up no earlier than the estimated
//! arrival plus the flight's `transfer_minutes`; the reservation the ride goes to
//! (`for_reservation`) can start no earlier than that pickup plus the ride's `drive_minutes`.
//! A ride or reservation set before its earliest time is reported infeasible, with that time.
//!
//! # The constraint check
//! The traveller's `constraints` record lists constraints by `rank` (1 = most important), each
//! `hard` or `soft`, each with one `rule` from a closed vocabulary:
//! * `{"party_size": "booked"}` — the option seats at least the booked party (the party stays
//!   together at one table);
//! * `{"not_before": "earliest_arrival"}` — the option starts no earlier than the traveller can
//!   arrive (the monitor's earliest time for that reservation; the booked time when no flight
//!   leads to it);
//! * `{"time": "HH:MM"}` — the option starts at that time;
//! * `{"restaurant": "booked"}` — the option is at the restaurant already booked.
//!
//! Invariants (fail closed):
//! * a rule outside the vocabulary, a constraint without a rank or kind, or unreadable times
//!   make the whole check an error — never a pass;
//! * an option that violates any hard constraint is not admissible, whatever it satisfies;
//! * admissible options are ordered by the constraints they satisfy, compared in rank order
//!   (a higher-ranked constraint outranks every lower-ranked one together), then by their
//!   position in the proposal; the first is `chosen`; none admissible → `chosen` is null.

use chrono::{DateTime, Duration, FixedOffset};
use serde_json::{Value, json};

/// Why a check could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CheckError(pub String);

fn bad(message: impl Into<String>) -> CheckError {
    CheckError(message.into())
}

fn time_of(v: &Value, field: &str) -> Result<DateTime<FixedOffset>, CheckError> {
    let text = v
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("{field} missing")))?;
    DateTime::parse_from_rfc3339(text).map_err(|e| bad(format!("{field} {text:?}: {e}")))
}

fn minutes_of(v: &Value, field: &str) -> Result<i64, CheckError> {
    v.get(field)
        .and_then(Value::as_i64)
        .filter(|m| (0..=24 * 60).contains(m))
        .ok_or_else(|| bad(format!("{field} missing or out of range")))
}

fn hhmm(t: &DateTime<FixedOffset>) -> String {
    t.format("%H:%M").to_string()
}

fn id_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A reservation reachable only after a flight, by a ride.
struct Reach {
    reservation: String,
    /// The earliest the reservation can start.
    start: DateTime<FixedOffset>,
    flight: String,
    /// The earliest the ride can pick up.
    pickup: DateTime<FixedOffset>,
    ride: String,
}

/// Every ride that leaves after a flight, with the earliest times it allows.
fn earliest(flights: &[Value], rides: &[Value]) -> Result<Vec<Reach>, CheckError> {
    let mut out = Vec::new();
    for ride in rides {
        let Some(flight_id) = ride.get("after_flight").and_then(Value::as_str) else {
            continue;
        };
        let flight = flights
            .iter()
            .find(|f| f.get("flight_id").and_then(Value::as_str) == Some(flight_id))
            .ok_or_else(|| bad(format!("ride leaves after unknown flight {flight_id}")))?;
        let eta = time_of(flight, "estimated_arrival")?;
        let pickup = eta + Duration::minutes(minutes_of(flight, "transfer_minutes")?);
        let start = pickup + Duration::minutes(minutes_of(ride, "drive_minutes")?);
        let reservation = ride
            .get("for_reservation")
            .map(id_text)
            .ok_or_else(|| bad("ride without for_reservation"))?;
        let ride_id = ride.get("ride_id").map(id_text).unwrap_or_default();
        out.push(Reach {
            reservation,
            start,
            flight: flight_id.to_string(),
            pickup,
            ride: ride_id,
        });
    }
    Ok(out)
}

/// The monitor: changed flights of the traveller and the plans they made unreachable.
pub fn disruptions(
    flights: &[Value],
    reservations: &[Value],
    rides: &[Value],
) -> Result<Value, CheckError> {
    let mut changes = Vec::new();
    let mut changed = Vec::new();
    for f in flights {
        let scheduled = time_of(f, "scheduled_arrival")?;
        let estimated = time_of(f, "estimated_arrival")?;
        if scheduled != estimated {
            let id = f.get("flight_id").map(id_text).unwrap_or_default();
            changes.push(json!({
                "flight_id": id, "scheduled_arrival": f["scheduled_arrival"],
                "estimated_arrival": f["estimated_arrival"],
                "scheduled_time": hhmm(&scheduled), "estimated_time": hhmm(&estimated),
                "delay_minutes": (estimated - scheduled).num_minutes(),
            }));
            changed.push(id);
        }
    }
    let mut infeasible = Vec::new();
    for Reach {
        reservation,
        start,
        flight,
        pickup,
        ride: ride_id,
    } in earliest(flights, rides)?
    {
        if !changed.contains(&flight) {
            continue;
        }
        if let Some(ride) = rides
            .iter()
            .find(|r| r.get("ride_id").map(id_text).as_deref() == Some(ride_id.as_str()))
            && ride.get("status").and_then(Value::as_str) == Some("booked")
        {
            let at = time_of(ride, "pickup_at")?;
            if at < pickup {
                infeasible.push(json!({
                    "kind": "ride", "id": ride_id, "after_flight": flight,
                    "pickup_at": ride["pickup_at"], "earliest": pickup.to_rfc3339(),
                    "earliest_time": hhmm(&pickup),
                }));
            }
        }
        if let Some(res) = reservations
            .iter()
            .find(|r| r.get("reservation_id").map(id_text).as_deref() == Some(reservation.as_str()))
            && res.get("status").and_then(Value::as_str) == Some("confirmed")
        {
            let at = time_of(res, "starts_at")?;
            if at < start {
                infeasible.push(json!({
                    "kind": "reservation", "id": reservation, "after_flight": flight,
                    "starts_at": res["starts_at"], "time": hhmm(&at),
                    "earliest": start.to_rfc3339(), "earliest_time": hhmm(&start),
                }));
            }
        }
    }
    Ok(json!({ "changes": changes, "infeasible": infeasible }))
}

/// One constraint as stored.
struct Constraint {
    id: String,
    rank: i64,
    hard: bool,
    rule: Rule,
}

enum Rule {
    PartyBooked,
    NotBeforeArrival,
    Time(String),
    RestaurantBooked,
}

fn constraints_of(record: &Value) -> Result<Vec<Constraint>, CheckError> {
    let list = record
        .get("constraints")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("the traveller's constraints record has no constraints list"))?;
    let mut out = Vec::new();
    for c in list {
        let id = c
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("a constraint without an id"))?
            .to_string();
        let rank = c
            .get("rank")
            .and_then(Value::as_i64)
            .ok_or_else(|| bad(format!("constraint {id} has no rank")))?;
        let hard = match c.get("kind").and_then(Value::as_str) {
            Some("hard") => true,
            Some("soft") => false,
            other => return Err(bad(format!("constraint {id}: kind {other:?}"))),
        };
        let rule = c
            .get("rule")
            .and_then(Value::as_object)
            .filter(|o| o.len() == 1)
            .ok_or_else(|| bad(format!("constraint {id}: rule must have exactly one entry")))?;
        let rule = match rule.iter().next() {
            Some((k, v)) if k == "party_size" && v == "booked" => Rule::PartyBooked,
            Some((k, v)) if k == "not_before" && v == "earliest_arrival" => Rule::NotBeforeArrival,
            Some((k, Value::String(t))) if k == "time" && minutes(t).is_some() => {
                Rule::Time(t.clone())
            }
            Some((k, v)) if k == "restaurant" && v == "booked" => Rule::RestaurantBooked,
            other => return Err(bad(format!("constraint {id}: unknown rule {other:?}"))),
        };
        out.push(Constraint {
            id,
            rank,
            hard,
            rule,
        });
    }
    out.sort_by_key(|c| c.rank);
    if out.windows(2).any(|w| w[0].rank == w[1].rank) {
        return Err(bad(
            "two constraints share a rank: their order is undefined",
        ));
    }
    Ok(out)
}

/// One option as judged.
struct Judged {
    index: usize,
    /// Per constraint in rank order: satisfied.
    score: Vec<bool>,
    excluded_by: Option<String>,
    satisfied: Vec<String>,
    violated: Vec<String>,
    option: Value,
}

fn minutes(t: &str) -> Option<i64> {
    let (h, m) = t.split_once(':')?;
    let (h, m) = (h.parse::<i64>().ok()?, m.parse::<i64>().ok()?);
    ((0..24).contains(&h) && (0..60).contains(&m) && t.len() == 5).then_some(h * 60 + m)
}

/// Checks `options` (each `{restaurant_id, time, party_size}`) for moving `reservation`
/// against the traveller's `constraints` record; `flights` and `rides` give the earliest
/// arrival (see the module doc).
pub fn check_intent(
    constraints: &Value,
    reservation: &Value,
    flights: &[Value],
    rides: &[Value],
    options: &[Value],
) -> Result<Value, CheckError> {
    let list = constraints_of(constraints)?;
    let id = reservation
        .get("reservation_id")
        .map(id_text)
        .ok_or_else(|| bad("reservation without an id"))?;
    let booked_party = reservation
        .get("party_size")
        .and_then(Value::as_i64)
        .ok_or_else(|| bad("reservation without a party size"))?;
    let booked_at = time_of(reservation, "starts_at")?;
    // Times are compared as instants: an option's "HH:MM" is on the reservation's day in
    // its UTC offset, and the earliest arrival is read in that offset too.
    let earliest_arrival = earliest(flights, rides)?
        .into_iter()
        .find(|r| r.reservation == id)
        .map_or(booked_at, |r| r.start)
        .with_timezone(booked_at.offset());
    let on_booked_day = |at: i64| {
        let hm = u32::try_from(at).ok()?;
        booked_at
            .date_naive()
            .and_hms_opt(hm / 60, hm % 60, 0)?
            .and_local_timezone(*booked_at.offset())
            .single()
    };
    let mut judged = Vec::new();
    for (index, opt) in options.iter().enumerate() {
        let time = opt
            .get("time")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("option {index} has no time")))?;
        let at = minutes(time).ok_or_else(|| bad(format!("option {index}: time {time:?}")))?;
        let starts =
            on_booked_day(at).ok_or_else(|| bad(format!("option {index}: time {time:?}")))?;
        let party = opt
            .get("party_size")
            .and_then(Value::as_i64)
            .unwrap_or(booked_party);
        let restaurant = opt.get("restaurant_id").and_then(Value::as_str);
        let mut satisfied = Vec::new();
        let mut violated = Vec::new();
        let mut excluded_by = None;
        let mut score = Vec::new();
        for c in &list {
            let ok = match &c.rule {
                Rule::PartyBooked => party >= booked_party,
                Rule::NotBeforeArrival => starts >= earliest_arrival,
                Rule::Time(t) => Some(at) == minutes(t),
                Rule::RestaurantBooked => {
                    restaurant.is_none_or(|r| Some(r) == reservation["restaurant_id"].as_str())
                }
            };
            score.push(ok);
            if ok {
                satisfied.push(c.id.clone());
            } else {
                violated.push(c.id.clone());
                if c.hard && excluded_by.is_none() {
                    excluded_by = Some(c.id.clone());
                }
            }
        }
        judged.push(Judged {
            index,
            score,
            excluded_by,
            satisfied,
            violated,
            option: opt.clone(),
        });
    }
    let mut admissible: Vec<&Judged> = judged.iter().filter(|j| j.excluded_by.is_none()).collect();
    // Lexicographic in rank order: `true` first, earlier constraints first; then position.
    admissible.sort_by(|a, b| b.score.cmp(&a.score).then(a.index.cmp(&b.index)));
    let chosen = admissible.first().map(|j| j.index);
    let options: Vec<Value> = judged
        .iter()
        .map(|j| {
            json!({"index": j.index, "option": j.option, "admissible": j.excluded_by.is_none(),
                   "excluded_by": j.excluded_by, "satisfied": j.satisfied, "violated": j.violated})
        })
        .collect();
    Ok(json!({
        "reservation_id": id,
        "earliest_arrival": earliest_arrival.to_rfc3339(),
        "earliest_time": hhmm(&earliest_arrival),
        "order": list.iter().map(|c| json!({"id": c.id, "rank": c.rank,
            "kind": if c.hard { "hard" } else { "soft" }})).collect::<Vec<_>>(),
        "chosen": chosen,
        "ranking": admissible.iter().map(|j| j.index).collect::<Vec<_>>(),
        "options": options,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flight(eta: &str) -> Value {
        json!({"flight_id": "FLIGHT-TP1351", "scheduled_arrival": "2026-06-11T17:45:00+01:00",
               "estimated_arrival": eta, "transfer_minutes": 15})
    }

    fn ride() -> Value {
        json!({"ride_id": "RIDE-20260611", "after_flight": "FLIGHT-TP1351",
               "for_reservation": 8472, "drive_minutes": 25, "status": "booked",
               "pickup_at": "2026-06-11T19:00:00+01:00"})
    }

    fn dinner() -> Value {
        json!({"reservation_id": 8472, "restaurant_id": "RST-1001", "party_size": 4,
               "starts_at": "2026-06-11T19:30:00+01:00", "status": "confirmed"})
    }

    fn constraints() -> Value {
        json!({"constraints": [
            {"id": "prefer.2000", "rank": 3, "kind": "soft", "rule": {"time": "20:00"}},
            {"id": "party.together", "rank": 1, "kind": "hard", "rule": {"party_size": "booked"}},
            {"id": "arrive.in_time", "rank": 2, "kind": "hard", "rule": {"not_before": "earliest_arrival"}},
            {"id": "same.restaurant", "rank": 4, "kind": "soft", "rule": {"restaurant": "booked"}},
        ]})
    }

    #[test]
    fn on_time_flights_disrupt_nothing() {
        let d = disruptions(
            &[flight("2026-06-11T17:45:00+01:00")],
            &[dinner()],
            &[ride()],
        )
        .unwrap();
        assert_eq!(d, json!({"changes": [], "infeasible": []}));
    }

    #[test]
    fn a_late_flight_makes_the_ride_and_the_dinner_unreachable() {
        let d = disruptions(
            &[flight("2026-06-11T19:20:00+01:00")],
            &[dinner()],
            &[ride()],
        )
        .unwrap();
        assert_eq!(d["changes"][0]["delay_minutes"], 95);
        assert_eq!(d["infeasible"][0]["kind"], "ride");
        assert_eq!(d["infeasible"][0]["earliest_time"], "19:35");
        assert_eq!(d["infeasible"][1]["kind"], "reservation");
        assert_eq!(d["infeasible"][1]["earliest_time"], "20:00");
        // A small delay that still leaves time is a change but makes nothing infeasible.
        let d = disruptions(
            &[flight("2026-06-11T18:00:00+01:00")],
            &[dinner()],
            &[ride()],
        )
        .unwrap();
        assert_eq!(d["changes"][0]["delay_minutes"], 15);
        assert_eq!(d["infeasible"], json!([]));
    }

    #[test]
    fn keeping_the_party_together_outranks_the_preferred_time() {
        let late = [flight("2026-06-11T19:20:00+01:00")];
        let opts = [
            json!({"restaurant_id": "RST-1001", "time": "20:00", "party_size": 2}),
            json!({"restaurant_id": "RST-1002", "time": "20:30", "party_size": 4}),
            json!({"restaurant_id": "RST-1001", "time": "19:00", "party_size": 4}),
        ];
        let c = check_intent(&constraints(), &dinner(), &late, &[ride()], &opts).unwrap();
        assert_eq!(c["chosen"], 1, "{c}");
        assert_eq!(c["options"][0]["excluded_by"], "party.together");
        assert_eq!(
            c["options"][0]["satisfied"],
            json!(["arrive.in_time", "prefer.2000", "same.restaurant"])
        );
        assert_eq!(c["options"][2]["excluded_by"], "arrive.in_time");
        // The move to 20:00 for the whole party satisfies everything and wins.
        let opts = [
            opts[1].clone(),
            json!({"restaurant_id": "RST-1001", "time": "20:00", "party_size": 4}),
        ];
        let c = check_intent(&constraints(), &dinner(), &late, &[ride()], &opts).unwrap();
        assert_eq!(c["chosen"], 1, "{c}");
        assert_eq!(c["ranking"], json!([1, 0]));
        // Nothing admissible: chosen is null.
        let c = check_intent(
            &constraints(),
            &dinner(),
            &late,
            &[ride()],
            &[json!({"time": "19:00"})],
        )
        .unwrap();
        assert_eq!(c["chosen"], Value::Null);
    }

    #[test]
    fn an_arrival_after_midnight_or_in_another_offset_is_compared_as_an_instant() {
        let arrive = [json!({"time": "21:00"}), json!({"time": "23:30"})];
        let only_arrival = json!({"constraints": [
            {"id": "arrive.in_time", "rank": 1, "kind": "hard", "rule": {"not_before": "earliest_arrival"}},
        ]});
        // Landing at 23:50 local: with transfer and drive the traveller arrives at 00:30 the
        // next day, after every option that evening (00:30 is not "before 21:00").
        let c = check_intent(
            &only_arrival,
            &dinner(),
            &[flight("2026-06-11T23:50:00+01:00")],
            &[ride()],
            &arrive,
        )
        .unwrap();
        assert_eq!(c["chosen"], Value::Null, "{c}");
        assert_eq!(c["earliest_time"], "00:30");
        // The same instant as the 20:00 arrival, written in UTC: 21:00 local is after it.
        let c = check_intent(
            &only_arrival,
            &dinner(),
            &[flight("2026-06-11T18:20:00+00:00")],
            &[ride()],
            &arrive,
        )
        .unwrap();
        assert_eq!(c["chosen"], 0, "{c}");
        assert_eq!(
            c["earliest_time"], "20:00",
            "shown in the reservation's offset: {c}"
        );
        // Landing at 19:30 UTC (20:30 local) means arriving at 21:10 local (20:10 UTC):
        // 21:00 local is too early, 23:30 is fine.
        let c = check_intent(
            &only_arrival,
            &dinner(),
            &[flight("2026-06-11T19:30:00+00:00")],
            &[ride()],
            &arrive,
        )
        .unwrap();
        assert_eq!(c["chosen"], 1, "{c}");
    }

    #[test]
    fn a_constraint_outside_the_vocabulary_fails_the_check() {
        let opts = [json!({"time": "20:00"})];
        for bad in [
            json!({"constraints": [{"id": "x", "rank": 1, "kind": "hard", "rule": {"vibes": "good"}}]}),
            json!({"constraints": [{"id": "x", "rank": 1, "kind": "maybe", "rule": {"time": "20:00"}}]}),
            json!({"constraints": [{"id": "x", "kind": "hard", "rule": {"time": "20:00"}}]}),
            json!({"constraints": [{"id": "x", "rank": 1, "kind": "soft", "rule": {"time": "8pm"}}]}),
            json!({"constraints": [
                {"id": "x", "rank": 1, "kind": "soft", "rule": {"time": "20:00"}},
                {"id": "y", "rank": 1, "kind": "soft", "rule": {"time": "20:30"}}]}),
            json!({}),
        ] {
            assert!(
                check_intent(&bad, &dinner(), &[], &[], &opts).is_err(),
                "{bad}"
            );
        }
    }
}
