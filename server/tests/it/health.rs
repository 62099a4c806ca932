use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::each_app;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_200_when_the_database_answers_and_503_when_it_does_not() {
    each_app(|app| async move {
        let resp = app.client.get(app.url("/healthz")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["status"], "ok");
        assert_eq!(body["database"], app.store.backend().as_str());

        // Take the database away underneath the running server.
        app.store.close().await;
        let resp = app.client.get(app.url("/healthz")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["status"], "unavailable");
        app
    })
    .await;
}
