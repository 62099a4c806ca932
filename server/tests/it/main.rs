//! countersign (server) integration tests: one binary, one module per area.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod audit;
mod cli;
mod config;
mod dashboard;
mod health;
mod helpers;
mod mcp;
mod registry;
