//! Standing authorizations in the store: refusals first (expired, revoked, another party,
//! another tenant, unreadable conditions cover nothing), then grants and revocations with their
//! audit records — on SQLite and Postgres.

use chrono::Duration;
use countersign_core::Store;
use countersign_core::policy::AuthorizationCondition as Cond;
use countersign_core::policy::TaskOrigin;
use countersign_core::store::testing::each_backend;
use countersign_core::store::{
    GRANTED_RULE, NewAgent, NewStanding, REVOKED_RULE, StandingError, StandingState, StoreError,
};

use crate::test_clock;

const HOUR_MS: i64 = 3_600_000;

fn grant(store: &Store, id: &str, tenant: &str, party: &str, expires_in_ms: i64) -> NewStanding {
    NewStanding {
        id: Some(id.into()),
        tenant: tenant.into(),
        party: party.into(),
        tool: "reservation.modify".into(),
        conditions: vec![Cond::OwnsResource, Cond::MaxShiftMinutes(30)],
        expires_at: store.clock().now_ms() + expires_in_ms,
        reason: "the traveller lets dinner move by half an hour".into(),
        granted_by: "ops@stillon".into(),
    }
}

fn ids(grants: &[countersign_core::policy::StandingAuthorization]) -> Vec<&str> {
    grants.iter().map(|g| g.id.as_str()).collect()
}

#[tokio::test]
async fn standing_expired_revoked_and_other_parties_grants_cover_nothing() {
    let (manual, clock) = test_clock();
    each_backend(clock, move |store| {
        let manual = manual.clone();
        async move {
            let day = 24 * HOUR_MS;
            for g in [
                grant(&store, "SA-long", "stillon", "user-123", 30 * day),
                grant(&store, "SA-short", "stillon", "user-123", HOUR_MS),
                grant(&store, "SA-revoked", "stillon", "user-123", 30 * day),
                grant(&store, "SA-other-party", "stillon", "user-999", 30 * day),
                grant(&store, "SA-other-tenant", "globex", "user-123", 30 * day),
            ] {
                store.grant_standing(&g).await.unwrap();
            }
            store
                .revoke_standing("SA-revoked", None, "ops@stillon", "the traveller withdrew it")
                .await
                .unwrap();
            // A row whose conditions no longer parse (written by hand, or a newer build).
            store
                .execute_sql(&format!(
                    "INSERT INTO standing_authorizations (id, tenant, party, tool, conditions, \
                     expires_at, reason, granted_by, granted_at) VALUES ('SA-garbled', 'stillon', \
                     'user-123', 'reservation.modify', '[{{\"max_shift_minutes\": \"lots\"}}]', {}, \
                     'by hand', 'someone', 0)",
                    store.clock().now_ms() + 30 * day
                ))
                .await
                .unwrap();

            let now = store.clock().now_ms();
            let held = store.standing_for("stillon", "user-123", now).await.unwrap();
            assert_eq!(ids(&held), ["SA-long", "SA-short"]);
            assert_eq!(held[0].principal, "user-123");
            assert_eq!(
                held[0].conditions,
                [Cond::OwnsResource, Cond::MaxShiftMinutes(30)]
            );
            assert_eq!(
                ids(&store.standing_for("stillon", "user-999", now).await.unwrap()),
                ["SA-other-party"]
            );
            assert_eq!(
                ids(&store.standing_for("globex", "user-123", now).await.unwrap()),
                ["SA-other-tenant"]
            );
            assert!(
                store
                    .standing_for("stillon", "nobody", now)
                    .await
                    .unwrap()
                    .is_empty()
            );

            // At its expiry instant a grant covers nothing any more.
            manual.advance(Duration::hours(1));
            let now = store.clock().now_ms();
            let held = store.standing_for("stillon", "user-123", now).await.unwrap();
            assert_eq!(ids(&held), ["SA-long"]);

            let states: Vec<(String, StandingState)> = store
                .list_standing(Some("stillon"))
                .await
                .unwrap()
                .into_iter()
                .map(|g| (g.id.clone(), g.state(now)))
                .collect();
            for (id, want) in [
                ("SA-long", StandingState::Active),
                ("SA-short", StandingState::Expired),
                ("SA-revoked", StandingState::Revoked),
                ("SA-other-party", StandingState::Active),
                ("SA-garbled", StandingState::Unreadable),
            ] {
                assert!(
                    states.iter().any(|(i, s)| i == id && *s == want),
                    "{id} should be {want:?}: {states:?}"
                );
            }
            assert!(!states.iter().any(|(i, _)| i == "SA-other-tenant"));
            assert_eq!(store.list_standing(None).await.unwrap().len(), 6);
        }
    })
    .await;
}

