//! Playing a scenario's steps: tool calls, plans, reviews, people's decisions, faults, waits
//! and clock moves.

use super::runner::Runner;
use super::script::Action;
use super::script::IN_APP_ISSUER;
use super::script::ObjectCheck;
use super::script::parse_duration;
use super::values::{check_value, subst, subst_str};
use crate::adapters::builtin::{ERP, Fault, inject_fault};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

impl Runner<'_, '_> {
    pub(super) async fn step(&mut self, a: &Action) -> Result<(), String> {
        let check = a.reply.clone().unwrap_or_default();
        if let Some(tool) = &a.call {
            let actor = a.actor.as_deref().ok_or("a call needs `as`")?;
            let arguments = subst(a.arguments.as_ref().unwrap_or(&json!({})), &self.vars)?;
            let mut params = json!({"name": tool, "arguments": arguments});
            if let Some(meta) = &a.meta {
                params["_meta"] = subst(meta, &self.vars)?;
            }
            let session = self.session(actor).await?;
            if !check.listed.is_empty() || !check.not_listed.is_empty() {
                let names = session.tool_names().await?;
                for t in &check.listed {
                    if !names.contains(t) {
                        return Err(format!("{t} is not listed for {actor}: {names:?}"));
                    }
                }
                for t in &check.not_listed {
                    if names.contains(t) {
                        return Err(format!("{t} is listed for {actor}"));
                    }
                }
            }
            let reply = session.request("tools/call", params).await?;
            if let Some(code) = check.rpc_error {
                if reply["error"]["code"] != json!(code) {
                    return Err(format!("wanted JSON-RPC error {code}: {reply}"));
                }
                return Ok(());
            }
            if reply.get("result").is_none() {
                return Err(format!("no result: {reply}"));
            }
            let content = &reply["result"]["structuredContent"];
            if let Some(want) = check.is_error
                && reply["result"]["isError"] != json!(want)
            {
                return Err(format!("isError wanted {want}: {reply}"));
            }
            check_value(&check, content, &self.vars).map_err(|e| format!("{e} in {reply}"))?;
            return self.save(&a.save, content);
        }
        if let Some(d) = &a.decide {
            let actor = a.actor.as_deref().ok_or("a decision needs `as`")?;
            let person = self.person(actor)?;
            let step = subst_str(&d.step, &self.vars)?;
            let in_app = self
                .scenario
                .actors
                .get(actor)
                .and_then(|x| x.approver_role.clone());
            let (status, body) = match in_app {
                Some(role) => {
                    self.decide_in_app(&person, &role, &step, &d.verdict, &d.reason)
                        .await?
                }
                None => self.decide(&person, &step, &d.verdict, &d.reason).await?,
            };
            let want = check.http.unwrap_or(200);
            if status != want {
                return Err(format!("decision answered {status}, wanted {want}: {body}"));
            }
            check_value(&check, &body, &self.vars).map_err(|e| format!("{e} in {body}"))?;
            return self.save(&a.save, &body);
        }
        if let Some(form) = &a.form {
            let actor = a.actor.as_deref().ok_or("a form needs `as`")?;
            let person = self.person(actor)?;
            let mut fields = Vec::with_capacity(form.fields.len());
            for (k, v) in &form.fields {
                fields.push((k.clone(), subst_str(v, &self.vars)?));
            }
            let cookie = self.sign_in(&person).await?;
            let base = &self.target.url;
            let resp = self
                .http
                .post(format!("{base}{}", form.path))
                .header("origin", self.target.origin.as_deref().unwrap_or(base))
                .header(reqwest::header::COOKIE, cookie)
                .form(&fields)
                .send()
                .await
                .map_err(|e| format!("form {}: {e}", form.path))?;
            let status = resp.status().as_u16();
            let want = check.http.unwrap_or(200);
            if status != want {
                let body = resp.text().await.unwrap_or_default();
                return Err(format!(
                    "form {} answered {status}, wanted {want}: {body}",
                    form.path
                ));
            }
            return Ok(());
        }
        if let Some(f) = &a.fault {
            let system = f.system.as_deref().unwrap_or(ERP);
            let fault = Fault {
                mode: f.mode,
                times: f.times.unwrap_or(1),
            };
            return inject_fault(&self.target.store, system, &f.operation, &fault)
                .await
                .map_err(|e| format!("fault: {e}"));
        }
        if let Some(set) = &a.set {
            let system = set.system.as_deref().unwrap_or(ERP);
            let id = subst_str(&set.id, &self.vars)?;
            let store = &self.target.store;
            let obj = store
                .demo_get(system, &set.kind, &id)
                .await
                .map_err(|e| format!("set: {e}"))?
                .ok_or_else(|| format!("set: no {system} {} {id}", set.kind))?;
            let mut data: Value =
                serde_json::from_str(&obj.data).map_err(|e| format!("set: {e}"))?;
            for (ptr, value) in &set.fields {
                let value = subst(value, &self.vars)?;
                let slot = data
                    .pointer_mut(ptr)
                    .ok_or_else(|| format!("set: nothing at {ptr} in {}", obj.data))?;
                *slot = value;
            }
            return store
                .demo_put(system, &set.kind, &id, &obj.tenant, &data.to_string())
                .await
                .map(|_| ())
                .map_err(|e| format!("set: {e}"));
        }
        if let Some(w) = &a.wait
            && let Some(run) = &w.run
        {
            if w.step.is_some() {
                return Err("wait for a step or a run, not both".into());
            }
            let run = subst_str(run, &self.vars)?;
            let limit = Duration::from_millis(w.timeout_ms.unwrap_or(20_000));
            let began = Instant::now();
            loop {
                let now = self
                    .target
                    .store
                    .get_run(&run)
                    .await
                    .map_err(|e| format!("run {run}: {e}"))?;
                if now.status.as_str() == w.status {
                    return Ok(());
                }
                if began.elapsed() > limit {
                    return Err(format!(
                        "run {run} stuck at {}, wanted {}",
                        now.status.as_str(),
                        w.status
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if let Some(w) = &a.wait {
            let step = subst_str(
                w.step.as_deref().ok_or("wait needs step or run")?,
                &self.vars,
            )?;
            let limit = Duration::from_millis(w.timeout_ms.unwrap_or(20_000));
            let began = Instant::now();
            loop {
                let now = self
                    .target
                    .store
                    .get_step(&step)
                    .await
                    .map_err(|e| format!("step {step}: {e}"))?;
                if now.status.as_str() == w.status {
                    return Ok(());
                }
                if began.elapsed() > limit {
                    return Err(format!(
                        "step {step} ({}) stuck at {}, wanted {}",
                        now.tool,
                        now.status.as_str(),
                        w.status
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if let Some(text) = &a.advance {
            let by = parse_duration(text).ok_or_else(|| format!("bad duration {text}"))?;
            let advance = self
                .target
                .advance
                .ok_or("this server's clock cannot be advanced")?;
            advance(by);
            return Ok(());
        }
        if let Some(ms) = a.sleep_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            return Ok(());
        }
        if !a.effects.is_empty() {
            for ec in &a.effects {
                let system = ec.system.as_deref().unwrap_or(ERP);
                let got = self
                    .target
                    .store
                    .demo_effects(system, &ec.operation)
                    .await
                    .map_err(|e| format!("effects: {e}"))?;
                if got.len() != ec.count {
                    return Err(format!(
                        "{} effects of {system} {}, wanted {}",
                        got.len(),
                        ec.operation,
                        ec.count
                    ));
                }
            }
            return Ok(());
        }
        if !a.objects.is_empty() {
            for oc in &a.objects {
                self.object_check(oc).await?;
            }
            return Ok(());
        }
        Err(
            "a step needs one of call, decide, form, fault, set, wait, advance, sleep_ms, effects, objects"
                .into(),
        )
    }

    /// `oc` holds for the record as the demo system has it now.
    pub(super) async fn object_check(&self, oc: &ObjectCheck) -> Result<(), String> {
        let system = oc.system.as_deref().unwrap_or(ERP);
        let id = subst_str(&oc.id, &self.vars)?;
        let obj = self
            .target
            .store
            .demo_get(system, &oc.kind, &id)
            .await
            .map_err(|e| format!("{system} {} {id}: {e}", oc.kind))?
            .ok_or_else(|| format!("no {system} {} {id}", oc.kind))?;
        let data: Value = serde_json::from_str(&obj.data).map_err(|e| e.to_string())?;
        check_value(&oc.is, &data, &self.vars)
            .map_err(|e| format!("{system} {} {id}: {e} in {data}", oc.kind))
    }

    /// A person outside the dashboard decides: the store's decision path, with the gate rules
    /// of the registry in force for the step's tool and inputs; an approval their tool
    /// requires a signature for is signed with the person's scenario passkey.
    pub(super) async fn decide_in_app(
        &mut self,
        person: &str,
        role: &str,
        step: &str,
        verdict: &str,
        reason: &str,
    ) -> Result<(u16, Value), String> {
        use countersign_core::approvals::{Approver, Decider, Verdict};
        let store = self.target.store.clone();
        let verdict = match verdict {
            "approved" => Verdict::Approved,
            "rejected" => Verdict::Rejected,
            other => return Err(format!("verdict {other}: approved or rejected")),
        };
        let (rules, tenant) = self.rules_of(step).await?;
        let decider = Decider {
            approver: Approver {
                iss: IN_APP_ISSUER.into(),
                sub: person.to_string(),
            },
            roles: vec![role.to_string()],
            auth_time: store.clock().now_ms(),
            auth_time_unknown: false,
        };
        // A signature that cannot be made (no gate window, an address without passkeys)
        // leaves the decision unsigned: the server's answer then says why.
        let submission = if rules.signature_required && verdict == Verdict::Approved {
            self.sign_in_app(&decider.approver, &tenant, step, verdict)
                .await
                .inspect_err(|e| tracing::debug!(error = %e, "scenario: no signature"))
                .ok()
        } else {
            None
        };
        let rp = url::Url::parse(self.target.origin.as_deref().unwrap_or(&self.target.url))
            .ok()
            .and_then(|u| countersign_core::signing::webauthn::RelyingParty::from_public_url(&u));
        match store
            .decide_step_signed(
                rp.as_ref(),
                step,
                &decider,
                &rules,
                verdict,
                reason,
                submission.as_ref(),
            )
            .await
        {
            Ok((approval, _)) => {
                let status = store
                    .get_step(step)
                    .await
                    .map(|s| s.status.as_str())
                    .unwrap_or("unknown");
                Ok((
                    200,
                    json!({"step_id": step, "decision": approval.decision, "status": status}),
                ))
            }
            Err(countersign_core::approvals::DecideError::Store(e)) => Err(e.to_string()),
            Err(e) => Ok((409, json!({"error": e.to_string()}))),
        }
    }

    /// Signs `person` in through the demo sign-in and posts the decision (signed with their
    /// scenario passkey where the tool requires it).
    pub(super) async fn decide(
        &mut self,
        person: &str,
        step: &str,
        verdict: &str,
        reason: &str,
    ) -> Result<(u16, Value), String> {
        let base = self.target.url.clone();
        let origin = self.target.origin.clone().unwrap_or_else(|| base.clone());
        let cookie = self.sign_in(person).await?;
        let mut body = json!({"verdict": verdict, "reason": reason});
        let (rules, _) = self.rules_of(step).await?;
        // A challenge the server does not issue (a step this person may not see) leaves the
        // decision unsigned: the server's answer to it is what the scenario checks.
        if rules.signature_required && verdict == "approved" {
            match self.sign_over_http(person, &cookie, step, verdict).await {
                Ok(signature) => body["signature"] = signature,
                Err(e) => tracing::debug!(error = %e, "scenario: no signature"),
            }
        }
        let resp = self
            .http
            .post(format!("{base}/api/steps/{step}/decision"))
            .header("origin", origin)
            .header(reqwest::header::COOKIE, cookie)
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("decision: {e}"))?;
        let status = resp.status().as_u16();
        let body = resp.json::<Value>().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    /// The demo person actor `actor` names.
    fn person(&self, actor: &str) -> Result<String, String> {
        self.scenario
            .actors
            .get(actor)
            .and_then(|x| x.person.clone())
            .ok_or_else(|| format!("{actor} is not a person of this scenario"))
    }

    /// Signs `person` in through the demo sign-in: the session cookie.
    async fn sign_in(&self, person: &str) -> Result<String, String> {
        let base = &self.target.url;
        let origin = self.target.origin.as_deref().unwrap_or(base);
        let signed = self
            .http
            .post(format!("{base}/auth/demo"))
            .header("origin", origin)
            .form(&[("user", person)])
            .send()
            .await
            .map_err(|e| format!("sign-in: {e}"))?;
        if signed.status() != reqwest::StatusCode::SEE_OTHER {
            return Err(format!("demo sign-in of {person}: {}", signed.status()));
        }
        let cookie = signed
            .headers()
            .get_all(reqwest::header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|v| v.split(';').next())
            .collect::<Vec<_>>()
            .join("; ");
        Ok(cookie)
    }
}
