//! What the demo target systems (the ERP in `builtin`, StillOn in `stillon`) share: faults
//! and latency injected per operation, reading a call's arguments, the answers a demo system
//! gives (rejected, unavailable, replayed), and a tenant's objects.

use super::contract::{AdapterError, Invocation};
use countersign_core::Store;
use countersign_core::store::{DemoEffect, DemoObject};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A fault injected into one operation of a demo system (object kind `fault`, id = the
/// operation): applied to the next `times` calls.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Fault {
    /// What happens.
    pub mode: FaultMode,
    /// How many calls it affects.
    pub times: u32,
}

/// How an injected fault behaves.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FaultMode {
    /// The target refuses with an error; nothing happens.
    Fail,
    /// The target cannot be reached; nothing happens.
    Unavailable,
    /// The effect is applied, then the answer is lost.
    TimeoutAfterEffect,
    /// The target takes [`SLOW_FAULT`] before applying the effect and answering (a call
    /// held in flight, for the cancellation and stop races).
    Slow,
    /// The target accepts the call and answers as if it did what was asked, but applies
    /// something else: the StillOn partner seats a moved reservation at the free sitting
    /// nearest the one asked for (only a read-back can tell). Operations with no "something
    /// else" to apply refuse like [`FaultMode::Fail`] — an injected fault is never ignored.
    Misapplied,
}

/// The object kind injected faults are stored as (id = the operation).
/// The tenant of a demo system's own objects (faults, latencies, counters): no tenant's.
pub(super) const ANY_TENANT: &str = "*";

pub(super) const FAULT: &str = "fault";

/// How long a [`FaultMode::Slow`] call takes.
pub const SLOW_FAULT: std::time::Duration = std::time::Duration::from_millis(1500);

/// Injects `fault` into `operation` of `system`.
pub async fn inject_fault(
    store: &Store,
    system: &str,
    operation: &str,
    fault: &Fault,
) -> Result<(), countersign_core::StoreError> {
    let data = serde_json::to_string(fault)
        .map_err(|e| countersign_core::StoreError::Conflict(e.to_string()))?;
    store
        .demo_put(system, FAULT, operation, ANY_TENANT, &data)
        .await?;
    Ok(())
}

/// A latency set on one operation of a demo system (object kind `latency`, id = the
/// operation): every call waits `before_ms` before applying its effect and `after_ms` after
/// it, before answering — a realistic target, so a worker killed mid-call is killed with the
/// effect not yet applied or applied but not yet answered. Unlike a [`Fault`] it is not used
/// up; [`set_latency`] with zeros clears it.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Latency {
    /// Milliseconds before the effect.
    pub before_ms: u64,
    /// Milliseconds after the effect, before the answer.
    pub after_ms: u64,
}

/// Sets `latency` on `operation` of `system`.
pub async fn set_latency(
    store: &Store,
    system: &str,
    operation: &str,
    latency: Latency,
) -> Result<(), countersign_core::StoreError> {
    let data = serde_json::to_string(&latency)
        .map_err(|e| countersign_core::StoreError::Conflict(e.to_string()))?;
    store
        .demo_put(system, LATENCY, operation, ANY_TENANT, &data)
        .await?;
    Ok(())
}

/// The object kind latencies are stored as (id = the operation).
pub(super) const LATENCY: &str = "latency";

/// One use of `operation`'s fault (taken), its latency and, when asked, the record `(kind,
/// id)` the call serves — read in one round trip.
pub(super) async fn fault_and_latency(
    store: &Store,
    system: &str,
    operation: &str,
    record: Option<(&str, &str)>,
) -> Result<(Option<FaultMode>, Latency, Option<DemoObject>), AdapterError> {
    let mut wanted = vec![(FAULT, operation), (LATENCY, operation)];
    wanted.extend(record);
    let mut found = store
        .demo_get_many(system, &wanted)
        .await
        .map_err(unavailable)?
        .into_iter();
    let (fault, latency) = (found.next().flatten(), found.next().flatten());
    let record = found.next().flatten();
    let latency = latency
        .and_then(|obj| serde_json::from_str(&obj.data).ok())
        .unwrap_or_default();
    let fault = consume_fault(store, system, operation, fault).await?;
    Ok((fault, latency, record))
}

pub(super) fn pause(ms: u64) -> impl std::future::Future<Output = ()> {
    tokio::time::sleep(std::time::Duration::from_millis(ms))
}

