//! Audit time order: `at` never decreases along `seq` whatever the clock does, and a
//! time-range search (which the store runs as a `seq` range) returns exactly the records in
//! range, on both backends.

use chrono::Duration;
use countersign_core::audit::{AuditEvent, AuditRecord, NewAuditRecord};
use countersign_core::policy::AuthorizationCondition as Cond;
use countersign_core::store::testing::each_backend;
use countersign_core::store::{AuditCursor, AuditFilter, NewStanding};
use countersign_core::{Clock, ManualClock, Store};

use crate::test_clock;

fn record(i: usize, actor: &str) -> NewAuditRecord {
    NewAuditRecord {
        event: Some(AuditEvent::Proposed),
        run_id: None,
        step_id: Some(format!("step-{i}")),
        tool: Some("invoice.get".into()),
        actor: Some(actor.into()),
        rule: None,
        detail: serde_json::Map::new(),
        tenant: None,
    }
}

async fn all_records(store: &Store) -> Vec<AuditRecord> {
    store.audit_in_order(0, 10_000).await.unwrap()
}

fn assert_time_ordered(records: &[AuditRecord]) {
    for pair in records.windows(2) {
        assert!(
            pair[1].at >= pair[0].at,
            "record {} at {} is earlier than record {} at {}",
            pair[1].seq,
            pair[1].at,
            pair[0].seq,
            pair[0].at
        );
    }
}

/// Runs `test` on each backend with the manual clock reset to the same start; `test` gets
/// the store, the clock and the start in Unix ms.
async fn each_backend_from_start<F, Fut>(test: F)
where
    F: Fn(Store, ManualClock, i64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (manual, clock) = test_clock();
    let start = manual.now();
    each_backend(clock, |store| {
        manual.set(start);
        test(store, manual.clone(), manual.now_ms())
    })
    .await;
}

#[tokio::test]
async fn at_never_decreases_along_seq_when_the_clock_steps_back() {
    each_backend_from_start(|store, manual, t0| async move {
        // Through the group committer (every append and step transition).
        let first = store.append_audit(&record(0, "a")).await.unwrap();
        assert_eq!(first.at, t0);
        // Each chain keeps its own time order: the tenant's chain starts at t0 too.
        let tenants = NewAuditRecord {
            tenant: Some("stillon".into()),
            ..record(9, "a")
        };
        assert_eq!(store.append_audit(&tenants).await.unwrap().at, t0);
        manual.advance(Duration::seconds(-10));
        let back = store.append_audit(&record(1, "a")).await.unwrap();
        assert_eq!(
            back.at, t0,
            "a clock that stepped back repeats the head's time"
        );
        // Through a write that appends inside its own transaction (a standing grant).
        store
            .grant_standing(&NewStanding {
                id: Some("SA-1".into()),
                tenant: "stillon".into(),
                party: "user-123".into(),
                tool: "reservation.modify".into(),
                conditions: vec![Cond::OwnsResource],
                expires_at: manual.now_ms() + 3_600_000,
                reason: "time order".into(),
                granted_by: "ops@stillon".into(),
            })
            .await
            .unwrap();
        manual.advance(Duration::seconds(20));
        let later = store.append_audit(&record(2, "a")).await.unwrap();
        assert_eq!(
            later.at,
            t0 + 10_000,
            "a clock ahead of the head is used as is"
        );

        let records = all_records(&store).await;
        assert_eq!(records.len(), 5);
        assert_eq!(records[3].chain, "stillon");
        assert_eq!(records[3].at, t0, "the grant's record is clamped too");
        assert_time_ordered(&records);
        // The clamped times are hashed like any other: the chains verify.
        assert_eq!(store.verify_audit().await.unwrap(), Ok(5));
    })
    .await;
}

/// Every record of `f` from the newest page down, `page` at a time.
async fn search_all(store: &Store, f: &AuditFilter, page: i64) -> Vec<i64> {
    let mut seqs = Vec::new();
    let mut cursor = AuditCursor::Newest;
    loop {
        let rows = store.search_audit(f, cursor, page).await.unwrap();
        seqs.extend(rows.iter().map(|r| r.seq));
        match rows.last() {
            Some(last) if rows.len() as i64 == page => cursor = AuditCursor::Before(last.seq),
            _ => return seqs,
        }
    }
}

