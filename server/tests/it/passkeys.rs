//! Passkeys over HTTP (issue 38), on both backends: registration needs a fresh sign-in, a
//! nonce used once and a verified user; removal and revocation are audited with the key; a
//! signature-required gate is refused through the API without an assertion, runs once with
//! one, and `audit verify-signatures` checks the trail — naming the record an edited export
//! breaks.

use countersign::adapters::builtin::ERP;
use countersign_core::signing::webauthn::soft::SoftPasskey;
use countersign_core::signing::webauthn::{RelyingParty, b64, unb64};
use reqwest::StatusCode;
use reqwest::header::LOCATION;
use serde_json::{Value, json};

use crate::helpers::{TestApp, countersign_on, http_signature};
use crate::mcp::{Client, agent, each_finance_app, payment_for};

fn rp(app: &TestApp) -> RelyingParty {
    app.state
        .config
        .relying_party()
        .expect("a loopback public URL")
}

async fn post_json(
    app: &TestApp,
    who: &reqwest::Client,
    path: &str,
    body: Value,
) -> (StatusCode, Value) {
    let resp = who
        .post(app.url(path))
        .header("origin", format!("http://{}", app.addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Asks for options and answers them with `key`: the registration's status and answer.
async fn register(app: &TestApp, who: &reqwest::Client, key: &SoftPasskey) -> (StatusCode, Value) {
    let (status, options) = post_json(app, who, "/api/passkeys/options", json!({})).await;
    if status != StatusCode::OK {
        return (status, options);
    }
    let nonce = options["nonce"].as_str().unwrap().to_string();
    let (cd, att) = key.register(&rp(app), &unb64(&nonce, "nonce").unwrap());
    post_json(
        app,
        who,
        "/api/passkeys",
        json!({"label": "laptop", "nonce": nonce, "client_data_json": b64(&cd),
               "attestation_object": b64(&att)}),
    )
    .await
}

async fn rules_audited(app: &TestApp, rule: &str) -> Vec<Value> {
    app.store
        .audit_records("acme", 1, 10_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.rule.as_deref() == Some(rule))
        .map(|r| serde_json::from_str(&r.record).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passkeys_are_registered_fresh_once_verified_and_removed_or_revoked_with_an_audit() {
    each_finance_app(|app| async move {
        let ana = app.demo_client("ana").await;
        let key = SoftPasskey::random().unwrap();
        let (status, body) = register(&app, &ana, &key).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let id = body["credential_id"].as_str().unwrap().to_string();
        assert_eq!(id, b64(&key.credential_id));
        // The registration record carries the public key and the RP id.
        let recorded = rules_audited(&app, "passkey.registered").await;
        assert_eq!(recorded.len(), 1);
        assert_eq!(
            recorded[0]["detail"]["cose_key"],
            json!(b64(&key.cose_key()))
        );
        assert_eq!(recorded[0]["detail"]["rp_id"], "localhost");
        assert_eq!(recorded[0]["actor"], "person:urn:countersign:demo#ana");

        // The same answer again: its nonce is spent.
        let (_, options) = post_json(&app, &ana, "/api/passkeys/options", json!({})).await;
        let nonce = options["nonce"].as_str().unwrap().to_string();
        let other = SoftPasskey::random().unwrap();
        let (cd, att) = other.register(&rp(&app), &unb64(&nonce, "n").unwrap());
        let body =
            json!({"nonce": nonce, "client_data_json": b64(&cd), "attestation_object": b64(&att)});
        let (first, _) = post_json(&app, &ana, "/api/passkeys", body.clone()).await;
        assert_eq!(first, StatusCode::CREATED);
        let (replayed, answer) = post_json(&app, &ana, "/api/passkeys", body).await;
        assert_eq!(
            (replayed, answer["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("challenge"))
        );
        // An authenticator that did not verify its user registers nothing.
        let mut lax = SoftPasskey::random().unwrap();
        lax.user_verified = false;
        let (status, answer) = register(&app, &ana, &lax).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("user_verification"))
        );
        // Another site's answer registers nothing.
        let (_, options) = post_json(&app, &ana, "/api/passkeys/options", json!({})).await;
        let nonce = options["nonce"].as_str().unwrap().to_string();
        let evil = RelyingParty {
            id: "evil.example".into(),
            origin: "https://evil.example".into(),
        };
        let (cd, att) = SoftPasskey::random()
            .unwrap()
            .register(&evil, &unb64(&nonce, "n").unwrap());
        let (status, _) = post_json(
            &app,
            &ana,
            "/api/passkeys",
            json!({"nonce": nonce, "client_data_json": b64(&cd), "attestation_object": b64(&att)}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        // A browser on http://localhost:PORT (where passkeys work) is this server's origin;
        // another origin is refused before anything runs.
        let local = ana
            .post(app.url("/api/passkeys/options"))
            .header("origin", rp(&app).origin)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(local.status(), StatusCode::OK);
        let forged = ana
            .post(app.url("/api/passkeys/options"))
            .header("origin", "https://evil.example")
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), StatusCode::FORBIDDEN);
        // Eleven minutes after her sign-in she must sign in again to add one.
        app.clock.advance(chrono::Duration::minutes(11));
        let (status, answer) = register(&app, &ana, &SoftPasskey::random().unwrap()).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("step_up"))
        );

        // Pat cannot remove Ana's passkey; Ana can; Ada (admin) revokes Ana's other one.
        let pat = app.demo_client("pat").await;
        let form = |who: &reqwest::Client, path: String| {
            who.post(app.url(&path))
                .header("origin", format!("http://{}", app.addr))
                .form(&[("x", "")])
                .send()
        };
        let resp = form(&pat, format!("/passkeys/{id}/remove")).await.unwrap();
        assert_eq!(resp.headers()[LOCATION], "/passkeys?error=not_found");
        let resp = form(&ana, format!("/passkeys/{id}/remove")).await.unwrap();
        assert_eq!(resp.headers()[LOCATION], "/passkeys?done=removed");
        let resp = form(
            &pat,
            format!("/admin/passkeys/{}/revoke", b64(&other.credential_id)),
        )
        .await
        .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "not an admin");
        let ada = app.demo_client("ada").await;
        let resp = form(
            &ada,
            format!("/admin/passkeys/{}/revoke", b64(&other.credential_id)),
        )
        .await
        .unwrap();
        assert_eq!(resp.headers()[LOCATION], "/passkeys?done=revoked");
        let removed = rules_audited(&app, "passkey.removed").await;
        let revoked = rules_audited(&app, "passkey.revoked").await;
        assert_eq!((removed.len(), revoked.len()), (1, 1));
        assert_eq!(
            removed[0]["detail"]["cose_key"],
            json!(b64(&key.cose_key()))
        );
        assert_eq!(revoked[0]["actor"], "person:urn:countersign:demo#ada");
        assert!(
            app.store
                .passkeys_of(
                    "acme",
                    &countersign_core::approvals::Approver {
                        iss: "urn:countersign:demo".into(),
                        sub: "ana".into()
                    }
                )
                .await
                .unwrap()
                .iter()
                .all(|k| k.revoked_at.is_some())
        );
        // Ada's page lists the tenant's passkeys with who ended them.
        let page = ada
            .get(app.url("/passkeys"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(
            page.matches("data-testid=\"passkey-row\"").count(),
            2,
            "{page}"
        );
        assert!(page.contains("Ana (AP clerk)"), "{page}");
        app
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_payment_runs_once_and_its_signature_verifies_from_the_trail_and_an_export() {
    each_finance_app(|app| async move {
        let (_, fin) = agent(&app, "fin-1", "worker.finance").await;
        let mut client = Client::new(&app, &fin);
        client.connect().await;
        let args = payment_for("INV-20260611", json!(4180.00));
        let reply = client.call("payment.schedule", args.clone()).await;
        let step = reply["result"]["structuredContent"]["step_id"].as_str().unwrap().to_string();
        let ana = app.demo_client("ana").await;
        // The gate's page says what the signature binds and that one is still needed.
        let page = ana.get(app.url(&format!("/inbox/{step}"))).send().await.unwrap().text().await.unwrap();
        assert!(page.contains("data-testid=\"signature-needs\""), "{page}");
        assert!(page.contains("4,180.00 EUR"), "{page}");
        assert!(page.contains("First signature: an approver"), "{page}");
        assert!(page.contains("data-testid=\"no-passkey\""), "{page}");

        // The API refuses an approval without an assertion, audited with its rule.
        let (status, answer) = post_json(
            &app,
            &ana,
            &format!("/api/steps/{step}/decision"),
            json!({"verdict": "approved", "reason": "three-way match checked"}),
        )
        .await;
        assert_eq!((status, answer["rule"].as_str()), (StatusCode::FORBIDDEN, Some("signature.missing")));
        assert_eq!(rules_audited(&app, "signature.missing").await.len(), 1);

        // An approval row written around the signature check (here: rules that forgot the
        // signature) lets nothing through: the gate counts only signed approvals of a tool
        // that requires them.
        let bypass = countersign_core::approvals::GateRules {
            signature_required: false,
            ..countersign::pipeline::gate_rules(
                app.state
                    .registry
                    .current()
                    .unwrap()
                    .bundle
                    .registry
                    .tool(&countersign_core::ToolName::parse("payment.schedule").unwrap())
                    .unwrap(),
                &args,
            )
        };
        let pat = countersign_core::approvals::Decider {
            approver: countersign_core::approvals::Approver {
                iss: "https://idp.example".into(),
                sub: "pat".into(),
            },
            roles: vec!["approver".into()],
            auth_time: app.store.clock().now_ms(),
            auth_time_unknown: false,
        };
        app.store
            .decide_step(&step, &pat, &bypass, countersign_core::approvals::Verdict::Approved, "unsigned")
            .await
            .unwrap();
        let unsigned = client.call("payment.schedule", args.clone()).await;
        assert_ne!(unsigned["result"]["structuredContent"]["status"], "scheduled", "{unsigned}");
        assert!(app.store.demo_effects(ERP, "payments.schedule").await.unwrap().is_empty());

        // A batch expiring beyond what a challenge can bind gets no challenge (never a
        // constant one): refused as a malformed batch.
        let now = app.store.clock().now_ms();
        let (status, answer) = post_json(
            &app,
            &ana,
            "/api/gates/batch/challenge",
            json!({"tool": "payment.schedule", "step_ids": [step], "max_count": 1,
                   "proposed_from": 0, "proposed_to": now, "expires_at": 1_i64 << 60,
                   "reason": "June run"}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");

        let signature = http_signature(&app, &ana, "ana", &step).await;
        let (status, answer) = post_json(
            &app,
            &ana,
            &format!("/api/steps/{step}/decision"),
            json!({"verdict": "approved", "reason": "three-way match checked", "signature": signature}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let paid = client.call("payment.schedule", args.clone()).await;
        assert_eq!(paid["result"]["structuredContent"]["status"], "scheduled", "{paid}");
        let again = client.call("payment.schedule", args).await;
        assert_eq!(again["result"]["structuredContent"]["status"], "scheduled", "{again}");
        assert_eq!(app.store.demo_effects(ERP, "payments.schedule").await.unwrap().len(), 1);

        let url = app.db_url();
        let out = countersign_on(&url).args(["audit", "verify-signatures"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("1 signed decision(s) verified against 1"),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        // Offline, from an export; an edited signature is named by its record.
        let export = countersign_on(&url).args(["audit", "export", "--tenant", "acme"]).output().unwrap();
        assert!(export.status.success());
        let text = String::from_utf8(export.stdout).unwrap();
        let dir = std::env::temp_dir().join(format!("cs-sig-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.jsonl");
        std::fs::write(&good, &text).unwrap();
        let out = countersign_on(&url)
            .args(["audit", "verify-signatures", "--from-export", good.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let signed_record = |r: &Value| {
            r["event"] == "approved"
                && serde_json::from_str::<Value>(r["record"].as_str().unwrap_or("{}"))
                    .is_ok_and(|b| b["detail"]["signature"].is_object())
        };
        let approved_seq = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|r| signed_record(r))
            .map(|r| r["seq"].as_i64().unwrap())
            .unwrap();
        let edited = edited_text(&text, &signed_record);
        let bad = dir.join("bad.jsonl");
        std::fs::write(&bad, edited).unwrap();
        let out = countersign_on(&url)
            .args(["audit", "verify-signatures", "--from-export", bad.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        // The edit breaks the record's hash: the chain check, run first, names it.
        assert!(
            err.contains(&format!("chain acme broken at record {approved_seq}")),
            "{err}"
        );
        // Someone who can rewrite the whole chain re-seals it after the edit (no checkpoint
        // pins it here): the chain verifies, the signature does not, and names the record.
        let resealed = dir.join("resealed.jsonl");
        std::fs::write(&resealed, reseal(&edited_text(&text, &signed_record))).unwrap();
        let out = countersign_on(&url)
            .args(["audit", "verify", "--file", resealed.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "re-sealed: {}", String::from_utf8_lossy(&out.stderr));
        let out = countersign_on(&url)
            .args(["audit", "verify-signatures", "--from-export", resealed.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("record acme#{approved_seq}:")), "{err}");
        assert!(err.contains("not what the signature signs"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
        app
    })
    .await;
}

/// `text` (an export) with the inputs hash of each record `pick` selects changed.
fn edited_text(text: &str, pick: &impl Fn(&Value) -> bool) -> String {
    text.lines()
        .map(|l| {
            let mut r: Value = match serde_json::from_str(l) {
                Ok(r) => r,
                Err(_) => return format!("{l}\n"),
            };
            if pick(&r) {
                let mut body: Value = serde_json::from_str(r["record"].as_str().unwrap()).unwrap();
                body["detail"]["inputs_hash"] = json!(format!("sha256:{}", "1".repeat(64)));
                r["record"] = json!(countersign_core::canonical::canonicalize(&body).unwrap());
            }
            format!("{r}\n")
        })
        .collect()
}

/// An export's records re-sealed from the first one whose hash no longer matches: each
/// record's hash recomputed and the next one's `prev` relinked, as a writer of the whole
/// database could.
fn reseal(text: &str) -> String {
    let mut prev: Option<String> = None;
    text.lines()
        .map(|l| {
            let mut r: Value = match serde_json::from_str::<Value>(l) {
                Ok(r) if r.get("record").is_some() => r,
                _ => return format!("{l}\n"),
            };
            let mut body: Value = serde_json::from_str(r["record"].as_str().unwrap()).unwrap();
            if let Some(p) = &prev {
                body["prev"] = json!(p);
                r["prev"] = json!(p);
            }
            let record = countersign_core::canonical::canonicalize(&body).unwrap();
            let hash = countersign_core::audit::hash_text(&record);
            r["record"] = json!(record);
            r["hash"] = json!(hash);
            prev = Some(hash);
            format!("{r}\n")
        })
        .collect()
}
