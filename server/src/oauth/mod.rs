//! `/mcp` as an OAuth 2.1 resource server (the MCP authorization specification): agents may
//! present access tokens from the authorization servers the operator trusts
//! (`agent_oauth_issuers`) instead of Countersign's own `cs_agent_` tokens.
//!
//! Owns the Protected Resource Metadata (RFC 9728) at
//! `/.well-known/oauth-protected-resource` and its `/mcp`-suffixed form, the
//! `WWW-Authenticate` challenges that point at it, the token check ([`token`]) and the audit
//! record of every refused token.
//!
//! Invariants:
//! * With no issuer configured none of this exists: the metadata answers 404 and the
//!   challenge is the plain one.
//! * A token maps to an agent only through a registration an admin made (`agent-token
//!   create --oauth-issuer … --oauth-client …`): everything downstream — role listing,
//!   policy, duties, the audit actor — is that credential's, exactly as for a `cs_agent_`
//!   token. An unregistered client, a revoked registration, and every token refused by
//!   [`token::Verifier`] are answered 401 (403 `insufficient_scope` for a missing scope) and
//!   audited ([`REFUSED_RULE`]), at most once per [`AUDIT_EVERY`] per (reason, client).
//! * The token itself is never recorded, logged or passed on.

pub mod token;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use countersign_core::Store;
use countersign_core::audit::{AuditEvent, NewAuditRecord};
use serde_json::json;

use crate::config::Config;

/// The audit rule of a refused agent access token.
pub const REFUSED_RULE: &str = "agent.oauth_refused";

/// The least time between two audit records of the same refusal (reason and client): a
/// flood of bad tokens writes one record a minute per kind, not one per request.
pub const AUDIT_EVERY: Duration = Duration::from_secs(60);

/// Where Protected Resource Metadata is served: here, and here followed by the resource's
/// path (RFC 9728 §3.1).
pub const METADATA_ROOT: &str = "/.well-known/oauth-protected-resource";

/// What the resource server needs at run time.
pub struct ResourceServer {
    /// Checks tokens.
    pub verifier: token::Verifier,
    /// The metadata URL the challenges name.
    pub metadata_url: String,
    /// (reason, issuer#client) → when last recorded, and how many since went unrecorded.
    audited: Mutex<HashMap<(String, String), (Instant, u64)>>,
}

impl std::fmt::Debug for ResourceServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceServer")
            .field("verifier", &self.verifier)
            .finish()
    }
}

/// The URL of the resource served at `path` (the audience its tokens must name).
pub fn resource_url(config: &Config, path: &str) -> String {
    format!("{}{path}", config.public_url.as_str().trim_end_matches('/'))
}

impl ResourceServer {
    /// The resource server `config` describes for the resource at `path`, if OAuth is on.
    pub fn from_config(
        config: &Config,
        store: &Store,
        path: &str,
    ) -> Result<Option<Arc<Self>>, String> {
        let auth = &config.agent_auth;
        if !auth.oauth() {
            return Ok(None);
        }
        let verifier = token::Verifier::new(
            &resource_url(config, path),
            &auth.oauth_scope,
            &auth.oauth_issuers,
            store.clock().clone(),
        )?;
        Ok(Some(Arc::new(Self {
            verifier,
            metadata_url: resource_url(config, &format!("{METADATA_ROOT}{path}")),
            audited: Mutex::default(),
        })))
    }

    /// The challenge of a 401: where the metadata is, and the scope to ask for.
    pub fn challenge(&self) -> String {
        format!(
            r#"Bearer realm="countersign", resource_metadata="{}", scope="{}""#,
            self.metadata_url,
            self.verifier.scope()
        )
    }

    /// The challenge of a 403 for a token without the required scope.
    pub fn insufficient_scope(&self) -> String {
        format!(
            r#"Bearer realm="countersign", error="insufficient_scope", scope="{}", resource_metadata="{}""#,
            self.verifier.scope(),
            self.metadata_url
        )
    }

