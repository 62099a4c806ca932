//! `/mcp` as an OAuth 2.1 resource server, against a real authorization server (npm
//! `oidc-provider`, run by end2end/oidc/agents-as.mjs: client credentials, resource
//! indicators, JWT access tokens). The official Python MCP SDK discovers the protected
//! resource metadata and the authorization server and obtains its own token (client
//! credentials); every refusal case is a token the authorization server issued or signed as a
//! broken one would, answered 401 (403 for a missing scope) and audited.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};

use countersign_core::Clock;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, example, spawn_app_with};
use crate::interop::{self, Sdk, repo_root};
use crate::reliability::{Child as KillOnDrop, free_port};
use countersign_core::Backend;

/// The authorization server process: its stdin closes first, then it is killed (fields drop
/// in order).
struct As {
    _stdin: Option<ChildStdin>,
    _child: KillOnDrop,
    main: String,
    other: String,
}

/// Starts the authorization server for `resource`; `None` (loudly) when node or the package
/// is missing outside CI.
fn start_as(resource: &str) -> Option<As> {
    let root = repo_root();
    if !root
        .join("node_modules/oidc-provider/package.json")
        .is_file()
    {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
            "OAuth tests need node_modules/oidc-provider (npm ci)"
        );
        eprintln!("\n!!! SKIPPING OAuth tests: node_modules/oidc-provider is missing !!!\n");
        return None;
    }
    let mut child = Command::new("node")
        .arg(root.join("end2end/oidc/agents-as.mjs"))
        .current_dir(&root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("node starts");
    let mut stdin = child.stdin.take();
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("issuers");
    let info: Value = serde_json::from_str(&line).expect("issuers JSON");
    let pipe = stdin.as_mut().expect("stdin");
    writeln!(pipe, "{}", json!({ "resource": resource })).unwrap();
    pipe.flush().unwrap();
    line.clear();
    stdout.read_line(&mut line).expect("ready");
    assert!(line.contains("ready"), "{line}");
    Some(As {
        _stdin: stdin,
        _child: KillOnDrop(child),
        main: info["main"].as_str().unwrap().to_string(),
        other: info["other"].as_str().unwrap().to_string(),
    })
}

/// A token `issuer` issues to `client` (client credentials) for `resource`.
async fn token_for(issuer: &str, client: &str, resource: &str, scope: Option<&str>) -> String {
    let mut form = vec![("grant_type", "client_credentials"), ("resource", resource)];
    if let Some(scope) = scope {
        form.push(("scope", scope));
    }
    let resp: Value = reqwest::Client::new()
        .post(format!("{issuer}/token"))
        .basic_auth(client, Some(format!("{client}-secret")))
        .form(&form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    resp["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token: {resp}"))
        .to_string()
}

