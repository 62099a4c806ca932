//! Bundle (registry + policies) versions in the database: each test runs on SQLite and on
//! Postgres.

use countersign_core::Clock;
use countersign_core::bundle::{Bundle, BundleSources, BundleSubject};
use countersign_core::store::testing::each_backend;
use countersign_core::store::{ImportError, StoreError};

use crate::bundle::{example_dir, example_sources};
use crate::registry::example_path;
use crate::test_clock;

fn finance_text() -> String {
    std::fs::read_to_string(example_path("finance")).unwrap()
}

#[tokio::test]
async fn an_empty_database_has_no_registry() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        assert_eq!(store.registry_version().await.unwrap(), None);
        assert_eq!(store.current_registry().await.unwrap(), None);
        assert_eq!(store.current_bundle().await.unwrap(), None);
        assert!(store.registry_versions(10).await.unwrap().is_empty());
    })
    .await;
}

#[tokio::test]
async fn imports_version_and_diff_registries() {
    let (manual, clock) = test_clock();
    each_backend(clock, move |store| {
        let manual = manual.clone();
        async move {
            let text = finance_text();
            let v1 = store.import_registry(&text, "admin@acme").await.unwrap();
            assert_eq!(v1, 1);
            assert_eq!(store.registry_version().await.unwrap(), Some(1));
            assert_eq!(store.current_registry().await.unwrap(), Some((1, text.clone())));
            let registry_only = BundleSources { registry_yaml: text.clone(), ..BundleSources::default() };
            assert_eq!(store.current_bundle().await.unwrap(), Some((1, registry_only.clone())));

            // Identical content: nothing stored, the current version returned.
            manual.advance(chrono::Duration::seconds(10));
            assert_eq!(store.import_registry(&text, "someone@acme").await.unwrap(), 1);
            assert_eq!(store.registry_versions(10).await.unwrap().len(), 1);

            // A change: the next version, with who, when and what changed.
            let changed = text.replace(
                "roles: [worker.finance, worker.comms]\n    handler: {provider: erp, operation: notes.discard}",
                "roles: [worker.finance]\n    handler: {provider: erp, operation: notes.discard}",
            );
            assert_ne!(changed, text);
            let v2 = store.import_registry(&changed, "admin2@acme").await.unwrap();
            assert_eq!(v2, 2);
            assert_eq!(store.registry_version().await.unwrap(), Some(2));
            assert_eq!(store.current_registry().await.unwrap(), Some((2, changed.clone())));

            let history = store.registry_versions(10).await.unwrap();
            assert_eq!(history.len(), 2);
            let (newest, first) = (&history[0], &history[1]);
            assert_eq!(newest.version, 2);
            assert_eq!(newest.created_by, "admin2@acme");
            assert_eq!(newest.created_at, manual.now_ms());
            let stored = BundleSources { registry_yaml: changed.clone(), ..BundleSources::default() };
            assert_eq!(newest.sha256, stored.sha256());
            assert_eq!(newest.diff, "- role worker.comms no longer lists note.discard");
            assert!(first.diff.contains("+ tool payment.schedule (irreversible, gate always)"), "{}", first.diff);
            assert!(first.diff.contains("+ role worker.vendor_master lists supplier.update_iban"), "{}", first.diff);
            assert_eq!(store.registry_versions(1).await.unwrap().len(), 1);

            // Text-only changes (a comment) are a new version with no content change.
            let commented = format!("# reviewed by admin3\n{changed}");
            assert_eq!(store.import_registry(&commented, "admin3@acme").await.unwrap(), 3);
            let newest = &store.registry_versions(1).await.unwrap()[0];
            assert_eq!(newest.diff, "no change in content (text only)");
        }
    })
    .await;
}

