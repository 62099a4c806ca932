//! Every scenario file under `examples/*/scenarios/` played by scripted agents over real MCP
//! HTTP and the approval API against a real server, on both backends; the expectations are
//! on the audit trail and the demo targets' effects (see `countersign::scenario`).

use countersign::scenario::{self, Target};
use countersign_core::Backend;

use crate::helpers::{example, spawn_app_with};

/// Every `examples/<bundle>/scenarios/*.yaml`, as (bundle, path), sorted.
pub(crate) fn scenario_files() -> Vec<(String, std::path::PathBuf)> {
    let root = std::path::PathBuf::from(format!("{}/../examples", env!("CARGO_MANIFEST_DIR")));
    let mut out = Vec::new();
    for bundle in std::fs::read_dir(&root).unwrap() {
        let bundle = bundle.unwrap().path();
        let dir = bundle.join("scenarios");
        let Ok(files) = std::fs::read_dir(&dir) else {
            continue;
        };
        for f in files {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                let name = bundle.file_name().unwrap().to_string_lossy().to_string();
                out.push((name, f));
            }
        }
    }
    out.sort();
    out
}

/// Plays one file on a fresh server of `backend`; the failures, each naming file and check.
async fn play(bundle: &str, path: &std::path::Path, backend: Backend) -> Vec<String> {
    let file = path.file_name().unwrap().to_string_lossy().to_string();
    let parsed = match scenario::load(path) {
        Ok(s) => s,
        Err(e) => return vec![format!("{file}: {e}")],
    };
    let registry = example(bundle);
    let Some(app) = spawn_app_with(backend, &[("COUNTERSIGN_REGISTRY", registry.as_str())]).await
    else {
        return vec![];
    };
    let clock = app.clock.clone();
    let advance = move |by: chrono::Duration| clock.advance(by);
    let target = Target {
        url: format!("http://{}", app.addr),
        origin: None,
        store: app.store.clone(),
        advance: Some(&advance),
    };
    let began = std::time::Instant::now();
    let result = scenario::run(&parsed, &target).await;
    if std::env::var("SCENARIO_DUMP").is_ok() {
        for r in app.store.audit_in_order(0, 100_000).await.unwrap() {
            eprintln!("{}", r.record);
        }
    }
    let failures = match result {
        Err(e) => vec![format!("{file} [{backend:?}]: {e}")],
        Ok(report) => {
            assert!(!report.checks.is_empty(), "{file}: no expectation checked");
            eprintln!(
                "scenario {file} [{backend:?}]: {} checks, {} ms",
                report.checks.len(),
                began.elapsed().as_millis()
            );
            if std::env::var("SCENARIO_DUMP").is_ok() {
                eprintln!("vars: {:?}", report.vars);
            }
            report
                .failures()
                .into_iter()
                .map(|c| format!("{file} [{backend:?}]: {} — {}", c.name, c.detail))
                .collect()
        }
    };
    app.stop().await;
    failures
}

