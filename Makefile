# Countersign — the two commands a newcomer needs: `make run` and `make test`.
# Pinned tools are installed on first use and left alone afterwards.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

CARGO_LEPTOS_VERSION := 0.3.10
WASM_BINDGEN_VERSION := 0.2.130
CARGO_BIN := $(HOME)/.cargo/bin
CHROMIUM ?= /usr/bin/chromium

# Node tools (tailwindcss for cargo-leptos, playwright) and cargo-installed tools on PATH.
export PATH := $(CURDIR)/node_modules/.bin:$(CARGO_BIN):$(PATH)
# Playwright must never download a browser: it drives Debian's Chromium.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1
# cargo-leptos compiles the server with these set; setting them for every cargo command keeps
# `cargo build/test` and `cargo leptos build` from invalidating each other's leptos builds.
export LEPTOS_OUTPUT_NAME := countersign
export LEPTOS_SITE_ROOT := target/site
export LEPTOS_SITE_PKG_DIR := pkg
export LEPTOS_SITE_ADDR := 127.0.0.1:3000
export LEPTOS_RELOAD_PORT := 3001

# Where `make run` keeps its data and which example registry it loads.
RUN_DATABASE_URL ?= sqlite://data/countersign.db
RUN_REGISTRY ?= examples/finance

.PHONY: help run build test bench reliability tools rust-tools node-tools interop-tools browser check fmt clippy layers test-rust site e2e tour clean-data

help:
	@echo "make run    build the dashboard and serve it (and /mcp) on http://localhost:3000 (= 127.0.0.1:3000) with SQLite"
	@echo "make test   everything CI runs: fmt, clippy, cargo tests (SQLite + Postgres), Playwright"
	@echo "make layers the import-cycle check alone (also part of make test), and each crate's floors"
	@echo "make build  release binary target/release/countersign and site target/site"
	@echo "make tour   run the browser suite and copy its page screenshots into docs/img (docs/tour.md)"
	@echo "make bench  every benchmark (Postgres needed), each next to its baseline; writes docs/benchmarks.md"
	@echo "make reliability  scenarios + fault tests repeated, a soak with workers killed (Postgres); writes docs/reliability.md"

## Tools ---------------------------------------------------------------------------------------

tools: rust-tools node-tools interop-tools

rust-tools:
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown \
	  || rustup target add wasm32-unknown-unknown
	@cargo leptos --version 2>/dev/null | grep -qx "cargo-leptos $(CARGO_LEPTOS_VERSION)" \
	  || cargo install cargo-leptos --version $(CARGO_LEPTOS_VERSION) --locked --features no_downloads
	@# wasm-bindgen-cli is installed without --locked: its lockfile pins a crate the registry no longer serves.
	@wasm-bindgen --version 2>/dev/null | grep -qx "wasm-bindgen $(WASM_BINDGEN_VERSION)" \
	  || cargo install wasm-bindgen-cli --version $(WASM_BINDGEN_VERSION)

node-tools: node_modules/.package-lock.json

node_modules/.package-lock.json: package.json package-lock.json
	@npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# The official MCP Python SDK for the interop tests, in its own venv (the TypeScript SDK is a
# devDependency in package.json). Rebuilt only when the pins change.
INTEROP_VENV := $(CURDIR)/.venv-interop
interop-tools: $(INTEROP_VENV)/.installed

$(INTEROP_VENV)/.installed: interop/python/requirements.txt
	@python3 -m venv $(INTEROP_VENV)
	@$(INTEROP_VENV)/bin/pip install --quiet --disable-pip-version-check -r $<
	@touch $@

browser:
	@if [ ! -x "$(CHROMIUM)" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's chromium for the browser tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "error: $(CHROMIUM) is missing; install Debian's chromium package (or set CHROMIUM=...)" >&2; exit 1; \
	  fi; \
	fi

## Run and build -------------------------------------------------------------------------------

site: tools
	cargo leptos build

run: site
	COUNTERSIGN_DATABASE_URL=$(RUN_DATABASE_URL) COUNTERSIGN_REGISTRY=$(RUN_REGISTRY) \
	  COUNTERSIGN_DEMO_SIGN_IN=true ./target/debug/countersign serve --demo

build: tools
	cargo leptos build --release
	@echo "built target/release/countersign and target/site"

clean-data:
	rm -rf data

## Tests ---------------------------------------------------------------------------------------

fmt:
	cargo fmt --all -- --check

layers:
	cargo test -p countersign-layers -- --include-ignored

clippy:
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p countersign-app --lib --target wasm32-unknown-unknown --no-default-features --features hydrate -- -D warnings

# The interop tests (server/tests/it/interop.rs) run the official MCP SDKs' clients: the
# Python one from the venv above, the TypeScript one from node_modules.
test-rust: node-tools interop-tools
	COUNTERSIGN_TEST_PYTHON=$(INTEROP_VENV)/bin/python cargo test --workspace

e2e: site browser
	cd end2end && CHROMIUM=$(CHROMIUM) npx playwright test

# The screenshots of docs/tour.md, regenerated from the browser suite's own pages.
TOUR_SHOTS = inbox-list inbox-detail passkeys passkey-gate inbox-batch inbox-batch-result runs run-timeline audit advisor proposal-preview escalations
tour: e2e
	mkdir -p docs/img
	for s in $(TOUR_SHOTS); do cp end2end/test-results/screenshots/$$s.png docs/img/$$s.png; done

test: tools fmt clippy test-rust e2e

## Benchmarks --------------------------------------------------------------------------------

# Every benchmark with its in-run baseline (gateway load, executor, policy decision, audit
# verification) on the local Postgres; writes docs/benchmarks.md.
bench:
	./scripts/bench.sh

## Reliability -------------------------------------------------------------------------------

# Every scenario and fault test repeated on both backends, then a soak on Postgres with worker
# processes killed (SIGKILL) every 30 s; writes docs/reliability.md. RELIABILITY_SOAK_MINUTES
# (default 10) shortens it.
reliability:
	./scripts/reliability.sh
