//! countersign (server) integration tests: one binary, one module per area.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod adapters;
mod admin;
mod advisor;
mod approvals;
mod audit;
mod auth;
mod batch;
mod budget;
mod cli;
mod config;
mod dashboard;
mod duties;
mod escalations;
mod gateway;
mod health;
mod helpers;
mod inbox;
mod inbox_batch;
mod interop;
mod mcp;
mod modern;
mod names;
mod oauth;
mod passkeys;
mod preview;
mod registry;
mod reliability;
mod replicas;
mod runs;
mod scenarios;
mod sessions;
mod stillon;
mod tenancy;
mod views;