    /// Records that a token was refused for `reason` (the issuer it claims and the client
    /// it names, if known, in `tenant` when known). The same refusal (reason, issuer,
    /// client) is recorded at most once per [`AUDIT_EVERY`]; the next record says how many
    /// were not (`suppressed_before`).
    pub async fn audit_refusal(
        &self,
        store: &Store,
        reason: &str,
        issuer: Option<&str>,
        client: Option<&str>,
        tenant: Option<&str>,
    ) {
        let key = (
            reason.to_string(),
            format!(
                "{}#{}",
                issuer.unwrap_or_default(),
                client.unwrap_or_default()
            ),
        );
        let suppressed = {
            let mut audited = match self.audited.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            match audited.get_mut(&key) {
                Some((at, n)) if at.elapsed() < AUDIT_EVERY => {
                    *n += 1;
                    return;
                }
                Some((_, n)) => *n,
                None => 0,
            }
        };
        let mut detail = serde_json::Map::new();
        detail.insert("kind".into(), json!("agent_token_refused"));
        detail.insert("reason".into(), json!(reason));
        detail.insert("issuer".into(), json!(issuer));
        detail.insert("client".into(), json!(client));
        detail.insert("suppressed_before".into(), json!(suppressed));
        let record = NewAuditRecord {
            event: Some(AuditEvent::Operational),
            run_id: None,
            step_id: None,
            tool: None,
            actor: client.map(|c| format!("oauth-client:{c}")),
            rule: Some(REFUSED_RULE.into()),
            detail,
            tenant: tenant.map(str::to_string),
        };
        match store.append_audit(&record).await {
            Ok(_) => {
                let mut audited = match self.audited.lock() {
                    Ok(g) => g,
                    Err(poisoned) => poisoned.into_inner(),
                };
                if audited.len() > 10_000 {
                    audited.clear();
                }
                audited.insert(key, (Instant::now(), 0));
            }
            Err(e) => tracing::warn!(error = %e, "mcp: auditing a refused access token failed"),
        }
    }
}

/// The Protected Resource Metadata document (RFC 9728) of the resource at `path`; 404 when
/// OAuth is off.
pub fn metadata(config: &Config, path: &str) -> Response {
    let auth = &config.agent_auth;
    if !auth.oauth() {
        return StatusCode::NOT_FOUND.into_response();
    }
    Json(json!({
        "resource": resource_url(config, path),
        "authorization_servers": auth.oauth_issuers,
        "scopes_supported": [auth.oauth_scope],
        "bearer_methods_supported": ["header"],
        "resource_name": "Countersign",
    }))
    .into_response()
}

/// Why an access token admitted no agent.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// 401 with [`ResourceServer::challenge`].
    Unauthorized,
    /// 403 with [`ResourceServer::insufficient_scope`].
    InsufficientScope,
    /// The database failed.
    Internal,
}

impl ResourceServer {
    /// The agent credential registered for the client `token` was issued to, if the token
    /// passes every check and the registration is live; every refusal is logged and audited.
    pub async fn admit(
        &self,
        store: &Store,
        token: &str,
    ) -> Result<countersign_core::store::AgentCredential, Refused> {
        use countersign_core::store::AuthError;
        let verified = match self.verifier.verify(token).await {
            Ok(verified) => verified,
            Err(rejection) => {
                tracing::info!(reason = %rejection, "mcp: agent access token refused");
                let claimed = token::claimed_issuer(token);
                self.audit_refusal(store, rejection.code(), claimed.as_deref(), None, None)
                    .await;
                return Err(match rejection {
                    token::Rejection::Scope(_) => Refused::InsufficientScope,
                    _ => Refused::Unauthorized,
                });
            }
        };
        let (issuer, client) = (verified.issuer.as_str(), verified.client.as_str());
        match store.authenticate_oauth(issuer, client).await {
            Ok(Ok(credential)) => Ok(credential),
            Ok(Err(reason)) => {
                let (code, tenant) = match &reason {
                    AuthError::Unknown => ("unregistered_client", None),
                    AuthError::Revoked(id) | AuthError::Expired(id) => (
                        if matches!(reason, AuthError::Revoked(_)) {
                            "registration_revoked"
                        } else {
                            "registration_expired"
                        },
                        store.get_agent(id).await.ok().map(|c| c.tenant),
                    ),
                };
                tracing::info!(%reason, client, "mcp: access token of a client not admitted");
                self.audit_refusal(store, code, Some(issuer), Some(client), tenant.as_deref())
                    .await;
                Err(Refused::Unauthorized)
            }
            Err(e) => {
                tracing::error!(error = %e, "mcp: reading an OAuth registration failed");
                Err(Refused::Internal)
            }
        }
    }
}
