//! MCP sessions as rows (`Store::mcp_session*`): only the opening agent, in its tenant, touches
//! or ends a session; a touch answers only while the session is live (not ended, touched
//! within the idle limit) and never revives one; ending is final and is what every replica
//! polls for.

use countersign_core::Clock;
use countersign_core::store::testing::each_backend;

use crate::test_clock;

const IDLE_MS: i64 = 360_000;

#[tokio::test]
async fn sessions_are_their_agents_alone_and_end_for_good() {
    let (manual, clock) = test_clock();
    each_backend(clock, move |store| {
        let manual = manual.clone();
        async move {
            let params = r#"{"protocolVersion":"x"}"#;
            for (tenant, id) in [("acme", "s1"), ("acme", "s2"), ("globex", "s3")] {
                store
                    .mcp_session_open(tenant, id, "agent-a", params)
                    .await
                    .unwrap();
            }
            let touched = store
                .mcp_session_touch("acme", "s1", "agent-a", IDLE_MS)
                .await
                .unwrap();
            assert_eq!(
                touched.as_deref(),
                Some(params),
                "the opener touches its session"
            );
            // Another agent, or the right agent in another tenant, finds nothing.
            for (tenant, agent) in [("acme", "agent-b"), ("globex", "agent-a")] {
                let touched = store
                    .mcp_session_touch(tenant, "s1", agent, IDLE_MS)
                    .await
                    .unwrap();
                assert_eq!(touched, None, "{tenant}/{agent}");
            }
            assert!(
                !store
                    .mcp_session_end("acme", "s1", "agent-b")
                    .await
                    .unwrap()
            );
            assert_eq!(
                store
                    .mcp_sessions_live("acme", "agent-a", IDLE_MS)
                    .await
                    .unwrap(),
                2
            );

            // s2 touched half-way; past the limit s1 is idle for good: not live, not counted,
            // and a touch does not bring it back.
            manual.advance(chrono::Duration::milliseconds(IDLE_MS / 2));
            assert!(
                store
                    .mcp_session_touch("acme", "s2", "agent-a", IDLE_MS)
                    .await
                    .unwrap()
                    .is_some()
            );
            manual.advance(chrono::Duration::milliseconds(IDLE_MS / 2 + 1));
            for _ in 0..2 {
                let touched = store
                    .mcp_session_touch("acme", "s1", "agent-a", IDLE_MS)
                    .await
                    .unwrap();
                assert_eq!(touched, None);
            }
            assert_eq!(
                store
                    .mcp_sessions_live("acme", "agent-a", IDLE_MS)
                    .await
                    .unwrap(),
                1
            );

            // Ended: final, and listed for the replicas' poll.
            let at = manual.now_ms();
            assert!(
                store
                    .mcp_session_end("acme", "s2", "agent-a")
                    .await
                    .unwrap()
            );
            assert!(
                !store
                    .mcp_session_end("acme", "s2", "agent-a")
                    .await
                    .unwrap()
            );
            let touched = store
                .mcp_session_touch("acme", "s2", "agent-a", IDLE_MS)
                .await
                .unwrap();
            assert_eq!(touched, None);
            let ended = store.mcp_sessions_ended_since(at).await.unwrap();
            assert_eq!(ended, vec![("s2".to_string(), at)]);
            assert!(
                store
                    .mcp_sessions_ended_since(at + 1)
                    .await
                    .unwrap()
                    .is_empty()
            );

            // Rows untouched for long are deleted, ended or not.
            manual.advance(chrono::Duration::milliseconds(10));
            let forgotten = store.mcp_sessions_forget(manual.now_ms()).await.unwrap();
            assert_eq!(forgotten, 3);
        }
    })
    .await;
}
