//! Sessions: the sign-in mode, the session layer and its cookie, and what a live session is —
//! within its idle and absolute limits, re-checked with the provider every
//! `oidc_recheck_minutes` (see the module doc of `crate::auth` for the invariants).

use super::oidc::{self, IdpSession, Oidc};
use super::pages::page;
use super::store::{DbSessionStore, EXPIRES_AT};
use crate::config::{Config, loopback_host};
use axum::http::StatusCode;
use axum::response::Response;
use countersign_core::{Person, Store};
use std::collections::HashMap;
use std::sync::Arc;
use tower_sessions::cookie::SameSite;
use tower_sessions::{Expiry, Session, SessionManagerLayer};

pub(super) const PERSON: &str = "person";

pub(super) const SEEN: &str = "seen";

/// The session data key of what the provider answered at sign-in ([`IdpSession`]).
pub(super) const IDP: &str = "idp";

/// How stale the last-seen mark may get before a request rewrites it.
pub(super) const SEEN_GRANULARITY_MS: i64 = 60 * 1000;

/// How people sign in on this server.
#[derive(Debug)]
pub enum Mode {
    /// Through the configured OpenID Connect provider.
    Oidc(Box<Oidc>),
    /// Loopback only, no issuer configured: pick a seeded demo user.
    Demo,
    /// No issuer and not on loopback: nobody can sign in.
    Off,
}

/// Sign-in settings and state shared by the handlers.
#[derive(Debug)]
pub struct Auth {
    /// The sign-in mode.
    pub mode: Mode,
    pub(super) store: Store,
    pub(super) origin: String,
    idle_ms: i64,
    max_ms: i64,
    recheck_ms: i64,
    pub(super) cookie_secure: bool,
    /// One re-check at a time per session on this server (see [`Auth::recheck`]).
    rechecks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The sign-in mode `config` allows: OIDC if an issuer is set; otherwise the demo sign-in
/// only when asked for (`demo_sign_in`) on a loopback listen address with a loopback public
/// URL.
pub fn mode_for(config: &Config, store: &Store) -> Result<Mode, oidc::SignInError> {
    match &config.oidc {
        Some(oidc) => {
            let redirect = config
                .public_url
                .join("/auth/callback")
                .map_err(|e| oidc::SignInError::Discovery(format!("redirect URI: {e}")))?;
            Ok(Mode::Oidc(Box::new(Oidc::new(
                oidc.clone(),
                redirect.as_str(),
                store.clock().clone(),
                std::time::Duration::from_secs(u64::from(config.session_max_hours) * 3600),
            )?)))
        }
        // Behind a reverse proxy (a public URL off loopback) the listen address says nothing
        // about who can reach the server: no demo sign-in there.
        None if config.demo_sign_in
            && config.listen.ip().is_loopback()
            && loopback_host(&config.public_url) =>
        {
            Ok(Mode::Demo)
        }
        None => Ok(Mode::Off),
    }
}

/// Whether cookies must be `Secure`: always, except for plain http on a loopback host.
pub fn cookie_secure(public_url: &url::Url) -> bool {
    !(public_url.scheme() == "http" && loopback_host(public_url))
}

impl Auth {
    /// Builds the sign-in state for `config` over `store`.
    pub fn new(config: &Config, store: Store) -> Result<Self, oidc::SignInError> {
        let mode = mode_for(config, &store)?;
        Ok(Self {
            mode,
            origin: config.public_url.origin().ascii_serialization(),
            idle_ms: i64::from(config.session_idle_minutes) * 60 * 1000,
            max_ms: i64::from(config.session_max_hours) * 3600 * 1000,
            recheck_ms: config
                .oidc
                .as_ref()
                .map_or(i64::MAX, |o| i64::from(o.recheck_minutes) * 60 * 1000),
            cookie_secure: cookie_secure(&config.public_url),
            rechecks: std::sync::Mutex::default(),
            store,
        })
    }

    /// The session cookie's name.
    pub fn cookie_name(&self) -> &'static str {
        if self.cookie_secure {
            "__Host-countersign"
        } else {
            "countersign"
        }
    }

    /// The session layer (database store, cookie attributes as in the module invariants).
    pub fn session_layer(&self) -> SessionManagerLayer<DbSessionStore> {
        SessionManagerLayer::new(DbSessionStore::new(self.store.clone()))
            .with_name(self.cookie_name())
            .with_http_only(true)
            .with_same_site(SameSite::Lax)
            .with_secure(self.cookie_secure)
            .with_path("/")
            .with_expiry(Expiry::OnSessionEnd)
    }

    /// The person signed in on `session`, if the session is live. An expired session is
    /// deleted; a live one has its last-seen mark refreshed, unless the request is a page's
    /// background refresh (`activity` false), which never keeps an idle session alive. A
    /// session signed in through the provider is re-checked with it every
    /// `oidc_recheck_minutes` ([`Self::recheck`]).
    pub async fn current(&self, session: &Session, activity: bool) -> Option<Person> {
        let person: Person = session.get(PERSON).await.ok().flatten()?;
        let seen: i64 = session.get(SEEN).await.ok().flatten().unwrap_or(0);
        let now = self.store.clock().now_ms();
        if now >= person.auth_time.saturating_add(self.max_ms)
            || now >= seen.saturating_add(self.idle_ms)
        {
            end(session, "expired").await;
            return None;
        }
        let person = self.recheck(session, person, now).await?;
        if activity && now - seen >= SEEN_GRANULARITY_MS && session.insert(SEEN, now).await.is_err()
        {
            return None;
        }
        Some(person)
    }

