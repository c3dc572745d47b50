#!/usr/bin/env bash
# The demo: a pod with an Istio sidecar is deleted while a client keeps calling its service and
# three long requests are in flight at it, and its proxy shuts down four ways: Istio's default,
# Istio's EXIT_ON_ZERO_ACTIVE_CONNECTIONS, and envoy-drain as the injection template sets it up,
# without and with --then-quit. It replays this in a replica of a real mesh (network namespaces,
# Istio's iptables rules, Envoy and the apps as different users, a client sidecar fed over EDS,
# hey as the client): run it as root. Installs Envoy 1.40.0 and the tools when missing (like the
# tests) and builds envoy-drain. Extra arguments are modes: istio, exit-on-zero, envoy-drain,
# requests or then-quit (default: all but requests).
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY_BIN=$(bash scripts/envoy)
export ENVOY_BIN
bash scripts/test-tools
cargo build --release --quiet
export ENVOY_DRAIN="$PWD/target/release/envoy-drain"
cargo run --release --quiet --example demo -- "$@"
