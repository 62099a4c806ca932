//! The audit chain: appends link, concurrent appenders never fork it, tampering is named.

use countersign_core::audit::{AuditEvent, AuditRecord, GENESIS, NewAuditRecord, verify};
use countersign_core::store::testing::each_backend;
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
    }
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
        assert_eq!(
            store.audit_for_run("run-1").await.unwrap(),
            vec![first, second]
        );
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

#[tokio::test]
async fn concurrent_appenders_never_fork_the_chain() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let tasks: Vec<_> = (0..24)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { store.append_audit(&record(i)).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
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