#[tokio::test]
async fn standing_grants_without_a_future_expiry_who_why_or_a_free_id_are_refused() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let refused = |r: Result<_, StandingError>| match r {
            Err(StandingError::Invalid(why)) => why,
            other => panic!("expected a refusal, got {other:?}"),
        };
        let expired = grant(&store, "SA-1", "stillon", "user-123", 0);
        assert!(refused(store.grant_standing(&expired).await).contains("future"));
        let past = grant(&store, "SA-1", "stillon", "user-123", -HOUR_MS);
        assert!(refused(store.grant_standing(&past).await).contains("future"));
        for blank in ["party", "tenant", "tool", "reason", "granted_by"] {
            let mut g = grant(&store, "SA-1", "stillon", "user-123", HOUR_MS);
            match blank {
                "party" => g.party = " ".into(),
                "tenant" => g.tenant = String::new(),
                "tool" => g.tool = String::new(),
                "reason" => g.reason = String::new(),
                _ => g.granted_by = String::new(),
            }
            assert!(refused(store.grant_standing(&g).await).contains(blank));
        }
        assert!(store.list_standing(None).await.unwrap().is_empty());
        // Nothing refused was audited.
        assert!(store.audit_in_order(0, 100).await.unwrap().is_empty());

        store
            .grant_standing(&grant(&store, "SA-1", "stillon", "user-123", HOUR_MS))
            .await
            .unwrap();
        let again = grant(&store, "SA-1", "stillon", "user-999", 2 * HOUR_MS);
        assert!(refused(store.grant_standing(&again).await).contains("exists"));
        // An id names one grant in every tenant, though the keys start with the tenant.
        let elsewhere = grant(&store, "SA-1", "globex", "user-123", HOUR_MS);
        assert!(refused(store.grant_standing(&elsewhere).await).contains("exists"));
        let kept = store.get_standing("SA-1").await.unwrap().unwrap();
        assert_eq!(kept.party, "user-123", "the first grant is untouched");
        // Seeding the same id is a no-op, not an error.
        assert!(!store.seed_standing(&again).await.unwrap());
        // Without an id, one is made up.
        let mut anon = grant(&store, "x", "stillon", "user-123", HOUR_MS);
        anon.id = None;
        let made = store.grant_standing(&anon).await.unwrap();
        assert!(made.id.starts_with("SA-"), "{}", made.id);
    })
    .await;
}

