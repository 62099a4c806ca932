#!/usr/bin/env bash
# Regenerates docs/reliability.md (generated: do not edit it by hand; run `make reliability`).
# Plays every scenario file and fault test repeatedly on SQLite and Postgres, then soaks a
# Postgres deployment (one `countersign serve`, `countersign worker` processes killed with
# SIGKILL at random) and counts effects, losses, duplicates and unreconciled unknowns from the
# database and the demo targets. The harness is the ignored test
# `reliability::reliability_report` in server/tests/it/reliability.rs.
#
# Settings (environment):
#   RELIABILITY_SOAK_MINUTES     soak length (default 10)
#   RELIABILITY_KILL_EVERY_SECS  a random worker is killed this often (default 30)
#   RELIABILITY_REPEAT           plays of each scenario / fault test per backend (default 3)
#   RELIABILITY_AGENTS           concurrent scripted agents in the soak (default 4)
#   RELIABILITY_READERS          concurrent short-lived reading agents in the soak (default 2)
#   RELIABILITY_TARGET_LATENCY_MS  how long the demo ERP's writes take in the soak, half
#                                before the effect and half after (default 2000), so kills
#                                land mid-call
#   RELIABILITY_RACE_STEPS       steps in the many-workers race (default 400)
#   RELIABILITY_REPLICA_AGENTS   scripted agents in each replica-kill play (default 8)
#   RELIABILITY_REPLICA_CALLS    writes per agent in each replica-kill play (default 50)
#   RELIABILITY_REPLICA_LATENCY_MS  how long each of those writes takes at the target (400)
#   RELIABILITY_CONCURRENT       1: play the scenarios and fault tests while the soak runs
#                                (default 0: after it)
#   COUNTERSIGN_TEST_POSTGRES_URL  (default postgres://postgres@127.0.0.1:5432/postgres)
set -euo pipefail
cd "$(dirname "$0")/.."

export RELIABILITY_DATE=${RELIABILITY_DATE:-$(date -u +%Y-%m-%dT%H:%MZ)}
export RELIABILITY_HOST=${RELIABILITY_HOST:-"$(uname -sm), $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"}
export RELIABILITY_COMMIT=${RELIABILITY_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export RELIABILITY_OUT=${RELIABILITY_OUT:-$PWD/docs/reliability.md}

# `cargo test` builds the `countersign` binary the harness starts (serve, worker) itself.
# `--workspace --test it` (not `-p countersign`) resolves features as `make test` does, so a
# tree built by `make test` is reused instead of rebuilt; core's `it` has no such test.
echo "reliability: soak ${RELIABILITY_SOAK_MINUTES:-10} min; output $RELIABILITY_OUT" >&2
cargo test --workspace --test it -- --ignored --exact reliability::reliability_report --nocapture
