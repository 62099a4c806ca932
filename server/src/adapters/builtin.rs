//! Built-in demo target systems, with their state in Countersign's database: the finance ERP
//! (`erp`: invoices, purchase orders, suppliers, notes, payments) for the seed-000 example,
//! and StillOn's partner systems (`stillon`, in [`super::stillon`]) for seed 004.
//!
//! They behave like well-built targets so the gateway's guarantees can be tested against
//! real state: every effect is applied at most once per idempotency key (a repeated key
//! returns the first result; the key with other arguments is refused `idempotency_mismatch`),
//! effects can be looked up by key for reconciliation, business
//! rules refuse what a real ERP would (paying an invoice twice, another tenant's records),
//! and faults can be injected per operation — fail, be unavailable, time out after the
//! effect was applied, or accept the call and apply something else — by writing a `fault`
//! object (see [`Fault`]).

use super::demo_kit::{
    ANY_TENANT, arg, fault_and_latency, faulted, must_tenant_object, parse, rejected, replayed,
    unavailable, with_faults,
};
pub use super::demo_kit::{Fault, FaultMode, Latency, inject_fault, set_latency};
pub use super::seed::seed_erp;
use countersign_core::Store;
use countersign_core::policy::ResourceFact;
use countersign_core::store::{Applied, DemoEffect, DemoObject, ObjectWrite};
use serde_json::{Map, Value, json};

use super::contract::{Adapter, AdapterError, BoxFuture, Invocation};

/// The object kind of the ERP's counters (notes and payments are numbered from them).
pub const COUNTER: &str = "counter";

/// The no-op system's provider name: for load tests of the gateway and executor themselves.
pub const NOOP: &str = "noop";

/// A target that does nothing: every operation answers `{"status": "ok", "operation": …}` at
/// once and touches no state. It keeps no record, so reconciliation cannot tell whether a call
/// happened ([`Adapter::lookup`] fails: an unknown step stays unknown, fail closed).
#[derive(Debug)]
pub struct Noop;

impl Adapter for Noop {
    fn invoke<'a>(&'a self, call: &'a Invocation) -> BoxFuture<'a, Result<Value, AdapterError>> {
        Box::pin(async move { Ok(json!({"status": "ok", "operation": call.operation})) })
    }

    fn lookup<'a>(
        &'a self,
        _tenant: &'a str,
        _idem_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, AdapterError>> {
        Box::pin(async {
            Err(AdapterError::Unavailable(
                "the no-op system keeps no record of calls".into(),
            ))
        })
    }

    fn facts<'a>(
        &'a self,
        _kind: &'a str,
        _id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceFact>, AdapterError>> {
        Box::pin(async { Ok(None) })
    }
}

/// The finance ERP's system name.
pub const ERP: &str = "erp";

/// The pseudo-operation of the ERP's key lookup (reconciliation), for injecting faults into it.
pub const LOOKUP: &str = "lookup";

/// The demo ERP.
#[derive(Debug)]
pub(super) struct Erp {
    pub(super) store: Store,
}

impl Erp {
    async fn must_get(
        &self,
        kind: &str,
        id: &str,
        tenant: &str,
    ) -> Result<(DemoObject, Value), AdapterError> {
        must_tenant_object(&self.store, ERP, kind, id, tenant).await
    }