#[tokio::test]
async fn scenarios_every_file_passes_on_both_backends() {
    let files = scenario_files();
    // SCENARIO=part-of-a-file-name plays only the matching files (while writing one).
    let only = std::env::var("SCENARIO").ok();
    assert!(
        only.is_some() || files.len() >= 10,
        "the seed scenarios are present: {files:?}"
    );
    let mut failures = Vec::new();
    for (bundle, path) in &files {
        if only
            .as_deref()
            .is_some_and(|o| !path.to_string_lossy().contains(o))
        {
            continue;
        }
        for backend in [Backend::Sqlite, Backend::Postgres] {
            failures.extend(play(bundle, path, backend).await);
        }
    }
    assert!(
        failures.is_empty(),
        "{} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The runner itself fails closed: a scenario whose expectation is false reports it (the
/// suite above would otherwise pass on a runner that checks nothing).
#[tokio::test]
async fn scenarios_a_false_expectation_is_reported_not_passed() {
    let text = r#"
name: false expectations
actors:
  fin: {role: worker.finance}
steps:
  - as: fin
    call: note.draft
    arguments: {invoice_id: INV-20260611, text: "A note."}
    reply: {is_error: false}
    save: {note: /note_id}
expect:
  effects:
    - {operation: notes.draft, count: 2}
    - {operation: payments.schedule, count: 0}
  audit:
    - name: a payment that never happened
      where: {event: succeeded, tool: payment.schedule}
    - name: the note succeeded once
      where: {event: succeeded, tool: note.draft}
      count: 1
      record: {present: [/detail/idem_key, /detail/latency_ms]}
  never_in_audit: ["A note."]
"#;
    let parsed = scenario::parse(text).unwrap();
    let registry = example("finance");
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(app) =
            spawn_app_with(backend, &[("COUNTERSIGN_REGISTRY", registry.as_str())]).await
        else {
            continue;
        };
        let target = Target {
            url: format!("http://{}", app.addr),
            origin: None,
            store: app.store.clone(),
            advance: None,
        };
        let report = scenario::run(&parsed, &target).await.unwrap();
        let failed: Vec<&str> = report.failures().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            failed,
            [
                "effects: erp notes.draft x2",
                "audit: a payment that never happened",
                "never in the audit trail: A note.",
            ],
            "{:?}",
            report.checks
        );
        // A step whose reply check fails stops the scenario, naming the step.
        let bad = scenario::parse(&text.replace("is_error: false", "is_error: true")).unwrap();
        let err = scenario::run(&bad, &target).await.unwrap_err().to_string();
        assert!(
            err.starts_with("step 1 (note.draft): isError wanted true"),
            "{err}"
        );
        // An advance on a server whose clock cannot move is refused.
        let adv =
            scenario::parse("name: a\nactors: {}\nsteps: [{advance: 1h}]\nexpect: {}\n").unwrap();
        let err = scenario::run(&adv, &target).await.unwrap_err().to_string();
        assert!(err.contains("cannot be advanced"), "{err}");
        app.stop().await;
    }
}

