//! The runner's state across a play: the server it plays against, its agents' sessions and
//! the values saved from replies.

use super::script::Scenario;
use super::script::Target;
use super::session::Session;
use serde_json::Value;
use std::collections::BTreeMap;

pub(super) struct Runner<'a, 'b> {
    pub(super) target: &'b Target<'a>,
    pub(super) http: reqwest::Client,
    pub(super) scenario: &'b Scenario,
    pub(super) tokens: BTreeMap<String, String>,
    pub(super) sessions: BTreeMap<String, Session>,
    pub(super) vars: BTreeMap<String, Value>,
    /// Each scenario person's software passkey (by actor text), made on first signature.
    pub(super) passkeys: BTreeMap<String, countersign_core::signing::webauthn::soft::SoftPasskey>,
}

impl Runner<'_, '_> {
    /// Ends every agent's MCP session with `DELETE /mcp`; the first failure, if any.
    pub(super) async fn close_sessions(&mut self) -> Result<(), String> {
        let mut result = Ok(());
        for (actor, session) in std::mem::take(&mut self.sessions) {
            if let Err(e) = session.close().await
                && result.is_ok()
            {
                result = Err(format!("{actor}: {e}"));
            }
        }
        result
    }

    pub(super) async fn session(&mut self, actor: &str) -> Result<&mut Session, String> {
        if !self.sessions.contains_key(actor) {
            let token = self
                .tokens
                .get(actor)
                .ok_or_else(|| format!("{actor} is not an agent of this scenario"))?;
            let s = Session::connect(&self.http, &self.target.url, token).await?;
            self.sessions.insert(actor.to_string(), s);
        }
        self.sessions
            .get_mut(actor)
            .ok_or_else(|| format!("no session for {actor}"))
    }

    pub(super) fn save(
        &mut self,
        saves: &BTreeMap<String, String>,
        v: &Value,
    ) -> Result<(), String> {
        for (name, ptr) in saves {
            let got = v
                .pointer(ptr)
                .ok_or_else(|| format!("save {name}: nothing at {ptr} in {v}"))?;
            self.vars.insert(name.clone(), got.clone());
        }
        Ok(())
    }
}
