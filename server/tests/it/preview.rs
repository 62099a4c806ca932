//! Impact preview over recorded calls (issue 33), on both backends: calls made through /mcp are
//! replayed through edited copies of the finance bundle, and each edit's transitions are
//! counted exactly; a tenant's preview reads its own calls only; a time-bounded rule is decided
//! at each call's recorded instant; `registry preview --json` prints the report.

use std::collections::BTreeMap;

use countersign::preview::{Window, preview, preview_changes};
use countersign_core::Clock;
use countersign_core::bundle::BundleSources;
use countersign_core::policy::TaskOrigin;
use countersign_core::store::{Change, ChangeOp, ListingChange, NewAgent};
use serde_json::{Value, json};

use crate::helpers::{TestApp, countersign_on, example};
use crate::mcp::{Client, each_finance_app};

/// The invoice the holds name: 12,400.00 EUR, so a 20,000 hold exceeds it.
const INVOICE: &str = "INV-20260615";

fn finance(change: impl Fn(&mut BundleSources)) -> BundleSources {
    let mut sources = BundleSources::read(std::path::Path::new(&example("finance"))).unwrap();
    change(&mut sources);
    sources
}

fn edit_policy(from: &str, to: &str) -> BundleSources {
    finance(|s| {
        let changed = s.policies.replacen(from, to, 1);
        assert_ne!(changed, s.policies, "{from:?} is in the policies");
        s.policies = changed;
    })
}

fn edit_registry(from: &str, to: &str) -> BundleSources {
    finance(|s| {
        let changed = s.registry_yaml.replacen(from, to, 1);
        assert_ne!(changed, s.registry_yaml, "{from:?} is in the registry");
        s.registry_yaml = changed;
    })
}

async fn worker(app: &TestApp, name: &str, tenant: &str) -> String {
    let (_, token) = app
        .store
        .create_agent(&NewAgent {
            name: name.into(),
            role: "worker.finance".into(),
            tenant: tenant.into(),
            created_by: "person:https://idp.example#admin".into(),
            expires_at: None,
            acts_for: None,
            origin: TaskOrigin::User,
        })
        .await
        .unwrap();
    token.reveal().to_string()
}