/// `demo = true`: on an empty database the server plays the finance demo at start — one paid
/// run, one payment waiting in the inbox, one refused injection attempt, then the gate
/// history (30 gated holds, one rejected) and the advisor's drafted proposal with a non-empty
/// impact preview — and never again once the database has runs.
#[tokio::test]
async fn scenarios_the_demo_seeds_an_empty_database_once() {
    use countersign::adapters::builtin::ERP;
    use countersign_core::StepStatus;
    let registry = example("finance");
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let env = [
            ("COUNTERSIGN_REGISTRY", registry.as_str()),
            ("COUNTERSIGN_DEMO", "true"),
        ];
        let Some(app) = spawn_app_with(backend, &env).await else {
            continue;
        };
        let began = std::time::Instant::now();
        // The demo's last act: Max drafts the advisor's proposal.
        let proposal = loop {
            if let Some(p) = app.store.list_proposals(10).await.unwrap().pop() {
                break p;
            }
            if began.elapsed() > std::time::Duration::from_secs(90) {
                let runs = app.store.list_runs("acme", 100).await.unwrap();
                let tail: Vec<_> = app
                    .store
                    .audit_in_order(0, 100_000)
                    .await
                    .unwrap()
                    .into_iter()
                    .rev()
                    .take(8)
                    .map(|r| (r.event, r.tool, r.rule))
                    .collect();
                panic!(
                    "{backend:?}: the demo never got to the advisor's draft; runs {:?}; last records {tail:?}",
                    runs.iter()
                        .map(|r| (&r.task, r.status.as_str()))
                        .collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        };
        assert!(
            proposal.note.starts_with("gate advisor"),
            "{}",
            proposal.note
        );
        let preview = countersign::preview::preview_changes(
            &app.store,
            Some("acme"),
            Some(proposal.base_version),
            &proposal.changes,
            countersign::preview::Window::Days(30),
        )
        .await
        .unwrap();
        assert_eq!(
            preview.report.transitions.get("require_approval->allow"),
            // The decided holds, the batch left waiting, and the hold whose gate expires soon.
            Some(&(countersign::demo::HOLDS + countersign::demo::WAITING_HOLDS.len() + 1)),
            "{preview:?}"
        );
        let mut refused: Vec<(String, Option<String>)> = app
            .store
            .steps_in_status(StepStatus::Refused, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|s| (s.tool, s.rule))
            .collect();
        refused.sort();
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert_eq!(refused[0].0, "invoice.hold", "Pat's rejected hold");
        assert_eq!(
            refused[1],
            (
                "supplier.update_iban".into(),
                Some("review.rejected".into())
            )
        );
        assert_eq!(
            app.store
                .demo_effects(ERP, "invoices.hold")
                .await
                .unwrap()
                .len(),
            countersign::demo::HOLDS - 1
        );
        let paid = app
            .store
            .demo_effects(ERP, "payments.schedule")
            .await
            .unwrap();
        assert_eq!(
            paid.len(),
            2,
            "one paid run, one deposit whose answer was lost"
        );
        assert!(
            paid.iter().any(|p| p.request.contains("INV-20260611")),
            "{paid:?}"
        );
        let waiting = app
            .store
            .steps_in_status(StepStatus::NeedsApproval, 10)
            .await
            .unwrap();
        // The inbox: the seed's payment, three holds for a batch, a payment for two people, a
        // hold of INV-20260612 whose gate expires within a day, and an IBAN change for four eyes.
        let mut inbox: Vec<(&str, bool)> = waiting
            .iter()
            .map(|s| (s.tool.as_str(), s.inputs.contains("INV-20260612")))
            .collect();
        inbox.sort_unstable();
        assert_eq!(
            inbox,
            [
                ("invoice.hold", false),
                ("invoice.hold", false),
                ("invoice.hold", false),
                ("invoice.hold", true),
                ("payment.schedule", false),
                ("payment.schedule", true),
                ("supplier.update_iban", false)
            ],
            "{waiting:?}"
        );
        assert!(
            app.store
                .demo_effects(ERP, "suppliers.update_iban")
                .await
                .unwrap()
                .is_empty()
        );
        let approvals: Vec<_> = app
            .store
            .audit_in_order(0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.event == "approved" && r.tool.as_deref() == Some("payment.schedule"))
            .collect();
        assert_eq!(approvals.len(), 2, "the paid run's payment and the deposit");
        assert!(approvals[0].actor.as_deref().unwrap().contains("ana"));
        // A month of history: the holds were decided one a day.
        let days: std::collections::BTreeSet<i64> = app
            .store
            .audit_in_order(0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.event == "approved" && r.tool.as_deref() == Some("invoice.hold"))
            .map(|r| r.at / 86_400_000)
            .collect();
        assert!(
            days.len() >= 25,
            "holds decided on {} days only",
            days.len()
        );
        // Runs in every status a demo can show (a stop would revoke the demo's agents).
        let statuses: std::collections::BTreeSet<&str> = app
            .store
            .list_runs("acme", 500)
            .await
            .unwrap()
            .iter()
            .map(|r| r.status.as_str())
            .collect();
        for want in ["active", "done", "failed", "cancelled"] {
            assert!(statuses.contains(want), "no {want} run: {statuses:?}");
        }
        // Two escalations: the failed run's note whose undo failed, and the deposit nobody can
        // reconcile (the reconciler escalates it once it is old enough; it is days old).
        let began = std::time::Instant::now();
        let kinds: std::collections::BTreeSet<String> = loop {
            let open = app.store.open_escalations("acme", 10).await.unwrap();
            let kinds = open.iter().map(|e| e.kind.clone()).collect();
            if open.len() >= 2 || began.elapsed() > std::time::Duration::from_secs(30) {
                break kinds;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        };
        assert_eq!(
            kinds,
            ["undo".to_string(), "unknown".to_string()].into(),
            "escalations"
        );
        assert!(app.store.verify_audit().await.unwrap().is_ok());
        // Names, not ids: no table cell or list line of any page shows a raw UUID (ids stay in
        // titles and links).
        let run = app.store.list_runs("acme", 500).await.unwrap();
        let paid_run = run
            .iter()
            .find(|r| r.task.contains("INV-20260611"))
            .unwrap();
        let pages: [(&str, Vec<String>); 5] = [
            ("ana", vec!["/inbox".into(), "/escalations".into()]),
            (
                "aud",
                vec![
                    "/runs".into(),
                    "/audit".into(),
                    format!("/runs/{}", paid_run.id),
                ],
            ),
            ("max", vec!["/gates".into()]),
            ("ada", vec!["/admin".into(), "/escalations".into()]),
            ("pat", vec!["/escalations".into()]),
        ];
        for (who, paths) in pages {
            let client = app.demo_client(who).await;
            for path in paths {
                let resp = client.get(app.url(&path)).send().await.unwrap();
                assert_eq!(resp.status(), reqwest::StatusCode::OK, "{who} {path}");
                let html = resp.text().await.unwrap();
                for cell in cells(&html) {
                    assert!(!has_uuid(&cell), "{who} {path}: a raw id in {cell:?}");
                }
            }
        }
        // Played once: with runs in the database, seeding again does nothing.
        let again =
            countersign::demo::seed(&app.store, &format!("http://{}", app.addr), None, None)
                .await
                .unwrap();
        assert!(again.is_none());
        assert_eq!(
            app.store
                .demo_effects(ERP, "payments.schedule")
                .await
                .unwrap()
                .len(),
            2
        );
        app.stop().await;
    }
}

/// Off by default: a server without `demo` starts with no runs.
#[tokio::test]
async fn scenarios_no_demo_unless_asked_for() {
    let registry = example("finance");
    let Some(app) = spawn_app_with(
        Backend::Sqlite,
        &[("COUNTERSIGN_REGISTRY", registry.as_str())],
    )
    .await
    else {
        return;
    };
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(app.store.list_runs("acme", 10).await.unwrap().is_empty());
    app.stop().await;
}

/// `countersign scenario run FILE... --url`: plays files against a running server on the
/// configured database; exit 0 when every check holds, 1 naming the failure otherwise.
#[tokio::test]
async fn scenarios_the_cli_plays_files_against_a_running_server() {
    let registry = example("finance");
    let Some(app) = spawn_app_with(
        Backend::Sqlite,
        &[("COUNTERSIGN_REGISTRY", registry.as_str())],
    )
    .await
    else {
        return;
    };
    let dir = format!("{registry}/scenarios");
    let url = format!("http://{}", app.addr);
    // The server runs on this test's runtime: the CLI process is waited for off it.
    let play = |file: &str| {
        let mut cmd = crate::helpers::countersign_on(&app.db_url());
        cmd.args(["scenario", "run", &format!("{dir}/{file}"), "--url", &url]);
        tokio::task::spawn_blocking(move || cmd.output().unwrap())
    };
    let out = play("000-refuse-tool-not-listed.yaml").await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ok   ") && stdout.contains("the audit chain verifies"),
        "{stdout}"
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
    // A scenario that needs the test clock cannot run against a real server: exit 1, named.
    let out = play("002-expired-approval.yaml").await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        stdout.contains("FAIL") && stdout.contains("cannot be advanced"),
        "{stdout}"
    );
    app.stop().await;
}

/// The vocabulary StillOn's scenarios use fails closed too: false `runs` and `objects`
/// expectations are reported, a person deciding "in the app" needs the tool's approver role
/// (409, nothing decided), an agent acting for nobody cannot read the traveller's itinerary,
/// and a `set` on a field that does not exist or a person with `acts_for` stops the scenario.
#[tokio::test]
async fn scenarios_the_stillon_vocabulary_reports_false_expectations() {
    let text = r#"
name: false stillon expectations
actors:
  maestro: {role: planner, acts_for: user-123}
  stranger: {role: planner}
  clerk: {person: pat, approver_role: approver}
steps:
  - as: stranger
    call: itinerary.disruptions
    arguments: {}
    reply: {is_error: true, equal: {/code: not_owner}}
  - as: maestro
    call: plan.submit
    arguments:
      task: Cancel the dinner
      steps:
        - tool: reservation.cancel
          arguments: {reservation_id: 8472, reason: "No table for the whole party at a reachable time"}
          reason: No admissible option keeps the party together
    save: {run: /run_id, cancel: /steps/0/step_id}
  - wait: {step: "${cancel}", status: needs_approval}
  - note: an approver who is not the traveller cannot decide it
    as: clerk
    decide: {step: "${cancel}", verdict: approved, reason: "Not mine to approve"}
    reply: {http: 409}
expect:
  runs: [{run: "${run}", status: done}]
  objects:
    - {system: stillon, kind: reservation, id: "8472", is: {equal: {/status: cancelled}}}
  steps: [{step: "${cancel}", status: needs_approval}]
  effects: [{system: stillon, operation: dining.reservation.cancel, count: 0}]
"#;
    let parsed = scenario::parse(text).unwrap();
    let registry = example("stillon");
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(app) =
            spawn_app_with(backend, &[("COUNTERSIGN_REGISTRY", registry.as_str())]).await
        else {
            continue;
        };
        let target = Target {
            url: format!("http://{}", app.addr),
            origin: None,
            store: app.store.clone(),
            advance: None,
        };
        let report = scenario::run(&parsed, &target).await.unwrap();
        let failed: Vec<&str> = report.failures().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            failed,
            ["run ${run} is done", "stillon reservation 8472"],
            "{:?}",
            report.checks
        );
        let bad_set = scenario::parse(
            "name: a\nactors: {}\nsteps: [{set: {system: stillon, kind: flight, id: FLIGHT-TP1351, fields: {/no/such: 1}}}]\nexpect: {}\n",
        )
        .unwrap();
        let err = scenario::run(&bad_set, &target)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("nothing at /no/such"), "{err}");
        let bad_actor = scenario::parse(
            "name: a\nactors: {t: {person: user-123, acts_for: user-123}}\nsteps: []\nexpect: {}\n",
        )
        .unwrap();
        let err = scenario::run(&bad_actor, &target)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("acts_for and created_by are for agents"),
            "{err}"
        );
        let bad_actor = scenario::parse(
            "name: a\nactors: {t: {person: ana, created_by: \"person:x#ana\"}}\nsteps: []\nexpect: {}\n",
        )
        .unwrap();
        let err = scenario::run(&bad_actor, &target)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("created_by are for agents"), "{err}");
        app.stop().await;
    }
}

