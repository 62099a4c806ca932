//! Structured logs through `tracing`: human text or one JSON object per line.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat};

/// Installs the global subscriber. Safe to call once; later calls are ignored.
pub fn init(config: &Config) {
    // The filter was validated when the config loaded; fall back to `info` regardless.
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match config.log_format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Text => builder
            .with_target(false)
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
    };
}
