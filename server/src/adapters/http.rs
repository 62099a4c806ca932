//! The `http` adapter: a provider's target system as JSON over HTTP(S) at its `base_url`.
//!
//! Wire contract (documented for target implementers in `docs/registry.md`):
//! * invoke: `POST {base_url}/{operation}` (each `/`-separated part of the operation one path
//!   segment), body = the canonical arguments, headers `Idempotency-Key`,
//!   `X-Countersign-Trace`, `X-Countersign-Tenant` and, when a person approved the call,
//!   `X-Countersign-Approval`. 2xx → the JSON body (an empty body is `{}`); 3xx → effect
//!   unknown (never followed: the target may have acted before redirecting); 429 and 503 →
//!   unavailable; other 5xx, and 409 on a re-send of a key (the key's first request still in
//!   progress, as the IETF Idempotency-Key draft answers) → effect unknown; other 4xx (a 409
//!   on a key's first send is a business conflict) → rejected with `code` (and `message`) from the body,
//!   `{"code": ..}` or `{"error": {"code": ..}}`, else `http.<status>`.
//! * lookup (reconciliation): `GET {base_url}/_lookup?idempotency_key=K` → 200 with
//!   `{"idempotency_key": K, "found": true, "result": {..}}` (it happened, with its result) or
//!   `{"idempotency_key": K, "found": false}` (it never did). Any other answer — a 404 from a
//!   server without the route, a catch-all 200, another key — is "cannot tell": only an
//!   answer about this key settles a step.
//! * facts: `GET {base_url}/_facts/{kind}/{id}` → 200 with a `ResourceFact` JSON, 404 = none.
//!
//! Invariants (all fail closed):
//! * Only hosts on the provider's `allowed_hosts` are ever contacted: every URL is checked
//!   before a request is built, and a failing check is [`AdapterError::Refused`] with no
//!   connection made. Redirects are never followed and no proxy (`HTTP_PROXY` …) is used, so
//!   no request leaves for a host that was not checked. The list holds names: what they
//!   resolve to is DNS's answer.
//! * An operation (and a resource id) is appended as path segments; `..`, `.`, empty segments
//!   and segments holding control characters (which URL parsing strips, turning `.\t.` into
//!   `..`) are refused, so neither can leave `base_url`'s path or name another record.
//! * What is known about the effect is reported honestly: a failure to connect is
//!   [`AdapterError::Unavailable`] (nothing was sent); once the request may have been sent,
//!   a lost or unreadable answer, or a server error other than 503 (a crash, a gateway that
//!   lost the answer), is [`AdapterError::Timeout`] (it may have happened); 503 and 429 say
//!   the target did not take the request ([`AdapterError::Unavailable`]).
//! * Answers are read up to [`MAX_BODY`] bytes; a larger one is unreadable. The status is
//!   judged first: a large error page of a 503 is still "unavailable".

use std::collections::BTreeSet;

use countersign_core::policy::ResourceFact;
use countersign_core::registry::Provider;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use url::Url;

use super::contract::{AdapterError, AdapterSettings, BoxFuture, Invocation};

/// The largest answer body read from a target, in bytes.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// The idempotency header.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// The trace header.
pub const TRACE: &str = "X-Countersign-Trace";
/// The tenant header.
pub const TENANT: &str = "X-Countersign-Tenant";
/// The approval reference header (only when a person approved the call).
pub const APPROVAL: &str = "X-Countersign-Approval";

/// Why an outbound adapter cannot be built for a provider.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The provider's URL is missing, unparsable or not http(s).
    #[error("bad endpoint URL: {0}")]
    Url(String),
    /// The URL's host is not on `allowed_hosts`.
    #[error("host {0} is not on allowed_hosts")]
    HostNotAllowed(String),
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Client(String),
}

/// The outbound host allow-list of one provider.
#[derive(Debug, Clone)]
pub(crate) struct AllowList(BTreeSet<String>);

impl AllowList {
    pub(crate) fn of(provider: &Provider) -> Self {
        Self(
            provider
                .allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
        )
    }

    /// `Ok` when `url` is http(s) with a host on the list.
    pub(crate) fn check(&self, url: &Url) -> Result<(), SetupError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(SetupError::Url(format!(
                "scheme {} is not http or https",
                url.scheme()
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(SetupError::Url("credentials in the URL".into()));
        }
        let host = url
            .host_str()
            .ok_or_else(|| SetupError::Url("no host".into()))?
            .to_ascii_lowercase();
        // IPv6 literals come bracketed from `host_str`; the list may hold either form.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if self.0.contains(&host) || self.0.contains(bare) {
            Ok(())
        } else {
            Err(SetupError::HostNotAllowed(host))
        }
    }
}

