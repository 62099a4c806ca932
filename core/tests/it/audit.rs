//! The audit chain: appends link, concurrent appenders never fork it, tampering is named.

use countersign_core::audit::checkpoint::{
    Checkpoint, CheckpointError, CheckpointPolicy, CheckpointSigner, PublicKey, VerifyFailure,
    expect_checkpoints,
};
use countersign_core::audit::tree_head::Leaf;
use countersign_core::audit::{
    AuditEvent, AuditRecord, ChainVerifier, GENESIS, NewAuditRecord, SYSTEM_CHAIN, seal, verify,
    verify_with_threads,
};
use countersign_core::store::testing::each_backend;
use countersign_core::{Backend, Secret};
use proptest::prelude::*;
use serde_json::json;

use crate::test_clock;

fn record(i: usize) -> NewAuditRecord {
    let mut detail = serde_json::Map::new();
    detail.insert(
        "inputs".into(),
        json!({"amount": 4180.00 + i as f64, "iban": "hmac-sha256:ab"}),
    );
    NewAuditRecord {
        event: Some(if i.is_multiple_of(2) {
            AuditEvent::Proposed
        } else {
            AuditEvent::Decided
        }),
        run_id: Some("run-1".into()),
        step_id: Some(format!("step-{i}")),
        tool: Some("payment.schedule".into()),
        actor: Some("worker.finance/agent-1".into()),
        rule: (!i.is_multiple_of(2)).then(|| "irreversible.always".to_string()),
        detail,
        tenant: None,
    }
}

/// An outcome record of `run` for the failures-in-a-row count.
fn outcome(run: &str, event: AuditEvent) -> NewAuditRecord {
    NewAuditRecord {
        event: Some(event),
        run_id: Some(run.into()),
        tool: Some("note.draft".into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn failures_in_a_row_count_back_to_the_last_success_across_pages_and_runs() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        use AuditEvent::{Decided, Failed, Reconciled, Started, Succeeded};
        let run = store
            .create_run(&crate::store::new_run("acme"))
            .await
            .unwrap();
        let run_a: &'static str = Box::leak(run.id.into_boxed_str());
        // Counted alone, and from the first page the executor's one read brings
        // (`planned_call`): always the same.
        let count = |run: &'static str, limit: i64| {
            let store = store.clone();
            async move {
                let alone = store.failures_in_a_row(run, limit).await.unwrap();
                if run == run_a {
                    let newest = store
                        .planned_call(run, 0, "emergency_stop")
                        .await
                        .unwrap()
                        .recent_events;
                    assert!(newest.as_ref().is_some_and(|p| p.len() <= 16));
                    let from = store
                        .failures_in_a_row_from(run, limit, newest)
                        .await
                        .unwrap();
                    assert_eq!(from, alone, "limit {limit}");
                }
                alone
            }
        };
        let append = |run: &'static str, event| {
            let store = store.clone();
            async move { store.append_audit(&outcome(run, event)).await.unwrap() }
        };
        assert_eq!(count(run_a, 3).await, 0, "no records");
        append(run_a, Succeeded).await;
        append(run_a, Failed).await;
        // Far more non-outcome records than one page between the two failures, and another
        // run's failures and successes interleaved: neither counts nor stops the count.
        for i in 0..150 {
            append(run_a, if i % 2 == 0 { Decided } else { Started }).await;
            if i % 50 == 0 {
                append("run-b", Failed).await;
                append("run-b", Succeeded).await;
            }
        }
        append(run_a, Failed).await;
        assert_eq!(count(run_a, 5).await, 2);
        assert_eq!(count(run_a, 1).await, 1, "capped at limit");
        assert_eq!(count(run_a, 0).await, 0);
        assert_eq!(count("run-b", 5).await, 0);
        append(run_a, Failed).await;
        append(run_a, Failed).await;
        assert_eq!(count(run_a, 3).await, 3, "capped at limit");
        assert_eq!(count(run_a, 10).await, 4);
        // A reconciled outcome is a success: the count starts again.
        append(run_a, Reconciled).await;
        assert_eq!(count(run_a, 10).await, 0);
        append(run_a, Failed).await;
        assert_eq!(count(run_a, 10).await, 1);
    })
    .await;
}

#[tokio::test]
async fn appended_records_link_and_verify_on_both_backends() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        assert_eq!(store.verify_audit().await.unwrap(), Ok(0));
        let first = store.append_audit(&record(0)).await.unwrap();
        assert_eq!(first.seq, 1);
        assert_eq!(first.prev, GENESIS);
        let second = store.append_audit(&record(1)).await.unwrap();
        assert_eq!(second.prev, first.hash);
        assert_eq!(store.verify_audit().await.unwrap(), Ok(2));
        let mut stored = store.audit_for_run("run-1").await.unwrap();
        assert_eq!(
            stored.iter().map(|r| r.pos).collect::<Vec<_>>(),
            vec![1, 2],
            "in the order written"
        );
        for r in &mut stored {
            r.pos = 0;
        }
        assert_eq!(stored, vec![first, second]);
        // A record without an event is refused, not written.
        assert!(
            store
                .append_audit(&NewAuditRecord::default())
                .await
                .is_err()
        );
        assert_eq!(store.verify_audit().await.unwrap(), Ok(2));
    })
    .await;
}

/// Appends `n` records from `n` concurrent tasks; every append must succeed.
async fn append_concurrently(store: &countersign_core::Store, n: usize) {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.append_audit(&record(i)).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn concurrent_appenders_never_fork_the_chain() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        append_concurrently(&store, 24).await;
        assert_eq!(
            store.verify_audit().await.unwrap(),
            Ok(24),
            "{:?}",
            store.backend()
        );
    })
    .await;
}

#[tokio::test]
async fn the_first_tampered_record_is_named() {
    let records = local_chain().await;
    assert_eq!(verify(&records, 1, GENESIS), Ok(6));

    // One changed byte in a record.
    let mut changed = records.clone();
    changed[3].record = changed[3].record.replacen("4183", "4193", 1);
    assert_eq!(verify(&changed, 1, GENESIS).unwrap_err().seq, 4);

    // A deleted record.
    let mut deleted = records.clone();
    deleted.remove(2);
    assert_eq!(verify(&deleted, 1, GENESIS).unwrap_err().seq, 3);

    // Two records swapped.
    let mut swapped = records.clone();
    swapped.swap(1, 4);
    assert_eq!(verify(&swapped, 1, GENESIS).unwrap_err().seq, 2);

    // A column rewritten without touching the hashed text.
    let mut relabelled = records.clone();
    relabelled[5].event = "approved".into();
    assert_eq!(verify(&relabelled, 1, GENESIS).unwrap_err().seq, 6);

    // A record rewritten and re-hashed still breaks the next link.
    let mut rehashed = records.clone();
    rehashed[1].record = rehashed[1].record.replacen("4181", "4999", 1);
    rehashed[1].hash = countersign_core::audit::hash_text(&rehashed[1].record);
    assert_eq!(verify(&rehashed, 1, GENESIS).unwrap_err().seq, 3);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]
    #[test]
    fn any_single_byte_change_is_caught_at_its_record(pos in 0usize..6, byte in 0usize..400, delta in 1u8..=26) {
        let records = tokio::runtime::Runtime::new().unwrap().block_on(local_chain());
        let mut tampered = records.clone();
        let text = tampered[pos].record.clone().into_bytes();
        let i = byte % text.len();
        let mut bytes = text;
        bytes[i] = if bytes[i].is_ascii_lowercase() { b'a' + (bytes[i] - b'a' + delta) % 26 } else { bytes[i] ^ 0x01 };
        prop_assume!(bytes != tampered[pos].record.as_bytes());
        tampered[pos].record = String::from_utf8_lossy(&bytes).into_owned();
        let err = verify(&tampered, 1, GENESIS).unwrap_err();
        prop_assert_eq!(err.seq, pos as i64 + 1);
    }
}

/// A 6-record chain on SQLite only (fast, for the property test).
async fn local_chain() -> Vec<AuditRecord> {
    use countersign_core::store::testing::FreshDb;
    let (_, clock) = test_clock();
    let db = FreshDb::create(countersign_core::Backend::Sqlite)
        .await
        .unwrap();
    let store = db.store(clock).await;
    let mut out = Vec::new();
    for i in 0..6 {
        out.push(store.append_audit(&record(i)).await.unwrap());
    }
    store.close().await;
    db.drop_db().await;
    out
}

