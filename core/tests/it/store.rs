//! Store tests: each runs on SQLite and on Postgres.

use std::sync::Arc;

use countersign_core::store::testing::{FreshDb, each_backend};
use countersign_core::store::{Backend, ConnectOptions, NewRun, RunStatus, StoreError};
use countersign_core::{Clock, Secret};
use countersign_core::{Store, SystemClock};

use crate::test_clock;

pub(crate) fn new_run(tenant: &str) -> NewRun {
    NewRun {
        tenant: tenant.into(),
        principal: "user-123".into(),
        agent_id: None,
        task: "Process invoice INV-20260611".into(),
        origin: "user".into(),
        planned: false,
    }
}

/// A pending step of `run_id` proposed by agent-1: `invoice.get` for a read, `note.draft`
/// otherwise, with inputs `{"n": n}`.
pub(crate) fn new_step(
    run_id: &str,
    effect: countersign_core::model::Effect,
    n: usize,
) -> countersign_core::store::NewStep {
    use countersign_core::model::{Effect, StepStatus};
    countersign_core::store::NewStep {
        run_id: run_id.to_string(),
        role: "worker".into(),
        tool: if effect == Effect::Read {
            "invoice.get"
        } else {
            "note.draft"
        }
        .into(),
        effect,
        inputs: countersign_core::CanonicalJson::from_value(&serde_json::json!({"n": n})).unwrap(),
        agent_id: Some("agent-1".into()),
        reason: format!("step {n}"),
        evidence: vec![],
        observed: None,
        trace_id: format!("trace-{n}"),
        status: StepStatus::Pending,
    }
}

/// A record of `event` about `step` of `run`, by agent-1.
fn record(
    run: &str,
    step: &countersign_core::store::Step,
    event: countersign_core::audit::AuditEvent,
) -> (
    countersign_core::audit::AuditEvent,
    countersign_core::audit::NewAuditRecord,
) {
    (
        event,
        countersign_core::audit::NewAuditRecord {
            event: Some(event),
            run_id: Some(run.to_string()),
            step_id: Some(step.id.clone()),
            tool: Some(step.tool.clone()),
            actor: Some("agent:agent-1".into()),
            rule: None,
            detail: Default::default(),
            tenant: None,
        },
    )
}

/// A read of `run` (inputs `{"n": n}`) written by its closing transition, done, with one
/// `succeeded` record, under `guard`.
fn closing_read(
    store: &Store,
    run: &str,
    n: usize,
    guard: Option<countersign_core::store::RunGuard>,
) -> countersign_core::store::Transition {
    use countersign_core::audit::AuditEvent;
    use countersign_core::model::{Effect, StepStatus};
    let r = store.prepare_read(&new_step(run, Effect::Read, n)).unwrap();
    countersign_core::store::Transition {
        step_id: r.id.clone(),
        from: vec![StepStatus::Pending],
        to: Some(StepStatus::Done),
        decision: Some("allow".into()),
        outcome: Some("{}".into()),
        bump_attempts: true,
        records: vec![record(run, &r, AuditEvent::Succeeded)],
        guard,
        insert: Some(Box::new(r)),
        ..Default::default()
    }
}

