//! An agent's OAuth access token (a JWT, RFC 9068) checked against the authorization servers
//! the operator trusts (`agent_oauth_issuers`).
//!
//! Invariants:
//! * Only asymmetric signatures are accepted ([`ALGORITHMS`]), each only with a key of its own
//!   family: `alg: none`, HMAC (whatever its key, the issuer's public key included) and a key
//!   of another type than the `alg` names are refused before any signature is computed.
//! * The issuer must be one of the configured ones, compared exactly; its keys come only from
//!   its own metadata (RFC 8414, else OpenID discovery), whose `issuer` must equal it. The
//!   unverified payload is read for one thing only: which configured issuer's keys to try.
//! * The token must be typed `at+jwt`, name this resource in `aud`, carry `exp` (and honour
//!   `nbf`), both against the server's clock with [`LEEWAY_MS`], grant the required scope and
//!   name its client in `client_id` (RFC 9068; never `sub`, which may name a person).
//! * A `kid` the cached key set lacks refetches the issuer's keys at most once per
//!   [`REFRESH_EVERY`] per issuer; a kid still unknown is refused. A key set is trusted for
//!   [`KEYS_MAX_AGE`] at most (a key the issuer withdrew stops working by then); one that
//!   cannot be fetched refuses every token of that issuer needing it (fail closed). Keys come
//!   from an `https` URL (or `http` on loopback), a bounded body, within [`FETCH_TIMEOUT`];
//!   one fetch per issuer at a time, and tokens whose key is cached never wait for it.
//! * Only keys meant for signatures (`use` absent or `sig`) are used.

use std::time::{Duration, Instant};

use base64::Engine as _;
use countersign_core::Clock;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use std::sync::Arc;

/// The signature algorithms accepted (asymmetric only).
pub const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::RS256,
    Algorithm::PS256,
    Algorithm::ES256,
    Algorithm::EdDSA,
];

/// How far `exp` and `nbf` may be off the server's clock.
pub const LEEWAY_MS: i64 = 30_000;

/// The least time between two fetches of one issuer's keys for an unknown `kid`.
pub const REFRESH_EVERY: Duration = Duration::from_secs(5);

/// How long one fetch of an issuer's metadata and keys may take, in all.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a fetched key set is trusted before it is fetched again.
pub const KEYS_MAX_AGE: Duration = Duration::from_secs(600);

/// The largest metadata or key set document read.
const MAX_DOCUMENT_BYTES: usize = 256 * 1024;

/// Why a token was refused (each is logged and audited; the caller only learns 401 or 403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// Not a JWT, or its header or claims do not parse.
    #[error("malformed token")]
    Malformed,
    /// Not typed `at+jwt`.
    #[error("not an access token (typ)")]
    Type,
    /// `none`, HMAC, or an algorithm not accepted, or one its key cannot have.
    #[error("algorithm not accepted")]
    Algorithm,
    /// An issuer that is not configured.
    #[error("issuer not trusted")]
    Issuer,
    /// A `kid` the issuer does not publish (after refetching its keys).
    #[error("unknown signing key")]
    UnknownKey,
    /// The signature does not verify.
    #[error("bad signature")]
    Signature,
    /// Issued for another resource.
    #[error("audience is not this resource")]
    Audience,
    /// Past `exp`.
    #[error("expired")]
    Expired,
    /// Before `nbf`.
    #[error("not yet valid")]
    NotYetValid,
    /// The required scope is not granted.
    #[error("scope {0} not granted")]
    Scope(String),
    /// The issuer's keys could not be fetched.
    #[error("keys unavailable: {0}")]
    KeysUnavailable(String),
}

impl Rejection {
    /// A short code for logs and audit records.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Type => "type",
            Self::Algorithm => "algorithm",
            Self::Issuer => "issuer",
            Self::UnknownKey => "unknown_key",
            Self::Signature => "signature",
            Self::Audience => "audience",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::Scope(_) => "scope",
            Self::KeysUnavailable(_) => "keys_unavailable",
        }
    }
}

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The issuer (as configured).
    pub issuer: String,
    /// The client the token was issued to (`client_id`).
    pub client: String,
    /// Unix ms.
    pub expires_at: i64,
}

/// The claims read from a token whose signature verified.
#[derive(Debug, Deserialize)]
struct Claims {
    exp: i64,
    nbf: Option<i64>,
    client_id: Option<String>,
    scope: Option<String>,
}

/// One trusted issuer and its cached keys.
struct Issuer {
    url: String,
    /// The keys as last fetched (read under a short lock; never held across a fetch).
    keys: std::sync::Mutex<Cached>,
    /// Held by the one fetch under way.
    fetching: tokio::sync::Mutex<()>,
}

