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
//! * `azp`, when an ID token carries it, must name this client (OpenID Connect Core §3.1.3.7
//!   step 5; openidconnect 4 leaves this step out, [`Oidc::verified`] does it).
//! * A re-check ([`Oidc::recheck`]) derives roles and tenant again from the provider: from an
//!   ID token a refresh grant returns (verified as at sign-in, except that the nonce of the
//!   original sign-in is not asked for), else from the userinfo endpoint (whose `sub` must
//!   be the person's). Anything the provider refuses or cannot answer is an error, and the
//!   caller ends the session.
//! * A back-channel logout token ([`Oidc::logout_token`]) is accepted only if it verifies
//!   like an ID token (keys, algorithms, `iss`, `aud`, `exp`; `typ`, when present,
//!   `logout+jwt` or `JWT`), carries the back-channel logout event, names the person (`sub`,
//!   which this reader requires; `sid` narrows it to one provider session), has no `nonce`
//!   (which tells it apart from an ID token), and was not issued in the future. A token signed
//!   by a key the provider had not published makes it fetch the keys again at most once a
//!   minute (the endpoint is unauthenticated: a forged token must not make it call out each
//!   time); a bad signature by a known key is refused outright.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::{AppRole, Clock, Person};
use openidconnect::core::{
    CoreAuthDisplay, CoreAuthPrompt, CoreAuthenticationFlow, CoreErrorResponseType,
    CoreGenderClaim, CoreJsonWebKey, CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm,
    CoreRevocableToken, CoreRevocationErrorResponse, CoreTokenIntrospectionResponse, CoreTokenType,
};
use openidconnect::{
    AccessToken, AdditionalClaims, AuthorizationCode, ClaimsVerificationError, Client, ClientId,
    ClientSecret, CsrfToken, EmptyExtraTokenFields, EndSessionUrl, EndpointMaybeSet,
    EndpointNotSet, EndpointSet, IdToken, IdTokenClaims, IdTokenFields, IssuerUrl,
    JsonWebTokenType, LogoutRequest, Nonce, OAuth2TokenResponse as _, PkceCodeChallenge,
    PkceCodeVerifier, PostLogoutRedirectUrl, ProviderMetadataWithLogout, RedirectUrl, RefreshToken,
    Scope, StandardErrorResponse, StandardTokenResponse, SubjectIdentifier, TokenResponse as _,
    UserInfoClaims,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::pending::PendingLogin;
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

type ParsedIdToken = IdToken<
    ExtraClaims,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;
type Claims = IdTokenClaims<ExtraClaims, CoreGenderClaim>;

/// How far in the future (by this server's clock) a logout token's `iat` may lie.
const LOGOUT_IAT_SKEW_MS: i64 = 5 * 60 * 1000;
/// How often a logout token with an unknown signing key may make it fetch the keys again.
const LOGOUT_REFETCH_EVERY: Duration = Duration::from_secs(60);

/// The event a back-channel logout token must carry (OpenID Connect Back-Channel Logout 1.0
/// §2.4).
const BACKCHANNEL_EVENT: &str = "http://schemas.openid.net/event/backchannel-logout";

/// What the session keeps of the provider's answer at sign-in: enough to re-check the
/// person later and to end the provider's session at sign-out. Secret: never logged.
#[derive(Clone, Serialize, Deserialize)]
pub struct IdpSession {
    /// The access token (for the userinfo endpoint).
    pub access_token: String,
    /// The refresh token, when the provider issued one.
    pub refresh_token: Option<String>,
    /// The ID token as received (the `id_token_hint` of an RP-initiated logout).
    pub id_token: String,
    /// The provider's session id (`sid`), when the ID token carries one.
    pub sid: Option<String>,
    /// When the person's roles and tenant were last derived from the provider (ms).
    pub checked_at: i64,
    /// When this session was signed in (ms, the server's clock).
    pub signed_in_at: i64,
}

impl std::fmt::Debug for IdpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdpSession")
            .field("sid", &self.sid)
            .field("checked_at", &self.checked_at)
            .finish_non_exhaustive()
    }
}

