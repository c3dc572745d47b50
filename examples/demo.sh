#!/usr/bin/env bash
# The demo: Istio's default pod shutdown versus envoy-drain as the preStop hook, with a real Envoy
# on this machine. Installs Envoy 1.40.0 when missing (like the tests), builds envoy-drain, and
# replays the shutdown in a private network namespace (run as root). Extra arguments are modes:
# fixed:<seconds> or envoy-drain (default: fixed:5 envoy-drain).
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY_BIN=$(bash scripts/envoy)
export ENVOY_BIN
cargo build --release --quiet
export ENVOY_DRAIN="$PWD/target/release/envoy-drain"
cargo run --release --quiet --example demo -- "$@"