#[tokio::test]
async fn migrations_reach_the_latest_version_and_are_idempotent() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let latest = store.latest_migration();
        assert!(latest >= 1);
        assert_eq!(store.schema_version().await.unwrap(), Some(latest));
        // Running them again is a no-op, not an error.
        store.migrate().await.unwrap();
        assert_eq!(store.schema_version().await.unwrap(), Some(latest));
        store.ping().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_database_migrated_by_a_newer_binary_is_refused() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let latest = store.latest_migration();
        let checksum = match store.backend() {
            Backend::Sqlite => "X'00'",
            Backend::Postgres => "'\\x00'::bytea",
        };
        store
            .execute_sql(&format!(
                "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
                 execution_time) VALUES ({}, 'from a newer Countersign', TRUE, {checksum}, 0)",
                latest + 1
            ))
            .await
            .unwrap();
        match store.migrate().await {
            Err(StoreError::SchemaNewer { found, known }) => {
                assert_eq!((found, known), (latest + 1, latest));
            }
            other => panic!("a newer schema was not refused: {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn runs_round_trip_with_the_injected_clock() {
    let (manual, clock) = test_clock();
    each_backend(clock, move |store| {
        let manual = manual.clone();
        async move {
            let created = store.create_run(&new_run("acme")).await.unwrap();
            assert_eq!(created.status, RunStatus::Active);
            assert_eq!(created.created_at, manual.now_ms());
            assert!(!created.replan);

            manual.advance(chrono::Duration::seconds(5));
            let cancelled = store
                .set_run_status(&created.id, RunStatus::Cancelled)
                .await
                .unwrap();
            assert_eq!(cancelled.status, RunStatus::Cancelled);
            assert_eq!(cancelled.updated_at, created.created_at + 5_000);

            store.create_run(&new_run("other-tenant")).await.unwrap();
            let acme = store.list_runs("acme", 10).await.unwrap();
            assert_eq!(acme.len(), 1, "runs are listed per tenant only");
            assert_eq!(acme[0].id, created.id);

            assert!(matches!(
                store.get_run("no-such-run").await,
                Err(StoreError::NotFound)
            ));
            assert!(matches!(
                store.set_run_status("no-such-run", RunStatus::Done).await,
                Err(StoreError::NotFound)
            ));
        }
    })
    .await;
}

#[tokio::test]
async fn the_database_refuses_update_and_delete_on_audit() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        // A record must extend its chain's head: the first one links to the genesis hash.
        let genesis = countersign_core::audit::GENESIS;
        let insert = |seq: i64, prev: &str, hash: &str, chain: &str| {
            format!(
                "INSERT INTO audit (chain, seq, at, event, record, prev, hash) \
                 VALUES ('{chain}', {seq}, 0, 'proposed', '{{}}', '{prev}', '{hash}')"
            )
        };
        // Several records in one statement: each follows the one before it (Postgres checks
        // the statement's records together, SQLite row by row).
        let insert_two = |second_seq: i64, second_prev: &str| {
            format!(
                "INSERT INTO audit (chain, seq, at, event, record, prev, hash) \
                 VALUES ('t', 1, 0, 'proposed', '{{}}', '{genesis}', 'sha256:1'), \
                        ('t', {second_seq}, 0, 'proposed', '{{}}', '{second_prev}', 'sha256:2')"
            )
        };
        // (The head row of a chain is written by its first appender.)
        store
            .execute_sql(&format!(
                "INSERT INTO audit_chains (chain, seq, hash, at) VALUES ('t', 0, '{genesis}', 0)"
            ))
            .await
            .unwrap();
        for (sql, why) in [
            (insert(2, genesis, "sha256:1", "t"), "a gap after the head"),
            (
                insert(1, "sha256:x", "sha256:1", "t"),
                "a wrong link to the head",
            ),
            (
                insert(1, genesis, "sha256:1", "nohead"),
                "a chain without a head",
            ),
            (
                insert(9, genesis, "sha256:1", "_legacy"),
                "the frozen legacy chain",
            ),
            (insert_two(3, "sha256:1"), "a gap inside the statement"),
            (
                insert_two(2, "sha256:x"),
                "a wrong link inside the statement",
            ),
        ] {
            let err = store.execute_sql(&sql).await.unwrap_err();
            assert!(
                err.to_string().contains("audit: "),
                "{:?}: {why}: {sql} gave {err}",
                store.backend()
            );
        }
        store
            .execute_sql(&insert(1, genesis, "sha256:1", "t"))
            .await
            .unwrap();
        assert_eq!(
            store.audit_chain_head("t").await.unwrap(),
            Some((1, "sha256:1".to_string())),
            "the insert moved the head"
        );
        // One statement extending two chains, two records on one of them, moves both heads.
        store
            .execute_sql(&format!(
                "INSERT INTO audit_chains (chain, seq, hash, at) VALUES ('u', 0, '{genesis}', 0)"
            ))
            .await
            .unwrap();
        store
            .execute_sql(&format!(
                "INSERT INTO audit (chain, seq, at, event, record, prev, hash) \
                 VALUES ('u', 1, 0, 'proposed', '{{}}', '{genesis}', 'sha256:u1'), \
                        ('t', 2, 0, 'proposed', '{{}}', 'sha256:1', 'sha256:2'), \
                        ('u', 2, 0, 'proposed', '{{}}', 'sha256:u1', 'sha256:u2')"
            ))
            .await
            .unwrap();
        for (chain, head) in [("t", (2, "sha256:2")), ("u", (2, "sha256:u2"))] {
            assert_eq!(
                store.audit_chain_head(chain).await.unwrap(),
                Some((head.0, head.1.to_string())),
                "{chain}"
            );
        }
        // The head moves only forward, with its records; it is never deleted.
        for sql in [
            "UPDATE audit_chains SET seq = 0 WHERE chain = 't'",
            "DELETE FROM audit_chains WHERE chain = 't'",
        ] {
            let err = store.execute_sql(sql).await.unwrap_err();
            assert!(err.to_string().contains("audit_chains"), "{sql}: {err}");
        }
        for sql in [
            "UPDATE audit SET event = 'approved' WHERE chain = 't' AND seq = 1",
            "DELETE FROM audit WHERE chain = 't' AND seq = 1",
        ] {
            let err = store.execute_sql(sql).await.unwrap_err();
            assert!(
                err.to_string().contains("append-only"),
                "{:?}: {sql} gave {err}",
                store.backend()
            );
        }
        if store.backend() == Backend::Postgres {
            let err = store.execute_sql("TRUNCATE audit").await.unwrap_err();
            assert!(err.to_string().contains("append-only"), "{err}");
        }
        // Reusing a seq is a conflict: the chain cannot fork.
        let dup = store
            .execute_sql(&insert(1, genesis, "sha256:2", "t"))
            .await
            .unwrap_err();
        assert!(matches!(dup, StoreError::Conflict(_)), "{dup:?}");
    })
    .await;
}

#[tokio::test]
async fn check_constraints_refuse_unknown_statuses() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let run = store.create_run(&new_run("acme")).await.unwrap();
        let err = store
            .execute_sql(&format!(
                "UPDATE runs SET status = 'exploded' WHERE id = '{}'",
                run.id
            ))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    })
    .await;
}

#[tokio::test]
async fn bad_urls_are_refused_with_the_password_hidden() {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let opts = ConnectOptions {
        connect_timeout: std::time::Duration::from_millis(500),
        max_connections: 1,
        ..ConnectOptions::default()
    };
    let err = Store::connect(
        &Secret::new("mysql://u:pw@h/db".into()),
        &opts,
        clock.clone(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::UnsupportedUrl { .. }), "{err:?}");

    // Nothing listens on port 1: connecting fails, and the message never shows the password.
    let err = Store::connect(
        &Secret::new("postgres://u:s3cr3t@127.0.0.1:1/db".into()),
        &opts,
        clock,
    )
    .await
    .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Connect { .. }), "{err:?}");
    assert!(!msg.contains("s3cr3t"), "{msg}");
    assert!(msg.contains("***"), "{msg}");

    // The drivers also take the password as a query parameter: hidden too.
    let err = Store::connect(
        &Secret::new("postgres://u@127.0.0.1:1/db?password=hunter2&sslmode=disable".into()),
        &opts,
        Arc::new(SystemClock),
    )
    .await
    .unwrap_err();
    let msg = err.to_string();
    assert!(!msg.contains("hunter2"), "{msg}");
    assert!(msg.contains("sslmode=disable"), "{msg}");
}