fn decision(reply: &Value) -> String {
    let c = &reply["result"]["structuredContent"];
    c["decision"]
        .as_str()
        .or(c["status"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// acme: holds of 500 (allowed), 2,000, 2,500, 4,000 (gated), 20,000 (refused: it exceeds the
/// invoice) and one read (`invoice.get`, its records folded into one); the first hold two
/// hours before the rest. globex: one 500 hold of its own invoice.
async fn history(app: &TestApp) {
    let acme = worker(app, "preview-acme", "acme").await;
    let mut client = Client::new(app, &acme);
    client.connect().await;
    let hold = |amount: f64| {
        json!({"invoice_id": INVOICE, "amount": amount, "currency": "EUR",
               "reason": format!("Disputed quantity on line 2, {amount} EUR")})
    };
    client.call("invoice.hold", hold(500.0)).await;
    app.clock.advance(chrono::Duration::hours(2));
    for amount in [2000.0, 2500.0, 4000.0, 20000.0] {
        let reply = client.call("invoice.hold", hold(amount)).await;
        assert!(!decision(&reply).is_empty(), "{reply}");
    }
    client
        .call("invoice.get", json!({"invoice_id": INVOICE}))
        .await;
    let globex = worker(app, "preview-globex", "globex").await;
    let mut other = Client::new(app, &globex);
    other.connect().await;
    other
        .call(
            "invoice.hold",
            json!({"invoice_id": "INV-20269001", "amount": 500.0, "currency": "EUR",
                   "reason": "Disputed quantity on line 1 of the PO"}),
        )
        .await;
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_counts_each_edits_transitions_exactly() {
    each_finance_app(|app| async move {
        history(&app).await;
        let store = &app.store;
        let acme = Some("acme");

        let same = preview(store, acme, finance(|_| {}), Window::Days(30)).await.unwrap();
        assert_eq!((same.report.replayed, same.report.changed), (6, 0), "{same:?}");
        assert_eq!(same.report.approximate, 0, "every call has its inputs recorded");

        // A raised threshold: the 2,000 and 2,500 holds would have run unattended.
        let raised = edit_policy(
            "context.args.amount_minor > 100000",
            "context.args.amount_minor > 300000",
        );
        let p = preview(store, acme, raised, Window::Days(30)).await.unwrap();
        assert_eq!(
            p.report.transitions,
            counts(&[("require_approval->allow", 2)])
        );
        assert_eq!(
            p.report.by_rule["amount.threshold"],
            counts(&[("require_approval->allow", 2)])
        );
        let example = &p.report.examples["require_approval->allow"][0];
        let (chain, seq) = example.record.clone().unwrap();
        let record = store.audit_record(&chain, seq).await.unwrap().unwrap();
        assert_eq!(record.step_id.as_deref(), Some(example.step_id.as_str()));

        // A tool removed from the role: every hold, whatever it was, is now unlisted.
        let removed = edit_registry(
            "roles: [worker.finance]\n    approval:\n      approver_roles: [approver]\n      expires: 72h\n      reversal_cost: 5\n    handler: {provider: erp, operation: invoices.hold}",
            "roles: [planner]\n    approval:\n      approver_roles: [approver]\n      expires: 72h\n      reversal_cost: 5\n    handler: {provider: erp, operation: invoices.hold}",
        );
        let p = preview(store, acme, removed, Window::Days(30)).await.unwrap();
        assert_eq!(
            p.report.transitions,
            counts(&[
                ("allow->unlisted", 1),
                ("require_approval->unlisted", 3),
                ("deny->unlisted", 1)
            ])
        );
        // The read, folded into one record, is replayed too.
        let p = preview_changes(
            store,
            acme,
            None,
            &[Change::Listing(ListingChange {
                tool: "invoice.get".into(),
                role: "worker.finance".into(),
                op: ChangeOp::Remove,
            })],
            Window::Days(30),
        )
        .await
        .unwrap();
        assert_eq!(p.report.transitions, counts(&[("allow->unlisted", 1)]));
        assert_eq!(p.report.by_tool["invoice.get"], counts(&[("allow->unlisted", 1)]));

        // A new forbid above 3,000.00: the gated 4,000 hold is refused; the 20,000 one was.
        let forbid = edit_policy(
            "// ---------------------------------------------------------------- payments",
            "@id(\"finance.hold.cap\")\n@rule(\"hold.cap\")\nforbid (principal, action == Action::\"invoice.hold\", resource)\nwhen { context.args.amount_minor > 300000 };\n\n// ---------------------------------------------------------------- payments",
        );
        let p = preview(store, acme, forbid, Window::Days(30)).await.unwrap();
        assert_eq!(p.report.transitions, counts(&[("require_approval->deny", 1)]));
        assert_eq!(
            p.report.by_rule["hold.cap"],
            counts(&[("require_approval->deny", 1)])
        );

        // A tightened schema: the holds above 1,000 no longer fit.
        let tightened = edit_registry(
            "amount: {type: number, exclusiveMinimum: 0, maximum: 50000}\n        currency: {type: string, enum: [EUR]}\n        reason: {type: string, minLength: 20, maxLength: 400}",
            "amount: {type: number, exclusiveMinimum: 0, maximum: 1000}\n        currency: {type: string, enum: [EUR]}\n        reason: {type: string, minLength: 20, maxLength: 400}",
        );
        let p = preview(store, acme, tightened, Window::Days(30)).await.unwrap();
        assert_eq!(
            p.report.transitions,
            counts(&[("require_approval->invalid", 3), ("deny->invalid", 1)])
        );
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_reads_only_the_tenants_calls_and_decides_at_the_recorded_instant() {
    each_finance_app(|app| async move {
        history(&app).await;
        let store = &app.store;
        let base = || finance(|_| {});
        let replayed = |p: countersign::preview::Preview| p.report.replayed;
        assert_eq!(replayed(preview(store, Some("acme"), base(), Window::Days(30)).await.unwrap()), 6);
        assert_eq!(replayed(preview(store, Some("globex"), base(), Window::Days(30)).await.unwrap()), 1);
        assert_eq!(replayed(preview(store, Some("initech"), base(), Window::Days(30)).await.unwrap()), 0);
        assert_eq!(replayed(preview(store, None, base(), Window::Days(30)).await.unwrap()), 7);

        // A rule in force only until an instant between the first hold and the rest: only
        // the first is refused — by the instant it was decided at, not by now.
        let first = app.clock.now().timestamp() - 3600 * 2;
        let until = first + 3600;
        let bounded = edit_policy(
            "// ---------------------------------------------------------------- payments",
            &format!(
                "@id(\"finance.hold.freeze\")\n@rule(\"hold.freeze\")\nforbid (principal, action == Action::\"invoice.hold\", resource)\nwhen {{ context.call.now < {until} }};\n\n// ---------------------------------------------------------------- payments"
            ),
        );
        let p = preview(store, Some("acme"), bounded, Window::Days(30)).await.unwrap();
        assert_eq!(p.report.transitions, counts(&[("allow->deny", 1)]), "{p:?}");

        // Outside the window nothing is replayed; a window out of bounds is refused.
        app.clock.advance(chrono::Duration::days(31));
        assert_eq!(replayed(preview(store, Some("acme"), base(), Window::Days(30)).await.unwrap()), 0);
        assert!(preview(store, None, base(), Window::Days(0)).await.is_err());
        assert!(preview(store, None, base(), Window::Days(367)).await.is_err());
        app
    })
    .await;
}

/// `registry preview PATH --json` on the server's database prints at least `replayed`,
/// `changed` and `transitions`; an invalid bundle is refused with its problems.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_preview_json_prints_the_report() {
    each_finance_app(|app| async move {
        history(&app).await;
        let dir = std::env::temp_dir().join(format!("cs-preview-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let raised = edit_policy(
            "context.args.amount_minor > 100000",
            "context.args.amount_minor > 300000",
        );
        std::fs::write(dir.join("registry.yaml"), &raised.registry_yaml).unwrap();
        std::fs::write(dir.join("policy.cedar"), &raised.policies).unwrap();
        std::fs::write(dir.join("policy.cedarschema"), &raised.policy_schema).unwrap();
        // The CLI reads the wall clock; the test server's is in June 2026: name the start.
        let out = countersign_on(&app.db_url())
            .args(["registry", "preview"])
            .arg(&dir)
            .args(["--from", "2026-06-01", "--tenant", "acme", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["replayed"], 6, "{report}");
        assert_eq!(report["changed"], 2, "{report}");
        assert_eq!(report["transitions"], json!({"require_approval->allow": 2}));
        assert_eq!(report["tenant"], "acme");

        std::fs::write(dir.join("policy.cedar"), "this is not cedar").unwrap();
        let out = countersign_on(&app.db_url())
            .args(["registry", "preview"])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
        app
    })
    .await;
}
