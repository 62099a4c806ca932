//! Dashboard sign-in against a real OpenID Connect provider (npm `oidc-provider`, run by
//! end2end/oidc/provider.mjs), the demo sign-in, sessions and the CSRF origin check.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;

use countersign_core::Backend;
use reqwest::StatusCode;
use reqwest::cookie::{CookieStore, Jar};
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app_with};
use crate::interop::repo_root;

const CLIENT_ID: &str = "countersign";
const CLIENT_SECRET: &str = "countersign-secret";

// ---------------------------------------------------------------------------------------
// The provider process.

struct Provider {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    main: String,
    other: String,
}

impl Drop for Provider {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the provider; `None` (after a loud warning) when node or the npm packages are
/// missing outside CI. Under CI=true that is a failure.
fn start_provider() -> Option<Provider> {
    let root = repo_root();
    let node_ok = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let package_ok = root
        .join("node_modules/oidc-provider/package.json")
        .is_file();
    if !(node_ok && package_ok) {
        let why = if node_ok {
            "node_modules/oidc-provider is missing (run `npm ci`)"
        } else {
            "node is not installed"
        };
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("OIDC tests need a real provider: {why}");
        }
        eprintln!("\n!!! SKIPPING OIDC provider tests: {why} !!!\n");
        return None;
    }
    let mut child = Command::new("node")
        .arg(root.join("end2end/oidc/provider.mjs"))
        .current_dir(&root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("node starts");
    let stdin = child.stdin.take();
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout
        .read_line(&mut line)
        .expect("provider prints its issuers");
    let info: Value = serde_json::from_str(&line).expect("provider JSON");
    Some(Provider {
        child,
        stdin,
        stdout,
        main: info["main"].as_str().unwrap().to_string(),
        other: info["other"].as_str().unwrap().to_string(),
    })
}

impl Provider {
    /// Registers the clients with `redirect_uri`; returns the provider's clock (ms).
    fn configure(&mut self, redirect_uri: &str) -> i64 {
        let stdin = self.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{}", json!({ "redirect_uri": redirect_uri })).unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("provider ready");
        let ready: Value = serde_json::from_str(&line).expect("ready JSON");
        assert_eq!(ready["ready"], true, "{line}");
        ready["now"].as_i64().unwrap()
    }

    /// The provider replaces its signing key (a new `kid`; the old key is gone).
    async fn rotate_key(&self) {
        let resp = reqwest::Client::new()
            .post(format!("{}/__test__/rotate", self.main))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    }

    /// Changes (or deletes) a user at the provider.
    async fn user(&self, change: Value) {
        let resp = reqwest::Client::new()
            .post(format!("{}/__test__/user", self.main))
            .json(&change)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    }

    /// The provider sends Countersign a back-channel logout for `user` now.
    async fn backchannel(&self, user: &str) -> (StatusCode, String) {
        let resp = reqwest::Client::new()
            .post(format!("{}/__test__/backchannel", self.main))
            .json(&json!({ "user": user }))
            .send()
            .await
            .unwrap();
        (resp.status(), resp.text().await.unwrap())
    }

    /// A logout token `issuer` signs as asked, not sent.
    async fn logout_token(&self, issuer: &str, ask: Value) -> String {
        let resp: Value = reqwest::Client::new()
            .post(format!("{issuer}/__test__/logout-token"))
            .json(&ask)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        resp["logout_token"].as_str().unwrap().to_string()
    }

    async fn tamper(&self, mode: Value) {
        let resp = reqwest::Client::new()
            .post(format!("{}/__test__/tamper", self.main))
            .json(&mode)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    }
}

/// A server configured for the provider's `main` issuer, with its clock set to the
/// provider's.
async fn oidc_app(backend: Backend) -> Option<(TestApp, Provider)> {
    oidc_app_with(backend, &[]).await
}

/// [`oidc_app`] with `extra` settings.
async fn oidc_app_with(backend: Backend, extra: &[(&str, &str)]) -> Option<(TestApp, Provider)> {
    let mut provider = start_provider()?;
    let issuer = provider.main.clone();
    let mut env = vec![
        ("COUNTERSIGN_OIDC_ISSUER", issuer.as_str()),
        ("COUNTERSIGN_OIDC_CLIENT_ID", CLIENT_ID),
        ("COUNTERSIGN_OIDC_CLIENT_SECRET", CLIENT_SECRET),
    ];
    env.extend_from_slice(extra);
    let app = spawn_app_with(backend, &env).await?;
    let now = provider.configure(&app.url("/auth/callback"));
    app.clock
        .set(chrono::DateTime::from_timestamp_millis(now).unwrap());
    Some((app, provider))
}

// ---------------------------------------------------------------------------------------
// A browser: a cookie jar, no automatic redirects.

struct Browser {
    client: reqwest::Client,
    jar: Arc<Jar>,
}

impl Browser {
    fn new() -> Self {
        let jar = Arc::new(Jar::default());
        let client = reqwest::Client::builder()
            .cookie_provider(jar.clone())
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        Self { client, jar }
    }

    fn cookie(&self, app: &TestApp, name: &str) -> Option<String> {
        let url = reqwest::Url::parse(&app.url("/")).unwrap();
        let header = self.jar.cookies(&url)?;
        header
            .to_str()
            .unwrap()
            .split("; ")
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")).map(str::to_string))
    }

    async fn get(&self, url: &str) -> reqwest::Response {
        self.client.get(url).send().await.unwrap()
    }

    /// Posts a form the way a page of `app` would (same-origin `Origin`).
    async fn post_form(
        &self,
        app: &TestApp,
        path: &str,
        form: &[(&str, &str)],
    ) -> reqwest::Response {
        self.client
            .post(app.url(path))
            .header("origin", format!("http://{}", app.addr))
            .form(form)
            .send()
            .await
            .unwrap()
    }

