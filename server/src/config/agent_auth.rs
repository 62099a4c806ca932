//! How agents authenticate on `/mcp`: Countersign's own `cs_agent_` tokens, OAuth access
//! tokens from trusted authorization servers, or both (`agent_token_kinds`,
//! `agent_oauth_issuers`, `agent_oauth_scope`).

use url::Url;

/// The scope an agent's access token must grant unless configured otherwise.
pub const DEFAULT_SCOPE: &str = "mcp:tools";

/// The token kinds `/mcp` accepts, and what an OAuth token must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentAuth {
    /// `cs_agent_` tokens minted by `countersign agent-token create` are accepted.
    pub countersign_tokens: bool,
    /// Issuers (exactly as their tokens' `iss`) whose access tokens are accepted; empty: none.
    pub oauth_issuers: Vec<String>,
    /// The scope an access token must grant.
    pub oauth_scope: String,
}

impl Default for AgentAuth {
    fn default() -> Self {
        Self {
            countersign_tokens: true,
            oauth_issuers: Vec::new(),
            oauth_scope: DEFAULT_SCOPE.into(),
        }
    }
}

impl AgentAuth {
    /// Whether OAuth access tokens are accepted.
    pub fn oauth(&self) -> bool {
        !self.oauth_issuers.is_empty()
    }
}

/// Reads the three keys' values; `Err((key, why))` names the key at fault.
pub(super) fn parse(
    issuers: Option<String>,
    kinds: Option<String>,
    scope: Option<String>,
) -> Result<AgentAuth, (&'static str, String)> {
    let oauth_issuers = issuers
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|issuer| check_issuer(issuer).map(|()| issuer.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let default_kinds = if oauth_issuers.is_empty() {
        "countersign"
    } else {
        "countersign,oauth"
    };
    let kinds = kinds.filter(|k| !k.trim().is_empty());
    let kinds = kinds.as_deref().unwrap_or(default_kinds);
    let (mut countersign_tokens, mut oauth) = (false, false);
    for kind in kinds.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        match kind {
            "countersign" => countersign_tokens = true,
            "oauth" => oauth = true,
            other => {
                return Err((
                    "agent_token_kinds",
                    format!("{other:?}: expected countersign, oauth or both, comma-separated"),
                ));
            }
        }
    }
    if oauth && oauth_issuers.is_empty() {
        return Err((
            "agent_token_kinds",
            "oauth needs agent_oauth_issuers (the authorization servers to trust)".into(),
        ));
    }
    if !countersign_tokens && !oauth {
        return Err(("agent_token_kinds", "accepts no kind of token".into()));
    }
    let oauth_scope = scope
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_SCOPE.into());
    // RFC 6749's scope-token: printable ASCII but space, `"` and `\\`.
    let scope_token = |c: char| c.is_ascii_graphic() && c != '"' && c != '\\';
    if !oauth_scope.chars().all(scope_token) {
        return Err((
            "agent_oauth_scope",
            "one scope: printable ASCII without spaces, quotes or backslashes".into(),
        ));
    }
    Ok(AgentAuth {
        countersign_tokens,
        oauth_issuers: if oauth { oauth_issuers } else { Vec::new() },
        oauth_scope,
    })
}

/// An issuer is an `https` URL (or `http` on a loopback host) without query or fragment.
fn check_issuer(issuer: &str) -> Result<(), (&'static str, String)> {
    let bad = |why: &str| Err(("agent_oauth_issuers", format!("{issuer:?}: {why}")));
    let Ok(url) = Url::parse(issuer) else {
        return bad("not a URL");
    };
    if url.host().is_none() {
        return bad("no host");
    }
    if url.query().is_some() || url.fragment().is_some() {
        return bad("an issuer has no query or fragment");
    }
    if !super::secure_or_loopback(&url) {
        return bad("expected https:// (http:// only on a loopback host)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    #[test]
    fn oauth_is_off_until_issuers_are_named_and_then_on_beside_tokens() {
        assert_eq!(parse(None, None, None), Ok(AgentAuth::default()));
        let both = parse(some("https://as.example, http://127.0.0.1:9"), None, None).unwrap();
        assert!(both.countersign_tokens && both.oauth());
        assert_eq!(
            both.oauth_issuers,
            ["https://as.example", "http://127.0.0.1:9"]
        );
        let only = parse(some("https://as.example"), some("oauth"), some("agents")).unwrap();
        assert!(!only.countersign_tokens && only.oauth());
        assert_eq!(only.oauth_scope, "agents");
        let tokens_only = parse(some("https://as.example"), some("countersign"), None).unwrap();
        assert!(!tokens_only.oauth());
    }

    #[test]
    fn bad_settings_are_refused_naming_their_key() {
        for (issuers, kinds, scope, key) in [
            (some("http://as.example"), None, None, "agent_oauth_issuers"),
            (some("not a url"), None, None, "agent_oauth_issuers"),
            (
                some("https://as.example?x=1"),
                None,
                None,
                "agent_oauth_issuers",
            ),
            (None, some("oauth"), None, "agent_token_kinds"),
            (None, some("passwords"), None, "agent_token_kinds"),
            (
                some("https://as.example"),
                some(" , "),
                None,
                "agent_token_kinds",
            ),
            (
                some("https://as.example"),
                None,
                some("a b"),
                "agent_oauth_scope",
            ),
        ] {
            let err = parse(issuers.clone(), kinds.clone(), scope).unwrap_err();
            assert_eq!(err.0, key, "{issuers:?} {kinds:?}: {err:?}");
        }
    }
}