#[tokio::test]
async fn sqlite_creates_its_folder() {
    let db = FreshDb::create(Backend::Sqlite).await.unwrap();
    let nested = db.url.expose().replace("test.db", "nested/deeper/cs.db");
    let store = Store::connect(
        &Secret::new(nested),
        &ConnectOptions::default(),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    store.ping().await.unwrap();
    store.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn opened_steps_are_what_is_stored_with_distinct_positions_and_keys() {
    use countersign_core::CanonicalJson;
    use countersign_core::keys::IdemKey;
    use countersign_core::model::{Effect, StepStatus};
    use countersign_core::store::{NewStep, RunGuard, Transition};
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let run = store.create_run(&new_run("acme")).await.unwrap();
        let step = |i: usize, effect: Effect| NewStep {
            reason: format!("reason {i}"),
            evidence: vec!["INV-1".into()],
            trace_id: format!("trace-{i}"),
            ..new_step(&run.id, effect, i % 3)
        };
        // Reads and writes opened concurrently in one run.
        let mut tasks = Vec::new();
        for i in 0..24 {
            let store = store.clone();
            let new = step(
                i,
                if i % 2 == 0 {
                    Effect::Read
                } else {
                    Effect::Write
                },
            );
            tasks.push(tokio::spawn(
                async move { store.open_step(&new).await.unwrap() },
            ));
        }
        let mut opened = Vec::new();
        for t in tasks {
            opened.push(t.await.unwrap());
        }
        let mut seqs = Vec::new();
        // A step's id is in time order (version 7), so the indexes keyed by it grow at their end.
        let version = |id: &str| uuid::Uuid::parse_str(id).unwrap().get_version_num();
        for (s, created) in &opened {
            // What open_step answers is exactly the stored row.
            assert_eq!(&store.get_step(&s.id).await.unwrap(), s);
            assert_eq!(version(&s.id), 7);
            let inputs = CanonicalJson::from_canonical_text(&s.inputs).unwrap();
            match s.effect {
                Effect::Read => {
                    assert!(created, "a read always opens a new step");
                    assert_eq!(s.idem_key, IdemKey::for_read(&s.id, &inputs).to_string());
                }
                _ => assert_eq!(
                    s.idem_key,
                    IdemKey::derive(&run.id, s.seq as u64, &inputs).to_string()
                ),
            }
            if *created {
                seqs.push(s.seq);
            }
        }
        // A read prepared to be written with its outcome takes one too.
        let prepared = store.prepare_read(&step(99, Effect::Read)).unwrap();
        assert_eq!(version(&prepared.id), 7);
        // Twelve reads, and three distinct writes (identical writes share one step).
        seqs.sort();
        assert_eq!(
            seqs,
            (1..=15).collect::<Vec<i64>>(),
            "positions 1..n, no gaps"
        );
        let mut keys: Vec<&str> = opened.iter().map(|(s, _)| s.idem_key.as_str()).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 15);

        // A guarded transition does not write once the run is no longer active.
        let (read, _) = opened
            .iter()
            .find(|(s, _)| s.effect == Effect::Read)
            .unwrap();
        let guarded = |id: &str| Transition {
            step_id: id.to_string(),
            from: vec![StepStatus::Pending],
            to: Some(StepStatus::Done),
            guard: Some(RunGuard {
                run_id: run.id.clone(),
                allow_failed: false,
                unless_switch: Some("emergency_stop".into()),
            }),
            ..Transition::default()
        };
        store
            .set_switch("emergency_stop", "test", "t")
            .await
            .unwrap();
        assert!(
            !store.move_step(&guarded(&read.id)).await.unwrap(),
            "stop set"
        );
        store.clear_switch("emergency_stop").await.unwrap();
        store
            .set_run_status(&run.id, RunStatus::Cancelled)
            .await
            .unwrap();
        assert!(
            !store.move_step(&guarded(&read.id)).await.unwrap(),
            "run cancelled"
        );
        assert_eq!(
            store.get_step(&read.id).await.unwrap().status,
            StepStatus::Pending
        );
        store
            .set_run_status(&run.id, RunStatus::Active)
            .await
            .unwrap();
        assert!(store.move_step(&guarded(&read.id)).await.unwrap());
        assert_eq!(
            store.get_step(&read.id).await.unwrap().status,
            StepStatus::Done
        );
    })
    .await;
}

#[tokio::test]
async fn claims_take_the_oldest_ready_step_of_planned_runs_once_and_read_nothing_back() {
    use countersign_core::CanonicalJson;
    use countersign_core::model::{Effect, StepStatus};
    use countersign_core::store::{NewStep, Transition};
    let (manual, clock) = test_clock();
    each_backend(clock, move |store| {
        let manual = manual.clone();
        async move {
            let planned = |task: &str| NewRun {
                planned: true,
                task: task.into(),
                ..new_run("acme")
            };
            let a = store.create_run(&planned("a")).await.unwrap();
            manual.advance(chrono::Duration::milliseconds(5));
            let b = store.create_run(&planned("b")).await.unwrap();
            let direct = store.create_run(&new_run("acme")).await.unwrap();
            let open = |run: &str, n: usize| {
                let store = store.clone();
                let run = run.to_string();
                async move {
                    let mut ids = Vec::new();
                    for i in 0..n {
                        let (step, _) = store
                            .open_step(&NewStep {
                                run_id: run.clone(),
                                role: "worker".into(),
                                tool: "note.draft".into(),
                                effect: Effect::Write,
                                inputs: CanonicalJson::from_value(&serde_json::json!({"n": i}))
                                    .unwrap(),
                                agent_id: None,
                                reason: format!("step {i}"),
                                evidence: vec![],
                                observed: None,
                                trace_id: format!("trace-{run}-{i}"),
                                status: StepStatus::Pending,
                            })
                            .await
                            .unwrap();
                        ids.push(step.id);
                    }
                    ids
                }
            };
            let a_steps = open(&a.id, 3).await;
            manual.advance(chrono::Duration::milliseconds(5));
            let b_steps = open(&b.id, 2).await;
            open(&direct.id, 1).await;
            let lease = manual.now_ms() + 60_000;

            // The oldest ready step first; it is returned as stored, with its lease.
            let first = store.claim_step("w1", lease, None).await.unwrap().unwrap();
            assert_eq!(first.id, a_steps[0]);
            assert_eq!(first, store.get_step(&first.id).await.unwrap());
            // Leased: the next worker gets the other run's first step (a's second waits for
            // its first); then nothing is ready (an unplanned run's steps are never claimed).
            let second = store.claim_step("w2", lease, None).await.unwrap().unwrap();
            assert_eq!(second.id, b_steps[0]);
            assert!(store.claim_step("w3", lease, None).await.unwrap().is_none());

            // A released step can be claimed again, unless the named switch is set.
            store.release_step(&first.id, "w1").await.unwrap();
            store.set_switch("emergency_stop", "t", "t").await.unwrap();
            assert!(
                store
                    .claim_step("w1", lease, Some("emergency_stop"))
                    .await
                    .unwrap()
                    .is_none()
            );
            store.clear_switch("emergency_stop").await.unwrap();
            let again = store
                .claim_step("w1", lease, Some("emergency_stop"))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(again.id, a_steps[0]);

            // An expired lease lets another worker take the step.
            manual.advance(chrono::Duration::seconds(61));
            let lease = manual.now_ms() + 60_000;
            let stolen = store.claim_step("w4", lease, None).await.unwrap().unwrap();
            assert_eq!(stolen.id, a_steps[0]);
            // The first holder's release no longer touches it.
            store.release_step(&stolen.id, "w1").await.unwrap();
            assert!(
                store
                    .claim_step("w5", lease, None)
                    .await
                    .unwrap()
                    .unwrap()
                    .id
                    == b_steps[0]
            );

            // Done steps unblock the next of their run; the run is done with its last step.
            let done = |id: &str| Transition {
                step_id: id.to_string(),
                from: vec![StepStatus::Pending],
                to: Some(StepStatus::Done),
                ..Transition::default()
            };
            assert!(store.move_step(&done(&a_steps[0])).await.unwrap());
            let next = store.claim_step("w4", lease, None).await.unwrap().unwrap();
            assert_eq!(next.id, a_steps[1]);
            let (step, run_done) = store.step_and_run_done(&a_steps[0]).await.unwrap();
            assert_eq!(step.status, StepStatus::Done);
            assert!(!run_done);
            for id in &a_steps[1..] {
                assert!(store.move_step(&done(id)).await.unwrap());
            }
            let (_, run_done) = store.step_and_run_done(&a_steps[2]).await.unwrap();
            assert!(run_done);
        }
    })
    .await;
}