#[derive(Default, Clone)]
struct Cached {
    set: Option<JwkSet>,
    /// When the set was fetched (or a fetch last failed).
    fetched: Option<Instant>,
}

impl Cached {
    /// Whether the set may still be trusted.
    fn fresh(&self) -> bool {
        self.fetched.is_some_and(|at| at.elapsed() < KEYS_MAX_AGE)
    }
}

impl Issuer {
    fn lock(&self) -> std::sync::MutexGuard<'_, Cached> {
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Signing key `kid` from the cached set, while that is younger than `KEYS_MAX_AGE`
    /// (read under the lock: nothing is cloned but the key).
    fn fresh_key(&self, kid: &str) -> Option<Jwk> {
        let cached = self.lock();
        if !cached.fresh() {
            return None;
        }
        cached.set.as_ref().and_then(|s| signing_key(s, kid))
    }

    fn cached(&self) -> Cached {
        self.lock().clone()
    }

    fn store(&self, cached: Cached) {
        *self.lock() = cached;
    }
}

/// The signing key `kid` of `set`, if it has one.
fn signing_key(set: &JwkSet, kid: &str) -> Option<Jwk> {
    use jsonwebtoken::jwk::PublicKeyUse;
    set.keys
        .iter()
        .find(|k| {
            k.common.key_id.as_deref() == Some(kid)
                && matches!(
                    k.common.public_key_use,
                    None | Some(PublicKeyUse::Signature)
                )
        })
        .cloned()
}

/// Checks agents' access tokens for one resource.
pub struct Verifier {
    resource: String,
    scope: String,
    issuers: Vec<Issuer>,
    http: reqwest::Client,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("resource", &self.resource)
            .field(
                "issuers",
                &self.issuers.iter().map(|i| &i.url).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Verifier {
    /// A verifier of tokens for `resource` granting `scope`, issued by one of `issuers`.
    pub fn new(
        resource: &str,
        scope: &str,
        issuers: &[String],
        clock: Arc<dyn Clock>,
    ) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            resource: resource.to_string(),
            scope: scope.to_string(),
            issuers: issuers
                .iter()
                .map(|url| Issuer {
                    url: url.clone(),
                    keys: std::sync::Mutex::default(),
                    fetching: tokio::sync::Mutex::default(),
                })
                .collect(),
            http,
            clock,
        })
    }

    /// The scope tokens must grant.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Checks `token`; what it proves, or why it is refused.
    pub async fn verify(&self, token: &str) -> Result<Verified, Rejection> {
        let (header, claimed_issuer) = peek(token)?;
        let alg = accepted_algorithm(&header)?;
        let issuer = self
            .issuers
            .iter()
            .find(|i| i.url == claimed_issuer)
            .ok_or(Rejection::Issuer)?;
        let kid = header.kid.as_deref().ok_or(Rejection::UnknownKey)?;
        let jwk = self.key(issuer, kid).await?;
        let key = decoding_key(&jwk, alg)?;
        let mut validation = Validation::new(alg);
        validation.algorithms = vec![alg];
        validation.set_issuer(&[issuer.url.as_str()]);
        validation.set_audience(&[self.resource.as_str()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        // Time is checked below against the server's clock, not the system's.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.leeway = 0;
        let claims = jsonwebtoken::decode::<Claims>(token, &key, &validation)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::InvalidSignature => Rejection::Signature,
                jsonwebtoken::errors::ErrorKind::InvalidAudience => Rejection::Audience,
                jsonwebtoken::errors::ErrorKind::InvalidIssuer => Rejection::Issuer,
                jsonwebtoken::errors::ErrorKind::InvalidAlgorithm
                | jsonwebtoken::errors::ErrorKind::InvalidKeyFormat => Rejection::Algorithm,
                _ => Rejection::Malformed,
            })?
            .claims;
        let now = self.clock.now_ms();
        let expires_at = claims.exp.saturating_mul(1000);
        if expires_at.saturating_add(LEEWAY_MS) <= now {
            return Err(Rejection::Expired);
        }
        if claims
            .nbf
            .is_some_and(|nbf| nbf.saturating_mul(1000).saturating_sub(LEEWAY_MS) > now)
        {
            return Err(Rejection::NotYetValid);
        }
        let granted = claims
            .scope
            .as_deref()
            .is_some_and(|s| s.split(' ').any(|g| g == self.scope));
        if !granted {
            return Err(Rejection::Scope(self.scope.clone()));
        }
        let client = claims
            .client_id
            .filter(|c| !c.is_empty())
            .ok_or(Rejection::Malformed)?;
        Ok(Verified {
            issuer: issuer.url.clone(),
            client,
            expires_at,
        })
    }

    /// The key `kid` of `issuer`: from the cached set while it is younger than
    /// `KEYS_MAX_AGE`, else (or for a kid it lacks, at most once per `REFRESH_EVERY`) from a
    /// fresh fetch that replaces it.
    async fn key(&self, issuer: &Issuer, kid: &str) -> Result<Jwk, Rejection> {
        if let Some(jwk) = issuer.fresh_key(kid) {
            return Ok(jwk);
        }
        // One fetch at a time; whoever waited finds its result.
        let _fetching = issuer.fetching.lock().await;
        if let Some(jwk) = issuer.fresh_key(kid) {
            return Ok(jwk);
        }
        let cached = issuer.cached();
        let may_fetch = !cached.fresh()
            || cached
                .fetched
                .is_none_or(|at| at.elapsed() >= REFRESH_EVERY);
        if !may_fetch {
            return Err(Rejection::UnknownKey);
        }
        let fetched = tokio::time::timeout(FETCH_TIMEOUT, fetch_keys(&self.http, &issuer.url))
            .await
            .unwrap_or_else(|_| Err("timed out".into()));
        match fetched {
            Ok(set) => {
                let found = signing_key(&set, kid);
                issuer.store(Cached {
                    set: Some(set),
                    fetched: Some(Instant::now()),
                });
                found.ok_or(Rejection::UnknownKey)
            }
            Err(e) => {
                // Nothing stale is trusted past its age; the next try waits REFRESH_EVERY.
                let still_fresh = cached.fresh();
                let set = cached.set.filter(|_| still_fresh);
                issuer.store(Cached {
                    fetched: set.as_ref().and(cached.fetched).or(Some(Instant::now())),
                    set,
                });
                Err(Rejection::KeysUnavailable(e))
            }
        }
    }
}

