//! Layer-2 policy tables: (role, tool, arguments, resources) → expected decision and rule,
//! over the finance and StillOn example bundles. Milliseconds, no model, no network.
//!
//! Everything about a tool comes from the REAL loaded bundle (`examples/*`): whether the
//! tool is listed for the row's role (`Registry::tool_for_role`), its effect and gate, and
//! the schema errors of the row's arguments (`Registry::validate`). Nothing is mirrored by
//! hand. Two explicit, per-row exceptions, each visible in the row:
//! * `.unchecked()` skips schema validation, to show the engine itself fails closed on
//!   arguments the schema would have refused (defence in depth);
//! * `.gate(g)` overrides the tool's gate, for the one floor no example tool exercises.
//!
//! `.no_base()` decides against the finance bundle with its `base.listed` permit removed.

use std::sync::OnceLock;

use chrono::{DateTime, Duration, Utc};
use countersign_core::bundle::{Bundle, BundleSources};
use countersign_core::policy::{
    ApprovalState, AuthorizationCondition as Cond, Decision, Principal, PrincipalKind, Request,
    ResourceFact, Rule, StandingAuthorization, TaskOrigin, ToolFacts,
};
use countersign_core::registry::{RoleName, ToolName};
use countersign_core::{Effect, Gate};
use serde_json::{Map, Value, json};

use crate::bundle::{example_bundle, example_sources};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Example {
    Finance,
    StillOn,
}

/// The example bundle, loaded once per test binary.
pub fn bundle(example: Example) -> &'static Bundle {
    static FINANCE: OnceLock<Bundle> = OnceLock::new();
    static STILLON: OnceLock<Bundle> = OnceLock::new();
    match example {
        Example::Finance => FINANCE.get_or_init(|| example_bundle("finance")),
        Example::StillOn => STILLON.get_or_init(|| example_bundle("stillon")),
    }
}

/// The finance bundle without its base permit: default-deny shows through.
pub fn finance_without_base() -> &'static Bundle {
    static NO_BASE: OnceLock<Bundle> = OnceLock::new();
    NO_BASE.get_or_init(|| {
        let mut s: BundleSources = example_sources("finance");
        let base = "@id(\"base.listed\")\npermit (principal, action, resource);";
        assert!(s.policies.contains(base));
        s.policies = s.policies.replace(base, "");
        Bundle::load(s).unwrap()
    })
}