    /// Re-derives the person's roles and tenant from the provider when the last check is
    /// `oidc_recheck_minutes` old. Fails closed: a session signed in through the provider
    /// without what a re-check needs, a provider that refuses or does not answer, or a
    /// tenant that changed ends the session; changed roles replace the session's.
    async fn recheck(&self, session: &Session, person: Person, now: i64) -> Option<Person> {
        let Mode::Oidc(oidc) = &self.mode else {
            return Some(person);
        };
        let Some(idp) = session.get::<IdpSession>(IDP).await.ok().flatten() else {
            end(session, "no provider tokens to re-check with").await;
            return None;
        };
        if now.saturating_sub(idp.checked_at) < self.recheck_ms {
            return Some(person);
        }
        // One re-check at a time per session: pages ask in parallel, and a provider that
        // rotates refresh tokens refuses the second use of one. The one that waited takes
        // what the first stored.
        let id = session.id().map(|id| id.to_string()).unwrap_or_default();
        let lock = self.recheck_lock(&id);
        let _turn = lock.lock().await;
        if let Some((stored, stored_idp)) = self.stored(&id).await
            && stored_idp.checked_at > idp.checked_at
        {
            self.release_lock(&id, &lock);
            let adopted = async {
                session.insert(PERSON, &stored).await?;
                session.insert(IDP, &stored_idp).await
            }
            .await;
            return adopted.is_ok().then_some(stored);
        }
        let rechecked = self.rechecked(oidc, session, person, &idp).await;
        self.release_lock(&id, &lock);
        rechecked
    }

    fn recheck_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.rechecks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(id.to_string()).or_default().clone()
    }

    fn release_lock(&self, id: &str, lock: &Arc<tokio::sync::Mutex<()>>) {
        let mut locks = self.rechecks.lock().unwrap_or_else(|p| p.into_inner());
        // Nobody else holds or waits for it (the map's and this caller's references).
        if Arc::strong_count(lock) <= 2 {
            locks.remove(id);
        }
    }

    /// The person and provider tokens as the session's row holds them now.
    async fn stored(&self, id: &str) -> Option<(Person, IdpSession)> {
        let bytes = self.store.session_load(id).await.ok().flatten()?;
        let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        let person = serde_json::from_value(value.get(PERSON)?.clone()).ok()?;
        let idp = serde_json::from_value(value.get(IDP)?.clone()).ok()?;
        Some((person, idp))
    }

    /// Asks the provider and applies its answer to the session (see [`Auth::recheck`]).
    async fn rechecked(
        &self,
        oidc: &Oidc,
        session: &Session,
        person: Person,
        idp: &IdpSession,
    ) -> Option<Person> {
        let (current, idp) = match oidc.recheck(idp, &person).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(iss = %person.iss, sub = %person.sub, error = %e, "re-check with the identity provider failed; session ended");
                end(session, "re-check failed").await;
                return None;
            }
        };
        if current.tenant != person.tenant {
            tracing::warn!(iss = %person.iss, sub = %person.sub, from = ?person.tenant, to = ?current.tenant, "tenant changed at the identity provider; session ended");
            end(session, "tenant changed").await;
            return None;
        }
        if current.roles != person.roles {
            tracing::info!(iss = %person.iss, sub = %person.sub, from = ?person.roles, to = ?current.roles, "roles changed at the identity provider");
        }
        let stored = async {
            session.insert(PERSON, &current).await?;
            session.insert(IDP, &idp).await
        }
        .await;
        if stored.is_err() {
            end(session, "re-check could not be stored").await;
            return None;
        }
        Some(current)
    }

    pub(super) async fn sign_in(
        &self,
        session: &Session,
        person: &Person,
        idp: Option<&IdpSession>,
    ) -> Result<(), Response> {
        let now = self.store.clock().now_ms();
        let result = async {
            session.cycle_id().await?;
            session.clear().await;
            session.insert(PERSON, person).await?;
            if let Some(idp) = idp {
                session.insert(IDP, idp).await?;
            }
            session.insert(SEEN, now).await?;
            session
                .insert(EXPIRES_AT, person.auth_time.saturating_add(self.max_ms))
                .await
        }
        .await;
        if result.is_ok()
            && let Some(tenant) = person.tenant.as_deref().filter(|t| !t.is_empty())
            && let Err(e) = self
                .store
                .remember_person(tenant, &person.iss, &person.sub, &person.name)
                .await
        {
            // Display only: a sign-in never fails for it.
            tracing::warn!(error = %e, "could not remember a person's display name");
        }
        result.map_err(|e| {
            tracing::error!(error = %e, "could not store a session");
            page(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Sign-in failed",
                "The session could not be stored. Try again.",
                self.demo(),
            )
        })
    }

    /// Whether the demo sign-in is on (pages then show the demo banner).
    pub fn demo(&self) -> bool {
        matches!(self.mode, Mode::Demo)
    }
}

/// Deletes `session` (it ended: `why`, for the log when that fails).
pub(super) async fn end(session: &Session, why: &str) {
    if let Err(e) = session.flush().await {
        tracing::warn!(error = %e, why, "could not delete an ended session");
    }
}