/// The parts of a JWT header checked before anything else.
#[derive(Debug, Deserialize)]
struct Header {
    alg: String,
    typ: Option<String>,
    kid: Option<String>,
}

/// The issuer `token` claims (unverified: for the audit record of a refusal only).
pub fn claimed_issuer(token: &str) -> Option<String> {
    peek(token).ok().map(|(_, iss)| iss)
}

/// The token's header and the issuer its payload names (not yet trusted).
fn peek(token: &str) -> Result<(Header, String), Rejection> {
    #[derive(Deserialize)]
    struct Iss {
        iss: String,
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Rejection::Malformed);
    };
    let decode = |s: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| Rejection::Malformed)
    };
    let header: Header = serde_json::from_slice(&decode(h)?).map_err(|_| Rejection::Malformed)?;
    let Iss { iss } = serde_json::from_slice(&decode(p)?).map_err(|_| Rejection::Malformed)?;
    Ok((header, iss))
}

/// The header's algorithm, if accepted, for a token typed as an access token.
fn accepted_algorithm(header: &Header) -> Result<Algorithm, Rejection> {
    let alg = header
        .alg
        .parse::<Algorithm>()
        .ok()
        .filter(|a| ALGORITHMS.contains(a))
        .ok_or(Rejection::Algorithm)?;
    let typ = header.typ.as_deref().map(str::to_ascii_lowercase);
    if !matches!(typ.as_deref(), Some("at+jwt" | "application/at+jwt")) {
        return Err(Rejection::Type);
    }
    Ok(alg)
}

/// `jwk` as a key for `alg`, only when the key is of `alg`'s own family.
fn decoding_key(jwk: &Jwk, alg: Algorithm) -> Result<DecodingKey, Rejection> {
    let fits = matches!(
        (&jwk.algorithm, alg),
        (
            AlgorithmParameters::RSA(_),
            Algorithm::RS256 | Algorithm::PS256
        ) | (AlgorithmParameters::EllipticCurve(_), Algorithm::ES256)
            | (AlgorithmParameters::OctetKeyPair(_), Algorithm::EdDSA)
    );
    if !fits {
        return Err(Rejection::Algorithm);
    }
    DecodingKey::from_jwk(jwk).map_err(|_| Rejection::Algorithm)
}

