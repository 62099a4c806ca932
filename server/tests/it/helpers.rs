//! `spawn_app`: the real server on port 0 with a fresh database, per test.

use std::net::SocketAddr;
use std::sync::Arc;

use countersign::{Application, Config};
use countersign_core::store::testing::FreshDb;
use countersign_core::{Backend, Clock, ManualClock, Store};
use tokio::sync::oneshot;

/// A running server and what a test needs to talk to it.
pub struct TestApp {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    /// `state.store`, for the many tests that only need the store.
    pub store: Store,
    /// The server's shared state (a test may build more routers over it).
    pub state: countersign::AppState,
    #[allow(dead_code)]
    pub clock: ManualClock,
    db: Option<FreshDb>,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The database URL (for CLI processes on the same database).
    #[allow(dead_code)]
    pub fn db_url(&self) -> String {
        self.db
            .as_ref()
            .map(|d| d.url.expose().clone())
            .unwrap_or_default()
    }

    /// A client with a cookie jar, signed in through the demo sign-in as `user`.
    ///
    /// Pages once hung here at random (a resource first polled while another test built its
    /// router waited forever: `http::router` now generates the route list once per process,
    /// see `dashboard::pages_finish_while_other_routers_are_built`). The client's timeout
    /// turns any such hang into a failure naming the page.
    pub async fn demo_client(&self, user: &str) -> reqwest::Client {
        // A page that never finishes fails its test instead of hanging the suite.
        let client = reqwest::Client::builder()
            .cookie_store(true)
            .redirect(reqwest::redirect::Policy::none())
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .unwrap();
        let resp = client
            .post(self.url("/auth/demo"))
            .header("origin", format!("http://{}", self.addr))
            .form(&[("user", user)])
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            reqwest::StatusCode::SEE_OTHER,
            "demo sign-in"
        );
        client
    }

    /// Stops the server and hands back its database (still there, for inspection).
    pub async fn stop_keeping_db(mut self) -> FreshDb {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.handle.take() {
            let _ = handle.await;
        }
        self.db.take().expect("the database")
    }

    /// Stops the server and drops its database.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.handle.take() {
            let _ = handle.await;
        }
        if let Some(db) = self.db.take() {
            db.drop_db().await;
        }
    }
}

/// Puts in force the finance registry with its first `from` replaced by `to` (the text must
/// be there), as the next registry version, and swaps it in.
pub async fn use_finance_registry_with(app: &TestApp, from: &str, to: &str) {
    let yaml = std::fs::read_to_string(format!("{}/registry.yaml", example("finance"))).unwrap();
    let changed = yaml.replacen(from, to, 1);
    assert_ne!(changed, yaml, "{from:?} is not in the finance registry");
    let version = app.store.import_registry(&changed, "test").await.unwrap();
    // The server's own poller may load it first: what counts is that it is in force now.
    app.state.registry.refresh(&app.store).await;
    assert_eq!(app.state.registry.version(), Some(version));
}

/// Opens a step of `tool` (inputs `{"x": 1}`) in `run_id` and parks it at its gate until
/// `expires_at`, as the pipeline would: a step waiting for a person.
pub async fn park_step(
    store: &Store,
    run_id: &str,
    tool: &str,
    expires_at: i64,
) -> countersign_core::store::Step {
    use countersign_core::store::{NewStep, Transition};
    use countersign_core::{CanonicalJson, Effect, StepStatus};
    let (step, _) = store
        .open_step(&NewStep {
            run_id: run_id.into(),
            role: "worker.finance".into(),
            tool: tool.into(),
            effect: Effect::Write,
            inputs: CanonicalJson::from_value(&serde_json::json!({"x": 1})).unwrap(),
            agent_id: None,
            reason: String::new(),
            evidence: vec![],
            observed: None,
            trace_id: "t".into(),
            status: StepStatus::Pending,
        })
        .await
        .unwrap();
    store
        .transition(&Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending],
            to: Some(StepStatus::NeedsApproval),
            expires_at: Some(expires_at),
            ..Transition::default()
        })
        .await
        .unwrap();
    step
}

