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

/// Regression: generating Leptos' route list switches resource loading off through a
/// process-global flag, so a page whose resource first polled while any router was being
/// built waited forever (the inbox test timed out this way in CI). Routers are now built from
/// a route list generated once per process; pages render while routers are built non-stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_finish_while_other_routers_are_built() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let Some(app) = crate::helpers::spawn_app(countersign_core::Backend::Sqlite).await else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let built = Arc::new(AtomicUsize::new(0));
    let builder = {
        let (stop, built, state) = (stop.clone(), built.clone(), app.state.clone());
        tokio::task::spawn_blocking(move || {
            while !stop.load(Ordering::Relaxed) {
                drop(countersign::http::router(state.clone()));
                built.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let ana = app.demo_client("ana").await;
    let mut outcome = Ok(());
    for i in 0..40 {
        // Each page with a short deadline of its own: a hung render fails fast.
        let page = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            let resp = ana.get(app.url("/inbox")).send().await?;
            Ok::<_, reqwest::Error>((resp.status(), resp.text().await?))
        })
        .await;
        match page {
            Ok(Ok((StatusCode::OK, html)))
                if html.contains(">Approval inbox</h1>") && html.contains("</html>") => {}
            other => {
                outcome = Err(format!("page {i} did not finish: {other:?}"));
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    builder.await.unwrap();
    assert!(
        built.load(Ordering::Relaxed) > 0,
        "no router was built while the pages rendered"
    );
    outcome.unwrap();
    app.stop().await;
}
