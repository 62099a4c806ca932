use std::io::Write;

use countersign::config::{Config, ConfigError, LogFormat};

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn temp_file(contents: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cs-config-{}", uuid_like()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("countersign.toml");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(contents.as_bytes())
        .unwrap();
    path
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

#[test]
fn defaults_are_the_embedded_sqlite_on_loopback() {
    let c = Config::load(Some(&temp_file("")), env(&[])).unwrap();
    assert_eq!(c.database_url.expose(), "sqlite://data/countersign.db");
    assert_eq!(c.listen.to_string(), "127.0.0.1:3000");
    assert_eq!(c.public_url.as_str(), "http://127.0.0.1:3000/");
    assert_eq!(c.log_format, LogFormat::Text);
    assert!(c.registry.is_none());
}

#[test]
fn environment_overrides_the_file_which_overrides_defaults() {
    let file = temp_file("listen = \"127.0.0.1:4000\"\nlog_format = \"json\"\n");
    let c = Config::load(Some(&file), env(&[])).unwrap();
    assert_eq!(c.listen.port(), 4000);
    assert_eq!(c.log_format, LogFormat::Json);
    let c = Config::load(
        Some(&file),
        env(&[
            ("COUNTERSIGN_LISTEN", "0.0.0.0:5000"),
            ("COUNTERSIGN_PUBLIC_URL", "https://countersign.example.com"),
            ("COUNTERSIGN_METRICS_TOKEN", METRICS_TOKEN),
            ("COUNTERSIGN_REDACTION_KEY", REDACTION_KEY),
        ]),
    )
    .unwrap();
    assert_eq!(c.listen.port(), 5000);
    assert_eq!(c.public_url.as_str(), "https://countersign.example.com/");
}

/// The benchmarks' ablation key: off by default, names only known mechanisms.
#[test]
fn store_ablations_are_off_unless_named_and_unknown_ones_stop_the_start() {
    use countersign_core::store::Ablations;
    let c = Config::load(Some(&temp_file("")), env(&[])).unwrap();
    assert_eq!(c.store_ablations, Ablations::default());
    let c = Config::load(
        Some(&temp_file("")),
        env(&[("COUNTERSIGN_STORE_ABLATE", "one_trip")]),
    )
    .unwrap();
    assert!(c.store_ablations.no_one_trip);
    // A mechanism that was removed (issue 34) is an unknown name now.
    let msg = Config::load(
        Some(&temp_file("")),
        env(&[("COUNTERSIGN_STORE_ABLATE", "pipeline")]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("COUNTERSIGN_STORE_ABLATE") && msg.contains("pipeline"),
        "{msg}"
    );
}

const METRICS_TOKEN: &str = "metrics-token-of-thirty-two-chars-x";
const REDACTION_KEY: &str = "a-redaction-key-of-at-least-32-bytes!";

#[test]
fn listening_beyond_loopback_needs_a_metrics_token_a_redaction_key_and_https() {
    let full = [
        ("COUNTERSIGN_LISTEN", "0.0.0.0:5000"),
        ("COUNTERSIGN_PUBLIC_URL", "https://countersign.example.com"),
        ("COUNTERSIGN_METRICS_TOKEN", METRICS_TOKEN),
        ("COUNTERSIGN_REDACTION_KEY", REDACTION_KEY),
    ];
    assert!(Config::load(Some(&temp_file("")), env(&full)).is_ok());
    // Each one left out stops the start, naming its key, in one line.
    for (missing, key) in [
        ("COUNTERSIGN_METRICS_TOKEN", "COUNTERSIGN_METRICS_TOKEN"),
        ("COUNTERSIGN_REDACTION_KEY", "COUNTERSIGN_REDACTION_KEY"),
        ("COUNTERSIGN_PUBLIC_URL", "COUNTERSIGN_PUBLIC_URL"),
    ] {
        let vars: Vec<(&str, &str)> = full
            .iter()
            .copied()
            .filter(|(k, _)| *k != missing)
            .collect();
        let msg = Config::load(Some(&temp_file("")), env(&vars))
            .unwrap_err()
            .to_string();
        assert!(msg.contains(key), "{missing}: {msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
    }
    let plain = full
        .iter()
        .map(|&(k, v)| {
            if k == "COUNTERSIGN_PUBLIC_URL" {
                (k, "http://countersign.example.com")
            } else {
                (k, v)
            }
        })
        .collect::<Vec<_>>();
    let msg = Config::load(Some(&temp_file("")), env(&plain))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("https://"), "{msg}");
    // A loopback listen address behind a reverse proxy (the public URL elsewhere) needs them
    // too.
    let msg = Config::load(
        Some(&temp_file("")),
        env(&[
            ("COUNTERSIGN_LISTEN", "127.0.0.1:5000"),
            ("COUNTERSIGN_PUBLIC_URL", "https://countersign.example.com"),
        ]),
    )
    .unwrap_err()
    .to_string();
    assert!(msg.contains("COUNTERSIGN_METRICS_TOKEN"), "{msg}");
    // On loopback none of them is needed.
    assert!(
        Config::load(
            Some(&temp_file("")),
            env(&[("COUNTERSIGN_LISTEN", "127.0.0.1:5000")])
        )
        .is_ok()
    );
}

#[test]
fn unknown_keys_are_refused_by_name_in_file_and_environment() {
    let err = Config::load(Some(&temp_file("databse_url = \"x\"\n")), env(&[])).unwrap_err();
    assert!(matches!(err, ConfigError::UnknownKey { .. }));
    assert!(err.to_string().contains("databse_url"), "{err}");

    let err = Config::load(
        Some(&temp_file("")),
        env(&[("COUNTERSIGN_LISTN", "127.0.0.1:1")]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("COUNTERSIGN_LISTN"), "{err}");

    // The test harness' own variables are not server configuration.
    Config::load(
        Some(&temp_file("")),
        env(&[("COUNTERSIGN_TEST_POSTGRES_URL", "postgres://x@y/z")]),
    )
    .unwrap();
}

#[test]
fn bad_values_name_the_key_and_source() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("COUNTERSIGN_LISTEN", "localhost")], "COUNTERSIGN_LISTEN"),
        (
            &[("COUNTERSIGN_DATABASE_URL", "mysql://db/x")],
            "COUNTERSIGN_DATABASE_URL",
        ),
        (
            &[("COUNTERSIGN_DATABASE_URL", "postgres://")],
            "COUNTERSIGN_DATABASE_URL",
        ),
        (
            &[("COUNTERSIGN_DATABASE_URL", "sqlite://")],
            "COUNTERSIGN_DATABASE_URL",
        ),
        (
            &[("COUNTERSIGN_PUBLIC_URL", "countersign.example.com")],
            "COUNTERSIGN_PUBLIC_URL",
        ),
        (
            &[("COUNTERSIGN_PUBLIC_URL", "ftp://x.example.com")],
            "COUNTERSIGN_PUBLIC_URL",
        ),
        (
            &[("COUNTERSIGN_PUBLIC_URL", "https://admin:pw@cs.example.com")],
            "COUNTERSIGN_PUBLIC_URL",
        ),
        (
            &[(
                "COUNTERSIGN_PUBLIC_URL",
                "https://cs.example.com/countersign",
            )],
            "COUNTERSIGN_PUBLIC_URL",
        ),
        (
            &[("COUNTERSIGN_PUBLIC_URL", "https://cs.example.com/?x=1")],
            "COUNTERSIGN_PUBLIC_URL",
        ),
        (
            &[("COUNTERSIGN_LOG_FORMAT", "xml")],
            "COUNTERSIGN_LOG_FORMAT",
        ),
        (
            &[("COUNTERSIGN_LOG_LEVEL", "info,,=[")],
            "COUNTERSIGN_LOG_LEVEL",
        ),
        (
            &[("COUNTERSIGN_REGISTRY", "/no/such/registry.yaml")],
            "COUNTERSIGN_REGISTRY",
        ),
        // A metrics token short enough to guess is refused (its value is not echoed).
        (
            &[("COUNTERSIGN_METRICS_TOKEN", "too-short-to-be-a-token")],
            "COUNTERSIGN_METRICS_TOKEN",
        ),
        // …and so is one no HTTP header could carry as sent.
        (
            &[(
                "COUNTERSIGN_METRICS_TOKEN",
                "jeton-de-métriques-0123456789abcdef",
            )],
            "COUNTERSIGN_METRICS_TOKEN",
        ),
        (
            &[(
                "COUNTERSIGN_METRICS_TOKEN",
                "two words 0123456789abcdef0123456789",
            )],
            "COUNTERSIGN_METRICS_TOKEN",
        ),
        // Plain http only for a provider on this machine.
        (
            &[
                ("COUNTERSIGN_OIDC_ISSUER", "http://idp.example.com"),
                ("COUNTERSIGN_OIDC_CLIENT_ID", "c"),
                ("COUNTERSIGN_OIDC_CLIENT_SECRET", "s"),
            ],
            "COUNTERSIGN_OIDC_ISSUER",
        ),
        (
            &[
                ("COUNTERSIGN_OIDC_ISSUER", "http://10.0.0.5:8080"),
                ("COUNTERSIGN_OIDC_CLIENT_ID", "c"),
                ("COUNTERSIGN_OIDC_CLIENT_SECRET", "s"),
            ],
            "COUNTERSIGN_OIDC_ISSUER",
        ),
    ];
    for (vars, key) in cases {
        let err = Config::load(Some(&temp_file("")), env(vars)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(key), "{vars:?}: {msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
    }
    let file = temp_file("listen = \"nope\"\n");
    let msg = Config::load(Some(&file), env(&[])).unwrap_err().to_string();
    assert!(
        msg.contains("listen in") && msg.contains("countersign.toml"),
        "{msg}"
    );

    let msg = Config::load(Some(&temp_file("listen = [1, 2]\n")), env(&[]))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("listen"), "{msg}");

    let msg = Config::load(Some(&temp_file("this is = not toml")), env(&[]))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("config file"), "{msg}");
}