/// A token `issuer` signs as asked (`mode`: rs256, none, hs256-public, unknown-kid).
async fn signed(issuer: &str, claims: Value, mode: &str) -> String {
    let resp: Value = reqwest::Client::new()
        .post(format!("{issuer}/__test__/sign"))
        .json(&json!({"claims": claims, "mode": mode}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    resp["token"].as_str().unwrap().to_string()
}

/// `tools/list` (a session-less request) with `token`: the status and the challenge.
async fn list_with(app: &TestApp, token: &str) -> (StatusCode, String) {
    let resp = app
        .client
        .post(app.url("/mcp"))
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", crate::mcp::SESSION_LESS)
        .header("Mcp-Method", "tools/list")
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": crate::mcp::SESSION_LESS,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "it", "version": "0"}}}}),
        )
        .send()
        .await
        .unwrap();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (resp.status(), challenge)
}

/// The reasons of the `agent.oauth_refused` records so far.
async fn refusals(app: &TestApp) -> Vec<String> {
    let mut reasons = Vec::new();
    for chain in ["_system", "acme"] {
        for r in app.store.audit_records(chain, 1, 10_000).await.unwrap() {
            if r.rule.as_deref() == Some(countersign::oauth::REFUSED_RULE) {
                let record: Value = serde_json::from_str(&r.record).unwrap_or(Value::Null);
                let reason = &record["detail"]["reason"];
                reasons.push(reason.as_str().unwrap_or_default().to_string());
            }
        }
    }
    reasons
}

#[tokio::test]
async fn agents_authenticate_with_oauth_access_tokens_and_bad_ones_are_refused() {
    let port = free_port();
    let public = format!("http://127.0.0.1:{port}");
    let resource = format!("{public}/mcp");
    let Some(auth) = start_as(&resource) else {
        return;
    };
    let registry = example("finance");
    let Some(app) = spawn_app_with(
        Backend::Sqlite,
        &[
            ("COUNTERSIGN_REGISTRY", registry.as_str()),
            ("COUNTERSIGN_LISTEN", &format!("127.0.0.1:{port}")),
            ("COUNTERSIGN_PUBLIC_URL", &public),
            ("COUNTERSIGN_AGENT_OAUTH_ISSUERS", &auth.main),
        ],
    )
    .await
    else {
        return;
    };
    // An admin registers the client on the admin page (an issuer not configured is refused).
    let ada = app.demo_client("ada").await;
    let register = |issuer: String| {
        let ada = ada.clone();
        let url = app.url("/admin/agents");
        let public = public.clone();
        async move {
            ada.post(url)
                .header("origin", public)
                .form(&[
                    ("name", "fin-oauth"),
                    ("role", "worker.finance"),
                    ("tenant", "acme"),
                    ("oauth_issuer", issuer.as_str()),
                    ("oauth_client", "fin-agent"),
                ])
                .send()
                .await
                .unwrap()
        }
    };
    let untrusted = register(auth.other.clone()).await;
    assert_ne!(untrusted.status(), StatusCode::OK);
    assert!(app.store.list_agents().await.unwrap().is_empty());
    let page = register(auth.main.clone()).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("OAuth client registered")
    );
    let registered = app.store.list_agents().await.unwrap().remove(0);
    assert_eq!(registered.created_by, "person:urn:countersign:demo#ada");
    let created = app.store.audit_records("acme", 1, 100).await.unwrap();
    assert!(
        created
            .iter()
            .any(|r| r.rule.as_deref() == Some("agent.created")
                && r.record.contains("fin-agent")
                && r.record.contains(&auth.main)),
        "the registration is audited with its client"
    );

    // The metadata, and the challenge that points at it.
    let meta: Value = app
        .client
        .get(app.url("/.well-known/oauth-protected-resource/mcp"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(meta["resource"], resource.as_str(), "{meta}");
    assert_eq!(meta["authorization_servers"], json!([auth.main]), "{meta}");
    assert_eq!(meta["scopes_supported"], json!(["mcp:tools"]), "{meta}");
    assert_eq!(
        meta["bearer_methods_supported"],
        json!(["header"]),
        "{meta}"
    );
    let (status, challenge) = list_with(&app, "not-a-token").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        challenge.contains(&format!(
            r#"resource_metadata="{public}/.well-known/oauth-protected-resource/mcp""#
        )),
        "{challenge}"
    );

    // The official Python SDK finds its way by itself and calls tools as the registered agent.
    if let Some(mut cmd) = interop::client_command(Sdk::Python) {
        cmd.env("MCP_OAUTH_ISSUER", &auth.main)
            .env("MCP_OAUTH_CLIENT", "fin-agent")
            .env("MCP_OAUTH_SECRET", "fin-agent-secret");
        let script = json!([
            {"op": "list"},
            interop::call("invoice.get", json!({"invoice_id": crate::mcp::INV})),
        ]);
        let out = interop::run_client_at(cmd, Sdk::Python, &resource, "-", script).await;
        let tools = interop::at(&out, 0)["tools"].to_string();
        assert!(tools.contains("\"invoice.get\""), "{out:#}");
        assert!(!tools.contains("\"supplier.update_iban\""), "{out:#}");
        assert_eq!(interop::result(&out, 1)["isError"], false, "{out:#}");
        let runs = crate::gateway::runs_of(&app, &registered.id).await;
        assert_eq!(
            runs.len(),
            1,
            "the call is the registered agent's: {runs:?}"
        );
    }
    let good = token_for(&auth.main, "fin-agent", &resource, Some("mcp:tools")).await;
    assert_eq!(list_with(&app, &good).await.0, StatusCode::OK);

    // Refused, each audited with its reason.
    let now = app.clock.now_ms() / 1000;
    let claims = |extra: Value| {
        let mut c = json!({"iss": auth.main, "aud": resource, "client_id": "fin-agent",
                           "sub": "fin-agent", "scope": "mcp:tools", "iat": now,
                           "exp": now + 300});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    let cases = [
        (
            "audience",
            token_for(
                &auth.main,
                "fin-agent",
                "http://elsewhere.test/mcp",
                Some("mcp:tools"),
            )
            .await,
        ),
        (
            "issuer",
            token_for(&auth.other, "fin-agent", &resource, Some("mcp:tools")).await,
        ),
        (
            "expired",
            signed(&auth.main, claims(json!({"exp": now - 120})), "rs256").await,
        ),
        (
            "not_yet_valid",
            signed(&auth.main, claims(json!({"nbf": now + 120})), "rs256").await,
        ),
        (
            "algorithm",
            signed(&auth.main, claims(json!({})), "none").await,
        ),
        (
            "algorithm",
            signed(&auth.main, claims(json!({})), "hs256-public").await,
        ),
        (
            "unknown_key",
            signed(&auth.main, claims(json!({})), "unknown-kid").await,
        ),
        // Signed by the other issuer's key under the kid the trusted issuer publishes.
        (
            "signature",
            signed(&auth.other, claims(json!({})), "rs256").await,
        ),
        // No `client_id` (a `sub` alone may name a person): nobody.
        (
            "malformed",
            signed(&auth.main, claims(json!({"client_id": null})), "rs256").await,
        ),
        (
            "unregistered_client",
            token_for(&auth.main, "stranger", &resource, Some("mcp:tools")).await,
        ),
    ];
    let count = |all: &[String], reason: &str| all.iter().filter(|r| *r == reason).count();
    let mut seen = std::collections::HashSet::new();
    for (reason, token) in &cases {
        let before = refusals(&app).await;
        let (status, _) = list_with(&app, token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{reason}");
        // The first refusal of each kind is recorded by this request (a repeat within a
        // minute is counted into the next record instead).
        if seen.insert(*reason) {
            let after = refusals(&app).await;
            assert_eq!(
                count(&after, reason),
                count(&before, reason) + 1,
                "{reason} is not audited: {after:?}"
            );
        }
    }
    // The issuer rotates its key: a token naming the new kid is accepted once the keys may be
    // fetched again (an unknown kid refetches them at most once per REFRESH_EVERY).
    let rotated: Value = reqwest::Client::new()
        .post(format!("{}/__test__/rotate", auth.main))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    tokio::time::sleep(countersign::oauth::token::REFRESH_EVERY).await;
    // Past the window, an unknown kid makes the verifier fetch the keys again: the new set
    // lacks it too (refused), and holds the rotated key the next token names — which is
    // then accepted without another fetch (one would not be allowed this soon).
    let ghost = signed(&auth.main, claims(json!({})), "unknown-kid").await;
    assert_eq!(list_with(&app, &ghost).await.0, StatusCode::UNAUTHORIZED);
    let fresh = token_for(&auth.main, "fin-agent", &resource, Some("mcp:tools")).await;
    let header: Value = {
        use base64::Engine as _;
        let part = fresh.split('.').next().unwrap();
        serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(part)
                .unwrap(),
        )
        .unwrap()
    };
    assert_eq!(header["kid"], rotated["kid"], "{header}");
    assert_eq!(list_with(&app, &fresh).await.0, StatusCode::OK);

    // A token without the scope: 403 naming it.
    let unscoped = token_for(&auth.main, "no-scope", &resource, None).await;
    let (status, challenge) = list_with(&app, &unscoped).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        challenge.contains(r#"error="insufficient_scope""#)
            && challenge.contains(r#"scope="mcp:tools""#),
        "{challenge}"
    );
    assert!(refusals(&app).await.contains(&"scope".to_string()));

    // Revoking the registration takes effect at the next request.
    app.store
        .revoke_agent(&registered.id, "person:https://idp.example#admin")
        .await
        .unwrap();
    assert_eq!(list_with(&app, &fresh).await.0, StatusCode::UNAUTHORIZED);
    assert!(
        refusals(&app)
            .await
            .contains(&"registration_revoked".to_string())
    );
    drop(auth);
    app.stop().await;
}
