//! A sign-in in progress, carried by a short-lived cookie instead of a session row: an
//! anonymous `GET /auth/login` writes nothing to the database.
//!
//! Invariants:
//! * The cookie holds a 256-bit random seed, when the sign-in started and where to go after
//!   it. `state`, `nonce` and the PKCE verifier are derived from all three under distinct
//!   labels (SHA-256), so the URL sent to the provider (state, nonce, challenge) reveals
//!   nothing that yields the verifier or the seed, and a cookie whose start or destination
//!   was changed no longer matches the `state` the provider returns.
//! * The cookie is `HttpOnly`, `SameSite=Lax` (the provider's redirect back is a top-level
//!   GET), `Path=/`, `Secure` with the `__Host-` prefix on the same terms as the session
//!   cookie, and lives [`PENDING_TTL_MS`] by the injected clock; an older one is refused.
//! * The callback clears it whatever happens next (single use); the provider refuses a
//!   code exchanged twice.
//! * `next` is at most [`MAX_NEXT`] bytes (else `/`) and re-checked as a local path when used;
//!   nothing in the cookie grants access.

use axum::http::{HeaderMap, HeaderValue, header};
use sha2::{Digest, Sha256};

/// How long a sign-in may take between the redirect to the provider and the callback.
pub const PENDING_TTL_MS: i64 = 10 * 60 * 1000;
/// The longest `next` a sign-in carries (a cookie over 4 KB would be dropped by browsers).
pub const MAX_NEXT: usize = 1024;

/// What the browser remembers between the redirect to the provider and the callback.
#[derive(Clone, PartialEq, Eq)]
pub struct PendingLogin {
    /// 256 random bits, base64url; everything secret is derived from it.
    seed: String,
    /// When the sign-in started (ms, the server's clock).
    pub started_at: i64,
    /// Where to go after sign-in (a local path).
    pub next: String,
}

impl PendingLogin {
    /// A new sign-in started at `now`, going to `next` afterwards (`/` when longer than
    /// [`MAX_NEXT`]).
    pub fn new(now: i64, next: String) -> Self {
        let next = if next.len() > MAX_NEXT {
            "/".to_string()
        } else {
            next
        };
        Self {
            seed: openidconnect::CsrfToken::new_random_len(32).into_secret(),
            started_at: now,
            next,
        }
    }

    fn derive(&self, label: &str) -> String {
        let mut h = Sha256::new();
        h.update(b"countersign.signin.v1\0");
        h.update(label.as_bytes());
        h.update(b"\0");
        h.update(self.seed.as_bytes());
        h.update(b"\0");
        h.update(self.started_at.to_string().as_bytes());
        h.update(b"\0");
        h.update(self.next.as_bytes());
        hex(&h.finalize())
    }

    /// The `state` sent to the provider.
    pub fn state(&self) -> String {
        self.derive("state")
    }

    /// The `nonce` sent to the provider.
    pub fn nonce(&self) -> String {
        self.derive("nonce")
    }

    /// The PKCE code verifier (64 unreserved characters).
    pub fn pkce_verifier(&self) -> String {
        self.derive("pkce")
    }

    /// Whether the sign-in is too old at `now` (or claims to start in the future).
    pub fn expired(&self, now: i64) -> bool {
        now < self.started_at || now - self.started_at >= PENDING_TTL_MS
    }

    fn encode(&self) -> String {
        url::form_urlencoded::Serializer::new(String::new())
            .append_pair("s", &self.seed)
            .append_pair("t", &self.started_at.to_string())
            .append_pair("n", &self.next)
            .finish()
    }

    fn decode(value: &str) -> Option<Self> {
        let (mut seed, mut started_at, mut next) = (None, None, None);
        for (k, v) in url::form_urlencoded::parse(value.as_bytes()) {
            match &*k {
                "s" => seed = Some(v.into_owned()),
                "t" => started_at = v.parse::<i64>().ok(),
                "n" => next = Some(v.into_owned()),
                _ => return None,
            }
        }
        let seed = seed.filter(|s| {
            s.len() == 43
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })?;
        Some(Self {
            seed,
            started_at: started_at?,
            next: next?,
        })
    }
}

