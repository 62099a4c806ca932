use reqwest::StatusCode;

use crate::helpers::each_app;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_renders_on_the_server_with_navigation_and_hydration_scripts() {
    each_app(|app| async move {
        // An admin may open every page (approvers see neither the audit trail nor metrics).
        let client = app.demo_client("ada").await;
        for (path, heading) in [
            ("/", "Countersign"),
            ("/inbox", "Approval inbox"),
            ("/runs", "Runs"),
            ("/audit", "Audit"),
            ("/gates", "Gate metrics"),
            ("/admin", "Admin"),
        ] {
            let resp = client.get(app.url(path)).send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            let html = resp.text().await.unwrap();
            assert!(html.contains(&format!(">{heading}</h1>")), "{path}: {html}");
            for nav in ["/inbox", "/runs", "/audit", "/gates", "/admin"] {
                assert!(
                    html.contains(&format!("href=\"{nav}\"")),
                    "{path} lacks {nav}"
                );
            }
            assert!(
                html.contains("/pkg/countersign.js"),
                "{path}: no hydration script"
            );
            assert!(
                html.contains("/pkg/countersign.css"),
                "{path}: no stylesheet"
            );
        }
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_pages_are_404() {
    each_app(|app| async move {
        let resp = app
            .demo_client("ana")
            .await
            .get(app.url("/no/such/page"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        assert!(resp.text().await.unwrap().contains("Not found"));
        app
    })
    .await;
}