/// Runs `call` on a demo system with its [`Latency`] and injected faults applied: `Fail` and
/// `Unavailable` stop it before any effect; `TimeoutAfterEffect` lets it run, then loses the
/// answer; `Slow` delays it; `Misapplied` is handed to `call` (its argument is `true`), which
/// applies something else or refuses.
/// `refuser` names the system in the refusal message.
pub(super) async fn with_faults<C, F>(
    store: &Store,
    system: &str,
    refuser: &str,
    operation: &str,
    call: C,
) -> Result<Value, AdapterError>
where
    C: FnOnce(bool) -> F,
    F: std::future::Future<Output = Result<Value, AdapterError>>,
{
    let (fault, latency, _) = fault_and_latency(store, system, operation, None).await?;
    faulted(fault, latency, refuser, call).await
}

/// [`with_faults`] once the fault has been taken and the latency read.
pub(super) async fn faulted<C, F>(
    fault: Option<FaultMode>,
    latency: Latency,
    refuser: &str,
    call: C,
) -> Result<Value, AdapterError>
where
    C: FnOnce(bool) -> F,
    F: std::future::Future<Output = Result<Value, AdapterError>>,
{
    if latency.before_ms > 0 {
        pause(latency.before_ms).await;
    }
    match fault {
        Some(FaultMode::Fail) => {
            return Err(rejected(
                "injected",
                format!("{refuser} refused (injected fault)"),
            ));
        }
        Some(FaultMode::Unavailable) => {
            return Err(AdapterError::Unavailable("injected fault".into()));
        }
        Some(FaultMode::Slow) => tokio::time::sleep(SLOW_FAULT).await,
        Some(FaultMode::TimeoutAfterEffect | FaultMode::Misapplied) | None => {}
    }
    let result = call(fault == Some(FaultMode::Misapplied)).await;
    if latency.after_ms > 0 {
        pause(latency.after_ms).await;
    }
    let result = result?;
    if fault == Some(FaultMode::TimeoutAfterEffect) {
        return Err(AdapterError::Timeout);
    }
    Ok(result)
}

/// Takes one use of the fault `obj` (the stored `fault` object of `operation`, if any).
pub(super) async fn consume_fault(
    store: &Store,
    system: &str,
    operation: &str,
    obj: Option<DemoObject>,
) -> Result<Option<FaultMode>, AdapterError> {
    let Some(obj) = obj else {
        return Ok(None);
    };
    let Ok(fault) = serde_json::from_str::<Fault>(&obj.data) else {
        return Ok(None);
    };
    if fault.times == 0 {
        return Ok(None);
    }
    let left = Fault {
        times: fault.times - 1,
        ..fault.clone()
    };
    inject_fault(store, system, operation, &left)
        .await
        .map_err(unavailable)?;
    Ok(Some(fault.mode))
}

pub(super) fn unavailable(e: impl std::fmt::Display) -> AdapterError {
    AdapterError::Unavailable(e.to_string())
}

pub(super) fn rejected(code: &str, message: impl Into<String>) -> AdapterError {
    AdapterError::Rejected {
        code: code.into(),
        message: message.into(),
    }
}

/// The answer to a call whose key already has an effect: that effect's first result when the
/// call repeats its arguments; the key with other arguments is refused
/// (`idempotency_mismatch`: never another request's result, never a second effect), as a
/// target honouring `Idempotency-Key` answers a key reused with another payload. The
/// operation is not compared: a registry that remapped the tool between two attempts of one
/// step still gets the step's first result.
pub(super) fn replayed(before: &DemoEffect, call: &Invocation) -> Result<Value, AdapterError> {
    let same = serde_json::from_str::<Value>(&before.request).is_ok_and(|r| r == call.arguments);
    if !same {
        return Err(rejected(
            "idempotency_mismatch",
            "this idempotency key was used for another request",
        ));
    }
    serde_json::from_str(&before.result).map_err(unavailable)
}

pub(super) fn parse(obj: &DemoObject) -> Result<Value, AdapterError> {
    serde_json::from_str(&obj.data).map_err(unavailable)
}

pub(super) fn arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, AdapterError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| rejected("bad_request", format!("missing {name}")))
}

/// An object of `system` in the caller's `tenant`; another tenant's record does not exist for
/// it.
pub(super) async fn tenant_object(
    store: &Store,
    system: &str,
    kind: &str,
    id: &str,
    tenant: &str,
) -> Result<Option<(DemoObject, Value)>, AdapterError> {
    match store
        .demo_get(system, kind, id)
        .await
        .map_err(unavailable)?
    {
        Some(obj) if obj.tenant == tenant => {
            let value = parse(&obj)?;
            Ok(Some((obj, value)))
        }
        _ => Ok(None),
    }
}

/// [`tenant_object`], or `not_found`.
pub(super) async fn must_tenant_object(
    store: &Store,
    system: &str,
    kind: &str,
    id: &str,
    tenant: &str,
) -> Result<(DemoObject, Value), AdapterError> {
    tenant_object(store, system, kind, id, tenant)
        .await?
        .ok_or_else(|| rejected("not_found", format!("no {kind} {id}")))
}