impl std::fmt::Debug for PendingLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingLogin")
            .field("started_at", &self.started_at)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

/// Only local paths are accepted as `next`; anything else becomes `/`.
pub fn local_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.contains('\\')
                && !n.chars().any(char::is_control)
                && !n.starts_with("/auth/") =>
        {
            n.to_string()
        }
        _ => "/".to_string(),
    }
}

/// Whether `a` and `b` are equal, in time that does not depend on where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cookie's name: `__Host-` prefixed when cookies are `Secure`.
pub fn cookie_name(secure: bool) -> &'static str {
    if secure {
        "__Host-countersign-signin"
    } else {
        "countersign-signin"
    }
}

fn attributes(secure: bool) -> &'static str {
    if secure {
        "; Path=/; HttpOnly; SameSite=Lax; Secure"
    } else {
        "; Path=/; HttpOnly; SameSite=Lax"
    }
}

/// The `Set-Cookie` value that stores `pending`.
pub fn set_cookie(pending: &PendingLogin, secure: bool) -> Option<HeaderValue> {
    let value = format!(
        "{}={}{}; Max-Age={}",
        cookie_name(secure),
        pending.encode(),
        attributes(secure),
        PENDING_TTL_MS / 1000
    );
    HeaderValue::from_str(&value).ok()
}

/// The `Set-Cookie` value that deletes the cookie.
pub fn clear_cookie(secure: bool) -> HeaderValue {
    let value = format!("{}={}; Max-Age=0", cookie_name(secure), attributes(secure));
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The pending sign-in the request's cookies carry, if any (the last one when repeated).
pub fn from_headers(headers: &HeaderMap, secure: bool) -> Option<PendingLogin> {
    let prefix = format!("{}=", cookie_name(secure));
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().strip_prefix(&prefix))
        .filter_map(PendingLogin::decode)
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_values_differ_per_label_and_per_seed_and_survive_the_cookie() {
        let a = PendingLogin::new(1_000, "/inbox?x=1;y".into());
        let b = PendingLogin::new(1_000, "/inbox".into());
        assert_ne!(a.state(), a.nonce());
        assert_ne!(a.state(), a.pkce_verifier());
        assert_ne!(a.state(), b.state());
        assert_eq!(a.pkce_verifier().len(), 64);
        // A cookie whose start or destination was rewritten derives another state.
        let moved = PendingLogin {
            started_at: a.started_at + 1,
            ..a.clone()
        };
        assert_ne!(moved.state(), a.state());
        let elsewhere = PendingLogin {
            next: "/admin".into(),
            ..a.clone()
        };
        assert_ne!(elsewhere.state(), a.state());
        assert!(
            !format!("{a:?}").contains(&a.seed),
            "the seed is never printed"
        );
        assert_eq!(PendingLogin::new(1, "/x".repeat(600)).next, "/");
        let header = set_cookie(&a, true).unwrap();
        let text = header.to_str().unwrap();
        assert!(text.starts_with("__Host-countersign-signin="), "{text}");
        assert!(
            text.contains("HttpOnly") && text.contains("Secure"),
            "{text}"
        );
        let cookie = text.split(';').next().unwrap().to_string();
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {cookie}")).unwrap(),
        );
        assert_eq!(from_headers(&headers, true), Some(a.clone()));
        // The insecure name is another cookie.
        assert_eq!(from_headers(&headers, false), None);
    }

    #[test]
    fn a_malformed_or_expired_cookie_is_no_sign_in() {
        for bad in [
            "s=z*z&t=1&n=%2F",
            "t=1&n=%2F",
            "s=&t=x&n=/",
            "garbage",
            "s=a&x=1",
        ] {
            assert_eq!(PendingLogin::decode(bad), None, "{bad}");
        }
        let p = PendingLogin::new(1_000, "/".into());
        assert!(!p.expired(1_000 + PENDING_TTL_MS - 1));
        assert!(p.expired(1_000 + PENDING_TTL_MS));
        assert!(p.expired(999));
    }
}