/// The client every outbound adapter uses: no redirects, no proxy, bounded time.
pub(crate) fn client(settings: &AdapterSettings) -> Result<reqwest::Client, SetupError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(settings.connect_timeout)
        .timeout(settings.timeout)
        .user_agent(concat!("countersign/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| SetupError::Client(e.to_string()))
}

/// What a failed send says about the effect.
pub(crate) fn send_error(e: &reqwest::Error) -> AdapterError {
    if e.is_connect() {
        // Never connected: nothing reached the target (this includes a connect timeout).
        AdapterError::Unavailable(format!("could not connect: {e}"))
    } else if e.is_builder() {
        AdapterError::Refused(format!("request not built: {e}"))
    } else {
        // The request may have reached the target: the effect is not known.
        tracing::info!(error = %e, "outbound call: no usable answer");
        AdapterError::Timeout
    }
}

/// Reads at most [`MAX_BODY`] bytes of `resp`.
pub(crate) async fn read_body(mut resp: reqwest::Response) -> Result<Vec<u8>, AdapterError> {
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_BODY {
                    tracing::info!("outbound call: answer larger than {MAX_BODY} bytes");
                    return Err(AdapterError::Timeout);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) => return Err(send_error(&e)),
        }
    }
}

/// The JSON of a 2xx body (`{}` when empty); an unparsable answer leaves the effect unknown.
fn success_json(body: &[u8]) -> Result<Value, AdapterError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(body).map_err(|e| {
        tracing::info!(error = %e, "outbound call: 2xx answer is not JSON");
        AdapterError::Timeout
    })
}

/// The error a non-2xx answer stands for; `resend` = the key was sent before.
fn status_error(status: StatusCode, body: &[u8], resend: bool) -> AdapterError {
    if status == StatusCode::SERVICE_UNAVAILABLE
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.as_u16() == 425
    {
        return AdapterError::Unavailable(format!("target answered {status}"));
    }
    if status.is_server_error()
        || status.is_redirection()
        || (resend && status == StatusCode::CONFLICT)
    {
        // The request arrived; a crash (500), a gateway that lost the answer (502, 504), a
        // redirect after acting (303 after a POST), or "this key's first request is still
        // running" (409 to a re-send) leaves the effect unknown. Redirects are never followed.
        tracing::info!(%status, "outbound call: answer does not say what happened; effect unknown");
        return AdapterError::Timeout;
    }
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let field = |name: &str| -> Option<String> {
        let v = parsed.as_ref()?;
        v.get(name)
            .or_else(|| v.get("error").and_then(|e| e.get(name)))
            .and_then(Value::as_str)
            .map(|s| s.chars().take(200).collect())
    };
    AdapterError::Rejected {
        code: field("code").unwrap_or_else(|| format!("http.{}", status.as_u16())),
        message: field("message").unwrap_or_else(|| format!("the target answered {status}")),
    }
}

/// "Cannot tell" from a lookup.
fn cannot_tell(why: String) -> AdapterError {
    AdapterError::Unavailable(format!("the lookup cannot tell: {why}"))
}

/// A lookup's answer about `key`: only `{"idempotency_key": key, "found": true|false, ..}`
/// settles anything.
fn lookup_answer(body: &[u8], key: &str) -> Result<Option<Value>, AdapterError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|_| cannot_tell("the answer is not JSON".into()))?;
    if v.get("idempotency_key").and_then(Value::as_str) != Some(key) {
        return Err(cannot_tell(
            "the answer does not name the key asked about".into(),
        ));
    }
    match (v.get("found").and_then(Value::as_bool), v.get("result")) {
        (Some(true), Some(result @ Value::Object(_))) => Ok(Some(result.clone())),
        (Some(false), None) => Ok(None),
        _ => Err(cannot_tell(
            "the answer has no `found` with a `result` object (or none when not found)".into(),
        )),
    }
}

/// `base` with `parts` appended as path segments; `.`/`..`/empty parts and parts with
/// control characters are refused.
fn join<'p>(base: &Url, parts: impl IntoIterator<Item = &'p str>) -> Result<Url, AdapterError> {
    let mut url = base.clone();
    {
        let mut segments = url
            .path_segments_mut()
            .map_err(|()| AdapterError::Refused("base_url cannot take a path".into()))?;
        segments.pop_if_empty();
        for part in parts {
            if part.is_empty() || part == "." || part == ".." || part.chars().any(char::is_control)
            {
                return Err(AdapterError::Refused(format!(
                    "path segment {part:?} is not allowed"
                )));
            }
            segments.push(part);
        }
    }
    Ok(url)
}

