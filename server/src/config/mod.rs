//! Configuration: a TOML file plus `COUNTERSIGN_*` environment variables, typed and
//! validated once at start.
//!
//! Precedence: built-in defaults < the TOML file < environment variables. Every key has one
//! name in the file (`database_url`) and one in the environment (`COUNTERSIGN_DATABASE_URL`).
//! An unknown key in either place is an error, so a typo never silently falls back to a
//! default. Errors name the key and where it came from; values of secret keys are never
//! printed (they are held in [`Secret`]).

mod agent_auth;
mod keys;
mod parse;

pub use agent_auth::AgentAuth;
pub use keys::{CONFIG_ENV, DEFAULT_CONFIG_FILE, KEYS, KeySpec};
use keys::{env_name, known_keys};
use parse::parse_duration;
pub use parse::{loopback_host, parse_origin, parse_role_map, secure_or_loopback};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use countersign_core::{AppRole, Backend, Secret};
use std::sync::Arc;

use countersign_core::audit::checkpoint::CheckpointSigner;
use countersign_core::redact::RedactionKey;
use countersign_core::store::Ablations;
use url::Url;

/// Environment variables with this prefix belong to the test harness, not to the server.
const TEST_ENV_PREFIX: &str = "COUNTERSIGN_TEST_";

/// The longest a signed-in person's roles may go without being re-derived from the provider:
/// removing someone from a group takes effect within this many minutes.
pub const MAX_RECHECK_MINUTES: u32 = 10;

/// Sign-in through an OpenID Connect provider.
#[derive(Debug, Clone)]
pub struct OidcConfig {
    /// Issuer URL, exactly as the provider's discovery document states it.
    pub issuer: String,
    /// Client id.
    pub client_id: String,
    /// Client secret.
    pub client_secret: Secret<String>,
    /// Claim holding the groups the role map reads.
    pub role_claim: String,
    /// Group → role.
    pub role_map: Vec<(String, AppRole)>,
    /// Claim holding the tenant.
    pub tenant_claim: String,
    /// How often a session's roles and tenant are re-derived from the provider (1–10).
    pub recheck_minutes: u32,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Database URL; secret because it may carry a password.
    pub database_url: Secret<String>,
    /// Bind address.
    pub listen: SocketAddr,
    /// External URL, no trailing slash.
    pub public_url: Url,
    /// Origins (`scheme://host[:port]`, serialised as browsers send them) a request to
    /// `/mcp` may carry in its `Origin` header; a request without the header passes.
    pub allowed_origins: Vec<String>,
    /// Registry to load when the database has none.
    pub registry: Option<PathBuf>,
    /// Log format.
    pub log_format: LogFormat,
    /// Tracing filter.
    pub log_level: String,
    /// Built site assets.
    pub site_root: PathBuf,
    /// Executor workers inside `serve`.
    pub workers: usize,
    /// An `unknown` the target cannot tell about goes to a person after this many seconds.
    pub escalate_unknown_after_seconds: u64,
    /// Write-path mechanisms turned off (benchmarks only).
    pub store_ablations: Ablations,
    /// Play the finance demo at start when the database has no runs (`serve --demo`).
    pub demo: bool,
    /// Offer the demo sign-in (still only without an issuer, on loopback, never through a
    /// proxy). Off unless asked for; the demo (`demo`) asks for it.
    pub demo_sign_in: bool,
    /// Where gate notifications are posted (secret: a webhook URL's path is its credential).
    pub webhook_urls: Vec<Secret<Url>>,
    /// Per-run limits the executor enforces.
    pub run_bounds: RunBounds,
    /// Total time an outbound `http`/`mcp` adapter call may take (connecting included).
    pub adapter_timeout: Duration,
    /// OIDC sign-in; `None` when no issuer is configured.
    pub oidc: Option<OidcConfig>,
    /// Idle session lifetime.
    pub session_idle_minutes: u32,
    /// Absolute session lifetime.
    pub session_max_hours: u32,
    /// Signs audit checkpoints; `None`: no checkpoints are written.
    pub audit_signing_key: Option<CheckpointSigner>,
    /// Sign once this many records are unsigned (≥ 1).
    pub audit_checkpoint_every: i64,
    /// Sign once the oldest unsigned record is this many minutes old (≥ 1).
    pub audit_checkpoint_minutes: i64,
    /// The HMAC key redacted values are hashed with; `None`: a random key of the process.
    pub redaction_key: Option<Arc<RedactionKey>>,
    /// The bearer token `/metrics` requires; `None`: `/metrics` answers anyone.
    pub metrics_token: Option<Secret<String>>,
    /// How agents authenticate on `/mcp` (their tokens, OAuth access tokens, or both).
    pub agent_auth: AgentAuth,
}