const SEED_A: [u8; 32] = [7; 32];
const SEED_B: [u8; 32] = [9; 32];

/// A valid chain of `n` records built without a database, exactly as appends build it.
fn mem_chain(n: usize) -> Vec<AuditRecord> {
    let mut prev = GENESIS.to_string();
    (0..n)
        .map(|i| {
            let new = record(i);
            let r = seal(
                SYSTEM_CHAIN,
                &new,
                new.event.unwrap(),
                i as i64 + 1,
                1_000 + i as i64,
                &prev,
            )
            .unwrap();
            prev.clone_from(&r.hash);
            r
        })
        .collect()
}

fn verify_pinned(
    records: &[AuditRecord],
    cps: &[Checkpoint],
    trusted: &[PublicKey],
) -> Result<i64, VerifyFailure> {
    let mut v = ChainVerifier::new(1, GENESIS);
    expect_checkpoints(
        &mut v,
        cps.iter().map(|c| (c, "test checkpoint".to_string())),
        trusted,
    )?;
    for r in records {
        v.push(r)?;
    }
    Ok(v.finish()?)
}

#[derive(Debug, Clone)]
enum Tamper {
    Byte { record: usize, at: usize },
    Delete(usize),
    Swap(usize, usize),
    Truncate(usize),
}

const N: usize = 12;

