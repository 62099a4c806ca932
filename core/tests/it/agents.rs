//! Agent credentials: the hash is stored, revoked and expired tokens are refused.

use chrono::Duration;
use countersign_core::Clock;
use countersign_core::agents::AgentToken;
use countersign_core::store::testing::each_backend;
use countersign_core::store::{AuthError, CreateAgentError, NewAgent, StoreError};

use crate::test_clock;

fn agent(name: &str, expires_at: Option<i64>) -> NewAgent {
    NewAgent {
        name: name.into(),
        role: "worker.finance".into(),
        tenant: "acme".into(),
        created_by: "admin@acme".into(),
        expires_at,
        acts_for: None,
        origin: countersign_core::policy::TaskOrigin::User,
    }
}

#[tokio::test]
async fn a_created_token_authenticates_and_only_its_hash_is_stored() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let (cred, token) = store
            .create_agent(&agent("invoice-bot", None))
            .await
            .unwrap();
        let ok = store
            .authenticate_agent(&AgentToken::presented(token.reveal()))
            .await
            .unwrap();
        assert_eq!(ok, Ok(cred.clone()));
        assert_eq!(cred.role, "worker.finance");

        // The database never holds the token itself.
        let dump = store.list_agents().await.unwrap();
        assert!(!format!("{dump:?}").contains(token.reveal()));
        let leaked = store
            .execute_sql(&format!(
                "UPDATE agent_credentials SET name = name WHERE token_hash = '{}'",
                token.reveal()
            ))
            .await
            .unwrap();
        assert_eq!(leaked, 0, "no row stores the clear token");
    })
    .await;
}

#[tokio::test]
async fn unknown_malformed_revoked_and_expired_tokens_are_refused() {
    let (manual, clock) = test_clock();
    each_backend(clock, move |store| {
        let manual = manual.clone();
        async move {
            let unknown = AgentToken::generate().unwrap();
            assert_eq!(
                store.authenticate_agent(&unknown).await.unwrap(),
                Err(AuthError::Unknown)
            );
            assert_eq!(
                store
                    .authenticate_agent(&AgentToken::presented("' OR 1=1 --"))
                    .await
                    .unwrap(),
                Err(AuthError::Unknown)
            );

            let (cred, token) = store.create_agent(&agent("to-revoke", None)).await.unwrap();
            let revoked = store.revoke_agent("to-revoke", "test").await.unwrap();
            assert!(revoked.revoked_at.is_some());
            assert_eq!(
                store.authenticate_agent(&token).await.unwrap(),
                Err(AuthError::Revoked(cred.id.clone()))
            );
            // Revoking again keeps the first time.
            manual.advance(Duration::seconds(10));
            let again = store.revoke_agent(&cred.id, "test").await.unwrap();
            assert_eq!(again.revoked_at, revoked.revoked_at);

            let expires = manual.now_ms() + 30 * 24 * 3600 * 1000;
            let (cred, token) = store
                .create_agent(&agent("short-lived", Some(expires)))
                .await
                .unwrap();
            assert!(store.authenticate_agent(&token).await.unwrap().is_ok());
            manual.advance(Duration::days(30));
            assert_eq!(
                store.authenticate_agent(&token).await.unwrap(),
                Err(AuthError::Expired(cred.id))
            );
        }
    })
    .await;
}

#[tokio::test]
async fn names_are_unique_among_active_credentials_and_fields_required() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        store.create_agent(&agent("bot", None)).await.unwrap();
        assert!(matches!(
            store.create_agent(&agent("bot", None)).await,
            Err(CreateAgentError::Invalid(_))
        ));
        store.revoke_agent("bot", "test").await.unwrap();
        // After revocation the name may be reused.
        store.create_agent(&agent("bot", None)).await.unwrap();
        let mut empty = agent("x", None);
        empty.role = " ".into();
        assert!(matches!(
            store.create_agent(&empty).await,
            Err(CreateAgentError::Invalid(_))
        ));
        assert_eq!(store.list_agents().await.unwrap().len(), 2);
    })
    .await;
}

