//! StillOn's partner systems (seed 004), built in, with their state in Countersign's
//! database (`demo_objects`/`demo_effects`, system `stillon`): restaurants with slots per
//! date, reservations, a calendar with revisions, rides, contacts and sent messages.
//!
//! They behave like well-built partner APIs so that the gateway's guarantees can be tested
//! against real state:
//! * every effect is applied at most once per idempotency key — a repeated key answers with
//!   the first result and changes nothing, the key with other arguments is refused
//!   `idempotency_mismatch`; [`Adapter::lookup`] finds an effect by key;
//! * records belong to a tenant (another tenant's record does not exist for a call) and to an
//!   owner: a call whose [`Invocation::acts_for`] is not the owner is refused `not_owner`
//!   (no `acts_for` at all is refused too — fail closed);
//! * business refusals: a slot that is not free → `slot.unavailable`; a reservation that is
//!   not confirmed → `not_active`; an unknown calendar revision → `not_found`;
//! * faults are injected per operation exactly like the ERP's ([`super::builtin::Fault`],
//!   written with [`super::builtin::inject_fault`] for system [`STILLON`]).
//!
//! # The hold (`dining.reservation.modify`)
//! Moving a reservation first takes a hold on the target slot: an object of kind `hold`, id
//! `<restaurant>/<date>/<HH:MM>`, recorded as its own effect under `<key>:hold` (operation
//! `dining.slot.hold`). A slot held by another key is `slot.unavailable`; the same key finds
//! its own hold and carries on (a retry). The move itself — slot freed, slot taken, the
//! reservation changed, the hold released — is one effect under the call's key, applied all or
//! nothing with version checks: a record that changed underneath refuses it and the target is
//! planned again from fresh state. A move that is refused releases its hold.
//!
//! # Reading state
//! `dining.reservation.get` answers the reservation as the partner holds it now plus `slots`:
//! the restaurant's slots on the reservation's date keyed `HHMM` (`"2000"`), each `free`,
//! `taken` or `yours` — so a plan can carry "slot 20:00 free" as observed state
//! (`slots.2000 = free`) and the executor can re-read it before mutating.

pub use super::seed::seed_stillon;
use countersign_core::Store;
use countersign_core::policy::ResourceFact;
use countersign_core::store::{Applied, DemoEffect, DemoObject, ObjectWrite};
use serde_json::{Map, Value, json};

use super::contract::{Adapter, AdapterError, BoxFuture, Invocation};
use super::demo_kit::{arg, parse, rejected, unavailable, with_faults};
use super::recovery;

/// StillOn's system (and provider) name.
pub const STILLON: &str = "stillon";
/// The demo tenant (the finance example's too: `acme`).
pub const TENANT: &str = "acme";
/// The traveller every seeded booking belongs to.
pub const TRAVELLER: &str = "user-123";
/// Operation name of the hold effect.
pub const HOLD_OPERATION: &str = "dining.slot.hold";

const READS: &[&str] = &[
    "dining.search",
    "dining.availability",
    "dining.reservation.get",
    "monitor.disruptions",
    "intent.check",
];

/// The partner systems.
#[derive(Debug)]
pub struct StillOn {
    store: Store,
}

fn id_arg(args: &Value, name: &str) -> Result<String, AdapterError> {
    match args.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        _ => Err(rejected("bad_request", format!("missing {name}"))),
    }
}

/// `HH:MM` → the `slots` key `HHMM`.
fn slot_key(time: &str) -> String {
    time.replace(':', "")
}

fn write(kind: &str, id: &str, tenant: &str, data: &Value, expected: Option<i64>) -> ObjectWrite {
    ObjectWrite {
        kind: kind.into(),
        id: id.into(),
        tenant: tenant.into(),
        data: data.to_string(),
        expected_version: expected,
    }
}

impl StillOn {
    /// The systems on `store`.
    pub fn new(store: &Store) -> Self {
        Self {
            store: store.clone(),
        }
    }