#[tokio::test]
async fn imports_bundles_with_their_policies() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let finance = example_sources("finance");
        assert_eq!(store.import_bundle(&finance, "admin@acme").await.unwrap(), 1);
        assert_eq!(store.current_bundle().await.unwrap(), Some((1, finance.clone())));
        let first = &store.registry_versions(1).await.unwrap()[0];
        assert!(first.diff.contains("+ tool invoice.hold (write, gate policy)"), "{}", first.diff);
        assert!(first.diff.ends_with("~ policies changed\n~ policy schema changed"), "{}", first.diff);
        assert_eq!(first.sha256, finance.sha256());

        // Identical: a no-op.
        assert_eq!(store.import_bundle(&finance, "other@acme").await.unwrap(), 1);

        // Only the policies change.
        let mut stricter = finance.clone();
        stricter.policies.push_str(
            "\n@id(\"finance.hold.external\")\n@rule(\"origin.external\")\nforbid (principal, action == Action::\"invoice.hold\", resource)\nwhen { context.call.task_origin == \"external\" };\n",
        );
        assert_eq!(store.import_bundle(&stricter, "admin2@acme").await.unwrap(), 2);
        assert_eq!(store.registry_versions(1).await.unwrap()[0].diff, "~ policies changed");

        // A registry import keeps the current policies and schema...
        let text = finance.registry_yaml.replace(
            "roles: [worker.finance, worker.comms]\n    handler: {provider: erp, operation: notes.discard}",
            "roles: [worker.finance]\n    handler: {provider: erp, operation: notes.discard}",
        );
        assert_eq!(store.import_registry(&text, "admin3@acme").await.unwrap(), 3);
        let (v, current) = store.current_bundle().await.unwrap().unwrap();
        assert_eq!(v, 3);
        assert_eq!(current.policies, stricter.policies);
        assert_eq!(current.policy_schema, stricter.policy_schema);
        assert_eq!(store.registry_versions(1).await.unwrap()[0].diff, "- role worker.comms no longer lists note.discard");

        // ...and is checked against them: dropping a tool a policy names is refused.
        let without_hold = {
            let start = text.find("  invoice.hold:").unwrap();
            let end = text.find("  # ---------------------------------------------------------------- irreversible").unwrap();
            format!("{}{}", &text[..start], &text[end..])
        };
        let err = store.import_registry(&without_hold, "admin4@acme").await.unwrap_err();
        let ImportError::Invalid(e) = &err else { panic!("{err:?}") };
        assert!(
            e.problems().iter().any(|p| matches!(&p.subject, BundleSubject::Policy(_)) && p.message.contains("invoice.hold")),
            "{e}"
        );
        assert_eq!(store.registry_version().await.unwrap(), Some(3));

        // What is stored exports to files that read and load back to the same bundle.
        let dir = std::env::temp_dir().join(format!("cs-export-{}", uuid::Uuid::new_v4()));
        current.to_files(&dir).unwrap();
        let back = BundleSources::read(&dir).unwrap();
        assert_eq!(back, current);
        Bundle::load(back).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(example_dir("finance").exists());
    })
    .await;
}

#[tokio::test]
async fn an_invalid_registry_is_refused_and_nothing_is_stored() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let text = finance_text();
        store.import_registry(&text, "admin@acme").await.unwrap();
        let broken = text.replace("gate: always\n    roles: [worker.finance]", "gate: never\n    roles: [worker.finance]");
        let err = store.import_registry(&broken, "admin@acme").await.unwrap_err();
        match &err {
            ImportError::Invalid(e) => {
                assert!(
                    e.problems().iter().any(|p| p.path == "/gate" && p.to_string().contains("payment.schedule")),
                    "{e}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(store.registry_version().await.unwrap(), Some(1));

        // An invalid bundle: its policy names a tool the registry lacks.
        let mut bad = example_sources("finance");
        bad.policies = bad.policies.replace("Action::\"invoice.hold\"", "Action::\"credit_note.issue\"");
        let err = store.import_bundle(&bad, "admin@acme").await.unwrap_err();
        assert!(err.to_string().contains("credit_note.issue"), "{err}");
        assert_eq!(store.registry_version().await.unwrap(), Some(1));

        let err = store.import_registry(&text, "  ").await.unwrap_err();
        assert!(matches!(err, ImportError::NoAuthor), "{err:?}");

        // Versions cannot be forged twice: the key refuses a duplicate.
        let dup = store
            .execute_sql(
                "INSERT INTO registry_versions (version, yaml, sha256, created_by, created_at, diff) \
                 VALUES (1, '', '', 'x', 0, '')",
            )
            .await
            .unwrap_err();
        assert!(matches!(dup, StoreError::Conflict(_)), "{dup:?}");
    })
    .await;
}