#[tokio::test]
async fn a_prepared_read_is_written_once_by_its_closing_transition_or_as_prepared_when_its_guard_refuses()
 {
    use countersign_core::CanonicalJson;
    use countersign_core::audit::AuditEvent;
    use countersign_core::model::{Effect, StepStatus};
    use countersign_core::store::{NewStep, RunGuard, Transition};
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let run = store.create_run(&new_run("acme")).await.unwrap();
        let new = |effect: Effect| NewStep {
            run_id: run.id.clone(),
            role: "worker".into(),
            tool: "invoice.get".into(),
            effect,
            inputs: CanonicalJson::from_value(&serde_json::json!({"invoice_id": "INV-1"})).unwrap(),
            agent_id: Some("agent-1".into()),
            reason: "check the invoice".into(),
            evidence: vec![],
            observed: None,
            trace_id: "trace-r".into(),
            status: StepStatus::Pending,
        };
        // Only a read is prepared without its row.
        assert!(store.prepare_read(&new(Effect::Write)).is_err());
        let (write, _) = store.open_step(&new(Effect::Write)).await.unwrap();
        assert_eq!(write.seq, 1);

        let prepared = store.prepare_read(&new(Effect::Read)).unwrap();
        assert!(
            matches!(
                store.get_step(&prepared.id).await,
                Err(StoreError::NotFound)
            ),
            "preparing writes nothing"
        );
        let guard = RunGuard {
            run_id: run.id.clone(),
            allow_failed: false,
            unless_switch: Some("emergency_stop".into()),
        };
        let record = |event: AuditEvent| {
            (
                event,
                countersign_core::audit::NewAuditRecord {
                    event: Some(event),
                    run_id: Some(run.id.clone()),
                    step_id: Some(prepared.id.clone()),
                    tool: Some("invoice.get".into()),
                    actor: Some("agent:agent-1".into()),
                    rule: None,
                    detail: Default::default(),
                    tenant: None,
                },
            )
        };
        let closing = |step: &countersign_core::store::Step| Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending, StepStatus::Failed],
            to: Some(StepStatus::Done),
            decision: Some("allow".into()),
            rule: Some("policy.allow".into()),
            outcome: Some("{\"ok\":true}".into()),
            bump_attempts: true,
            records: vec![record(AuditEvent::Decided), record(AuditEvent::Succeeded)],
            guard: Some(guard.clone()),
            insert: Some(Box::new(step.clone())),
            ..Transition::default()
        };
        let before = store.audit_in_order(0, 1_000_000).await.unwrap().len() as i64;
        assert!(store.move_step(&closing(&prepared)).await.unwrap());
        let stored = store.get_step(&prepared.id).await.unwrap();
        assert_eq!(stored.status, StepStatus::Done);
        assert_eq!(stored.seq, 2, "the run's next position, taken when written");
        assert_eq!(stored.attempts, 1);
        assert_eq!(stored.decision.as_deref(), Some("allow"));
        assert_eq!(stored.outcome.as_deref(), Some("{\"ok\":true}"));
        assert_eq!(stored.idem_key, prepared.idem_key);
        assert_eq!(stored.inputs_hash, prepared.inputs_hash);
        let after = store.audit_in_order(0, 1_000_000).await.unwrap().len() as i64;
        assert_eq!(after - before, 2, "its records commit with it");

        // Once the run is cancelled the guard refuses: no outcome, no record, and the row
        // exists as prepared so the caller can record why it did not run.
        let second = store.prepare_read(&new(Effect::Read)).unwrap();
        store
            .set_run_status(&run.id, RunStatus::Cancelled)
            .await
            .unwrap();
        assert!(!store.move_step(&closing(&second)).await.unwrap());
        let kept = store.get_step(&second.id).await.unwrap();
        assert_eq!(kept.status, StepStatus::Pending);
        assert_eq!(kept.outcome, None);
        assert_eq!(kept.seq, 3);
        assert_eq!(
            (store.audit_in_order(0, 1_000_000).await.unwrap().len() as i64),
            after,
            "nothing recorded"
        );
        // insert_prepared writes a prepared read as it is.
        let third = store.prepare_read(&new(Effect::Read)).unwrap();
        let written = store.insert_prepared(&third).await.unwrap();
        assert_eq!(written.seq, 4);
        assert_eq!(store.get_step(&third.id).await.unwrap(), written);
    })
    .await;
}

