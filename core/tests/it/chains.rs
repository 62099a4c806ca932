//! One audit chain per tenant (issue 39): tenants append concurrently, each chain verifies on
//! its own and under the signed checkpoint over every chain, and a database of the previous
//! schema (one chain) migrates with every record still verifying.

use countersign_core::audit::checkpoint::{Checkpoint, CheckpointSigner, VerifyFailure};
use countersign_core::audit::tree_head::InclusionProof;
use countersign_core::audit::{
    AuditEvent, GENESIS, LEGACY_CHAIN, NewAuditRecord, SYSTEM_CHAIN, hash_text,
};
use countersign_core::canonical::canonicalize;
use countersign_core::store::testing::{FreshDb, each_backend};
use countersign_core::{Backend, Store};
use serde_json::json;

use crate::test_clock;

const SEED_A: [u8; 32] = [7; 32];

fn record(tenant: Option<&str>, i: usize) -> NewAuditRecord {
    let mut detail = serde_json::Map::new();
    detail.insert("n".into(), json!(i));
    NewAuditRecord {
        event: Some(AuditEvent::Operational),
        actor: Some("test".into()),
        detail,
        tenant: tenant.map(str::to_string),
        ..NewAuditRecord::default()
    }
}

async fn append(store: &Store, tenant: Option<&str>, n: usize) {
    for i in 0..n {
        store.append_audit(&record(tenant, i)).await.unwrap();
    }
}

async fn drop_guards(store: &Store) {
    let sql: &[&str] = match store.backend() {
        Backend::Sqlite => &[
            "DROP TRIGGER audit_no_update",
            "DROP TRIGGER audit_no_delete",
            "DROP TRIGGER audit_chains_forward_only",
            "DROP TRIGGER audit_chains_no_delete",
            "DROP TRIGGER audit_tree_heads_no_delete",
            "DROP TRIGGER audit_tree_leaves_no_delete",
            "DROP TRIGGER audit_tree_leaves_no_update",
        ],
        Backend::Postgres => &[
            "ALTER TABLE audit DISABLE TRIGGER audit_no_update",
            "ALTER TABLE audit_chains DISABLE TRIGGER audit_chains_forward_only",
            "ALTER TABLE audit_tree_heads DISABLE TRIGGER audit_tree_heads_no_update",
            "ALTER TABLE audit_tree_leaves DISABLE TRIGGER audit_tree_leaves_no_update",
        ],
    };
    for s in sql {
        store.execute_sql(s).await.unwrap();
    }
}

#[tokio::test]
async fn records_join_their_tenants_chain_and_each_chain_starts_at_one() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        append(&store, Some("acme"), 3).await;
        append(&store, Some("globex"), 2).await;
        append(&store, None, 1).await;
        for (chain, n) in [("acme", 3), ("globex", 2), (SYSTEM_CHAIN, 1)] {
            let records = store.audit_records(chain, 1, 100).await.unwrap();
            assert_eq!(records.len(), n, "{chain}");
            assert_eq!(records[0].prev, GENESIS, "{chain} starts its own chain");
            assert!(records.iter().all(|r| r.chain == chain));
            assert!(
                records[0]
                    .record
                    .contains(&format!("\"chain\":\"{chain}\""))
            );
            assert!(records[0].record.ends_with(",\"v\":2}"), "format version 2");
        }
        assert_eq!(store.verify_audit().await.unwrap(), Ok(6));
        // A tenant name that would pass for a reserved chain is refused, nothing written…
        for bad in ["_system", "_legacy", ""] {
            assert!(
                store.append_audit(&record(Some(bad), 0)).await.is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(store.verify_audit().await.unwrap(), Ok(6));
        // …no credential is created for it…
        let refused = store
            .create_agent(&countersign_core::store::NewAgent {
                name: "bot".into(),
                role: "worker.finance".into(),
                tenant: "_system".into(),
                created_by: "ops".into(),
                expires_at: None,
                acts_for: None,
                origin: countersign_core::policy::TaskOrigin::User,
            })
            .await;
        assert!(refused.is_err(), "{refused:?}");
        // …and a person of such a tenant reads no chain through the audit search.
        use countersign_core::store::{AuditCursor, AuditFilter};
        for (tenant, expected) in [("acme", 4), ("_system", 0), ("_legacy", 0)] {
            let f = AuditFilter {
                tenant: Some(tenant.into()),
                actor: Some("test".into()),
                ..AuditFilter::default()
            };
            let found = store
                .search_audit(&f, AuditCursor::Newest, 50)
                .await
                .unwrap();
            // (acme sees its 3 and the system record, which names no tenant.)
            assert_eq!(found.len(), expected, "{tenant}");
        }
    })
    .await;
}

