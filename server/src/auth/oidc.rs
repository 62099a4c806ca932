//! The OpenID Connect relying party: discovery, the authorization request and the checks
//! on the ID token.
//!
//! Invariants:
//! * Discovery is lazy and retried on the next sign-in until it succeeds; the issuer in the
//!   discovery document must equal the configured one (openidconnect checks this). An ID
//!   token whose signature does not verify against the cached keys makes it discover once
//!   more (the provider rotated its keys) and check that same token again; nothing else is
//!   retried.
//! * Every authorization request carries PKCE (S256), a random `state` and a random `nonce`.
//! * An ID token is accepted only if its signature verifies against the provider's published
//!   keys with an asymmetric algorithm (never `none`, never a MAC keyed by the client secret),
//!   and its `iss`, `aud` (this client), `exp` (against the injected clock) and `nonce` (the
//!   one stored for this browser's sign-in) match. Anything else is refused with a reason.
//! * The provider's HTTP client follows no redirects.
//! * A person's `auth_time` is when the provider last authenticated them (the ID token's
//!   `auth_time`, which every request asks for with `max_age`), never when the callback ran:
//!   a sign-in the provider answers from its own session does not make a step-up sign-in
//!   fresh. A step-up sign-in ([`Oidc::begin`] with `fresh`) asks for `prompt=login`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::{AppRole, Clock, Person};
use openidconnect::core::{
    CoreAuthDisplay, CoreAuthPrompt, CoreAuthenticationFlow, CoreErrorResponseType,
    CoreGenderClaim, CoreJsonWebKey, CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm,
    CoreProviderMetadata, CoreRevocableToken, CoreRevocationErrorResponse,
    CoreTokenIntrospectionResponse, CoreTokenType,
};
use openidconnect::{
    AdditionalClaims, AuthorizationCode, ClaimsVerificationError, Client, ClientId, ClientSecret,
    CsrfToken, EmptyExtraTokenFields, EndpointMaybeSet, EndpointNotSet, EndpointSet, IdTokenFields,
    IssuerUrl, Nonce, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, Scope,
    StandardErrorResponse, StandardTokenResponse, TokenResponse as _,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::config::OidcConfig;

/// Claims beyond the standard ones (groups, tenant, …), kept as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExtraClaims {
    #[serde(flatten)]
    rest: BTreeMap<String, serde_json::Value>,
}

impl AdditionalClaims for ExtraClaims {}

type IdFields = IdTokenFields<
    ExtraClaims,
    EmptyExtraTokenFields,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;
type Tokens = StandardTokenResponse<IdFields, CoreTokenType>;
type OidcClient = Client<
    ExtraClaims,
    CoreAuthDisplay,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJsonWebKey,
    CoreAuthPrompt,
    StandardErrorResponse<CoreErrorResponseType>,
    Tokens,
    CoreTokenIntrospectionResponse,
    CoreRevocableToken,
    CoreRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// The only signature algorithms accepted on ID tokens.
const ALLOWED_ALGS: [CoreJwsSigningAlgorithm; 9] = [
    CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
    CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha384,
    CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha512,
    CoreJwsSigningAlgorithm::RsaSsaPssSha256,
    CoreJwsSigningAlgorithm::RsaSsaPssSha384,
    CoreJwsSigningAlgorithm::RsaSsaPssSha512,
    CoreJwsSigningAlgorithm::EcdsaP256Sha256,
    CoreJwsSigningAlgorithm::EcdsaP384Sha384,
    CoreJwsSigningAlgorithm::EdDsa,
];

/// What the browser's session remembers between the redirect to the provider and the
/// callback. Single use.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingLogin {
    /// The `state` sent.
    pub state: String,
    /// The `nonce` sent.
    pub nonce: String,
    /// The PKCE verifier.
    pub pkce_verifier: String,
    /// Where to go after sign-in (a local path).
    pub next: String,
}

/// Why a sign-in was refused. `Display` is shown to the person.
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    /// Discovery failed.
    #[error("the identity provider could not be reached or its discovery document is invalid: {0}")]
    Discovery(String),
    /// The provider sent an error to the callback.
    #[error("the identity provider refused the sign-in: {0}")]
    Provider(String),
    /// The callback came from a different issuer than configured (RFC 9207 `iss`).
    #[error("the sign-in response came from another issuer")]
    WrongResponseIssuer,
    /// The code exchange failed (unknown, replayed or expired code, PKCE mismatch).
    #[error(
        "the identity provider did not accept the authorization code (used before, expired, or not ours): {0}"
    )]
    Exchange(String),
    /// No ID token in the token response.
    #[error("the identity provider sent no ID token")]
    NoIdToken,
    /// The ID token failed verification: why, in a fixed phrase a visitor may read, and the
    /// detail for the log.
    #[error("the ID token was refused: {0} ({1})")]
    IdToken(&'static str, String),
}