#[tokio::test]
async fn ending_a_run_cancels_its_unstarted_steps_in_the_same_transaction() {
    use countersign_core::CanonicalJson;
    use countersign_core::audit::{AuditEvent, NewAuditRecord};
    use countersign_core::model::{Effect, StepStatus};
    use countersign_core::store::{NewStep, Transition};
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let run = store
            .create_run(&NewRun {
                planned: true,
                ..new_run("acme")
            })
            .await
            .unwrap();
        let mut ids = Vec::new();
        for i in 0..40 {
            let (step, _) = store
                .open_step(&NewStep {
                    run_id: run.id.clone(),
                    role: "worker".into(),
                    tool: "note.draft".into(),
                    effect: Effect::Write,
                    inputs: CanonicalJson::from_value(&serde_json::json!({"n": i})).unwrap(),
                    agent_id: None,
                    reason: format!("step {i}"),
                    evidence: vec![],
                    observed: None,
                    trace_id: format!("trace-{i}"),
                    status: StepStatus::Pending,
                })
                .await
                .unwrap();
            ids.push(step.id);
        }
        // The first step already ran: its cancel must write nothing.
        assert!(
            store
                .move_step(&Transition {
                    step_id: ids[0].clone(),
                    from: vec![StepStatus::Pending],
                    to: Some(StepStatus::Failed),
                    ..Transition::default()
                })
                .await
                .unwrap()
        );
        let cancels: Vec<Transition> = ids
            .iter()
            .map(|id| Transition {
                step_id: id.clone(),
                from: vec![StepStatus::Pending, StepStatus::NeedsApproval],
                to: Some(StepStatus::Cancelled),
                rule: Some("run.failed".into()),
                records: vec![(
                    AuditEvent::Cancelled,
                    NewAuditRecord {
                        event: Some(AuditEvent::Cancelled),
                        run_id: Some(run.id.clone()),
                        step_id: Some(id.clone()),
                        tool: Some("note.draft".into()),
                        actor: Some("executor".into()),
                        rule: Some("run.failed".into()),
                        detail: Default::default(),
                        tenant: None,
                    },
                )],
                ..Transition::default()
            })
            .collect();

        // A reader that looks at the run, then at its steps, never finds the run ended while
        // one of its steps is still pending.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let watcher = {
            let (store, stop, run_id) = (store.clone(), stop.clone(), run.id.clone());
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut seen_ended = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let status = store.get_run(&run_id).await.unwrap().status;
                    let steps = store.steps_for_run(&run_id).await.unwrap();
                    if status != RunStatus::Active {
                        seen_ended += 1;
                        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let pending: Vec<_> = steps
                            .iter()
                            .filter(|s| s.status == StepStatus::Pending)
                            .map(|s| s.seq)
                            .collect();
                        assert!(pending.is_empty(), "run ended, steps {pending:?} pending");
                    }
                    tokio::task::yield_now().await;
                }
                seen_ended
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let before = store.audit_in_order(0, 1_000_000).await.unwrap().len() as i64;
        let (ended, moved) = store
            .end_run(&run.id, RunStatus::Failed, "step 1 failed", &cancels)
            .await
            .unwrap();
        assert!(ended);
        assert_eq!(moved, 39, "every step but the failed one");
        // Let the watcher look at the ended run a few times (on a loaded machine one look
        // can take longer than any fixed sleep; give up after 30 s).
        let waiting = std::time::Instant::now();
        while seen.load(std::sync::atomic::Ordering::SeqCst) < 3
            && waiting.elapsed() < std::time::Duration::from_secs(30)
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(watcher.await.unwrap() > 0, "the watcher saw the ended run");

        let run_now = store.get_run(&run.id).await.unwrap();
        assert_eq!(run_now.status, RunStatus::Failed);
        assert_eq!(run_now.reason, "step 1 failed");
        let steps = store.steps_for_run(&run.id).await.unwrap();
        assert_eq!(
            steps[0].status,
            StepStatus::Failed,
            "a step that ran keeps its end"
        );
        assert!(steps[1..].iter().all(|s| s.status == StepStatus::Cancelled));
        let after = store.audit_in_order(0, 1_000_000).await.unwrap().len() as i64;
        assert_eq!(
            after - before,
            39,
            "one record per cancelled step, in the same commit"
        );

        // Ending it again: the run is no longer active, nothing moves.
        let (ended, moved) = store
            .end_run(&run.id, RunStatus::Cancelled, "again", &cancels)
            .await
            .unwrap();
        assert!(!ended);
        assert_eq!(moved, 0);
        assert_eq!(
            store.get_run(&run.id).await.unwrap().status,
            RunStatus::Failed
        );
    })
    .await;
}