    async fn read(&self, call: &Invocation) -> Result<Value, AdapterError> {
        let args = &call.arguments;
        let tenant = call.tenant.as_str();
        match call.operation.as_str() {
            "invoices.search" => {
                let limit = args.get("limit").and_then(Value::as_u64).unwrap_or(20) as usize;
                let mut found = Vec::new();
                for obj in self
                    .store
                    .demo_list(ERP, "invoice")
                    .await
                    .map_err(unavailable)?
                {
                    if obj.tenant != tenant {
                        continue;
                    }
                    let inv = parse(&obj)?;
                    let matches = |field: &str, arg_name: &str| {
                        args.get(arg_name)
                            .is_none_or(|want| inv.get(field) == Some(want))
                    };
                    let due_ok = args
                        .get("due_before")
                        .and_then(Value::as_str)
                        .is_none_or(|d| inv.get("due_date").and_then(Value::as_str) < Some(d));
                    if matches("supplier_id", "supplier_id")
                        && matches("status", "status")
                        && due_ok
                    {
                        found.push(inv);
                    }
                    if found.len() >= limit {
                        break;
                    }
                }
                Ok(json!({ "invoices": found }))
            }
            "payments.lookup" => {
                if let Some(key) = args.get("idempotency_key").and_then(Value::as_str) {
                    let effect = self
                        .store
                        .demo_effect(ERP, key)
                        .await
                        .map_err(unavailable)?;
                    return match effect {
                        Some(e) if e.operation == "payments.schedule" => {
                            let result: Value =
                                serde_json::from_str(&e.result).map_err(unavailable)?;
                            let reference = result.get("ref").and_then(Value::as_str).unwrap_or("");
                            Ok(self.must_get("payment", reference, tenant).await?.1)
                        }
                        _ => Err(rejected("not_found", "no payment under that key")),
                    };
                }
                Ok(self
                    .must_get("payment", arg(args, "payment_reference")?, tenant)
                    .await?
                    .1)
            }
            other => Err(rejected(
                "unknown_operation",
                format!("no operation {other}"),
            )),
        }
    }

    /// Plans the writes of one effect and its result, from the current state.
    /// `attempt`: how many plans of this call found the records changed before writing (a
    /// new note then takes a number no concurrent draft can also take).
    async fn plan(
        &self,
        call: &Invocation,
        attempt: u32,
    ) -> Result<(Value, Vec<ObjectWrite>), AdapterError> {
        let args = &call.arguments;
        let tenant = call.tenant.clone();
        let write = |kind: &str, id: &str, data: &Value, expected: Option<i64>| ObjectWrite {
            kind: kind.into(),
            id: id.into(),
            tenant: tenant.clone(),
            data: data.to_string(),
            expected_version: expected,
        };
        match call.operation.as_str() {
            "notes.draft" => {
                let invoice_id = arg(args, "invoice_id")?;
                self.must_get("invoice", invoice_id, &tenant).await?;
                // The counter's next number; a draft that lost it to a concurrent one (its
                // write found the counter moved) takes one derived from its own key instead
                // (`KEYED_FROM` and up), so concurrent drafts do not all race again.
                let (id, mut writes) = if attempt == 0 {
                    let (n, counter) = self.next_number("note").await?;
                    (format!("NOTE-{n:08}"), vec![counter])
                } else {
                    let n = keyed_number(&call.idem_key, attempt);
                    (format!("NOTE-{n:08}"), Vec::new())
                };
                let note = json!({"note_id": id, "invoice_id": invoice_id,
                                  "text": arg(args, "text")?, "status": "draft"});
                writes.push(write("note", &id, &note, None));
                Ok((note, writes))
            }
            "notes.discard" => {
                let id = arg(args, "note_id")?;
                let (obj, mut note) = self.must_get("note", id, &tenant).await?;
                note["status"] = json!("discarded");
                Ok((
                    note.clone(),
                    vec![write("note", id, &note, Some(obj.version))],
                ))
            }
            "invoices.hold" => {
                let id = arg(args, "invoice_id")?;
                let (obj, mut inv) = self.must_get("invoice", id, &tenant).await?;
                if inv["status"] == json!("paid") {
                    return Err(rejected(
                        "conflict",
                        format!("invoice {id} is already paid"),
                    ));
                }
                inv["status"] = json!("on_hold");
                inv["hold"] = json!({"amount": args["amount"], "currency": args["currency"],
                                     "reason": args["reason"]});
                Ok((
                    json!({"invoice_id": id, "status": "on_hold"}),
                    vec![write("invoice", id, &inv, Some(obj.version))],
                ))
            }
            "payments.schedule" => {
                let id = arg(args, "invoice_id")?;
                let (obj, mut inv) = self.must_get("invoice", id, &tenant).await?;
                if inv["status"] == json!("paid") {
                    return Err(rejected(
                        "conflict",
                        format!("invoice {id} is already paid"),
                    ));
                }
                if inv["status"] != json!("approved") {
                    return Err(rejected(
                        "conflict",
                        format!("invoice {id} is not approved"),
                    ));
                }
                let date = arg(args, "value_date")?;
                let (n, counter) = self.next_number("payment").await?;
                let reference = format!("PAYRUN-{date}/{:04}", ((n - 1) % 9999) + 1);
                let payment = json!({"ref": reference, "invoice_id": id,
                    "supplier_id": inv["supplier_id"], "amount": args["amount"],
                    "currency": args["currency"], "value_date": date, "status": "scheduled",
                    "idempotency_key": call.idem_key});
                inv["status"] = json!("paid");
                inv["payment_ref"] = json!(reference);
                Ok((
                    json!({"ref": reference, "status": "scheduled"}),
                    vec![
                        counter,
                        write("payment", &reference, &payment, None),
                        write("invoice", id, &inv, Some(obj.version)),
                    ],
                ))
            }
            "suppliers.update_iban" => {
                let id = arg(args, "supplier_id")?;
                let (obj, mut sup) = self.must_get("supplier", id, &tenant).await?;
                if sup["blocked"] == json!(true) {
                    return Err(rejected("conflict", format!("supplier {id} is blocked")));
                }
                sup["iban"] = json!(arg(args, "iban")?);
                Ok((
                    json!({"supplier_id": id, "status": "updated"}),
                    vec![write("supplier", id, &sup, Some(obj.version))],
                ))
            }
            other => Err(rejected(
                "unknown_operation",
                format!("no operation {other}"),
            )),
        }
    }

