#!/usr/bin/env bash
# The rollout table (examples/rollout.rs): `kubectl rollout restart` of three pods under load on
# a real node, every data plane x app shutdown x clients. Run it as root. Installs the tools and
# builds the components, ztunnel and Envoy when missing (like the tests) and the release binary the
# node's image holds. With no arguments, every row: about 25 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/test-tools
ENVOY_DRAIN_COMPONENTS=$(bash scripts/components)
ZTUNNEL_BIN=${ZTUNNEL_BIN:-$(bash ../shared/ztunnel/build.sh)}
ENVOY_BIN=$(bash scripts/envoy)
export ENVOY_DRAIN_COMPONENTS ZTUNNEL_BIN ENVOY_BIN
bash scripts/build-release >/dev/null
cargo run --quiet --example rollout -- "$@"
