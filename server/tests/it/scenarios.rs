//! Every scenario file under `examples/*/scenarios/` played by scripted agents over real MCP
//! HTTP and the approval API against a real server, on both backends; the expectations are
//! on the audit trail and the demo targets' effects (see `countersign::scenario`).

use countersign::scenario::{self, Target};
use countersign_core::Backend;

use crate::helpers::{example, spawn_app_with};

/// Every `examples/<bundle>/scenarios/*.yaml`, as (bundle, path), sorted.
fn scenario_files() -> Vec<(String, std::path::PathBuf)> {
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
        store: app.store.clone(),
        advance: Some(&advance),
    };
    let began = std::time::Instant::now();
    let result = scenario::run(&parsed, &target).await;
    if std::env::var("SCENARIO_DUMP").is_ok() {
        for r in app.store.audit_records(1, 100_000).await.unwrap() {
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