#[tokio::test]
async fn standing_changes_are_audited_and_a_revoked_grant_stays_revoked() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let g = store
            .grant_standing(&grant(&store, "SA-1", "stillon", "user-123", HOUR_MS))
            .await
            .unwrap();
        assert_eq!(g.granted_by, "ops@stillon");
        assert!(matches!(
            store
                .revoke_standing("SA-nope", None, "ops@stillon", "typo")
                .await,
            Err(StandingError::NotFound(_))
        ));
        assert!(matches!(
            store.revoke_standing("SA-1", None, "ops@stillon", "").await,
            Err(StandingError::Invalid(_))
        ));
        let revoked = store
            .revoke_standing("SA-1", None, "lead@stillon", "the traveller withdrew it")
            .await
            .unwrap();
        assert_eq!(revoked.revoked_by.as_deref(), Some("lead@stillon"));
        assert!(revoked.revoked_at.is_some());
        assert!(matches!(
            store
                .revoke_standing("SA-1", None, "lead@stillon", "again")
                .await,
            Err(StandingError::AlreadyRevoked(_))
        ));
        // Re-granting the same id does not revive it.
        assert!(
            !store
                .seed_standing(&grant(&store, "SA-1", "stillon", "user-123", HOUR_MS))
                .await
                .unwrap()
        );
        let now = store.clock().now_ms();
        assert!(
            store
                .standing_for("stillon", "user-123", now)
                .await
                .unwrap()
                .is_empty()
        );

        let records = store.audit_in_order(0, 100).await.unwrap();
        let rules: Vec<(&str, Option<&str>, Option<&str>)> = records
            .iter()
            .map(|r| (r.event.as_str(), r.rule.as_deref(), r.actor.as_deref()))
            .collect();
        assert_eq!(
            rules,
            [
                ("operational", Some(GRANTED_RULE), Some("ops@stillon")),
                ("operational", Some(REVOKED_RULE), Some("lead@stillon")),
            ]
        );
        let granted: serde_json::Value = serde_json::from_str(&records[0].record).unwrap();
        assert_eq!(granted["tool"], "reservation.modify");
        assert_eq!(granted["detail"]["id"], "SA-1");
        assert_eq!(granted["detail"]["party"], "user-123");
        assert_eq!(
            granted["detail"]["conditions"],
            serde_json::json!(["owns_resource", {"max_shift_minutes": 30}])
        );
        let revoked: serde_json::Value = serde_json::from_str(&records[1].record).unwrap();
        assert_eq!(revoked["detail"]["reason"], "the traveller withdrew it");
        assert_eq!(store.verify_audit().await.unwrap(), Ok(2));
    })
    .await;
}

#[tokio::test]
async fn a_calls_context_reads_run_stop_party_and_the_partys_grants_exactly_as_standing_for() {
    use countersign_core::store::{NewRun, RunStatus, StoreError};
    let (manual, clock) = test_clock();
    each_backend(clock, move |store| {
        let manual = manual.clone();
        async move {
            let day = 24 * HOUR_MS;
            let (agent, _) = store
                .create_agent(&NewAgent {
                    name: "agent-7".into(),
                    role: "traveller.assistant".into(),
                    tenant: "stillon".into(),
                    created_by: "admin@stillon".into(),
                    expires_at: None,
                    acts_for: None,
                    origin: TaskOrigin::User,
                })
                .await
                .unwrap();
            let agent_id = agent.id.clone();
            for g in [
                grant(&store, "SA-traveller", "stillon", "user-123", 30 * day),
                grant(&store, "SA-short", "stillon", "user-123", HOUR_MS),
                grant(&store, "SA-revoked", "stillon", "user-123", 30 * day),
                grant(&store, "SA-agent", "stillon", &agent_id, 30 * day),
                grant(&store, "SA-other-tenant", "globex", "user-123", 30 * day),
            ] {
                store.grant_standing(&g).await.unwrap();
            }
            store
                .revoke_standing("SA-revoked", None, "ops@stillon", "withdrawn")
                .await
                .unwrap();
            let run = store
                .create_run(&NewRun {
                    tenant: "stillon".into(),
                    principal: "agent:agent-7".into(),
                    agent_id: None,
                    task: "keep dinner".into(),
                    origin: "monitor".into(),
                    planned: false,
                })
                .await
                .unwrap();
            let now = store.clock().now_ms();
            let context_in = |tenant: &'static str, now: i64| {
                let store = store.clone();
                let run_id = run.id.clone();
                let agent_id = agent_id.clone();
                async move {
                    store
                        .call_context(&run_id, "emergency_stop", tenant, &agent_id, now)
                        .await
                }
            };
            let context = |now: i64| context_in("stillon", now);

            // Unbound: the agent itself holds the grants (its own only).
            let c = context(now).await.unwrap();
            assert_eq!(c.run_status, RunStatus::Active);
            assert!(!c.switch_set);
            assert_eq!(c.party, None);
            assert_eq!(ids(&c.grants), ["SA-agent"]);

            // Bound to the traveller (an operator's binding): the traveller's live grants of
            // this tenant, the same as standing_for, in the same order.
            store
                .bind_agent(&agent_id, Some("user-123"), TaskOrigin::User, "ops@stillon")
                .await
                .unwrap();
            // Asked for another tenant than the credential's, the binding binds nothing.
            let c = context_in("globex", now).await.unwrap();
            assert_eq!(c.party, None);
            assert!(c.grants.is_empty());
            let c = context(now).await.unwrap();
            assert_eq!(c.party.as_deref(), Some("user-123"));
            assert_eq!(ids(&c.grants), ["SA-short", "SA-traveller"]);
            assert_eq!(
                c.grants,
                store
                    .standing_for("stillon", "user-123", now)
                    .await
                    .unwrap()
            );

            // Expiry, the stop and the run's status are read at the instant asked.
            manual.advance(Duration::hours(1));
            store
                .set_switch("emergency_stop", "drill", "ops")
                .await
                .unwrap();
            store
                .set_run_status(&run.id, RunStatus::Cancelled)
                .await
                .unwrap();
            let c = context(store.clock().now_ms()).await.unwrap();
            assert_eq!(ids(&c.grants), ["SA-traveller"]);
            assert!(c.switch_set);
            assert_eq!(c.run_status, RunStatus::Cancelled);

            // No such run: not found, never an empty context.
            assert!(matches!(
                store
                    .call_context("no-such-run", "emergency_stop", "stillon", &agent_id, now)
                    .await,
                Err(StoreError::NotFound)
            ));
        }
    })
    .await;
}

