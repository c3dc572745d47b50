#!/usr/bin/env bash
# The rollout table (examples/rollout.rs): pods ended under load (rollouts; on several nodes also
# node drains, scale-in, deletes) on real nodes, every data plane x app shutdown x clients x
# operation. Run it as root. Installs the tools and builds the components, ztunnel and Envoy when
# missing (like the tests) and the release binary the nodes' image holds. With no arguments, every
# rollout row on one node: about 25 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/test-tools
ENVOY_DRAIN_COMPONENTS=$(bash scripts/components)
ZTUNNEL_BIN=${ZTUNNEL_BIN:-$(bash ../shared/ztunnel/build.sh)}
ENVOY_BIN=$(bash scripts/envoy)
export ENVOY_DRAIN_COMPONENTS ZTUNNEL_BIN ENVOY_BIN
bash scripts/build-release >/dev/null
cargo run --quiet --example rollout -- "$@"