/// The text of every table cell, list item, definition, paragraph and heading of `html` (tags
/// and their attributes dropped: an id in a title or a link is one click away, not shown).
fn cells(html: &str) -> Vec<String> {
    // What a `<details>` holds (an audit record's exact JSON) is one click away, not shown.
    let mut shown = String::with_capacity(html.len());
    let mut rest = html;
    while let Some(at) = rest.find("<details") {
        shown.push_str(&rest[..at]);
        rest = rest[at..]
            .find("</details>")
            .map_or("", |end| &rest[at + end + "</details>".len()..]);
    }
    shown.push_str(rest);
    let html = shown.as_str();
    let mut out = Vec::new();
    for (open, close) in [
        ("<td", "</td>"),
        ("<li", "</li>"),
        ("<th", "</th>"),
        ("<dd", "</dd>"),
        ("<p", "</p>"),
        ("<h1", "</h1>"),
        ("<h2", "</h2>"),
    ] {
        let mut rest = html;
        while let Some(at) = rest.find(open) {
            rest = &rest[at + open.len()..];
            // `<td>` or `<td …>`, not `<thead>` or `<link>`.
            if !(rest.starts_with('>') || rest.starts_with(' ')) {
                continue;
            }
            let Some(start) = rest.find('>') else { break };
            let Some(end) = rest.find(close) else { break };
            if end > start {
                out.push(strip_tags(&rest[start + 1..end]));
            }
        }
    }
    out
}