/// The example bundle folder `name` (finance, stillon).
pub fn example(name: &str) -> String {
    format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Configuration for a test server on `db`, listening on an ephemeral port, with `extra`
/// environment variables on top.
pub fn test_config(db: &FreshDb, extra: &[(&str, &str)]) -> Config {
    let mut env = vec![
        (
            "COUNTERSIGN_DATABASE_URL".to_string(),
            db.url.expose().clone(),
        ),
        ("COUNTERSIGN_LISTEN".to_string(), "127.0.0.1:0".to_string()),
        ("COUNTERSIGN_LOG_LEVEL".to_string(), "warn".to_string()),
        // Tests sign people in through the demo sign-in (each may turn it off again).
        ("COUNTERSIGN_DEMO_SIGN_IN".to_string(), "true".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Config::load(None, env).expect("test config is valid")
}

/// Starts the real server on a fresh database of `backend`. `None` only when Postgres is
/// unreachable outside CI (the harness has already printed a loud warning).
pub async fn spawn_app(backend: Backend) -> Option<TestApp> {
    spawn_app_with(backend, &[]).await
}

/// [`spawn_app`] with extra `COUNTERSIGN_*` settings.
pub async fn spawn_app_with(backend: Backend, extra: &[(&str, &str)]) -> Option<TestApp> {
    Some(spawn_app_on(FreshDb::create(backend).await?, extra).await)
}

/// Starts the real server on `db` (which it drops when stopped), with extra `COUNTERSIGN_*`
/// settings (which may reach `db` another way: `COUNTERSIGN_DATABASE_URL` wins).
pub async fn spawn_app_on(db: FreshDb, extra: &[(&str, &str)]) -> TestApp {
    let clock = ManualClock::new(chrono::DateTime::from_timestamp(1_781_170_937, 0).unwrap());
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let app = Application::build(test_config(&db, extra), shared)
        .await
        .expect("server builds")
        .with_clock_hand(Arc::new(clock.clone()));
    let addr = app.local_addr().unwrap();
    let state = app.state().clone();
    let store = state.store.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        app.run_until(async move {
            let _ = stopped.await;
        })
        .await
        .expect("server runs");
    });
    TestApp {
        addr,
        client: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
        store,
        state,
        clock,
        db: Some(db),
        stop: Some(stop),
        handle: Some(handle),
    }
}

/// Runs `test` against a fresh server on SQLite, then on Postgres.
pub async fn each_app<F, Fut>(test: F)
where
    F: Fn(TestApp) -> Fut,
    Fut: std::future::Future<Output = TestApp>,
{
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(app) = spawn_app(backend).await else {
            continue;
        };
        let app = test(app).await;
        app.stop().await;
    }
}

/// The `countersign` binary with no inherited `COUNTERSIGN_*` settings, run in a temp dir.
pub fn countersign_cmd() -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_countersign"));
    for (k, _) in std::env::vars() {
        if k.starts_with("COUNTERSIGN_") {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(std::env::temp_dir());
    cmd
}

/// [`countersign_cmd`] on the database at `db_url`, with logging off.
pub fn countersign_on(db_url: &str) -> std::process::Command {
    let mut cmd = countersign_cmd();
    cmd.env("COUNTERSIGN_DATABASE_URL", db_url)
        .env("COUNTERSIGN_LOG_LEVEL", "off");
    cmd
}

/// A webhook receiver on loopback: its URL and every JSON body POSTed to it, in order
/// (each answered 200).
pub async fn webhook_sink() -> (String, Arc<std::sync::Mutex<Vec<serde_json::Value>>>) {
    let seen: Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Arc::default();
    let hits = seen.clone();
    let hook = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(body): axum::Json<serde_json::Value>| {
            let hits = hits.clone();
            async move {
                hits.lock().unwrap().push(body);
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, hook).await.unwrap() });
    (format!("http://{addr}/hook"), seen)
}