fn arb_tamper() -> impl Strategy<Value = Tamper> {
    prop_oneof![
        (0..N, 0usize..1000).prop_map(|(record, at)| Tamper::Byte { record, at }),
        (0..N).prop_map(Tamper::Delete),
        (0..N, 0..N)
            .prop_filter("two positions", |(a, b)| a != b)
            .prop_map(|(a, b)| Tamper::Swap(a.min(b), a.max(b))),
        (0..N).prop_map(Tamper::Truncate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]
    /// Change one byte, delete one, swap two, truncate the tail: verify against the signed
    /// head names the first broken record. Truncation (and deleting the last record) leaves
    /// a valid shorter chain, caught only through the checkpoint.
    #[test]
    fn every_tamper_is_named_at_its_first_broken_record(t in arb_tamper()) {
        let chain = mem_chain(N);
        let signer = CheckpointSigner::from_seed(&SEED_A);
        let cp = signer.sign(N as i64, &chain[N - 1].hash, 99).unwrap();
        let trusted = [signer.public_key()];
        prop_assert_eq!(verify_pinned(&chain, std::slice::from_ref(&cp), &trusted), Ok(N as i64));

        let mut tampered = chain.clone();
        let (first_broken, only_via_checkpoint) = match t {
            Tamper::Byte { record, at } => {
                let mut bytes = tampered[record].record.clone().into_bytes();
                let i = at % bytes.len();
                bytes[i] ^= 0x01;
                tampered[record].record = String::from_utf8_lossy(&bytes).into_owned();
                (record + 1, false)
            }
            Tamper::Delete(i) => {
                tampered.remove(i);
                (i + 1, i == N - 1)
            }
            Tamper::Swap(a, b) => {
                tampered.swap(a, b);
                (a + 1, false)
            }
            Tamper::Truncate(keep) => {
                tampered.truncate(keep);
                (keep + 1, true)
            }
        };
        let plain = verify(&tampered, 1, GENESIS);
        if only_via_checkpoint {
            prop_assert_eq!(plain, Ok(tampered.len() as i64));
        } else {
            prop_assert_eq!(plain.unwrap_err().seq, first_broken as i64);
        }
        match verify_pinned(&tampered, &[cp], &trusted) {
            Err(VerifyFailure::Chain(b)) => prop_assert_eq!(b.seq, first_broken as i64, "{}", b),
            other => prop_assert!(false, "expected a break, got {:?}", other),
        }
    }
}

fn flip_hex(text: &str, i: usize) -> String {
    let mut b = text.as_bytes().to_vec();
    b[i] = if b[i] == b'0' { b'1' } else { b'0' };
    String::from_utf8(b).unwrap()
}

#[test]
fn a_forged_or_foreign_checkpoint_is_refused() {
    let chain = mem_chain(5);
    let a = CheckpointSigner::from_seed(&SEED_A);
    let b = CheckpointSigner::from_seed(&SEED_B);
    let good = a.sign(5, &chain[4].hash, 42).unwrap();
    assert_eq!(good.check(&[a.public_key()]), Ok(()));
    assert_eq!(good.check(&[]), Ok(()));
    assert_eq!(
        verify_pinned(&chain, std::slice::from_ref(&good), &[a.public_key()]),
        Ok(5)
    );

    // A changed signature, or the same signature over another head or time.
    let mut forged = good.clone();
    forged.signature = flip_hex(&forged.signature, 10);
    assert_eq!(
        forged.check(&[a.public_key()]),
        Err(CheckpointError::BadSignature)
    );
    let mut moved = good.clone();
    moved.seq = 4;
    moved.hash.clone_from(&chain[3].hash);
    assert_eq!(moved.check(&[]), Err(CheckpointError::BadSignature));
    let mut retimed = good.clone();
    retimed.at += 1;
    assert_eq!(retimed.check(&[]), Err(CheckpointError::BadSignature));
    let mut garbled = good.clone();
    garbled.signature.truncate(20);
    assert!(matches!(
        garbled.check(&[]),
        Err(CheckpointError::Malformed(_))
    ));

    // Signed by another key: refused when a trusted key is given.
    let foreign = b.sign(5, &chain[4].hash, 42).unwrap();
    assert_eq!(
        foreign.check(&[a.public_key()]),
        Err(CheckpointError::UntrustedKey(b.public_key().to_string()))
    );
    // Another key's signature under the trusted key's name.
    let mut impostor = foreign.clone();
    impostor.public_key = a.public_key().to_string();
    assert_eq!(
        impostor.check(&[a.public_key()]),
        Err(CheckpointError::BadSignature)
    );
    // Through the verifier, a refused checkpoint fails the whole verification.
    match verify_pinned(&chain, &[foreign], &[a.public_key()]) {
        Err(VerifyFailure::Checkpoint {
            seq: 5,
            error: CheckpointError::UntrustedKey(_),
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    match verify_pinned(&chain, &[forged], &[]) {
        Err(VerifyFailure::Checkpoint {
            error: CheckpointError::BadSignature,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn keys_read_as_hex_or_base64_and_seeds_never_show() {
    use base64::Engine;
    let a = CheckpointSigner::from_seed(&SEED_A);
    let hex: String = SEED_A.iter().map(|b| format!("{b:02x}")).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(SEED_A);
    assert_eq!(
        CheckpointSigner::parse(&hex).unwrap().public_key(),
        a.public_key()
    );
    assert_eq!(
        CheckpointSigner::parse(&b64).unwrap().public_key(),
        a.public_key()
    );
    assert!(CheckpointSigner::parse("abcd").is_err());
    assert!(CheckpointSigner::parse(&hex[..62]).is_err());
    let shown = a.public_key().to_string();
    assert_eq!(PublicKey::parse(&shown).unwrap(), a.public_key());
    assert!(!format!("{a:?}").contains(&hex), "{a:?}");
    assert!(format!("{a:?}").contains(&shown));
}

/// Rewrites records `from..=to` in place (guards dropped) so that the chain still links.
async fn rewrite_and_rehash(store: &countersign_core::Store, chain: &[AuditRecord], from: usize) {
    let mut prev = chain[from - 2].hash.clone();
    for r in &chain[from - 1..] {
        let mut new = record(r.seq as usize - 1);
        new.detail
            .insert("inputs".into(), json!({"amount": 1, "iban": "attacker"}));
        let forged = seal(SYSTEM_CHAIN, &new, new.event.unwrap(), r.seq, r.at, &prev).unwrap();
        store
            .execute_sql(&format!(
                "UPDATE audit SET record = '{}', prev = '{}', hash = '{}' WHERE seq = {}",
                forged.record, forged.prev, forged.hash, r.seq
            ))
            .await
            .unwrap();
        prev = forged.hash;
    }
}

async fn drop_audit_guards(store: &countersign_core::Store) {
    let sql: &[&str] = match store.backend() {
        Backend::Sqlite => &[
            "DROP TRIGGER audit_no_update",
            "DROP TRIGGER audit_no_delete",
            "DROP TRIGGER audit_chains_forward_only",
        ],
        Backend::Postgres => &[
            "ALTER TABLE audit DISABLE TRIGGER audit_no_update",
            "ALTER TABLE audit_chains DISABLE TRIGGER audit_chains_forward_only",
        ],
    };
    for s in sql {
        store.execute_sql(s).await.unwrap();
    }
}

/// Sets chain `chain`'s head row (after [`drop_audit_guards`]): what someone covering their
/// tracks would do.
async fn set_head(store: &countersign_core::Store, chain: &str, seq: i64, hash: &str) {
    store
        .execute_sql(&format!(
            "UPDATE audit_chains SET seq = {seq}, hash = '{hash}' WHERE chain = '{chain}'"
        ))
        .await
        .unwrap();
}

#[tokio::test]
async fn checkpoints_are_signed_when_due_and_pin_the_stored_chain() {
    let (manual, clock) = test_clock();
    each_backend(clock, move |store| {
        let manual = manual.clone();
        async move {
            let a = CheckpointSigner::from_seed(&SEED_A);
            let policy = Some(CheckpointPolicy {
                every: 3,
                max_age_ms: 600_000,
            });
            assert_eq!(
                store.checkpoint_audit(&a, None).await.unwrap(),
                None,
                "no records"
            );
            let mut chain = Vec::new();
            for i in 0..2 {
                chain.push(store.append_audit(&record(i)).await.unwrap());
            }
            assert_eq!(
                store.checkpoint_audit(&a, policy).await.unwrap(),
                None,
                "not due"
            );
            chain.push(store.append_audit(&record(2)).await.unwrap());
            let first = store
                .checkpoint_audit(&a, policy)
                .await
                .unwrap()
                .expect("due by count");
            assert_eq!(first.number(), 1);
            assert_eq!(
                first.leaves,
                vec![Leaf {
                    chain: SYSTEM_CHAIN.into(),
                    seq: 3,
                    hash: chain[2].hash.clone()
                }]
            );
            first.note.verify(&[*a.public_key().key()]).unwrap();
            assert_eq!(
                store.checkpoint_audit(&a, policy).await.unwrap(),
                None,
                "nothing moved"
            );

            chain.push(store.append_audit(&record(3)).await.unwrap());
            manual.advance(chrono::Duration::milliseconds(599_999));
            assert_eq!(
                store.checkpoint_audit(&a, policy).await.unwrap(),
                None,
                "not old enough"
            );
            manual.advance(chrono::Duration::milliseconds(1));
            let second = store
                .checkpoint_audit(&a, policy)
                .await
                .unwrap()
                .expect("due by age");
            assert_eq!((second.number(), second.leaves[0].seq), (2, 4));
            assert_eq!(second.note.body.prev, first.note.body.hash(), "a log");
            // On demand, with nothing moved: that checkpoint.
            assert_eq!(
                store.checkpoint_audit(&a, None).await.unwrap(),
                Some(second.clone())
            );
            assert_eq!(
                store.tree_heads().await.unwrap(),
                vec![first.clone(), second.clone()]
            );

            let trusted = [a.public_key()];
            let report = store
                .verify_audit_full(&trusted, &[], &[], None)
                .await
                .unwrap()
                .unwrap();
            assert_eq!((report.records, report.checkpoints), (4, 2));
            let other = CheckpointSigner::from_seed(&SEED_B).public_key();
            assert!(matches!(
                store
                    .verify_audit_full(&[other], &[], &[], None)
                    .await
                    .unwrap(),
                Err(VerifyFailure::Log { number: 1, .. })
            ));

            // The checkpoint tables are append-only too.
            for sql in [
                "UPDATE audit_tree_heads SET at = 0",
                "DELETE FROM audit_tree_heads",
                "UPDATE audit_tree_leaves SET seq = 0",
                "DELETE FROM audit_tree_leaves",
            ] {
                let err = store.execute_sql(sql).await.unwrap_err();
                assert!(err.to_string().contains("append-only"), "{sql}: {err}");
            }
            if store.backend() == Backend::Postgres {
                for t in ["audit_tree_heads", "audit_tree_leaves", "audit_chains"] {
                    let err = store
                        .execute_sql(&format!("TRUNCATE {t}"))
                        .await
                        .unwrap_err();
                    assert!(err.to_string().contains("refused"), "{t}: {err}");
                }
                // And nobody holds UPDATE/DELETE/TRUNCATE through PUBLIC.
                let n = store
                    .execute_sql(
                        "SELECT 1 FROM information_schema.role_table_grants \
                         WHERE grantee = 'PUBLIC' AND table_name IN ('audit', \
                         'audit_checkpoints', 'audit_tree_heads', 'audit_tree_leaves') \
                         AND privilege_type IN ('UPDATE', 'DELETE', 'TRUNCATE')",
                    )
                    .await
                    .unwrap();
                assert_eq!(n, 0);
            }

            // Someone with DDL rights cuts the tail and moves the head back: the chain alone
            // still verifies, the checkpoint for record 4 names the first missing record.
            drop_audit_guards(&store).await;
            store
                .execute_sql("DELETE FROM audit WHERE seq = 4")
                .await
                .unwrap();
            match store.verify_audit().await.unwrap() {
                Err(b) => assert!(b.reason.contains("truncated"), "the head row: {b}"),
                other => panic!("{other:?}"),
            }
            set_head(&store, SYSTEM_CHAIN, 3, &chain[2].hash).await;
            assert_eq!(store.verify_audit().await.unwrap(), Ok(3));
            match store
                .verify_audit_full(&trusted, &[], &[], None)
                .await
                .unwrap()
            {
                Err(VerifyFailure::Chain(b)) => {
                    assert_eq!(b.seq, 4, "{b}");
                    assert!(b.reason.contains("truncated"), "{b}");
                }
                other => panic!("{other:?}"),
            }
            // …then rewrites record 2 and re-hashes record 3: caught at the checkpoint for 3.
            rewrite_and_rehash(&store, &chain[..3], 2).await;
            let rehashed = store.audit_record(SYSTEM_CHAIN, 3).await.unwrap().unwrap();
            set_head(&store, SYSTEM_CHAIN, 3, &rehashed.hash).await;
            assert_eq!(store.verify_audit().await.unwrap(), Ok(3));
            match store
                .verify_audit_full(&trusted, &[], &[], None)
                .await
                .unwrap()
            {
                Err(VerifyFailure::Chain(b)) => {
                    assert_eq!(b.seq, 1, "{b}");
                    assert!(
                        b.reason.contains("record 3") && b.reason.contains("rewritten"),
                        "{b}"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    })
    .await;
}

#[tokio::test]
async fn the_redaction_key_fingerprint_is_recorded_on_first_use_and_rotation() {
    use countersign_core::redact::RedactionKey;
    let key =
        |text: &str| RedactionKey::from_secret(Secret::new(text.as_bytes().to_vec())).unwrap();
    let a = key("an operator's redaction key, 32+ bytes long");
    let b = key("another operator's redaction key, 32+ bytes");
    assert_eq!(
        a.fingerprint(),
        key("an operator's redaction key, 32+ bytes long").fingerprint()
    );
    assert_ne!(a.fingerprint(), b.fingerprint());
    assert!(a.fingerprint().starts_with("hmac-sha256:"));
    assert!(a.id().as_str().starts_with("rk-"));
    assert!(RedactionKey::from_secret(Secret::new(b"short".to_vec())).is_err());
    // The fingerprint is not the digest of any value (a value's canonical form is quoted).
    assert_ne!(
        a.digest(&json!("countersign.redaction-key.fingerprint.v1"))
            .unwrap(),
        a.fingerprint()
    );

    let (_, clock) = test_clock();
    each_backend(clock, move |store| {
        let (a, b) = (a.clone(), b.clone());
        async move {
            let record = |k: &RedactionKey| {
                let store = store.clone();
                let (fp, id) = (k.fingerprint(), k.id().to_string());
                async move { store.record_redaction_key(&fp, &id, "test").await.unwrap() }
            };
            let first = record(&a).await.expect("first key recorded");
            assert_eq!(first.event, "operational");
            assert!(first.record.contains(&a.fingerprint()));
            assert!(first.record.contains(r#""kind":"redaction_key""#));
            assert!(record(&a).await.is_none(), "same key: nothing new");
            store.append_audit(&record_n(7)).await.unwrap();
            let rotated = record(&b).await.expect("rotation recorded");
            assert!(
                rotated
                    .record
                    .contains(&format!(r#""previous":"{}""#, a.fingerprint()))
            );
            assert!(
                record(&a).await.is_some(),
                "rotating back is a rotation too"
            );
            assert_eq!(
                store.last_redaction_key_fingerprint().await.unwrap(),
                Some(a.fingerprint())
            );
            assert_eq!(store.verify_audit().await.unwrap(), Ok(4));
        }
    })
    .await;
}

fn record_n(i: usize) -> NewAuditRecord {
    record(i)
}

/// Group commit: two stores on one database (two committers, as two processes have) race
/// transitions of the same steps while appending records. Every step moves exactly once,
/// each winner's records are in the chain, and the chain verifies.
#[tokio::test]
async fn racing_transitions_across_committers_move_each_step_once() {
    use countersign_core::canonical::CanonicalJson;
    use countersign_core::model::{Effect, StepStatus};
    use countersign_core::store::testing::FreshDb;
    use countersign_core::store::{NewRun, NewStep, Transition};

    let (_, clock) = test_clock();
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(db) = FreshDb::create(backend).await else {
            continue;
        };
        let a = db.store(clock.clone()).await;
        let b = db.store(clock.clone()).await;
        let run = a
            .create_run(&NewRun {
                tenant: "acme".into(),
                principal: "user:1".into(),
                agent_id: None,
                task: "race".into(),
                origin: "user".into(),
                planned: true,
            })
            .await
            .unwrap();
        let mut steps = Vec::new();
        for i in 0..12 {
            let (step, _) = a
                .open_step(&NewStep {
                    run_id: run.id.clone(),
                    role: "worker".into(),
                    tool: "note.draft".into(),
                    effect: Effect::Write,
                    inputs: CanonicalJson::from_value(&json!({"n": i})).unwrap(),
                    agent_id: None,
                    reason: String::new(),
                    evidence: vec![],
                    observed: None,
                    trace_id: "t".into(),
                    status: StepStatus::Pending,
                })
                .await
                .unwrap();
            steps.push(step.id);
        }
        let mut tasks = Vec::new();
        for contender in 0..6 {
            for (i, id) in steps.iter().enumerate() {
                let store = if contender % 2 == 0 {
                    a.clone()
                } else {
                    b.clone()
                };
                let id = id.clone();
                tasks.push(tokio::spawn(async move {
                    let mut started = record(i);
                    started.step_id = Some(id.clone());
                    let moved = store
                        .transition(&Transition {
                            step_id: id,
                            from: vec![StepStatus::Pending],
                            to: Some(StepStatus::Running),
                            bump_attempts: true,
                            records: vec![
                                (AuditEvent::Started, started.clone()),
                                (AuditEvent::Decided, started),
                            ],
                            ..Transition::default()
                        })
                        .await
                        .unwrap();
                    store.append_audit(&record(100 + i)).await.unwrap();
                    moved.is_some()
                }));
            }
        }
        let mut winners = 0;
        for t in tasks {
            winners += usize::from(t.await.unwrap());
        }
        assert_eq!(winners, steps.len(), "{backend:?}: each step moves once");
        for id in &steps {
            let s = a.get_step(id).await.unwrap();
            assert_eq!(
                (s.status, s.attempts),
                (StepStatus::Running, 1),
                "{backend:?}"
            );
        }
        // 12 winners × 2 records + 72 lone appends.
        let total = 12 * 2 + 72;
        assert_eq!(a.verify_audit().await.unwrap(), Ok(total), "{backend:?}");
        let records = a.audit_in_order(0, 1000).await.unwrap();
        for id in &steps {
            let mine: Vec<_> = records
                .iter()
                .filter(|r| r.step_id.as_deref() == Some(id.as_str()))
                .collect();
            assert_eq!(mine.len(), 2, "{backend:?}: the winner's two records");
            assert_eq!(
                mine[1].seq,
                mine[0].seq + 1,
                "{backend:?}: a job's records are contiguous"
            );
        }
        a.close().await;
        b.close().await;
        db.drop_db().await;
    }
}

/// Issue 34's ablation switch: with the one-trip statement turned off, every batch takes the
/// multi-statement path; with it on, a batch sealed on the head the committer knows goes in
/// one trip. Either way every transition and record commits, chained.
#[tokio::test]
async fn the_one_trip_ablation_leaves_the_multi_statement_path_and_loses_nothing() {
    use countersign_core::model::{Effect, StepStatus};
    use countersign_core::store::testing::FreshDb;
    use countersign_core::store::{Ablations, ConnectOptions, Store, Transition};

    let (_, clock) = test_clock();
    for list in ["", "one_trip"] {
        let ablations = Ablations::parse(list).unwrap();
        let Some(db) = FreshDb::create(Backend::Postgres).await else {
            return;
        };
        let options = ConnectOptions {
            ablations,
            ..ConnectOptions::default()
        };
        let store = Store::connect(&db.url, &options, clock.clone())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let run = store
            .create_run(&crate::store::new_run("acme"))
            .await
            .unwrap();
        let (step, _) = store
            .open_step(&crate::store::new_step(&run.id, Effect::Write, 1))
            .await
            .unwrap();
        let mut started = record(1);
        started.step_id = Some(step.id.clone());
        let taken = Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending],
            to: Some(StepStatus::Running),
            records: vec![(AuditEvent::Started, started.clone())],
            ..Transition::default()
        };
        assert!(store.move_step(&taken).await.unwrap(), "{list:?}");
        for i in 2..6 {
            store.append_audit(&record(i)).await.unwrap();
        }
        let closed = Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Running],
            to: Some(StepStatus::Done),
            records: vec![(AuditEvent::Succeeded, started)],
            ..Transition::default()
        };
        assert!(store.move_step(&closed).await.unwrap(), "{list:?}");
        assert_eq!(
            store.one_trip_batches() == 0,
            ablations.no_one_trip,
            "{list:?}: one-trip batches {}",
            store.one_trip_batches()
        );
        assert_eq!(
            store.get_step(&step.id).await.unwrap().status,
            StepStatus::Done,
            "{list:?}"
        );
        assert_eq!(store.verify_audit().await.unwrap(), Ok(6), "{list:?}");
        store.close().await;
        db.drop_db().await;
    }
    assert!(Ablations::parse("one_trip, pipeline").is_err());
    assert_eq!(Ablations::parse("").unwrap(), Ablations::default());
}

/// The chain pushed one record at a time (no precomputed checks): the reference.
fn verify_one_by_one(records: &[AuditRecord]) -> Result<i64, countersign_core::audit::ChainBreak> {
    let mut v = ChainVerifier::new(1, GENESIS);
    for r in records {
        v.push(r)?;
    }
    v.finish()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]
    /// Parallel verify (chunks of a chain long enough to be split over 2–4 threads) names the
    /// same first break, with the same reason, as pushing each record in turn: a changed
    /// byte, a deleted record, two swapped records, or a record re-sealed in place (so it is
    /// consistent with itself and only its successor's link breaks), anywhere, including at
    /// chunk edges.
    #[test]
    fn parallel_verify_names_the_same_first_break_as_sequential(
        kind in 0u8..4,
        at in 0usize..LONG,
        other in 0usize..LONG,
        byte in 0usize..1000,
        threads in 2usize..5,
    ) {
        let chain = long_chain();
        let mut t = chain.to_vec();
        match kind {
            0 => {
                let mut bytes = t[at].record.clone().into_bytes();
                let i = byte % bytes.len();
                bytes[i] ^= 0x01;
                t[at].record = String::from_utf8_lossy(&bytes).into_owned();
            }
            1 => {
                t.remove(at);
            }
            2 => {
                if at != other {
                    t.swap(at, other);
                }
            }
            _ => {
                let mut new = record(at);
                new.actor = Some("someone else".into());
                t[at] = seal(SYSTEM_CHAIN, &new, new.event.unwrap(), at as i64 + 1, 1_000 + at as i64, &t[at].prev)
                    .unwrap();
            }
        }
        let reference = verify_one_by_one(&t);
        prop_assert_eq!(verify_with_threads(&t, 1, GENESIS, threads), reference.clone());
        prop_assert_eq!(verify_with_threads(&t, 1, GENESIS, 1), reference.clone());
        prop_assert_eq!(verify(&t, 1, GENESIS), reference.clone());
        // Unnoticeable: swapping a record with itself; deleting or re-sealing the last one
        // (a shorter or different but intact chain: only a checkpoint catches those).
        let intact = (kind == 2 && at == other) || (matches!(kind, 1 | 3) && at == LONG - 1);
        if !intact {
            prop_assert!(reference.is_err(), "tamper {} at {} went unnoticed", kind, at);
        }
    }
}

/// Long enough that verify splits it over several threads.
const LONG: usize = 4 * 2_048 + 17;

fn long_chain() -> &'static [AuditRecord] {
    static CHAIN: std::sync::OnceLock<Vec<AuditRecord>> = std::sync::OnceLock::new();
    CHAIN.get_or_init(|| mem_chain(LONG))
}

#[test]
fn parallel_verify_accepts_an_intact_long_chain() {
    let chain = long_chain();
    for threads in [1, 2, 3, 8] {
        assert_eq!(
            verify_with_threads(chain, 1, GENESIS, threads),
            Ok(LONG as i64)
        );
    }
}

/// Every batch is answered only after a durable commit, so the store's sessions commit
/// synchronously even on a database whose default is `synchronous_commit = off` (a URL's own
/// `options` may still set it).
#[tokio::test]
async fn the_store_commits_synchronously_whatever_the_database_default() {
    use countersign_core::store::testing::FreshDb;
    use sqlx::Connection;

    let (_, clock) = test_clock();
    let Some(db) = FreshDb::create(Backend::Postgres).await else {
        return;
    };
    let mut conn = sqlx::PgConnection::connect(db.url.expose()).await.unwrap();
    sqlx::query(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = off', \
         current_database()); END $$",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let _ = conn.close().await;
    let mut plain = sqlx::PgConnection::connect(db.url.expose()).await.unwrap();
    let default: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&mut plain)
        .await
        .unwrap();
    assert_eq!(default, "off", "the database's own default");
    let _ = plain.close().await;
    let store = db.store(clock.clone()).await;
    assert_eq!(
        store
            .query_strings("SHOW synchronous_commit")
            .await
            .unwrap(),
        vec!["on".to_string()]
    );
    store.append_audit(&record(1)).await.unwrap();
    store.close().await;
    db.drop_db().await;
}

/// Sessions the server ends under the store (an administrator's `pg_terminate_backend`, a
/// restart) are given up and replaced: appends work again once the pools have noticed (after
/// a pause, as a restart takes), no answered append is missing from the chain, and the chain
/// holds. Guards any change that keeps connections out of the pool between batches.
#[tokio::test]
async fn sessions_ended_under_the_store_are_replaced() {
    use countersign_core::store::testing::FreshDb;
    use sqlx::Connection;

    let (_, clock) = test_clock();
    let Some(db) = FreshDb::create(Backend::Postgres).await else {
        return;
    };
    let store = db.store(clock).await;
    let mut admin = sqlx::PgConnection::connect(db.url.expose()).await.unwrap();
    // Every other session of this database ends (the store's pooled, idle connections).
    let end_sessions = async |admin: &mut sqlx::PgConnection| {
        let ended: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()) ended",
        )
        .fetch_one(admin)
        .await
        .unwrap();
        assert!(ended >= 1, "the store's sessions were open");
    };
    let pause = || tokio::time::sleep(std::time::Duration::from_millis(1_100));
    append_concurrently(&store, 24).await;
    // Ended while idle, then a pause (a restart takes one): the next appends all succeed, as
    // connections idle that long are tested before use.
    end_sessions(&mut admin).await;
    pause().await;
    append_concurrently(&store, 24).await;
    // Ended right after a burst: an append at once may fail (a connection that broke fails
    // its statement); an answered one is in the chain.
    append_concurrently(&store, 24).await;
    end_sessions(&mut admin).await;
    let mut answered: i64 = 0;
    for i in 0..24 {
        if store.append_audit(&record(i)).await.is_ok() {
            answered += 1;
        }
    }
    pause().await;
    append_concurrently(&store, 24).await;
    let chained = store.verify_audit().await.unwrap().unwrap();
    assert!(
        (96 + answered..=120).contains(&chained),
        "{chained} records chained, {answered} answered after the sessions ended"
    );
    let _ = admin.close().await;
    store.close().await;
    db.drop_db().await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]
    /// Checkpoints on the parallel path: a signed hash expected at any `seq` (the right one, a
    /// wrong one, or one past the end), with the chain intact or one record tampered with,
    /// gives the same verdict through `push_all` on several threads as record by record.
    #[test]
    fn parallel_verify_checks_checkpoints_as_sequential(
        at in 1usize..LONG + 2,
        right in any::<bool>(),
        tamper in prop::option::of(0usize..LONG),
        threads in 1usize..5,
    ) {
        let chain = long_chain();
        let mut t = chain.to_vec();
        if let Some(i) = tamper {
            t[i].hash = GENESIS.to_string();
        }
        let hash = match chain.get(at - 1) {
            Some(r) if right => r.hash.clone(),
            _ => GENESIS.to_string(),
        };
        let expecting = |threads: usize| {
            let mut v = ChainVerifier::new(1, GENESIS).threads(threads);
            v.expect(at as i64, &hash, "checkpoint").unwrap();
            v
        };
        let mut one = expecting(1);
        let reference = t.iter().try_for_each(|r| one.push(r)).and_then(|()| one.finish());
        let mut all = expecting(threads);
        let parallel = all.push_all(&t).and_then(|()| all.finish());
        prop_assert_eq!(parallel, reference);
    }
}

/// Column text for the layout property test: plain text, and the bytes that force escapes
/// or could confuse a reader of the frame (quotes, backslashes, control bytes, member-like
/// fragments, non-ASCII).
fn arb_column() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(prop_oneof![
        "[a-z0-9._/-]{0,12}",
        "[a-z\"\\\\\u{1}\u{1f}é,:{}]{0,8}",
        Just(r#"x","rule":null"#.to_string()),
        Just("\n".to_string()),
    ])
}

fn arb_int() -> impl Strategy<Value = i64> {
    prop_oneof![
        0i64..5_000,
        1_781_170_937_000i64..1_781_170_938_000,
        Just(-7i64),
        Just(9_007_199_254_740_991i64),
        Just(9_007_199_254_740_992i64),
        Just(i64::MAX),
        Just(i64::MIN),
    ]
}

/// An edit made to a sealed record before it is checked (the hash is recomputed, so only
/// the text checks decide).
#[derive(Debug, Clone)]
enum Edit {
    None,
    Byte(usize, u8),
    Insert(usize, &'static str),
    Delete(usize),
    Seq(i64),
    At(i64),
    Event(String),
    Actor(Option<String>),
    Tool(Option<String>),
    Prev(String),
    /// The actor column set to this text, and the hashed text's actor written as that text
    /// between quotes, unescaped (invalid or non-canonical unless it is plain).
    RawActor(String),
    /// The seq column and the hashed text's seq both set to this integer, written as its
    /// plain digits (not canonical beyond ±(2^53 − 1) where JCS writes another number).
    RawSeq(i64),
}

fn arb_edit() -> impl Strategy<Value = Edit> {
    let byte = prop_oneof![
        Just(b' '),
        Just(b'"'),
        Just(b'\\'),
        Just(b'0'),
        Just(b'-'),
        Just(b'}'),
        Just(b','),
        Just(b'a'),
        Just(0x01u8),
    ];
    let snippet = prop_oneof![
        Just(" "),
        Just("0"),
        Just(",\"a\":1"),
        Just("\\u0041"),
        Just("{}"),
        Just("null,"),
        Just("\"\""),
    ];
    prop_oneof![
        Just(Edit::None),
        (0usize..2_000, byte).prop_map(|(i, b)| Edit::Byte(i, b)),
        (0usize..2_000, snippet).prop_map(|(i, s)| Edit::Insert(i, s)),
        (0usize..2_000).prop_map(Edit::Delete),
        arb_int().prop_map(Edit::Seq),
        arb_int().prop_map(Edit::At),
        "[a-z_\"]{0,6}".prop_map(Edit::Event),
        arb_column().prop_map(Edit::Actor),
        arb_column().prop_map(Edit::Tool),
        "[a-z0-9:\\\\]{0,8}".prop_map(Edit::Prev),
        "[a-z\"\\\\\u{1}\n]{1,6}".prop_map(Edit::RawActor),
        prop_oneof![
            arb_int(),
            Just(9_007_199_254_740_993i64),
            Just(-9_007_199_254_740_993i64)
        ]
        .prop_map(Edit::RawSeq),
    ]
}

fn arb_detail() -> impl Strategy<Value = serde_json::Map<String, serde_json::Value>> {
    let leaf = prop_oneof![
        Just(json!(null)),
        any::<bool>().prop_map(|b| json!(b)),
        (-1_000_000i64..1_000_000).prop_map(|n| json!(n)),
        (-1.0e6f64..1.0e6).prop_map(|f| json!(f)),
        "[a-z\"\\\\\u{1}é ]{0,8}".prop_map(|s| json!(s)),
    ];
    let value = leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map("[a-z_é]{0,5}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    });
    proptest::collection::btree_map("[a-z_]{1,6}", value, 0..4)
        .prop_map(|m| m.into_iter().collect())
}

fn apply(r: &mut AuditRecord, edit: &Edit) {
    let mut bytes = r.record.clone().into_bytes();
    match edit {
        Edit::None => {}
        Edit::Byte(i, b) => {
            let i = i % bytes.len();
            bytes[i] = *b;
        }
        Edit::Insert(i, s) => {
            let i = i % (bytes.len() + 1);
            bytes.splice(i..i, s.bytes());
        }
        Edit::Delete(i) => {
            bytes.remove(i % bytes.len());
        }
        Edit::Seq(v) => r.seq = *v,
        Edit::At(v) => r.at = *v,
        Edit::Event(e) => r.event.clone_from(e),
        Edit::Actor(a) => r.actor.clone_from(a),
        Edit::Tool(t) => r.tool.clone_from(t),
        Edit::Prev(p) => r.prev.clone_from(p),
        Edit::RawActor(a) => {
            // Quotes inside the sealed actor are escaped, so the first raw `,"at":` ends it.
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let rest = text.find(",\"at\":").map_or("", |i| &text[i..]);
            bytes = format!("{{\"actor\":\"{a}\"{rest}").into_bytes();
            r.actor = Some(a.clone());
        }
        Edit::RawSeq(v) => {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            if let Some(i) = text.find(",\"seq\":") {
                let digits = i + 7;
                let end = text[digits..].find(',').map_or(text.len(), |e| digits + e);
                bytes = format!("{}{v}{}", &text[..digits], &text[end..]).into_bytes();
                r.seq = *v;
            }
        }
    }
    r.record = String::from_utf8_lossy(&bytes).into_owned();
    r.hash = countersign_core::audit::hash_text(&r.record);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, .. ProptestConfig::default() })]
    /// The layout fast path of the per-record check (a record in `seal`'s layout matched
    /// against its own columns, only `detail` scanned) never accepts a record the general
    /// canonical scan refuses: random columns (escapes, control bytes, member-like text,
    /// integers past 2^53), random details, then a random edit to the text or a column
    /// with the hash recomputed. So verify with the fast path decides exactly as without it.
    #[test]
    fn the_layout_fast_path_never_accepts_what_the_general_check_refuses(
        actor in arb_column(),
        tool in arb_column(),
        run_id in arb_column(),
        step_id in arb_column(),
        rule in arb_column(),
        detail in arb_detail(),
        seq in arb_int(),
        at in arb_int(),
        edit in arb_edit(),
    ) {
        let new = NewAuditRecord {
            event: Some(AuditEvent::Proposed),
            run_id,
            step_id,
            tool,
            actor,
            rule,
            detail,
            tenant: None,
        };
        // Integers JCS cannot write exactly have no sealed form at all.
        let Ok(mut r) = seal(SYSTEM_CHAIN, &new, AuditEvent::Proposed, seq, at, GENESIS) else {
            return Ok(());
        };
        let (fast, general) = countersign_core::audit::fast_and_general(&r, &r.prev);
        prop_assert_eq!(&general, &Ok(()), "a sealed record passes the general check");
        let plain = |c: &Option<String>| {
            c.as_deref().is_none_or(|s| !s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20))
        };
        let expect_fast = [&r.actor, &r.tool, &r.run_id, &r.step_id, &r.rule].into_iter().all(plain)
            && seq.unsigned_abs() < 1 << 53
            && at.unsigned_abs() < 1 << 53;
        prop_assert_eq!(fast, expect_fast, "the fast path takes every plain sealed record");

        apply(&mut r, &edit);
        let prev = r.prev.clone();
        let (fast, general) = countersign_core::audit::fast_and_general(&r, &prev);
        if fast {
            prop_assert_eq!(general, Ok(()), "fast path accepted {:?} after {:?}", r.record, edit);
        }
        // And verify (which uses the fast path) says what the general check says.
        let verified = verify(std::slice::from_ref(&r), r.seq, &prev);
        prop_assert_eq!(verified.is_ok(), countersign_core::audit::fast_and_general(&r, &prev).1.is_ok());
    }
}

#[test]
fn records_with_escaped_columns_still_verify_through_the_general_check() {
    let mut new = record(0);
    new.actor = Some("agent \"quoted\"\n".into());
    new.rule = None;
    let r = seal(SYSTEM_CHAIN, &new, AuditEvent::Proposed, 1, 1_000, GENESIS).unwrap();
    assert_eq!(
        countersign_core::audit::fast_and_general(&r, GENESIS),
        (false, Ok(()))
    );
    assert_eq!(verify(std::slice::from_ref(&r), 1, GENESIS), Ok(1));
    // The column differs from the hashed text by one escape: refused, and named.
    let mut relabelled = r.clone();
    relabelled.actor = Some("agent \"quoted\"".into());
    let err = verify(std::slice::from_ref(&relabelled), 1, GENESIS).unwrap_err();
    assert_eq!(err.reason, "columns disagree with the hashed record");
}

/// SQL inserting `r` as it stands (every column).
fn insert_sql(r: &AuditRecord) -> String {
    let text = |v: &Option<String>| v.as_ref().map_or("NULL".into(), |s| format!("'{s}'"));
    format!(
        "INSERT INTO audit (chain, seq, at, event, run_id, step_id, tool, actor, rule, record, \
         prev, hash) VALUES ('{}', {}, {}, '{}', {}, {}, {}, {}, {}, '{}', '{}', '{}')",
        r.chain,
        r.seq,
        r.at,
        r.event,
        text(&r.run_id),
        text(&r.step_id),
        text(&r.tool),
        text(&r.actor),
        text(&r.rule),
        r.record.replace('\'', "''"),
        r.prev,
        r.hash
    )
}

#[tokio::test]
async fn a_record_stored_below_record_one_is_refused_and_never_verifies() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        for i in 0..3 {
            store.append_audit(&record(i)).await.unwrap();
        }
        // A backdated "approved", correctly sealed as a chain of its own, at seq 0.
        let forged = NewAuditRecord {
            event: Some(AuditEvent::Approved),
            actor: Some("person:https://idp.example#ana".into()),
            ..record(0)
        };
        let forged = seal(SYSTEM_CHAIN, &forged, AuditEvent::Approved, 0, 1, GENESIS).unwrap();
        assert!(
            store.execute_sql(&insert_sql(&forged)).await.is_err(),
            "the database refuses a record below seq 1"
        );
        assert_eq!(store.verify_audit().await.unwrap(), Ok(3));
        // Someone able to change the schema drops that guard: verification still refuses the
        // store, though records 1..=3 form an intact chain.
        let unguard: &[&str] = match store.backend() {
            Backend::Sqlite => &["DROP TRIGGER audit_extend_head"],
            Backend::Postgres => &[
                "ALTER TABLE audit DROP CONSTRAINT audit_seq_positive",
                "ALTER TABLE audit DISABLE TRIGGER audit_extend_heads",
            ],
        };
        for sql in unguard {
            store.execute_sql(sql).await.unwrap();
        }
        // (SQLite's CHECK is part of the table: ignored for this one connection.)
        let insert = match store.backend() {
            Backend::Sqlite => format!(
                "PRAGMA ignore_check_constraints = ON; {}; PRAGMA ignore_check_constraints = OFF",
                insert_sql(&forged)
            ),
            Backend::Postgres => insert_sql(&forged),
        };
        store.execute_sql(&insert).await.unwrap();
        let broken = store.verify_audit().await.unwrap().unwrap_err();
        assert_eq!(broken.seq, 0);
        assert!(
            broken.reason.contains("outside the chain"),
            "{}",
            broken.reason
        );
        assert!(
            store
                .verify_audit_full(&[], &[], &[], None)
                .await
                .unwrap()
                .is_err(),
            "the full verification refuses it too"
        );
    })
    .await;
}

#[tokio::test]
async fn a_checkpoint_request_never_extends_a_log_it_did_not_sign() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let a = CheckpointSigner::from_seed(&SEED_A);
        let b = CheckpointSigner::from_seed(&SEED_B);
        for i in 0..4 {
            store.append_audit(&record(i)).await.unwrap();
        }
        // Another key's checkpoint is the newest stored.
        let theirs = store.checkpoint_audit(&b, None).await.unwrap().unwrap();
        store.append_audit(&record(4)).await.unwrap();
        assert!(store.checkpoint_audit(&a, None).await.is_err(), "not ours");
        // The background signer does not take it as "nothing due" either.
        let policy = Some(CheckpointPolicy {
            every: 1,
            max_age_ms: 0,
        });
        assert!(store.checkpoint_audit(&a, policy).await.is_err());
        // And the log verifies only under the key that signed it.
        assert!(matches!(
            store
                .verify_audit_full(&[a.public_key()], &[], &[], None)
                .await
                .unwrap(),
            Err(VerifyFailure::Log { number: 1, .. })
        ));
        assert_eq!(theirs.number(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_checkpoint_is_refused_once_a_chain_it_covers_fell_behind() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let a = CheckpointSigner::from_seed(&SEED_A);
        let mut chain = Vec::new();
        for i in 0..4 {
            chain.push(store.append_audit(&record(i)).await.unwrap());
        }
        store.checkpoint_audit(&a, None).await.unwrap().unwrap();
        // The tail is cut and the head moved back: signing over it would bless the cut.
        drop_audit_guards(&store).await;
        store
            .execute_sql("DELETE FROM audit WHERE seq = 4")
            .await
            .unwrap();
        set_head(&store, SYSTEM_CHAIN, 3, &chain[2].hash).await;
        let err = store.checkpoint_audit(&a, None).await.unwrap_err();
        assert!(err.to_string().contains("no longer reaches"), "{err}");
    })
    .await;
}