    /// The next number of `kind` (1, 2, …) and the write that takes it: the ERP's counter
    /// object (kind [`COUNTER`], id `kind`, data `{"next": n}`) moved on under its version, so
    /// two plans that read the same number cannot both take it (one is `Changed` and plans
    /// again). A database without the counter yet (before it existed) starts after the
    /// records already there — the one time the ERP counts them.
    async fn next_number(&self, kind: &str) -> Result<(u64, ObjectWrite), AdapterError> {
        let counter = self
            .store
            .demo_get(ERP, COUNTER, kind)
            .await
            .map_err(unavailable)?;
        let (next, expected_version) = match counter {
            Some(obj) => {
                let data: Value = serde_json::from_str(&obj.data).map_err(|e| {
                    AdapterError::Unavailable(format!("the ERP's {kind} counter: {e}"))
                })?;
                let next = data["next"].as_u64().filter(|n| *n >= 1).ok_or_else(|| {
                    AdapterError::Unavailable(format!("the ERP's {kind} counter has no next"))
                })?;
                (next, Some(obj.version))
            }
            None => {
                let existing = self
                    .store
                    .demo_count(ERP, kind)
                    .await
                    .map_err(unavailable)?;
                (u64::try_from(existing).unwrap_or(0) + 1, None)
            }
        };
        let write = ObjectWrite {
            kind: COUNTER.into(),
            id: kind.into(),
            tenant: ANY_TENANT.into(),
            data: json!({ "next": next + 1 }).to_string(),
            expected_version,
        };
        Ok((next, write))
    }

    async fn write(&self, call: &Invocation) -> Result<Value, AdapterError> {
        // A key seen before answers with its first result, whatever the state is now.
        if let Some(before) = self
            .store
            .demo_effect(ERP, &call.idem_key)
            .await
            .map_err(unavailable)?
        {
            return replayed(&before, call);
        }
        for attempt in 0..8 {
            let (result, writes) = self.plan(call, attempt).await?;
            let effect = DemoEffect {
                system: ERP.into(),
                idem_key: call.idem_key.clone(),
                operation: call.operation.clone(),
                request: call.arguments.to_string(),
                result: result.to_string(),
                at: self.store.clock().now_ms(),
            };
            match self
                .store
                .demo_apply(&effect, &writes)
                .await
                .map_err(unavailable)?
            {
                Applied::Now => return Ok(result),
                Applied::Before(before) => return replayed(&before, call),
                // Someone changed a record between read and write: plan again on fresh state.
                Applied::Changed => continue,
            }
        }
        Err(AdapterError::Unavailable(
            "the ERP's records kept changing".into(),
        ))
    }
}

/// Where numbers derived from a key start: above any number the ERP's counters reach in
/// practice, so that a counter never runs into a note numbered from a key (its draft would
/// find the id taken, roll back with the counter unmoved, and every later draft would meet
/// the same taken number).
const KEYED_FROM: u64 = 50_000_000;

