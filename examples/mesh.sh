#!/usr/bin/env bash
# The mesh's table: requests that fail while a pod is deleted under live traffic, through a client
# sidecar that learns of the deletion over EDS, under both of the kubelet's orderings
# (tests/support/mesh.rs). Run it as root. Installs Envoy 1.40.0 and the tools when missing (like
# the tests) and builds envoy-drain. Arguments narrow the table down (examples/mesh.rs); with none,
# every row: about 40 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY_BIN=$(bash scripts/envoy)
export ENVOY_BIN
bash scripts/test-tools
cargo build --release --quiet
export ENVOY_DRAIN="$PWD/target/release/envoy-drain"
cargo run --quiet --example mesh -- "$@"