    async fn me(&self, app: &TestApp) -> Option<Value> {
        let resp = self.get(&app.url("/auth/me")).await;
        match resp.status() {
            StatusCode::OK => Some(resp.json().await.unwrap()),
            StatusCode::UNAUTHORIZED => None,
            other => panic!("/auth/me: {other}"),
        }
    }
}

fn location(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("location")
        .unwrap_or_else(|| panic!("no Location on {}", resp.status()))
        .to_str()
        .unwrap()
        .to_string()
}

fn query_param(url: &str, name: &str) -> Option<String> {
    reqwest::Url::parse(url)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

fn with_param(url: &str, name: &str, value: &str) -> String {
    let mut u = reqwest::Url::parse(url).unwrap();
    let pairs: Vec<(String, String)> = u
        .query_pairs()
        .map(|(k, v)| {
            let v = if k == name {
                value.to_string()
            } else {
                v.into_owned()
            };
            (k.into_owned(), v)
        })
        .collect();
    u.query_pairs_mut().clear().extend_pairs(pairs);
    u.to_string()
}

/// GET /auth/login?next=/inbox: the provider's authorization URL.
async fn begin(browser: &Browser, app: &TestApp) -> String {
    let resp = browser.get(&app.url("/auth/login?next=/inbox")).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    location(&resp)
}

/// Follows the provider's redirects from `authorize_url`, logging in as `user`, up to the
/// redirect to `redirect_uri`; returns that URL (code, state, iss).
async fn authorize(
    browser: &Browser,
    authorize_url: &str,
    user: &str,
    redirect_uri: &str,
) -> String {
    authorize_seen(browser, authorize_url, user, redirect_uri)
        .await
        .0
}

/// [`authorize`], also telling whether the provider asked the person to authenticate (an
/// interaction) rather than answering from its own session.
async fn authorize_seen(
    browser: &Browser,
    authorize_url: &str,
    user: &str,
    redirect_uri: &str,
) -> (String, bool) {
    let base = {
        let u = reqwest::Url::parse(authorize_url).unwrap();
        format!(
            "{}://{}:{}",
            u.scheme(),
            u.host_str().unwrap(),
            u.port().unwrap()
        )
    };
    let mut url = authorize_url.to_string();
    let mut interacted = false;
    for _ in 0..8 {
        let resp = browser.get(&url).await;
        let status = resp.status();
        if status != StatusCode::SEE_OTHER {
            panic!("{url}: {status} {:?}", resp.text().await);
        }
        let mut next = location(&resp);
        if next.starts_with(redirect_uri) {
            return (next, interacted);
        }
        if next.starts_with("/interaction/") {
            interacted = true;
            next = format!("{next}?login={user}");
        }
        url = if next.starts_with('/') {
            format!("{base}{next}")
        } else {
            next
        };
    }
    panic!("the provider never redirected back");
}

/// A full sign-in as `user`; returns the callback response.
async fn sign_in(browser: &Browser, app: &TestApp, user: &str) -> reqwest::Response {
    let url = begin(browser, app).await;
    let callback = authorize(browser, &url, user, &app.url("/auth/callback")).await;
    browser.get(&callback).await
}

/// The test, as a second relying party, obtains a genuine ID token from `issuer` for
/// `client_id`, carrying `nonce`.
async fn direct_id_token(issuer: &str, client_id: &str, nonce: &str, redirect_uri: &str) -> String {
    let browser = Browser::new();
    let (challenge, verifier) = openidconnect::PkceCodeChallenge::new_random_sha256();
    let mut url = reqwest::Url::parse(&format!("{issuer}/auth")).unwrap();
    url.query_pairs_mut()
        .append_pair("client_id", client_id)
        .append_pair("redirect_uri", redirect_uri)
        .append_pair("response_type", "code")
        .append_pair("scope", "openid profile email")
        .append_pair("state", "direct")
        .append_pair("nonce", nonce)
        .append_pair("code_challenge", challenge.as_str())
        .append_pair("code_challenge_method", "S256");
    let callback = authorize(&browser, url.as_str(), "ana", redirect_uri).await;
    let code = query_param(&callback, "code").unwrap();
    let tokens: Value = reqwest::Client::new()
        .post(format!("{issuer}/token"))
        .basic_auth(client_id, Some(format!("{client_id}-secret")))
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", code.as_str()),
            ("redirect_uri", redirect_uri),
            ("code_verifier", verifier.secret().as_str()),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    tokens["id_token"].as_str().expect("id_token").to_string()
}

/// The `sessions.ended` audit records, oldest first.
async fn sessions_ended(app: &TestApp) -> Vec<Value> {
    app.store
        .audit_in_order(0, 10_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.rule.as_deref() == Some("sessions.ended"))
        .map(|r| serde_json::from_str::<Value>(&r.record).unwrap())
        .collect()
}

async fn assert_refused(resp: reqwest::Response, expected: &str) {
    let status = resp.status();
    let body = resp.text().await.unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("Sign-in refused"), "{body}");
    assert!(body.contains(expected), "expected {expected:?} in {body}");
}

// ---------------------------------------------------------------------------------------
// OIDC: the happy path, roles, logout.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_sign_in_maps_roles_rotates_the_session_and_logout_deletes_it() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some((app, provider)) = oidc_app(backend).await else {
            continue;
        };
        // Signed out: pages redirect to sign-in and render nothing.
        let anon = Browser::new();
        let resp = anon.get(&app.url("/inbox")).await;
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        assert_eq!(location(&resp), "/auth/login?next=%2Finbox");
        assert!(!resp.text().await.unwrap().contains("Approval inbox"));

        let browser = Browser::new();
        let url = begin(&browser, &app).await;
        assert!(url.starts_with(&provider.main), "{url}");
        for p in ["state", "nonce", "code_challenge"] {
            assert!(
                query_param(&url, p).is_some_and(|v| v.len() >= 16),
                "{p} in {url}"
            );
        }
        assert_eq!(
            query_param(&url, "code_challenge_method").as_deref(),
            Some("S256")
        );
        // Starting a sign-in writes no session row: the browser carries it in a cookie.
        assert!(browser.cookie(&app, "countersign").is_none());
        assert!(browser.cookie(&app, "countersign-signin").is_some());
        assert!(app.store.sessions_all().await.unwrap().is_empty());
        for _ in 0..20 {
            Browser::new().get(&app.url("/auth/login")).await;
        }
        assert!(
            app.store.sessions_all().await.unwrap().is_empty(),
            "anonymous sign-in starts write nothing"
        );
        // A session planted before sign-in is replaced (no fixation).
        let planted = "AAAAAAAAAAAAAAAAAAAAAA";
        browser.jar.add_cookie_str(
            &format!("countersign={planted}; Path=/"),
            &reqwest::Url::parse(&app.url("/")).unwrap(),
        );
        let callback = authorize(&browser, &url, "ana", &app.url("/auth/callback")).await;
        let resp = browser.get(&callback).await;
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        assert_eq!(location(&resp), "/inbox");
        let session = browser.cookie(&app, "countersign").expect("session");
        assert_ne!(session, planted, "the session id is the server's own");
        assert!(
            browser.cookie(&app, "countersign-signin").is_none(),
            "the sign-in cookie is used up"
        );
        assert_eq!(app.store.sessions_all().await.unwrap().len(), 1);

        let me = browser.me(&app).await.expect("signed in");
        assert_eq!(me["iss"], provider.main.as_str());
        assert_eq!(me["sub"], "ana");
        assert_eq!(me["name"], "Ana Clerk");
        assert_eq!(me["email"], "ana@acme.test");
        assert_eq!(me["roles"], json!(["approver"]));
        assert_eq!(me["tenant"], "acme");
        // The people directory names her on the pages (issue 36), under her tenant only.
        assert_eq!(
            app.store.people_of("acme").await.unwrap(),
            [(
                provider.main.to_string(),
                "ana".to_string(),
                "Ana Clerk".to_string()
            )]
        );
        assert!(app.store.people_of("globex").await.unwrap().is_empty());
        let resp = browser.get(&app.url("/inbox")).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.text().await.unwrap().contains("Approval inbox"));

        // Logout deletes the session server-side: the old cookie is refused afterwards.
        let resp = browser.post_form(&app, "/auth/logout", &[]).await;
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        assert!(!app.store.session_exists(&session).await.unwrap());
        let replay = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let resp = replay
            .get(app.url("/inbox"))
            .header("cookie", format!("countersign={session}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::SEE_OTHER, "old cookie refused");

        // The role map: managers → manager; a user in no mapped group has no role and
        // sees nothing.
        let max = Browser::new();
        assert_eq!(
            sign_in(&max, &app, "max").await.status(),
            StatusCode::SEE_OTHER
        );
        assert_eq!(max.me(&app).await.unwrap()["roles"], json!(["manager"]));
        let eve = Browser::new();
        assert_eq!(
            sign_in(&eve, &app, "eve").await.status(),
            StatusCode::SEE_OTHER
        );
        assert_eq!(eve.me(&app).await.unwrap()["roles"], json!([]));
        let resp = eve.get(&app.url("/inbox")).await;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        let body = resp.text().await.unwrap();
        assert!(body.contains("no Countersign role"), "{body}");
        assert!(!body.contains("Approval inbox"));
        app.stop().await;
    }
}