#[test]
fn secrets_never_appear_in_errors_or_debug_output() {
    let err = Config::load(
        Some(&temp_file("")),
        env(&[("COUNTERSIGN_DATABASE_URL", "mysql://admin:hunter2@db/x")]),
    )
    .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
    // Nor a password put into a URL that is not itself secret.
    let err = Config::load(
        Some(&temp_file("")),
        env(&[(
            "COUNTERSIGN_PUBLIC_URL",
            "https://admin:hunter2@cs.example.com",
        )]),
    )
    .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");

    let c = Config::load(
        Some(&temp_file("")),
        env(&[("COUNTERSIGN_DATABASE_URL", "postgres://admin:hunter2@db/x")]),
    )
    .unwrap();
    assert!(!format!("{c:?}").contains("hunter2"));

    // A webhook URL's path is its credential: never printed with the configuration.
    let c = Config::load(
        Some(&temp_file("")),
        env(&[(
            "COUNTERSIGN_WEBHOOK_URLS",
            "https://hooks.example.com/services/T0/B0/xoxb-secret-path",
        )]),
    )
    .unwrap();
    assert_eq!(c.webhook_urls.len(), 1);
    assert!(!format!("{c:?}").contains("xoxb-secret-path"));

    let token = "metrics-scrape-token-0123456789abcdef";
    let c = Config::load(
        Some(&temp_file("")),
        env(&[("COUNTERSIGN_METRICS_TOKEN", token)]),
    )
    .unwrap();
    assert_eq!(
        c.metrics_token.as_ref().map(|t| t.expose().as_str()),
        Some(token)
    );
    assert!(!format!("{c:?}").contains(token));
    let err = Config::load(
        Some(&temp_file("")),
        env(&[("COUNTERSIGN_METRICS_TOKEN", "short-secret-7")]),
    )
    .unwrap_err();
    assert!(!err.to_string().contains("short-secret-7"), "{err}");
}

