#!/usr/bin/env bash
# The demo: a pod with an Istio sidecar is deleted while a client keeps calling its service and
# three long requests are in flight at it, and its proxy shuts down four ways: Istio's default,
# Istio's EXIT_ON_ZERO_ACTIVE_CONNECTIONS, and envoy-drain as the injection template sets it up,
# without and with --then-quit. These are the top rows of the mesh's table, from the same code
# (examples/mesh.sh, docs/mesh.md), shown short. Run it as root. Extra arguments are modes:
# istio, exit-on-zero, envoy-drain, requests or then-quit (default: all but requests).
exec bash "$(dirname "$0")/mesh.sh" demo "$@"
