//! Layer-2 policy tables: (role, tool, arguments, resources) → expected decision and rule,
//! over the finance and StillOn examples. Milliseconds, no model, no network.
//!
//! The role → tool listing and each tool's effect and gate come from [`registry`], the one
//! place to swap for the real registry once it lands.

use chrono::{DateTime, Duration, Utc};
use countersign_core::policy::{
    ApprovalState, AuthorizationCondition as Cond, Decision, PolicyEngine, Principal,
    PrincipalKind, Request, ResourceFact, Rule, StandingAuthorization, TaskOrigin, ToolFacts,
};
use countersign_core::{Effect, Gate};
use serde_json::{Map, Value, json};

pub const FINANCE_POLICY: &str = include_str!("../../../examples/finance/policy.cedar");
pub const FINANCE_SCHEMA: &str = include_str!("../../../examples/finance/policy.cedarschema");
pub const STILLON_POLICY: &str = include_str!("../../../examples/stillon/policy.cedar");
pub const STILLON_SCHEMA: &str = include_str!("../../../examples/stillon/policy.cedarschema");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Example {
    Finance,
    StillOn,
}

/// The registry as the tables see it: tool → (effect, gate, roles it is listed for).
/// Mirrors `examples/*/registry.yaml`; replace with the loaded registry once it exists.
pub fn registry(example: Example) -> Vec<(&'static str, Effect, Gate, &'static [&'static str])> {
    use Effect::{Irreversible, Read, Write};
    use Gate::{Always, Never, Policy};
    const READERS: &[&str] = &["planner", "worker.finance", "reviewer"];
    match example {
        Example::Finance => vec![
            ("invoice.search", Read, Never, READERS),
            (
                "invoice.get",
                Read,
                Never,
                &["planner", "worker.finance", "worker.comms", "reviewer"],
            ),
            ("po.get", Read, Never, READERS),
            (
                "supplier.get",
                Read,
                Never,
                &[
                    "planner",
                    "worker.finance",
                    "worker.comms",
                    "reviewer",
                    "worker.vendor_master",
                ],
            ),
            ("payment.lookup", Read, Never, READERS),
            (
                "note.draft",
                Write,
                Never,
                &["worker.finance", "worker.comms"],
            ),
            (
                "note.discard",
                Write,
                Never,
                &["worker.finance", "worker.comms"],
            ),
            ("credit_note.issue", Write, Policy, &["worker.finance"]),
            (
                "payment.schedule",
                Irreversible,
                Always,
                &["worker.finance"],
            ),
            (
                "supplier.update_iban",
                Irreversible,
                Always,
                &["worker.vendor_master"],
            ),
            ("plan.submit", Write, Never, &["planner"]),
            ("run.status", Read, Never, &["planner"]),
            ("run.cancel", Write, Never, &["planner"]),
            ("step.list", Read, Never, &["reviewer"]),
            ("step.approve", Write, Never, &["reviewer"]),
            ("step.reject", Write, Never, &["reviewer"]),
        ],
        Example::StillOn => vec![
            ("restaurant.search", Read, Never, &["concierge", "viewer"]),
            (
                "restaurant.availability",
                Read,
                Never,
                &["concierge", "viewer"],
            ),
            ("reservation.modify", Write, Policy, &["concierge"]),
            ("reservation.cancel", Irreversible, Always, &["concierge"]),
            ("calendar.update", Write, Never, &["concierge"]),
            ("notify.send", Irreversible, Always, &["concierge"]),
            ("ride.adjust", Write, Never, &["concierge"]),
        ],
    }
}

pub fn engine(example: Example) -> PolicyEngine {
    match example {
        Example::Finance => PolicyEngine::load(FINANCE_POLICY, FINANCE_SCHEMA).unwrap(),
        Example::StillOn => PolicyEngine::load(STILLON_POLICY, STILLON_SCHEMA).unwrap(),
    }
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
    pub schema_errors: Vec<String>,
    pub grants: Vec<StandingAuthorization>,
    pub force_listed: bool,
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
        schema_errors: Vec::new(),
        grants: Vec::new(),
        force_listed: false,
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
    fn schema_error(mut self, e: &str) -> Self {
        self.schema_errors.push(e.to_owned());
        self
    }
    fn grant(mut self, g: StandingAuthorization) -> Self {
        self.grants.push(g);
        self
    }
    /// The registry lists the tool for this role even though no policy permits it (drift).
    fn force_listed(mut self) -> Self {
        self.force_listed = true;
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

    pub fn request(&self) -> Request {
        let (effect, gate, roles) = registry(self.example)
            .into_iter()
            .find(|(name, ..)| *name == self.tool)
            .map(|(_, e, g, roles)| (e, g, roles))
            .unwrap_or_else(|| {
                panic!(
                    "tool {} is not in the {:?} registry",
                    self.tool, self.example
                )
            });
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
            tool: ToolFacts {
                name: self.tool.to_owned(),
                effect,
                gate: self.gate.unwrap_or(gate),
                listed_for_role: self.force_listed || roles.contains(&self.role),
            },
            schema_errors: self.schema_errors.clone(),
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
        "INV-20260611",
        "acme",
        None,
        json!({"status": status, "amount": amount, "currency": "EUR", "supplier_id": "SUP-0042"}),
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
        "SUP-0042",
        "acme",
        None,
        json!({"name": "Acme GmbH", "blocked": blocked}),
    )
}

fn reservation(owner: &str, status: &str) -> ResourceFact {
    fact(
        "reservation",
        "RES-7781",
        "stillon",
        Some(owner),
        json!({"restaurant_id": "R-19", "starts_at": "2026-06-11T19:30:00Z", "party_size": 4, "status": status}),
    )
}

fn payment(amount: Value) -> Value {
    json!({
        "invoice_id": "INV-20260611",
        "amount": amount,
        "currency": "EUR",
        "value_date": "2026-06-15",
        "reason": "Invoice approved by AP, due in four days"
    })
}

fn credit(amount: Value) -> Value {
    json!({"invoice_id": "INV-20260611", "amount": amount, "currency": "EUR", "reason": "Damaged goods on delivery"})
}

fn shift(new_start: &str) -> Value {
    json!({"reservation_id": "RES-7781", "new_start": new_start})
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
            Cond::OnlyArguments(vec!["reservation_id".into(), "new_start".into()]),
        ],
        expires_at: now() + Duration::days(30),
    }
}