/// A provider of kind `http`.
#[derive(Debug)]
pub struct HttpAdapter {
    base: Url,
    allow: AllowList,
    client: reqwest::Client,
}

impl HttpAdapter {
    /// The adapter for `provider` (its `base_url` must be http(s) on `allowed_hosts`).
    pub fn new(provider: &Provider, settings: &AdapterSettings) -> Result<Self, SetupError> {
        let text = provider
            .base_url
            .as_deref()
            .ok_or_else(|| SetupError::Url("an http provider needs base_url".into()))?;
        let base = Url::parse(text).map_err(|e| SetupError::Url(e.to_string()))?;
        let allow = AllowList::of(provider);
        allow.check(&base)?;
        Ok(Self {
            base,
            allow,
            client: client(settings)?,
        })
    }

    /// Sends one request to `url` (after the allow-list check) and returns status and body.
    async fn send(
        &self,
        method: Method,
        url: Url,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<(StatusCode, Vec<u8>), AdapterError> {
        self.allow
            .check(&url)
            .map_err(|e| AdapterError::Refused(e.to_string()))?;
        let mut req = self
            .client
            .request(method, url)
            .header(reqwest::header::ACCEPT, "application/json");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(|e| send_error(&e))?;
        let status = resp.status();
        match read_body(resp).await {
            Ok(body) => Ok((status, body)),
            // An error answer too large to read still says what its status says.
            Err(AdapterError::Timeout) if !status.is_success() => Ok((status, Vec::new())),
            Err(e) => Err(e),
        }
    }

    /// A GET that answers `None` on 404.
    async fn get_optional(
        &self,
        url: Url,
        headers: &[(&str, &str)],
    ) -> Result<Option<Value>, AdapterError> {
        let (status, body) = self.send(Method::GET, url, headers, None).await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(status_error(status, &body, false));
        }
        // A read: an unreadable answer means "cannot tell", never a guess.
        success_json(&body).map(Some)
    }
}

impl super::Adapter for HttpAdapter {
    fn invoke<'a>(&'a self, call: &'a Invocation) -> BoxFuture<'a, Result<Value, AdapterError>> {
        Box::pin(async move {
            let url = join(&self.base, call.operation.split('/'))?;
            let mut headers = vec![
                (IDEMPOTENCY_KEY, call.idem_key.as_str()),
                (TRACE, call.trace_id.as_str()),
                (TENANT, call.tenant.as_str()),
            ];
            if let Some(approval) = &call.approval_token {
                headers.push((APPROVAL, approval.as_str()));
            }
            let (status, body) = self
                .send(Method::POST, url, &headers, Some(&call.arguments))
                .await?;
            if status.is_success() {
                success_json(&body)
            } else {
                Err(status_error(status, &body, call.resend))
            }
        })
    }

    fn lookup<'a>(
        &'a self,
        tenant: &'a str,
        idem_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, AdapterError>> {
        Box::pin(async move {
            let mut url = join(&self.base, ["_lookup"])?;
            url.query_pairs_mut()
                .append_pair("idempotency_key", idem_key);
            let (status, body) = self
                .send(Method::GET, url, &[(TENANT, tenant)], None)
                .await?;
            if !status.is_success() {
                return Err(cannot_tell(format!("the target answered {status}")));
            }
            lookup_answer(&body, idem_key)
        })
    }