/// The key set of `issuer`, found through its metadata.
async fn fetch_keys(http: &reqwest::Client, issuer: &str) -> Result<JwkSet, String> {
    #[derive(Deserialize)]
    struct Metadata {
        issuer: String,
        jwks_uri: String,
    }
    let mut last = String::from("no metadata");
    for url in metadata_urls(issuer) {
        match get_json::<Metadata>(http, &url).await {
            Ok(meta) if meta.issuer == issuer => {
                if !secure_url(&meta.jwks_uri) {
                    return Err(format!(
                        "jwks_uri {:?} is neither https nor on loopback",
                        meta.jwks_uri
                    ));
                }
                return get_json::<JwkSet>(http, &meta.jwks_uri).await;
            }
            Ok(meta) => {
                return Err(format!(
                    "{url} names issuer {:?}, not {issuer:?}",
                    meta.issuer
                ));
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// `url`'s JSON body, read up to `MAX_DOCUMENT_BYTES`.
async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
) -> Result<T, String> {
    let mut resp = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("{url}: {}", resp.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| format!("{url}: {e}"))? {
        if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
            return Err(format!("{url}: larger than {MAX_DOCUMENT_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|e| format!("{url}: {e}"))
}

/// An `https` URL, or an `http` one on a loopback host.
fn secure_url(text: &str) -> bool {
    url::Url::parse(text).is_ok_and(|u| crate::config::secure_or_loopback(&u))
}

/// Where `issuer`'s metadata may be: RFC 8414's well-known URL (the issuer's path after it),
/// then OpenID discovery's (after the issuer's path).
fn metadata_urls(issuer: &str) -> Vec<String> {
    let trimmed = issuer.trim_end_matches('/');
    let (origin, path) = match trimmed.find("://").map(|i| i + 3) {
        Some(start) => match trimmed[start..].find('/') {
            Some(slash) => trimmed.split_at(start + slash),
            None => (trimmed, ""),
        },
        None => (trimmed, ""),
    };
    vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!("{trimmed}/.well-known/openid-configuration"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_looked_for_where_rfc_8414_and_openid_say() {
        assert_eq!(
            metadata_urls("https://as.example"),
            [
                "https://as.example/.well-known/oauth-authorization-server",
                "https://as.example/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            metadata_urls("https://as.example/tenant1"),
            [
                "https://as.example/.well-known/oauth-authorization-server/tenant1",
                "https://as.example/tenant1/.well-known/openid-configuration"
            ]
        );
    }

    #[test]
    fn a_key_serves_only_its_own_algorithm_family_and_only_signatures() {
        let rsa: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "r", "n": "sXch", "e": "AQAB"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": "sXch", "e": "AQAB"},
            {"kty": "oct", "kid": "h", "k": "c2VjcmV0"}
        ]}))
        .unwrap();
        let r = signing_key(&rsa, "r").unwrap();
        assert!(decoding_key(&r, Algorithm::RS256).is_ok());
        for alg in [Algorithm::ES256, Algorithm::EdDSA, Algorithm::HS256] {
            assert_eq!(
                decoding_key(&r, alg).err(),
                Some(Rejection::Algorithm),
                "{alg:?}"
            );
        }
        assert!(
            signing_key(&rsa, "enc").is_none(),
            "an encryption key never verifies"
        );
        let h = signing_key(&rsa, "h").unwrap();
        for alg in ALGORITHMS {
            assert_eq!(
                decoding_key(&h, alg).err(),
                Some(Rejection::Algorithm),
                "{alg:?}"
            );
        }
    }

    #[test]
    fn keys_come_only_from_https_or_loopback() {
        assert!(secure_url("https://as.example/jwks"));
        assert!(secure_url("http://127.0.0.1:8080/jwks"));
        assert!(secure_url("http://localhost/jwks"));
        assert!(!secure_url("http://as.example/jwks"));
        assert!(!secure_url("file:///etc/keys"));
    }

    #[test]
    fn only_asymmetric_access_tokens_pass_the_header_check() {
        let header = |alg: &str, typ: Option<&str>| Header {
            alg: alg.into(),
            typ: typ.map(str::to_string),
            kid: None,
        };
        for alg in ["none", "HS256", "HS512", "RS384", ""] {
            assert_eq!(
                accepted_algorithm(&header(alg, Some("at+jwt"))),
                Err(Rejection::Algorithm),
                "{alg}"
            );
        }
        assert_eq!(
            accepted_algorithm(&header("RS256", Some("JWT"))),
            Err(Rejection::Type)
        );
        assert_eq!(
            accepted_algorithm(&header("RS256", None)),
            Err(Rejection::Type)
        );
        assert_eq!(
            accepted_algorithm(&header("ES256", Some("application/at+jwt"))),
            Ok(Algorithm::ES256)
        );
    }
}
