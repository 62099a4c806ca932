//! Security headers on every HTTP response.
//!
//! Invariants:
//! * No page can be framed by another site (`X-Frame-Options: DENY` and CSP
//!   `frame-ancestors 'none'`): an approve, revoke or stop button cannot be clickjacked.
//! * Responses are not content-sniffed (`X-Content-Type-Options: nosniff`) and send no
//!   referrer to other origins (`Referrer-Policy: same-origin`).
//! * Nothing but the compiled static assets (`/pkg/…`) is stored by browsers or proxies
//!   (`Cache-Control: no-store`): inputs, audit records and one-time tokens do not outlive
//!   the page in a shared browser's cache. A handler's own `Cache-Control` is kept.
//! * No script runs on a document unless its handler allowed it: the default policy is
//!   `script-src 'none'` (with `object-src` and `base-uri` off). The dashboard's pages replace
//!   it with a policy naming their own per-response nonce (`countersign_app::page_policy`),
//!   which also keeps `frame-ancestors 'none'`.
//! * Behind an `https://` public URL every response carries `Strict-Transport-Security`
//!   (one year, subdomains not included): a browser that once reached Countersign over TLS
//!   never falls back to plain http for it.
//! * A header a handler set itself is never overwritten.

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, REFERRER_POLICY, STRICT_TRANSPORT_SECURITY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::middleware::Next;
use axum::response::Response;

/// The static assets' path prefix (cacheable).
const STATIC_PREFIX: &str = "/pkg/";

/// The policy of every response whose handler set none: no scripts, no plugins, no `<base>`,
/// no framing.
pub const DEFAULT_POLICY: &str =
    "script-src 'none'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

/// `Strict-Transport-Security` for an https public URL.
pub const HSTS: &str = "max-age=31536000";

/// Adds the security headers to the response of `req`; `https`: the public URL is https.
pub async fn security_headers(State(https): State<bool>, req: Request, next: Next) -> Response {
    let cacheable = req.uri().path().starts_with(STATIC_PREFIX);
    let mut resp = next.run(req).await;
    let headers = resp.headers_mut();
    let mut set = |name, value: &'static str| {
        headers
            .entry(name)
            .or_insert_with(|| HeaderValue::from_static(value));
    };
    set(X_FRAME_OPTIONS, "DENY");
    set(CONTENT_SECURITY_POLICY, DEFAULT_POLICY);
    set(X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(REFERRER_POLICY, "same-origin");
    if !cacheable {
        set(CACHE_CONTROL, "no-store");
    }
    if https {
        set(STRICT_TRANSPORT_SECURITY, HSTS);
    }
    resp
}