impl SignInError {
    /// What the sign-in page may say: a fixed sentence per kind, never text from the
    /// provider or an error chain (those go to the log).
    pub fn public(&self) -> String {
        match self {
            Self::Discovery(_) => "The identity provider could not be reached".into(),
            Self::Provider(_) => "The identity provider did not sign you in".into(),
            Self::WrongResponseIssuer => "The sign-in response came from another issuer".into(),
            Self::Exchange(_) => {
                "The identity provider did not accept the authorization code (used before, \
                 expired, or not ours)"
                    .into()
            }
            Self::NoIdToken => "The identity provider sent no ID token".into(),
            Self::IdToken(why, _) => format!("The ID token was refused: {why}"),
        }
    }
}

/// The relying party for one configured issuer.
pub struct Oidc {
    config: OidcConfig,
    redirect: RedirectUrl,
    http: openidconnect::reqwest::Client,
    client: Mutex<Option<Arc<OidcClient>>>,
    clock: Arc<dyn Clock>,
    max_age: Duration,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field("issuer", &self.config.issuer)
            .field("client_id", &self.config.client_id)
            .finish_non_exhaustive()
    }
}

impl Oidc {
    /// A relying party for `config`, redirecting back to `redirect`; the provider is asked
    /// to authenticate again any person it authenticated longer than `max_age` ago.
    pub fn new(
        config: OidcConfig,
        redirect: &str,
        clock: Arc<dyn Clock>,
        max_age: Duration,
    ) -> Result<Self, SignInError> {
        let redirect = RedirectUrl::new(redirect.to_string())
            .map_err(|e| SignInError::Discovery(format!("redirect URI: {e}")))?;
        let http = openidconnect::reqwest::ClientBuilder::new()
            .redirect(openidconnect::reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| SignInError::Discovery(e.to_string()))?;
        Ok(Self {
            config,
            redirect,
            http,
            client: Mutex::new(None),
            clock,
            max_age,
        })
    }

    /// The configured issuer.
    pub fn issuer(&self) -> &str {
        &self.config.issuer
    }

    async fn client(&self) -> Result<Arc<OidcClient>, SignInError> {
        let mut cached = self.client.lock().await;
        if let Some(client) = cached.as_ref() {
            return Ok(client.clone());
        }
        self.discover(&mut cached).await
    }

    /// Discovers again (the provider's keys may have changed), replacing the cached client.
    async fn rediscover(&self) -> Result<Arc<OidcClient>, SignInError> {
        let mut cached = self.client.lock().await;
        self.discover(&mut cached).await
    }

    async fn discover(
        &self,
        cached: &mut Option<Arc<OidcClient>>,
    ) -> Result<Arc<OidcClient>, SignInError> {
        let issuer = IssuerUrl::new(self.config.issuer.clone())
            .map_err(|e| SignInError::Discovery(e.to_string()))?;
        let metadata = CoreProviderMetadata::discover_async(issuer, &self.http)
            .await
            .map_err(|e| SignInError::Discovery(error_chain(&e)))?;
        let client = OidcClient::from_provider_metadata(
            metadata,
            ClientId::new(self.config.client_id.clone()),
            Some(ClientSecret::new(
                self.config.client_secret.expose().clone(),
            )),
        )
        .set_redirect_uri(self.redirect.clone());
        let client = Arc::new(client);
        *cached = Some(client.clone());
        Ok(client)
    }

    /// Discovers now (at start-up); failures are logged and retried at the next sign-in.
    pub async fn warm_up(&self) {
        if let Err(e) = self.client().await {
            tracing::warn!(issuer = %self.config.issuer, error = %e, "OIDC discovery failed; will retry at the next sign-in");
        }
    }

