//! The run list and timeline (`/runs`, `/runs/{id}`), audit search (`/audit`) with its JSONL
//! export, and gate metrics (`/gates`): refusals first, then what each page shows, on both
//! backends.

use countersign_core::audit::{AuditEvent, AuditRecord, ChainVerifier, NewAuditRecord};
use countersign_core::store::{NewRun, NewStep, Transition};
use countersign_core::{CanonicalJson, Effect, StepStatus};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, LOCATION};
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::mcp::{Client, INV, REASON, agent, each_finance_app, payment_for};

async fn get(client: &reqwest::Client, app: &TestApp, path: &str) -> (StatusCode, String) {
    let resp = client.get(app.url(path)).send().await.unwrap();
    let status = resp.status();
    (status, resp.text().await.unwrap())
}

async fn ok_page(client: &reqwest::Client, app: &TestApp, path: &str) -> String {
    let (status, html) = get(client, app, path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {html}");
    html
}

/// A gated payment of `amount` EUR; returns the step id.
async fn gated(client: &mut Client<'_>, amount: Value) -> String {
    let reply = client
        .call("payment.schedule", payment_for(INV, amount))
        .await;
    let content = &reply["result"]["structuredContent"];
    assert_eq!(content["status"], "needs_approval", "{reply}");
    content["step_id"].as_str().unwrap().to_string()
}

/// Decides `step` in the inbox form as demo person `user` (signed in on `who`); an approval is
/// signed with their passkey (payment.schedule requires it).
async fn decide(app: &TestApp, who: &reqwest::Client, user: &str, step: &str, verdict: &str) {
    let signature = if verdict == "approved" {
        crate::helpers::http_signature(app, who, user, step).await
    } else {
        serde_json::Value::Null
    };
    let form = crate::helpers::with_signature(
        &[("verdict", verdict), ("reason", "three-way match checked")],
        &signature,
    );
    let resp = who
        .post(app.url(&format!("/inbox/{step}/decision")))
        .header("origin", format!("http://{}", app.addr))
        .form(&form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let to = resp.headers()[LOCATION].to_str().unwrap().to_string();
    assert!(to.starts_with("/inbox?done="), "{verdict}: {to}");
}

fn rows(html: &str, testid: &str) -> usize {
    html.matches(&format!("data-testid=\"{testid}\"")).count()
}

/// The `data-seq` values of the audit rows, in page order.
fn seqs(html: &str) -> Vec<i64> {
    html.split("data-testid=\"audit-row\" data-seq=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().parse().unwrap())
        .collect()
}

/// The `href` of the link marked `data-testid="{testid}"`.
fn link(html: &str, testid: &str) -> Option<String> {
    let at = html.find(&format!("data-testid=\"{testid}\""))?;
    let tag = &html[html[..at].rfind("<a ")?..at];
    let value = tag.split("href=\"").nth(1)?;
    Some(value.split('"').next()?.replace("&amp;", "&"))
}

fn no_data(html: &str, secrets: &[&str], what: &str) {
    assert!(html.contains("data-testid=\"refused\""), "{what}: {html}");
    for s in secrets {
        assert!(!html.contains(s), "{what} leaks {s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_refuse_signed_out_people_and_wrong_roles_and_show_no_data() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let step = gated(&mut client, json!(4180.00)).await;
        let run = app.store.get_step(&step).await.unwrap().run_id;
        let secrets = [run.as_str(), step.as_str(), INV, "4,180.00"];

        // Signed out: every page and the export send the browser to sign-in, with no data.
        let anon = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        for path in [
            "/runs".to_string(),
            format!("/runs/{run}"),
            "/audit".to_string(),
            format!("/audit?run={run}"),
            "/gates".to_string(),
            "/audit/export.jsonl".to_string(),
        ] {
            let resp = anon.get(app.url(&path)).send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{path}");
            let to = resp.headers()[LOCATION].to_str().unwrap().to_string();
            assert!(to.starts_with("/auth/login?next="), "{path}: {to}");
            let body = resp.text().await.unwrap();
            for s in secrets {
                assert!(!body.contains(s), "{path} leaks {s} when signed out");
            }
        }

        // An approver may follow runs but not read the audit trail or the metrics.
        let ana = app.demo_client("ana").await;
        for path in [
            "/audit".to_string(),
            format!("/audit?run={run}"),
            "/gates".into(),
        ] {
            let (status, html) = get(&ana, &app, &path).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
            no_data(&html, &secrets, &path);
        }
        let (status, body) = get(&ana, &app, &format!("/audit/export.jsonl?run={run}")).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(!body.contains(&run) && !body.contains("\"seq\""), "{body}");

        // An auditor reads the audit trail but not the metrics.
        let aud = app.demo_client("aud").await;
        let (status, html) = get(&aud, &app, "/gates").await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        no_data(
            &html,
            &["payment.schedule", "break-even-row"],
            "/gates as auditor",
        );
        assert!(ok_page(&aud, &app, "/audit").await.contains(&run));

        // Another tenant's run is invisible: not listed, not found, not searchable.
        let other = app
            .store
            .create_run(&NewRun {
                tenant: "globex".into(),
                principal: "globex-user".into(),
                agent_id: None,
                task: "Globex secret task".into(),
                origin: "user".into(),
                planned: false,
            })
            .await
            .unwrap();
        app.store
            .append_audit(&NewAuditRecord {
                event: Some(AuditEvent::Proposed),
                run_id: Some(other.id.clone()),
                tool: Some("globex.tool".into()),
                actor: Some("agent:globex".into()),
                ..NewAuditRecord::default()
            })
            .await
            .unwrap();
        let list = ok_page(&ana, &app, "/runs").await;
        assert!(list.contains(&run), "{list}");
        assert!(
            !list.contains(&other.id) && !list.contains("Globex"),
            "{list}"
        );
        let (_, html) = get(&ana, &app, &format!("/runs/{}", other.id)).await;
        assert!(html.contains("data-testid=\"not-found\""), "{html}");
        assert!(!html.contains("Globex"), "{html}");
        let html = ok_page(&aud, &app, "/audit?tool=globex.tool").await;
        assert_eq!(rows(&html, "audit-row"), 0, "{html}");
        let (_, jsonl) = get(&aud, &app, "/audit/export.jsonl?tool=globex.tool").await;
        assert!(jsonl.is_empty(), "{jsonl}");

        // Records of no run: global ones and this tenant's are shown, another tenant's not
        // (its standing grants, batch approvals, its agents' refused calls).
        let runless = |detail: serde_json::Value, actor: &str, tool: &str| NewAuditRecord {
            event: Some(AuditEvent::Operational),
            run_id: None,
            tool: Some(tool.into()),
            actor: Some(actor.into()),
            detail: detail.as_object().unwrap().clone(),
            ..NewAuditRecord::default()
        };
        for record in [
            runless(
                serde_json::json!({"kind": "standing_authorization", "tenant": "globex",
                                   "party": "Globex secret party"}),
                "person:https://idp.example#gus",
                "standing.tool",
            ),
            runless(
                serde_json::json!({"kind": "batch", "batch": {"tenant": "globex",
                                   "reason": "Globex secret batch"}}),
                "person:https://idp.example#gus",
                "batch.tool",
            ),
            runless(
                serde_json::json!({"requested_tool": "Globex secret tool"}),
                "agent:g1 role:worker.finance tenant:globex",
                "refused.tool",
            ),
            runless(
                serde_json::json!({"kind": "standing_authorization", "tenant": "acme",
                                   "party": "Acme own party"}),
                "person:https://idp.example#ada",
                "standing.tool",
            ),
            runless(
                serde_json::json!({"kind": "registry_import", "version": 7}),
                "config:COUNTERSIGN_REGISTRY",
                "global.tool",
            ),
        ] {
            app.store.append_audit(&record).await.unwrap();
        }
        let html = ok_page(&aud, &app, "/audit?event=operational").await;
        assert!(html.contains("Acme own party"), "{html}");
        assert!(html.contains("registry_import"), "{html}");
        assert!(!html.contains("Globex secret"), "{html}");
        let (_, jsonl) = get(&aud, &app, "/audit/export.jsonl").await;
        assert!(!jsonl.contains("Globex secret"), "{jsonl}");
        assert!(!jsonl.contains("tenant:globex"), "{jsonl}");
        assert!(jsonl.contains("Acme own party"), "{jsonl}");
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_list_and_timeline_show_steps_statuses_unknown_reconciliation_and_links() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let step = gated(&mut client, json!(4180.00)).await;
        let ana = app.demo_client("ana").await;
        decide(&app, &ana, "ana", &step, "approved").await;
        let reply = client
            .call("payment.schedule", payment_for(INV, json!(4180.00)))
            .await;
        assert_eq!(
            reply["result"]["structuredContent"]["status"], "scheduled",
            "{reply}"
        );
        let run = app.store.get_step(&step).await.unwrap().run_id;

        // A second step of the run whose call was sent and never answered, then reconciled.
        let inputs = CanonicalJson::from_value(
            &json!({"invoice_id": "INV-20260612", "amount": 99.5, "currency": "EUR"}),
        )
        .unwrap();
        let (odd, _) = app
            .store
            .open_step(&NewStep {
                run_id: run.clone(),
                role: "worker.finance".into(),
                tool: "payment.schedule".into(),
                effect: Effect::Irreversible,
                inputs,
                agent_id: None,
                reason: REASON.into(),
                evidence: vec![],
                observed: None,
                trace_id: "t".into(),
                status: StepStatus::Running,
            })
            .await
            .unwrap();
        for (to, event, detail) in [
            (
                StepStatus::Unknown,
                AuditEvent::Unknown,
                json!({"status": "unknown"}),
            ),
            (
                StepStatus::Done,
                AuditEvent::Reconciled,
                json!({"found": true, "reference": "PAYRUN-2026-06-15/0001"}),
            ),
        ] {
            let from = app.store.get_step(&odd.id).await.unwrap().status;
            app.store
                .transition(&Transition {
                    step_id: odd.id.clone(),
                    from: vec![from],
                    to: Some(to),
                    records: vec![(
                        event,
                        NewAuditRecord {
                            event: Some(event),
                            run_id: Some(run.clone()),
                            step_id: Some(odd.id.clone()),
                            tool: Some("payment.schedule".into()),
                            actor: Some("reconciler".into()),
                            detail: detail.as_object().unwrap().clone(),
                            ..NewAuditRecord::default()
                        },
                    )],
                    ..Transition::default()
                })
                .await
                .unwrap()
                .unwrap();
        }

        // The list (a manager may read runs): newest first, status, principal, tenant, counts.
        let max = app.demo_client("max").await;
        let list = ok_page(&max, &app, "/runs").await;
        assert_eq!(rows(&list, "run-row"), 1, "{list}");
        assert!(list.contains(&format!("href=\"/runs/{run}\"")), "{list}");
        assert!(list.contains("2 step(s): 2 done"), "{list}");
        assert!(list.contains(">acme<"), "{list}");
        assert!(list.contains("data-status=\"active\""), "{list}");

        let html = ok_page(&max, &app, &format!("/runs/{run}")).await;
        assert_eq!(rows(&html, "step-row"), 2, "{html}");
        assert!(
            html.contains("4,180.00 EUR"),
            "amount with currency: {html}"
        );
        assert!(html.contains("99.50 EUR"), "{html}");
        // Unknown and its reconciliation are visible, in words as well as colour.
        assert!(
            html.contains("unknown: sent, no answer; reconciling by key"),
            "{html}"
        );
        assert!(html.contains("reconciled with the target"), "{html}");
        assert!(html.contains("the target has the effect"), "{html}");
        // Every audit record of the run, in chain order, each with an anchor.
        let records = app.store.audit_for_run(&run).await.unwrap();
        assert_eq!(rows(&html, "event"), records.len(), "{html}");
        let mut last = 0;
        for r in &records {
            let at = html
                .find(&format!("id=\"rec-{}\"", r.seq))
                .unwrap_or_else(|| panic!("no anchor for record {}", r.seq));
            assert!(at > last, "record {} out of order", r.seq);
            last = at;
        }
        // The payment's step links proposal → decision → approval → outcome, to those anchors.
        let ours: Vec<&AuditRecord> = records
            .iter()
            .filter(|r| r.step_id.as_deref() == Some(step.as_str()))
            .collect();
        let first = |e: &str| ours.iter().find(|r| r.event == e).unwrap().seq;
        let links = html
            .split(&format!("data-step-id=\"{step}\""))
            .nth(1)
            .and_then(|r| r.split("data-testid=\"step-links\"").nth(1))
            .and_then(|r| r.split("</td>").next())
            .unwrap();
        for (event, label) in [
            ("proposed", "proposal"),
            ("decided", "decision"),
            ("approved", "approved"),
            ("succeeded", "succeeded"),
        ] {
            let seq = match event {
                // A direct call's proposal is its first record (the first decision).
                "proposed" => ours[0].seq,
                "decided" => ours.iter().rev().find(|r| r.event == event).unwrap().seq,
                _ => first(event),
            };
            let tag = links
                .split(&format!("<a href=\"#rec-{seq}\""))
                .nth(1)
                .unwrap_or_else(|| panic!("{event}: no link to #rec-{seq}: {links}"));
            assert!(
                tag.split("</a>")
                    .next()
                    .unwrap()
                    .ends_with(&format!(">{label} #{seq}")),
                "{event}: {links}"
            );
        }
        // Events link back to their step.
        assert!(html.contains(&format!("href=\"#step-{step}\"")), "{html}");

        // The step rows show inputs and references through the tool's redaction in force.
        let row = |html: &str, id: &str| {
            html.split(&format!("data-step-id=\"{id}\""))
                .nth(1)
                .and_then(|r| r.split("</tr>").next())
                .unwrap()
                .to_string()
        };
        assert!(row(&html, &odd.id).contains("INV-20260612"));
        crate::helpers::use_finance_registry_with(
            &app,
            "    handler: {provider: erp, operation: payments.schedule}\n",
            "    handler: {provider: erp, operation: payments.schedule}\n    redact: [amount, {field: invoice_id, how: drop}, ref]\n",
        )
        .await;
        let html = ok_page(&max, &app, &format!("/runs/{run}")).await;
        let reference = reply["result"]["structuredContent"]["ref"].as_str().unwrap();
        for (id, secrets) in [
            (&odd.id, ["99.50", "INV-20260612", "PAYRUN-2026-06-15/0001"]),
            (&step, ["4,180.00", INV, reference]),
        ] {
            let row = row(&html, id);
            for secret in secrets {
                assert!(!row.contains(secret), "{secret} in {row}");
            }
        }
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_search_filters_pages_by_seq_verifies_the_chain_and_exports_jsonl() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let step = gated(&mut client, json!(4180.00)).await;
        let ana = app.demo_client("ana").await;
        decide(&app, &ana, "ana", &step, "approved").await;
        let run = app.store.get_step(&step).await.unwrap().run_id;
        // 120 more records of the run, to page through.
        for i in 0..120 {
            app.store
                .append_audit(&NewAuditRecord {
                    event: Some(AuditEvent::Proposed),
                    run_id: Some(run.clone()),
                    tool: Some("bulk.tool".into()),
                    actor: Some(format!("agent:bulk-{}", i % 2)),
                    rule: Some("bulk.rule".into()),
                    ..NewAuditRecord::default()
                })
                .await
                .unwrap();
        }
        let aud = app.demo_client("aud").await;

        let html = ok_page(&aud, &app, "/audit").await;
        assert_eq!(rows(&html, "audit-row"), 50, "a page is 50 records");
        assert!(html.contains("data-chain=\"ok\""), "{html}");
        for label in ["Run", "Tool", "Actor (exact, or an agent name)", "Approver", "Status / event", "Policy rule", "From (UTC)", "To (UTC, exclusive)"] {
            assert!(html.contains(&format!(">{label}</label>")), "label {label}");
        }
        assert!(html.contains("<details"), "records expand without JS");

        // Filters.
        let one = ok_page(&aud, &app, "/audit?event=approved").await;
        assert_eq!(seqs(&one).len(), 1, "{one}");
        assert!(one.contains("data-event=\"approved\""));
        assert!(one.contains("1 of 1 approval(s)"), "{one}");
        let decided = app.store.audit_for_run(&run).await.unwrap();
        let of_step = decided
            .iter()
            .filter(|r| r.step_id.as_deref() == Some(step.as_str()))
            .count();
        let by_ana = ok_page(&aud, &app, "/audit?approver=ana").await;
        assert_eq!(seqs(&by_ana).len(), of_step, "{by_ana}");
        let by_full = ok_page(&aud, &app, "/audit?approver=urn%3Acountersign%3Ademo%23ana").await;
        assert_eq!(seqs(&by_full), seqs(&by_ana));
        assert!(seqs(&ok_page(&aud, &app, "/audit?approver=pat").await).is_empty());
        let actor = ok_page(&aud, &app, "/audit?actor=agent%3Abulk-1&rule=bulk.rule").await;
        assert_eq!(rows(&actor, "audit-row"), 50);
        let pay = ok_page(&aud, &app, "/audit?tool=payment.schedule&event=decided").await;
        assert_eq!(seqs(&pay).len(), 1, "{pay}");
        assert!(pay.contains("4,180.00 EUR"), "amount with currency: {pay}");
        assert!(seqs(&ok_page(&aud, &app, "/audit?from=2026-06-12").await).is_empty());
        assert!(seqs(&ok_page(&aud, &app, "/audit?to=2026-06-11").await).is_empty());
        assert_eq!(
            seqs(&ok_page(&aud, &app, "/audit?from=2026-06-11T00:00&to=2026-06-12T00:00&tool=bulk.tool").await).len(),
            50
        );
        let bad = ok_page(&aud, &app, "/audit?from=soon").await;
        assert!(bad.contains("data-testid=\"invalid\""), "{bad}");
        assert!(seqs(&bad).is_empty());

        // Keyset pages over the 120 bulk records: 50 + 50 + 20, newest first, no overlap.
        let mut all = Vec::new();
        let mut path = "/audit?tool=bulk.tool".to_string();
        let mut pages = Vec::new();
        loop {
            let html = ok_page(&aud, &app, &path).await;
            let page = seqs(&html);
            assert!(page.windows(2).all(|w| w[0] > w[1]), "{page:?}");
            all.extend(page.iter().copied());
            pages.push((path.clone(), page));
            match link(&html, "older") {
                Some(next) => {
                    assert!(next.contains("before="), "{next}");
                    assert!(next.contains("tool=bulk.tool"), "the filter is kept: {next}");
                    path = next;
                }
                None => break,
            }
        }
        assert_eq!(
            pages.iter().map(|(_, p)| p.len()).collect::<Vec<_>>(),
            vec![50, 50, 20]
        );
        let mut sorted = all.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), 120);
        // "Newer" from the second page leads back to exactly the first.
        let second = ok_page(&aud, &app, &pages[1].0).await;
        let newer = link(&second, "newer").unwrap();
        assert!(newer.contains("after="), "{newer}");
        assert_eq!(seqs(&ok_page(&aud, &app, &newer).await), pages[0].1);

        // The export: same filter, chain order, the CLI's JSONL lines, a valid sparse chain.
        let first_page = ok_page(&aud, &app, "/audit?tool=bulk.tool").await;
        let export_href = link(&first_page, "export").unwrap();
        assert!(export_href.starts_with("/audit/export.jsonl?tool=bulk.tool"), "{export_href}");
        let resp = aud.get(app.url(&export_href)).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            resp.headers()[CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("application/jsonl")
        );
        let text = resp.text().await.unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 120);
        let stored: Vec<AuditRecord> = app
            .store
            .audit_in_order(0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.tool.as_deref() == Some("bulk.tool"))
            .collect();
        let mut v = ChainVerifier::new(stored[0].seq, &stored[0].prev).sparse();
        for (line, want) in lines.iter().zip(&stored) {
            assert_eq!(*line, serde_json::to_string(want).unwrap());
            let parsed: AuditRecord = serde_json::from_str(line).unwrap();
            v.push(&parsed).unwrap();
        }
        assert_eq!(v.finish().unwrap(), 120);

        // A record rewritten in the database: the page names the first broken record.
        let ddl: &[&str] = match app.store.backend() {
            countersign_core::Backend::Sqlite => &["DROP TRIGGER audit_no_update"],
            countersign_core::Backend::Postgres => {
                &["ALTER TABLE audit DISABLE TRIGGER audit_no_update"]
            }
        };
        for sql in ddl {
            app.store.execute_sql(sql).await.unwrap();
        }
        let victim = stored[10].seq;
        app.store
            .execute_sql(&format!(
                "UPDATE audit SET record = REPLACE(record, 'bulk.rule', 'bulk.rulf') WHERE seq = {victim}"
            ))
            .await
            .unwrap();
        let html = ok_page(&aud, &app, "/audit").await;
        assert!(html.contains("data-chain=\"broken\""), "{html}");
        assert!(html.contains(&format!("BROKEN at record {victim}")), "{html}");
        // The whole chain, asked for: the same record.
        let html = ok_page(&aud, &app, "/audit?verify=full").await;
        assert!(html.contains(&format!("BROKEN at record {victim}")), "{html}");
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_metrics_show_rejection_rates_latency_expired_gates_and_break_even() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let a = gated(&mut client, json!(4180.00)).await;
        let b = gated(&mut client, json!(4179.99)).await;
        let c = gated(&mut client, json!(4179.98)).await;
        let d = gated(&mut client, json!(4179.97)).await;
        let ana = app.demo_client("ana").await;
        // Decided after 1, 2 and 4 minutes.
        for (step, minutes, verdict) in [
            (&a, 1, "approved"),
            (&b, 1, "approved"),
            (&c, 2, "rejected"),
        ] {
            app.clock.advance(chrono::Duration::minutes(minutes));
            decide(&app, &ana, "ana", step, verdict).await;
        }
        // The fourth gate is left until it expires (72 h), then the agent asks again.
        app.clock.advance(chrono::Duration::hours(73));
        let again = client
            .call("payment.schedule", payment_for(INV, json!(4179.97)))
            .await;
        assert_eq!(
            again["result"]["structuredContent"]["status"], "expired",
            "{again}"
        );
        assert_eq!(
            app.store.get_step(&d).await.unwrap().status,
            StepStatus::Expired
        );

        let max = app.demo_client("max").await;
        let html = ok_page(&max, &app, "/gates").await;
        let row = html
            .split("data-testid=\"break-even-row\" data-tool=\"payment.schedule\"")
            .nth(1)
            .and_then(|r| r.split("</tr>").next())
            .unwrap_or_else(|| panic!("{html}"));
        assert!(row.contains(">4<"), "4 gates opened: {row}");
        assert!(row.contains("33.3 %"), "r = 1/3: {row}");
        assert!(row.contains("3.0 approvals"), "k = 1/r = 3: {row}");
        assert!(
            html.contains("data-testid=\"expired\" class=\"text-lg\">1<"),
            "{html}"
        );
        // Latencies 1, 2 and 4 minutes: nearest-rank p50 2 min, p90 and p99 4 min.
        assert!(
            html.contains("p50 2 min · p90 4 min · p99 4 min (over 3 decision(s))"),
            "{html}"
        );
        // Charts are server-rendered SVG, per tool and per rule, with the day's numbers.
        assert!(html.contains("data-label=\"payment.schedule\""), "{html}");
        assert!(html.contains("<svg"), "{html}");
        assert!(
            html.contains("2026-06-11: 1 of 3 rejected (33.3 %)"),
            "{html}"
        );
        assert!(
            rows(&html, "rate-chart") >= 2,
            "a tool chart and a rule chart"
        );
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_refuses_framing_sniffing_and_caching() {
    each_finance_app(|app| async move {
        let ana = app.demo_client("ana").await;
        let anonymous = &app.client;
        for (who, path) in [
            (&ana, "/inbox"),
            (&ana, "/runs"),
            (&ana, "/api/gates"),
            (anonymous, "/healthz"),
            (anonymous, "/inbox"),
            (anonymous, "/auth/login"),
        ] {
            let resp = who.get(app.url(path)).send().await.unwrap();
            let h = resp.headers();
            let value = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
            assert_eq!(value("x-frame-options"), "DENY", "{path}");
            assert!(
                value("content-security-policy").contains("frame-ancestors 'none'"),
                "{path}"
            );
            assert_eq!(value("x-content-type-options"), "nosniff", "{path}");
            assert_eq!(value("referrer-policy"), "same-origin", "{path}");
            assert_eq!(value("cache-control"), "no-store", "{path}");
        }
        // Documents that are not dashboard pages run no scripts at all.
        for path in ["/healthz", "/auth/login"] {
            let resp = anonymous.get(app.url(path)).send().await.unwrap();
            let policy = resp.headers()["content-security-policy"].to_str().unwrap();
            assert!(policy.contains("script-src 'none'"), "{path}: {policy}");
        }
        // A dashboard page runs only the scripts carrying its response's own nonce.
        let mut nonces = Vec::new();
        for _ in 0..2 {
            let resp = ana.get(app.url("/inbox")).send().await.unwrap();
            let policy = resp.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .to_string();
            let html = resp.text().await.unwrap();
            let nonce = policy
                .split("'nonce-")
                .nth(1)
                .and_then(|rest| rest.split('\'').next())
                .unwrap_or_else(|| panic!("no nonce in {policy}"))
                .to_string();
            assert!(nonce.len() >= 16, "{nonce}");
            assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
            assert!(!policy.contains("unsafe-inline"), "{policy}");
            let scripts: Vec<&str> = html.split("<script").skip(1).collect();
            assert!(!scripts.is_empty(), "the page hydrates: {html}");
            for script in scripts {
                let tag = script.split('>').next().unwrap_or_default();
                assert!(
                    tag.contains(&format!("nonce=\"{nonce}\"")),
                    "a script without the nonce: <script{tag}>"
                );
            }
            nonces.push(nonce);
        }
        assert_ne!(nonces[0], nonces[1], "each response has its own nonce");
        // A page path that merely ends like a static file still needs a session.
        for path in ["/runs/x.css", "/inbox/x.js", "/audit/a.png"] {
            let resp = anonymous.get(app.url(path)).send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{path}");
            let to = resp.headers().get(LOCATION).unwrap().to_str().unwrap();
            assert!(to.starts_with("/auth/login"), "{path}: {to}");
        }
        // The favicon at the root does not.
        let icon = anonymous.get(app.url("/favicon.svg")).send().await.unwrap();
        assert_ne!(icon.status(), StatusCode::SEE_OTHER);
        // The compiled assets may be cached.
        let asset = anonymous
            .get(app.url("/pkg/countersign.css"))
            .send()
            .await
            .unwrap();
        assert_ne!(
            asset
                .headers()
                .get("cache-control")
                .and_then(|v| v.to_str().ok()),
            Some("no-store")
        );
        app
    })
    .await;
}