/// Limits on one planned run, enforced before each of its steps starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunBounds {
    /// Wall time from the run's creation, in minutes.
    pub max_minutes: i64,
    /// Sum of the steps' `amount`, in minor units (`None`: no cap).
    pub max_spend_minor: Option<i64>,
    /// Failed attempts in a row.
    pub max_failures: usize,
}

/// Where a value came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Built-in default.
    Default,
    /// The TOML file at this path.
    File(PathBuf),
    /// An environment variable.
    Env,
}

/// A configuration problem. `Display` is the one line shown to the operator.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config file {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A key nobody knows.
    #[error("unknown configuration key {key} (in {place}); known keys: {known}")]
    UnknownKey {
        /// The key as written.
        key: String,
        /// File path or "environment".
        place: String,
        /// The known keys.
        known: String,
    },
    /// A value that does not parse or is not allowed.
    #[error("invalid {key}{shown}: {message}")]
    Invalid {
        /// `COUNTERSIGN_X` or `x in FILE`.
        key: String,
        /// ` = "value"`, or empty for secrets.
        shown: String,
        /// What is wrong and what is expected.
        message: String,
    },
}

struct Raw {
    value: String,
    source: Source,
}

impl Config {
    /// The WebAuthn relying party passkeys sign for, from `public_url` (a loopback address
    /// stands for `localhost` on the same port); `None` when passkeys cannot work there (a
    /// public URL on any other IP address).
    pub fn relying_party(&self) -> Option<countersign_core::signing::webauthn::RelyingParty> {
        countersign_core::signing::webauthn::RelyingParty::from_public_url(&self.public_url)
    }

    /// Loads from an optional file and the given environment (pass `std::env::vars()`).
    /// `file` is the `--config` flag; without it `COUNTERSIGN_CONFIG`, then
    /// `countersign.toml` if it exists, are tried.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let env: BTreeMap<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("COUNTERSIGN_"))
            .collect();

        let file = match (file, env.get(CONFIG_ENV)) {
            (Some(f), _) => Some(f.to_path_buf()),
            (None, Some(f)) => Some(PathBuf::from(f)),
            (None, None) => {
                let default = PathBuf::from(DEFAULT_CONFIG_FILE);
                default.is_file().then_some(default)
            }
        };

        let mut raw: BTreeMap<&'static str, Raw> = BTreeMap::new();
        for spec in KEYS {
            if let Some(d) = spec.default {
                raw.insert(
                    spec.name,
                    Raw {
                        value: d.to_string(),
                        source: Source::Default,
                    },
                );
            }
        }

