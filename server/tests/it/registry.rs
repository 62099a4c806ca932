//! The registry at start, on change, and through the CLI.

use std::time::Duration;

use countersign::Application;
use countersign_core::bundle::BundleSources;
use countersign_core::store::ProposalStatus;
use countersign_core::store::testing::FreshDb;
use countersign_core::{Backend, Clock, SystemClock};
use serde_json::Value;

use crate::helpers::{countersign_on, example, spawn_app_with, test_config};

async fn registry_version(app: &crate::helpers::TestApp) -> Option<i64> {
    let body: Value = app
        .client
        .get(app.url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["registry_version"].as_i64()
}

#[tokio::test]
async fn the_configured_registry_seeds_an_empty_database_and_new_versions_load_without_restart() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let finance = example("finance");
        let Some(app) = spawn_app_with(backend, &[("COUNTERSIGN_REGISTRY", &finance)]).await else {
            continue;
        };
        assert_eq!(registry_version(&app).await, Some(1), "{backend:?}");
        let history = app.store.registry_versions(10).await.unwrap();
        assert_eq!(history.len(), 1);
        assert_eq!(
            history[0].created_by,
            countersign::registry::CONFIG_IMPORTER
        );

        // Another process (an admin, the CLI) imports a change; the server picks it up.
        let mut changed = BundleSources::read(std::path::Path::new(&finance)).unwrap();
        changed
            .registry_yaml
            .push_str("\n# reviewed by the second admin\n");
        let v2 = app.store.import_bundle(&changed, "admin-2").await.unwrap();
        assert_eq!(v2, 2);
        let mut seen = None;
        for _ in 0..60 {
            seen = registry_version(&app).await;
            if seen == Some(2) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(seen, Some(2), "{backend:?}: new version not loaded");
        app.stop().await;
    }
}

