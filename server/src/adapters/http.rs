//! The `http` adapter: a provider's target system as JSON over HTTP(S) at its `base_url`.
//!
//! Wire contract (documented for target implementers in `docs/registry.md`):
//! * invoke: `POST {base_url}/{operation}` (each `/`-separated part of the operation one path
//!   segment), body = the canonical arguments, headers `Idempotency-Key`,
//!   `X-Countersign-Trace`, `X-Countersign-Tenant` and, when a person approved the call,
//!   `X-Countersign-Approval`. 2xx → the JSON body (an empty body is `{}`); 3xx → rejected
//!   (`http.redirect`, never followed); 429 and 5xx → unavailable; other 4xx → rejected with
//!   `code` (and `message`) from the body, `{"code": ..}` or `{"error": {"code": ..}}`, else
//!   `http.<status>`.
//! * lookup (reconciliation): `GET {base_url}/_lookup?idempotency_key=K` → 200 with the
//!   stored result, 404 = never happened.
//! * facts: `GET {base_url}/_facts/{kind}/{id}` → 200 with a `ResourceFact` JSON, 404 = none.
//!
//! Invariants (all fail closed):
//! * Only hosts on the provider's `allowed_hosts` are ever contacted: every URL is checked
//!   before a request is built, and a failing check is [`AdapterError::Refused`] with no
//!   connection made. Redirects are never followed and no proxy (`HTTP_PROXY` …) is used, so
//!   no request leaves for a host that was not checked. The list holds names: what they
//!   resolve to is DNS's answer.
//! * An operation is appended as path segments; `..`, `.` or empty segments are refused, so
//!   a registry operation can never leave `base_url`'s path.
//! * What is known about the effect is reported honestly: a failure to connect is
//!   [`AdapterError::Unavailable`] (nothing was sent); once the request may have been sent,
//!   a lost or unreadable answer, or a server error other than 503 (a crash, a gateway that
//!   lost the answer), is [`AdapterError::Timeout`] (it may have happened); 503 and 429 say
//!   the target did not take the request ([`AdapterError::Unavailable`]).
//! * Answers are read up to [`MAX_BODY`] bytes; a larger one is unreadable.

use std::collections::BTreeSet;

use countersign_core::policy::ResourceFact;
use countersign_core::registry::Provider;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use url::Url;

use super::{AdapterError, AdapterSettings, BoxFuture, Invocation};

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

/// The error a non-2xx answer stands for.
fn status_error(status: StatusCode, body: &[u8]) -> AdapterError {
    if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
        return AdapterError::Unavailable(format!("target answered {status}"));
    }
    if status.is_server_error() {
        // The request arrived; a crash (500) or a gateway that lost the answer (502, 504)
        // leaves the effect unknown.
        tracing::info!(%status, "outbound call: server error after sending; effect unknown");
        return AdapterError::Timeout;
    }
    if status.is_redirection() {
        return AdapterError::Rejected {
            code: "http.redirect".into(),
            message: format!("the target answered {status}; redirects are not followed"),
        };
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

/// `base` with `parts` appended as path segments; `.`/`..`/empty parts are refused.
fn join<'p>(base: &Url, parts: impl IntoIterator<Item = &'p str>) -> Result<Url, AdapterError> {
    let mut url = base.clone();
    {
        let mut segments = url
            .path_segments_mut()
            .map_err(|()| AdapterError::Refused("base_url cannot take a path".into()))?;
        segments.pop_if_empty();
        for part in parts {
            if part.is_empty() || part == "." || part == ".." {
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
        Ok((status, read_body(resp).await?))
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
            return Err(status_error(status, &body));
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
                Err(status_error(status, &body))
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
            self.get_optional(url, &[(TENANT, tenant)]).await
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
            status_error(StatusCode::UNPROCESSABLE_ENTITY, body),
            AdapterError::Rejected {
                code: "insufficient_funds".into(),
                message: "no".into()
            }
        );
        assert!(matches!(
            status_error(StatusCode::CONFLICT, b"not json"),
            AdapterError::Rejected { code, .. } if code == "http.409"
        ));
        // The request arrived and the answer was lost or the target crashed: unknown.
        assert_eq!(
            status_error(StatusCode::BAD_GATEWAY, b""),
            AdapterError::Timeout
        );
        assert!(matches!(
            status_error(StatusCode::SERVICE_UNAVAILABLE, b""),
            AdapterError::Unavailable(_)
        ));
        assert!(matches!(
            status_error(StatusCode::TOO_MANY_REQUESTS, b""),
            AdapterError::Unavailable(_)
        ));
        assert!(matches!(
            status_error(StatusCode::FOUND, b""),
            AdapterError::Rejected { code, .. } if code == "http.redirect"
        ));
        assert_eq!(success_json(b"").unwrap(), json!({}));
        assert_eq!(success_json(b"garbage"), Err(AdapterError::Timeout));
    }
}