/// 2026-06-11T09:42:17Z, the same instant as the other tests' clock.
pub fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_781_170_937, 0).unwrap()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    Allow,
    Within(&'static str),
    Approval(&'static str),
    Deny(&'static str),
}

#[derive(Debug, Clone)]
pub struct Row {
    pub name: &'static str,
    pub example: Example,
    pub role: &'static str,
    pub kind: PrincipalKind,
    pub tool: &'static str,
    pub args: Value,
    pub resources: Vec<ResourceFact>,
    pub origin: TaskOrigin,
    pub approval: ApprovalState,
    pub grants: Vec<StandingAuthorization>,
    pub unchecked: bool,
    pub no_base: bool,
    pub gate: Option<Gate>,
    pub expect: Expect,
}

fn row(
    example: Example,
    name: &'static str,
    role: &'static str,
    tool: &'static str,
    args: Value,
) -> Row {
    Row {
        name,
        example,
        role,
        kind: PrincipalKind::Agent,
        tool,
        args,
        resources: Vec::new(),
        origin: TaskOrigin::User,
        approval: ApprovalState::None,
        grants: Vec::new(),
        unchecked: false,
        no_base: false,
        gate: None,
        expect: Expect::Allow,
    }
}

fn fin(name: &'static str, role: &'static str, tool: &'static str, args: Value) -> Row {
    row(Example::Finance, name, role, tool, args)
}

fn so(name: &'static str, role: &'static str, tool: &'static str, args: Value) -> Row {
    row(Example::StillOn, name, role, tool, args)
}

impl Row {
    fn res(mut self, r: ResourceFact) -> Self {
        self.resources.push(r);
        self
    }
    fn origin(mut self, o: TaskOrigin) -> Self {
        self.origin = o;
        self
    }
    fn human(mut self) -> Self {
        self.kind = PrincipalKind::Human;
        self
    }
    fn approval(mut self, a: ApprovalState) -> Self {
        self.approval = a;
        self
    }
    fn grant(mut self, g: StandingAuthorization) -> Self {
        self.grants.push(g);
        self
    }
    /// Skip schema validation: the engine must fail closed on its own.
    fn unchecked(mut self) -> Self {
        self.unchecked = true;
        self
    }
    /// Decide against the finance bundle without `base.listed`.
    fn no_base(mut self) -> Self {
        self.no_base = true;
        self
    }
    fn gate(mut self, g: Gate) -> Self {
        self.gate = Some(g);
        self
    }
    fn allow(mut self) -> Self {
        self.expect = Expect::Allow;
        self
    }
    fn within(mut self, id: &'static str) -> Self {
        self.expect = Expect::Within(id);
        self
    }
    fn approve(mut self, rule: &'static str) -> Self {
        self.expect = Expect::Approval(rule);
        self
    }
    fn deny(mut self, rule: &'static str) -> Self {
        self.expect = Expect::Deny(rule);
        self
    }

    /// The bundle this row is decided against.
    pub fn bundle(&self) -> &'static Bundle {
        if self.no_base {
            finance_without_base()
        } else {
            bundle(self.example)
        }
    }

    /// The request, with listing, effect, gate and schema errors from the row's bundle.
    pub fn request(&self) -> Request {
        self.request_for(self.bundle())
    }

    /// The request, with listing, effect, gate and schema errors from `bundle`.
    pub fn request_for(&self, bundle: &Bundle) -> Request {
        let role = RoleName::parse(self.role).unwrap();
        // A tool the registry does not have is "not listed" for everyone.
        let mut tool = bundle.tool_facts(&role, self.tool).unwrap_or(ToolFacts {
            name: self.tool.to_owned(),
            effect: Effect::Read,
            gate: Gate::Never,
            listed_for_role: false,
        });
        if let Some(g) = self.gate {
            tool.gate = g;
        }
        let schema_errors = match (self.unchecked, ToolName::parse(self.tool)) {
            (false, Ok(name)) if bundle.registry.tool(&name).is_some() => bundle
                .registry
                .validate(&name, &self.args)
                .err()
                .unwrap_or_default()
                .iter()
                .map(ToString::to_string)
                .collect(),
            _ => Vec::new(),
        };
        let (id, tenant, acts_for) = match self.example {
            Example::Finance => ("agent-fin-1", "acme", "user-123"),
            Example::StillOn => ("maestro", "stillon", CUSTOMER),
        };
        let (id, acts_for) = match self.kind {
            PrincipalKind::Agent => (id, Some(acts_for.to_owned())),
            PrincipalKind::Human => (acts_for, None),
        };
        Request {
            principal: Principal {
                kind: self.kind,
                id: id.to_owned(),
                role: self.role.to_owned(),
                tenant: tenant.to_owned(),
                acts_for,
            },
            tool,
            schema_errors,
            arguments: self.args.clone(),
            resources: self.resources.clone(),
            task_origin: self.origin,
            approval: self.approval,
            now: now(),
            authorizations: self.grants.clone(),
        }
    }
}

fn expected(e: &Expect) -> Decision {
    let rule = |s: &str| Rule::parse(s).unwrap_or_else(|| panic!("bad rule in table: {s}"));
    match e {
        Expect::Allow => Decision::Allow,
        Expect::Within(id) => Decision::AllowWithinAuthorization((*id).to_owned()),
        Expect::Approval(r) => Decision::RequireApproval(rule(r)),
        Expect::Deny(r) => Decision::Deny(rule(r)),
    }
}

// ------------------------------------------------------------------------- facts

const CUSTOMER: &str = "cust-42";
const INV: &str = "INV-20260611";
const SUP: &str = "SUP-000042";
const RUN: &str = "0b7e8f8a-3c1d-4e59-9a57-2f1c6d4b8e10";
const STEP: &str = "5d1f0c2e-7a4b-4c3d-8e9f-a0b1c2d3e4f5";
/// A step's inputs hash, as `step.list` shows it.
const HASH: &str = "sha256:db3a46fae0b1dbce179a4ebc620c4358e5f524875745a882562e0c4557518764";
const REASON: &str = "Invoice approved by AP, due in four days";

fn fact(kind: &str, id: &str, tenant: &str, owner: Option<&str>, attrs: Value) -> ResourceFact {
    let attrs: Map<String, Value> = match attrs {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    ResourceFact {
        kind: kind.to_owned(),
        id: id.to_owned(),
        tenant: tenant.to_owned(),
        owner: owner.map(str::to_owned),
        attrs,
    }
}

fn invoice(status: &str, amount: Value) -> ResourceFact {
    fact(
        "invoice",
        INV,
        "acme",
        None,
        json!({"status": status, "amount": amount, "currency": "EUR", "supplier_id": SUP}),
    )
}

fn invoice_in(tenant: &str) -> ResourceFact {
    let mut f = invoice("approved", json!(4180.00));
    f.tenant = tenant.to_owned();
    f
}

fn supplier(blocked: bool) -> ResourceFact {
    fact(
        "supplier",
        SUP,
        "acme",
        None,
        json!({"name": "Acme GmbH", "blocked": blocked}),
    )
}

fn reservation_at(owner: &str, status: &str, starts_at: &str) -> ResourceFact {
    fact(
        "reservation",
        "8472",
        "stillon",
        Some(owner),
        json!({"restaurant_id": "RST-0019", "starts_at": starts_at, "party_size": 4, "status": status}),
    )
}

fn reservation(owner: &str, status: &str) -> ResourceFact {
    reservation_at(owner, status, "2026-06-11T19:30:00+01:00")
}

fn owned(kind: &str, id: &str, owner: &str) -> ResourceFact {
    fact(kind, id, "stillon", Some(owner), json!({}))
}

fn payment(amount: Value) -> Value {
    json!({"invoice_id": INV, "amount": amount, "currency": "EUR", "value_date": "2026-06-15", "reason": REASON})
}

fn hold(amount: Value) -> Value {
    json!({"invoice_id": INV, "amount": amount, "currency": "EUR", "reason": "Damaged goods on delivery"})
}

fn iban(reason: &str) -> Value {
    json!({"supplier_id": SUP, "iban": "DE89370400440532013000", "reason": reason})
}

fn shift(requested_time: &str) -> Value {
    json!({"reservation_id": 8472, "requested_time": requested_time, "reason": "Flight LH1234 lands 90 minutes late"})
}

fn cancel() -> Value {
    json!({"reservation_id": 8472, "reason": "The restaurant cannot seat us after 20:00"})
}

/// Seed 004's standing authorization: move my reservation by ≤ 30 minutes.
fn dinner_grant() -> StandingAuthorization {
    StandingAuthorization {
        id: "sa-dinner-30".into(),
        principal: CUSTOMER.into(),
        tool: "reservation.modify".into(),
        conditions: vec![
            Cond::OwnsResource,
            Cond::MaxShiftMinutes(30),
            Cond::OnlyArguments(vec![
                "reservation_id".into(),
                "requested_time".into(),
                "reason".into(),
            ]),
        ],
        expires_at: now() + Duration::days(30),
    }
}

fn hold_grant() -> StandingAuthorization {
    StandingAuthorization {
        id: "sa-hold-2k".into(),
        principal: "user-123".into(),
        tool: "invoice.hold".into(),
        conditions: vec![Cond::MaxAmountMinor(200_000)],
        expires_at: now() + Duration::days(1),
    }
}

// ------------------------------------------------------------------------- the table

pub fn rows() -> Vec<Row> {
    let inv = || invoice("approved", json!(30000.00));
    let plan = json!({"task": "Pay INV-20260611", "steps": [
        {"tool": "invoice.get", "arguments": {"invoice_id": INV}, "reason": "Read the invoice before paying it"},
        {"tool": "payment.schedule", "arguments": payment(json!(4180.00)), "reason": "Pay the approved invoice on time"}
    ]});
    vec![
        // --- finance: reads and run tools per role
        fin("planner searches invoices", "planner", "invoice.search", json!({"status": "approved", "limit": 20})).allow(),
        fin("planner reads an invoice", "planner", "invoice.get", json!({"invoice_id": INV})).res(inv()).allow(),
        fin("planner reads a PO", "planner", "po.get", json!({"po_id": "PO-10001"}))
            .res(fact("purchase_order", "PO-10001", "acme", None, json!({"status": "open"}))).allow(),
        fin("planner reads a supplier", "planner", "supplier.get", json!({"supplier_id": SUP})).res(supplier(false)).allow(),
        fin("planner looks a payment up", "planner", "payment.lookup", json!({"payment_reference": "PAYRUN-2026-06-15/0001"})).allow(),
        fin("planner submits a plan", "planner", "plan.submit", plan).allow(),
        fin("planner reads run status", "planner", "run.status", json!({"run_id": RUN})).allow(),
        fin("planner cancels a run", "planner", "run.cancel", json!({"run_id": RUN, "reason": "Superseded by a newer plan"})).allow(),
        fin("reviewer lists steps", "reviewer", "step.list", json!({"status": "needs_approval"})).allow(),
        fin("reviewer approves a step", "reviewer", "step.approve", json!({"step_id": STEP, "inputs_hash": HASH, "reason": "Matches the invoice and the PO"})).allow(),
        fin("reviewer rejects a step", "reviewer", "step.reject", json!({"step_id": STEP, "reason": "Wrong supplier on the invoice"})).allow(),
        fin("reviewer reads an invoice", "reviewer", "invoice.get", json!({"invoice_id": INV})).res(inv()).allow(),
        fin("worker.finance searches", "worker.finance", "invoice.search", json!({})).allow(),
        fin("worker.finance drafts a note", "worker.finance", "note.draft", json!({"invoice_id": INV, "text": "Paid on the 15th"})).res(inv()).allow(),
        fin("worker.finance discards a note", "worker.finance", "note.discard", json!({"note_id": "NOTE-00000001"})).allow(),
        fin("worker.comms drafts a note", "worker.comms", "note.draft", json!({"invoice_id": INV, "text": "Reminder"})).res(inv()).allow(),
        fin("worker.comms reads an invoice", "worker.comms", "invoice.get", json!({"invoice_id": INV})).res(inv()).allow(),
        fin("vendor master reads a supplier", "worker.vendor_master", "supplier.get", json!({"supplier_id": SUP})).allow(),
        // --- finance: role listing floor (tools listed for another role, or for nobody)
        fin("planner cannot schedule payments", "planner", "payment.schedule", payment(json!(100))).res(inv()).deny("role.tool_not_listed"),
        fin("planner cannot draft notes", "planner", "note.draft", json!({"invoice_id": INV, "text": "x"})).deny("role.tool_not_listed"),
        fin("worker.finance cannot change IBANs", "worker.finance", "supplier.update_iban", iban("Letter from the supplier")).res(supplier(false)).deny("role.tool_not_listed"),
        fin("worker.comms cannot hold invoices", "worker.comms", "invoice.hold", hold(json!(10))).res(inv()).deny("role.tool_not_listed"),
        fin("worker.comms cannot schedule payments", "worker.comms", "payment.schedule", payment(json!(10))).res(inv()).deny("role.tool_not_listed"),
        fin("reviewer cannot cancel runs", "reviewer", "run.cancel", json!({"run_id": RUN, "reason": "Superseded by a newer plan"})).deny("role.tool_not_listed"),
        fin("vendor master cannot read invoices", "worker.vendor_master", "invoice.get", json!({"invoice_id": INV})).deny("role.tool_not_listed"),
        fin("planner cannot approve steps", "planner", "step.approve", json!({"step_id": STEP, "reason": "Matches the invoice and the PO"})).deny("role.tool_not_listed"),
        fin("a tool the registry lacks exists for nobody", "worker.finance", "credit_note.issue", hold(json!(10))).res(inv()).deny("role.tool_not_listed"),
        // --- finance: default deny
        fin("listed but no policy permits it", "planner", "invoice.get", json!({"invoice_id": INV})).res(inv()).no_base().deny("policy.no_permit"),
        fin("payment not pointing at an invoice", "worker.finance", "payment.schedule", payment(json!(100))).deny("payment.no_invoice"),
        // --- finance: invoice holds (write, gate: policy, gated above 1,000.00 EUR)
        fin("hold below threshold", "worker.finance", "invoice.hold", hold(json!(999.99))).res(inv()).allow(),
        fin("hold exactly at threshold", "worker.finance", "invoice.hold", hold(json!(1000.00))).res(inv()).allow(),
        fin("hold at threshold, integer spelling", "worker.finance", "invoice.hold", hold(json!(1000))).res(inv()).allow(),
        fin("hold one cent over", "worker.finance", "invoice.hold", hold(json!(1000.01))).res(inv()).approve("amount.threshold"),
        fin("hold well over", "worker.finance", "invoice.hold", hold(json!(12500.5))).res(inv()).approve("amount.threshold"),
        fin("hold finer than a cent", "worker.finance", "invoice.hold", hold(json!(1000.001))).res(inv()).deny("policy.error"),
        fin("hold above the invoice", "worker.finance", "invoice.hold", hold(json!(5000))).res(invoice("approved", json!(4180.00))).deny("amount.exceeds_invoice"),
        fin("hold under a grant", "worker.finance", "invoice.hold", hold(json!(1500))).res(inv()).grant(hold_grant()).within("sa-hold-2k"),
        fin("hold above the grant's bound", "worker.finance", "invoice.hold", hold(json!(2000.01))).res(inv()).grant(hold_grant()).approve("amount.threshold"),
        fin("hold, grant expired", "worker.finance", "invoice.hold", hold(json!(1500))).res(inv())
            .grant(StandingAuthorization { expires_at: now() - Duration::seconds(1), ..hold_grant() }).approve("amount.threshold"),
        fin("grant never lifts a forbid", "worker.finance", "invoice.hold", hold(json!(1500))).res(invoice("approved", json!(1200))).grant(hold_grant()).deny("amount.exceeds_invoice"),
        fin("client-sent amount_minor fails the schema", "worker.finance", "invoice.hold",
            json!({"invoice_id": INV, "amount": 5, "amount_minor": 1, "currency": "EUR", "reason": "Damaged goods on delivery"})).res(inv()).deny("input.schema"),
        fin("client-sent amount_minor is refused by the engine too", "worker.finance", "invoice.hold",
            json!({"invoice_id": INV, "amount": 5, "amount_minor": 1, "currency": "EUR", "reason": "Damaged goods on delivery"})).res(inv()).unchecked().deny("policy.error"),
        // --- finance: payment.schedule (irreversible, gate: always)
        fin("payment within limits still needs a person", "worker.finance", "payment.schedule", payment(json!(4180.00))).res(invoice("approved", json!(4180.00))).approve("irreversible.always"),
        fin("payment exactly at the ceiling", "worker.finance", "payment.schedule", payment(json!(25000.00))).res(inv()).approve("irreversible.always"),
        fin("payment one cent over the ceiling", "worker.finance", "payment.schedule", payment(json!(25000.01))).res(inv()).deny("amount.ceiling"),
        fin("payment over the schema maximum", "worker.finance", "payment.schedule", payment(json!(50000.01))).res(inv()).deny("input.schema"),
        fin("payment of an unapproved invoice", "worker.finance", "payment.schedule", payment(json!(100))).res(invoice("pending", json!(30000))).deny("invoice.not_approved"),
        fin("payment of an invoice without status", "worker.finance", "payment.schedule", payment(json!(100)))
            .res(fact("invoice", INV, "acme", None, json!({"amount": 100, "currency": "EUR"}))).deny("invoice.not_approved"),
        fin("payment above the invoice amount", "worker.finance", "payment.schedule", payment(json!(4180.01))).res(invoice("approved", json!(4180.00))).deny("amount.exceeds_invoice"),
        fin("payment in another currency than the invoice", "worker.finance", "payment.schedule", payment(json!(100)))
            .res(fact("invoice", INV, "acme", None, json!({"status": "approved", "amount": 30000, "currency": "USD"}))).deny("currency.mismatch"),
        fin("payment of another tenant's invoice", "worker.finance", "payment.schedule", payment(json!(100))).res(invoice_in("globex")).deny("tenant.mismatch"),
        fin("payment steered by an inbound e-mail", "worker.finance", "payment.schedule", payment(json!(100))).res(inv()).origin(TaskOrigin::External).deny("origin.external"),
        fin("payment from a schedule", "worker.finance", "payment.schedule", payment(json!(100))).res(inv()).origin(TaskOrigin::Schedule).approve("irreversible.always"),
        fin("a grant never lifts irreversible.always", "worker.finance", "payment.schedule", payment(json!(100))).res(inv())
            .grant(StandingAuthorization { id: "sa-pay".into(), principal: "user-123".into(), tool: "payment.schedule".into(), conditions: vec![], expires_at: now() + Duration::days(1) })
            .approve("irreversible.always"),
        fin("an approval in context does not lift the gate", "worker.finance", "payment.schedule", payment(json!(100))).res(inv()).approval(ApprovalState::Approved).approve("irreversible.always"),
        fin("a person in the role is gated the same", "worker.finance", "payment.schedule", payment(json!(100))).res(inv()).human().approve("irreversible.always"),
        fin("payment without an amount fails the schema", "worker.finance", "payment.schedule",
            json!({"invoice_id": INV, "currency": "EUR", "value_date": "2026-06-15", "reason": REASON})).res(inv()).deny("input.schema"),
        fin("payment without an amount errors closed in the engine", "worker.finance", "payment.schedule",
            json!({"invoice_id": INV, "currency": "EUR", "value_date": "2026-06-15", "reason": REASON})).res(inv()).unchecked().deny("policy.error"),
        fin("payment amount as a string fails the schema", "worker.finance", "payment.schedule", payment(json!("100.00"))).res(inv()).deny("input.schema"),
        fin("payment amount as a string errors closed in the engine", "worker.finance", "payment.schedule", payment(json!("100.00"))).res(inv()).unchecked().deny("policy.error"),
        // --- finance: vendor master
        fin("IBAN change needs a person", "worker.vendor_master", "supplier.update_iban", iban("Letter from the supplier")).res(supplier(false)).approve("irreversible.always"),
        fin("IBAN change of a blocked supplier", "worker.vendor_master", "supplier.update_iban", iban("Letter from the supplier")).res(supplier(true)).deny("supplier.blocked"),
        fin("IBAN change steered by an inbound e-mail", "worker.vendor_master", "supplier.update_iban", iban("Letter from the supplier")).res(supplier(false)).origin(TaskOrigin::External).deny("origin.external"),
        // --- finance: other floors
        fin("cross-tenant invoice read", "reviewer", "invoice.get", json!({"invoice_id": INV})).res(invoice_in("globex")).deny("tenant.mismatch"),
        fin("one cross-tenant resource among several", "worker.finance", "note.draft", json!({"invoice_id": INV, "text": "x"}))
            .res(inv()).res(fact("supplier", SUP, "globex", None, json!({}))).deny("tenant.mismatch"),
        fin("schema errors deny before policy", "planner", "invoice.get", json!({"invoice_id": 7})).deny("input.schema"),
        fin("not listed wins over schema errors", "planner", "payment.schedule", json!({})).deny("role.tool_not_listed"),
        fin("gate: always on a write", "worker.finance", "note.draft", json!({"invoice_id": INV, "text": "x"})).gate(Gate::Always).approve("gate.always"),
        fin("gate: always keeps a deny", "worker.finance", "payment.schedule", payment(json!(26000))).res(inv()).deny("amount.ceiling"),
        fin("unknown resource kind type errors closed", "planner", "invoice.get", json!({"invoice_id": INV}))
            .res(fact("Invoice", INV, "acme", None, json!({}))).deny("policy.error"),
        fin("null members fail the schema", "planner", "invoice.search", json!({"status": null, "limit": 20})).deny("input.schema"),
        fin("null members are left out by the engine", "planner", "invoice.search", json!({"status": null, "limit": 20})).unchecked().allow(),
        // --- StillOn: reads
        so("planner searches restaurants", "planner", "restaurant.search", json!({"city": "Lisbon", "date": "2026-06-11", "party_size": 4})).allow(),
        so("reviewer checks availability", "reviewer", "restaurant.availability", json!({"restaurant_id": "RST-0019", "date": "2026-06-11", "party_size": 4}))
            .res(fact("restaurant", "RST-0019", "stillon", None, json!({"city": "Lisbon"}))).allow(),
        so("fractional non-money numbers fail the schema", "planner", "restaurant.search", json!({"city": "Lisbon", "date": "2026-06-11", "party_size": 4.5})).deny("input.schema"),
        so("fractional non-money numbers error closed in the engine", "planner", "restaurant.search", json!({"city": "Lisbon", "date": "2026-06-11", "party_size": 4.5})).unchecked().deny("policy.error"),
        so("integral doubles are integers", "planner", "restaurant.search", json!({"city": "Lisbon", "date": "2026-06-11", "party_size": 4.0})).allow(),
        so("planner reads the customer's reservation", "planner", "reservation.get", json!({"reservation_id": 8472})).res(reservation(CUSTOMER, "confirmed")).allow(),
        so("planner cannot read someone else's reservation", "planner", "reservation.get", json!({"reservation_id": 8472})).res(reservation("cust-99", "confirmed")).deny("resource.not_owner"),
        so("planner asks the disruption monitor", "planner", "itinerary.disruptions", json!({"date": "2026-06-11"})).allow(),
        so("planner checks options against the customer's constraints", "planner", "intent.check", json!({"reservation_id": 8472, "options": [{"time": "20:00"}]}))
            .res(reservation(CUSTOMER, "confirmed")).allow(),
        so("constraints of someone else's reservation are not checked", "planner", "intent.check", json!({"reservation_id": 8472, "options": [{"time": "20:00"}]}))
            .res(reservation("cust-99", "confirmed")).deny("resource.not_owner"),
        // --- StillOn: reservation.modify (gate: policy) and the standing authorization
        so("30-minute shift within the grant", "worker.travel", "reservation.modify", shift("20:00")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).within("sa-dinner-30"),
        so("30 minutes earlier within the grant", "worker.travel", "reservation.modify", shift("19:00")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).within("sa-dinner-30"),
        so("the shift is measured in the venue's offset", "worker.travel", "reservation.modify", shift("20:00"))
            .res(reservation_at(CUSTOMER, "confirmed", "2026-06-11T19:30:00+02:00")).grant(dinner_grant()).within("sa-dinner-30"),
        so("31-minute shift needs a person", "worker.travel", "reservation.modify", shift("20:01")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).approve("reservation.change"),
        so("30 minutes and 1 second needs a person", "worker.travel", "reservation.modify", shift("20:00"))
            .res(reservation_at(CUSTOMER, "confirmed", "2026-06-11T19:29:59+01:00")).grant(dinner_grant()).approve("reservation.change"),
        so("a move across midnight needs a person", "worker.travel", "reservation.modify", shift("00:10"))
            .res(reservation_at(CUSTOMER, "confirmed", "2026-06-11T23:50:00+01:00")).grant(dinner_grant()).approve("reservation.change"),
        so("no grant: a person decides", "worker.travel", "reservation.modify", shift("20:00")).res(reservation(CUSTOMER, "confirmed")).approve("reservation.change"),
        so("expired grant has no effect", "worker.travel", "reservation.modify", shift("20:00")).res(reservation(CUSTOMER, "confirmed"))
            .grant(StandingAuthorization { expires_at: now() - Duration::hours(1), ..dinner_grant() }).approve("reservation.change"),
        so("grant expiring this instant has no effect", "worker.travel", "reservation.modify", shift("20:00")).res(reservation(CUSTOMER, "confirmed"))
            .grant(StandingAuthorization { expires_at: now(), ..dinner_grant() }).approve("reservation.change"),
        so("non-owner is denied, grant or not", "worker.travel", "reservation.modify", shift("20:00")).res(reservation("cust-99", "confirmed")).grant(dinner_grant()).deny("resource.not_owner"),
        so("reservation without an owner is denied", "worker.travel", "reservation.modify", shift("20:00"))
            .res(fact("reservation", "8472", "stillon", None, json!({"starts_at": "2026-06-11T19:30:00+01:00", "status": "confirmed"}))).deny("resource.not_owner"),
        so("another party's grant has no effect", "worker.travel", "reservation.modify", shift("20:00")).res(reservation(CUSTOMER, "confirmed"))
            .grant(StandingAuthorization { principal: "cust-99".into(), ..dinner_grant() }).approve("reservation.change"),
        so("a grant for another tool has no effect", "worker.travel", "reservation.modify", shift("20:00")).res(reservation(CUSTOMER, "confirmed"))
            .grant(StandingAuthorization { tool: "reservation.cancel".into(), ..dinner_grant() }).approve("reservation.change"),
        so("extra changes ride outside the grant", "worker.travel", "reservation.modify",
            json!({"reservation_id": 8472, "requested_time": "20:00", "party_size": 6, "reason": "Flight LH1234 lands 90 minutes late"}))
            .res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).approve("reservation.change"),
        so("unreadable requested_time fails the schema", "worker.travel", "reservation.modify", shift("8pm")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).deny("input.schema"),
        so("unreadable requested_time fails the grant closed", "worker.travel", "reservation.modify", shift("8pm")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).unchecked().approve("reservation.change"),
        so("reservation without a start fails the grant closed", "worker.travel", "reservation.modify", shift("20:00"))
            .res(fact("reservation", "8472", "stillon", Some(CUSTOMER), json!({"status": "confirmed"}))).grant(dinner_grant()).approve("reservation.change"),
        so("cancelled reservation is not moved", "worker.travel", "reservation.modify", shift("20:00")).res(reservation(CUSTOMER, "cancelled")).grant(dinner_grant()).deny("reservation.not_active"),
        so("cross-tenant reservation", "worker.travel", "reservation.modify", shift("20:00"))
            .res(ResourceFact { tenant: "other-brand".into(), ..reservation(CUSTOMER, "confirmed") }).grant(dinner_grant()).deny("tenant.mismatch"),
        so("planner cannot modify", "planner", "reservation.modify", shift("20:00")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).deny("role.tool_not_listed"),
        so("schema error on modify", "worker.travel", "reservation.modify", json!({"reservation_id": "8472", "requested_time": "20:00", "reason": "Flight LH1234 lands 90 minutes late"}))
            .res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).deny("input.schema"),
        so("modify with no reservation fact cannot prove ownership", "worker.travel", "reservation.modify", shift("20:00")).grant(dinner_grant()).deny("resource.not_owner"),
        // --- StillOn: irreversible and the rest
        so("cancel always needs a person", "worker.travel", "reservation.cancel", cancel()).res(reservation(CUSTOMER, "confirmed")).approve("irreversible.always"),
        so("a cancel grant never lifts irreversible", "worker.travel", "reservation.cancel", cancel()).res(reservation(CUSTOMER, "confirmed"))
            .grant(StandingAuthorization { tool: "reservation.cancel".into(), conditions: vec![Cond::OwnsResource], ..dinner_grant() }).approve("irreversible.always"),
        so("non-owner cancel is denied", "worker.travel", "reservation.cancel", cancel()).res(reservation("cust-99", "confirmed")).deny("resource.not_owner"),
        so("calendar follows the owner's plan", "worker.travel", "calendar.update",
            json!({"event_id": "EVT-0a1b2c3d", "start": "2026-06-11T20:00:00+01:00", "end": "2026-06-11T22:00:00+01:00"}))
            .res(fact("calendar_event", "EVT-0a1b2c3d", "stillon", Some(CUSTOMER), json!({"starts_at": "2026-06-11T19:30:00+01:00"}))).allow(),
        so("someone else's calendar", "worker.travel", "calendar.update",
            json!({"event_id": "EVT-0a1b2c3d", "start": "2026-06-11T20:00:00+01:00", "end": "2026-06-11T22:00:00+01:00"}))
            .res(owned("calendar_event", "EVT-0a1b2c3d", "cust-99")).deny("resource.not_owner"),
        so("calendar revert by the owner", "worker.travel", "calendar.revert", json!({"event_id": "EVT-0a1b2c3d", "revision": 3}))
            .res(owned("calendar_event", "EVT-0a1b2c3d", CUSTOMER)).allow(),
        so("notifications are countersigned", "worker.travel", "notify.send", json!({"contact_id": "CONTACT-0042", "channel": "sms", "message": "Dinner moved to 20:00"}))
            .res(owned("contact", "CONTACT-0042", CUSTOMER)).approve("irreversible.always"),
        so("no e-mail from outside text", "worker.travel", "notify.send", json!({"contact_id": "CONTACT-0042", "channel": "email", "message": "Dinner moved to 20:00"}))
            .res(owned("contact", "CONTACT-0042", CUSTOMER)).origin(TaskOrigin::External).deny("notify.channel"),
        so("ride moves with the dinner, asked", "worker.travel", "ride.adjust", json!({"ride_id": "RIDE-0003", "pickup_time": "2026-06-11T19:35:00+01:00", "reason": "Dinner moved to 20:00 tonight"}))
            .res(owned("ride", "RIDE-0003", CUSTOMER)).approve("ride.change"),
        so("ride moves within a grant", "worker.travel", "ride.adjust", json!({"ride_id": "RIDE-0003", "pickup_time": "2026-06-11T19:35:00+01:00", "reason": "Dinner moved to 20:00 tonight"}))
            .res(owned("ride", "RIDE-0003", CUSTOMER))
            .grant(StandingAuthorization { id: "sa-ride".into(), tool: "ride.adjust".into(), conditions: vec![Cond::OwnsResource], ..dinner_grant() }).within("sa-ride"),
        so("planner cannot adjust rides", "planner", "ride.adjust", json!({"ride_id": "RIDE-0003", "pickup_time": "2026-06-11T19:35:00+01:00", "reason": "Dinner moved to 20:00 tonight"})).deny("role.tool_not_listed"),
        so("the customer in person is also gated on cancel", "worker.travel", "reservation.cancel", cancel())
            .res(reservation(CUSTOMER, "confirmed")).human().approve("irreversible.always"),
        so("planner submits a recovery plan", "planner", "plan.submit", json!({"task": "Recover the evening", "steps": [
            {"tool": "reservation.modify", "arguments": shift("20:00"), "reason": "The flight lands 90 minutes late"}]})).allow(),
        so("planner reads run status", "planner", "run.status", json!({"run_id": RUN})).allow(),
        so("planner cancels a run", "planner", "run.cancel", json!({"run_id": RUN, "reason": "The traveller rebooked by phone"})).allow(),
        so("reviewer lists steps", "reviewer", "step.list", json!({"run_id": RUN})).allow(),
        so("reviewer approves a step", "reviewer", "step.approve", json!({"step_id": STEP, "inputs_hash": HASH, "reason": "Within the traveller's constraints"})).allow(),
        so("reviewer rejects a step", "reviewer", "step.reject", json!({"step_id": STEP, "reason": "The new time clashes with the ride"})).allow(),
    ]
}