/// With a transaction holding tenant A's head row, tenant B's appends commit (through the
/// committer, and alone), and A's waits — no database-wide lock serialises tenants.
#[tokio::test]
async fn a_held_chain_head_stops_only_its_own_tenant() {
    use sqlx::Connection;
    let (_, clock) = test_clock();
    let Some(db) = FreshDb::create(Backend::Postgres).await else {
        return;
    };
    let store = db.store(clock).await;
    append(&store, Some("a"), 1).await;
    let mut holder = sqlx::PgConnection::connect(db.url.expose()).await.unwrap();
    let mut held = holder.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM audit_chains WHERE chain = 'a' FOR UPDATE")
        .execute(&mut *held)
        .await
        .unwrap();
    let blocked = tokio::spawn({
        let store = store.clone();
        async move { store.append_audit(&record(Some("a"), 9)).await }
    });
    // Tenant A's append is parked on A's head row (the server says so, no timing involved).
    let mut admin = sqlx::PgConnection::connect(db.url.expose()).await.unwrap();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut admin)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    // Meanwhile B commits (its chain's first record, then one more), and the system chain.
    // (The timeout only turns a regression into a failure instead of a hang.)
    for (tenant, i) in [(Some("b"), 0), (Some("b"), 1), (None, 0)] {
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            store.append_audit(&record(tenant, i)),
        )
        .await
        .expect("another tenant is not held up by A's head")
        .unwrap();
        assert_eq!(r.chain, tenant.unwrap_or(SYSTEM_CHAIN));
    }
    let advisory: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(advisory, 0, "no advisory lock is taken for audit appends");
    assert!(!blocked.is_finished(), "A waits for its head");
    held.commit().await.unwrap();
    let a = blocked.await.unwrap().unwrap();
    assert_eq!((a.chain.as_str(), a.seq), ("a", 2));
    assert_eq!(store.verify_audit().await.unwrap(), Ok(5));
    let _ = admin.close().await;
    let _ = holder.close().await;
    store.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn verification_names_a_swapped_chain_id_and_a_dropped_chain() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let a = CheckpointSigner::from_seed(&SEED_A);
        append(&store, Some("a"), 3).await;
        append(&store, Some("b"), 3).await;
        store.checkpoint_audit(&a, None).await.unwrap().unwrap();
        let trusted = [a.public_key()];
        drop_guards(&store).await;

        // Record 2 of chain a and record 2 of chain b trade places.
        for sql in [
            "UPDATE audit SET chain = 'tmp' WHERE chain = 'a' AND seq = 2",
            "UPDATE audit SET chain = 'a' WHERE chain = 'b' AND seq = 2",
            "UPDATE audit SET chain = 'b' WHERE chain = 'tmp' AND seq = 2",
        ] {
            store.execute_sql(sql).await.unwrap();
        }
        let b = store.verify_audit().await.unwrap().unwrap_err();
        assert_eq!((b.chain.as_str(), b.seq), ("a", 2), "{b}");
        for sql in [
            "UPDATE audit SET chain = 'tmp' WHERE chain = 'a' AND seq = 2",
            "UPDATE audit SET chain = 'a' WHERE chain = 'b' AND seq = 2",
            "UPDATE audit SET chain = 'b' WHERE chain = 'tmp' AND seq = 2",
        ] {
            store.execute_sql(sql).await.unwrap();
        }
        assert_eq!(store.verify_audit().await.unwrap(), Ok(6), "restored");

        // A whole chain renamed (its records and head): every record names its chain in its
        // hashed text, so the renamed chain does not verify.
        for sql in [
            "UPDATE audit SET chain = 'c' WHERE chain = 'b'",
            "UPDATE audit_chains SET chain = 'c' WHERE chain = 'b'",
        ] {
            store.execute_sql(sql).await.unwrap();
        }
        let b = store.verify_audit().await.unwrap().unwrap_err();
        assert_eq!((b.chain.as_str(), b.seq), ("c", 1), "{b}");
        assert!(b.reason.contains("columns disagree"), "{b}");

        // A chain's head row removed: its records no longer verify, even alone.
        store
            .execute_sql("DELETE FROM audit_chains WHERE chain = 'a'")
            .await
            .unwrap();
        let b = match store
            .verify_audit_full(&trusted, &[], &[], Some("a"))
            .await
            .unwrap()
        {
            Err(VerifyFailure::Chain(b)) => b,
            other => panic!("{other:?}"),
        };
        assert!(b.reason.contains("no head row"), "{b}");
        store
            .execute_sql(
                "INSERT INTO audit_chains (chain, seq, hash, at) \
                 SELECT chain, seq, hash, at FROM audit WHERE chain = 'a' AND seq = 3",
            )
            .await
            .unwrap();

        // Chain b dropped whole (records and head): the chains left verify alone; the
        // checkpoint names b as truncated.
        for sql in [
            "DELETE FROM audit WHERE chain = 'c'",
            "DELETE FROM audit_chains WHERE chain = 'c'",
        ] {
            store.execute_sql(sql).await.unwrap();
        }
        assert_eq!(store.verify_audit().await.unwrap(), Ok(3));
        match store
            .verify_audit_full(&trusted, &[], &[], None)
            .await
            .unwrap()
        {
            Err(VerifyFailure::Chain(b)) => {
                assert_eq!((b.chain.as_str(), b.seq), ("b", 1), "{b}");
                assert!(b.reason.contains("truncated"), "{b}");
            }
            other => panic!("{other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn a_rolled_back_or_forked_checkpoint_log_is_refused() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let a = CheckpointSigner::from_seed(&SEED_A);
        let trusted = [a.public_key()];
        append(&store, Some("a"), 2).await;
        let first = store.checkpoint_audit(&a, None).await.unwrap().unwrap();
        append(&store, Some("b"), 2).await;
        let second = store.checkpoint_audit(&a, None).await.unwrap().unwrap();
        let held = [(second.note.clone(), "the auditor's copy".to_string())];
        let report = store
            .verify_audit_full(&trusted, &[], &held, None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((report.chains, report.checkpoints), (2, 2));

        // The database is put back to before the second checkpoint.
        drop_guards(&store).await;
        for sql in [
            "DELETE FROM audit_tree_leaves WHERE number = 2",
            "DELETE FROM audit_tree_heads WHERE number = 2",
        ] {
            store.execute_sql(sql).await.unwrap();
        }
        match store
            .verify_audit_full(&trusted, &[], &held, None)
            .await
            .unwrap()
        {
            Err(VerifyFailure::Log { number: 2, reason }) => {
                assert!(reason.contains("rolled back"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        // The first checkpoint replaced by another signed over other heads: a fork.
        let keep = [(first.note.clone(), "the auditor's first copy".to_string())];
        store
            .execute_sql("UPDATE audit_tree_leaves SET seq = 1 WHERE number = 1")
            .await
            .unwrap();
        assert!(matches!(
            store
                .verify_audit_full(&trusted, &[], &keep, None)
                .await
                .unwrap(),
            Err(VerifyFailure::Log { number: 1, .. })
        ));
    })
    .await;
}

#[tokio::test]
async fn an_inclusion_proof_verifies_and_fails_when_any_part_changes() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let a = CheckpointSigner::from_seed(&SEED_A);
        let trusted = [a.public_key()];
        for t in ["a", "b", "c", "d", "e"] {
            append(&store, Some(t), 2).await;
        }
        let th = store.checkpoint_audit(&a, None).await.unwrap().unwrap();
        let proof = InclusionProof::of(&th, "c").unwrap().unwrap();
        assert_eq!(proof.leaf.chain, "c");
        proof.verify(&trusted).unwrap();
        assert!(InclusionProof::of(&th, "zz").unwrap().is_none());

        let mut bad = proof.clone();
        bad.leaf.seq += 1;
        assert!(bad.verify(&trusted).is_err(), "the leaf's seq");
        let mut bad = proof.clone();
        bad.leaf.hash.replace_range(8..9, "0");
        if bad.leaf.hash == proof.leaf.hash {
            bad.leaf.hash.replace_range(8..9, "1");
        }
        assert!(bad.verify(&trusted).is_err(), "the leaf's hash");
        let mut bad = proof.clone();
        bad.index ^= 1;
        assert!(bad.verify(&trusted).is_err(), "the index");
        for i in 0..proof.proof.len() {
            let mut bad = proof.clone();
            let mut bytes = bad.proof[i].clone().into_bytes();
            bytes[0] = if bytes[0] == b'A' { b'B' } else { b'A' };
            bad.proof[i] = String::from_utf8(bytes).unwrap();
            assert!(bad.verify(&trusted).is_err(), "proof node {i}");
        }
        for i in 0..proof.checkpoint.len() {
            let mut bytes = proof.checkpoint.clone().into_bytes();
            bytes[i] ^= 1;
            let Ok(text) = String::from_utf8(bytes) else {
                continue;
            };
            let bad = InclusionProof {
                checkpoint: text,
                ..proof.clone()
            };
            assert!(bad.verify(&trusted).is_err(), "checkpoint byte {i}");
        }
        // Under another key it proves nothing.
        let other = CheckpointSigner::from_seed(&[9; 32]).public_key();
        assert!(proof.verify(&[other]).is_err());
    })
    .await;
}

/// A database of schema 15 (one chain, checkpoints of its head) migrates: its records become
/// the frozen legacy chain, byte for byte, still pinned by their checkpoint; new records go to
/// their tenants' chains; verification passes before and after, and still catches tampering.
#[tokio::test]
async fn a_single_chain_database_migrates_and_still_verifies() {
    let (_, clock) = test_clock();
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(db) = FreshDb::create(backend).await else {
            continue;
        };
        let store = Store::connect(
            &db.url,
            &countersign_core::store::ConnectOptions::default(),
            clock.clone(),
        )
        .await
        .unwrap();
        store.migrate_to(15).await.unwrap();
        // Five records as the previous release sealed them (format 1: no chain, no version).
        let mut prev = GENESIS.to_string();
        let mut last = (0, String::new(), 0);
        for seq in 1..=5_i64 {
            let at = 1_700_000_000_000 + seq;
            let body = json!({
                "seq": seq, "at": at, "event": "operational", "run_id": null,
                "step_id": null, "tool": null, "actor": "old", "rule": null,
                "detail": {"n": seq}, "prev": prev,
            });
            let text = canonicalize(&body).unwrap();
            let hash = hash_text(&text);
            store
                .execute_sql(&format!(
                    "INSERT INTO audit (seq, at, event, actor, record, prev, hash) \
                     VALUES ({seq}, {at}, 'operational', 'old', '{text}', '{prev}', '{hash}')"
                ))
                .await
                .unwrap();
            last = (seq, hash.clone(), at);
            prev = hash;
        }
        let signer = CheckpointSigner::from_seed(&SEED_A);
        let old: Checkpoint = signer.sign(last.0, &last.1, last.2).unwrap();
        store
            .execute_sql(&format!(
                "INSERT INTO audit_checkpoints (seq, hash, at, public_key, signature) \
                 VALUES ({}, '{}', {}, '{}', '{}')",
                old.seq, old.hash, old.at, old.public_key, old.signature
            ))
            .await
            .unwrap();

        store.migrate().await.unwrap();
        let trusted = [signer.public_key()];
        let legacy = store.audit_records(LEGACY_CHAIN, 1, 100).await.unwrap();
        assert_eq!(legacy.len(), 5);
        assert_eq!(legacy[4].hash, last.1, "byte for byte");
        let report = store
            .verify_audit_full(&trusted, &[(old.clone(), "the old file".into())], &[], None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((report.records, report.checkpoints), (5, 2));

        // New records go to their chains; the legacy chain is frozen.
        append(&store, Some("acme"), 2).await;
        let frozen = store
            .execute_sql(&format!(
                "INSERT INTO audit (chain, seq, at, event, record, prev, hash) \
                 VALUES ('{LEGACY_CHAIN}', 6, 0, 'x', '{{}}', '{}', 'sha256:x')",
                last.1
            ))
            .await
            .unwrap_err();
        assert!(frozen.to_string().contains("frozen"), "{frozen}");
        let th = store
            .checkpoint_audit(&signer, None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            th.leaves
                .iter()
                .map(|l| l.chain.as_str())
                .collect::<Vec<_>>(),
            vec![LEGACY_CHAIN, "acme"],
            "the first checkpoint covers the legacy chain"
        );
        let report = store
            .verify_audit_full(&trusted, &[], &[], None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((report.records, report.chains), (7, 2));

        // A legacy record changed afterwards is still named.
        drop_guards(&store).await;
        store
            .execute_sql(&format!(
                "UPDATE audit SET record = replace(record, '\"n\":3', '\"n\":4') \
                 WHERE chain = '{LEGACY_CHAIN}' AND seq = 3"
            ))
            .await
            .unwrap();
        let b = store.verify_audit().await.unwrap().unwrap_err();
        assert_eq!((b.chain.as_str(), b.seq), (LEGACY_CHAIN, 3), "{b}");
        store.close().await;
        db.drop_db().await;
    }
}