#[tokio::test]
async fn a_name_is_unique_within_its_tenant_and_ambiguous_across_tenants() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let (acme, _) = store.create_agent(&agent("ap-bot", None)).await.unwrap();
        let mut other = agent("ap-bot", None);
        other.tenant = "globex".into();
        // Another tenant may use the name (its keys, and the name's index, start with the tenant).
        let (globex, _) = store.create_agent(&other).await.unwrap();
        assert_ne!(acme.id, globex.id);
        // Named without a tenant, it is ambiguous: refused, never one of the two picked.
        assert!(
            matches!(
                store.find_agent("ap-bot").await,
                Err(StoreError::Conflict(_))
            ),
            "{:?}",
            store.find_agent("ap-bot").await
        );
        assert!(store.revoke_agent("ap-bot", "test").await.is_err());
        // By id, each is found; once one is revoked, the name is no longer ambiguous.
        assert_eq!(store.find_agent(&acme.id).await.unwrap().tenant, "acme");
        store.revoke_agent(&globex.id, "test").await.unwrap();
        assert_eq!(store.find_agent("ap-bot").await.unwrap().id, acme.id);
    })
    .await;
}

#[tokio::test]
async fn two_creations_of_one_name_at_once_leave_one_active_credential() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        for round in 0..8 {
            let name = format!("fin-bot-{round}");
            let (first, second) = (agent(&name, None), agent(&name, None));
            let (a, b) = tokio::join!(store.create_agent(&first), store.create_agent(&second));
            assert_eq!(
                usize::from(a.is_ok()) + usize::from(b.is_ok()),
                1,
                "round {round}: {a:?} / {b:?}"
            );
            let refused = if a.is_ok() { b } else { a };
            assert!(
                matches!(refused, Err(CreateAgentError::Invalid(_))),
                "{refused:?}"
            );
            // Revoking by name leaves no active credential of that name.
            store.revoke_agent(&name, "test").await.unwrap();
            let active = store
                .list_agents()
                .await
                .unwrap()
                .into_iter()
                .filter(|c| c.name == name && c.revoked_at.is_none())
                .count();
            assert_eq!(active, 0);
        }
    })
    .await;
}

#[tokio::test]
async fn creating_and_revoking_a_credential_are_audited_without_its_token() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let (cred, token) = store.create_agent(&agent("audited", None)).await.unwrap();
        // A refused creation (the name is taken) records nothing.
        assert!(store.create_agent(&agent("audited", None)).await.is_err());
        store
            .revoke_agent("audited", "person:https://idp.example#ana")
            .await
            .unwrap();
        // Revoking again changes nothing and records nothing.
        store.revoke_agent(&cred.id, "someone-else").await.unwrap();
        assert!(store.revoke_agent("no-such-credential", "x").await.is_err());

        let records = store.audit_in_order(0, 1_000).await.unwrap();
        let ours: Vec<_> = records
            .iter()
            .filter(|r| r.record.contains(&cred.id))
            .collect();
        let rules: Vec<_> = ours
            .iter()
            .map(|r| r.rule.as_deref().unwrap_or(""))
            .collect();
        assert_eq!(rules, ["agent.created", "agent.revoked"], "{records:?}");
        assert_eq!(ours[0].actor.as_deref(), Some("admin@acme"));
        assert_eq!(
            ours[1].actor.as_deref(),
            Some("person:https://idp.example#ana")
        );
        for r in &ours {
            assert_eq!(r.event, "operational");
            assert!(r.record.contains("\"tenant\":\"acme\""), "{}", r.record);
            assert!(
                r.record.contains("\"role\":\"worker.finance\""),
                "{}",
                r.record
            );
            assert!(!r.record.contains(token.reveal()));
            assert!(
                !r.record
                    .contains(token.hash().trim_start_matches("sha256:"))
            );
        }
        assert_eq!(records.len(), 2, "{records:?}");
        store.verify_audit().await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test]
async fn revoking_by_id_never_takes_a_credential_named_like_that_id() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let (target, _) = store.create_agent(&agent("target", None)).await.unwrap();
        let (decoy, _) = store.create_agent(&agent(&target.id, None)).await.unwrap();
        let revoked = store.revoke_agent(&target.id, "admin").await.unwrap();
        assert_eq!(revoked.id, target.id);
        assert!(
            store
                .get_agent(&decoy.id)
                .await
                .unwrap()
                .revoked_at
                .is_none()
        );
        // A name still works when no id matches.
        let (bot, _) = store.create_agent(&agent("bot", None)).await.unwrap();
        assert_eq!(store.revoke_agent("bot", "admin").await.unwrap().id, bot.id);
    })
    .await;
}