/// The executor's one read before a planned step: the run, its agent's credential as stored
/// and that agent's context — each exactly what the separate reads return.
#[tokio::test]
async fn a_planned_calls_read_is_its_run_its_agent_and_that_agents_context() {
    use countersign_core::store::{NewRun, StoreError};
    let (_, clock) = test_clock();
    each_backend(clock, move |store| async move {
        let (agent, _) = store
            .create_agent(&NewAgent {
                name: "planner".into(),
                role: "traveller.assistant".into(),
                tenant: "stillon".into(),
                created_by: "admin@stillon".into(),
                expires_at: None,
                acts_for: None,
                origin: TaskOrigin::User,
            })
            .await
            .unwrap();
        let day = 24 * HOUR_MS;
        for g in [
            grant(&store, "SA-traveller", "stillon", "user-123", 30 * day),
            grant(&store, "SA-agent", "stillon", &agent.id, 30 * day),
            grant(&store, "SA-other-tenant", "globex", "user-123", 30 * day),
        ] {
            store.grant_standing(&g).await.unwrap();
        }
        let new_run = |agent_id: Option<String>| NewRun {
            tenant: "stillon".into(),
            principal: "user-123".into(),
            agent_id,
            task: "keep dinner".into(),
            origin: "user".into(),
            planned: true,
        };
        let run = store
            .create_run(&new_run(Some(agent.id.clone())))
            .await
            .unwrap();
        let expect = |store: Store, run_id: String, agent_id: String| async move {
            let now = store.clock().now_ms();
            store
                .call_context(&run_id, "emergency_stop", "stillon", &agent_id, now)
                .await
                .unwrap()
        };

        // Unbound: the agent's own grants.
        let call = store
            .planned_call(&run.id, 0, "emergency_stop")
            .await
            .unwrap();
        assert_eq!(call.run.id, run.id);
        assert_eq!(call.run.agent_id.as_deref(), Some(agent.id.as_str()));
        assert_eq!(call.run.status, run.status);
        assert_eq!(call.agent.as_ref(), Some(&agent));
        let context = call.context.unwrap();
        assert_eq!(ids(&context.grants), ["SA-agent"]);
        assert_eq!(
            context,
            expect(store.clone(), run.id.clone(), agent.id.clone()).await
        );

        // Bound to the traveller, with the stop set: the traveller's grants, the switch seen.
        store
            .bind_agent(&agent.id, Some("user-123"), TaskOrigin::User, "ops@stillon")
            .await
            .unwrap();
        store
            .set_switch("emergency_stop", "drill", "ops")
            .await
            .unwrap();
        let context = store
            .planned_call(&run.id, 0, "emergency_stop")
            .await
            .unwrap()
            .context
            .unwrap();
        assert_eq!(context.party.as_deref(), Some("user-123"));
        assert!(context.switch_set);
        assert_eq!(ids(&context.grants), ["SA-traveller"]);
        assert_eq!(
            context,
            expect(store.clone(), run.id.clone(), agent.id.clone()).await
        );

        // The steps after a position that are not done yet.
        use countersign_core::model::{Effect, StepStatus};
        let mut steps = Vec::new();
        for n in 1..=2 {
            let (step, _) = store
                .open_step(&crate::store::new_step(&run.id, Effect::Write, n))
                .await
                .unwrap();
            steps.push(step);
        }
        let later = |seq: i64| {
            let (store, run_id) = (store.clone(), run.id.clone());
            async move {
                store
                    .planned_call(&run_id, seq, "emergency_stop")
                    .await
                    .unwrap()
                    .later_open
            }
        };
        assert_eq!((later(0).await, later(1).await, later(2).await), (2, 1, 0));
        let done = countersign_core::store::Transition {
            step_id: steps[1].id.clone(),
            from: vec![StepStatus::Pending],
            to: Some(StepStatus::Done),
            ..Default::default()
        };
        assert!(store.move_step(&done).await.unwrap());
        assert_eq!((later(0).await, later(1).await), (1, 0));

        // A run without an agent: no credential, no context; no such run: not found.
        let lone = store.create_run(&new_run(None)).await.unwrap();
        let call = store
            .planned_call(&lone.id, 0, "emergency_stop")
            .await
            .unwrap();
        assert_eq!(call.run.id, lone.id);
        assert!(call.agent.is_none() && call.context.is_none());
        assert!(matches!(
            store.planned_call("no-such-run", 0, "emergency_stop").await,
            Err(StoreError::NotFound)
        ));
    })
    .await;
}