#[test]
fn a_missing_config_file_named_explicitly_is_an_error() {
    let err = Config::load(
        Some(std::path::Path::new("/no/such/countersign.toml")),
        env(&[]),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("/no/such/countersign.toml"),
        "{err}"
    );
    let err = Config::load(None, env(&[("COUNTERSIGN_CONFIG", "/no/such/cs.toml")])).unwrap_err();
    assert!(err.to_string().contains("/no/such/cs.toml"), "{err}");
}

#[test]
fn allowed_origins_default_to_the_public_urls_origin_and_are_normalised() {
    let c = Config::load(Some(&temp_file("")), env(&[])).unwrap();
    assert_eq!(c.allowed_origins, vec!["http://127.0.0.1:3000".to_string()]);
    let c = Config::load(
        Some(&temp_file("")),
        env(&[
            ("COUNTERSIGN_PUBLIC_URL", "https://countersign.example.com/"),
            ("COUNTERSIGN_METRICS_TOKEN", METRICS_TOKEN),
            ("COUNTERSIGN_REDACTION_KEY", REDACTION_KEY),
            (
                "COUNTERSIGN_ALLOWED_ORIGINS",
                " https://Agents.Example:443 , http://localhost:8080 ",
            ),
        ]),
    )
    .unwrap();
    assert_eq!(
        c.allowed_origins,
        vec![
            "https://agents.example".to_string(),
            "http://localhost:8080".to_string()
        ]
    );
    let c = Config::load(
        Some(&temp_file("")),
        env(&[
            (
                "COUNTERSIGN_PUBLIC_URL",
                "https://countersign.example.com:443",
            ),
            ("COUNTERSIGN_METRICS_TOKEN", METRICS_TOKEN),
            ("COUNTERSIGN_REDACTION_KEY", REDACTION_KEY),
        ]),
    )
    .unwrap();
    assert_eq!(
        c.allowed_origins,
        vec!["https://countersign.example.com".to_string()]
    );
    for bad in [
        "agents.example",
        "ftp://agents.example",
        "https://agents.example/path",
    ] {
        let e = Config::load(
            Some(&temp_file("")),
            env(&[("COUNTERSIGN_ALLOWED_ORIGINS", bad)]),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("COUNTERSIGN_ALLOWED_ORIGINS"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn adapter_timeout_is_a_bounded_duration() {
    let c = Config::load(Some(&temp_file("")), env(&[])).unwrap();
    assert_eq!(c.adapter_timeout, std::time::Duration::from_secs(15));
    let c = Config::load(Some(&temp_file("adapter_timeout = \"800ms\"\n")), env(&[])).unwrap();
    assert_eq!(c.adapter_timeout, std::time::Duration::from_millis(800));
    for bad in ["0s", "21s", "fast", "10", "-1s", "1.5s"] {
        let err = Config::load(
            Some(&temp_file("")),
            env(&[("COUNTERSIGN_ADAPTER_TIMEOUT", bad)]),
        )
        .unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { key, .. } if key == "COUNTERSIGN_ADAPTER_TIMEOUT"),
            "{bad}: {err}"
        );
    }
}