/// People's software passkeys, one per (server, person), registered on first use.
static PASSKEYS: std::sync::LazyLock<
    std::sync::Mutex<
        std::collections::HashMap<String, countersign_core::signing::webauthn::soft::SoftPasskey>,
    >,
> = std::sync::LazyLock::new(Default::default);

/// `approver`'s passkey assertion over `challenge` (their passkey registered in `tenant`
/// through the store on first use, as a browser's registration would store it).
async fn assert_as(
    app: &TestApp,
    approver: &countersign_core::approvals::Approver,
    tenant: &str,
    challenge: &[u8],
) -> countersign_core::signing::webauthn::Assertion {
    use countersign_core::signing::webauthn::read_registration;
    use countersign_core::signing::webauthn::soft::SoftPasskey;
    let rp = app
        .state
        .config
        .relying_party()
        .expect("a loopback public URL");
    let slot = format!("{}/{}", app.addr, approver.actor());
    let existing = PASSKEYS.lock().unwrap().get(&slot).cloned();
    let mut key = match existing {
        Some(k) => k,
        None => {
            let key = SoftPasskey::random().unwrap();
            let (cd, att) = key.register(&rp, b"test");
            let reg = read_registration(&rp, &cd, &att, b"test").unwrap();
            app.store
                .register_passkey(tenant, approver, "test passkey", &reg, &rp)
                .await
                .unwrap();
            key
        }
    };
    let assertion = key.assert(&rp, challenge);
    PASSKEYS.lock().unwrap().insert(slot, key);
    assertion
}

/// Decides `step_id` through the store as `decider`, signing an approval with their passkey
/// when `rules` require it (the way the inbox's page does).
pub async fn decide_signed(
    app: &TestApp,
    step_id: &str,
    decider: &countersign_core::approvals::Decider,
    rules: &countersign_core::approvals::GateRules,
    verdict: countersign_core::approvals::Verdict,
    reason: &str,
) -> Result<
    (
        countersign_core::approvals::Approval,
        Option<countersign_core::Secret<String>>,
    ),
    countersign_core::approvals::DecideError,
> {
    use countersign_core::approvals::Verdict;
    use countersign_core::signing::challenge::Signed;
    use countersign_core::signing::decide::Submission;
    let rp = app.state.config.relying_party();
    let submission = if rules.signature_required && verdict == Verdict::Approved {
        let step = app.store.get_step(step_id).await.unwrap();
        let tenant = app.store.get_run(&step.run_id).await.unwrap().tenant;
        let issued = app
            .store
            .issue_decision_challenge(
                &tenant,
                &decider.approver,
                &Signed::Step {
                    step_id: step.id.clone(),
                    inputs_hash: step.inputs_hash.clone(),
                },
                verdict,
                step.expires_at.unwrap_or_default(),
            )
            .await
            .unwrap();
        Some(Submission {
            assertion: assert_as(app, &decider.approver, &tenant, &issued.challenge).await,
            nonce: issued.nonce,
        })
    } else {
        None
    };
    app.store
        .decide_step_signed(
            rp.as_ref(),
            step_id,
            decider,
            rules,
            verdict,
            reason,
            submission.as_ref(),
        )
        .await
}