        if let Some(path) = &file {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                path: path.clone(),
                message: e.to_string(),
            })?;
            let table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::File {
                path: path.clone(),
                message: e.message().to_string(),
            })?;
            for (key, value) in table {
                let Some(spec) = KEYS.iter().find(|s| s.name == key) else {
                    return Err(ConfigError::UnknownKey {
                        key,
                        place: path.display().to_string(),
                        known: known_keys(),
                    });
                };
                let value = match value {
                    toml::Value::String(s) => s,
                    toml::Value::Integer(i) => i.to_string(),
                    toml::Value::Boolean(b) => b.to_string(),
                    other => {
                        return Err(ConfigError::Invalid {
                            key: format!("{} in {}", spec.name, path.display()),
                            shown: String::new(),
                            message: format!("expected a string, found a {}", other.type_str()),
                        });
                    }
                };
                raw.insert(
                    spec.name,
                    Raw {
                        value,
                        source: Source::File(path.clone()),
                    },
                );
            }
        }

        for (name, value) in &env {
            if name == CONFIG_ENV || name.starts_with(TEST_ENV_PREFIX) {
                continue;
            }
            let Some(spec) = KEYS.iter().find(|s| env_name(s.name) == *name) else {
                return Err(ConfigError::UnknownKey {
                    key: name.clone(),
                    place: "environment".into(),
                    known: KEYS
                        .iter()
                        .map(|k| env_name(k.name))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            };
            raw.insert(
                spec.name,
                Raw {
                    value: value.clone(),
                    source: Source::Env,
                },
            );
        }

        Self::from_raw(&raw)
    }

    fn from_raw(raw: &BTreeMap<&'static str, Raw>) -> Result<Self, ConfigError> {
        let invalid = |name: &'static str, message: String| -> ConfigError {
            let spec = KEYS.iter().find(|s| s.name == name);
            let secret = spec.is_some_and(|s| s.secret);
            let (key, value) = match raw.get(name) {
                Some(Raw {
                    value,
                    source: Source::Env,
                }) => (env_name(name), value.as_str()),
                Some(Raw {
                    value,
                    source: Source::File(p),
                }) => (format!("{name} in {}", p.display()), value.as_str()),
                Some(Raw {
                    value,
                    source: Source::Default,
                }) => (format!("{name} (default)"), value.as_str()),
                None => (env_name(name), ""),
            };
            // A URL carrying a password is shown as nothing, whichever key it was given for.
            let has_password = Url::parse(value.trim()).is_ok_and(|u| u.password().is_some());
            let shown = if secret || has_password {
                String::new()
            } else {
                format!(" = {value:?}")
            };
            ConfigError::Invalid {
                key,
                shown,
                message,
            }
        };
        let get = |name: &str| raw.get(name).map(|r| r.value.trim().to_string());

        let database_url = get("database_url").unwrap_or_default();
        match Backend::from_url(&database_url) {
            Some(Backend::Postgres) => {
                let parsed = Url::parse(&database_url).map_err(|e| {
                    invalid("database_url", format!("malformed Postgres URL ({e})"))
                })?;
                if parsed.host_str().is_none_or(str::is_empty) {
                    return Err(invalid(
                        "database_url",
                        "the Postgres URL has no host".into(),
                    ));
                }
            }
            Some(Backend::Sqlite) => {
                let path = database_url
                    .trim_start_matches("sqlite://")
                    .trim_start_matches("sqlite:");
                if path.is_empty() {
                    return Err(invalid(
                        "database_url",
                        "the SQLite URL names no file (expected sqlite://PATH)".into(),
                    ));
                }
            }
            None => {
                return Err(invalid(
                    "database_url",
                    "unsupported database; expected sqlite://PATH or postgres://USER@HOST/DB"
                        .into(),
                ));
            }
        }

        let workers_text = get("workers").unwrap_or_default();
        let workers: usize = workers_text
            .parse()
            .ok()
            .filter(|n| *n <= 64)
            .ok_or_else(|| invalid("workers", "expected a number from 0 to 64".into()))?;

        let escalate_unknown_after_seconds: u64 = get("escalate_unknown_after_seconds")
            .unwrap_or_default()
            .parse()
            .ok()
            .filter(|n| *n <= 7 * 24 * 3600)
            .ok_or_else(|| {
                invalid(
                    "escalate_unknown_after_seconds",
                    "expected a whole number of seconds from 0 to 604800 (a week)".into(),
                )
            })?;

        let store_ablations = Ablations::parse(&get("store_ablate").unwrap_or_default())
            .map_err(|why| invalid("store_ablate", why))?;

        let demo = match get("demo").as_deref() {
            None | Some("" | "false" | "0") => false,
            Some("true" | "1") => true,
            Some(_) => return Err(invalid("demo", "expected true or false".into())),
        };
        let demo_sign_in = match get("demo_sign_in").as_deref() {
            None | Some("" | "false" | "0") => false,
            Some("true" | "1") => true,
            Some(_) => return Err(invalid("demo_sign_in", "expected true or false".into())),
        };

        let mut webhook_urls = Vec::new();
        for text in get("webhook_urls")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            let url = Url::parse(text)
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https"))
                .ok_or_else(|| invalid("webhook_urls", "an entry is not an http(s) URL".into()))?;
            webhook_urls.push(Secret::new(url));
        }

        let number = |name: &'static str| -> Result<Option<i64>, ConfigError> {
            match get(name).filter(|t| !t.is_empty()) {
                None => Ok(None),
                Some(t) => t
                    .parse::<i64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .map(Some)
                    .ok_or_else(|| invalid(name, "expected a whole number above 0".into())),
            }
        };
        let run_bounds = RunBounds {
            max_minutes: number("run_max_minutes")?.unwrap_or(1440),
            max_spend_minor: number("run_max_spend")?,
            max_failures: usize::try_from(number("run_max_failures")?.unwrap_or(3)).unwrap_or(3),
        };

        let listen_text = get("listen").unwrap_or_default();
        let listen: SocketAddr = listen_text.parse().map_err(|_| {
            invalid(
                "listen",
                "not a socket address; expected IP:PORT such as 127.0.0.1:3000".into(),
            )
        })?;

        let public_url = match get("public_url") {
            Some(text) => {
                let url = Url::parse(&text)
                    .map_err(|e| invalid("public_url", format!("not an absolute URL ({e})")))?;
                if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                    return Err(invalid(
                        "public_url",
                        "expected an http:// or https:// URL with a host".into(),
                    ));
                }
                // Served at the root: links, redirect URIs and origins are built from scheme,
                // host and port alone, and a password here would be logged and sent out.
                if !url.username().is_empty()
                    || url.password().is_some()
                    || url.path() != "/"
                    || url.query().is_some()
                    || url.fragment().is_some()
                {
                    return Err(invalid(
                        "public_url",
                        "expected scheme, host and port only (no user, path, query or fragment)"
                            .into(),
                    ));
                }
                url
            }
            None => Url::parse(&format!("http://{listen}"))
                .map_err(|e| invalid("listen", format!("cannot form a URL from it ({e})")))?,
        };

        let allowed_origins = match get("allowed_origins").filter(|s| !s.is_empty()) {
            Some(text) => text
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|entry| {
                    parse_origin(entry).ok_or_else(|| {
                        invalid(
                            "allowed_origins",
                            format!(
                                "{entry:?} is not an origin; expected http(s)://HOST[:PORT], comma-separated"
                            ),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => vec![public_url.origin().ascii_serialization()],
        };

        let registry = get("registry").filter(|s| !s.is_empty()).map(PathBuf::from);
        if let Some(path) = &registry
            && !path.exists()
        {
            return Err(invalid("registry", "no such file or folder".into()));
        }

        let log_format = match get("log_format").as_deref() {
            Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            _ => return Err(invalid("log_format", "expected text or json".into())),
        };

        let log_level = get("log_level").unwrap_or_default();
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&log_level) {
            return Err(invalid("log_level", format!("not a tracing filter ({e})")));
        }

        let site_root = PathBuf::from(get("site_root").unwrap_or_default());

        let adapter_timeout = get("adapter_timeout")
            .as_deref()
            .and_then(parse_duration)
            .filter(|d| !d.is_zero() && *d <= crate::adapters::ADAPTER_TIMEOUT)
            .ok_or_else(|| {
                invalid(
                    "adapter_timeout",
                    format!(
                        "expected a duration such as 15s or 800ms, above zero and at most {}s",
                        crate::adapters::ADAPTER_TIMEOUT.as_secs()
                    ),
                )
            })?;
        let nonempty = |name: &str| get(name).filter(|s| !s.is_empty());
        let oidc = match nonempty("oidc_issuer") {
            None => {
                for name in ["oidc_client_id", "oidc_client_secret"] {
                    if nonempty(name).is_some() {
                        return Err(invalid(
                            name,
                            "set without COUNTERSIGN_OIDC_ISSUER; set the issuer too".into(),
                        ));
                    }
                }
                None
            }
            Some(issuer) => {
                let url = Url::parse(&issuer)
                    .map_err(|e| invalid("oidc_issuer", format!("not an absolute URL ({e})")))?;
                // Plain http would carry the client secret and the code in clear and let
                // anyone on the path serve signing keys: only for a provider on this machine.
                let loopback = match url.host() {
                    Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                    Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                    Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                    None => false,
                };
                let allowed = match url.scheme() {
                    "https" => url.host().is_some(),
                    "http" => loopback,
                    _ => false,
                };
                if !allowed {
                    return Err(invalid(
                        "oidc_issuer",
                        "expected an https:// URL (http:// only for a test provider on \
                         localhost or a loopback address)"
                            .into(),
                    ));
                }
                let client_id = nonempty("oidc_client_id").ok_or_else(|| {
                    invalid(
                        "oidc_client_id",
                        "required when COUNTERSIGN_OIDC_ISSUER is set".into(),
                    )
                })?;
                let client_secret = nonempty("oidc_client_secret").ok_or_else(|| {
                    invalid(
                        "oidc_client_secret",
                        "required when COUNTERSIGN_OIDC_ISSUER is set".into(),
                    )
                })?;
                let role_claim = nonempty("oidc_role_claim")
                    .ok_or_else(|| invalid("oidc_role_claim", "must name a claim".into()))?;
                let tenant_claim = nonempty("oidc_tenant_claim")
                    .ok_or_else(|| invalid("oidc_tenant_claim", "must name a claim".into()))?;
                let role_map = parse_role_map(&get("oidc_role_map").unwrap_or_default())
                    .map_err(|m| invalid("oidc_role_map", m))?;
                let recheck_minutes = get("oidc_recheck_minutes")
                    .and_then(|t| t.parse::<u32>().ok())
                    .filter(|n| (1..=MAX_RECHECK_MINUTES).contains(n))
                    .ok_or_else(|| {
                        invalid(
                            "oidc_recheck_minutes",
                            format!(
                                "expected a whole number of minutes from 1 to {MAX_RECHECK_MINUTES}"
                            ),
                        )
                    })?;
                Some(OidcConfig {
                    issuer,
                    client_id,
                    client_secret: Secret::new(client_secret),
                    role_claim,
                    role_map,
                    tenant_claim,
                    recheck_minutes,
                })
            }
        };
        let positive = |name: &'static str| -> Result<u32, ConfigError> {
            get(name)
                .and_then(|t| t.parse::<u32>().ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| invalid(name, "expected a whole number above 0".into()))
        };
        let session_idle_minutes = positive("session_idle_minutes")?;
        let session_max_hours = positive("session_max_hours")?;
        let audit_signing_key = match raw.get("audit_signing_key").map(|r| r.value.as_str()) {
            None | Some("") => None,
            Some(text) => Some(
                CheckpointSigner::parse(text)
                    .map_err(|e| invalid("audit_signing_key", e.to_string()))?,
            ),
        };
        let positive = |name: &'static str| -> Result<i64, ConfigError> {
            get(name)
                .and_then(|t| t.parse::<i64>().ok())
                .filter(|n| *n >= 1)
                .ok_or_else(|| invalid(name, "expected a whole number of at least 1".into()))
        };
        let audit_checkpoint_every = positive("audit_checkpoint_every")?;
        let audit_checkpoint_minutes = positive("audit_checkpoint_minutes")?;
        if audit_checkpoint_minutes > 60 * 24 * 365 {
            return Err(invalid(
                "audit_checkpoint_minutes",
                "at most 525600 (one year)".into(),
            ));
        }

        let redaction_key = match get("redaction_key").as_deref() {
            None | Some("") => None,
            Some(text) => Some(Arc::new(
                RedactionKey::from_secret(Secret::new(text.as_bytes().to_vec())).map_err(|_| {
                    invalid(
                        "redaction_key",
                        format!(
                            "must be at least {} bytes",
                            countersign_core::redact::MIN_KEY_LEN
                        ),
                    )
                })?,
            )),
        };

        let metrics_token = match get("metrics_token") {
            None => None,
            Some(t) if t.is_empty() => None,
            // Printable ASCII only: anything else could never arrive in an HTTP header.
            Some(t) if t.len() < MIN_METRICS_TOKEN || !t.bytes().all(|b| b.is_ascii_graphic()) => {
                return Err(invalid(
                    "metrics_token",
                    format!(
                        "must be at least {MIN_METRICS_TOKEN} printable ASCII characters, no spaces"
                    ),
                ));
            }
            Some(t) => Some(Secret::new(t)),
        };

        let agent_auth = agent_auth::parse(
            get("agent_oauth_issuers"),
            get("agent_token_kinds"),
            get("agent_oauth_scope"),
        )
        .map_err(|(key, why)| invalid(key, why))?;

        secure_off_loopback(
            &listen,
            &public_url,
            metrics_token.is_some(),
            redaction_key.is_some(),
        )
        .map_err(|(key, why)| invalid(key, why))?;

        Ok(Self {
            database_url: Secret::new(database_url),
            listen,
            public_url,
            allowed_origins,
            registry,
            log_format,
            log_level,
            site_root,
            workers,
            escalate_unknown_after_seconds,
            store_ablations,
            demo,
            demo_sign_in,
            webhook_urls,
            run_bounds,
            adapter_timeout,
            oidc,
            session_idle_minutes,
            session_max_hours,
            audit_signing_key,
            audit_checkpoint_every,
            audit_checkpoint_minutes,
            redaction_key,
            metrics_token,
            agent_auth,
        })
    }
}