#[tokio::test]
async fn a_time_range_search_returns_exactly_the_records_in_range() {
    each_backend_from_start(|store, manual, t0| async move {
        // Steps forward, ties, and steps back (which the appender clamps).
        let steps_ms = [0, 5, 0, 0, 7, -3, 1, 10, -20, 0, 4, 4, 1, 0, 30];
        for (i, step) in steps_ms.iter().enumerate() {
            manual.advance(Duration::milliseconds(*step));
            let actor = if i % 3 == 0 { "x" } else { "y" };
            store.append_audit(&record(i, actor)).await.unwrap();
        }
        let records = all_records(&store).await;
        assert_time_ordered(&records);
        // Every time a record carries, the millisecond after it, one before them all.
        let mut times: Vec<i64> = records.iter().flat_map(|r| [r.at, r.at + 1]).collect();
        times.push(t0 - 1);
        times.sort_unstable();
        times.dedup();
        let mut bounds: Vec<Option<i64>> = vec![None];
        bounds.extend(times.into_iter().map(Some));
        for from in &bounds {
            for to in &bounds {
                for actor in [None, Some("x")] {
                    let f = AuditFilter {
                        actor: actor.map(str::to_string),
                        from_ms: *from,
                        to_ms: *to,
                        ..AuditFilter::default()
                    };
                    let mut want: Vec<i64> = records
                        .iter()
                        .filter(|r| from.is_none_or(|t| r.at >= t))
                        .filter(|r| to.is_none_or(|t| r.at < t))
                        .filter(|r| actor.is_none_or(|a| r.actor.as_deref() == Some(a)))
                        .map(|r| r.seq)
                        .collect();
                    let exported: Vec<i64> = store
                        .audit_matching_after(&f, 0, 1_000)
                        .await
                        .unwrap()
                        .iter()
                        .map(|r| r.seq)
                        .collect();
                    assert_eq!(exported, want, "export {f:?}");
                    want.reverse();
                    assert_eq!(search_all(&store, &f, 4).await, want, "search {f:?}");
                }
            }
        }
    })
    .await;
}

/// A chain written before the time-order rule may hold a record older than the one before
/// it. The search checks the time range on every record it returns (the query walks a `seq`
/// range without `at` conditions) and reads on so that no page comes back short.
#[tokio::test]
async fn a_search_over_an_out_of_order_chain_drops_what_is_out_of_range_and_fills_its_pages() {
    each_backend_from_start(|store, _manual, t0| async move {
        let head = store.append_audit(&record(0, "x")).await.unwrap().seq;
        // 30 records after it as an old appender could have left them: every third one dated
        // before the first (out of any range that starts at t0), the others 10 ms apart.
        for seq in head + 1..=head + 30 {
            let at = if seq % 3 == 0 {
                t0 - 1_000
            } else {
                t0 + seq * 10
            };
            // Linked to the head (the database checks links, not hashes).
            let prev = store.audit_chain_head("_system").await.unwrap().unwrap().1;
            store
                .execute_sql(&format!(
                    "INSERT INTO audit (chain, seq, at, event, run_id, step_id, tool, actor, \
                         rule, record, prev, hash) VALUES ('_system', {seq}, {at}, 'proposed', \
                         NULL, 'step-{seq}', 'invoice.get', 'x', NULL, '{{}}', '{prev}', \
                         'sha256:h{seq}')"
                ))
                .await
                .unwrap();
        }
        let records = all_records(&store).await;
        assert_eq!(records.len(), usize::try_from(head + 30).unwrap());
        let f = AuditFilter {
            actor: Some("x".into()),
            from_ms: Some(t0),
            to_ms: Some(t0 + 10_000),
            ..AuditFilter::default()
        };
        let mut want: Vec<i64> = records
            .iter()
            .filter(|r| r.at >= t0 && r.at < t0 + 10_000 && r.actor.as_deref() == Some("x"))
            .map(|r| r.seq)
            .collect();
        assert_eq!(want.len(), 21, "1 appended + 20 of the 30 inserted");
        want.reverse();
        // Page by page: every page but the last is full, and none holds a record dated
        // out of range.
        let mut got = Vec::new();
        let mut cursor = AuditCursor::Newest;
        loop {
            let rows = store.search_audit(&f, cursor, 4).await.unwrap();
            for r in &rows {
                assert!(r.at >= t0, "record {} at {} is out of range", r.seq, r.at);
            }
            got.extend(rows.iter().map(|r| r.seq));
            if rows.len() < 4 {
                break;
            }
            cursor = AuditCursor::Before(rows.last().unwrap().seq);
        }
        assert_eq!(got, want);
        // The page above a cursor, newest first, full as well.
        let above = store
            .search_audit(&f, AuditCursor::After(want[10]), 4)
            .await
            .unwrap();
        let above: Vec<i64> = above.iter().map(|r| r.seq).collect();
        assert_eq!(above, want[6..10].to_vec());
    })
    .await;
}