/// The `signature` a browser sends with demo person `user`'s approval of `step_id`: the
/// challenge asked for through `client` (signed in as `user`), signed with their passkey.
pub async fn http_signature(
    app: &TestApp,
    client: &reqwest::Client,
    user: &str,
    step_id: &str,
) -> serde_json::Value {
    use countersign_core::signing::webauthn::unb64;
    let issued: serde_json::Value = client
        .post(app.url(&format!("/api/steps/{step_id}/challenge")))
        .header("origin", format!("http://{}", app.addr))
        .json(&serde_json::json!({"verdict": "approved"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let Some(challenge) = issued["challenge"].as_str() else {
        // No challenge for this person (a step they may not see): an unsigned approval.
        return serde_json::Value::Null;
    };
    let step = app.store.get_step(step_id).await.unwrap();
    let tenant = app.store.get_run(&step.run_id).await.unwrap().tenant;
    let approver = countersign_core::approvals::Approver {
        iss: "urn:countersign:demo".into(),
        sub: user.into(),
    };
    let a = assert_as(app, &approver, &tenant, &unb64(challenge, "c").unwrap()).await;
    signature_json(&issued["nonce"], &a)
}

/// The `signature` a browser sends with demo person `user`'s batch approval `body` (the
/// `POST /api/gates/batch` body): one assertion over the batch's challenge, asked for through
/// `client`; `Null` when no challenge is issued (not an approver, a malformed batch).
pub async fn http_batch_signature(
    app: &TestApp,
    client: &reqwest::Client,
    user: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    use countersign_core::signing::webauthn::unb64;
    let resp = client
        .post(app.url("/api/gates/batch/challenge"))
        .header("origin", format!("http://{}", app.addr))
        .json(body)
        .send()
        .await
        .unwrap();
    if !resp.status().is_success() {
        return serde_json::Value::Null;
    }
    let issued: serde_json::Value = resp.json().await.unwrap();
    let approver = countersign_core::approvals::Approver {
        iss: "urn:countersign:demo".into(),
        sub: user.into(),
    };
    let challenge = unb64(issued["challenge"].as_str().unwrap(), "c").unwrap();
    let a = assert_as(app, &approver, "acme", &challenge).await;
    signature_json(&issued["nonce"], &a)
}

/// The hidden fields the inbox's page adds to an "Approve ticked" form of `steps` for demo
/// person `user` (signed in on `client`): one passkey assertion over the batch's challenge,
/// and the expiry it binds; none when the tool requires no signature or no challenge is
/// issued.
pub async fn inbox_batch_signature(
    app: &TestApp,
    client: &reqwest::Client,
    user: &str,
    steps: &[String],
) -> Vec<(String, String)> {
    use countersign_core::signing::webauthn::{b64, unb64};
    let resp = client
        .post(app.url("/inbox/batch/challenge"))
        .header("origin", format!("http://{}", app.addr))
        .json(&serde_json::json!({"steps": steps}))
        .send()
        .await
        .unwrap();
    if !resp.status().is_success() {
        return Vec::new();
    }
    let issued: serde_json::Value = resp.json().await.unwrap();
    if issued["signature"] != serde_json::json!(true) {
        return Vec::new();
    }
    let approver = countersign_core::approvals::Approver {
        iss: "urn:countersign:demo".into(),
        sub: user.into(),
    };
    let challenge = unb64(issued["challenge"].as_str().unwrap(), "c").unwrap();
    let a = assert_as(app, &approver, "acme", &challenge).await;
    vec![
        (
            "nonce".into(),
            issued["nonce"].as_str().unwrap().to_string(),
        ),
        ("credential_id".into(), b64(&a.credential_id)),
        ("authenticator_data".into(), b64(&a.authenticator_data)),
        ("client_data_json".into(), b64(&a.client_data_json)),
        ("signature".into(), b64(&a.signature)),
        ("batch_expires_at".into(), issued["expires_at"].to_string()),
    ]
}

/// The `signature` JSON a browser sends: the nonce it was issued and the assertion.
fn signature_json(
    nonce: &serde_json::Value,
    a: &countersign_core::signing::webauthn::Assertion,
) -> serde_json::Value {
    use countersign_core::signing::webauthn::b64;
    serde_json::json!({
        "nonce": nonce,
        "credential_id": b64(&a.credential_id),
        "authenticator_data": b64(&a.authenticator_data),
        "client_data_json": b64(&a.client_data_json),
        "signature": b64(&a.signature),
    })
}

/// An HTML form's `fields` with a signature's members added, as the page's script adds them.
pub fn with_signature(
    fields: &[(&str, &str)],
    signature: &serde_json::Value,
) -> Vec<(String, String)> {
    let mut form: Vec<(String, String)> = fields
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    for (k, v) in signature.as_object().into_iter().flatten() {
        form.push((k.clone(), v.as_str().unwrap_or_default().to_string()));
    }
    form
}