fn strip_tags(s: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in s.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

/// Whether `text` holds a UUID (8-4-4-4-12 hex digits).
fn has_uuid(text: &str) -> bool {
    let b = text.as_bytes();
    let groups = [8, 4, 4, 4, 12];
    (0..b.len()).any(|i| {
        let mut at = i;
        for (n, len) in groups.iter().enumerate() {
            if at + len > b.len() || !b[at..at + len].iter().all(u8::is_ascii_hexdigit) {
                return false;
            }
            at += len;
            if n < 4 {
                if b.get(at) != Some(&b'-') {
                    return false;
                }
                at += 1;
            }
        }
        true
    })
}

#[test]
fn cells_and_uuids_are_found() {
    let html = r#"<link rel="x"><table><thead><tr><th>Who</th></tr></thead><tr><td>bot<details><summary>Record</summary><pre>0eb25196-6f9a-4c1e-9a57-9b2f3c1d0e11</pre></details></td><td title="0eb25196-6f9a-4c1e-9a57-9b2f3c1d0e11">agent bot</td><td><a href="/runs/0eb25196-6f9a-4c1e-9a57-9b2f3c1d0e11">Pay it</a></td><td>0eb25196-6f9a-4c1e-9a57-9b2f3c1d0e11</td></tr></table>"#;
    let cells = cells(html);
    assert_eq!(cells.len(), 5, "{cells:?}");
    assert_eq!(cells[0], "bot");
    assert!(!has_uuid(&cells[1]) && !has_uuid(&cells[2]));
    assert!(has_uuid(&cells[3]));
    assert_eq!(cells[4], "Who");
    assert!(!has_uuid("sha256:0eb25196"));
}
