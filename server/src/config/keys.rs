//! Every configuration key: its name (the file's key; the environment's `COUNTERSIGN_` +
//! upper case), whether it is secret, its default, and the line of help `config --help` shows.

/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "COUNTERSIGN_CONFIG";

/// The file read when neither `--config` nor `COUNTERSIGN_CONFIG` names one, if it exists.
pub const DEFAULT_CONFIG_FILE: &str = "countersign.toml";

/// One configuration key: its file name, whether its value is secret, and its help text.
#[derive(Debug, Clone, Copy)]
pub struct KeySpec {
    /// Name in the TOML file; the environment name is `COUNTERSIGN_` + uppercase.
    pub name: &'static str,
    /// Never print the value.
    pub secret: bool,
    /// Default, as text, if any.
    pub default: Option<&'static str>,
    /// One line for the README and `--help`.
    pub help: &'static str,
}

/// Every key Countersign understands.
pub const KEYS: &[KeySpec] = &[
    KeySpec {
        name: "database_url",
        secret: true,
        default: Some("sqlite://data/countersign.db"),
        help: "sqlite://PATH (embedded, zero set-up) or postgres://USER:PASS@HOST/DB",
    },
    KeySpec {
        name: "listen",
        secret: false,
        default: Some("127.0.0.1:3000"),
        help: "address and port to serve the dashboard, /mcp, /healthz and /metrics on",
    },
    KeySpec {
        name: "public_url",
        secret: false,
        default: None,
        help: "the URL people and agents reach this server at (default http://LISTEN)",
    },
    KeySpec {
        name: "allowed_origins",
        secret: false,
        default: None,
        help: "comma-separated origins browsers may call /mcp from (default: public_url's origin)",
    },
    KeySpec {
        name: "registry",
        secret: false,
        default: None,
        help: "registry YAML file or folder, loaded at start when the database holds none",
    },
    KeySpec {
        name: "workers",
        secret: false,
        default: Some("1"),
        help: "executor workers `serve` runs for planned steps (0 = none; run `countersign worker`)",
    },
    KeySpec {
        name: "escalate_unknown_after_seconds",
        secret: false,
        default: Some("600"),
        help: "an `unknown` outcome the target still cannot tell about after this long goes to the escalations page",
    },
    KeySpec {
        name: "run_max_minutes",
        secret: false,
        default: Some("1440"),
        help: "a planned run older than this stops: no further step starts",
    },
    KeySpec {
        name: "run_max_spend",
        secret: false,
        default: None,
        help: "most a planned run may move, in minor units (sum of `amount` of its steps); unset: no cap",
    },
    KeySpec {
        name: "run_max_failures",
        secret: false,
        default: Some("3"),
        help: "failed attempts in a row after which a planned run stops",
    },
    KeySpec {
        name: "webhook_urls",
        // A webhook URL is often the credential itself (Slack's incoming webhooks).
        secret: true,
        default: None,
        help: "comma-separated URLs told (JSON POST, Slack-compatible `text`) when a gate opens or a failed run leaves a write for a person to undo",
    },
    KeySpec {
        name: "log_format",
        secret: false,
        default: Some("text"),
        help: "text (human) or json (one object per line)",
    },
    KeySpec {
        name: "log_level",
        secret: false,
        default: Some("info,sqlx=warn"),
        help: "tracing filter directives, e.g. info or countersign=debug,info",
    },
    KeySpec {
        name: "audit_signing_key",
        secret: true,
        default: None,
        help: "Ed25519 seed (32 bytes, hex or base64) that signs audit checkpoints; unset: none are written",
    },
    KeySpec {
        name: "audit_checkpoint_every",
        secret: false,
        default: Some("1000"),
        help: "sign an audit checkpoint once this many records are unsigned",
    },
    KeySpec {
        name: "audit_checkpoint_minutes",
        secret: false,
        default: Some("10"),
        help: "sign an audit checkpoint once the oldest unsigned record is this many minutes old",
    },
    KeySpec {
        name: "redaction_key",
        secret: true,
        default: None,
        help: "HMAC key (at least 32 bytes of text) for redacted values; its fingerprint is audited",
    },
    KeySpec {
        name: "metrics_token",
        secret: true,
        default: None,
        help: "bearer token (at least 32 printable ASCII characters) a scraper must send to /metrics; unset: /metrics is open",
    },
    KeySpec {
        name: "site_root",
        secret: false,
        default: Some("target/site"),
        help: "folder with the built dashboard assets (pkg/*.js, *.wasm, *.css)",
    },
    KeySpec {
        name: "adapter_timeout",
        secret: false,
        default: Some("15s"),
        help: "how long an http/mcp provider call may take (e.g. 15s, 800ms); longer = unknown",
    },
    KeySpec {
        name: "agent_oauth_issuers",
        secret: false,
        default: None,
        help: "comma-separated authorization servers whose OAuth access tokens agents may present on /mcp (exactly as their tokens' iss)",
    },
    KeySpec {
        name: "agent_token_kinds",
        secret: false,
        default: None,
        help: "which agent tokens /mcp accepts: countersign, oauth or both (default: countersign, plus oauth when agent_oauth_issuers is set)",
    },
    KeySpec {
        name: "agent_oauth_scope",
        secret: false,
        default: Some("mcp:tools"),
        help: "the scope an agent's OAuth access token must grant",
    },
    KeySpec {
        name: "oidc_issuer",
        secret: false,
        default: None,
        help: "OpenID Connect issuer URL for dashboard sign-in (unset: demo sign-in on loopback only)",
    },
    KeySpec {
        name: "oidc_client_id",
        secret: false,
        default: None,
        help: "client id registered at the issuer; redirect URI is PUBLIC_URL/auth/callback",
    },
    KeySpec {
        name: "oidc_client_secret",
        secret: true,
        default: None,
        help: "client secret registered at the issuer",
    },
    KeySpec {
        name: "oidc_role_claim",
        secret: false,
        default: Some("groups"),
        help: "ID-token claim (string or list of strings) that the role map reads",
    },
    KeySpec {
        name: "oidc_role_map",
        secret: false,
        default: Some(
            "ap-clerks=approver,managers=manager,admins=admin,auditors=auditor,\
             platform-admins=admin,platform-admins=platform_admin",
        ),
        help: "comma-separated GROUP=ROLE pairs; roles: approver, manager, admin, auditor, platform_admin",
    },
    KeySpec {
        name: "oidc_tenant_claim",
        secret: false,
        default: Some("tenant"),
        help: "ID-token claim naming the person's tenant",
    },
    KeySpec {
        name: "oidc_recheck_minutes",
        secret: false,
        default: Some("5"),
        help: "re-derive a signed-in person's roles and tenant from the issuer this often (refresh token or userinfo); at most 10",
    },
    KeySpec {
        name: "session_idle_minutes",
        secret: false,
        default: Some("30"),
        help: "a dashboard session ends after this many minutes without a request",
    },
    KeySpec {
        name: "session_max_hours",
        secret: false,
        default: Some("12"),
        help: "a dashboard session ends this many hours after sign-in, active or not",
    },
    KeySpec {
        name: "demo",
        secret: false,
        default: Some("false"),
        help: "on an empty database, play the finance demo at start (scripted agents, a demo approver); `make run` turns it on",
    },
    KeySpec {
        name: "demo_sign_in",
        secret: false,
        default: Some("false"),
        help: "offer seeded demo people at /auth/demo (only with no OIDC issuer, on loopback, never through a proxy); `make run` turns it on",
    },
    KeySpec {
        name: "store_ablate",
        secret: false,
        default: None,
        help: "benchmarks only: Postgres write-path mechanisms to turn off (one_trip, one_trip_reads), to measure what each pays; every guarantee holds without them",
    },
];

pub(super) fn env_name(key: &str) -> String {
    format!("COUNTERSIGN_{}", key.to_ascii_uppercase())
}

pub(super) fn known_keys() -> String {
    KEYS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}