    fn facts<'a>(
        &'a self,
        kind: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceFact>, AdapterError>> {
        Box::pin(async move {
            let url = join(&self.base, ["_facts", kind, id])?;
            match self.get_optional(url, &[]).await? {
                None => Ok(None),
                Some(v) => serde_json::from_value(v).map(Some).map_err(|e| {
                    AdapterError::Unavailable(format!("the target's facts do not parse: {e}"))
                }),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Url {
        Url::parse("https://bank.example/api/").unwrap()
    }

    #[test]
    fn operations_become_path_segments_and_cannot_leave_the_base_path() {
        let url = join(&base(), "payments.schedule".split('/')).unwrap();
        assert_eq!(url.as_str(), "https://bank.example/api/payments.schedule");
        let url = join(&base(), "v1/payments".split('/')).unwrap();
        assert_eq!(url.as_str(), "https://bank.example/api/v1/payments");
        for bad in ["../admin", "a//b", "./x", ""] {
            assert!(
                matches!(join(&base(), bad.split('/')), Err(AdapterError::Refused(_))),
                "{bad}"
            );
        }
        // A segment that looks like a host stays a path segment (percent-encoded where needed).
        let url = join(&base(), ["evil.example:80@x"]).unwrap();
        assert_eq!(url.host_str(), Some("bank.example"));
    }

    #[test]
    fn the_allow_list_is_by_host_and_scheme() {
        let allow = AllowList(["bank.example".to_string(), "::1".to_string()].into());
        assert!(allow.check(&base()).is_ok());
        assert!(
            allow
                .check(&Url::parse("http://BANK.example:8080/x").unwrap())
                .is_ok()
        );
        assert!(allow.check(&Url::parse("http://[::1]:9/").unwrap()).is_ok());
        for bad in [
            "https://evil.example/",
            "https://bank.example.evil.example/",
            "ftp://bank.example/",
            "https://user:pw@bank.example/",
            "http://127.0.0.1/",
        ] {
            assert!(allow.check(&Url::parse(bad).unwrap()).is_err(), "{bad}");
        }
    }

    #[test]
    fn answers_map_to_what_is_known_about_the_effect() {
        let body = br#"{"error": {"code": "insufficient_funds", "message": "no"}}"#;
        assert_eq!(
            status_error(StatusCode::UNPROCESSABLE_ENTITY, body, false),
            AdapterError::Rejected {
                code: "insufficient_funds".into(),
                message: "no".into()
            }
        );
        // A 409 to a key's first send is a business conflict; to a re-send it may be "the
        // first request with this key is still running": unknown.
        assert!(matches!(
            status_error(StatusCode::CONFLICT, b"not json", false),
            AdapterError::Rejected { code, .. } if code == "http.409"
        ));
        assert_eq!(
            status_error(StatusCode::CONFLICT, b"", true),
            AdapterError::Timeout
        );
        // The request arrived and the answer was lost, the target crashed, or it redirected
        // (possibly after acting): unknown.
        for status in [
            StatusCode::BAD_GATEWAY,
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::FOUND,
            StatusCode::SEE_OTHER,
            StatusCode::TEMPORARY_REDIRECT,
        ] {
            assert_eq!(
                status_error(status, b"", false),
                AdapterError::Timeout,
                "{status}"
            );
        }
        for status in [
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::from_u16(425).unwrap(),
        ] {
            assert!(
                matches!(
                    status_error(status, b"", true),
                    AdapterError::Unavailable(_)
                ),
                "{status}"
            );
        }
        assert_eq!(success_json(b"").unwrap(), json!({}));
        assert_eq!(success_json(b"garbage"), Err(AdapterError::Timeout));
    }

    #[test]
    fn only_a_lookup_answer_about_the_key_settles_anything() {
        let k = "idem:k1";
        assert_eq!(
            lookup_answer(
                br#"{"idempotency_key":"idem:k1","found":true,"result":{"ref":"T-1"}}"#,
                k
            ),
            Ok(Some(json!({"ref": "T-1"})))
        );
        assert_eq!(
            lookup_answer(br#"{"idempotency_key":"idem:k1","found":false}"#, k),
            Ok(None)
        );
        for unclear in [
            &b"{}"[..],
            b"",
            b"<html>not found</html>",
            br#"{"ref":"T-1"}"#,
            br#"{"idempotency_key":"idem:other","found":false}"#,
            br#"{"idempotency_key":"idem:k1"}"#,
            br#"{"idempotency_key":"idem:k1","found":true}"#,
            br#"{"idempotency_key":"idem:k1","found":true,"result":"done"}"#,
            br#"{"idempotency_key":"idem:k1","found":false,"result":{}}"#,
            br#"{"idempotency_key":"idem:k1","found":"yes","result":{}}"#,
            br#"{"args":{"idempotency_key":"idem:k1"},"found":true,"result":{}}"#,
        ] {
            assert!(
                matches!(lookup_answer(unclear, k), Err(AdapterError::Unavailable(_))),
                "{}",
                String::from_utf8_lossy(unclear)
            );
        }
    }

    #[test]
    fn control_characters_cannot_make_a_dot_segment() {
        for bad in [".\t.", "..\n", "\t..", "INV-1\t", "a\rb"] {
            assert!(
                matches!(
                    join(&base(), ["_facts", "invoice", bad]),
                    Err(AdapterError::Refused(_))
                ),
                "{bad:?}"
            );
        }
    }
}
