//! Scenario people sign the approvals their tools require: each person of a scenario gets a
//! software passkey (a random key held only by this run), registered the way a browser
//! registers one — through the store for in-app people, through the HTTP API for people who
//! sign in — and signs the server's challenge for each such approval.

use countersign_core::approvals::{Approver, GateRules, Verdict};
use countersign_core::signing::challenge::Signed;
use countersign_core::signing::decide::Submission;
use countersign_core::signing::webauthn::soft::SoftPasskey;
use countersign_core::signing::webauthn::{RelyingParty, b64, read_registration, unb64};
use serde_json::{Value, json};

use super::runner::Runner;

impl Runner<'_, '_> {
    /// The gate rules of `step_id` under the registry in force.
    pub(super) async fn rules_of(&self, step_id: &str) -> Result<(GateRules, String), String> {
        let store = &self.target.store;
        let found = store.get_step(step_id).await.map_err(|e| e.to_string())?;
        let (_, sources) = store
            .current_bundle()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no registry in force")?;
        let bundle = countersign_core::Bundle::load(sources).map_err(|e| e.to_string())?;
        let tool = countersign_core::ToolName::parse(&found.tool)
            .ok()
            .and_then(|n| bundle.registry.tool(&n).cloned())
            .ok_or_else(|| format!("{} is not in the registry in force", found.tool))?;
        let inputs: Value = serde_json::from_str(&found.inputs).map_err(|e| e.to_string())?;
        let tenant = store
            .get_run(&found.run_id)
            .await
            .map_err(|e| e.to_string())?
            .tenant;
        Ok((crate::pipeline::gate_rules(&tool, &inputs), tenant))
    }

    /// The relying party of the target, as the server derives it from its public URL.
    fn relying_party(&self) -> Result<RelyingParty, String> {
        let base = self.target.origin.as_deref().unwrap_or(&self.target.url);
        url::Url::parse(base)
            .ok()
            .and_then(|u| RelyingParty::from_public_url(&u))
            .ok_or_else(|| format!("{base} cannot use passkeys"))
    }

    /// `person`'s passkey, made on first use.
    fn passkey(&mut self, person: &str) -> Result<(&mut SoftPasskey, bool), String> {
        let new = !self.passkeys.contains_key(person);
        if new {
            self.passkeys
                .insert(person.to_string(), SoftPasskey::random()?);
        }
        let key = self
            .passkeys
            .get_mut(person)
            .ok_or("the passkey just made")?;
        Ok((key, new))
    }

    /// An in-app person's signature of `verdict` on `step_id` (registering their passkey
    /// through the store first, audited like any).
    pub(super) async fn sign_in_app(
        &mut self,
        approver: &Approver,
        tenant: &str,
        step_id: &str,
        verdict: Verdict,
    ) -> Result<Submission, String> {
        let rp = self.relying_party()?;
        let store = self.target.store.clone();
        let (key, new) = self.passkey(&approver.actor())?;
        if new {
            let (cd, att) = key.register(&rp, b"scenario");
            let reg = read_registration(&rp, &cd, &att, b"scenario").map_err(|e| e.to_string())?;
            store
                .register_passkey(
                    tenant,
                    approver,
                    "scenario passkey (held by the scenario runner)",
                    &reg,
                    &rp,
                )
                .await
                .map_err(|e| e.to_string())?;
        }
        let step = store.get_step(step_id).await.map_err(|e| e.to_string())?;
        let expires = step.expires_at.ok_or("the step has no gate window")?;
        let issued = store
            .issue_decision_challenge(
                tenant,
                approver,
                &Signed::Step {
                    step_id: step.id.clone(),
                    inputs_hash: step.inputs_hash.clone(),
                },
                verdict,
                expires,
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(Submission {
            assertion: key.assert(&rp, &issued.challenge),
            nonce: issued.nonce,
        })
    }

    /// A signed-in person's signature of `verdict` on `step_id`, as the JSON body's
    /// `signature` (registering their passkey through the HTTP API first).
    pub(super) async fn sign_over_http(
        &mut self,
        person: &str,
        cookie: &str,
        step_id: &str,
        verdict: &str,
    ) -> Result<Value, String> {
        let rp = self.relying_party()?;
        let base = self.target.url.clone();
        let origin = self.target.origin.clone().unwrap_or_else(|| base.clone());
        let http = self.http.clone();
        let post = |path: String, body: Value| {
            http.post(format!("{base}{path}"))
                .header("origin", origin.as_str())
                .header(reqwest::header::COOKIE, cookie)
                .json(&body)
                .send()
        };
        let answer = |r: Result<reqwest::Response, reqwest::Error>, what: &'static str| async move {
            let r = r.map_err(|e| format!("{what}: {e}"))?;
            let status = r.status();
            let body = r.json::<Value>().await.unwrap_or(Value::Null);
            if status.is_success() {
                Ok(body)
            } else {
                Err(format!("{what} answered {status}: {body}"))
            }
        };
        let (key, new) = self.passkey(person)?;
        if new {
            let options = answer(
                post("/api/passkeys/options".into(), json!({})).await,
                "passkey options",
            )
            .await?;
            let nonce = options["nonce"].as_str().unwrap_or_default().to_string();
            let challenge = unb64(&nonce, "nonce").map_err(|e| e.to_string())?;
            let (cd, att) = key.register(&rp, &challenge);
            answer(
                post(
                    "/api/passkeys".into(),
                    json!({"label": "scenario passkey (held by the scenario runner)", "nonce": nonce,
                           "client_data_json": b64(&cd), "attestation_object": b64(&att)}),
                )
                .await,
                "passkey registration",
            )
            .await?;
        }
        let issued = answer(
            post(
                format!("/api/steps/{step_id}/challenge"),
                json!({"verdict": verdict}),
            )
            .await,
            "signing challenge",
        )
        .await?;
        let challenge = unb64(
            issued["challenge"].as_str().unwrap_or_default(),
            "challenge",
        )
        .map_err(|e| e.to_string())?;
        let a = key.assert(&rp, &challenge);
        Ok(json!({
            "nonce": issued["nonce"],
            "credential_id": b64(&a.credential_id),
            "authenticator_data": b64(&a.authenticator_data),
            "client_data_json": b64(&a.client_data_json),
            "signature": b64(&a.signature),
        }))
    }
}