/// Whom a verified back-channel logout token signs out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogoutSubject {
    /// The issuer.
    pub iss: String,
    /// The person, when named.
    pub sub: Option<String>,
    /// The provider session, when named.
    pub sid: Option<String>,
    /// When the provider issued the token (ms).
    pub issued_at: i64,
}

/// The provider as discovered: the client and what RP-initiated logout needs.
struct Discovered {
    client: OidcClient,
    end_session: Option<EndSessionUrl>,
    /// The ids of the signing keys the provider published.
    kids: std::collections::BTreeSet<String>,
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
    /// A re-check of the person with the provider failed.
    #[error("the identity provider did not confirm the person: {0}")]
    Recheck(String),
    /// A back-channel logout token was refused.
    #[error("the logout token was refused: {0}")]
    LogoutToken(String),
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
            Self::Recheck(_) => "The identity provider did not confirm who you are".into(),
            Self::LogoutToken(_) => "The logout token was refused".into(),
        }
    }
}

/// The relying party for one configured issuer.
pub struct Oidc {
    config: OidcConfig,
    redirect: RedirectUrl,
    http: openidconnect::reqwest::Client,
    discovered: Mutex<Option<Arc<Discovered>>>,
    /// When a logout token last made it fetch the provider's keys again.
    logout_rediscovered: Mutex<Option<std::time::Instant>>,
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
            discovered: Mutex::new(None),
            logout_rediscovered: Mutex::new(None),
            clock,
            max_age,
        })
    }

    /// The configured issuer.
    pub fn issuer(&self) -> &str {
        &self.config.issuer
    }

    async fn provider(&self) -> Result<Arc<Discovered>, SignInError> {
        let mut cached = self.discovered.lock().await;
        if let Some(found) = cached.as_ref() {
            return Ok(found.clone());
        }
        self.discover(&mut cached).await
    }

    /// Discovers again (the provider's keys may have changed), replacing the cached client.
    async fn rediscover(&self) -> Result<Arc<Discovered>, SignInError> {
        let mut cached = self.discovered.lock().await;
        self.discover(&mut cached).await
    }

    async fn discover(
        &self,
        cached: &mut Option<Arc<Discovered>>,
    ) -> Result<Arc<Discovered>, SignInError> {
        let issuer = IssuerUrl::new(self.config.issuer.clone())
            .map_err(|e| SignInError::Discovery(e.to_string()))?;
        let metadata = ProviderMetadataWithLogout::discover_async(issuer, &self.http)
            .await
            .map_err(|e| SignInError::Discovery(error_chain(&e)))?;
        let end_session = metadata.additional_metadata().end_session_endpoint.clone();
        let kids = metadata
            .jwks()
            .keys()
            .iter()
            .filter_map(|k| openidconnect::JsonWebKey::key_id(k).map(|id| id.as_str().to_string()))
            .collect();
        let client = OidcClient::from_provider_metadata(
            metadata,
            ClientId::new(self.config.client_id.clone()),
            Some(ClientSecret::new(
                self.config.client_secret.expose().clone(),
            )),
        )
        .set_redirect_uri(self.redirect.clone());
        let found = Arc::new(Discovered {
            client,
            end_session,
            kids,
        });
        *cached = Some(found.clone());
        Ok(found)
    }

    /// Discovers now (at start-up); failures are logged and retried at the next sign-in.
    pub async fn warm_up(&self) {
        if let Err(e) = self.provider().await {
            tracing::warn!(issuer = %self.config.issuer, error = %e, "OIDC discovery failed; will retry at the next sign-in");
        }
    }

    /// The provider URL to send the browser to for `pending` (its state, nonce and PKCE
    /// verifier). `fresh`: the person must authenticate now (a step-up), not through the
    /// provider's session.
    pub async fn begin(&self, pending: &PendingLogin, fresh: bool) -> Result<String, SignInError> {
        let found = self.provider().await?;
        let challenge = PkceCodeChallenge::from_code_verifier_sha256(&PkceCodeVerifier::new(
            pending.pkce_verifier(),
        ));
        let (state, nonce) = (pending.state(), pending.nonce());
        let mut request = found
            .client
            .authorize_url(
                CoreAuthenticationFlow::AuthorizationCode,
                move || CsrfToken::new(state),
                move || Nonce::new(nonce),
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
        let (url, _, _) = request.url();
        Ok(url.to_string())
    }

    /// Checks the callback's `iss` parameter (when the provider sends one), exchanges the
    /// code and verifies the ID token. `state` has been checked by the caller.
    pub async fn finish(
        &self,
        pending: &PendingLogin,
        code: String,
        response_iss: Option<&str>,
    ) -> Result<(Person, IdpSession), SignInError> {
        if let Some(iss) = response_iss
            && iss != self.config.issuer
        {
            return Err(SignInError::WrongResponseIssuer);
        }
        let found = self.provider().await?;
        let tokens = found
            .client
            .exchange_code(AuthorizationCode::new(code))
            .map_err(|e| SignInError::Exchange(e.to_string()))?
            .set_pkce_verifier(PkceCodeVerifier::new(pending.pkce_verifier()))
            .request_async(&self.http)
            .await
            .map_err(|e| SignInError::Exchange(error_chain(&e)))?;
        let id_token = tokens.id_token().ok_or(SignInError::NoIdToken)?;
        let nonce = Nonce::new(pending.nonce());
        let claims = self
            .verified(id_token, found, |n: Option<&Nonce>| {
                if n.is_some_and(|n| {
                    super::pending::constant_time_eq(
                        n.secret().as_bytes(),
                        nonce.secret().as_bytes(),
                    )
                }) {
                    Ok(())
                } else {
                    Err("nonce mismatch".to_string())
                }
            })
            .await?;
        let now = self.clock.now_ms();
        let person = Person {
            iss: claims.issuer().as_str().to_string(),
            sub: claims.subject().as_str().to_string(),
            name: display_name(&claims),
            email: claims.email().map(|e| e.as_str().to_string()),
            roles: self.roles(&claims.additional_claims().rest),
            tenant: self.tenant(&claims.additional_claims().rest),
            auth_time: authenticated_at(claims.auth_time(), now),
            // Every request asks for `auth_time` (max_age); a provider that leaves it out
            // never makes a sign-in count as fresh for a step-up.
            auth_time_unknown: claims.auth_time().is_none(),
        };
        let idp = IdpSession {
            access_token: tokens.access_token().secret().clone(),
            refresh_token: tokens.refresh_token().map(|t| t.secret().clone()),
            id_token: id_token.to_string(),
            sid: claims
                .additional_claims()
                .rest
                .get("sid")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string),
            checked_at: now,
            signed_in_at: now,
        };
        Ok((person, idp))
    }

    /// `token`'s claims, verified against the provider's keys (discovering once more when
    /// the signature does not verify: the provider may have rotated its keys).
    async fn verified(
        &self,
        token: &ParsedIdToken,
        found: Arc<Discovered>,
        nonce: impl Fn(Option<&Nonce>) -> Result<(), String> + Clone,
    ) -> Result<Claims, SignInError> {
        let claims = match token.claims(&self.verifier(&found.client), nonce.clone()) {
            Ok(claims) => claims.clone(),
            Err(ClaimsVerificationError::SignatureVerification(_)) => {
                let fresh = self.rediscover().await?;
                token
                    .claims(&self.verifier(&fresh.client), nonce)
                    .cloned()
                    .map_err(|e| refused_token(&e))?
            }
            Err(e) => return Err(refused_token(&e)),
        };
        if let Some(azp) = claims.authorized_party()
            && azp.as_str() != self.config.client_id
        {
            return Err(SignInError::IdToken(
                "it was issued to another client (azp)",
                format!("azp {}", azp.as_str()),
            ));
        }
        Ok(claims)
    }

    fn verifier<'c>(
        &self,
        client: &'c OidcClient,
    ) -> openidconnect::IdTokenVerifier<'c, CoreJsonWebKey> {
        let clock = self.clock.clone();
        client
            .id_token_verifier()
            .set_allowed_algs(ALLOWED_ALGS)
            .set_time_fn(move || clock.now())
    }

    fn roles(&self, claims: &BTreeMap<String, serde_json::Value>) -> Vec<AppRole> {
        map_roles(claims.get(&self.config.role_claim), &self.config.role_map)
    }

    /// The tenant claim; a name reserved for audit chains (`_…`, or empty) counts as none,
    /// so such a person sees no tenant's data (fail closed).
    fn tenant(&self, claims: &BTreeMap<String, serde_json::Value>) -> Option<String> {
        let tenant = claims
            .get(&self.config.tenant_claim)
            .and_then(serde_json::Value::as_str)?;
        if countersign_core::audit::chain_of_tenant(Some(tenant)).is_err() {
            tracing::warn!(
                tenant,
                "a tenant claim names a reserved audit chain: taken as no tenant"
            );
            return None;
        }
        Some(tenant.to_string())
    }

    /// Derives `person`'s roles and tenant from the provider again: a refresh grant when the
    /// session holds a refresh token (its ID token's claims, or failing one the userinfo
    /// endpoint's with the new access token), else the userinfo endpoint with the access
    /// token of the sign-in. Returns the person as the provider sees them now and the
    /// session's updated tokens.
    pub async fn recheck(
        &self,
        idp: &IdpSession,
        person: &Person,
    ) -> Result<(Person, IdpSession), SignInError> {
        let found = self.provider().await?;
        let mut next = idp.clone();
        let mut from_id_token = None;
        if let Some(refresh) = &idp.refresh_token {
            let refresh = RefreshToken::new(refresh.clone());
            let tokens = found
                .client
                .exchange_refresh_token(&refresh)
                .map_err(|e| SignInError::Recheck(e.to_string()))?
                .request_async(&self.http)
                .await
                .map_err(|e| SignInError::Recheck(error_chain(&e)))?;
            next.access_token = tokens.access_token().secret().clone();
            if let Some(rotated) = tokens.refresh_token() {
                next.refresh_token = Some(rotated.secret().clone());
            }
            if let Some(token) = tokens.id_token() {
                // Straight from the token endpoint over the client's authenticated channel;
                // the original sign-in's nonce is not repeated by every provider.
                let claims = self
                    .verified(token, found.clone(), |_: Option<&Nonce>| Ok(()))
                    .await
                    .map_err(|e| SignInError::Recheck(e.to_string()))?;
                if claims.subject().as_str() != person.sub {
                    return Err(SignInError::Recheck(
                        "the ID token names another subject".into(),
                    ));
                }
                next.id_token = token.to_string();
                from_id_token = Some(claims.additional_claims().rest.clone());
            }
        }
        let claims = match from_id_token {
            Some(claims) => claims,
            None => {
                let info: UserInfoClaims<ExtraClaims, CoreGenderClaim> = found
                    .client
                    .user_info(
                        AccessToken::new(next.access_token.clone()),
                        Some(SubjectIdentifier::new(person.sub.clone())),
                    )
                    .map_err(|e| SignInError::Recheck(e.to_string()))?
                    .request_async(&self.http)
                    .await
                    .map_err(|e| SignInError::Recheck(error_chain(&e)))?;
                info.additional_claims().rest.clone()
            }
        };
        next.checked_at = self.clock.now_ms();
        let now = Person {
            roles: self.roles(&claims),
            tenant: self.tenant(&claims),
            ..person.clone()
        };
        Ok((now, next))
    }

    /// Verifies a back-channel logout token (see the module invariants) and names whom it
    /// signs out.
    pub async fn logout_token(&self, token: &str) -> Result<LogoutSubject, SignInError> {
        let refused = |why: &str| SignInError::LogoutToken(why.to_string());
        let parsed: ParsedIdToken = token
            .parse()
            .map_err(|_| refused("not a signed JWT naming its subject"))?;
        let found = self.provider().await?;
        let claims = match self.logout_claims(&parsed, &found) {
            // Signed by a key the provider did not publish when it was last asked: it may have
            // rotated its keys. Ask again, at most once a minute; until then the provider is
            // told to retry (503), a forged token's unknown key costs nothing more.
            Err(ClaimsVerificationError::SignatureVerification(_))
                if !header_kid(token).is_some_and(|kid| found.kids.contains(&kid)) =>
            {
                if !self.may_refetch().await {
                    return Err(SignInError::Discovery(
                        "a logout token's signing key is not among the provider's keys yet".into(),
                    ));
                }
                let fresh = self.rediscover().await?;
                self.logout_claims(&parsed, &fresh)
            }
            other => other,
        }
        .map_err(|e| SignInError::LogoutToken(e.to_string()))?;
        let issued_at = claims.issue_time().timestamp_millis();
        if issued_at > self.clock.now_ms() + LOGOUT_IAT_SKEW_MS {
            return Err(refused("it was issued in the future"));
        }
        let extra = &claims.additional_claims().rest;
        let has_event = extra
            .get("events")
            .and_then(serde_json::Value::as_object)
            .is_some_and(|events| events.contains_key(BACKCHANNEL_EVENT));
        if !has_event {
            return Err(refused("it does not carry the back-channel logout event"));
        }
        let sub = Some(claims.subject().as_str().to_string()).filter(|s| !s.is_empty());
        let sid = extra
            .get("sid")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string);
        if sub.is_none() && sid.is_none() {
            return Err(refused("it names neither a subject nor a session"));
        }
        Ok(LogoutSubject {
            iss: claims.issuer().as_str().to_string(),
            sub,
            sid,
            issued_at,
        })
    }

    fn logout_claims(
        &self,
        token: &ParsedIdToken,
        found: &Discovered,
    ) -> Result<Claims, ClaimsVerificationError> {
        let jose_types = ["logout+jwt", "JWT"]
            .into_iter()
            .filter_map(|t| JsonWebTokenType::new(t.to_string()).normalize().ok());
        let verifier = self
            .verifier(&found.client)
            .set_allowed_jose_types(jose_types);
        let no_nonce = |n: Option<&Nonce>| match n {
            None => Ok(()),
            Some(_) => Err("a logout token carries no nonce".to_string()),
        };
        token.claims(&verifier, no_nonce).cloned()
    }

    /// Whether a logout token may make it fetch the provider's keys again now (at most once
    /// a minute), and if so, marks that it did.
    async fn may_refetch(&self) -> bool {
        let mut last = self.logout_rediscovered.lock().await;
        let due = last.is_none_or(|at| at.elapsed() >= LOGOUT_REFETCH_EVERY);
        if due {
            *last = Some(std::time::Instant::now());
        }
        due
    }

    /// Where to send the browser to end its session at the provider (RP-initiated logout),
    /// when the provider advertises an `end_session_endpoint`; the provider sends it back to
    /// `post_logout` afterwards.
    pub async fn end_session_url(&self, id_token: &str, post_logout: &str) -> Option<String> {
        let found = self.provider().await.ok()?;
        let endpoint = found.end_session.clone()?;
        let mut request = LogoutRequest::from(endpoint)
            .set_client_id(ClientId::new(self.config.client_id.clone()));
        if let Ok(hint) = id_token.parse::<ParsedIdToken>() {
            request = request.set_id_token_hint(&hint);
        }
        if let Ok(back) = PostLogoutRedirectUrl::new(post_logout.to_string()) {
            request = request.set_post_logout_redirect_uri(back);
        }
        Some(request.http_get_url().to_string())
    }
}

/// The `kid` of a compact JWT's JOSE header, if it names one.
fn header_kid(token: &str) -> Option<String> {
    use base64::Engine as _;
    let header = token.split('.').next()?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .ok()?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    value.get("kid")?.as_str().map(str::to_string)
}

fn display_name(claims: &Claims) -> String {
    claims
        .name()
        .and_then(|n| n.get(None))
        .map(|n| n.as_str().to_string())
        .or_else(|| claims.preferred_username().map(|u| u.as_str().to_string()))
        .unwrap_or_else(|| claims.subject().as_str().to_string())
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