/// Many transitions committed at once (the committer batches them; on Postgres a batch of
/// distinct steps is written in a few statements, `store::bulk`): each moves exactly when its
/// `from` statuses and its guard allow, reads of one run take consecutive positions, keys
/// follow their moved steps only, and every moved job's records are contiguous in the chain.
#[tokio::test]
async fn concurrent_transitions_each_move_exactly_when_their_from_and_guard_allow() {
    use countersign_core::audit::AuditEvent;
    use countersign_core::model::{Effect, StepStatus};
    use countersign_core::store::{KeyState, RunGuard, Transition};
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let live = store.create_run(&new_run("acme")).await.unwrap();
        let ended = store.create_run(&new_run("acme")).await.unwrap();
        // Another tenant's active run, held by that tenant's emergency stop (every write path
        // — update, insert, the Postgres batch function — reads the tenant's switch row).
        let halted = store.create_run(&new_run("initech")).await.unwrap();
        let guard = |run: &str| RunGuard {
            run_id: run.to_string(),
            allow_failed: false,
            unless_switch: Some("emergency_stop".into()),
        };
        // (transition, whether it must move, the run its guard names)
        let mut cases: Vec<(Transition, bool, &str)> = Vec::new();
        for i in 0..4 {
            let (w, _) = store
                .open_step(&new_step(&halted.id, Effect::Write, 200 + i))
                .await
                .unwrap();
            store
                .reserve_key(&w.idem_key, &w.id, &w.inputs_hash, "test")
                .await
                .unwrap();
            cases.push((
                Transition {
                    step_id: w.id.clone(),
                    from: vec![StepStatus::Pending],
                    to: Some(StepStatus::Done),
                    outcome: Some(format!("{{\"n\":{i}}}")),
                    bump_attempts: true,
                    key: Some((KeyState::Done, Some(format!("{{\"n\":{i}}}")))),
                    records: vec![record(&halted.id, &w, AuditEvent::Succeeded)],
                    guard: Some(guard(&halted.id)),
                    ..Transition::default()
                },
                false,
                "halted",
            ));
            cases.push((
                closing_read(&store, &halted.id, 300 + i, Some(guard(&halted.id))),
                false,
                "halted",
            ));
        }
        store
            .set_switch(
                &countersign_core::store::tenant_switch("emergency_stop", "initech"),
                "test",
                "test",
            )
            .await
            .unwrap();
        for i in 0..8 {
            let (w, _) = store
                .open_step(&new_step(&live.id, Effect::Write, i))
                .await
                .unwrap();
            // Writes with keys: even ones leave `pending` (they move and settle their key),
            // odd ones claim to leave `needs_approval` (they do not, and their key stays).
            store
                .reserve_key(&w.idem_key, &w.id, &w.inputs_hash, "test")
                .await
                .unwrap();
            let moves = i % 2 == 0;
            cases.push((
                Transition {
                    step_id: w.id.clone(),
                    from: vec![if moves {
                        StepStatus::Pending
                    } else {
                        StepStatus::NeedsApproval
                    }],
                    to: Some(StepStatus::Done),
                    outcome: Some(format!("{{\"n\":{i}}}")),
                    bump_attempts: true,
                    key: Some((KeyState::Done, Some(format!("{{\"n\":{i}}}")))),
                    records: vec![
                        record(&live.id, &w, AuditEvent::Started),
                        record(&live.id, &w, AuditEvent::Succeeded),
                    ],
                    guard: Some(guard(&live.id)),
                    ..Transition::default()
                },
                moves,
                "live",
            ));
        }
        for i in 0..12 {
            // Reads written with their outcome: those of the ended run are refused by
            // their guard and kept as prepared.
            let (run, moves, name) = if i % 3 == 2 {
                (&ended.id, false, "ended")
            } else {
                (&live.id, true, "live")
            };
            cases.push((
                closing_read(&store, run, 100 + i, Some(guard(run))),
                moves,
                name,
            ));
        }
        store
            .set_run_status(&ended.id, RunStatus::Cancelled)
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for (t, moves, name) in cases {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let answer = store.transition(&t).await.unwrap();
                (t, moves, name, answer)
            }));
        }
        let mut read_seqs = Vec::new();
        for task in tasks {
            let (t, moves, name, answer) = task.await.unwrap();
            let stored = store.get_step(&t.step_id).await.unwrap();
            match answer {
                Some((step, records)) => {
                    assert!(moves, "{name} step {} moved but must not", t.step_id);
                    assert_eq!(step, stored);
                    assert_eq!(stored.status, StepStatus::Done);
                    assert_eq!(stored.attempts, 1);
                    assert_eq!(records.len(), t.records.len());
                    for pair in records.windows(2) {
                        assert_eq!(
                            pair[1].seq,
                            pair[0].seq + 1,
                            "a job's records are contiguous"
                        );
                    }
                    if t.insert.is_some() {
                        read_seqs.push(stored.seq);
                    }
                }
                None => {
                    assert!(!moves, "{name} step {} did not move", t.step_id);
                    // A refused read is kept as prepared; a write stays where it was.
                    assert_eq!(stored.status, StepStatus::Pending);
                    assert_eq!(stored.attempts, 0);
                    assert_eq!(stored.outcome, None);
                }
            }
            if t.key.is_some() {
                let key = store.get_key(&stored.idem_key).await.unwrap().unwrap();
                let want = if moves {
                    KeyState::Done
                } else {
                    KeyState::InFlight
                };
                assert_eq!(key.state, want, "the key follows its step");
            }
        }
        // Eight writes took 1..=8; the live run's eight reads follow, no gap, no repeat.
        read_seqs.sort();
        assert_eq!(read_seqs, (9..=16).collect::<Vec<i64>>());
        assert!(
            store.verify_audit().await.unwrap().is_ok(),
            "the chain holds"
        );
    })
    .await;
}

/// A batch with a job that fails in the database (a read of a run that does not exist: its
/// row breaks the foreign key) commits the jobs beside it, writes nothing of the failed one,
/// and leaves every pooled connection usable: none keeps the append lock or an aborted
/// transaction (the appends after it would hang or fail).
#[tokio::test]
async fn a_failing_job_fails_alone_and_leaves_the_append_lock_free() {
    use countersign_core::audit::{AuditEvent, NewAuditRecord};
    use countersign_core::model::StepStatus;
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let live = store.create_run(&new_run("acme")).await.unwrap();
        let before = store.audit_in_order(0, 10_000).await.unwrap().len();
        for round in 0..3 {
            let mut tasks = Vec::new();
            for i in 0..9 {
                let (t, good) = if i == 4 {
                    (
                        closing_read(&store, "no-such-run", round * 100 + i, None),
                        false,
                    )
                } else {
                    (closing_read(&store, &live.id, round * 100 + i, None), true)
                };
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    (good, t.step_id.clone(), store.transition(&t).await)
                }));
            }
            for task in tasks {
                let (good, step_id, answer) = task.await.unwrap();
                if good {
                    let moved = answer.unwrap().expect("a good read is written");
                    assert_eq!(moved.0.status, StepStatus::Done);
                } else {
                    assert!(answer.is_err(), "the broken read fails: {answer:?}");
                    assert!(store.get_step(&step_id).await.is_err(), "nothing of it");
                }
            }
        }
        // Every connection of the pool is still usable: appends from many tasks at once
        // (each needs the append lock) all finish, and the chain holds.
        let mut appends = Vec::new();
        for i in 0..32 {
            let store = store.clone();
            let run = live.id.clone();
            appends.push(tokio::spawn(async move {
                store
                    .append_audit(&NewAuditRecord {
                        event: Some(AuditEvent::Proposed),
                        run_id: Some(run),
                        step_id: None,
                        tool: None,
                        actor: Some(format!("after-{i}")),
                        rule: None,
                        detail: Default::default(),
                        tenant: None,
                    })
                    .await
            }));
        }
        let finished = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            for a in appends {
                a.await.unwrap().unwrap();
            }
        })
        .await;
        assert!(finished.is_ok(), "appends after the failures hung");
        let records = store.audit_in_order(0, 10_000).await.unwrap();
        assert_eq!(
            records.len(),
            before + 3 * 8 + 32,
            "good jobs and appends only"
        );
        assert!(
            records
                .iter()
                .all(|r| r.run_id.as_deref() != Some("no-such-run")),
            "nothing of a failed job is in the chain"
        );
        assert!(store.verify_audit().await.unwrap().is_ok());
    })
    .await;
}