#[test]
fn policy_tables() {
    let rows = rows();
    assert!(rows.len() >= 60, "only {} rows", rows.len());
    let mut failures = Vec::new();
    for row in &rows {
        let request = row.request();
        // Rows that are not about schema errors must pass the real schema.
        let report = row.bundle().policy.decide(&request);
        let want = expected(&row.expect);
        if report.decision != want {
            failures.push(format!(
                "row `{}`: expected {want}, got {} (policies {:?}, errors {:?})\n  {row:?}",
                row.name, report.decision, report.policy_ids, report.errors
            ));
        }
        let about_schema = matches!(row.expect, Expect::Deny("input.schema"));
        if !about_schema && !request.schema_errors.is_empty() && request.tool.listed_for_role {
            failures.push(format!(
                "row `{}`: arguments fail the registry schema: {:?}\n  {row:?}",
                row.name, request.schema_errors
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

#[test]
fn every_registry_tool_appears_in_the_table() {
    let rows = rows();
    for example in [Example::Finance, Example::StillOn] {
        for tool in bundle(example).registry.tools() {
            assert!(
                rows.iter().any(|r| r.example == example
                    && r.tool == tool.name.as_str()
                    && !matches!(r.expect, Expect::Deny("role.tool_not_listed"))),
                "no row decides {} in {example:?}",
                tool.name
            );
        }
    }
}
