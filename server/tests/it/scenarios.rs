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
            assert!(
                began.elapsed() < std::time::Duration::from_secs(90),
                "{backend:?}: the demo never got to the advisor's draft"
            );
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
            Some(&(countersign::demo::HOLDS + countersign::demo::WAITING_HOLDS.len())),
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
        assert_eq!(paid.len(), 1, "one paid run");
        assert!(paid[0].request.contains("INV-20260611"), "{:?}", paid[0]);
        let waiting = app
            .store
            .steps_in_status(StepStatus::NeedsApproval, 10)
            .await
            .unwrap();
        // The inbox: the seed's payment, three holds for a batch, a payment for two people.
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
                ("payment.schedule", false),
                ("payment.schedule", true)
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
        assert_eq!(approvals.len(), 1);
        assert!(approvals[0].actor.as_deref().unwrap().contains("ana"));
        assert!(app.store.verify_audit().await.unwrap().is_ok());
        // Played once: with runs in the database, seeding again does nothing.
        let again = countersign::demo::seed(&app.store, &format!("http://{}", app.addr), None)
            .await
            .unwrap();
        assert!(again.is_none());
        assert_eq!(
            app.store
                .demo_effects(ERP, "payments.schedule")
                .await
                .unwrap()
                .len(),
            1
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
        assert!(err.contains("acts_for is for agents"), "{err}");
        app.stop().await;
    }
}