/// A number in `KEYED_FROM..10^8` derived from `key` and `attempt` (sha256), for ids that
/// concurrent calls must not share.
fn keyed_number(key: &str, attempt: u32) -> u64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{key}:{attempt}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    KEYED_FROM + u64::from_be_bytes(first) % (100_000_000 - KEYED_FROM)
}

const READS: &[&str] = &[
    "invoices.get",
    "invoices.search",
    "purchase_orders.get",
    "suppliers.get",
    "payments.lookup",
];

/// The ERP's reads of one record: operation → (object kind, id argument).
fn record_read(operation: &str) -> Option<(&'static str, &'static str)> {
    match operation {
        "invoices.get" => Some(("invoice", "invoice_id")),
        "purchase_orders.get" => Some(("purchase_order", "po_id")),
        "suppliers.get" => Some(("supplier", "supplier_id")),
        _ => None,
    }
}

impl Erp {
    /// A read of one record: its operation's fault and latency and the record in one round
    /// trip; the record only in the caller's tenant, else `not_found`.
    async fn read_record(
        &self,
        call: &Invocation,
        kind: &str,
        id_arg: &str,
    ) -> Result<Value, AdapterError> {
        let id = arg(&call.arguments, id_arg)?;
        let (fault, latency, record) =
            fault_and_latency(&self.store, ERP, &call.operation, Some((kind, id))).await?;
        faulted(fault, latency, "the ERP", move |misapply| async move {
            if misapply {
                return Err(rejected(
                    "injected",
                    "the ERP refused (injected fault: it has nothing else to apply)",
                ));
            }
            match record {
                Some(obj) if obj.tenant == call.tenant => parse(&obj),
                _ => Err(rejected("not_found", format!("no {kind} {id}"))),
            }
        })
        .await
    }
}

impl Adapter for Erp {
    fn invoke<'a>(&'a self, call: &'a Invocation) -> BoxFuture<'a, Result<Value, AdapterError>> {
        if let Some((kind, id_arg)) = record_read(&call.operation) {
            return Box::pin(self.read_record(call, kind, id_arg));
        }
        Box::pin(with_faults(
            &self.store,
            ERP,
            "the ERP",
            &call.operation,
            move |misapply| async move {
                if misapply {
                    return Err(rejected(
                        "injected",
                        "the ERP refused (injected fault: it has nothing else to apply)",
                    ));
                }
                if READS.contains(&call.operation.as_str()) {
                    self.read(call).await
                } else {
                    self.write(call).await
                }
            },
        ))
    }

    fn lookup<'a>(
        &'a self,
        _tenant: &'a str,
        idem_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, AdapterError>> {
        Box::pin(async move {
            // A fault injected into the pseudo-operation `lookup` (e.g. `unavailable`) makes
            // the ERP unable to tell reconciliation anything: an `unknown` then stays so.
            let (fault, latency, _) = fault_and_latency(&self.store, ERP, LOOKUP, None).await?;
            let found = faulted(fault, latency, "the ERP", |_| async {
                Ok(match self
                    .store
                    .demo_effect(ERP, idem_key)
                    .await
                    .map_err(unavailable)?
                {
                    Some(e) => json!({"found": serde_json::from_str::<Value>(&e.result).map_err(unavailable)?}),
                    None => json!({}),
                })
            })
            .await?;
            Ok(found.get("found").cloned())
        })
    }

    fn readback_aliases(&self, operation: &str) -> &'static [(&'static str, &'static str)] {
        match operation {
            // A hold's amount is the hold's, not the invoice's.
            "invoices.hold" => &[("amount", "hold.amount"), ("currency", "hold.currency")],
            _ => &[],
        }
    }

    fn facts<'a>(
        &'a self,
        kind: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceFact>, AdapterError>> {
        Box::pin(async move {
            let Some(obj) = self
                .store
                .demo_get(ERP, kind, id)
                .await
                .map_err(unavailable)?
            else {
                return Ok(None);
            };
            let value = parse(&obj)?;
            let mut attrs = Map::new();
            for field in ["amount", "currency", "status", "blocked", "supplier_id"] {
                if let Some(v) = value.get(field) {
                    attrs.insert(field.into(), v.clone());
                }
            }
            Ok(Some(ResourceFact {
                kind: kind.into(),
                id: id.into(),
                tenant: obj.tenant,
                owner: None,
                attrs,
            }))
        })
    }
}