// ---------------------------------------------------------------------------------------
// OIDC: every refusal leaves no session.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_refuses_bad_responses_and_tokens_with_a_clear_page_and_no_session() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some((app, provider)) = oidc_app(backend).await else {
            continue;
        };
        let redirect = app.url("/auth/callback");

        // Wrong state.
        let b = Browser::new();
        let url = begin(&b, &app).await;
        let callback = authorize(&b, &url, "ana", &redirect).await;
        let forged = with_param(&callback, "state", "forged-state-value");
        assert_refused(b.get(&forged).await, "state does not match").await;
        assert!(b.me(&app).await.is_none());
        // The pending sign-in was used up: even the genuine response is refused now.
        assert_refused(b.get(&callback).await, "No sign-in is in progress").await;
        assert!(b.me(&app).await.is_none());

        // Replayed code: a code already exchanged, sent with a fresh sign-in's valid state.
        let first = Browser::new();
        let url = begin(&first, &app).await;
        let callback = authorize(&first, &url, "ana", &redirect).await;
        assert_eq!(first.get(&callback).await.status(), StatusCode::SEE_OTHER);
        let attacker = Browser::new();
        let url = begin(&attacker, &app).await;
        let replayed = with_param(&callback, "state", &query_param(&url, "state").unwrap());
        assert_refused(
            attacker.get(&replayed).await,
            "did not accept the authorization code",
        )
        .await;
        assert!(attacker.me(&app).await.is_none());

        // Wrong nonce: the provider is asked for a token with a nonce this browser never got.
        let b = Browser::new();
        let url = begin(&b, &app).await;
        let tampered = with_param(&url, "nonce", "a-nonce-from-somewhere-else");
        let callback = authorize(&b, &tampered, "ana", &redirect).await;
        assert_refused(b.get(&callback).await, "nonce does not match").await;
        assert!(b.me(&app).await.is_none());

        // ID token for another audience: a genuine token the provider issued to
        // `other-client`, with this browser's nonce, swapped into the token response.
        let b = Browser::new();
        let url = begin(&b, &app).await;
        let nonce = query_param(&url, "nonce").unwrap();
        let token = direct_id_token(&provider.main, "other-client", &nonce, &redirect).await;
        let callback = authorize(&b, &url, "ana", &redirect).await;
        provider
            .tamper(json!({ "mode": "replace", "id_token": token }))
            .await;
        assert_refused(b.get(&callback).await, "another audience").await;
        assert!(b.me(&app).await.is_none());

        // Wrong issuer: a genuine token from a second provider (same signing key, same
        // client, same nonce).
        let b = Browser::new();
        let url = begin(&b, &app).await;
        let nonce = query_param(&url, "nonce").unwrap();
        let token = direct_id_token(&provider.other, CLIENT_ID, &nonce, &redirect).await;
        let callback = authorize(&b, &url, "ana", &redirect).await;
        provider
            .tamper(json!({ "mode": "replace", "id_token": token }))
            .await;
        assert_refused(b.get(&callback).await, "another issuer").await;
        assert!(b.me(&app).await.is_none());

        // The callback's `iss` parameter names another issuer (mix-up defence).
        let b = Browser::new();
        let url = begin(&b, &app).await;
        let callback = authorize(&b, &url, "ana", &redirect).await;
        let mixed = with_param(&callback, "iss", &provider.other);
        assert_refused(b.get(&mixed).await, "another issuer").await;
        assert!(b.me(&app).await.is_none());

        // A token issued to another client (`azp`), signed by the provider.
        let b = Browser::new();
        let url = begin(&b, &app).await;
        let callback = authorize(&b, &url, "ana", &redirect).await;
        provider
            .tamper(json!({ "mode": "claims", "set": { "azp": "other-client" } }))
            .await;
        assert_refused(b.get(&callback).await, "issued to another client").await;
        assert!(b.me(&app).await.is_none());

        // Unsigned token (alg none) with otherwise valid claims.
        let b = Browser::new();
        let url = begin(&b, &app).await;
        let callback = authorize(&b, &url, "ana", &redirect).await;
        provider.tamper(json!({ "mode": "alg_none" })).await;
        assert_refused(b.get(&callback).await, "ID token was refused").await;
        assert!(b.me(&app).await.is_none());

        // Expired token: the server's clock is past the token's exp (provider TTL 5 min;
        // the pending sign-in itself lives 10 min).
        let b = Browser::new();
        let url = begin(&b, &app).await;
        let callback = authorize(&b, &url, "ana", &redirect).await;
        app.clock.advance(chrono::Duration::minutes(9));
        assert_refused(b.get(&callback).await, "expired").await;
        assert!(b.me(&app).await.is_none());

        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_callback_checks_state_before_an_error_and_never_shows_the_providers_words() {
    let Some((app, provider)) = oidc_app(Backend::Sqlite).await else {
        return;
    };
    let said = "Call+555-0100+to+unlock+your+account";
    // An error response with a forged state: refused for the state, the words not shown.
    let b = Browser::new();
    begin(&b, &app).await;
    let forged = app.url(&format!(
        "/auth/callback?state=forged&error=access_denied&error_description={said}"
    ));
    let resp = b.get(&forged).await;
    let body = resp.text().await.unwrap();
    assert!(body.contains("state does not match"), "{body}");
    assert!(!body.contains("555-0100"), "{body}");
    // This browser's own state: the registered code is named, the description is not.
    let b = Browser::new();
    let url = begin(&b, &app).await;
    let state = query_param(&url, "state").unwrap();
    let genuine = app.url(&format!(
        "/auth/callback?state={state}&error=access_denied&error_description={said}"
    ));
    let resp = b.get(&genuine).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body = resp.text().await.unwrap();
    assert!(body.contains("access_denied"), "{body}");
    assert!(!body.contains("555-0100"), "{body}");
    assert!(b.me(&app).await.is_none());
    // A code outside the registered ones is not echoed either.
    let b = Browser::new();
    let url = begin(&b, &app).await;
    let state = query_param(&url, "state").unwrap();
    let odd = app.url(&format!(
        "/auth/callback?state={state}&error=pay_us_at_evil.example"
    ));
    let body = b.get(&odd).await.text().await.unwrap();
    assert!(body.contains("an unlisted error"), "{body}");
    assert!(!body.contains("evil.example"), "{body}");
    // A refused ID token names why in fixed words, not the library's detail.
    let b = Browser::new();
    let url = begin(&b, &app).await;
    let tampered = with_param(&url, "nonce", "a-nonce-from-somewhere-else");
    let callback = authorize(&b, &tampered, "ana", &app.url("/auth/callback")).await;
    let body = b.get(&callback).await.text().await.unwrap();
    assert!(body.contains("nonce does not match"), "{body}");
    assert!(!body.contains("a-nonce-from-somewhere-else"), "{body}");
    drop(provider);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_a_provider_that_omits_auth_time_never_makes_the_sign_in_fresh() {
    let Some((app, provider)) = oidc_app(Backend::Sqlite).await else {
        return;
    };
    let b = Browser::new();
    let url = begin(&b, &app).await;
    let callback = authorize(&b, &url, "ana", &app.url("/auth/callback")).await;
    provider.tamper(json!({"mode": "drop_auth_time"})).await;
    assert_eq!(b.get(&callback).await.status(), StatusCode::SEE_OTHER);
    let me = b.me(&app).await.expect("signed in");
    assert_eq!(me["auth_time_unknown"], true, "{me}");
    // A genuine sign-in states it.
    let b = Browser::new();
    let resp = sign_in(&b, &app, "ana").await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let me = b.me(&app).await.expect("signed in");
    assert_eq!(me["auth_time_unknown"], false, "{me}");
    app.stop().await;
}

// ---------------------------------------------------------------------------------------
// Demo sign-in, sessions, CSRF.

async fn demo_app(backend: Backend, extra: &[(&str, &str)]) -> Option<TestApp> {
    spawn_app_with(backend, extra).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_sign_in_lists_people_shows_the_banner_and_sets_a_strict_cookie() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(app) = demo_app(backend, &[]).await else {
            continue;
        };
        let b = Browser::new();
        // Without a session a page redirects to sign-in, which (no issuer, loopback) is the
        // demo page.
        let resp = b.get(&app.url("/audit")).await;
        assert_eq!(location(&resp), "/auth/login?next=%2Faudit");
        let resp = b.get(&app.url("/auth/login?next=/audit")).await;
        assert_eq!(location(&resp), "/auth/demo?next=%2Faudit");
        let page = b
            .get(&app.url("/auth/demo?next=/audit"))
            .await
            .text()
            .await
            .unwrap();
        for user in ["ana", "pat", "max", "ada", "bob", "aud"] {
            assert!(
                page.contains(&format!("value=\"{user}\"")),
                "{user}: {page}"
            );
        }
        assert!(page.contains("Demo sign-in: not for production"));

        let resp = b
            .post_form(&app, "/auth/demo", &[("user", "ana"), ("next", "/audit")])
            .await;
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        assert_eq!(location(&resp), "/audit");
        let cookie = resp
            .headers()
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .find(|c| c.starts_with("countersign="))
            .expect("session cookie");
        for attr in ["HttpOnly", "SameSite=Lax", "Path=/"] {
            assert!(cookie.contains(attr), "{attr} in {cookie}");
        }
        assert!(!cookie.contains("Secure"), "plain-http loopback: {cookie}");
        assert!(!cookie.contains("Max-Age"), "session cookie: {cookie}");
        let me = b.me(&app).await.unwrap();
        assert_eq!(me["sub"], "ana");
        assert_eq!(me["roles"], json!(["approver"]));
        assert_eq!(me["tenant"], "acme");
        let html = b.get(&app.url("/audit")).await.text().await.unwrap();
        assert!(html.contains(">Audit</h1>"), "{html}");
        assert!(html.contains("Demo sign-in: not for production"), "{html}");

        // Unknown demo users and foreign `next` targets are refused.
        let resp = b
            .post_form(&app, "/auth/demo", &[("user", "mallory")])
            .await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let resp = b
            .post_form(
                &app,
                "/auth/demo",
                &[("user", "ana"), ("next", "https://evil.example/")],
            )
            .await;
        assert_eq!(location(&resp), "/");
        let resp = b
            .post_form(
                &app,
                "/auth/demo",
                &[("user", "ana"), ("next", "//evil.example/")],
            )
            .await;
        assert_eq!(location(&resp), "/");
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_sign_in_is_refused_off_loopback_and_when_an_issuer_is_configured() {
    let Some(app) = demo_app(
        Backend::Sqlite,
        &[
            ("COUNTERSIGN_LISTEN", "0.0.0.0:0"),
            ("COUNTERSIGN_PUBLIC_URL", "https://countersign.example.com"),
            (
                "COUNTERSIGN_METRICS_TOKEN",
                "metrics-token-of-thirty-two-chars-x",
            ),
            (
                "COUNTERSIGN_REDACTION_KEY",
                "a-redaction-key-of-at-least-32-bytes!",
            ),
        ],
    )
    .await
    else {
        return;
    };
    let base = format!("http://127.0.0.1:{}", app.addr.port());
    let b = Browser::new();
    let resp = b.get(&format!("{base}/auth/demo")).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let body = resp.text().await.unwrap();
    assert!(
        body.contains("only available when the server listens on a loopback"),
        "{body}"
    );
    assert!(!body.contains("not for production"));
    let resp = b
        .client
        .post(format!("{base}/auth/demo"))
        .header(
            "origin",
            "http://0.0.0.0:".to_string() + &app.addr.port().to_string(),
        )
        .form(&[("user", "ada")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = b.get(&format!("{base}/auth/login")).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    app.stop().await;

    // An issuer configured (unreachable here): the demo page does not exist.
    let Some(app) = demo_app(
        Backend::Sqlite,
        &[
            ("COUNTERSIGN_OIDC_ISSUER", "http://127.0.0.1:9"),
            ("COUNTERSIGN_OIDC_CLIENT_ID", "x"),
            ("COUNTERSIGN_OIDC_CLIENT_SECRET", "y"),
        ],
    )
    .await
    else {
        return;
    };
    let b = Browser::new();
    let resp = b.get(&app.url("/auth/demo")).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = b.post_form(&app, "/auth/demo", &[("user", "ada")]).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(b.me(&app).await.is_none());
    // The provider is unreachable: sign-in says so instead of failing open.
    let resp = b.get(&app.url("/auth/login")).await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    app.stop().await;

    // Listening beyond loopback with a loopback public URL: no demo sign-in (the listen
    // address alone refuses it).
    let Some(app) = demo_app(
        Backend::Sqlite,
        &[
            ("COUNTERSIGN_LISTEN", "0.0.0.0:0"),
            ("COUNTERSIGN_PUBLIC_URL", "http://localhost:3000"),
            (
                "COUNTERSIGN_METRICS_TOKEN",
                "metrics-token-of-thirty-two-chars-x",
            ),
            (
                "COUNTERSIGN_REDACTION_KEY",
                "a-redaction-key-of-at-least-32-bytes!",
            ),
        ],
    )
    .await
    else {
        return;
    };
    let b = Browser::new();
    let resp = b
        .get(&format!("http://127.0.0.1:{}/auth/demo", app.addr.port()))
        .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    app.stop().await;

    // On loopback behind a reverse proxy (the public URL elsewhere): no demo sign-in either.
    let Some(app) = demo_app(
        Backend::Sqlite,
        &[
            ("COUNTERSIGN_PUBLIC_URL", "https://countersign.example.com"),
            (
                "COUNTERSIGN_METRICS_TOKEN",
                "metrics-token-of-thirty-two-chars-x",
            ),
            (
                "COUNTERSIGN_REDACTION_KEY",
                "a-redaction-key-of-at-least-32-bytes!",
            ),
        ],
    )
    .await
    else {
        return;
    };
    let b = Browser::new();
    let resp = b.get(&app.url("/auth/demo")).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = b
        .client
        .post(app.url("/auth/demo"))
        .header("origin", "https://countersign.example.com")
        .form(&[("user", "ada")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_end_after_the_idle_and_the_absolute_timeout() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(app) = demo_app(backend, &[]).await else {
            continue;
        };
        let b = Browser::new();
        b.post_form(&app, "/auth/demo", &[("user", "max")]).await;
        let minutes = |m| chrono::Duration::minutes(m);
        app.clock.advance(minutes(29));
        assert!(b.me(&app).await.is_some(), "29 min idle: alive");
        app.clock.advance(minutes(29));
        assert!(
            b.me(&app).await.is_some(),
            "activity refreshed the idle timer"
        );
        let session = b.cookie(&app, "countersign").unwrap();
        app.clock.advance(minutes(31));
        assert!(b.me(&app).await.is_none(), "31 min idle: ended");
        assert!(
            !app.store.session_exists(&session).await.unwrap(),
            "deleted"
        );

        // Absolute: active every 25 minutes, still ended 12 h after sign-in.
        let b = Browser::new();
        b.post_form(&app, "/auth/demo", &[("user", "max")]).await;
        for _ in 0..28 {
            app.clock.advance(minutes(25));
            assert!(b.me(&app).await.is_some());
        }
        app.clock.advance(minutes(25)); // 12 h 5 min after sign-in
        assert!(b.me(&app).await.is_none(), "absolute timeout");
        let resp = b.get(&app.url("/inbox")).await;
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_sign_in_is_an_explicit_opt_in_and_never_answers_through_a_proxy() {
    // Loopback, no issuer, but not asked for: nobody signs in.
    let Some(app) = demo_app(Backend::Sqlite, &[("COUNTERSIGN_DEMO_SIGN_IN", "false")]).await
    else {
        return;
    };
    let b = Browser::new();
    let resp = b.get(&app.url("/auth/demo")).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(
        resp.text()
            .await
            .unwrap()
            .contains("COUNTERSIGN_DEMO_SIGN_IN")
    );
    let resp = b.post_form(&app, "/auth/demo", &[("user", "ada")]).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(b.me(&app).await.is_none());
    app.stop().await;

    // Asked for, but the request came through a reverse proxy to 127.0.0.1: refused.
    let Some(app) = demo_app(Backend::Sqlite, &[]).await else {
        return;
    };
    for (name, value) in [
        ("forwarded", "for=203.0.113.7;proto=https"),
        ("x-forwarded-for", "203.0.113.7"),
        ("x-forwarded-host", "countersign.example.com"),
        ("via", "1.1 proxy.example"),
        ("x-real-ip", "203.0.113.7"),
    ] {
        let b = Browser::new();
        let resp = b
            .client
            .post(app.url("/auth/demo"))
            .header("origin", format!("http://{}", app.addr))
            .header(name, value)
            .form(&[("user", "ada")])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{name}");
        assert!(b.me(&app).await.is_none(), "{name}");
        let resp = b
            .client
            .get(app.url("/auth/demo"))
            .header(name, value)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{name}");
    }
    // The same browser without a proxy in between signs in.
    let b = Browser::new();
    let resp = b.post_form(&app, "/auth/demo", &[("user", "ada")]).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    assert!(b.me(&app).await.is_some());
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_ends_a_persons_sessions_at_their_next_request() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(app) = demo_app(backend, &[]).await else {
            continue;
        };
        let ana = Browser::new();
        ana.post_form(&app, "/auth/demo", &[("user", "ana")]).await;
        let ana_too = Browser::new();
        ana_too
            .post_form(&app, "/auth/demo", &[("user", "ana")])
            .await;
        let pat = Browser::new();
        pat.post_form(&app, "/auth/demo", &[("user", "pat")]).await;
        assert!(ana.me(&app).await.is_some());
        // Another tenant's admin reaches nobody of acme.
        let gus = Browser::new();
        gus.post_form(&app, "/auth/demo", &[("user", "gus")]).await;
        let person = "urn:countersign:demo#ana";
        let resp = gus
            .post_form(&app, "/admin/sessions/end", &[("person", person)])
            .await;
        assert_eq!(location(&resp), "/admin?done=sessions_ended");
        assert!(
            ana.me(&app).await.is_some(),
            "globex's admin cannot end acme's sessions"
        );
        // Ada (acme) ends both of Ana's sessions; Pat's stays.
        let ada = Browser::new();
        ada.post_form(&app, "/auth/demo", &[("user", "ada")]).await;
        let resp = ada
            .post_form(&app, "/admin/sessions/end", &[("person", "nobody")])
            .await;
        assert_eq!(location(&resp), "/admin?error=person");
        let resp = ada
            .post_form(&app, "/admin/sessions/end", &[("person", person)])
            .await;
        assert_eq!(location(&resp), "/admin?done=sessions_ended");
        assert!(ana.me(&app).await.is_none());
        assert!(ana_too.me(&app).await.is_none());
        assert!(pat.me(&app).await.is_some());
        let resp = ana.get(&app.url("/inbox")).await;
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        // Audited, with who did it and how many ended.
        let ended = sessions_ended(&app).await;
        assert_eq!(ended.len(), 2, "{ended:?}");
        assert_eq!(ended[0]["detail"]["ended"], 0);
        assert_eq!(ended[1]["detail"]["ended"], 2);
        // The CLI does the same for Pat, everywhere.
        let out = crate::helpers::countersign_on(&app.db_url())
            .args([
                "end-sessions",
                "--person",
                "person:urn:countersign:demo#pat",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("ended 1 session"));
        assert!(pat.me(&app).await.is_none());
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inboxs_background_refresh_never_keeps_an_idle_session_alive() {
    let Some(app) = demo_app(Backend::Sqlite, &[]).await else {
        return;
    };
    let b = Browser::new();
    b.post_form(&app, "/auth/demo", &[("user", "ana")]).await;
    let refresh = countersign_app::BACKGROUND_PREFIX.to_string() + "gates";
    // The open inbox refreshes every few seconds; it answers while the session lives...
    for _ in 0..5 {
        app.clock.advance(chrono::Duration::minutes(5));
        let resp = b.post_form(&app, &refresh, &[]).await;
        assert_eq!(
            resp.status(),
            StatusCode::OK,
            "{}",
            resp.text().await.unwrap()
        );
    }
    // ...but it is not the person's activity: 31 minutes after the last of that, the
    // session has ended.
    app.clock.advance(chrono::Duration::minutes(6));
    let resp = b.post_form(&app, &refresh, &[]).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let resp = b.get(&app.url("/inbox")).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_state_changes_are_refused() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(app) = demo_app(backend, &[]).await else {
            continue;
        };
        let b = Browser::new();
        b.post_form(&app, "/auth/demo", &[("user", "ana")]).await;
        let own = format!("http://{}", app.addr);

        // Another site's Origin, a missing Origin and Referer, a foreign Referer, "null".
        for (origin, referer) in [
            (Some("https://evil.example"), None),
            (None, None),
            (None, Some("https://evil.example/page")),
            (Some("null"), None),
            (Some("http://localhost:1"), Some(own.as_str())),
        ] {
            for path in ["/auth/logout", "/api/anything", "/inbox"] {
                let mut req = b.client.post(app.url(path));
                if let Some(o) = origin {
                    req = req.header("origin", o);
                }
                if let Some(r) = referer {
                    req = req.header("referer", r);
                }
                let resp = req.send().await.unwrap();
                assert_eq!(
                    resp.status(),
                    StatusCode::FORBIDDEN,
                    "{path} {origin:?} {referer:?}"
                );
                assert!(
                    resp.text()
                        .await
                        .unwrap()
                        .contains("Cross-origin request refused")
                );
            }
        }
        assert!(
            b.me(&app).await.is_some(),
            "still signed in: logout was refused"
        );

        // A same-origin Referer (no Origin) is accepted.
        let resp = b
            .client
            .post(app.url("/auth/logout"))
            .header("referer", format!("{own}/inbox"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        assert!(b.me(&app).await.is_none());

        // /mcp has its own guard and is not subject to this check.
        let resp = app
            .client
            .post(app.url("/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_ne!(resp.status(), StatusCode::FORBIDDEN);
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secure_public_url_gets_a_host_prefixed_secure_cookie() {
    let Some(app) = demo_app(
        Backend::Sqlite,
        // https on a loopback host: the demo sign-in stays available to set the cookie.
        &[("COUNTERSIGN_PUBLIC_URL", "https://localhost:8443")],
    )
    .await
    else {
        return;
    };
    let resp = app
        .client
        .post(app.url("/auth/demo"))
        .header("origin", "https://localhost:8443")
        .form(&[("user", "ana")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let cookie = resp
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(cookie.starts_with("__Host-countersign="), "{cookie}");
    for attr in ["Secure", "HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(cookie.contains(attr), "{attr} in {cookie}");
    }
    assert!(!cookie.contains("Domain"), "{cookie}");
    // An https public URL: every response pins TLS for a year.
    let resp = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(
        resp.headers()
            .get("strict-transport-security")
            .and_then(|v| v.to_str().ok()),
        Some("max-age=31536000")
    );
    app.stop().await;
    // A plain-http (loopback) public URL sends none: a browser would ignore it anyway.
    let Some(app) = demo_app(Backend::Sqlite, &[]).await else {
        return;
    };
    let resp = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert!(resp.headers().get("strict-transport-security").is_none());
    app.stop().await;
}

#[test]
fn only_local_paths_are_accepted_as_next() {
    use countersign::auth::local_next;
    assert_eq!(local_next(Some("/inbox?x=1")), "/inbox?x=1");
    for bad in [
        "https://evil.example/",
        "//evil.example",
        "/\\evil",
        "evil",
        "/auth/logout",
    ] {
        assert_eq!(local_next(Some(bad)), "/", "{bad}");
    }
    assert_eq!(local_next(None), "/");
}

#[test]
fn the_role_map_reads_strings_and_lists_and_ignores_unknown_groups() {
    use countersign::auth::oidc::map_roles;
    use countersign::config::parse_role_map;
    use countersign_core::AppRole;
    let map = parse_role_map("ap-clerks=approver,managers=manager,admins=admin,auditors=auditor")
        .unwrap();
    assert_eq!(
        map_roles(Some(&json!("ap-clerks")), &map),
        vec![AppRole::Approver]
    );
    assert_eq!(
        map_roles(
            Some(&json!(["admins", "staff", "auditors", "admins"])),
            &map
        ),
        vec![AppRole::Admin, AppRole::Auditor]
    );
    assert!(map_roles(Some(&json!(["staff"])), &map).is_empty());
    assert!(map_roles(Some(&json!(42)), &map).is_empty());
    assert!(map_roles(None, &map).is_empty());
    // The default map: platform admins hold both roles; a plain admin only one.
    let default = parse_role_map(
        countersign::config::KEYS
            .iter()
            .find(|k| k.name == "oidc_role_map")
            .and_then(|k| k.default)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        map_roles(Some(&json!(["platform-admins"])), &default),
        vec![AppRole::Admin, AppRole::PlatformAdmin]
    );
    assert_eq!(
        map_roles(Some(&json!(["admins"])), &default),
        vec![AppRole::Admin]
    );
    assert!(parse_role_map("clerks=superuser").is_err());
    assert!(parse_role_map("=admin").is_err());
    assert!(parse_role_map("clerks").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_step_up_needs_the_provider_to_authenticate_the_person_again() {
    // The finance registry, with payments wanting a sign-in within 3 seconds: the provider's
    // clock is the real one, so the test waits real seconds instead of moving a clock. The
    // step-up is checked here, not the passkey signature (tests/it/passkeys.rs): payments
    // here are approved unsigned.
    let dir = std::env::temp_dir().join(format!("cs-step-up-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = std::fs::read_to_string(format!(
        "{}/registry.yaml",
        crate::helpers::example("finance")
    ))
    .unwrap()
    .replacen("step_up_max_age: 15m", "step_up_max_age: 3s", 1)
    .replacen("signature: required", "signature: none", 1);
    for file in ["policy.cedar", "policy.cedarschema"] {
        std::fs::copy(
            format!("{}/{file}", crate::helpers::example("finance")),
            dir.join(file),
        )
        .unwrap();
    }
    std::fs::write(dir.join("registry.yaml"), yaml).unwrap();
    let registry = dir.to_str().unwrap().to_string();
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some((app, _provider)) =
            oidc_app_with(backend, &[("COUNTERSIGN_REGISTRY", registry.as_str())]).await
        else {
            continue;
        };
        // A payment waits for a person.
        let (_, fin) = crate::mcp::agent(&app, "fin-1", "worker.finance").await;
        let mut agent = crate::mcp::Client::new(&app, &fin);
        agent.connect().await;
        let reply = agent
            .call(
                "payment.schedule",
                crate::mcp::payment_for("INV-20260611", json!(4180.00)),
            )
            .await;
        let step = reply["result"]["structuredContent"]["step_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{reply}"))
            .to_string();
        let ana = Browser::new();
        assert_eq!(
            sign_in(&ana, &app, "ana").await.status(),
            StatusCode::SEE_OTHER
        );
        let decide = || {
            ana.client
                .post(app.url(&format!("/api/steps/{step}/decision")))
                .header("origin", format!("http://{}", app.addr))
                .json(&json!({"verdict": "approved", "reason": "matches the PO"}))
                .send()
        };
        tokio::time::sleep(std::time::Duration::from_millis(4_500)).await;
        app.clock
            .set(countersign_core::Clock::now(&countersign_core::SystemClock));
        assert_eq!(
            decide().await.unwrap().status(),
            StatusCode::UNAUTHORIZED,
            "a sign-in 4 seconds old"
        );
        // Signing in again through the provider's own session proves nothing new.
        let callback = app.url("/auth/callback");
        let (back, interacted) =
            authorize_seen(&ana, &begin(&ana, &app).await, "ana", &callback).await;
        assert!(!interacted, "the provider answered from its session");
        assert_eq!(ana.get(&back).await.status(), StatusCode::SEE_OTHER);
        app.clock
            .set(countersign_core::Clock::now(&countersign_core::SystemClock));
        assert_eq!(
            decide().await.unwrap().status(),
            StatusCode::UNAUTHORIZED,
            "a silent sign-in does not make the sign-in fresh"
        );
        // The step-up sign-in the inbox links to makes the provider authenticate her now.
        let resp = ana
            .get(&app.url(&format!("/auth/login?next=/inbox/{step}&fresh=1")))
            .await;
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        let url = location(&resp);
        assert_eq!(
            query_param(&url, "prompt").as_deref(),
            Some("login"),
            "{url}"
        );
        assert!(query_param(&url, "max_age").is_some(), "{url}");
        let (back, interacted) = authorize_seen(&ana, &url, "ana", &callback).await;
        assert!(interacted, "the provider asked her to authenticate");
        assert_eq!(ana.get(&back).await.status(), StatusCode::SEE_OTHER);
        // Her new authentication is now: the decision goes through.
        app.clock
            .set(countersign_core::Clock::now(&countersign_core::SystemClock));
        let ok = decide().await.unwrap();
        assert!(ok.status().is_success(), "{}", ok.status());
        app.stop().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_sign_in_survives_the_provider_rotating_its_signing_key() {
    let Some((app, provider)) = oidc_app(Backend::Sqlite).await else {
        return;
    };
    // The first sign-in discovers the provider and its keys.
    let ana = Browser::new();
    assert_eq!(
        sign_in(&ana, &app, "ana").await.status(),
        StatusCode::SEE_OTHER
    );
    provider.rotate_key().await;
    // Its ID tokens are now signed with a key Countersign has not seen: it fetches the keys
    // again rather than refusing everyone until a restart.
    let pat = Browser::new();
    let resp = sign_in(&pat, &app, "ana").await;
    let status = resp.status();
    assert_eq!(status, StatusCode::SEE_OTHER, "{:?}", resp.text().await);
    assert!(pat.me(&app).await.is_some());
    app.stop().await;
}

// ---------------------------------------------------------------------------------------
// OIDC: what the provider says after sign-in counts.

/// A payment of the finance example waiting at its gate; returns the step id.
async fn waiting_payment(app: &TestApp) -> String {
    let (_, fin) = crate::mcp::agent(app, "fin-1", "worker.finance").await;
    let mut agent = crate::mcp::Client::new(app, &fin);
    agent.connect().await;
    let reply = agent
        .call(
            "payment.schedule",
            crate::mcp::payment_for("INV-20260611", json!(4180.00)),
        )
        .await;
    reply["result"]["structuredContent"]["step_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_roles_are_re_checked_with_the_provider_and_a_removed_group_refuses_the_next_decision()
{
    let registry = crate::helpers::example("finance");
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some((app, provider)) =
            oidc_app_with(backend, &[("COUNTERSIGN_REGISTRY", registry.as_str())]).await
        else {
            continue;
        };
        let step = waiting_payment(&app).await;
        // Ana and Aud sign in (the provider issues refresh tokens); Max's sign-in comes
        // without one, so his re-check asks the userinfo endpoint.
        let (ana, max, aud, ada) = (
            Browser::new(),
            Browser::new(),
            Browser::new(),
            Browser::new(),
        );
        for (b, user) in [(&ana, "ana"), (&aud, "aud"), (&ada, "ada")] {
            assert_eq!(sign_in(b, &app, user).await.status(), StatusCode::SEE_OTHER);
        }
        let url = begin(&max, &app).await;
        let callback = authorize(&max, &url, "max", &app.url("/auth/callback")).await;
        provider.tamper(json!({"mode": "drop_refresh_token"})).await;
        let resp = max.get(&callback).await;
        assert_eq!(
            resp.status(),
            StatusCode::SEE_OTHER,
            "{:?}",
            resp.text().await
        );
        // Six minutes on, the re-checks confirm everyone's roles.
        app.clock.advance(chrono::Duration::minutes(6));
        assert_eq!(ana.me(&app).await.unwrap()["roles"], json!(["approver"]));
        assert_eq!(max.me(&app).await.unwrap()["roles"], json!(["manager"]));
        assert_eq!(aud.me(&app).await.unwrap()["roles"], json!(["auditor"]));
        // At the provider: Ana leaves ap-clerks, Max leaves managers, Aud's account goes.
        provider
            .user(json!({"user": "ana", "set": {"groups": ["staff"]}}))
            .await;
        provider
            .user(json!({"user": "max", "set": {"groups": []}}))
            .await;
        provider.user(json!({"user": "aud", "delete": true})).await;
        provider
            .user(json!({"user": "ada", "set": {"tenant": "globex"}}))
            .await;
        app.clock.advance(chrono::Duration::minutes(6));
        // Within the re-check interval Ana's next decision is refused; the gate still waits.
        let resp = ana
            .client
            .post(app.url(&format!("/api/steps/{step}/decision")))
            .header("origin", format!("http://{}", app.addr))
            .json(&json!({"verdict": "approved", "reason": "matches the PO"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert!(resp.text().await.unwrap().contains("no Countersign role"));
        assert_eq!(ana.me(&app).await.unwrap()["roles"], json!([]));
        let waiting = app.store.get_step(&step).await.unwrap();
        assert_eq!(waiting.status, countersign_core::StepStatus::NeedsApproval);
        // The userinfo endpoint says the same of Max.
        assert_eq!(max.me(&app).await.unwrap()["roles"], json!([]));
        // An account the provider no longer knows: the re-check fails, the session ends.
        assert!(aud.me(&app).await.is_none(), "signed out");
        // A person the provider now places in another tenant is signed out, not moved.
        assert!(ada.me(&app).await.is_none(), "another tenant");
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_back_channel_logout_ends_the_persons_sessions_and_refuses_forged_tokens() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some((app, provider)) = oidc_app(backend).await else {
            continue;
        };
        let (ana, ana_too, max) = (Browser::new(), Browser::new(), Browser::new());
        for (b, user) in [(&ana, "ana"), (&ana_too, "ana"), (&max, "max")] {
            assert_eq!(sign_in(b, &app, user).await.status(), StatusCode::SEE_OTHER);
        }
        let post = |token: String| {
            reqwest::Client::new()
                .post(app.url("/auth/backchannel-logout"))
                .form(&[("logout_token", token)])
                .send()
        };
        let genuine = provider
            .logout_token(&provider.main, json!({"user": "ana"}))
            .await;
        // One signature character changed mid-way (the last one may carry only padding bits).
        let mut forged_signature = genuine.clone().into_bytes();
        let at = genuine.rfind('.').unwrap() + 20;
        forged_signature[at] = if forged_signature[at] == b'A' {
            b'B'
        } else {
            b'A'
        };
        let forged_signature = String::from_utf8(forged_signature).unwrap();
        let redirect = app.url("/auth/callback");
        let refused = [
            (
                "another issuer",
                provider
                    .logout_token(&provider.other, json!({"user": "ana"}))
                    .await,
            ),
            (
                "a nonce",
                provider
                    .logout_token(&provider.main, json!({"user": "ana", "nonce": "n-1"}))
                    .await,
            ),
            (
                "no logout event",
                provider
                    .logout_token(&provider.main, json!({"user": "ana", "events": false}))
                    .await,
            ),
            (
                "an ID token",
                direct_id_token(&provider.main, CLIENT_ID, "n-2", &redirect).await,
            ),
            ("a broken signature", forged_signature),
            ("not a JWT", "not-a-token".to_string()),
            (
                "another client's",
                provider
                    .logout_token(
                        &provider.main,
                        json!({"user": "ana", "client": "other-client"}),
                    )
                    .await,
            ),
        ];
        for (why, token) in refused {
            let resp = post(token).await.unwrap();
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{why}");
            assert_eq!(resp.headers()["cache-control"], "no-store", "{why}");
        }
        for b in [&ana, &ana_too, &max] {
            assert!(b.me(&app).await.is_some(), "a refused token ends nothing");
        }
        // An expired one (logout tokens live two minutes) ends nothing either.
        app.clock.advance(chrono::Duration::minutes(3));
        let resp = post(genuine.clone()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "expired");
        assert!(ana.me(&app).await.is_some());
        app.clock
            .set(countersign_core::Clock::now(&countersign_core::SystemClock));
        // The provider rotates its signing key: its next logout token still verifies.
        provider.rotate_key().await;
        // The provider signs Ana out over the back channel: both her sessions end.
        let (status, body) = provider.backchannel("ana").await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
        assert!(ana.me(&app).await.is_none());
        assert!(ana_too.me(&app).await.is_none());
        assert!(max.me(&app).await.is_some(), "Max is someone else");
        let ended = sessions_ended(&app).await;
        assert_eq!(ended.len(), 1, "{ended:?}");
        assert_eq!(ended[0]["detail"]["ended"], 2);
        assert!(
            ended[0]["actor"]
                .as_str()
                .unwrap()
                .contains("back-channel logout"),
            "{ended:?}"
        );
        // Replayed later, a logout token ends no session begun after it was issued.
        let old = provider
            .logout_token(&provider.main, json!({"user": "ana"}))
            .await;
        app.clock.advance(chrono::Duration::seconds(90));
        let later = Browser::new();
        assert_eq!(
            sign_in(&later, &app, "ana").await.status(),
            StatusCode::SEE_OTHER
        );
        assert_eq!(post(old).await.unwrap().status(), StatusCode::OK);
        assert!(later.me(&app).await.is_some(), "signed in after the token");
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_sign_out_ends_the_providers_session_and_the_sessions_sharing_it() {
    let Some((app, provider)) = oidc_app(Backend::Sqlite).await else {
        return;
    };
    let callback = app.url("/auth/callback");
    let b = Browser::new();
    assert_eq!(
        sign_in(&b, &app, "ana").await.status(),
        StatusCode::SEE_OTHER
    );
    // A second browser holding the same provider session (its cookies copied) signs in
    // silently: a second Countersign session of the same provider session (`sid`).
    let twin = Browser::new();
    let idp = reqwest::Url::parse(&provider.main).unwrap();
    let cookies = b.jar.cookies(&idp).unwrap();
    // (Cookies ignore ports: the jar holds Countersign's own cookies for 127.0.0.1 too.)
    for kv in cookies.to_str().unwrap().split("; ") {
        if !kv.starts_with("countersign") {
            twin.jar.add_cookie_str(&format!("{kv}; Path=/"), &idp);
        }
    }
    let (back, interacted) =
        authorize_seen(&twin, &begin(&twin, &app).await, "ana", &callback).await;
    assert!(!interacted);
    assert_eq!(twin.get(&back).await.status(), StatusCode::SEE_OTHER);
    assert!(twin.me(&app).await.is_some());
    // Ana also signs in elsewhere, authenticating anew: another provider session.
    let elsewhere = Browser::new();
    assert_eq!(
        sign_in(&elsewhere, &app, "ana").await.status(),
        StatusCode::SEE_OTHER
    );

    // Sign-out sends the browser to the provider's end-session endpoint.
    let resp = b.post_form(&app, "/auth/logout", &[]).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let end = location(&resp);
    assert!(end.starts_with(&provider.main), "{end}");
    assert!(query_param(&end, "id_token_hint").is_some(), "{end}");
    assert_eq!(
        query_param(&end, "post_logout_redirect_uri").as_deref(),
        Some(app.url("/auth/signed-out").as_str())
    );
    assert!(
        b.me(&app).await.is_none(),
        "Countersign's session ended first"
    );
    // The provider asks; the person confirms.
    let page = b.get(&end).await;
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    let field = |name: &str| {
        let at = html
            .find(&format!("{name}=\""))
            .unwrap_or_else(|| panic!("{html}"));
        let rest = &html[at + name.len() + 2..];
        rest[..rest.find('"').unwrap()].to_string()
    };
    let action = field("action");
    let xsrf = {
        let needle = "name=\"xsrf\" value=\"";
        let at = html.find(needle).unwrap_or_else(|| panic!("{html}"));
        let rest = &html[at + needle.len()..];
        rest[..rest.find('"').unwrap()].to_string()
    };
    let action = if action.starts_with('/') {
        format!("{}{action}", provider.main)
    } else {
        action
    };
    let resp = b
        .client
        .post(&action)
        .form(&[("xsrf", xsrf.as_str()), ("logout", "yes")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    assert!(location(&resp).starts_with(&app.url("/auth/signed-out")));
    // The provider told Countersign over the back channel: the twin's session ended too;
    // her session of another provider session stays.
    let ended = sessions_ended(&app).await;
    assert!(twin.me(&app).await.is_none(), "{ended:?}");
    assert!(
        elsewhere.me(&app).await.is_some(),
        "another provider session"
    );
    // Signing in again means authenticating again.
    let (back, interacted) = authorize_seen(&b, &begin(&b, &app).await, "ana", &callback).await;
    assert!(interacted, "the provider asked her to authenticate");
    let resp = b.get(&back).await;
    assert_eq!(
        resp.status(),
        StatusCode::SEE_OTHER,
        "{:?}",
        resp.text().await
    );
    app.stop().await;
}
