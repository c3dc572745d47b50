#!/usr/bin/env bash
# The rollout table (examples/rollout.rs): `kubectl rollout restart` of three pods under load on
# a real node, every app shutdown x clients. Run it as root. Installs the tools and builds the
# components when missing (like the tests) and the release binary the node's image holds. With no
# arguments, every row: about 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/test-tools
ENVOY_DRAIN_COMPONENTS=$(bash scripts/components)
export ENVOY_DRAIN_COMPONENTS
bash scripts/build-release >/dev/null
cargo run --release --quiet --example rollout -- "$@"