#[tokio::test]
async fn expired_sessions_are_swept_and_live_ones_kept() {
    let (manual, clock) = test_clock();
    each_backend(clock, move |store| {
        let manual = manual.clone();
        async move {
            let now_s = store.clock().now_ms() / 1000;
            assert!(store.session_insert("old", b"a", now_s - 10).await.unwrap());
            assert!(store.session_insert("edge", b"b", now_s).await.unwrap());
            assert!(
                store
                    .session_insert("live", b"c", now_s + 3600)
                    .await
                    .unwrap()
            );
            assert_eq!(store.session_delete_expired().await.unwrap(), 2);
            assert_eq!(store.session_count().await.unwrap(), 1);
            assert_eq!(
                store.session_load("live").await.unwrap().as_deref(),
                Some(&b"c"[..])
            );
            // An hour later the last one goes too.
            manual.advance(chrono::Duration::hours(1));
            assert_eq!(store.session_delete_expired().await.unwrap(), 1);
            assert_eq!(store.session_count().await.unwrap(), 0);
        }
    })
    .await;
}

/// A transition that names a worker ends that worker's lease on the step in the same write
/// (an executor's closing transition), and only that worker's: in the transaction's UPDATE
/// (SQLite) and in the committer's one-trip batch (Postgres).
#[tokio::test]
async fn a_transition_ends_the_lease_of_the_worker_it_names_and_no_other() {
    use countersign_core::model::{Effect, StepStatus};
    use countersign_core::store::Transition;
    let (manual, clock) = test_clock();
    each_backend(clock, move |store| {
        let manual = manual.clone();
        async move {
            let run = store
                .create_run(&NewRun {
                    planned: true,
                    ..new_run("acme")
                })
                .await
                .unwrap();
            let (a, _) = store
                .open_step(&new_step(&run.id, Effect::Write, 1))
                .await
                .unwrap();
            store
                .open_step(&new_step(&run.id, Effect::Write, 2))
                .await
                .unwrap();
            let lease = manual.now_ms() + 60_000;
            assert_eq!(
                store
                    .claim_step("w1", lease, None)
                    .await
                    .unwrap()
                    .unwrap()
                    .id,
                a.id
            );
            // (With a record: a transition without one is written alone, outside the
            // committer; this one goes through its batches, one trip on Postgres.)
            let touch = |release: &str| Transition {
                step_id: a.id.clone(),
                from: vec![StepStatus::Pending],
                to: Some(StepStatus::Pending),
                release: Some(release.to_string()),
                records: vec![(
                    countersign_core::audit::AuditEvent::Operational,
                    countersign_core::audit::NewAuditRecord {
                        event: Some(countersign_core::audit::AuditEvent::Operational),
                        run_id: Some(run.id.clone()),
                        step_id: Some(a.id.clone()),
                        ..Default::default()
                    },
                )],
                ..Transition::default()
            };
            let trips = store.one_trip_batches();
            // Another worker's name: w1 keeps it (and the run's second step waits for it).
            assert!(store.move_step(&touch("w2")).await.unwrap());
            assert!(store.claim_step("w3", lease, None).await.unwrap().is_none());
            // w1's own: the lease ends with the write; another worker may take the step.
            assert!(store.move_step(&touch("w1")).await.unwrap());
            let again = store.claim_step("w3", lease, None).await.unwrap().unwrap();
            assert_eq!(again.id, a.id);
            // The same, now that the committer knows the head (one trip on Postgres).
            assert!(store.move_step(&touch("w1")).await.unwrap());
            assert!(store.claim_step("w4", lease, None).await.unwrap().is_none());
            assert!(store.move_step(&touch("w3")).await.unwrap());
            assert_eq!(
                store
                    .claim_step("w4", lease, None)
                    .await
                    .unwrap()
                    .unwrap()
                    .id,
                a.id
            );
            if store.backend() == Backend::Postgres {
                assert!(
                    store.one_trip_batches() >= trips + 3,
                    "one-trip batches ran"
                );
            }
        }
    })
    .await;
}

/// Taking a step and reserving its key in one transaction (`start_step`): a new key is
/// reserved with the move; a key that exists (an earlier attempt's) is left as it is and
/// reported; a step that does not move reserves nothing. On Postgres the first goes in the
/// committer's one trip, the second is refused there and lands by the long path.
#[tokio::test]
async fn a_step_is_taken_with_its_key_or_told_the_key_exists() {
    use countersign_core::model::{Effect, StepStatus};
    use countersign_core::store::{KeyClaim, KeyState, Transition};
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let run = store.create_run(&new_run("acme")).await.unwrap();
        let mut steps = Vec::new();
        for n in 1..=3 {
            let (step, _) = store
                .open_step(&new_step(&run.id, Effect::Write, n))
                .await
                .unwrap();
            steps.push(step);
        }
        let start = |step: &countersign_core::store::Step, owner: &str| Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending],
            to: Some(StepStatus::Running),
            bump_attempts: true,
            reserve: Some(KeyClaim {
                idem_key: step.idem_key.clone(),
                inputs_hash: step.inputs_hash.clone(),
                owner: owner.into(),
            }),
            ..Transition::default()
        };
        // Warm the committer's head (Postgres), then: reserved with the move.
        let warm = countersign_core::audit::NewAuditRecord {
            event: Some(countersign_core::audit::AuditEvent::Proposed),
            run_id: Some(run.id.clone()),
            ..Default::default()
        };
        store.append_audit(&warm).await.unwrap();
        assert_eq!(
            store.start_step(&start(&steps[0], "t-1")).await.unwrap(),
            Some(true)
        );
        let key = store.get_key(&steps[0].idem_key).await.unwrap().unwrap();
        assert_eq!(
            (key.state, key.step_id.as_str()),
            (KeyState::InFlight, steps[0].id.as_str())
        );
        assert_eq!(key.owner, "t-1");
        // A key an earlier attempt holds: the step moves, the key stays that attempt's.
        store
            .reserve_key(
                &steps[1].idem_key,
                &steps[1].id,
                &steps[1].inputs_hash,
                "t-old",
            )
            .await
            .unwrap();
        assert_eq!(
            store.start_step(&start(&steps[1], "t-2")).await.unwrap(),
            Some(false)
        );
        assert_eq!(
            store.get_step(&steps[1].id).await.unwrap().status,
            StepStatus::Running
        );
        let key = store.get_key(&steps[1].idem_key).await.unwrap().unwrap();
        assert_eq!(key.owner, "t-old");
        // Not moved (already running): nothing reserved, nothing written.
        assert_eq!(
            store.start_step(&start(&steps[0], "t-3")).await.unwrap(),
            None
        );
        assert_eq!(
            store
                .get_key(&steps[0].idem_key)
                .await
                .unwrap()
                .unwrap()
                .owner,
            "t-1"
        );
        // A transition without a claim reserves nothing.
        let plain = Transition {
            reserve: None,
            ..start(&steps[2], "t-4")
        };
        assert_eq!(store.start_step(&plain).await.unwrap(), Some(false));
        assert!(store.get_key(&steps[2].idem_key).await.unwrap().is_none());
    })
    .await;
}