/// Grant ids are free across tenants when granted, but the keys start with the tenant: should
/// two racing grants ever leave one id in two tenants (Postgres), the id alone names neither —
/// refused as ambiguous — and the tenant names each, so both stay revocable.
#[tokio::test]
async fn an_id_two_tenants_hold_is_revoked_by_naming_the_tenant() {
    let (_, clock) = test_clock();
    let Some(db) =
        countersign_core::store::testing::FreshDb::create(countersign_core::Backend::Postgres)
            .await
    else {
        return;
    };
    let store = db.store(clock).await;
    store
        .grant_standing(&grant(&store, "SA-twin", "stillon", "user-1", HOUR_MS))
        .await
        .unwrap();
    // What the race would leave: the same id in another tenant.
    store
        .execute_sql(
            "INSERT INTO standing_authorizations (id, tenant, party, tool, conditions, expires_at,
                 reason, granted_by, granted_at)
             SELECT id, 'globex', party, tool, conditions, expires_at, reason, granted_by,
                    granted_at FROM standing_authorizations WHERE id = 'SA-twin'",
        )
        .await
        .unwrap();
    let ambiguous = store
        .revoke_standing("SA-twin", None, "ops@stillon", "withdrawn")
        .await;
    assert!(
        matches!(
            &ambiguous,
            Err(StandingError::Store(StoreError::Conflict(_)))
        ),
        "{ambiguous:?}"
    );
    let revoked = store
        .revoke_standing("SA-twin", Some("globex"), "ops@stillon", "withdrawn")
        .await
        .unwrap();
    assert_eq!(revoked.tenant, "globex");
    assert!(revoked.revoked_at.is_some());
    let kept = store.list_standing(Some("stillon")).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert!(
        kept[0].revoked_at.is_none(),
        "the other tenant's grant is untouched"
    );
    store.close().await;
    db.drop_db().await;
}
