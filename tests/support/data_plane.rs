//! What carries a pod's traffic: one idea for the replica of one pod (pod.rs, mesh.rs, kubelet.rs)
//! and the real components (rollout.rs) alike.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPlane {
    /// No mesh: the app alone.
    None,
    /// Istio's sidecar: Envoy and its agent in the pod, classic (`false`: the kubelet stops both
    /// containers at once) or native (`true`: an init container the kubelet stops after the app).
    Sidecar { native: bool },
    /// Istio's ambient mode: the node's ztunnel holds listeners in the pod's namespace.
    Ambient,
    /// Ambient mode with a waypoint for the namespace's services: istiod's own (a Gateway of
    /// class istio-waypoint, two replicas), which the rollout restarts instead of the app; the
    /// row's shutdown is the waypoint's. The real components alone have one.
    Waypoint,
}

impl DataPlane {
    pub fn sidecar(self) -> bool {
        matches!(self, DataPlane::Sidecar { .. })
    }
}