#[tokio::test]
async fn a_stored_registry_wins_over_the_configured_one() {
    let db = FreshDb::create(Backend::Sqlite).await.unwrap();
    let clock: std::sync::Arc<dyn Clock> = std::sync::Arc::new(SystemClock);
    let stillon = example("stillon");
    let finance = example("finance");
    // First start seeds StillOn.
    let app = Application::build(
        test_config(&db, &[("COUNTERSIGN_REGISTRY", &stillon)]),
        clock.clone(),
    )
    .await
    .unwrap();
    let v = app.state().registry.current().unwrap();
    assert!(
        v.bundle
            .registry
            .tools()
            .any(|t| t.name.as_str() == "reservation.modify")
    );
    app.state().store.close().await;
    drop(app);
    // A restart pointing at finance does not replace what the database holds.
    let app = Application::build(
        test_config(&db, &[("COUNTERSIGN_REGISTRY", &finance)]),
        clock,
    )
    .await
    .unwrap();
    let loaded = app.state().registry.current().unwrap();
    assert_eq!(loaded.version, 1);
    assert!(
        loaded
            .bundle
            .registry
            .tools()
            .any(|t| t.name.as_str() == "reservation.modify")
    );
    assert!(
        !loaded
            .bundle
            .registry
            .tools()
            .any(|t| t.name.as_str() == "payment.schedule")
    );
    app.state().store.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn an_invalid_configured_registry_stops_the_start_with_one_line() {
    let dir = std::env::temp_dir().join(format!("cs-bad-registry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("registry.yaml");
    std::fs::write(
        &file,
        "tools:\n  x.open:\n    description: open schema\n    effect: read\n    gate: never\n    roles: [planner]\n    handler: {provider: erp, operation: x}\n    inputSchema: {type: object}\nroles:\n  planner: {description: p}\nproviders:\n  erp: {kind: builtin}\n",
    )
    .unwrap();
    let db = FreshDb::create(Backend::Sqlite).await.unwrap();
    let err = Application::build(
        test_config(&db, &[("COUNTERSIGN_REGISTRY", file.to_str().unwrap())]),
        std::sync::Arc::new(SystemClock),
    )
    .await
    .err()
    .expect("an open schema must stop the start");
    let msg = err.to_string();
    assert!(msg.starts_with("COUNTERSIGN_REGISTRY:"), "{msg}");
    assert!(
        msg.contains("x.open") && msg.contains("additionalProperties"),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "{msg}");
    db.drop_db().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cli_validate_lists_every_problem_and_exits_1() {
    let dir = std::env::temp_dir().join(format!("cs-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "tools:\n  a.open:\n    description: d\n    effect: read\n    gate: never\n    roles: [planner]\n    handler: {provider: erp, operation: x}\n    inputSchema: {type: object}\n  b.pay:\n    description: d\n    effect: irreversible\n    gate: never\n    roles: [planner]\n    handler: {provider: erp, operation: y}\n    inputSchema: {type: object, additionalProperties: false, properties: {n: {type: number}}}\nroles:\n  planner: {description: p}\nproviders:\n  erp: {kind: builtin}\n",
    )
    .unwrap();
    let out = countersign_on("sqlite:///nonexistent/never-used.db")
        .args(["registry", "validate"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    // Three distinct problems in two tools, all reported in one run.
    assert!(err.contains("a.open"), "{err}");
    assert!(err.contains("b.pay") && err.contains("gate"), "{err}");
    assert!(err.contains("/properties/n"), "{err}");

    for name in ["finance", "stillon"] {
        let out = countersign_on("sqlite:///nonexistent/never-used.db")
            .args(["registry", "validate", &example(name)])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("valid"));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cli_import_then_export_round_trips() {
    let dir = std::env::temp_dir().join(format!("cs-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/cs.db", dir.display());

    let out = countersign_on(&url)
        .args(["registry", "export"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "nothing to export yet");

    let out = countersign_on(&url)
        .args(["registry", "import", &example("finance"), "--by", "alice"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("version 1"));

    // Importing the same content again is a no-op.
    let out = countersign_on(&url)
        .args(["registry", "import", &example("finance"), "--by", "alice"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("unchanged"));

    let exported = dir.join("exported");
    let out = countersign_on(&url)
        .args(["registry", "export", "--out"])
        .arg(&exported)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let original = BundleSources::read(std::path::Path::new(&example("finance"))).unwrap();
    let back = BundleSources::read(&exported).unwrap();
    let a = countersign_core::bundle::Bundle::load(original).unwrap();
    let b = countersign_core::bundle::Bundle::load(back).unwrap();
    assert_eq!(a.registry, b.registry);
    assert_eq!(a.policy.policy_ids(), b.policy.policy_ids());

    // The exported folder imports as the same content: still version 1.
    let out = countersign_on(&url)
        .args(["registry", "import"])
        .arg(&exported)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = countersign_on(&url)
        .args(["registry", "history"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("by alice"));
    let _ = std::fs::remove_dir_all(dir);
}

/// The finance example with invoice.hold's approval expiring after `expires`, in a folder of
/// its own.
fn finance_with_expiry(tag: &str, expires: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cs-bundle-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let from = std::path::PathBuf::from(example("finance"));
    for name in ["registry.yaml", "policy.cedar", "policy.cedarschema"] {
        let text = std::fs::read_to_string(from.join(name)).unwrap();
        let text = if name == "registry.yaml" {
            assert!(text.contains("expires: 72h"));
            text.replacen("expires: 72h", &format!("expires: {expires}"), 1)
        } else {
            text
        };
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn cli_import_on_a_database_with_a_registry_is_a_proposal_a_second_admin_applies() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let finance = example("finance");
        let Some(app) = spawn_app_with(backend, &[("COUNTERSIGN_REGISTRY", &finance)]).await else {
            continue;
        };
        let cli = |args: &[&str]| countersign_on(&app.db_url()).args(args).output().unwrap();
        let changed = finance_with_expiry(&format!("{backend:?}"), "48h");
        let changed = changed.to_str().unwrap();

        // Filed, not applied: version 1 stays in force.
        let out = cli(&["registry", "import", changed, "--by", "alice"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = stdout(&out);
        assert!(text.contains("proposal"), "{text}");
        assert_eq!(app.store.registry_version().await.unwrap(), Some(1));
        let proposal = app.store.list_proposals(10).await.unwrap().remove(0);
        assert_eq!(proposal.status, ProposalStatus::Proposed);
        assert_eq!(proposal.proposer, "alice");
        let listed = stdout(&cli(&["registry", "proposals"]));
        assert!(listed.contains(&proposal.id), "{listed}");
        assert!(
            listed.contains("invoice.hold"),
            "the summary names the change: {listed}"
        );

        // The proposer cannot apply it; a second admin can. A reject needs a reason.
        let out = cli(&["registry", "approve", &proposal.id, "--by", "alice"]);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(app.store.registry_version().await.unwrap(), Some(1));
        let out = cli(&["registry", "approve", &proposal.id, "--by", "person:bob"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(app.store.registry_version().await.unwrap(), Some(2));
        let (_, sources) = app.store.current_bundle().await.unwrap().unwrap();
        assert!(sources.registry_yaml.contains("expires: 48h"));
        assert_eq!(
            app.store
                .get_proposal(&proposal.id)
                .await
                .unwrap()
                .decided_by
                .as_deref(),
            Some("bob")
        );

        // The same texts again change nothing; a rejected bundle leaves the registry as is.
        let out = cli(&["registry", "import", changed, "--by", "alice"]);
        assert!(stdout(&out).contains("unchanged"), "{}", stdout(&out));
        let out = cli(&["registry", "import", &finance, "--by", "alice"]);
        assert!(out.status.success());
        let second = app.store.list_proposals(10).await.unwrap().remove(0);
        assert_ne!(second.id, proposal.id);
        let out = cli(&[
            "registry", "reject", &second.id, "--by", "bob", "--reason", " ",
        ]);
        assert_eq!(out.status.code(), Some(1));
        let out = cli(&[
            "registry", "reject", &second.id, "--by", "bob", "--reason", "keep 48h",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(app.store.registry_version().await.unwrap(), Some(2));
        // A bundle that does not load is refused outright: no proposal.
        let broken = finance_with_expiry(&format!("{backend:?}-broken"), "soon");
        let out = cli(&[
            "registry",
            "import",
            broken.to_str().unwrap(),
            "--by",
            "alice",
        ]);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(app.store.list_proposals(10).await.unwrap().len(), 2);
        app.stop().await;
    }
}
