//! OAuth client registrations (`Store::register_oauth_agent`, `authenticate_oauth`): one active
//! registration per (issuer, client) across tenants; revoking it refuses the client at once.

use countersign_core::store::testing::each_backend;
use countersign_core::store::{AuthError, NewAgent};

use crate::test_clock;

fn agent(name: &str, tenant: &str) -> NewAgent {
    NewAgent {
        name: name.into(),
        role: "worker.finance".into(),
        tenant: tenant.into(),
        created_by: "person:https://idp.example#admin".into(),
        expires_at: None,
        acts_for: None,
        origin: countersign_core::policy::TaskOrigin::User,
    }
}

const AS: &str = "https://as.example";

#[tokio::test]
async fn a_client_is_one_agent_until_its_registration_is_revoked() {
    let (_, clock) = test_clock();
    each_backend(clock, |store| async move {
        let cred = store
            .register_oauth_agent(&agent("fin-oauth", "acme"), AS, "fin-client")
            .await
            .unwrap();
        let found = store.authenticate_oauth(AS, "fin-client").await.unwrap();
        assert_eq!(found.map(|c| c.id), Ok(cred.id.clone()));
        // Another issuer's client of the same id, or another client, is nobody.
        for (issuer, client) in [("https://other.example", "fin-client"), (AS, "fin")] {
            let found = store.authenticate_oauth(issuer, client).await.unwrap();
            assert_eq!(found, Err(AuthError::Unknown), "{issuer} {client}");
        }
        // The same client cannot be registered twice, in any tenant.
        for tenant in ["acme", "globex"] {
            let again = store
                .register_oauth_agent(&agent(&format!("dup-{tenant}"), tenant), AS, "fin-client")
                .await;
            assert!(again.is_err(), "{tenant}");
        }
        // A registration has no token anyone could present.
        assert!(store.list_agents().await.unwrap().len() == 1);
        store
            .revoke_agent(&cred.id, "person:https://idp.example#admin")
            .await
            .unwrap();
        let found = store.authenticate_oauth(AS, "fin-client").await.unwrap();
        assert_eq!(found, Err(AuthError::Revoked(cred.id.clone())));
        // Once revoked, the client may be registered again (a new credential).
        let renewed = store
            .register_oauth_agent(&agent("fin-oauth-2", "acme"), AS, "fin-client")
            .await
            .unwrap();
        let found = store.authenticate_oauth(AS, "fin-client").await.unwrap();
        assert_eq!(found.map(|c| c.id), Ok(renewed.id));
        let listed = store.oauth_registrations().await.unwrap();
        assert_eq!(listed.len(), 2);
    })
    .await;
}
