#!/usr/bin/env bash
# The demo: a pod with an Istio sidecar is deleted with six long requests in flight, and its proxy
# shuts down four ways: Istio's default, Istio's EXIT_ON_ZERO_ACTIVE_CONNECTIONS, and envoy-drain
# as the preStop hook, without and with --then-quit. It replays this in a replica of a real Istio
# pod (network namespaces, Istio's iptables rules, Envoy and the app as different users): run it
# as root. Installs Envoy 1.40.0 and the pod's tools when missing (like the tests) and builds
# envoy-drain. Extra arguments are modes: fixed:<seconds>, exit-on-zero, envoy-drain or then-quit
# (default: all four, fixed:5).
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY_BIN=$(bash scripts/envoy)
export ENVOY_BIN
bash scripts/test-tools
cargo build --release --quiet
export ENVOY_DRAIN="$PWD/target/release/envoy-drain"
cargo run --release --quiet --example demo -- "$@"