/// Postgres: a read written with its outcome goes in one trip once the committer knows its
/// chain's head (migration 24), and one whose guard refuses it there (its run was cancelled)
/// writes nothing in that trip: the multi-statement path keeps its row as prepared, with no
/// record.
#[tokio::test]
async fn reads_go_in_one_trip_and_a_refused_one_is_kept_prepared() {
    use countersign_core::model::StepStatus;
    use countersign_core::store::RunGuard;
    let (_, clock) = test_clock();
    let Some(db) = FreshDb::create(Backend::Postgres).await else {
        return;
    };
    let store = db.store(clock).await;
    let run = store.create_run(&new_run("acme")).await.unwrap();
    let guard = RunGuard {
        run_id: run.id.clone(),
        allow_failed: false,
        unless_switch: None,
    };
    // The first batch reads the chain's head.
    let first = closing_read(&store, &run.id, 0, Some(guard.clone()));
    assert!(store.move_step(&first).await.unwrap());
    let trips = store.one_trip_batches();
    let second = closing_read(&store, &run.id, 1, Some(guard.clone()));
    assert!(store.move_step(&second).await.unwrap());
    assert_eq!(
        store.one_trip_batches(),
        trips + 1,
        "a read goes in one trip"
    );
    let written = store.get_step(&second.step_id).await.unwrap();
    assert_eq!(written.status, StepStatus::Done);
    assert_eq!(written.seq, 2, "the run's next position");
    assert_eq!(written.attempts, 1);
    assert_eq!(written.outcome.as_deref(), Some("{}"));
    let records = store.audit_in_order(0, 1_000_000).await.unwrap();
    assert_eq!(
        records
            .iter()
            .filter(|r| r.step_id.as_deref() == Some(second.step_id.as_str()))
            .count(),
        1,
        "its one record"
    );

    store
        .set_run_status(&run.id, RunStatus::Cancelled)
        .await
        .unwrap();
    let refused = closing_read(&store, &run.id, 2, Some(guard));
    assert!(!store.move_step(&refused).await.unwrap());
    assert_eq!(
        store.one_trip_batches(),
        trips + 1,
        "the refused trip wrote nothing"
    );
    let kept = store.get_step(&refused.step_id).await.unwrap();
    assert_eq!(kept.status, StepStatus::Pending, "kept as prepared");
    assert_eq!(kept.seq, 3);
    assert_eq!(kept.outcome, None);
    assert_eq!(
        store.audit_in_order(0, 1_000_000).await.unwrap().len(),
        records.len(),
        "no record for the refused read"
    );
    store.close().await;
    db.drop_db().await;
}

/// Postgres, with `one_trip_reads` ablated (the benchmark's switch): a read takes the
/// multi-statement path even once the head is known, and is written the same, done.
#[tokio::test]
async fn with_reads_ablated_a_read_takes_the_long_path_and_is_written_the_same() {
    use countersign_core::model::StepStatus;
    use countersign_core::store::Ablations;
    let (_, clock) = test_clock();
    let Some(db) = FreshDb::create(Backend::Postgres).await else {
        return;
    };
    let options = ConnectOptions {
        ablations: Ablations::parse("one_trip_reads").unwrap(),
        ..ConnectOptions::default()
    };
    let store = Store::connect(&db.url, &options, clock).await.unwrap();
    store.migrate().await.unwrap();
    let run = store.create_run(&new_run("acme")).await.unwrap();
    let first = closing_read(&store, &run.id, 0, None);
    assert!(store.move_step(&first).await.unwrap());
    let second = closing_read(&store, &run.id, 1, None);
    assert!(store.move_step(&second).await.unwrap());
    assert_eq!(store.one_trip_batches(), 0, "no read went in one trip");
    let written = store.get_step(&second.step_id).await.unwrap();
    assert_eq!(
        (written.status, written.seq, written.attempts),
        (StepStatus::Done, 2, 1)
    );
    assert_eq!(store.verify_audit().await.unwrap(), Ok(2));
    store.close().await;
    db.drop_db().await;
}

/// SQLite keeps temporary tables and statement journals in memory on every pooled connection
/// (no temp file created and unlinked per write transaction).
#[tokio::test]
async fn sqlite_connections_keep_temporary_storage_in_memory() {
    let (_, clock) = test_clock();
    let db = FreshDb::create(Backend::Sqlite).await.unwrap();
    let store = db.store(clock).await;
    for _ in 0..3 {
        let mode = store
            .query_strings("SELECT CAST(temp_store AS TEXT) FROM pragma_temp_store")
            .await
            .unwrap();
        assert_eq!(mode, ["2"], "2 = MEMORY");
    }
    store.close().await;
}