#[tokio::test]
async fn a_checkpoint_request_returns_the_newest_when_nothing_moved() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let a = CheckpointSigner::from_seed(&SEED_A);
        for i in 0..3 {
            store.append_audit(&record(i)).await.unwrap();
        }
        let first = store.checkpoint_audit(&a, None).await.unwrap().unwrap();
        let again = store.checkpoint_audit(&a, None).await.unwrap().unwrap();
        assert_eq!(first, again, "signed once; asking again returns it");
        assert_eq!(first.leaves[0].seq, 3);
    })
    .await;
}

/// A TCP proxy to `target` whose connections can all be cut at once: the client's socket
/// closes; the server's session lives on until it next writes to its own.
struct CuttableProxy {
    addr: std::net::SocketAddr,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl CuttableProxy {
    async fn start(target: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let held = conns.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let target = target.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                held.lock().unwrap().push(task.abort_handle());
            }
        });
        Self { addr, conns }
    }

    fn cut(&self) {
        for conn in self.conns.lock().unwrap().drain(..) {
            conn.abort();
        }
    }
}

/// A one-trip batch whose connection breaks while the server still holds its statement
/// (waiting for the append lock another session holds) commits after the client saw the
/// error. It must be answered "outcome unknown" and never retried: a retry would append its
/// record a second time once the lock is free.
#[tokio::test]
async fn a_one_trip_batch_cut_off_while_waiting_is_never_written_twice() {
    use countersign_core::store::testing::FreshDb;
    use countersign_core::store::{ConnectOptions, Store, StoreError};
    use sqlx::Connection;

    let (_, clock) = test_clock();
    let Some(db) = FreshDb::create(Backend::Postgres).await else {
        return;
    };
    db.store(clock.clone()).await.close().await; // migrated
    // The store reaches Postgres through the proxy.
    let url = db.url.expose();
    let (head, rest) = url.split_once('@').unwrap();
    let (server, path) = rest.split_once('/').unwrap();
    let proxy = CuttableProxy::start(server.to_string()).await;
    let proxied = Secret::new(format!("{head}@{}/{path}", proxy.addr));
    let store = Store::connect(&proxied, &ConnectOptions::default(), clock)
        .await
        .unwrap();
    let mut admin = sqlx::PgConnection::connect(url).await.unwrap();

    // The first append reads the chain head; the next goes in one trip.
    store.append_audit(&record(0)).await.unwrap();
    let trips = store.one_trip_batches();
    store.append_audit(&record(1)).await.unwrap();
    assert_eq!(
        store.one_trip_batches(),
        trips + 1,
        "one trip once the head is known"
    );

    let before = store.verify_audit().await.unwrap().unwrap();
    // Another session holds the chain's head row.
    let mut holder = sqlx::PgConnection::connect(url).await.unwrap();
    let mut held = holder.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM audit_chains WHERE chain = $1 FOR UPDATE")
        .bind(SYSTEM_CHAIN)
        .execute(&mut *held)
        .await
        .unwrap();
    let mut marked = record(2);
    marked.actor = Some("cut-off".into());
    let append = tokio::spawn({
        let store = store.clone();
        async move { store.append_audit(&marked).await }
    });
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND wait_event_type = 'Lock' AND query LIKE '%countersign_commit_batch%'";
    let mut tries = 0;
    while sqlx::query_scalar::<_, i64>(waiting)
        .fetch_one(&mut admin)
        .await
        .unwrap()
        == 0
    {
        tries += 1;
        assert!(
            tries < 500,
            "the one-trip statement never waited for the lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    proxy.cut();
    let answer = append.await.unwrap();
    assert!(
        matches!(answer, Err(StoreError::OutcomeUnknown(_))),
        "answered {answer:?}"
    );
    // The lock is freed: the cut-off statement commits at the server; nothing else follows.
    held.commit().await.unwrap();
    let busy = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                AND pid <> pg_backend_pid() AND state = 'active' \
                AND query LIKE '%countersign_commit_batch%'";
    while sqlx::query_scalar::<_, i64>(busy)
        .fetch_one(&mut admin)
        .await
        .unwrap()
        > 0
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let copies: i64 = sqlx::query_scalar("SELECT count(*) FROM audit WHERE actor = 'cut-off'")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    // It did commit after its client gave up (the case a retry would have doubled).
    assert_eq!(copies, 1, "the cut-off record written {copies} times");
    // The store goes on (new connections through the proxy; a pooled connection the cut broke
    // fails the one statement that finds it so, as any broken connection does); the chain
    // holds.
    let mut appended = Err(StoreError::NotFound);
    for _ in 0..4 {
        appended = store.append_audit(&record(3)).await;
        if appended.is_ok() {
            break;
        }
    }
    appended.unwrap();
    assert_eq!(store.verify_audit().await.unwrap(), Ok(before + 2));
    let _ = admin.close().await;
    store.close().await;
    db.drop_db().await;
}

/// One round trip (Postgres): once the committer knows the chain head, a batch of transitions
/// is written by one statement — the same rows and chain as the multi-statement path. A batch
/// refused because another process moved the head is sealed again on the head the refusal
/// names and goes in one trip again; one it cannot write that way (a transition that does not
/// move) writes nothing there and lands by the long path; the chain stays whole.
#[tokio::test]
async fn committer_batches_go_in_one_round_trip_and_fall_back_whole() {
    use countersign_core::model::{Effect, StepStatus};
    use countersign_core::store::testing::FreshDb;
    use countersign_core::store::{KeyState, Transition};

    let (_, clock) = test_clock();
    let Some(db) = FreshDb::create(Backend::Postgres).await else {
        return;
    };
    let store = db.store(clock.clone()).await;
    let other = db.store(clock.clone()).await;
    let run = store
        .create_run(&crate::store::new_run("acme"))
        .await
        .unwrap();
    let mut steps = Vec::new();
    for n in 0..4 {
        let (step, _) = store
            .open_step(&crate::store::new_step(&run.id, Effect::Write, n))
            .await
            .unwrap();
        steps.push(step);
    }
    let start = |id: &str, n: usize| {
        let mut started = record(n);
        started.step_id = Some(id.to_string());
        Transition {
            step_id: id.to_string(),
            from: vec![StepStatus::Pending],
            to: Some(StepStatus::Running),
            bump_attempts: true,
            records: vec![(AuditEvent::Started, started)],
            ..Transition::default()
        }
    };
    // The first batch reads the head (long path); the next ones know it.
    assert!(store.move_step(&start(&steps[0].id, 0)).await.unwrap());
    let trips = store.one_trip_batches();
    assert!(store.move_step(&start(&steps[1].id, 1)).await.unwrap());
    assert_eq!(
        store.one_trip_batches(),
        trips + 1,
        "one trip once the head is known"
    );
    // Its key and its outcome, as the long path writes them.
    store
        .reserve_key(&steps[1].idem_key, &steps[1].id, &steps[1].inputs_hash, "w")
        .await
        .unwrap();
    let mut done = record(5);
    done.step_id = Some(steps[1].id.clone());
    let finished = Transition {
        step_id: steps[1].id.clone(),
        from: vec![StepStatus::Running],
        to: Some(StepStatus::Done),
        outcome: Some(r#"{"ok":true}"#.into()),
        key: Some((KeyState::Done, Some(r#"{"ref":"R-1"}"#.into()))),
        records: vec![(AuditEvent::Succeeded, done)],
        ..Transition::default()
    };
    assert!(store.move_step(&finished).await.unwrap());
    assert_eq!(store.one_trip_batches(), trips + 2);
    let step = store.get_step(&steps[1].id).await.unwrap();
    assert_eq!(step.status, StepStatus::Done);
    assert_eq!(step.attempts, 1);
    assert_eq!(step.outcome.as_deref(), Some(r#"{"ok":true}"#));
    let key = store.get_key(&steps[1].idem_key).await.unwrap().unwrap();
    assert_eq!(key.state, KeyState::Done);
    assert_eq!(key.result.as_deref(), Some(r#"{"ref":"R-1"}"#));

    // A transition that does not move: nothing written, no one-trip batch counted, and the
    // batch after it goes in one trip again.
    let records = store.verify_audit().await.unwrap().unwrap();
    assert!(!store.move_step(&start(&steps[1].id, 6)).await.unwrap());
    assert_eq!(store.verify_audit().await.unwrap(), Ok(records));
    assert_eq!(store.one_trip_batches(), trips + 2);

    // Another process appends: this committer's head is stale; the refusal names the head it
    // found, and the batch, sealed again on it, still goes in one trip, after the other's
    // record.
    other.append_audit(&record(7)).await.unwrap();
    assert!(store.move_step(&start(&steps[2].id, 2)).await.unwrap());
    assert_eq!(
        store.one_trip_batches(),
        trips + 3,
        "sealed again on the head the refusal named"
    );
    assert!(store.move_step(&start(&steps[3].id, 3)).await.unwrap());
    assert_eq!(store.one_trip_batches(), trips + 4, "one trip again");
    // What a re-sealed batch answers is what it wrote.
    other.append_audit(&record(8)).await.unwrap();
    let answered = store.append_audit(&record(9)).await.unwrap();
    assert_eq!(store.one_trip_batches(), trips + 5);
    let stored = store
        .audit_records(&answered.chain, answered.seq, 1)
        .await
        .unwrap();
    assert_eq!(
        (
            stored[0].hash.as_str(),
            stored[0].prev.as_str(),
            stored[0].at
        ),
        (answered.hash.as_str(), answered.prev.as_str(), answered.at)
    );
    let records = records + 2;
    assert_eq!(store.verify_audit().await.unwrap(), Ok(records + 3));
    for s in &steps[2..] {
        assert_eq!(
            store.get_step(&s.id).await.unwrap().status,
            StepStatus::Running
        );
    }

    // Two jobs at once, one of which does not move: shared batch or not, the other moves
    // with its record and the first writes nothing.
    let mut closing = record(8);
    closing.step_id = Some(steps[2].id.clone());
    let close = Transition {
        step_id: steps[2].id.clone(),
        from: vec![StepStatus::Running],
        to: Some(StepStatus::Done),
        records: vec![(AuditEvent::Succeeded, closing)],
        ..Transition::default()
    };
    let stale = start(&steps[1].id, 9);
    let (closed, restarted) = tokio::join!(store.move_step(&close), store.move_step(&stale));
    assert!(closed.unwrap());
    assert!(!restarted.unwrap());
    assert_eq!(store.verify_audit().await.unwrap(), Ok(records + 4));
    assert_eq!(
        store.get_step(&steps[2].id).await.unwrap().status,
        StepStatus::Done
    );
    assert_eq!(
        store.get_step(&steps[1].id).await.unwrap().status,
        StepStatus::Done
    );
    store.close().await;
    other.close().await;
    db.drop_db().await;
}

/// A gate's history (issue 30, item 8): however long its run's trail (one MCP session is one
/// run), opening a gate reads its own step's newest records through the `(step_id, seq)`
/// index under a LIMIT. With 200k records in the run, each backend's planner says so, and
/// the read returns the step's newest records only.
#[tokio::test]
async fn a_gates_history_reads_its_step_through_an_index_under_a_limit() {
    use countersign_core::audit::audit_for_step_sql;
    use countersign_core::store::testing::FreshDb;
    use sqlx::Connection;

    let (_, clock) = test_clock();
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(db) = FreshDb::create(backend).await else {
            continue;
        };
        let store = db.store(clock.clone()).await;
        // 200k records of run r-big, the last 300 of them step s-gate's (the audit's hash
        // columns are not checked by this read; the chain is not verified here).
        let fill = "INSERT INTO audit (chain, seq, at, event, run_id, step_id, tool, actor, rule, record, prev, hash) \
                    SELECT 'c', n, n, 'outcome', 'r-big', CASE WHEN n > 199700 THEN 's-gate' ELSE 's-' || (n % 5000) END, \
                           't', 'a', NULL, '{}', 'p', 'h' || n FROM series";
        let plan_sql = audit_for_step_sql()
            .replace("$1", "'s-gate'")
            .replace("$2", "'r-big'")
            .replace("$3", "200");
        let plan: String = match backend {
            Backend::Sqlite => {
                let path = db.url.expose().trim_start_matches("sqlite://").to_string();
                let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{path}"))
                    .await
                    .unwrap();
                // (Hashes and links are not what this reads: the head trigger goes.)
                sqlx::query("DROP TRIGGER audit_extend_head")
                    .execute(&mut c)
                    .await
                    .unwrap();
                sqlx::query(&format!(
                    "WITH RECURSIVE series(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM series WHERE n < 200000) {fill}"
                ))
                .execute(&mut c)
                .await
                .unwrap();
                sqlx::query("ANALYZE").execute(&mut c).await.unwrap();
                let rows: Vec<(i64, i64, i64, String)> =
                    sqlx::query_as(&format!("EXPLAIN QUERY PLAN {plan_sql}"))
                        .fetch_all(&mut c)
                        .await
                        .unwrap();
                rows.into_iter().map(|r| r.3).collect::<Vec<_>>().join("\n")
            }
            Backend::Postgres => {
                let mut c = sqlx::PgConnection::connect(db.url.expose()).await.unwrap();
                sqlx::query("ALTER TABLE audit DISABLE TRIGGER audit_extend_heads")
                    .execute(&mut c)
                    .await
                    .unwrap();
                sqlx::query(&format!(
                    "WITH series(n) AS (SELECT generate_series(1, 200000)) {fill}"
                ))
                .execute(&mut c)
                .await
                .unwrap();
                sqlx::query("ANALYZE audit").execute(&mut c).await.unwrap();
                let rows: Vec<(String,)> = sqlx::query_as(&format!("EXPLAIN {plan_sql}"))
                    .fetch_all(&mut c)
                    .await
                    .unwrap();
                rows.into_iter().map(|r| r.0).collect::<Vec<_>>().join("\n")
            }
        };
        match backend {
            Backend::Sqlite => assert!(
                plan.contains("USING INDEX audit_step_pos") && !plan.contains("SCAN audit"),
                "{plan}"
            ),
            Backend::Postgres => assert!(
                plan.contains("Limit")
                    && plan.contains("audit_step_pos")
                    && !plan.contains("Seq Scan"),
                "{plan}"
            ),
        }
        let rows = store.audit_for_step("r-big", "s-gate", 200).await.unwrap();
        assert_eq!(rows.len(), 200);
        assert_eq!(rows.first().unwrap().seq, 199_801);
        assert_eq!(
            rows.last().unwrap().seq,
            200_000,
            "the newest, in chain order"
        );
        store.close().await;
        db.drop_db().await;
    }
}