    async fn get(
        &self,
        kind: &str,
        id: &str,
        tenant: &str,
    ) -> Result<Option<(DemoObject, Value)>, AdapterError> {
        super::demo_kit::tenant_object(&self.store, STILLON, kind, id, tenant).await
    }

    async fn must_get(
        &self,
        kind: &str,
        id: &str,
        tenant: &str,
    ) -> Result<(DemoObject, Value), AdapterError> {
        super::demo_kit::must_tenant_object(&self.store, STILLON, kind, id, tenant).await
    }

    /// A record of the caller's tenant owned by the party the call is made for.
    async fn owned(
        &self,
        call: &Invocation,
        kind: &str,
        id: &str,
    ) -> Result<(DemoObject, Value), AdapterError> {
        let (obj, value) = self.must_get(kind, id, &call.tenant).await?;
        let owner = value.get("owner").and_then(Value::as_str);
        if owner.is_none() || owner != call.acts_for.as_deref() {
            return Err(rejected(
                "not_owner",
                format!("{kind} {id} does not belong to the party this call is made for"),
            ));
        }
        Ok((obj, value))
    }

    async fn read(&self, call: &Invocation) -> Result<Value, AdapterError> {
        let args = &call.arguments;
        let tenant = call.tenant.as_str();
        match call.operation.as_str() {
            "dining.search" => {
                let city = arg(args, "city")?;
                let date = arg(args, "date")?;
                let party = args.get("party_size").and_then(Value::as_i64).unwrap_or(1);
                let cuisine = args.get("cuisine").and_then(Value::as_str);
                let near = args.get("time").and_then(Value::as_str);
                let mut found = Vec::new();
                for obj in self
                    .store
                    .demo_list(STILLON, "restaurant")
                    .await
                    .map_err(unavailable)?
                {
                    if obj.tenant != tenant {
                        continue;
                    }
                    let r = parse(&obj)?;
                    if !r["city"]
                        .as_str()
                        .is_some_and(|c| c.eq_ignore_ascii_case(city))
                        || r["max_party"].as_i64().unwrap_or(0) < party
                        || cuisine.is_some_and(|c| c != "any" && r["cuisine"] != json!(c))
                    {
                        continue;
                    }
                    let free: Vec<String> = free_slots(&r, date)
                        .into_iter()
                        .filter(|t| near.is_none_or(|n| within_an_hour(t, n)))
                        .collect();
                    if free.is_empty() {
                        continue;
                    }
                    found.push(
                        json!({"restaurant_id": r["restaurant_id"], "name": r["name"],
                                      "cuisine": r["cuisine"], "free": free}),
                    );
                }
                Ok(json!({ "restaurants": found }))
            }
            "dining.availability" => {
                let id = arg(args, "restaurant_id")?;
                let date = arg(args, "date")?;
                let party = args.get("party_size").and_then(Value::as_i64).unwrap_or(1);
                let (_, r) = self.must_get("restaurant", id, tenant).await?;
                let free = if r["max_party"].as_i64().unwrap_or(0) < party {
                    Vec::new()
                } else {
                    free_slots(&r, date)
                };
                Ok(json!({"restaurant_id": id, "date": date, "party_size": party, "free": free}))
            }
            "dining.reservation.get" => {
                let id = id_arg(args, "reservation_id")?;
                let (_, mut res) = self.owned(call, "reservation", &id).await?;
                let date = res["date"].as_str().unwrap_or_default().to_string();
                let restaurant = res["restaurant_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let mut slots = Map::new();
                if let Some((_, r)) = self.get("restaurant", &restaurant, tenant).await?
                    && let Some(day) = r["slots"][&date].as_object()
                {
                    let mine = format!("R:{id}");
                    for (time, state) in day {
                        let shown = match state.as_str() {
                            Some("free") => "free",
                            Some(s) if s == mine => "yours",
                            _ => "taken",
                        };
                        slots.insert(slot_key(time), json!(shown));
                    }
                }
                res["slots"] = Value::Object(slots);
                Ok(res)
            }
            "monitor.disruptions" => {
                let (flights, reservations, rides) = self.itinerary(call).await?;
                recovery::disruptions(&flights, &reservations, &rides)
                    .map_err(|e| rejected("itinerary.invalid", e.0))
            }
            "intent.check" => {
                let id = id_arg(args, "reservation_id")?;
                let (_, res) = self.owned(call, "reservation", &id).await?;
                let party = call.acts_for.as_deref().unwrap_or_default();
                let (_, constraints) =
                    self.get("constraints", party, tenant)
                        .await?
                        .ok_or_else(|| {
                            rejected("not_found", "no constraints are stored for the traveller")
                        })?;
                let (flights, _, rides) = self.itinerary(call).await?;
                let options = args
                    .get("options")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                recovery::check_intent(&constraints, &res, &flights, &rides, &options)
                    .map_err(|e| rejected("constraints.invalid", e.0))
            }
            other => Err(rejected(
                "unknown_operation",
                format!("no operation {other}"),
            )),
        }
    }

    /// The flights, reservations and rides of the party the call is made for (none known:
    /// refused, fail closed).
    async fn itinerary(
        &self,
        call: &Invocation,
    ) -> Result<(Vec<Value>, Vec<Value>, Vec<Value>), AdapterError> {
        let Some(party) = call.acts_for.as_deref() else {
            return Err(rejected(
                "not_owner",
                "the call is made for nobody whose itinerary could be read",
            ));
        };
        let mut out = (Vec::new(), Vec::new(), Vec::new());
        for (kind, list) in [
            ("flight", &mut out.0),
            ("reservation", &mut out.1),
            ("ride", &mut out.2),
        ] {
            for obj in self
                .store
                .demo_list(STILLON, kind)
                .await
                .map_err(unavailable)?
            {
                if obj.tenant != call.tenant {
                    continue;
                }
                let v = parse(&obj)?;
                if v.get("owner").and_then(Value::as_str) == Some(party) {
                    list.push(v);
                }
            }
        }
        Ok(out)
    }

    /// Takes (or finds its own) hold on a slot. Returns the hold's id.
    async fn hold(
        &self,
        call: &Invocation,
        restaurant: &str,
        date: &str,
        time: &str,
        reservation: &str,
    ) -> Result<String, AdapterError> {
        let id = format!("{restaurant}/{date}/{time}");
        let existing = self.get("hold", &id, &call.tenant).await?;
        if let Some((_, h)) = &existing {
            if h["key"] == json!(call.idem_key) {
                return Ok(id);
            }
            if h["active"] == json!(true) {
                return Err(rejected(
                    "slot.unavailable",
                    format!("{time} is held by another change"),
                ));
            }
        }
        let data = json!({"key": call.idem_key, "reservation_id": reservation, "active": true});
        let effect = DemoEffect {
            system: STILLON.into(),
            idem_key: format!("{}:hold", call.idem_key),
            operation: HOLD_OPERATION.into(),
            request: json!({"slot": id}).to_string(),
            result: data.to_string(),
            at: self.store.clock().now_ms(),
        };
        let writes = [write(
            "hold",
            &id,
            &call.tenant,
            &data,
            existing.map(|(o, _)| o.version),
        )];
        match self
            .store
            .demo_apply(&effect, &writes)
            .await
            .map_err(unavailable)?
        {
            Applied::Now | Applied::Before(_) => Ok(id),
            Applied::Changed => Err(rejected(
                "slot.unavailable",
                format!("{time} was held by another change"),
            )),
        }
    }

    /// Releases a hold this call took (after a refusal; best effort).
    async fn release(&self, call: &Invocation, hold: &str) {
        if let Ok(Some((_, h))) = self.get("hold", hold, &call.tenant).await
            && h["key"] == json!(call.idem_key)
        {
            let data = json!({"key": call.idem_key, "active": false});
            let _ = self
                .store
                .demo_put(STILLON, "hold", hold, &call.tenant, &data.to_string())
                .await;
        }
    }

    /// The move of a reservation, holding the target slot while it mutates. `misapply`: the
    /// party is seated at the free sitting nearest the one asked for (refused when there is
    /// none), and the answer still names the time asked for.
    async fn modify(&self, call: &Invocation, misapply: bool) -> Result<Value, AdapterError> {
        let args = &call.arguments;
        let id = id_arg(args, "reservation_id")?;
        let asked = arg(args, "requested_time")?.to_string();
        let (_, res) = self.owned(call, "reservation", &id).await?;
        let restaurant = res["restaurant_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let date = res["date"].as_str().unwrap_or_default().to_string();
        let time = if misapply {
            let (_, r) = self
                .must_get("restaurant", &restaurant, &call.tenant)
                .await?;
            let asked_at = minutes(&asked).unwrap_or(0);
            free_slots(&r, &date)
                .into_iter()
                .filter(|t| *t != asked)
                .min_by_key(|t| (minutes(t).unwrap_or(i64::MAX) - asked_at).abs())
                .ok_or_else(|| {
                    rejected(
                        "injected",
                        "the partner refused (injected fault: no other sitting to misapply)",
                    )
                })?
        } else {
            asked.clone()
        };
        let hold = self.hold(call, &restaurant, &date, &time, &id).await?;
        for _ in 0..8 {
            let planned = self.plan_modify(call, &id, &time, &hold).await;
            let (result, writes) = match planned {
                Ok((mut result, writes)) => {
                    if time != asked {
                        result["time"] = json!(asked);
                        result["ref"] = json!(format!("{id}@{asked}"));
                    }
                    (result, writes)
                }
                Err(e) => {
                    self.release(call, &hold).await;
                    return Err(e);
                }
            };
            match self.apply(call, &result, &writes).await? {
                Some(answer) => return Ok(answer),
                None => continue,
            }
        }
        self.release(call, &hold).await;
        Err(AdapterError::Unavailable(
            "the partner's records kept changing".into(),
        ))
    }

    async fn plan_modify(
        &self,
        call: &Invocation,
        id: &str,
        time: &str,
        hold: &str,
    ) -> Result<(Value, Vec<ObjectWrite>), AdapterError> {
        let tenant = call.tenant.as_str();
        let (res_obj, mut res) = self.owned(call, "reservation", id).await?;
        if res["status"] != json!("confirmed") {
            return Err(rejected(
                "not_active",
                format!("reservation {id} is {}", res["status"]),
            ));
        }
        let restaurant = res["restaurant_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let date = res["date"].as_str().unwrap_or_default().to_string();
        let (r_obj, mut r) = self.must_get("restaurant", &restaurant, tenant).await?;
        let previous_party = res["party_size"].as_i64();
        let party = call
            .arguments
            .get("party_size")
            .and_then(Value::as_i64)
            .or_else(|| res["party_size"].as_i64())
            .unwrap_or(1);
        if r["max_party"].as_i64().unwrap_or(0) < party {
            return Err(rejected(
                "slot.unavailable",
                format!("no table for {party} at {restaurant}"),
            ));
        }
        let mine = json!(format!("R:{id}"));
        let previous = res["time"].as_str().unwrap_or_default().to_string();
        match r["slots"][&date].get(time) {
            Some(s) if *s == json!("free") || *s == mine => {}
            Some(_) => {
                return Err(rejected(
                    "slot.unavailable",
                    format!("{time} on {date} is taken"),
                ));
            }
            None => {
                return Err(rejected(
                    "slot.unavailable",
                    format!("{restaurant} has no {time} sitting on {date}"),
                ));
            }
        }
        if previous != time {
            r["slots"][&date][&previous] = json!("free");
        }
        r["slots"][&date][time] = mine;
        let offset = res["starts_at"]
            .as_str()
            .and_then(|s| s.get(19..))
            .unwrap_or("Z")
            .to_string();
        res["time"] = json!(time);
        res["starts_at"] = json!(format!("{date}T{time}:00{offset}"));
        res["party_size"] = json!(party);
        let (h_obj, _) = self.must_get("hold", hold, tenant).await?;
        let released = json!({"key": call.idem_key, "reservation_id": id, "active": false});
        let result = json!({"ref": format!("{id}@{time}"), "reservation_id": res["reservation_id"],
                            "status": "confirmed", "time": time, "previous_time": previous,
                            "previous_requested_time": previous,
                            "party_size": party, "previous_party_size": previous_party});
        Ok((
            result,
            vec![
                write("restaurant", &restaurant, tenant, &r, Some(r_obj.version)),
                write("reservation", id, tenant, &res, Some(res_obj.version)),
                write("hold", hold, tenant, &released, Some(h_obj.version)),
            ],
        ))
    }

    /// Plans the writes of one (non-hold) effect and its result, from the current state.
    async fn plan(&self, call: &Invocation) -> Result<(Value, Vec<ObjectWrite>), AdapterError> {
        let args = &call.arguments;
        let tenant = call.tenant.as_str();
        match call.operation.as_str() {
            "dining.reservation.cancel" => {
                let id = id_arg(args, "reservation_id")?;
                let (obj, mut res) = self.owned(call, "reservation", &id).await?;
                if res["status"] != json!("confirmed") {
                    return Err(rejected(
                        "not_active",
                        format!("reservation {id} is {}", res["status"]),
                    ));
                }
                let restaurant = res["restaurant_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let date = res["date"].as_str().unwrap_or_default().to_string();
                let time = res["time"].as_str().unwrap_or_default().to_string();
                let mut writes = Vec::new();
                if let Some((r_obj, mut r)) = self.get("restaurant", &restaurant, tenant).await?
                    && r["slots"][&date].get(&time) == Some(&json!(format!("R:{id}")))
                {
                    r["slots"][&date][&time] = json!("free");
                    writes.push(write(
                        "restaurant",
                        &restaurant,
                        tenant,
                        &r,
                        Some(r_obj.version),
                    ));
                }
                res["status"] = json!("cancelled");
                writes.push(write("reservation", &id, tenant, &res, Some(obj.version)));
                Ok((
                    json!({"ref": format!("{id}/cancelled"), "reservation_id": res["reservation_id"],
                           "status": "cancelled"}),
                    writes,
                ))
            }
            "calendar.update" => {
                let id = arg(args, "event_id")?;
                let (obj, mut ev) = self.owned(call, "calendar_event", id).await?;
                let revision = ev["revision"].as_i64().unwrap_or(1) + 1;
                ev["start"] = args["start"].clone();
                ev["end"] = args["end"].clone();
                if let Some(note) = args.get("note") {
                    ev["note"] = note.clone();
                }
                ev["revision"] = json!(revision);
                let entry = json!({"revision": revision, "start": ev["start"], "end": ev["end"]});
                if let Some(list) = ev["revisions"].as_array_mut() {
                    list.push(entry);
                }
                Ok((
                    json!({"ref": format!("{id}#{revision}"), "event_id": id, "revision": revision,
                           "previous_revision": revision - 1, "start": ev["start"], "end": ev["end"]}),
                    vec![write("calendar_event", id, tenant, &ev, Some(obj.version))],
                ))
            }
            "calendar.revert" => {
                let id = arg(args, "event_id")?;
                let wanted = args.get("revision").and_then(Value::as_i64).unwrap_or(0);
                let (obj, mut ev) = self.owned(call, "calendar_event", id).await?;
                let Some(old) = ev["revisions"]
                    .as_array()
                    .and_then(|l| l.iter().find(|r| r["revision"] == json!(wanted)))
                    .cloned()
                else {
                    return Err(rejected(
                        "not_found",
                        format!("event {id} has no revision {wanted}"),
                    ));
                };
                let revision = ev["revision"].as_i64().unwrap_or(1) + 1;
                ev["start"] = old["start"].clone();
                ev["end"] = old["end"].clone();
                ev["revision"] = json!(revision);
                let entry = json!({"revision": revision, "start": ev["start"], "end": ev["end"],
                                   "reverted_to": wanted});
                if let Some(list) = ev["revisions"].as_array_mut() {
                    list.push(entry);
                }
                Ok((
                    json!({"ref": format!("{id}#{revision}"), "event_id": id, "revision": revision,
                           "reverted_to": wanted, "start": ev["start"], "end": ev["end"]}),
                    vec![write("calendar_event", id, tenant, &ev, Some(obj.version))],
                ))
            }
            "mobility.ride.adjust" => {
                let id = arg(args, "ride_id")?;
                let (obj, mut ride) = self.owned(call, "ride", id).await?;
                if ride["status"] != json!("booked") {
                    return Err(rejected(
                        "not_active",
                        format!("ride {id} is {}", ride["status"]),
                    ));
                }
                let previous = ride["pickup_at"].clone();
                ride["pickup_at"] = args["pickup_time"].clone();
                Ok((
                    json!({"ref": format!("{id}@{}", args["pickup_time"].as_str().unwrap_or_default()),
                           "ride_id": id, "pickup_at": ride["pickup_at"],
                           "previous_pickup_at": previous, "previous_pickup_time": previous,
                           "status": "booked"}),
                    vec![write("ride", id, tenant, &ride, Some(obj.version))],
                ))
            }
            "messaging.send" => {
                let id = arg(args, "contact_id")?;
                self.owned(call, "contact", id).await?;
                let n = self
                    .store
                    .demo_list(STILLON, "message")
                    .await
                    .map_err(unavailable)?
                    .len();
                let msg_id = format!("MSG-{:06}", n + 1);
                let message = json!({"message_id": msg_id, "contact_id": id,
                                     "channel": args["channel"], "message": args["message"],
                                     "idempotency_key": call.idem_key, "status": "sent"});
                Ok((
                    json!({"ref": msg_id, "contact_id": id, "channel": args["channel"],
                           "status": "sent"}),
                    vec![write("message", &msg_id, tenant, &message, None)],
                ))
            }
            other => Err(rejected(
                "unknown_operation",
                format!("no operation {other}"),
            )),
        }
    }

    /// Applies one effect; `None` when a record changed underneath (plan again).
    async fn apply(
        &self,
        call: &Invocation,
        result: &Value,
        writes: &[ObjectWrite],
    ) -> Result<Option<Value>, AdapterError> {
        let effect = DemoEffect {
            system: STILLON.into(),
            idem_key: call.idem_key.clone(),
            operation: call.operation.clone(),
            request: call.arguments.to_string(),
            result: result.to_string(),
            at: self.store.clock().now_ms(),
        };
        match self
            .store
            .demo_apply(&effect, writes)
            .await
            .map_err(unavailable)?
        {
            Applied::Now => Ok(Some(result.clone())),
            Applied::Before(before) => super::demo_kit::replayed(&before, call).map(Some),
            Applied::Changed => Ok(None),
        }
    }

    /// One effect. `misapply` (an injected [`super::builtin::FaultMode::Misapplied`]): a
    /// reservation move seats the party at the free sitting nearest the one asked for and
    /// answers as if it had moved it as asked; any other operation refuses.
    async fn write(&self, call: &Invocation, misapply: bool) -> Result<Value, AdapterError> {
        // A key seen before answers with its first result, whatever the state is now.
        if let Some(before) = self
            .store
            .demo_effect(STILLON, &call.idem_key)
            .await
            .map_err(unavailable)?
        {
            return super::demo_kit::replayed(&before, call);
        }
        if call.operation == "dining.reservation.modify" {
            return self.modify(call, misapply).await;
        }
        if misapply {
            return Err(rejected(
                "injected",
                "the partner refused (injected fault: it has nothing else to apply)",
            ));
        }
        for _ in 0..8 {
            let (result, writes) = self.plan(call).await?;
            if let Some(answer) = self.apply(call, &result, &writes).await? {
                return Ok(answer);
            }
        }
        Err(AdapterError::Unavailable(
            "the partner's records kept changing".into(),
        ))
    }
}

/// Free slots of restaurant `r` on `date`, `HH:MM`, in order.
fn free_slots(r: &Value, date: &str) -> Vec<String> {
    r["slots"][date]
        .as_object()
        .map(|day| {
            day.iter()
                .filter(|(_, s)| **s == json!("free"))
                .map(|(t, _)| t.clone())
                .collect()
        })
        .unwrap_or_default()
}

fn minutes(t: &str) -> Option<i64> {
    let (h, m) = t.split_once(':')?;
    Some(h.parse::<i64>().ok()? * 60 + m.parse::<i64>().ok()?)
}

fn within_an_hour(a: &str, b: &str) -> bool {
    matches!((minutes(a), minutes(b)), (Some(x), Some(y)) if (x - y).abs() <= 60)
}

impl Adapter for StillOn {
    fn invoke<'a>(&'a self, call: &'a Invocation) -> BoxFuture<'a, Result<Value, AdapterError>> {
        Box::pin(with_faults(
            &self.store,
            STILLON,
            "the partner",
            &call.operation,
            move |misapply| async move {
                if READS.contains(&call.operation.as_str()) {
                    // A read has nothing else to apply: the injected fault refuses it, never
                    // silently used up.
                    if misapply {
                        return Err(rejected(
                            "injected",
                            "the partner refused (injected fault: a read has nothing else to apply)",
                        ));
                    }
                    self.read(call).await
                } else {
                    self.write(call, misapply).await
                }
            },
        ))
    }

    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        idem_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, AdapterError>> {
        let _ = tenant;
        Box::pin(async move {
            match self
                .store
                .demo_effect(STILLON, idem_key)
                .await
                .map_err(unavailable)?
            {
                Some(e) => Ok(Some(serde_json::from_str(&e.result).map_err(unavailable)?)),
                None => Ok(None),
            }
        })
    }

    fn facts<'a>(
        &'a self,
        kind: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceFact>, AdapterError>> {
        Box::pin(async move {
            let Some(obj) = self
                .store
                .demo_get(STILLON, kind, id)
                .await
                .map_err(unavailable)?
            else {
                return Ok(None);
            };
            let value = parse(&obj)?;
            // Only the attributes the example's Cedar schema declares for each kind.
            let fields: &[(&str, &str)] = match kind {
                "restaurant" => &[("city", "city")],
                "reservation" => &[
                    ("restaurant_id", "restaurant_id"),
                    ("starts_at", "starts_at"),
                    ("party_size", "party_size"),
                    ("status", "status"),
                ],
                "calendar_event" => &[("starts_at", "start")],
                "ride" => &[("pickup_at", "pickup_at")],
                _ => &[],
            };
            let mut attrs = Map::new();
            for (attr, field) in fields {
                if let Some(v) = value.get(*field) {
                    attrs.insert((*attr).into(), v.clone());
                }
            }
            Ok(Some(ResourceFact {
                kind: kind.into(),
                id: id.into(),
                tenant: obj.tenant,
                owner: value
                    .get("owner")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                attrs,
            }))
        })
    }

    fn readback_aliases(&self, operation: &str) -> &'static [(&'static str, &'static str)] {
        match operation {
            "dining.reservation.modify" => &[("requested_time", "time")],
            "mobility.ride.adjust" => &[("pickup_time", "pickup_at")],
            _ => &[],
        }
    }
}
