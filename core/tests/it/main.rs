//! countersign-core integration tests: one binary, one module per area.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod agents;
mod approvals;
mod audit;
mod audit_time;
mod bundle;
mod canonical;
mod catalog;
mod chains;
mod keys;
mod mcp_sessions;
mod oauth_agents;
mod policy;
mod policy_tables;
mod redact;
mod registry;
mod registry_store;
mod schema_fuzz;
mod shadow;
mod signatures;
mod standing;
mod store;

use std::sync::Arc;

use chrono::DateTime;
use countersign_core::{Clock, ManualClock};

/// A manual clock at a fixed, readable instant (2026-06-11T09:42:17Z).
pub fn test_clock() -> (ManualClock, Arc<dyn Clock>) {
    let clock = ManualClock::new(DateTime::from_timestamp(1_781_170_937, 0).unwrap());
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    (clock, shared)
}
