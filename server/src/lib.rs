//! The `countersign` server: configuration, the HTTP surface (dashboard, `/healthz`, `/mcp`,
//! and later `/metrics`), and process start-up.
//!
//! [`Application::build`] does everything that can fail at start (connect, migrate, bind)
//! so that a bad deployment stops with one clear line before serving anything.

pub mod adapters;
pub mod audit;
pub mod auth;
pub mod compensation;
pub mod config;
pub mod demo;
pub mod escalations;
pub mod executor;
pub mod http;
pub mod mcp;
pub mod metrics;
pub mod notify;
pub mod oauth;
pub mod pipeline;
pub mod preview;
pub mod provenance;
pub mod registry;
pub mod revalidate;
pub mod runs;
pub mod scenario;
pub mod standing;
pub mod state;
pub mod stop;
pub mod telemetry;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::ListenerExt;
use countersign_core::Clock;
use countersign_core::audit::checkpoint::CheckpointPolicy;
use countersign_core::redact::RedactionKey;
use leptos::config::LeptosOptions;
use tokio::net::TcpListener;

pub use config::Config;
pub use registry::LiveRegistry;
pub use state::{AppParts, AppState, StartError, connect_and_migrate};

/// How often a server checks the database for a new registry version.
pub const REGISTRY_POLL: std::time::Duration = std::time::Duration::from_secs(2);
/// How long connections may take to finish once shutdown is signalled.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// [`AppParts::shown_key`]: derived from the configured key (its own label), else a fresh
/// random one.
fn shown_key(configured: Option<&Arc<RedactionKey>>) -> Result<Arc<RedactionKey>, StartError> {
    match configured {
        Some(key) => key
            .for_agents()
            .map(Arc::new)
            .map_err(|e| StartError::Random(e.to_string())),
        None => RedactionKey::random()
            .map(Arc::new)
            .map_err(StartError::Random),
    }
}

/// A bound, ready-to-run server.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    state: AppState,
    /// Moves the clock while the demo plays its history (`serve --demo` on an empty database).
    clock_hand: Option<Arc<dyn demo::ClockHand>>,
}

/// The state a process without HTTP (`countersign worker`, `countersign stop`) works with:
/// connected, migrated, with the registry in force.
pub async fn headless_state(config: Config, clock: Arc<dyn Clock>) -> Result<AppState, StartError> {
    let store = connect_and_migrate(&config, clock).await?;
    let registry = LiveRegistry::bootstrap(
        &store,
        config.registry.as_deref(),
        crate::adapters::AdapterSettings::with_timeout(config.adapter_timeout),
    )
    .await?;
    let auth = Arc::new(auth::Auth::new(&config, store.clone())?);
    let leptos = LeptosOptions::builder()
        .output_name("countersign")
        .site_root(config.site_root.display().to_string())
        .build();
    let redaction = config.redaction_key.clone();
    let shown_key = shown_key(redaction.as_ref())?;
    Ok(AppState::new(AppParts {
        store,
        leptos,
        config: Arc::new(config),
        registry,
        metrics: Arc::default(),
        auth,
        redaction,
        shown_key,
        shutdown: tokio_util::sync::CancellationToken::new(),
    }))
}

impl Application {
    /// Connects, migrates and binds. Nothing is served until [`Application::run`].
    pub async fn build(mut config: Config, clock: Arc<dyn Clock>) -> Result<Self, StartError> {
        let store = connect_and_migrate(&config, clock).await?;
        let registry = LiveRegistry::bootstrap(
            &store,
            config.registry.as_deref(),
            crate::adapters::AdapterSettings::with_timeout(config.adapter_timeout),
        )
        .await?;
        // (Beyond loopback the configuration already required a redaction key and a metrics
        // token: `config::secure_off_loopback`.)
        if let Some(key) = &config.redaction_key {
            audit::record_redaction_key(&store, key).await?;
        }
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| StartError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(StartError::Serve)?;
        // A public URL with port 0 (the default when listening on port 0) means the port
        // actually bound: redirect URIs and the CSRF origin must name a reachable address.
        if config.public_url.port() == Some(0) {
            let _ = config.public_url.set_port(Some(addr.port()));
        }
        let auth = Arc::new(auth::Auth::new(&config, store.clone())?);
        if let auth::Mode::Oidc(oidc) = &auth.mode {
            oidc.warm_up().await;
        }
        let leptos = LeptosOptions::builder()
            .output_name("countersign")
            .site_root(config.site_root.display().to_string())
            .site_pkg_dir("pkg")
            .site_addr(addr)
            .build();
        let redaction = config.redaction_key.clone();
        let shown_key = shown_key(redaction.as_ref())?;
        let state = AppState::new(AppParts {
            store,
            leptos,
            config: Arc::new(config),
            registry,
            metrics: Arc::default(),
            auth,
            redaction,
            shown_key,
            shutdown: tokio_util::sync::CancellationToken::new(),
        });
        let router = http::router(state.clone());
        Ok(Self {
            listener,
            router,
            state,
            clock_hand: None,
        })
    }