fn credit_grant() -> StandingAuthorization {
    StandingAuthorization {
        id: "sa-credit-2k".into(),
        principal: "user-123".into(),
        tool: "credit_note.issue".into(),
        conditions: vec![Cond::MaxAmountMinor(200_000)],
        expires_at: now() + Duration::days(1),
    }
}

// ------------------------------------------------------------------------- the table

pub fn rows() -> Vec<Row> {
    let inv = || invoice("approved", json!(30000.00));
    vec![
        // --- finance: reads per role
        fin("planner searches invoices", "planner", "invoice.search", json!({"query": "Acme"})).allow(),
        fin("null members are left out", "planner", "invoice.search", json!({"query": null, "limit": 20})).allow(),
        fin("planner reads an invoice", "planner", "invoice.get", json!({"invoice_id": "INV-20260611"})).res(inv()).allow(),
        fin("planner reads a PO", "planner", "po.get", json!({"po_id": "PO-1"}))
            .res(fact("purchase_order", "PO-1", "acme", None, json!({"status": "open"}))).allow(),
        fin("planner reads a supplier", "planner", "supplier.get", json!({"supplier_id": "SUP-0042"})).res(supplier(false)).allow(),
        fin("planner looks a payment up", "planner", "payment.lookup", json!({"invoice_id": "INV-20260611"})).allow(),
        fin("planner submits a plan", "planner", "plan.submit", json!({"task": "Pay INV-20260611", "steps": [{"tool": "invoice.get"}, {"tool": "payment.schedule"}]})).allow(),
        fin("planner reads run status", "planner", "run.status", json!({"run_id": "run-1"})).allow(),
        fin("planner cancels a run", "planner", "run.cancel", json!({"run_id": "run-1", "reason": "superseded"})).allow(),
        fin("reviewer lists steps", "reviewer", "step.list", json!({"status": "needs_approval"})).allow(),
        fin("reviewer approves a step", "reviewer", "step.approve", json!({"step_id": "s-1", "inputs_hash": "sha256:00"}))
            .res(fact("step", "s-1", "acme", None, json!({"status": "needs_approval"}))).allow(),
        fin("reviewer rejects a step", "reviewer", "step.reject", json!({"step_id": "s-1", "reason": "wrong supplier"})).allow(),
        fin("reviewer reads an invoice", "reviewer", "invoice.get", json!({"invoice_id": "INV-20260611"})).res(inv()).allow(),
        fin("worker.finance searches", "worker.finance", "invoice.search", json!({})).allow(),
        fin("worker.finance drafts a note", "worker.finance", "note.draft", json!({"invoice_id": "INV-20260611", "text": "Paid on the 15th"})).res(inv()).allow(),
        fin("worker.finance discards a note", "worker.finance", "note.discard", json!({"note_id": "N-1"})).allow(),
        fin("worker.comms drafts a note", "worker.comms", "note.draft", json!({"supplier_id": "SUP-0042", "text": "Reminder"})).res(supplier(false)).allow(),
        fin("worker.comms reads an invoice", "worker.comms", "invoice.get", json!({"invoice_id": "INV-20260611"})).res(inv()).allow(),
        fin("vendor master reads a supplier", "worker.vendor_master", "supplier.get", json!({"supplier_id": "SUP-0042"})).allow(),
        // --- finance: role listing floor (tools listed for another role)
        fin("planner cannot schedule payments", "planner", "payment.schedule", payment(json!(100))).res(inv()).deny("role.tool_not_listed"),
        fin("planner cannot draft notes", "planner", "note.draft", json!({"text": "x"})).deny("role.tool_not_listed"),
        fin("worker.finance cannot change IBANs", "worker.finance", "supplier.update_iban", json!({"supplier_id": "SUP-0042", "iban": "DE89370400440532013000", "reason": "letter"})).res(supplier(false)).deny("role.tool_not_listed"),
        fin("worker.comms cannot issue credit notes", "worker.comms", "credit_note.issue", credit(json!(10))).res(inv()).deny("role.tool_not_listed"),
        fin("worker.comms cannot schedule payments", "worker.comms", "payment.schedule", payment(json!(10))).res(inv()).deny("role.tool_not_listed"),
        fin("reviewer cannot cancel runs", "reviewer", "run.cancel", json!({"run_id": "run-1", "reason": "x"})).deny("role.tool_not_listed"),
        fin("vendor master cannot read invoices", "worker.vendor_master", "invoice.get", json!({"invoice_id": "INV-20260611"})).deny("role.tool_not_listed"),
        fin("planner cannot approve steps", "planner", "step.approve", json!({"step_id": "s-1", "inputs_hash": "sha256:00"})).deny("role.tool_not_listed"),
        // --- finance: no permit
        fin("listed but no policy permits it", "worker.comms", "payment.lookup", json!({"invoice_id": "INV-20260611"})).force_listed().deny("policy.no_permit"),
        fin("payment not pointing at an invoice", "worker.finance", "payment.schedule", payment(json!(100))).deny("policy.no_permit"),
        // --- finance: credit note threshold (write, gate: policy)
        fin("credit note below threshold", "worker.finance", "credit_note.issue", credit(json!(999.99))).res(inv()).allow(),
        fin("credit note exactly at threshold", "worker.finance", "credit_note.issue", credit(json!(1000.00))).res(inv()).allow(),
        fin("credit note at threshold, integer spelling", "worker.finance", "credit_note.issue", credit(json!(1000))).res(inv()).allow(),
        fin("credit note one cent over", "worker.finance", "credit_note.issue", credit(json!(1000.01))).res(inv()).approve("amount.threshold"),
        fin("credit note well over", "worker.finance", "credit_note.issue", credit(json!(12500.5))).res(inv()).approve("amount.threshold"),
        fin("credit note finer than a cent", "worker.finance", "credit_note.issue", credit(json!(1000.001))).res(inv()).deny("policy.error"),
        fin("credit note above the invoice", "worker.finance", "credit_note.issue", credit(json!(5000))).res(invoice("approved", json!(4180.00))).deny("amount.exceeds_invoice"),
        fin("credit note under a grant", "worker.finance", "credit_note.issue", credit(json!(1500))).res(inv()).grant(credit_grant()).within("sa-credit-2k"),
        fin("credit note above the grant's bound", "worker.finance", "credit_note.issue", credit(json!(2000.01))).res(inv()).grant(credit_grant()).approve("amount.threshold"),
        fin("credit note, grant expired", "worker.finance", "credit_note.issue", credit(json!(1500))).res(inv())
            .grant(StandingAuthorization { expires_at: now() - Duration::seconds(1), ..credit_grant() }).approve("amount.threshold"),
        fin("grant never lifts a forbid", "worker.finance", "credit_note.issue", credit(json!(1500))).res(invoice("approved", json!(1200))).grant(credit_grant()).deny("amount.exceeds_invoice"),
        fin("client-sent amount_minor is refused", "worker.finance", "credit_note.issue",
            json!({"invoice_id": "INV-20260611", "amount": 5, "amount_minor": 1, "currency": "EUR", "reason": "Damaged goods on delivery"})).res(inv()).deny("policy.error"),
        // --- finance: payment.schedule (irreversible, gate: always)
        fin("payment within limits still needs a person", "worker.finance", "payment.schedule", payment(json!(4180.00))).res(invoice("approved", json!(4180.00))).approve("irreversible.always"),
        fin("payment exactly at the ceiling", "worker.finance", "payment.schedule", payment(json!(25000.00))).res(inv()).approve("irreversible.always"),
        fin("payment one cent over the ceiling", "worker.finance", "payment.schedule", payment(json!(25000.01))).res(inv()).deny("amount.ceiling"),
        fin("payment over the schema maximum", "worker.finance", "payment.schedule", payment(json!(50000.01))).res(inv())
            .schema_error("/amount: 50000.01 is greater than the maximum of 50000").deny("input.schema"),
        fin("payment of an unapproved invoice", "worker.finance", "payment.schedule", payment(json!(100))).res(invoice("pending", json!(30000))).deny("invoice.not_approved"),
        fin("payment of an invoice without status", "worker.finance", "payment.schedule", payment(json!(100)))
            .res(fact("invoice", "INV-20260611", "acme", None, json!({"amount": 100, "currency": "EUR"}))).deny("invoice.not_approved"),
        fin("payment above the invoice amount", "worker.finance", "payment.schedule", payment(json!(4180.01))).res(invoice("approved", json!(4180.00))).deny("amount.exceeds_invoice"),
        fin("payment in another currency than the invoice", "worker.finance", "payment.schedule", payment(json!(100)))
            .res(fact("invoice", "INV-20260611", "acme", None, json!({"status": "approved", "amount": 30000, "currency": "USD"}))).deny("currency.mismatch"),
        fin("payment of another tenant's invoice", "worker.finance", "payment.schedule", payment(json!(100))).res(invoice_in("globex")).deny("tenant.mismatch"),
        fin("payment steered by an inbound e-mail", "worker.finance", "payment.schedule", payment(json!(100))).res(inv()).origin(TaskOrigin::External).deny("origin.external"),
        fin("payment from a schedule", "worker.finance", "payment.schedule", payment(json!(100))).res(inv()).origin(TaskOrigin::Schedule).approve("irreversible.always"),
        fin("a grant never lifts irreversible.always", "worker.finance", "payment.schedule", payment(json!(100))).res(inv())
            .grant(StandingAuthorization { id: "sa-pay".into(), principal: "user-123".into(), tool: "payment.schedule".into(), conditions: vec![], expires_at: now() + Duration::days(1) })
            .approve("irreversible.always"),
        fin("an approval in context does not lift the gate", "worker.finance", "payment.schedule", payment(json!(100))).res(inv()).approval(ApprovalState::Approved).approve("irreversible.always"),
        fin("a person in the role is gated the same", "worker.finance", "payment.schedule", payment(json!(100))).res(inv()).human().approve("irreversible.always"),
        fin("payment without an amount errors closed", "worker.finance", "payment.schedule",
            json!({"invoice_id": "INV-20260611", "currency": "EUR", "value_date": "2026-06-15", "reason": "Invoice approved by AP, due in four days"})).res(inv()).deny("policy.error"),
        fin("payment amount as a string errors closed", "worker.finance", "payment.schedule", payment(json!("100.00"))).res(inv()).deny("policy.error"),
        // --- finance: vendor master
        fin("IBAN change needs a person", "worker.vendor_master", "supplier.update_iban", json!({"supplier_id": "SUP-0042", "iban": "DE89370400440532013000", "reason": "letter from supplier"})).res(supplier(false)).approve("irreversible.always"),
        fin("IBAN change of a blocked supplier", "worker.vendor_master", "supplier.update_iban", json!({"supplier_id": "SUP-0042", "iban": "DE89370400440532013000", "reason": "letter"})).res(supplier(true)).deny("supplier.blocked"),
        fin("IBAN change steered by an inbound e-mail", "worker.vendor_master", "supplier.update_iban", json!({"supplier_id": "SUP-0042", "iban": "DE89370400440532013000", "reason": "letter"})).res(supplier(false)).origin(TaskOrigin::External).deny("origin.external"),
        // --- finance: other floors
        fin("cross-tenant invoice read", "reviewer", "invoice.get", json!({"invoice_id": "INV-20260611"})).res(invoice_in("globex")).deny("tenant.mismatch"),
        fin("one cross-tenant resource among several", "worker.finance", "note.draft", json!({"invoice_id": "INV-20260611", "supplier_id": "SUP-0042", "text": "x"}))
            .res(inv()).res(fact("supplier", "SUP-0042", "globex", None, json!({}))).deny("tenant.mismatch"),
        fin("schema errors deny before policy", "planner", "invoice.get", json!({"invoice_id": 7})).schema_error("/invoice_id: 7 is not of type string").deny("input.schema"),
        fin("not listed wins over schema errors", "planner", "payment.schedule", json!({})).schema_error("/amount: required").deny("role.tool_not_listed"),
        fin("gate: always on a write", "worker.finance", "note.draft", json!({"text": "x"})).gate(Gate::Always).approve("gate.always"),
        fin("gate: always keeps a deny", "worker.finance", "payment.schedule", payment(json!(26000))).res(inv()).deny("amount.ceiling"),
        fin("unknown resource kind type errors closed", "planner", "invoice.get", json!({"invoice_id": "INV-20260611"}))
            .res(fact("Invoice", "INV-20260611", "acme", None, json!({})))
            .deny("policy.error"),
        // --- StillOn: reads
        so("concierge searches restaurants", "concierge", "restaurant.search", json!({"city": "Lisbon", "party_size": 4})).allow(),
        so("viewer checks availability", "viewer", "restaurant.availability", json!({"restaurant_id": "R-19", "date": "2026-06-11", "party_size": 4})).allow(),
        so("fractional non-money numbers error closed", "concierge", "restaurant.search", json!({"city": "Lisbon", "party_size": 4, "min_rating": 4.5})).deny("policy.error"),
        so("integral doubles are integers", "concierge", "restaurant.search", json!({"city": "Lisbon", "party_size": 4.0})).allow(),
        // --- StillOn: reservation.modify and the standing authorization
        so("30-minute shift within the grant", "concierge", "reservation.modify", shift("2026-06-11T20:00:00Z")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).within("sa-dinner-30"),
        so("30 minutes earlier within the grant", "concierge", "reservation.modify", shift("2026-06-11T19:00:00Z")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).within("sa-dinner-30"),
        so("offset spelling of the same instant", "concierge", "reservation.modify", shift("2026-06-11T22:00:00+02:00")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).within("sa-dinner-30"),
        so("31-minute shift needs a person", "concierge", "reservation.modify", shift("2026-06-11T20:01:00Z")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).approve("reservation.change"),
        so("30 minutes and 1 second needs a person", "concierge", "reservation.modify", shift("2026-06-11T20:00:01Z")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).approve("reservation.change"),
        so("no grant: a person decides", "concierge", "reservation.modify", shift("2026-06-11T20:00:00Z")).res(reservation(CUSTOMER, "confirmed")).approve("reservation.change"),
        so("expired grant has no effect", "concierge", "reservation.modify", shift("2026-06-11T20:00:00Z")).res(reservation(CUSTOMER, "confirmed"))
            .grant(StandingAuthorization { expires_at: now() - Duration::hours(1), ..dinner_grant() }).approve("reservation.change"),
        so("grant expiring this instant has no effect", "concierge", "reservation.modify", shift("2026-06-11T20:00:00Z")).res(reservation(CUSTOMER, "confirmed"))
            .grant(StandingAuthorization { expires_at: now(), ..dinner_grant() }).approve("reservation.change"),
        so("non-owner is denied, grant or not", "concierge", "reservation.modify", shift("2026-06-11T20:00:00Z")).res(reservation("cust-99", "confirmed")).grant(dinner_grant()).deny("resource.not_owner"),
        so("reservation without an owner is denied", "concierge", "reservation.modify", shift("2026-06-11T20:00:00Z"))
            .res(fact("reservation", "RES-7781", "stillon", None, json!({"starts_at": "2026-06-11T19:30:00Z", "status": "confirmed"}))).deny("resource.not_owner"),
        so("another party's grant has no effect", "concierge", "reservation.modify", shift("2026-06-11T20:00:00Z")).res(reservation(CUSTOMER, "confirmed"))
            .grant(StandingAuthorization { principal: "cust-99".into(), ..dinner_grant() }).approve("reservation.change"),
        so("a grant for another tool has no effect", "concierge", "reservation.modify", shift("2026-06-11T20:00:00Z")).res(reservation(CUSTOMER, "confirmed"))
            .grant(StandingAuthorization { tool: "reservation.cancel".into(), ..dinner_grant() }).approve("reservation.change"),
        so("extra changes ride outside the grant", "concierge", "reservation.modify", json!({"reservation_id": "RES-7781", "new_start": "2026-06-11T20:00:00Z", "party_size": 6}))
            .res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).approve("reservation.change"),
        so("unreadable new_start fails the grant closed", "concierge", "reservation.modify", shift("8pm")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).approve("reservation.change"),
        so("reservation without a start fails the grant closed", "concierge", "reservation.modify", shift("2026-06-11T20:00:00Z"))
            .res(fact("reservation", "RES-7781", "stillon", Some(CUSTOMER), json!({"status": "confirmed"}))).grant(dinner_grant()).approve("reservation.change"),
        so("cancelled reservation is not moved", "concierge", "reservation.modify", shift("2026-06-11T20:00:00Z")).res(reservation(CUSTOMER, "cancelled")).grant(dinner_grant()).deny("reservation.not_active"),
        so("cross-tenant reservation", "concierge", "reservation.modify", shift("2026-06-11T20:00:00Z"))
            .res(ResourceFact { tenant: "other-brand".into(), ..reservation(CUSTOMER, "confirmed") }).grant(dinner_grant()).deny("tenant.mismatch"),
        so("viewer cannot modify", "viewer", "reservation.modify", shift("2026-06-11T20:00:00Z")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant()).deny("role.tool_not_listed"),
        so("schema error on modify", "concierge", "reservation.modify", shift("tonight")).res(reservation(CUSTOMER, "confirmed")).grant(dinner_grant())
            .schema_error("/new_start: \"tonight\" is not a \"date-time\"").deny("input.schema"),
        so("modify with no reservation fact cannot prove ownership", "concierge", "reservation.modify", shift("2026-06-11T20:00:00Z")).grant(dinner_grant()).deny("resource.not_owner"),
        // --- StillOn: irreversible and the rest
        so("cancel always needs a person", "concierge", "reservation.cancel", json!({"reservation_id": "RES-7781", "reason": "restaurant cannot do 20:00"})).res(reservation(CUSTOMER, "confirmed")).approve("irreversible.always"),
        so("a cancel grant never lifts irreversible", "concierge", "reservation.cancel", json!({"reservation_id": "RES-7781", "reason": "x"})).res(reservation(CUSTOMER, "confirmed"))
            .grant(StandingAuthorization { tool: "reservation.cancel".into(), conditions: vec![Cond::OwnsResource], ..dinner_grant() }).approve("irreversible.always"),
        so("non-owner cancel is denied", "concierge", "reservation.cancel", json!({"reservation_id": "RES-7781", "reason": "x"})).res(reservation("cust-99", "confirmed")).deny("resource.not_owner"),
        so("calendar follows the owner's plan", "concierge", "calendar.update", json!({"event_id": "EV-1", "new_start": "2026-06-11T20:00:00Z"}))
            .res(fact("calendar_event", "EV-1", "stillon", Some(CUSTOMER), json!({"starts_at": "2026-06-11T19:30:00Z"}))).allow(),
        so("someone else's calendar", "concierge", "calendar.update", json!({"event_id": "EV-1", "new_start": "2026-06-11T20:00:00Z"}))
            .res(fact("calendar_event", "EV-1", "stillon", Some("cust-99"), json!({}))).deny("resource.not_owner"),
        so("notifications are countersigned", "concierge", "notify.send", json!({"recipient": "guest-1", "channel": "sms", "message": "Dinner moved to 20:00"})).approve("irreversible.always"),
        so("ride moves with the dinner", "concierge", "ride.adjust", json!({"ride_id": "RIDE-3", "new_pickup": "2026-06-11T19:35:00Z"}))
            .res(fact("ride", "RIDE-3", "stillon", Some(CUSTOMER), json!({"pickup_at": "2026-06-11T19:05:00Z"}))).allow(),
        so("viewer cannot adjust rides", "viewer", "ride.adjust", json!({"ride_id": "RIDE-3", "new_pickup": "2026-06-11T19:35:00Z"})).deny("role.tool_not_listed"),
        so("the customer in person is also gated on cancel", "concierge", "reservation.cancel", json!({"reservation_id": "RES-7781", "reason": "x"}))
            .res(reservation(CUSTOMER, "confirmed")).human().approve("irreversible.always"),
    ]
}

#[test]
fn policy_tables() {
    let finance = engine(Example::Finance);
    let stillon = engine(Example::StillOn);
    let rows = rows();
    assert!(rows.len() >= 60, "only {} rows", rows.len());
    let mut failures = Vec::new();
    for row in &rows {
        let engine = match row.example {
            Example::Finance => &finance,
            Example::StillOn => &stillon,
        };
        let report = engine.decide(&row.request());
        let want = expected(&row.expect);
        if report.decision != want {
            failures.push(format!(
                "row `{}`: expected {want}, got {} (policies {:?}, errors {:?})\n  {row:?}",
                row.name, report.decision, report.policy_ids, report.errors
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
fn every_listed_tool_appears_in_the_table() {
    let rows = rows();
    for example in [Example::Finance, Example::StillOn] {
        for (tool, ..) in registry(example) {
            assert!(
                rows.iter().any(|r| r.example == example && r.tool == tool),
                "no row for {tool}"
            );
        }
    }
}
