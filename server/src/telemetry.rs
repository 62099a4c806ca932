//! Structured logs through `tracing`: human text or one JSON object per line.

use std::io::IsTerminal;

use tracing::{Level, Metadata};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{Config, LogFormat};

/// Installs the global subscriber. Safe to call once; later calls are ignored.
pub fn init(config: &Config) {
    // The filter was validated when the config loaded; fall back to `info` regardless.
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let verbose = asks_for_debug(&config.log_level);
    let quiet_disconnects = filter_fn(move |meta| verbose || !client_went_away(meta));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match config.log_format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .finish()
            .with(quiet_disconnects)
            .try_init(),
        LogFormat::Text => builder
            .with_target(false)
            .with_ansi(std::io::stderr().is_terminal())
            .finish()
            .with(quiet_disconnects)
            .try_init(),
    };
}

/// rmcp's session loop (`rmcp::service`) logs at ERROR when the transport refuses an answer
/// because the client closed its stream or connection first — a client's doing, not a fault
/// of the server, and on a busy gateway a flood. Such events are kept out of the log unless
/// its level asks for debug. They are told apart by their call sites, which are fixed because
/// rmcp is pinned (`=3.11.0`; re-check these lines when it moves): `service.rs` 1578 "fail to
/// response message", 1642 "fail to send rejection error", 1866 "failed to send pending
/// response during drain". Its other ERRORs (a send task that panicked, a sink that would not
/// close) stay in the log.
const CLIENT_GONE_LINES: [u32; 3] = [1578, 1642, 1866];

fn client_went_away(meta: &Metadata<'_>) -> bool {
    meta.is_event()
        && meta.target() == "rmcp::service"
        && *meta.level() == Level::ERROR
        && meta.file().is_some_and(|f| f.ends_with("service.rs"))
        && meta.line().is_some_and(|l| CLIENT_GONE_LINES.contains(&l))
}

/// Whether a log-level directive asks for debug (or trace) output anywhere.
fn asks_for_debug(level: &str) -> bool {
    let level = level.to_ascii_lowercase();
    level.contains("debug") || level.contains("trace")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_rmcp_session_errors_count_as_a_client_gone_and_debug_shows_them() {
        use tracing::callsite::Identifier;
        use tracing::field::FieldSet;
        use tracing::metadata::Kind;
        struct Site;
        impl tracing::Callsite for Site {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                unreachable!()
            }
        }
        static SITE: Site = Site;
        let meta = |target: &'static str, level: Level, line: u32| {
            Metadata::new(
                "event",
                target,
                level,
                Some("/registry/rmcp-3.11.0/src/service.rs"),
                Some(line),
                None,
                FieldSet::new(&["message"], Identifier(&SITE)),
                Kind::EVENT,
            )
        };
        assert!(client_went_away(&meta("rmcp::service", Level::ERROR, 1578)));
        assert!(client_went_away(&meta("rmcp::service", Level::ERROR, 1866)));
        // A send task that panicked (1558) is a fault: it stays.
        assert!(!client_went_away(&meta(
            "rmcp::service",
            Level::ERROR,
            1558
        )));
        assert!(!client_went_away(&meta("rmcp::service", Level::WARN, 1578)));
        assert!(!client_went_away(&meta(
            "countersign::mcp",
            Level::ERROR,
            1578
        )));
        assert!(!client_went_away(&meta(
            "rmcp::transport",
            Level::ERROR,
            1578
        )));
        assert!(asks_for_debug("info,rmcp=DEBUG"));
        assert!(!asks_for_debug("info"));
    }
}