    /// The hand the demo moves the server's clock with while it plays its history (the one
    /// [`Application::build`] was given): without one, the demo plays everything today.
    pub fn with_clock_hand(mut self, hand: Arc<dyn demo::ClockHand>) -> Self {
        self.clock_hand = Some(hand);
        self
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, std::io::Error> {
        self.listener.local_addr()
    }

    /// The shared state (tests use its store).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` resolves.
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartError> {
        tracing::info!(
            addr = %self.listener.local_addr().map_err(StartError::Serve)?,
            backend = self.state.store.backend().as_str(),
            public_url = %self.state.config.public_url,
            "countersign serving"
        );
        let watcher = self
            .state
            .registry
            .spawn_watcher(self.state.store.clone(), REGISTRY_POLL);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let background = spawn_background(
            &self.state,
            self.state.config.workers,
            executor::Timings {
                escalate_unknown_after: std::time::Duration::from_secs(
                    self.state.config.escalate_unknown_after_seconds,
                ),
                ..executor::Timings::default()
            },
            stop_rx,
        );
        let checkpointer = match &self.state.config.audit_signing_key {
            Some(signer) => Some(audit::spawn_checkpointer(
                self.state.store.clone(),
                signer.clone(),
                CheckpointPolicy {
                    every: self.state.config.audit_checkpoint_every,
                    max_age_ms: self.state.config.audit_checkpoint_minutes * 60_000,
                },
                audit::CHECKPOINT_POLL,
            )),
            None => {
                tracing::warn!(
                    "audit_signing_key is not set: no signed audit checkpoints are written, so a \
                     rewritten-and-rehashed or truncated audit tail cannot be detected"
                );
                None
            }
        };
        let sweeper = tokio::spawn(sweep_sessions(self.state.store.clone()));
        let demo = if self.state.config.demo {
            let addr = self.listener.local_addr().map_err(StartError::Serve)?;
            let host = if addr.ip().is_unspecified() {
                std::net::IpAddr::from([127, 0, 0, 1])
            } else {
                addr.ip()
            };
            let url = format!("http://{}", SocketAddr::new(host, addr.port()));
            let origin = self.state.config.public_url.origin().ascii_serialization();
            Some(tokio::spawn(demo::seed_when_up(
                self.state.store.clone(),
                url,
                Some(origin),
                self.clock_hand.clone(),
            )))
        } else {
            None
        };
        // On the signal: workers stop claiming at once, MCP sessions end (their SSE streams
        // would hold the drain open for good), and connections get SHUTDOWN_GRACE to finish.
        let (signaled_tx, mut signaled) = tokio::sync::watch::channel(false);
        let (token, workers) = (self.state.shutdown.clone(), stop_tx.clone());
        let signal = async move {
            shutdown.await;
            let _ = workers.send(true);
            token.cancel();
            let _ = signaled_tx.send(true);
        };
        let serving = axum::serve(without_nagle(self.listener), self.router)
            .with_graceful_shutdown(signal)
            .into_future();
        let served = tokio::select! {
            served = serving => served,
            () = async {
                let _ = signaled.wait_for(|s| *s).await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } => {
                tracing::warn!("connections still open after the shutdown grace; closing them");
                Ok(())
            }
        };
        watcher.abort();
        sweeper.abort();
        if let Some(d) = demo {
            d.abort();
        }
        let _ = stop_tx.send(true);
        for task in background {
            let _ = task.await;
        }
        if let Some(c) = checkpointer {
            c.abort();
            // The records written since the last checkpoint are signed before the process
            // goes: a tail cut while it was down is then still detected.
            if let Some(signer) = &self.state.config.audit_signing_key {
                match self.state.store.checkpoint_audit(signer, None).await {
                    Ok(Some(th)) => {
                        tracing::info!(number = th.number(), "final audit checkpoint signed")
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "final audit checkpoint failed"),
                }
            }
        }
        served.map_err(StartError::Serve)?;
        self.state.store.close().await;
        Ok(())
    }
}

/// Every ten minutes, deletes the browser sessions that have expired: unfinished sign-ins and
/// sessions nobody signed out of would otherwise stay in the table for good.
async fn sweep_sessions(store: countersign_core::Store) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(600));
    loop {
        every.tick().await;
        match store.session_delete_expired().await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(deleted = n, "expired sessions deleted"),
            Err(e) => tracing::warn!(error = %e, "deleting expired sessions failed; retried later"),
        }
    }
}

/// Starts `workers` executor workers and the reconciler; they stop when `stop` turns true.
pub fn spawn_background(
    state: &AppState,
    workers: usize,
    timings: executor::Timings,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".into());
    let pid = std::process::id();
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = (0..workers)
        .map(|i| {
            tokio::spawn(executor::worker(
                state.clone(),
                format!("{host}:{pid}:{i}"),
                timings,
                stop.clone(),
            ))
        })
        .collect();
    tasks.push(tokio::spawn(executor::reconciler(
        state.clone(),
        timings,
        stop,
    )));
    tasks
}

/// `listener` with `TCP_NODELAY` set on every connection it accepts. With Nagle's algorithm
/// on, a response written in two pieces (an MCP answer's SSE event after its headers) waits
/// for the client's delayed ACK, about 40 ms on Linux, on every call.
fn without_nagle(
    listener: TcpListener,
) -> axum::serve::TapIo<TcpListener, fn(&mut tokio::net::TcpStream)> {
    fn no_delay(tcp: &mut tokio::net::TcpStream) {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY on a connection");
        }
    }
    listener.tap_io(no_delay)
}

#[cfg(test)]
mod nagle_tests {
    use axum::serve::Listener;

    #[tokio::test]
    async fn accepted_connections_send_without_waiting_for_acks() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut listener = super::without_nagle(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (stream, _) = listener.accept().await;
        assert!(
            stream.nodelay().unwrap(),
            "TCP_NODELAY is set on the accepted socket"
        );
    }
}
