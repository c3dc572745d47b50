#!/usr/bin/env bash
# The demo: `kubectl rollout restart` of four Deployments at once on one node of real components
# (kubelet, containerd, kube-proxy, istiod, ztunnel, istio-cni, built from source), each of two
# pods under 100 requests a second from a client pod: native Istio sidecars and ambient mode, each
# as written and with envoy-drain installed (the injection template; the admission policy), istiod
# pushing each change 2 s late as a busy one does. The rows of BENCHMARKS §10, side by side
# (examples/rollout.rs `demo`). Run it as root; it builds what is missing first (the components
# the first time: about 30 minutes), then takes under two minutes. The mesh replica's demo (the
# proxy's side: long requests in flight at a deleted pod) is `bash examples/mesh.sh demo`.
exec bash "$(dirname "$0")/rollout.sh" demo