/// Secure by default where others can reach the server (`listen` beyond loopback, or a
/// public URL that is not on a loopback host — a reverse proxy in front): a
/// `metrics_token` (else `/metrics` is anyone's), a `redaction_key` (else the audit's digests
/// are keyed by a per-process key nobody can compare across restarts), and an `https://`
/// public URL unless it names a loopback host (else session cookies travel in clear). The
/// first missing one, as (key, why).
fn secure_off_loopback(
    listen: &SocketAddr,
    public_url: &Url,
    metrics_token: bool,
    redaction_key: bool,
) -> Result<(), (&'static str, String)> {
    let loopback_host = loopback_host(public_url);
    // A loopback listen address behind a reverse proxy (the public URL elsewhere) is reached
    // by others just the same.
    if listen.ip().is_loopback() && loopback_host {
        return Ok(());
    }
    let reason = format!(
        "required when others can reach the server (listen {listen}, public_url {public_url})"
    );
    if !metrics_token {
        return Err(("metrics_token", reason));
    }
    if !redaction_key {
        return Err(("redaction_key", reason));
    }
    if public_url.scheme() != "https" && !loopback_host {
        return Err((
            "public_url",
            format!(
                "must be an https:// URL when listen ({listen}) is not a loopback address (a \
                 reverse proxy terminating TLS in front of Countersign)"
            ),
        ));
    }
    Ok(())
}

/// The shortest `metrics_token` accepted.
pub const MIN_METRICS_TOKEN: usize = 32;