    /// The provider URL to send the browser to, and what to remember until the callback.
    /// `fresh`: the person must authenticate now (a step-up), not through the provider's
    /// session.
    pub async fn begin(
        &self,
        next: String,
        fresh: bool,
    ) -> Result<(String, PendingLogin), SignInError> {
        let client = self.client().await?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client
            .authorize_url(
                CoreAuthenticationFlow::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .add_scope(Scope::new("openid".into()))
            .add_scope(Scope::new("profile".into()))
            .add_scope(Scope::new("email".into()))
            // Makes `auth_time` a required claim of the ID token.
            .set_max_age(self.max_age)
            .set_pkce_challenge(challenge);
        if fresh {
            request = request.add_prompt(CoreAuthPrompt::Login);
        }
        let (url, state, nonce) = request.url();
        Ok((
            url.to_string(),
            PendingLogin {
                state: state.secret().clone(),
                nonce: nonce.secret().clone(),
                pkce_verifier: verifier.secret().clone(),
                next,
            },
        ))
    }

    /// Checks the callback's `iss` parameter (when the provider sends one), exchanges the
    /// code and verifies the ID token. `state` has been checked by the caller.
    pub async fn finish(
        &self,
        pending: PendingLogin,
        code: String,
        response_iss: Option<&str>,
    ) -> Result<Person, SignInError> {
        if let Some(iss) = response_iss
            && iss != self.config.issuer
        {
            return Err(SignInError::WrongResponseIssuer);
        }
        let client = self.client().await?;
        let tokens = client
            .exchange_code(AuthorizationCode::new(code))
            .map_err(|e| SignInError::Exchange(e.to_string()))?
            .set_pkce_verifier(PkceCodeVerifier::new(pending.pkce_verifier))
            .request_async(&self.http)
            .await
            .map_err(|e| SignInError::Exchange(error_chain(&e)))?;
        let id_token = tokens.id_token().ok_or(SignInError::NoIdToken)?;
        let nonce = Nonce::new(pending.nonce);
        fn verifier<'c>(
            client: &'c OidcClient,
            clock: Arc<dyn Clock>,
        ) -> openidconnect::IdTokenVerifier<'c, CoreJsonWebKey> {
            client
                .id_token_verifier()
                .set_allowed_algs(ALLOWED_ALGS)
                .set_time_fn(move || clock.now())
        }
        let claims = match id_token.claims(&verifier(&client, self.clock.clone()), &nonce) {
            Ok(claims) => claims,
            // The provider may have rotated its signing keys since discovery: discover once
            // more and check the same token against the keys it publishes now.
            Err(ClaimsVerificationError::SignatureVerification(_)) => {
                let fresh = self.rediscover().await?;
                id_token
                    .claims(&verifier(&fresh, self.clock.clone()), &nonce)
                    .map_err(|e| refused_token(&e))?
            }
            Err(e) => return Err(refused_token(&e)),
        };

        let extra = &claims.additional_claims().rest;
        let name = claims
            .name()
            .and_then(|n| n.get(None))
            .map(|n| n.as_str().to_string())
            .or_else(|| claims.preferred_username().map(|u| u.as_str().to_string()))
            .unwrap_or_else(|| claims.subject().as_str().to_string());
        Ok(Person {
            iss: claims.issuer().as_str().to_string(),
            sub: claims.subject().as_str().to_string(),
            name,
            email: claims.email().map(|e| e.as_str().to_string()),
            roles: map_roles(extra.get(&self.config.role_claim), &self.config.role_map),
            tenant: extra
                .get(&self.config.tenant_claim)
                .and_then(serde_json::Value::as_str)
                .map(str::to_string),
            auth_time: authenticated_at(claims.auth_time(), self.clock.now_ms()),
            // Every request asks for `auth_time` (max_age); a provider that leaves it out
            // never makes a sign-in count as fresh for a step-up.
            auth_time_unknown: claims.auth_time().is_none(),
        })
    }
}

/// When the provider authenticated the person: the ID token's `auth_time`, never later than
/// `now` (a provider clock ahead of ours does not extend a sign-in); `now` for a provider
/// that leaves the claim out although `max_age` asks for it (the session's clock starts then;
/// such a sign-in is never fresh for a step-up, `Person::auth_time_unknown`).
pub fn authenticated_at(auth_time: Option<chrono::DateTime<chrono::Utc>>, now: i64) -> i64 {
    auth_time.map_or(now, |t| t.timestamp_millis().min(now))
}

/// The roles `groups` (a string or a list of strings) map to, sorted, no duplicates.
pub fn map_roles(groups: Option<&serde_json::Value>, map: &[(String, AppRole)]) -> Vec<AppRole> {
    let names: Vec<&str> = match groups {
        Some(serde_json::Value::String(s)) => vec![s.as_str()],
        Some(serde_json::Value::Array(items)) => {
            items.iter().filter_map(serde_json::Value::as_str).collect()
        }
        _ => Vec::new(),
    };
    let mut roles: Vec<AppRole> = map
        .iter()
        .filter(|(group, _)| names.contains(&group.as_str()))
        .map(|(_, role)| *role)
        .collect();
    roles.sort();
    roles.dedup();
    roles
}

/// The refusal of an ID token: a fixed phrase per kind, the library's words as detail.
fn refused_token(e: &ClaimsVerificationError) -> SignInError {
    let why = match e {
        ClaimsVerificationError::InvalidAudience(_) => {
            "it was issued for another audience (client)"
        }
        ClaimsVerificationError::InvalidIssuer(_) => "it was issued by another issuer",
        ClaimsVerificationError::Expired(_) => "it has expired",
        ClaimsVerificationError::InvalidNonce(_) => {
            "its nonce does not match this browser's sign-in"
        }
        ClaimsVerificationError::SignatureVerification(_) => "its signature is missing or invalid",
        ClaimsVerificationError::Unsupported(_) => "it is of an unsupported kind",
        _ => "its claims did not verify",
    };
    SignInError::IdToken(why, e.to_string())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
