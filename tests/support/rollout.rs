//! One `kubectl rollout restart` under load on a real node (node.rs): a Deployment of three
//! replicas of the app (tests/pod/app.py, which on SIGTERM closes its listener and finishes the
//! requests in flight, as nginx does), ready by an HTTP probe, behind a Service, and a client pod
//! from which hey sends 100 requests a second to the Service's cluster IP (`kubectl exec`), from
//! before the restart until after it. In one of the data planes:
//! - no mesh: kube-proxy's rules on the node take the client's connections to the pods;
//! - sidecars: istiod (cluster.rs `start_istiod`, with the template of
//!   examples/istio-template-values.yaml) injects every pod, the client's included, with its
//!   istio-proxy: pilot-agent (built from istio.io/istio like istiod) running Envoy, as Istio's
//!   proxyv2 image does, its capture written by istio-init (`pilot-agent istio-iptables`), its
//!   certificate from istiod's CA; istiod pushes the Service's endpoints to the client's Envoy.
//!   Classic (istio-proxy a container) or native (an init container that always restarts), per
//!   pod by Istio's own annotation;
//! - ambient: istiod's charts' ztunnel and istio-cni DaemonSets on the node (`ambient`): istio-cni
//!   captures each pod as it starts and hands it to ztunnel, which carries the client's
//!   connections over HBONE to the pods it learns from istiod;
//! - a waypoint: ambient mode, the namespace's Service behind istiod's own waypoint (two replicas,
//!   examples/waypoint.yaml), which the rollout restarts instead of the app.
//!
//! The app's shutdown is none (the pod as written: with a sidecar, Istio's own preStop and
//! SIGTERM handling), EXIT_ON_ZERO_ACTIVE_CONNECTIONS for the proxy, `preStop: sleep`, or
//! envoy-drain as installed: the hook examples/hold-policy.yaml adds without a mesh, the template's
//! `run` and `hold` with sidecars (envoy-drain.io/hold: "true"), the policy's hold in ambient mode.
//!
//! Beside the requests' outcomes it measures, for each replaced pod, when its endpoint left the
//! client's data path after its deletion: the client's Envoy's /clusters (sidecars), ztunnel's
//! /config_dump (ambient), kube-proxy's rules (no mesh), polled every 100 ms. The pods' logs (the app's events and, through
//! /proc/1/fd/1, the hold's) are read as the kubelet writes them, before it removes them with the
//! pod.

use super::cluster::{ControlPlane, Nodes};
pub use super::data_plane::DataPlane;
use super::netns::Netns;
use super::node::{Image, Node};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/hold-policy.yaml");
const TEMPLATE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/istio-template-values.yaml");
const WAYPOINT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/waypoint.yaml");
const APP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pod/app.py");
/// scripts/build-release's static binary, as the FROM scratch image holds it.
const RELEASE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/dist/amd64/envoy-drain");
/// istiod's revision, and its xDS and CA address: the node's (node.rs NODE_IP), the port
/// cluster.rs gives istiod 0.
const REVISION: &str = "rollout";
const ISTIOD: &str = "10.0.0.1:20012";

impl DataPlane {
    /// Whether the node runs ztunnel and istio-cni.
    fn ambient(self) -> bool {
        matches!(self, DataPlane::Ambient | DataPlane::Waypoint)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// The pod as written: SIGTERM at deletion, and with a sidecar Istio's own preStop and drain.
    None,
    /// Istio's EXIT_ON_ZERO_ACTIVE_CONNECTIONS for the proxy (sidecars, waypoints).
    ExitOnZero,
    /// Kubernetes' own `preStop: sleep` of that many seconds for the app.
    Sleep(u32),
    /// envoy-drain: examples/hold-policy.yaml's hold without a sidecar (no mesh, ambient); the
    /// template's `run` and `hold` with sidecars; examples/waypoint.yaml's `run` for a waypoint.
    EnvoyDrain,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clients {
    /// A connection per request (`hey -disable-keepalive`).
    NewConn,
    /// Ten connections kept alive.
    KeepAlive,
    /// Ten connections kept alive, and beside them `DOWNLOADERS` slow clients (a mobile or
    /// cross-region reader) each downloading `DOWNLOAD` bytes at `DOWNLOAD_RATE` bytes a second
    /// (wget's `--limit-rate`), one after another, from outside the mesh (`DOWNLOAD_PORT`): a
    /// sidecar of the client's own would read each answer at once and hold it itself.
    Downloads,
}

/// The slow clients of `Clients::Downloads`: how many at once, the answer's size and their rate
/// (12 s a download, within the grace period).
pub const DOWNLOADERS: usize = 4;
pub const DOWNLOAD: u64 = 3_000_000;
pub const DOWNLOAD_RATE: u64 = 250_000;
/// The Service's port the slow clients ask, which the client's sidecar lets pass
/// (traffic.sidecar.istio.io/excludeOutboundPorts), as a client outside the mesh reaches the pod.
const DOWNLOAD_PORT: u16 = 81;

/// How the app's pods end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `kubectl rollout restart` with the Deployment's rolling update.
    Restart(Strategy),
    /// `kubectl drain` of node-2, which holds about half the app's pods (three nodes only): the
    /// Eviction API, paced by the app's PodDisruptionBudget (`Case::budget`).
    Drain,
    /// `kubectl scale` to that many replicas: the pods removed have no replacement.
    Scale(u32),
    /// `kubectl delete pod` of that many pods (taken from each node in turn), as by hand.
    Delete(u32),
}

/// The app's PodDisruptionBudget on several nodes: its one field, as the API takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    MinAvailable(Amount),
    MaxUnavailable(Amount),
}

/// A budget's number: pods, or a percentage of the replicas (an intstr.IntOrString).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amount {
    Pods(u32),
    Percent(u32),
}

impl Amount {
    /// Of `replicas`, a percentage rounded up, as the disruption controller scales both fields
    /// (kubernetes pkg/controller/disruption/disruption.go, `getExpectedScale` and
    /// `GetScaledValueFromIntOrPercent(.., true)`).
    fn of(self, replicas: u32) -> u32 {
        match self {
            Amount::Pods(n) => n,
            Amount::Percent(p) => (replicas * p).div_ceil(100),
        }
    }
}

impl std::fmt::Display for Amount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Amount::Pods(n) => write!(f, "{n}"),
            Amount::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Budget {
    /// The evictions it allows at once while all of `replicas` are ready: none blocks a drain
    /// until kubectl's timeout.
    pub fn allowed(self, replicas: u32) -> u32 {
        match self {
            Budget::MinAvailable(a) => replicas.saturating_sub(a.of(replicas)),
            Budget::MaxUnavailable(a) => a.of(replicas).min(replicas),
        }
    }

    /// Its field as YAML, and as the table's header says it.
    fn field(self) -> (&'static str, Amount) {
        match self {
            Budget::MinAvailable(a) => ("minAvailable", a),
            Budget::MaxUnavailable(a) => ("maxUnavailable", a),
        }
    }
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, amount) = self.field();
        write!(f, "{name} {amount}")
    }
}

/// A Deployment's rolling update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Kubernetes' default: maxSurge 25 %, maxUnavailable 25 %.
    Default,
    /// maxSurge 25 %, maxUnavailable 0: a new pod ready before each old one goes.
    Surge,
    /// maxSurge 0, maxUnavailable 1: one pod at a time, the capacity one short meanwhile.
    OneAtATime,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    pub mesh: DataPlane,
    pub shutdown: Shutdown,
    pub clients: Clients,
    /// istiod's debounce (PILOT_DEBOUNCE_AFTER, and PILOT_DEBOUNCE_MAX at least as long): a slower
    /// push. None: Istio's defaults (100 ms, at most 10 s).
    pub debounce: Option<Duration>,
    /// The app's replicas.
    pub replicas: u32,
    /// The client's requests a second, over ten connections at a time (hey's workers), or as many
    /// as the requests' length needs.
    pub rate: u32,
    /// How long the app takes to answer each request, in milliseconds; from 1 s on, the mean of
    /// times drawn between half and one and a half of it, so that the clients' requests spread
    /// out in time.
    pub request_ms: u32,
    /// The app pods' terminationGracePeriodSeconds.
    pub grace: u32,
    /// The cluster's nodes: with more than one, the client on node-1 and the app's pods spread
    /// over the others (node.rs `start_nodes`), its traffic crossing nodes.
    pub nodes: u8,
    pub operation: Operation,
    /// On several nodes, the app's PodDisruptionBudget.
    pub budget: Budget,
}

impl Operation {
    /// The Deployment's rollingUpdate: the strategy's, else Kubernetes' defaults.
    fn surge_and_unavailable(self) -> (&'static str, &'static str) {
        match self {
            Operation::Restart(Strategy::Surge) => ("25%", "0"),
            Operation::Restart(Strategy::OneAtATime) => ("0", "1"),
            _ => ("25%", "25%"),
        }
    }
}

impl Case {
    /// The table's usual case: three replicas, 100 requests a second, Kubernetes' default grace
    /// period (30 s), istiod's own debounce.
    pub fn new(mesh: DataPlane, shutdown: Shutdown, clients: Clients) -> Case {
        Case {
            mesh,
            shutdown,
            clients,
            debounce: None,
            replicas: 3,
            rate: 100,
            request_ms: 50,
            grace: 30,
            nodes: 1,
            operation: Operation::Restart(Strategy::Default),
            budget: Budget::MinAvailable(Amount::Percent(50)),
        }
    }

    pub fn operation_name(&self) -> String {
        match self.operation {
            Operation::Restart(Strategy::Default) => "rollout restart".into(),
            Operation::Restart(Strategy::Surge) => "rollout restart (maxUnavailable 0)".into(),
            Operation::Restart(Strategy::OneAtATime) => "rollout restart (maxSurge 0)".into(),
            Operation::Drain => "drain node-2".into(),
            Operation::Scale(n) => format!("scale {} to {n}", self.replicas),
            Operation::Delete(n) => format!("delete {n} pods"),
        }
    }

    pub fn clients_name(&self) -> String {
        match self.clients {
            Clients::NewConn => "new-conn".into(),
            Clients::KeepAlive => "keep-alive".into(),
            Clients::Downloads => format!(
                "keep-alive + {DOWNLOADERS} downloads of {} MB at {} KB/s",
                DOWNLOAD / 1_000_000,
                DOWNLOAD_RATE / 1000
            ),
        }
    }

    pub fn mesh_name(&self) -> &'static str {
        match self.mesh {
            DataPlane::None => "no mesh",
            DataPlane::Sidecar { native: false } => "sidecar (classic)",
            DataPlane::Sidecar { native: true } => "sidecar (native)",
            DataPlane::Ambient => "ambient (ztunnel)",
            DataPlane::Waypoint => "ambient waypoint",
        }
    }

    pub fn shutdown_name(&self) -> String {
        match (self.shutdown, self.mesh) {
            (Shutdown::None, DataPlane::None | DataPlane::Ambient) => "none".into(),
            (Shutdown::None, _) => "Istio's default".into(),
            (Shutdown::ExitOnZero, _) => "EXIT_ON_ZERO_ACTIVE_CONNECTIONS".into(),
            (Shutdown::Sleep(s), _) => format!("preStop sleep {s}s"),
            (Shutdown::EnvoyDrain, DataPlane::None | DataPlane::Ambient) => {
                "envoy-drain hold (policy)".into()
            }
            (Shutdown::EnvoyDrain, DataPlane::Waypoint) => {
                "envoy-drain run --preset waypoint".into()
            }
            (Shutdown::EnvoyDrain, _) => "envoy-drain run + hold (template)".into(),
        }
    }
}

pub struct Row {
    pub case: Case,
    /// Requests answered 200, and downloads that arrived whole.
    pub ok: u64,
    /// Of those, the downloads.
    pub downloaded: u64,
    /// Every other answer and every error, as hey names them.
    pub failed: Vec<(String, u64)>,
    /// From the operation's start to the last pod it ended gone (a drain: the node empty).
    pub took: Duration,
    /// For each pod the operation ended: when its hold ended after the last request it received (seconds;
    /// none without a hold), and the hold's summary.
    pub holds: Vec<(Option<f64>, String)>,
    /// The holds' records: their summary lines in JSON (`--log-format json`, which the policy's
    /// ConfigMap and the pods' envoy-drain.io/log-format ask for), one per replaced pod that had
    /// a hold.
    pub records: Vec<String>,
    /// For each pod the operation ended: seconds from its deletion to its endpoint leaving the client's data
    /// path (none where that was not seen).
    pub propagation: Vec<Option<f64>>,
    /// What explains a failure: the kubelet's probe failures, hey's errors and kube-proxy's last
    /// lines.
    pub diagnosis: String,
    /// The evictions the API server refused (a drain's 429s under the budget).
    pub refused: u64,
    /// With a waypoint: what `envoy-drain status --preset waypoint` printed in one of the old
    /// waypoints under the load, before the restart.
    pub status: String,
    /// Each pod the operation made (a replacement, a rollout's new pod): seconds from its
    /// creation to Ready (none where not Ready by the row's end), and how long envoy-drain's
    /// install container ran in it (none without one), both in the API's whole seconds.
    pub started: Vec<(Option<i64>, Option<i64>)>,
}

impl Row {
    pub fn failed_total(&self) -> u64 {
        self.failed.iter().map(|(_, n)| n).sum()
    }
}

/// istiod as the chart installs it with the template, its image set to the node's, and what this
/// node needs of it: images from the node (hub localhost, tag test); istiod's address without
/// DNS (the pods have none here), with the name its certificate holds (ISTIOD_SAN, which
/// pilot-agent offers for this); and Istio's telemetry off, whose filters (istio.stats,
/// istio.metadata_exchange, istio.alpn) only Istio's own build of Envoy has (istio/proxy, not
/// buildable here): the proxies run the upstream Envoy of `scripts/envoy`. For the same reason
/// sidecars keep to mTLS where ambient's profile would have them speak HBONE too
/// (ISTIO_META_ENABLE_HBONE adds the bootstrap extension `istio.workload.BootstrapExtension`).
fn istiod_values() -> String {
    let template = std::fs::read_to_string(TEMPLATE).expect("the template's values");
    let unset = "{{- $image := \"\" }}";
    assert!(template.contains(unset), "{TEMPLATE}: $image, unset");
    let template = template.replace(unset, "{{- $image := \"localhost/envoy-drain:test\" }}");
    format!(
        "{template}global:\n  hub: localhost\n  tag: test\n  imagePullPolicy: IfNotPresent\n  \
         caAddress: {ISTIOD}\nmeshConfig:\n  defaultConfig:\n    discoveryAddress: {ISTIOD}\n    \
         proxyMetadata:\n      ISTIOD_SAN: istiod-{REVISION}.istio-system.svc\n      \
         ISTIO_META_ENABLE_HBONE: 'false'\n  \
         defaultProviders:\n    metrics: []\ntelemetry:\n  enabled: false\n"
    )
}

/// The namespace `ns`, labelled for the row's data plane.
fn namespace(case: Case, ns: &str) -> String {
    let hold = if case.shutdown == Shutdown::EnvoyDrain { "enabled" } else { "disabled" };
    let labels = match case.mesh {
        DataPlane::None => format!("envoy-drain.io/hold: {hold}"),
        DataPlane::Sidecar { .. } => format!("istio.io/rev: {REVISION}"),
        DataPlane::Ambient => {
            format!("envoy-drain.io/hold: {hold}, istio.io/dataplane-mode: ambient")
        }
        DataPlane::Waypoint => "envoy-drain.io/hold: disabled, istio.io/dataplane-mode: ambient, \
                           istio.io/use-waypoint: waypoint"
            .to_string(),
    };
    format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels: {{{labels}}}\n")
}

/// The app pods' annotations: with sidecars, the native flag and envoy-drain's own.
fn annotations(case: Case) -> Vec<String> {
    let mut annotations = Vec::new();
    if let DataPlane::Sidecar { native } = case.mesh {
        annotations.push(format!("sidecar.istio.io/nativeSidecar: '{native}'"));
        if case.shutdown == Shutdown::EnvoyDrain {
            annotations.push("envoy-drain.io/hold: 'true'".to_string());
            annotations.push("envoy-drain.io/log-format: json".to_string());
        } else {
            annotations.push("envoy-drain.io/disabled: 'true'".to_string());
        }
        if case.shutdown == Shutdown::ExitOnZero {
            annotations.push(
                "proxy.istio.io/config: '{\"proxyMetadata\": \
                 {\"EXIT_ON_ZERO_ACTIVE_CONNECTIONS\": \"true\"}}'"
                    .to_string(),
            );
        }
    }
    annotations
}

/// The app container's `preStop: sleep` of `sleep<seconds>` rows, as YAML at its place in
/// `workload`'s Deployment.
fn sleep_pre_stop(case: Case) -> String {
    match case.shutdown {
        Shutdown::Sleep(s) => {
            format!("\n        lifecycle:\n          preStop:\n            sleep: {{seconds: {s}}}")
        }
        _ => String::new(),
    }
}

/// On several nodes, the app's and the client's placement (YAML at their places in `workload`'s
/// Deployments): the client on node-1, the app's pods spread over the others.
fn placement(case: Case) -> (String, String) {
    match case.nodes {
        1 => (String::new(), String::new()),
        _ => (
            "
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{key: kubernetes.io/hostname, operator: NotIn, values: [node-1]}]
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: app}}}"
                .to_string(),
            "\n      nodeSelector: {kubernetes.io/hostname: node-1}".to_string(),
        ),
    }
}

/// On several nodes, the budget a production Deployment has, which paces a drain's evictions.
fn budget(case: Case, ns: &str) -> String {
    match case.nodes {
        1 => String::new(),
        _ => {
            let (field, amount) = case.budget.field();
            format!(
                "---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: app, \
                 namespace: {ns}}}\nspec: {{{field}: {amount}, selector: {{matchLabels: {{app: app}}}}}}\n"
            )
        }
    }
}

/// The namespace `ns`, labelled for the row's data plane; the app's Deployment and Service; the
/// client's Deployment.
fn workload(case: Case, ns: &str) -> (String, String) {
    let namespace = namespace(case, ns);
    let pre_stop = sleep_pre_stop(case);
    let (replicas, grace) = (case.replicas, case.grace);
    let (app_placement, client_placement) = placement(case);
    let (surge, unavailable) = case.operation.surge_and_unavailable();
    let deployment = format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: app, namespace: {ns}}}
spec:
  replicas: {replicas}
  strategy: {{rollingUpdate: {{maxSurge: {surge}, maxUnavailable: {unavailable}}}}}
  selector: {{matchLabels: {{app: app}}}}
  template:
    metadata:
      labels: {{app: app}}
      annotations: {{{}}}
    spec:
      terminationGracePeriodSeconds: {grace}{app_placement}
      containers:
      - name: app
        image: localhost/app:test
        args: [close]
        ports: [{{containerPort: 8080}}]
        readinessProbe:
          httpGet: {{path: '/local/0?probe', port: 8080}}
          periodSeconds: 2{pre_stop}
---
apiVersion: v1
kind: Service
metadata: {{name: app, namespace: {ns}}}
spec:
  selector: {{app: app}}
  ports:
  - {{name: http, port: 80, targetPort: 8080}}
  - {{name: http-outside, port: {DOWNLOAD_PORT}, targetPort: 8080}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: client, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: client}}}}
  template:
    metadata:
      labels: {{app: client}}
      annotations:
        envoy-drain.io/disabled: 'true'
        traffic.sidecar.istio.io/excludeOutboundPorts: '{DOWNLOAD_PORT}'
    spec:{client_placement}
      containers:
      - name: client
        image: localhost/client:test
{}",
        annotations(case).join(", "),
        budget(case, ns)
    );
    (namespace, deployment)
}

/// What upstream Envoy needs to run istiod's waypoint configuration (Istio's own Envoy,
/// istio/proxy, cannot be built here), scoped to the waypoint: its two `io.istio.http.peer_metadata`
/// filters (telemetry) gone, the double-HBONE listener (multi-network only) gone, and
/// `connect_authority` the same set_filter_state on Envoy's own `envoy.hashable_string` factory
/// where istiod names Istio's `istio.hashable_string` (pilot/pkg/xds/filters/filters.go).
const UPSTREAM_ENVOY_WAYPOINT: &str = "apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: upstream-envoy}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
  configPatches:
  - applyTo: HTTP_FILTER
    match: {listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: waypoint_downstream_peer_metadata}}}}}
    patch: {operation: REMOVE}
  - applyTo: HTTP_FILTER
    match: {listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: waypoint_upstream_peer_metadata}}}}}
    patch: {operation: REMOVE}
  - applyTo: LISTENER
    match: {listener: {name: inner_connect_originate}}
    patch: {operation: REMOVE}
  - applyTo: HTTP_FILTER
    match: {listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: connect_authority}}}}}
    patch:
      operation: REPLACE
      value:
        name: connect_authority
        typed_config:
          '@type': type.googleapis.com/envoy.extensions.filters.http.set_filter_state.v3.Config
          on_request_headers:
          - {object_key: envoy.filters.listener.original_dst.local_ip, format_string: {text_format_source: {inline_string: '%REQ(:AUTHORITY)%'}}, shared_with_upstream: ONCE}
          - {object_key: io.istio.connect_authority, factory_key: envoy.hashable_string, format_string: {text_format_source: {inline_string: '%REQ(:AUTHORITY)%'}}, shared_with_upstream: ONCE}
          - {object_key: envoy.filters.listener.original_dst.remote_ip, format_string: {text_format_source: {inline_string: '%DOWNSTREAM_REMOTE_ADDRESS%'}}, shared_with_upstream: ONCE}
          - {object_key: io.istio.peer_principal, factory_key: envoy.hashable_string, format_string: {text_format_source: {inline_string: '%DOWNSTREAM_PEER_URI_SAN%'}}, shared_with_upstream: ONCE}
          - {object_key: io.istio.local_principal, factory_key: envoy.hashable_string, format_string: {text_format_source: {inline_string: '%DOWNSTREAM_LOCAL_URI_SAN%'}}, shared_with_upstream: ONCE}
";

/// The waypoint of namespace `ns` as examples/waypoint.yaml makes it (its Gateway, of istiod's
/// revision here; with envoy-drain its ConfigMap, the hook's record in JSON), and upstream
/// Envoy's EnvoyFilter. Without envoy-drain the ConfigMap asks for the two replicas alone, and
/// with EXIT_ON_ZERO_ACTIVE_CONNECTIONS sets it for pilot-agent.
fn waypoint(case: Case, ns: &str) -> String {
    let example = std::fs::read_to_string(WAYPOINT).expect("examples/waypoint.yaml");
    let example = example.replace("namespace: shop\n", &format!("namespace: {ns}\n"));
    let (config_map, gateway) = example.split_once("\n---\n").expect("a ConfigMap, then a Gateway");
    let labels = "    istio.io/waypoint-for: service\n";
    assert!(gateway.contains(labels), "{WAYPOINT}: the Gateway's labels");
    let gateway = gateway.replace(labels, &format!("{labels}    istio.io/rev: {REVISION}\n"));
    let config_map = match case.shutdown {
        Shutdown::EnvoyDrain => {
            let hook = "- --log-file=/proc/1/fd/1";
            assert!(config_map.contains(hook), "{WAYPOINT}: the hook's log file");
            let with_json = format!("{hook}\n{}- --log-format=json", " ".repeat(18));
            config_map
                .replace("image: envoy-drain:0.1.0", "image: localhost/envoy-drain:test")
                .replace(hook, &with_json)
        }
        shutdown => {
            let mut patch = "spec:\n  replicas: 2\n".to_string();
            if shutdown == Shutdown::ExitOnZero {
                patch += "  template:\n    spec:\n      containers:\n      - name: istio-proxy\n        \
                          env: [{name: EXIT_ON_ZERO_ACTIVE_CONNECTIONS, value: 'true'}]\n";
            }
            let patch = patch.lines().map(|l| format!("    {l}\n")).collect::<String>();
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: waypoint-envoy-drain, \
                 namespace: {ns}}}\ndata:\n  deployment: |\n{patch}"
            )
        }
    };
    let filter = UPSTREAM_ENVOY_WAYPOINT
        .replace("{name: upstream-envoy}", &format!("{{name: upstream-envoy, namespace: {ns}}}"));
    format!("{filter}---\n{config_map}\n---\n{gateway}")
}

/// iptables for istio-init and istio-cni: the machine's nft and legacy builds, under every name
/// istio-iptables looks for (the modules the rules load go beside them).
fn iptables() -> Vec<(PathBuf, String)> {
    let mut iptables = Vec::new();
    for (multi, kinds) in [
        ("/usr/sbin/xtables-nft-multi", ["", "-nft"]),
        ("/usr/sbin/xtables-legacy-multi", ["-legacy", "-legacy"]),
    ] {
        for kind in kinds {
            for family in ["iptables", "ip6tables"] {
                for tool in ["", "-save", "-restore"] {
                    iptables.push((multi.into(), format!("/usr/sbin/{family}{kind}{tool}")));
                }
            }
        }
    }
    iptables
}

/// The images every row needs: the app, envoy-drain's FROM scratch content, the client.
pub fn base_images(cp: &ControlPlane) -> Vec<Image> {
    vec![
        Image {
            name: "localhost/app:test",
            entrypoint: vec!["/usr/bin/python3.11".into(), "/app.py".into()],
            files: vec!["/usr/bin/python3.11".into(), "/usr/lib/python3.11".into()],
            extra: vec![(APP.into(), "/app.py".into())],
        },
        Image {
            name: "localhost/envoy-drain:test",
            entrypoint: vec!["/envoy-drain".into()],
            files: vec![],
            extra: vec![(RELEASE.into(), "/envoy-drain".into())],
        },
        Image {
            name: "localhost/client:test",
            entrypoint: vec!["/pause".into()],
            files: vec!["/usr/bin/hey".into(), "/usr/bin/wget".into()],
            extra: vec![(cp.bin("pause"), "/pause".into())],
        },
    ]
}

/// The node's images: the app, envoy-drain's FROM scratch content, the client (Kubernetes' pause
/// program, and hey and wget to exec); with sidecars Istio's proxyv2 as its Dockerfile lays it out
/// (pilot/docker/Dockerfile.proxyv2: pilot-agent, Envoy, the bootstrap template); in ambient
/// mode ztunnel and install-cni (istio-cni's node agent and plugin).
fn images(cp: &ControlPlane, meshes: &[DataPlane], envoy: &Path, bootstrap: &Path) -> Vec<Image> {
    let mut images = base_images(cp);
    let iptables = iptables();
    let modules = vec!["/usr/lib/x86_64-linux-gnu/xtables".to_string()];
    if meshes.iter().any(|m| matches!(m, DataPlane::Sidecar { .. } | DataPlane::Waypoint)) {
        let mut extra = vec![
            (cp.bin("pilot-agent"), "/usr/local/bin/pilot-agent".to_string()),
            (envoy.to_path_buf(), "/usr/local/bin/envoy".into()),
            (bootstrap.to_path_buf(), "/var/lib/istio/envoy/envoy_bootstrap_tmpl.json".into()),
        ];
        extra.extend(iptables.iter().cloned());
        images.push(Image {
            name: "localhost/proxyv2:test",
            entrypoint: vec!["/usr/local/bin/pilot-agent".into()],
            files: modules.clone(),
            extra,
        });
    }
    // As Istio's images lay them out (pilot/docker/Dockerfile.ztunnel is ztunnel's own
    // repository's; cni/deployments/kubernetes/Dockerfile.install-cni: install-cni on the PATH,
    // the plugin in /opt/cni/bin).
    if meshes.iter().any(|m| m.ambient()) {
        let ztunnel = super::built::built_by(
            "ZTUNNEL_BIN",
            "../shared/ztunnel/build.sh",
            "ztunnel is built from ../shared/ztunnel",
        );
        images.push(Image {
            name: "localhost/ztunnel:test",
            entrypoint: vec!["/usr/local/bin/ztunnel".into()],
            files: vec![],
            extra: vec![(ztunnel.join("ztunnel"), "/usr/local/bin/ztunnel".into())],
        });
        let mut extra = vec![
            (cp.bin("install-cni"), "/usr/local/bin/install-cni".to_string()),
            (cp.bin("istio-cni"), "/opt/cni/bin/istio-cni".into()),
        ];
        extra.extend(iptables);
        images.push(Image {
            name: "localhost/install-cni:test",
            entrypoint: vec!["/usr/local/bin/install-cni".into()],
            files: modules,
            extra,
        });
    }
    images
}

/// Runs one rollout and reads what it did.
pub fn run(case: Case) -> Row {
    let mut rows = run_together(&[case]);
    rows.pop().expect("a row for the one case")
}

/// Runs the cases' rollouts at once on one node, side by side: each case in a namespace of its
/// own (`shop-0`, `shop-1`, ...) with its own load, restarted together; a case's `debounce` is
/// istiod's (the first case's). Sidecar and ambient namespaces share one istiod, as in a mesh
/// that has both.
pub fn run_together(cases: &[Case]) -> Vec<Row> {
    // One node at a time: each takes the node's address and istiod's (NODE_IP, ISTIOD).
    static ONE_NODE: Mutex<()> = Mutex::new(());
    let _one = ONE_NODE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let envoy = prerequisites();
    let mut phases = Phases(Instant::now(), String::from("setup:"));
    let cp = ControlPlane::start_with("rollout", "kube-apiserver", &[], Nodes::Kubelet);
    phases.done("control plane");
    let meshes: Vec<DataPlane> = cases.iter().map(|c| c.mesh).collect();
    let bootstrap = bootstrap(&cp, &meshes);
    let nodes =
        Node::start_nodes(&cp, node_count(cases), &images(&cp, &meshes, &envoy, &bootstrap));
    let node = &nodes[0];
    phases.done("node");
    // Kept to the end: ambient's node init (dropped before the node).
    let _init = mesh(&cp, &nodes, &meshes, cases.first().and_then(|c| c.debounce));
    phases.done("mesh");
    let sides: Vec<Side> = cases
        .iter()
        .enumerate()
        .map(|(i, &case)| Side::deploy(&cp, case, format!("shop-{i}")))
        .collect();
    let sides: Vec<Side> = sides.into_iter().map(|s| s.ready(&cp, node)).collect();
    phases.done("pods ready");
    let logs = Logs::follow(nodes.iter().map(Node::pod_logs).collect());
    // The loads' slow clients run in this scope, which their loads' ends join.
    std::thread::scope(|load_scope| {
        let loads: Vec<Load> =
            sides.iter().map(|s| Load::start(&cp, &nodes, s, load_scope)).collect();
        // The load runs a while before the rollout, as it does before a user's; long requests a few
        // of their lengths, so that they spread out.
        let longest = cases.iter().map(|c| c.request_ms).max().unwrap_or(0);
        std::thread::sleep(Duration::from_millis(u64::from(longest * 3).max(5000)));
        phases.done("load");
        eprintln!("{}", phases.1);
        let statuses: Vec<String> = sides.iter().map(Side::waypoint_status).collect();
        let ended = operate(&cp, node, &sides);
        for side in &sides {
            assert_captured(&cp, side);
        }
        // A few more seconds of load on the new pods alone, then hey stops as on Ctrl-C.
        std::thread::sleep(Duration::from_secs(3));
        let logs = logs.stop();
        let health = nodes_health(&nodes);
        let rows = sides.iter().zip(loads).zip(ended).zip(statuses);
        rows.map(|(((side, load), ended), status)| {
            let mut row = load.stop(side, &ended.pods, &logs);
            (row.took, row.refused, row.status) = (ended.took, ended.refused, status);
            row.started = side.started(&cp);
            row.diagnosis = format!("{}; {}; {health}", phases.1, row.diagnosis);
            row
        })
        .collect()
    })
}

/// Envoy, for the images, and the release binary the nodes' image of envoy-drain holds.
fn prerequisites() -> PathBuf {
    assert!(
        Path::new(RELEASE).exists(),
        "NOT RUN: {RELEASE} is missing: `bash scripts/build-release` makes it"
    );
    super::envoy::required()
}

/// The nodes the cases need, one count for all (each case's pods are kept off node-1 only, so a
/// case of fewer nodes would spread onto another's): node-1 for the clients.
fn node_count(cases: &[Case]) -> u8 {
    let count = cases.first().map_or(1, |c| c.nodes);
    assert!(cases.iter().all(|c| c.nodes == count), "one node count for all cases run together");
    let drains = cases.iter().any(|c| c.operation == Operation::Drain);
    assert!(!drains || count > 2, "a drain needs nodes=3: node-1 holds the client");
    count
}

/// For a row's diagnosis: the kubelets' failed probes, and each node's last kube-proxy lines.
fn nodes_health(nodes: &[Node]) -> String {
    let mut probes = 0;
    let mut kube_proxy = String::new();
    for node in nodes {
        let kubelet = std::fs::read_to_string(node.log("kubelet")).unwrap_or_default();
        probes += kubelet.lines().filter(|l| l.contains("Probe failed")).count();
        kube_proxy += &node.log_tail("kube-proxy", 6);
    }
    format!("{probes} failed probes; kube-proxy:\n{kube_proxy}")
}

/// What an operation did to a side: how long it took, to the last pod it ended gone from the API
/// server; the pods it ended; the eviction requests the API server refused (429: the
/// PodDisruptionBudget allows no more now), each retried by kubectl 5 s later.
struct Ended {
    took: Duration,
    pods: Vec<String>,
    refused: u64,
}

/// The cases' operation on every side at once (a drain: once, for all of them).
fn operate(cp: &ControlPlane, node: &Node, sides: &[Side]) -> Vec<Ended> {
    let operation = sides[0].case.operation;
    assert!(sides.iter().all(|s| s.case.operation == operation), "one operation for all cases");
    if operation == Operation::Drain {
        return drain(cp, sides);
    }
    // Each side's start: a restart's once its own command has run.
    let starts: Vec<Instant> = sides
        .iter()
        .map(|side| {
            let started = Instant::now();
            if let Operation::Restart(_) = operation {
                cp.ok(&["rollout", "restart", "-n", &side.ns, side.restarted().0]);
            }
            started
        })
        .collect();
    std::thread::scope(|scope| {
        let waits: Vec<_> = sides
            .iter()
            .zip(starts)
            .map(|(side, started)| {
                scope.spawn(move || match operation {
                    Operation::Scale(n) => side.scaled(cp, n, started),
                    Operation::Delete(n) => side.deleted(cp, n),
                    _ => {
                        let took = side.rolled(cp, node, started);
                        Ended { took, pods: side.old.clone(), refused: 0 }
                    }
                })
            })
            .collect();
        waits.into_iter().map(|w| w.join().expect("an operation's wait")).collect()
    })
}

/// `kubectl drain node-2` (the app's pods there evicted through their budgets, the DaemonSets'
/// left), returning once they are gone; node-2 stays cordoned.
fn drain(cp: &ControlPlane, sides: &[Side]) -> Vec<Ended> {
    let on_node_2: Vec<Vec<String>> = sides.iter().map(|s| s.pods_on(cp, "node-2")).collect();
    let grace = sides.iter().map(|s| s.case.grace).max().unwrap_or(30);
    let timeout = format!("--timeout={}s", 60 + 3 * grace);
    let started = Instant::now();
    let drained =
        cp.kubectl(&["drain", "node-2", "--ignore-daemonsets", "--delete-emptydir-data", &timeout]);
    let took = started.elapsed();
    assert!(drained.ok, "kubectl drain node-2: {}", drained.stderr);
    // kubectl's line for each 429 (k8s.io/kubectl pkg/drain/drain.go, evictPods): `error when
    // evicting pods/"app-..." -n "shop-0" (will retry after 5s): Cannot evict pod as it would
    // violate the pod's disruption budget.`
    let refusals: Vec<&str> = drained
        .stderr
        .lines()
        .filter(|l| l.starts_with("error when evicting pods/") && l.contains("disruption budget"))
        .collect();
    sides
        .iter()
        .zip(on_node_2)
        .map(|(side, pods)| {
            let ns = format!("-n \"{}\"", side.ns);
            let refused = refusals.iter().filter(|l| l.contains(&ns)).count() as u64;
            Ended { took, pods, refused }
        })
        .collect()
}

/// Istio's bootstrap template for the node's proxyv2 image. With a waypoint (a Gateway: Gateway
/// API's CRDs, at the version Istio pins, go in before istiod), without the block by which
/// pilot-agent turns on Istio's workload metadata extension for every waypoint (istio
/// pkg/bootstrap/config.go, "Waypoint overrides"), which upstream Envoy does not have.
fn bootstrap(cp: &ControlPlane, meshes: &[DataPlane]) -> PathBuf {
    let bootstrap = super::cluster::components().join("istio-bootstrap.json");
    if !meshes.contains(&DataPlane::Waypoint) {
        return bootstrap;
    }
    let crds = super::cluster::components().join("gateway-api-crds");
    cp.ok(&["apply", "--server-side", "-f", &crds.to_string_lossy()]);
    let template = std::fs::read_to_string(&bootstrap).expect("the bootstrap template");
    let block = "{{- if .metadata_discovery }}";
    assert!(template.contains(block), "{}: {block}", bootstrap.display());
    let edited_path = PathBuf::from(cp.path("istio-bootstrap-waypoint.json"));
    let edited = template.replace(block, "{{- if and .metadata_discovery false }}");
    std::fs::write(&edited_path, edited).expect("the waypoint's bootstrap template");
    edited_path
}

/// How long each step of a rollout's setup took (one run took 333 s where ~95 s is usual, all of
/// it before the rollout): since when, and the steps so far.
struct Phases(Instant, String);

impl Phases {
    fn done(&mut self, step: &str) {
        self.1 += &format!(" {step} {:.1}s", self.0.elapsed().as_secs_f64());
        self.0 = Instant::now();
    }
}

/// The mesh the cases need, installed: the hold policy for the pods without a sidecar; istiod
/// with the template for sidecars, with ambient's profile and DaemonSets for ambient pods; ambient's
/// node init, when there is one.
fn mesh(
    cp: &ControlPlane,
    nodes: &[Node],
    meshes: &[DataPlane],
    debounce: Option<Duration>,
) -> Vec<NodeInit> {
    if meshes
        .iter()
        .any(|m| matches!(m, DataPlane::None | DataPlane::Ambient | DataPlane::Waypoint))
    {
        cp.ok(&["apply", "-f", POLICY]);
        // Every hook's log in JSON, its last line the termination's record.
        cp.hold_settings(&["image=localhost/envoy-drain:test", "logFormat=json"]);
    }
    if meshes.iter().any(|m| m.ambient()) {
        return ambient(cp, nodes, debounce);
    }
    if meshes.iter().any(|m| matches!(m, DataPlane::Sidecar { .. })) {
        let env = istiod_env(debounce, false);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        cp.start_istiod(REVISION, &istiod_values(), &[], 0, &env);
    }
    Vec::new()
}

/// istiod's environment: what upstream Envoy needs of it (istiod_values), ambient's switch, and
/// a slower push when asked.
fn istiod_env(debounce: Option<Duration>, ambient: bool) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("PILOT_ENABLE_METADATA_EXCHANGE", "false".to_string()),
        ("PILOT_ENABLE_ALPN_FILTER", "false".to_string()),
    ];
    if ambient {
        env.push(("PILOT_ENABLE_AMBIENT", "true".to_string()));
    }
    if let Some(d) = debounce {
        env.push(("PILOT_DEBOUNCE_AFTER", format!("{}ms", d.as_millis())));
        env.push(("PILOT_DEBOUNCE_MAX", format!("{}ms", d.as_millis())));
    }
    env
}

/// One case's workload in its namespace.
struct Side {
    case: Case,
    ns: String,
    /// The app's pods before the restart.
    old: Vec<String>,
    client: String,
    /// The Service's cluster IP.
    ip: String,
}

impl Side {
    /// Applies the namespace and the workloads, once the hold policy serves the namespace when the
    /// case has it.
    fn deploy(cp: &ControlPlane, case: Case, ns: String) -> Side {
        let (namespace, deployment) = workload(case, &ns);
        cp.namespace(&namespace, &ns);
        if matches!(case.mesh, DataPlane::None | DataPlane::Ambient)
            && case.shutdown == Shutdown::EnvoyDrain
        {
            // The API server serves a policy once its informers have the ConfigMap: the
            // Deployment comes after a dry run shows the hook.
            let probe = format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: probe, namespace: {ns}}}\nspec:\n  \
                 containers: [{{name: app, image: localhost/app:test}}]\n"
            );
            cp.wait_for(&format!("the policy to serve {ns}"), || {
                let pod = cp.ok_with(
                    &["create", "--dry-run=server", "-o", "json", "-f", "-"],
                    Some(&probe),
                );
                pod.contains("preStop").then_some(())
            });
        }
        if case.mesh == DataPlane::Waypoint {
            cp.ok_with(&["apply", "-f", "-"], Some(&waypoint(case, &ns)));
        }
        cp.ok_with(&["apply", "-f", "-"], Some(&deployment));
        Side { case, ns, old: Vec::new(), client: String::new(), ip: String::new() }
    }

    /// The Deployment the rollout restarts, and its pods' label.
    fn restarted(&self) -> (&'static str, &'static str) {
        match self.case.mesh {
            DataPlane::Waypoint => {
                ("deployment/waypoint", "gateway.networking.k8s.io/gateway-name=waypoint")
            }
            _ => ("deployment/app", "app=app"),
        }
    }

    /// With a waypoint: istiod's Deployment of it ready, and each pod's istio-proxy preStop the
    /// row's.
    fn waypoint_ready(&self, cp: &ControlPlane, node: &Node) {
        let ns = self.ns.as_str();
        cp.wait_for(&format!("istiod to make the waypoint of {ns}"), || {
            cp.kubectl(&["get", "-n", ns, "deployment/waypoint"]).ok.then_some(())
        });
        let status = ["rollout", "status", "-n", ns, "deployment/waypoint", "--timeout=90s"];
        let rolled = cp.kubectl(&status);
        assert!(rolled.ok, "{ns} waypoint: {}\n{}", rolled.stderr, node.log_tail("kubelet", 4));
        let path = "jsonpath={range .items[*]}{.spec.containers[?(@.name==\"istio-proxy\")].\
                    lifecycle.preStop.exec.command}{\"\\n\"}{end}";
        let label = self.restarted().1;
        let proxies = cp.ok(&["get", "pods", "-n", ns, "-l", label, "-o", path]);
        let ours = self.case.shutdown == Shutdown::EnvoyDrain;
        assert_eq!(proxies.lines().count(), 2, "two waypoints: {proxies}");
        assert!(
            proxies.lines().all(|p| p.contains("\"run\",\"--preset=waypoint\"") == ours),
            "each waypoint's istio-proxy preStop in {ns} is the row's: {proxies}"
        );
        if ours {
            // The example's disruption budget, which istiod renders only when asked.
            let pdb = ["get", "pdb", "-n", ns, "waypoint", "-o", "jsonpath={.spec.minAvailable}"];
            assert_eq!(cp.kubectl(&pdb).stdout, "1", "examples/waypoint.yaml's budget in {ns}");
        }
    }

    /// Waits for the pods to be ready, and checks they are the case's: captured in ambient mode,
    /// the app's preStop and the proxy's as the case installs them.
    fn ready(mut self, cp: &ControlPlane, node: &Node) -> Side {
        let ns = self.ns.as_str();
        for deployment in ["deployment/app", "deployment/client"] {
            let status = ["rollout", "status", "-n", ns, deployment, "--timeout=90s"];
            let rolled = cp.kubectl(&status);
            assert!(
                rolled.ok,
                "{ns} {deployment}: {}\n{}",
                rolled.stderr,
                node.log_tail("kubelet", 4)
            );
        }
        if self.case.mesh == DataPlane::Waypoint {
            self.waypoint_ready(cp, node);
        }
        assert_captured(cp, &self);
        self.hooks_are_the_rows(cp);
        let label = self.restarted().1;
        let names = "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}";
        let old = cp.ok(&["get", "pods", "-n", ns, "-l", label, "-o", names]);
        self.old = old.lines().map(String::from).collect();
        self.client = cp.ok(&[
            "get",
            "pods",
            "-n",
            ns,
            "-l",
            "app=client",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ]);
        self.ip = cp.ok(&["get", "service", "-n", ns, "app", "-o", "jsonpath={.spec.clusterIP}"]);
        if self.case.nodes > 1 {
            self.placed(cp);
        }
        self
    }

    /// On several nodes: the client on node-1, the app's pods on the others, none on node-1,
    /// spread within one pod of even (the spread is the scheduler's preference, checked here).
    fn placed(&self, cp: &ControlPlane) {
        let path =
            "jsonpath={range .items[*]}{.metadata.labels.app} {.spec.nodeName}{\"\\n\"}{end}";
        let pods = cp.ok(&["get", "pods", "-n", &self.ns, "-o", path]);
        let on = |app: &str| -> Vec<&str> {
            pods.lines().filter_map(|l| l.strip_prefix(app)?.strip_prefix(' ')).collect()
        };
        assert_eq!(on("client"), ["node-1"], "{}: the client on node-1: {pods}", self.ns);
        let app = on("app");
        let each: Vec<usize> = (2..=self.case.nodes)
            .map(|n| app.iter().filter(|p| **p == format!("node-{n}")).count())
            .collect();
        let (fewest, most) = (each.iter().min(), each.iter().max());
        assert!(
            each.iter().sum::<usize>() == app.len()
                && most.zip(fewest).is_some_and(|(m, f)| m - f <= 1),
            "{}: the app's pods spread over the nodes but node-1: {pods}",
            self.ns
        );
    }

    /// The app's pods now on `node`.
    fn pods_on(&self, cp: &ControlPlane, node: &str) -> Vec<String> {
        let path = "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}";
        let pods = self.app_pods(cp, path);
        pods.lines().filter_map(|l| Some(l.strip_suffix(node)?.trim_end().to_string())).collect()
    }

    /// The pods the operation made (the app's; a waypoint row's, the waypoint's): (creation to
    /// Ready, envoy-drain's install container's run), in the API server's whole seconds.
    fn started(&self, cp: &ControlPlane) -> Vec<(Option<i64>, Option<i64>)> {
        let label = self.restarted().1;
        let pods = cp.ok(&["get", "pods", "-n", &self.ns, "-l", label, "-o", "json"]);
        let pods: serde_json::Value = serde_json::from_str(&pods).expect("kubectl's pods as JSON");
        let time = |v: &serde_json::Value| v.as_str().and_then(unix_seconds);
        let made = each(&pods["items"]).filter(|p| {
            !self.old.iter().any(|o| p["metadata"]["name"].as_str() == Some(o.as_str()))
        });
        made.map(|pod| {
            let created = time(&pod["metadata"]["creationTimestamp"]);
            let ready = each(&pod["status"]["conditions"])
                .find(|c| c["type"] == "Ready" && c["status"] == "True")
                .and_then(|c| time(&c["lastTransitionTime"]));
            let install = each(&pod["status"]["initContainerStatuses"])
                .find(|c| c["name"] == "envoy-drain-install")
                .map(|c| &c["state"]["terminated"])
                .and_then(|ran| Some(time(&ran["finishedAt"])? - time(&ran["startedAt"])?));
            (ready.zip(created).map(|(r, c)| r - c), install)
        })
        .collect()
    }

    /// `kubectl get pods` of the app, as `path` prints them.
    fn app_pods(&self, cp: &ControlPlane, path: &str) -> String {
        cp.ok(&["get", "pods", "-n", &self.ns, "-l", "app=app", "-o", path])
    }

    /// `kubectl scale` to `n` replicas, then waits for the pods removed to be gone (within the
    /// control plane's bound, past a 30 s grace period): how long after `started`, and which.
    fn scaled(&self, cp: &ControlPlane, n: u32, started: Instant) -> Ended {
        cp.ok(&["scale", "-n", &self.ns, "deployment/app", &format!("--replicas={n}")]);
        let names = "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}";
        // Bounded by the pods' grace period, as `kubectl delete`'s timeout is.
        let bound = started + Duration::from_secs(u64::from(self.case.grace) + 60);
        let left = loop {
            let pods = self.app_pods(cp, names);
            if pods.lines().count() == n as usize {
                break pods;
            }
            assert!(Instant::now() < bound, "{} to scale to {n}: {pods}", self.ns);
            std::thread::sleep(Duration::from_millis(100));
        };
        let pods = self.old.iter().filter(|p| !left.lines().any(|l| l == *p)).cloned().collect();
        Ended { took: started.elapsed(), pods, refused: 0 }
    }

    /// `kubectl delete pod` of `n` pods, one from each node in turn; returns once they are gone.
    fn deleted(&self, cp: &ControlPlane, n: u32) -> Ended {
        let path = "jsonpath={range .items[*]}{.spec.nodeName} {.metadata.name}{\"\\n\"}{end}";
        let mut placed: Vec<(usize, String)> = Vec::new();
        let mut on: BTreeMap<String, usize> = BTreeMap::new();
        for line in self.app_pods(cp, path).lines() {
            let (node, pod) = line.split_once(' ').expect("a node and a pod");
            let k = on.entry(node.to_string()).or_default();
            placed.push((*k, pod.to_string()));
            *k += 1;
        }
        placed.sort();
        let pods: Vec<String> = placed.into_iter().take(n as usize).map(|(_, p)| p).collect();
        assert_eq!(pods.len(), n as usize, "{n} pods to delete in {}", self.ns);
        let timeout = format!("--timeout={}s", self.case.grace + 60);
        let mut delete = vec!["delete", "pod", "-n", &self.ns, &timeout];
        delete.extend(pods.iter().map(String::as_str));
        let started = Instant::now();
        let done = cp.kubectl(&delete);
        assert!(done.ok, "kubectl delete pod in {}: {}", self.ns, done.stderr);
        Ended { took: started.elapsed(), pods, refused: 0 }
    }

    /// Each pod's app preStop, and with sidecars its istio-proxy's, are the row's.
    fn hooks_are_the_rows(&self, cp: &ControlPlane) {
        let ns = self.ns.as_str();
        let hooks = cp.ok(&[
            "get",
            "pods",
            "-n",
            ns,
            "-l",
            "app=app",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.containers[?(@.name==\"app\")].lifecycle.preStop}{\"\\n\"}{end}",
        ]);
        let expected = match self.case.shutdown {
            _ if self.case.mesh == DataPlane::Waypoint => "",
            Shutdown::None | Shutdown::ExitOnZero => "",
            Shutdown::Sleep(_) => "\"sleep\"",
            Shutdown::EnvoyDrain => "\"hold\"",
        };
        assert_eq!(hooks.lines().count(), self.case.replicas as usize, "{hooks}");
        assert!(
            hooks.lines().all(|h| expected.is_empty() != h.contains('{') && h.contains(expected)),
            "each pod's app preStop in {ns} is the row's ({:?}): {hooks}",
            self.case.shutdown
        );
        if let DataPlane::Sidecar { native } = self.case.mesh {
            // The proxy where the ordering puts it, with the template's `run` only in its rows.
            let field = if native { "initContainers" } else { "containers" };
            let path = format!(
                "jsonpath={{range .items[*]}}{{.spec.{field}[?(@.name==\"istio-proxy\")].\
                 lifecycle.preStop.exec.command}}{{\"\\n\"}}{{end}}"
            );
            let proxies = cp.ok(&["get", "pods", "-n", ns, "-l", "app=app", "-o", &path]);
            let ours = self.case.shutdown == Shutdown::EnvoyDrain;
            assert_eq!(proxies.lines().count(), self.case.replicas as usize, "{proxies}");
            assert!(
                proxies.lines().all(|p| p.contains("\"/envoy-drain/envoy-drain\",\"run\"") == ours),
                "each pod's istio-proxy ({field}) preStop in {ns} is the row's: {proxies}"
            );
        }
    }

    /// hey in the client pod (`kubectl exec`), to the Service.
    fn hey(&self, cp: &ControlPlane, args: &[&str]) -> std::process::Command {
        let mut cmd =
            cp.kubectl_command(&["exec", "-n", &self.ns, &self.client, "-c", "client", "--"]);
        cmd.arg("/usr/bin/hey").args(args);
        cmd
    }

    /// One download of `Clients::Downloads` in the client pod (wget, `kubectl exec`), to the
    /// Service: what went wrong, if anything. wget checks the length the answer announced, tries
    /// once, and says where a download stopped.
    fn download(&self, cp: &ControlPlane) -> Result<(), String> {
        let mut cmd =
            cp.kubectl_command(&["exec", "-n", &self.ns, &self.client, "-c", "client", "--"]);
        let url = format!("http://{}:{DOWNLOAD_PORT}/bytes/{DOWNLOAD}", self.ip);
        let rate = format!("--limit-rate={DOWNLOAD_RATE}");
        cmd.args([
            "/usr/bin/wget",
            "--progress=dot:giga",
            "--tries=1",
            "--timeout=60",
            &rate,
            "-O",
            "/dev/null",
        ]);
        let out = cmd.arg(&url).output().map_err(|e| format!("kubectl exec of wget: {e}"))?;
        let said = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            // wget's last line: `'/dev/null' saved [3000000/3000000]`, the bytes it got of those
            // announced.
            Some(0) if said.contains(&format!("saved [{DOWNLOAD}/{DOWNLOAD}]")) => Ok(()),
            Some(0) => Err(format!("download: not {DOWNLOAD} bytes ({})", said.trim())),
            // wget's exit codes (wget(1), EXIT STATUS): 8 an error status, 4 the network's.
            Some(8) => Err(match said.split_once("ERROR ") {
                Some((_, e)) => format!("download: status {}", e.split(':').next().unwrap_or(e)),
                None => "download: an error status".into(),
            }),
            Some(4) if said.contains("Connection closed at byte") => {
                Err("download cut short (closed)".into())
            }
            Some(4) if said.contains("Read error at byte") && said.contains("reset by peer") => {
                Err("download cut short (reset)".into())
            }
            Some(4) if said.contains("Read error at byte") => {
                Err("download cut short (read error)".into())
            }
            Some(4) if said.contains("Connection refused") => Err("download: refused".into()),
            Some(c) => Err(format!("download failed (wget exit {c}: {})", said.trim())),
            None => Err("download: wget killed".into()),
        }
    }

    /// The URL the load asks (the case's request length), which also finds hey's process.
    fn url(&self) -> String {
        let seconds = f64::from(self.case.request_ms) / 1000.0;
        match self.case.request_ms {
            ..1000 => format!("http://{}/local/{seconds}", self.ip),
            _ => format!("http://{}/local/{}-{}", self.ip, seconds / 2.0, seconds * 1.5),
        }
    }

    /// With a waypoint, `envoy-drain status --preset waypoint` in the network namespace of one of
    /// its pods, as `kubectl debug` would run it there; else nothing.
    fn waypoint_status(&self) -> String {
        if self.case.mesh != DataPlane::Waypoint {
            return String::new();
        }
        let pod = format!("POD_NAME={}", self.old[0]);
        let pid = process("envoy", "environ", &[&pod]).expect("the waypoint's Envoy");
        let out = std::process::Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-n", RELEASE, "status", "--preset", "waypoint"])
            .output()
            .expect("nsenter (util-linux)");
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    /// Waits for the restart's rollout and the old pods to be gone: how long after `restarted`.
    fn rolled(&self, cp: &ControlPlane, node: &Node, restarted: Instant) -> Duration {
        let ns = self.ns.as_str();
        // Bounded by the pods' grace periods (a waypoint's: examples/waypoint.yaml's at most),
        // one after the other, and their starts.
        let (replicas, grace) = match self.case.mesh {
            DataPlane::Waypoint => (2, 60),
            _ => (self.case.replicas, self.case.grace),
        };
        let timeout = format!("--timeout={}s", 30 + replicas * (grace + 10));
        let deployment = self.restarted().0;
        let rolled = cp.kubectl(&["rollout", "status", "-n", ns, deployment, &timeout]);
        assert!(
            rolled.ok,
            "the restart of {ns}: {}\n{}",
            rolled.stderr,
            node.log_tail("kubelet", 4)
        );
        let old_pods: Vec<String> = self.old.iter().map(|p| format!("pod/{p}")).collect();
        let timeout = format!("--timeout={}s", 30 + grace);
        let mut wait = vec!["wait", "-n", ns, "--for=delete", &timeout];
        wait.extend(old_pods.iter().map(String::as_str));
        let gone = cp.kubectl(&wait);
        assert!(gone.ok, "the old pods of {ns} to be gone: {}", gone.stderr);
        restarted.elapsed()
    }
}

/// One case's load and what watches it: hey, the case's requests a second from the client pod; the
/// endpoints in the client's data path; the app pods' deletions.
struct Load<'s> {
    hey: std::process::Child,
    seen: Withdrawals,
    deleted: Deletions,
    /// `Clients::Downloads`' slow clients: told to stop after their download in progress, each
    /// returns what became of its downloads.
    stop: Arc<AtomicBool>,
    downloaders: Vec<std::thread::ScopedJoinHandle<'s, Vec<Result<(), String>>>>,
}

impl<'s> Load<'s> {
    /// Starts once the Service answers the client: its rules (kube-proxy) or endpoints (istiod)
    /// reach the client a moment after the pods are ready, so once 30 requests in a row answer.
    /// The slow clients run in `scope`, which outlives the load.
    fn start<'e>(
        cp: &'e ControlPlane,
        nodes: &[Node],
        side: &'e Side,
        scope: &'s std::thread::Scope<'s, 'e>,
    ) -> Load<'s> {
        let url = format!("http://{}/local/0", side.ip);
        cp.wait_for(&format!("the Service of {} to answer the client", side.ns), || {
            let probe = ["-n", "30", "-c", "1", "-disable-keepalive", "-t", "2", url.as_str()];
            let out = side.hey(cp, &probe).output().ok()?;
            let (ok, failed) = tally(&String::from_utf8_lossy(&out.stdout));
            (ok == 30 && failed.is_empty()).then_some(())
        });
        let seen = Withdrawals::follow(cp, nodes, side);
        let deleted = Deletions::follow(cp, &side.ns, side.restarted().1);
        // Until told to stop (`stop`), at most ten minutes. Workers share the rate, each at most
        // half of what it could: a worker waits for each answer (50 ms: 10 of them top out at
        // 200). Long requests go back to back, as many workers as the rate needs: hey's limit of
        // a rate starts every worker's requests at once, and their spread lengths part them.
        let (rate, request) = (side.case.rate, side.case.request_ms);
        let long = request >= 1000;
        let workers = (rate * request * if long { 1 } else { 2 }).div_ceil(1000).max(10);
        let each = format!("{}", f64::from(rate) / f64::from(workers));
        let (workers, timeout) = (workers.to_string(), (request * 3 / 2000 + 10).to_string());
        let mut load = vec!["-z", "600s", "-c", &workers, "-t", &timeout];
        if !long {
            load.extend(["-q", &each]);
        }
        if side.case.clients == Clients::NewConn {
            load.push("-disable-keepalive");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let downloaders = match side.case.clients {
            Clients::Downloads => DOWNLOADERS,
            _ => 0,
        };
        // Bounded: a download ends whole, cut, or after 60 s without a byte (wget's --timeout),
        // at most 60 each, and they stop when told (the load's end).
        let downloaders = (0..downloaders)
            .map(|_| {
                let stop = Arc::clone(&stop);
                scope.spawn(move || {
                    let mut done = Vec::new();
                    while !stop.load(Ordering::SeqCst) && done.len() < 60 {
                        done.push(side.download(cp));
                    }
                    done
                })
            })
            .collect();
        let url = side.url();
        load.push(&url);
        let hey = side
            .hey(cp, &load)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("NOT RUN: kubectl exec of hey");
        Load { hey, seen, deleted, stop, downloaders }
    }

    /// Stops hey as on Ctrl-C (SIGINT: it finishes the requests in flight and prints its summary)
    /// and reads the case's row from it, the watches and the pods' logs.
    fn stop(self, side: &Side, ended: &[String], logs: &BTreeMap<String, String>) -> Row {
        let pid =
            process("hey", "cmdline", &[&side.url()]).expect("hey's process in the client pod");
        // SAFETY: a signal to the load generator this test started.
        unsafe { libc::kill(pid as i32, libc::SIGINT) };
        let out = self.hey.wait_with_output().expect("hey's output");
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && report.contains("Summary:"),
            "hey's report in {}, whole: {report}{}",
            side.ns,
            String::from_utf8_lossy(&out.stderr)
        );
        let (mut ok, mut failed) = tally(&report);
        let mut downloaded = 0;
        self.stop.store(true, Ordering::SeqCst);
        for downloads in self.downloaders.into_iter().map(|d| d.join().expect("a downloader")) {
            for download in downloads {
                match download {
                    Ok(()) => downloaded += 1,
                    Err(why) => match failed.iter_mut().find(|(e, _)| *e == why) {
                        Some((_, n)) => *n += 1,
                        None => failed.push((why, 1)),
                    },
                }
            }
        }
        let (seen, deleted) = (self.seen.stop(), self.deleted.stop());
        let (holds, records) = holds(side, ended, logs);
        let propagation = ended
            .iter()
            .map(|pod| {
                let (at, ip) = deleted.get(pod)?;
                let left = seen.get(ip).or_else(|| seen.get(pod))?;
                // Negative where the data path dropped it before the watch saw the deletion.
                Some(match left.checked_duration_since(*at) {
                    Some(after) => after.as_secs_f64(),
                    None => -at.duration_since(*left).as_secs_f64(),
                })
            })
            .collect();
        let diagnosis = format!("hey: {}", String::from_utf8_lossy(&out.stderr).trim());
        let took = Duration::ZERO;
        let status = String::new();
        ok += downloaded;
        Row {
            case: side.case,
            ok,
            downloaded,
            failed,
            took,
            holds,
            records,
            propagation,
            diagnosis,
            status,
            refused: 0,
            started: Vec::new(),
        }
    }
}

/// The elements of a JSON list, none where it is missing.
fn each(list: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    list.as_array().into_iter().flatten()
}

/// `2026-12-07T23:50:01Z`, the API server's times, as seconds since 1970 (days from the civil
/// date as in Howard Hinnant's `days_from_civil`).
fn unix_seconds(t: &str) -> Option<i64> {
    let n = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (h, min, sec) = (n(11..13)?, n(14..16)?, n(17..19)?);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(days * 86_400 + h * 3600 + min * 60 + sec)
}

/// For each pod of `side` the operation ended (`ended`), from its log in `logs`: when its hold
/// ended after its last request, and its summary; and the holds' records.
fn holds(
    side: &Side,
    ended: &[String],
    logs: &BTreeMap<String, String>,
) -> (Vec<(Option<f64>, String)>, Vec<String>) {
    let mut records = Vec::new();
    let holds = ended
        .iter()
        .map(|pod| {
            let dir = format!("{}_{pod}_", side.ns);
            let Some((_, text)) = logs.iter().find(|(d, _)| d.starts_with(&dir)) else {
                return (None, "(no log read)".to_string());
            };
            let (after, summary, record) = hold_end(text);
            records.extend(record);
            (after, summary)
        })
        .collect();
    (holds, records)
}

/// The rendered DaemonSets of istio-cni and ztunnel on the node's paths (`netns`: containerd's
/// network namespaces) rather than the machine's. Each edit must apply: one missed would leave a
/// DaemonSet on the machine's own paths (its CNI configuration, /var/run) or on PID 1's
/// namespace.
fn on_the_node(mut daemonsets: String, node: &Node, netns: &str) -> String {
    let (cni_run, ztunnel_run) = (node.path("istio-cni"), node.path("ztunnel"));
    let mut edit = |from: &str, to: &str| {
        assert!(daemonsets.contains(from), "the rendered DaemonSets lack {from:?}: {daemonsets}");
        daemonsets = daemonsets.replace(from, to);
    };
    edit("path: /opt/cni/bin\n", &format!("path: {}\n", node.path("cni-bin")));
    edit("path: /etc/cni/net.d\n", &format!("path: {}\n", node.path("cni")));
    edit("path: /proc\n", &format!("path: {}\n", node.path("proc")));
    edit("path: /var/run/netns\n", &format!("path: {netns}\n"));
    edit("mountPath: /host/var/run/netns\n", &format!("mountPath: /host{netns}\n"));
    edit("path: /var/run/istio-cni\n", &format!("path: {cni_run}\n"));
    edit("path: /var/run/ztunnel\n", &format!("path: {ztunnel_run}\n"));
    // The agent's directory is where the plugin (run by containerd, outside any container) finds
    // the agent's socket: the same path inside the agent's container.
    edit("- mountPath: /var/run/istio-cni\n", &format!("- mountPath: {cni_run}\n"));
    // What the istio-cni chart renders with `ambient.shareHostNetworkNamespace` (which istioctl's
    // schema does not take): hostNetwork, and no switch to PID 1's namespace.
    edit(
        "    spec:\n      containers:\n      - args:\n        - --log_output_level",
        "    spec:\n      hostNetwork: true\n      dnsPolicy: ClusterFirstWithHostNet\n      \
         containers:\n      - args:\n        - --log_output_level",
    );
    edit("        - name: ALLOW_SWITCH_TO_HOST_NS\n          value: \"true\"\n", "");
    edit(
        "- name: REPAIR_SIDECAR_ANNOTATION",
        &format!(
            "- name: CNI_AGENT_RUN_DIR\n          value: {cni_run}\n        \
             - name: REPAIR_SIDECAR_ANNOTATION"
        ),
    );
    // Every host path is the node's now.
    let lines: Vec<&str> = daemonsets.lines().collect();
    for pair in lines.windows(2) {
        if pair[0].trim_start().starts_with("- hostPath:") || pair[0].trim() == "hostPath:" {
            let path = pair[1].trim().trim_start_matches("path: ");
            assert!(path.starts_with(&node.path("")), "a host path off the node: {path}");
        }
    }
    daemonsets
}

/// istiod with ambient's profile, and the ztunnel and istio-cni DaemonSets its charts render, as
/// installed on a node whose host paths are the test's: the CNI configuration and plugins
/// (containerd's in node.rs), the pods' network namespaces (containerd's, under its state
/// directory, mounted at the same path under /host, where istio-cni looks for a path the plugin
/// hands it), and the sockets istio-cni and ztunnel share. ztunnel and the plugin reach istiod at
/// the node's address, with the name its certificate holds (ztunnel's ALT_XDS_HOSTNAME and
/// ALT_CA_HOSTNAME). istio-cni shares the node's network namespace (the chart's
/// `ambient.shareHostNetworkNamespace`): by default it enters the namespace of the machine's PID 1
/// for the node's rules, and the node's network here is the test's own namespace. Returns once
/// both DaemonSets' pods are ready.
fn ambient(cp: &ControlPlane, nodes: &[Node], debounce: Option<Duration>) -> Vec<NodeInit> {
    let san = format!("istiod-{REVISION}.istio-system.svc");
    let overlay = format!(
        "apiVersion: install.istio.io/v1alpha1\nkind: IstioOperator\nspec:\n  components:\n    \
         cni: {{enabled: true}}\n    ztunnel: {{enabled: true}}\n  values:\n    profile: ambient\n    \
         global: {{variant: \"\"}}\n    ztunnel:\n      caAddress: {ISTIOD}\n      xdsAddress: \
         {ISTIOD}\n      env: {{ALT_XDS_HOSTNAME: {san}, ALT_CA_HOSTNAME: {san}}}\n"
    );
    let file = nodes[0].path("ambient.iop.yaml");
    std::fs::write(&file, overlay).expect("the ambient overlay");
    let env = istiod_env(debounce, true);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let daemonsets = cp.start_istiod(REVISION, &istiod_values(), &[Path::new(&file)], 0, &env);
    // Node-1's paths, which on every node name its own (node.rs `seen`).
    let node = &nodes[0];
    let netns_dir = "containerd/state/io.containerd.grpc.v1.cri/netns";
    let netns = node.path(netns_dir);
    let mut inits = Vec::new();
    for each in nodes {
        std::fs::create_dir_all(each.path(netns_dir)).expect("containerd's network namespaces");
        // istio-cni mounts it HostToContainer: the pods' namespaces that containerd mounts there
        // later must reach its container, which a shared mount does (node.rs unmounts it at the
        // end, or the node's mount namespace goes with it).
        for args in [vec!["--bind", &netns, &netns], vec!["--make-shared", &netns]] {
            let ok = each.command("mount").args(&args).status().expect("mount");
            assert!(ok.success(), "mount {args:?} on {}", each.name());
        }
        inits.push(NodeInit::start(cp, each, &node.path("proc")));
    }
    let daemonsets = on_the_node(daemonsets, node, &netns);
    assert_eq!(daemonsets.matches("hostNetwork: true").count(), 1, "{daemonsets}");
    cp.ok_with(&["apply", "-f", "-"], Some(&daemonsets));
    for ds in ["daemonset/istio-cni-node", "daemonset/ztunnel"] {
        let status = ["rollout", "status", "-n", "istio-system", ds, "--timeout=90s"];
        let rolled = cp.kubectl(&status);
        assert!(rolled.ok, "{ds}: {}\n{}", rolled.stderr, node.log_tail("kubelet", 6));
    }
    inits
}

/// The node's /proc as istio-cni reads it: a process table whose PID 1 lives in the node's
/// network namespace, which istio-cni takes for the host's (podcgroupns_linux.go
/// `statHostNetns` reads `1/ns/net`). This machine's own PID 1 is outside the test's reach
/// (reading its namespace is refused, also to root): an init of the node's own, in a PID
/// namespace of its own, whose proc is mounted at `path`. istio-cni finds a new pod's namespace
/// by the path its CNI plugin hands it; the table serves it only for pods that ran before it
/// started, which here are none.
struct NodeInit {
    child: std::process::Child,
}

impl NodeInit {
    /// `node`'s init, its proc mounted at `path` as the node's processes see it.
    fn start(cp: &ControlPlane, node: &Node, path: &str) -> NodeInit {
        std::fs::create_dir_all(node.path("proc")).expect("the node's proc");
        let child = node
            .command("unshare")
            .args(["--pid", "--fork", "--kill-child", "sleep", "3600"])
            .spawn()
            .expect("unshare (util-linux)");
        let init = cp.wait_for("the node's init", || {
            let children = std::fs::read_to_string(format!(
                "/proc/{}/task/{}/children",
                child.id(),
                child.id()
            ))
            .ok()?;
            children.split_whitespace().next().map(String::from)
        });
        let mounted = node
            .command("nsenter")
            .args(["--target", &init, "--pid", "--", "mount", "-t", "proc", "proc", path])
            .status()
            .expect("nsenter (util-linux)");
        assert!(mounted.success(), "the node's proc at {path}");
        NodeInit { child }
    }
}

impl Drop for NodeInit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// When each app pod left the data path, polled every 100 ms on every node that has one, the
/// slowest node's time: the client's Envoy's /clusters (admin on 127.0.0.1:15000 in its pod,
/// which the test enters), each node's kube-proxy rules (in the node's namespace), or each node's
/// ztunnel's /config_dump (in its pod).
struct Withdrawals {
    stop: Stop,
    thread: std::thread::JoinHandle<BTreeMap<String, Instant>>,
}

/// Tells a poller's thread to end once dropped: by its `stop`, or on a failure of the test.
struct Stop(Arc<AtomicBool>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A reading of one data path's endpoints.
type Reader = Box<dyn FnMut() -> Option<String> + Send>;

/// What reads the data path for `side`: each node's kube-proxy rules without a mesh, the
/// client's sidecar's /clusters, or each node's ztunnel's /config_dump in ambient mode.
fn data_path_readers(cp: &ControlPlane, nodes: &[Node], side: &Side) -> Vec<Reader> {
    match side.case.mesh {
        DataPlane::None => nodes
            .iter()
            .map(|node| {
                let mut save = node.command("iptables-save");
                save.args(["-t", "nat"]);
                Box::new(move || {
                    let out = save.output().ok()?;
                    Some(String::from_utf8_lossy(&out.stdout).into_owned())
                }) as Reader
            })
            .collect(),
        DataPlane::Sidecar { .. } => {
            let pod = [format!("POD_NAME={}", side.client), format!("POD_NAMESPACE={}", side.ns)];
            let pid = process("pilot-agent", "environ", &[&pod[0], &pod[1]])
                .unwrap_or_else(|| panic!("the client pod {}'s pilot-agent", side.client));
            let netns = Netns::of_process(pid).expect("the client pod's network namespace");
            vec![Box::new(move || netns.enter(|| admin_get("127.0.0.1:15000", "/clusters")))]
        }
        DataPlane::Ambient | DataPlane::Waypoint => {
            let path = "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}";
            let ztunnels =
                cp.ok(&["get", "pods", "-n", "istio-system", "-l", "app=ztunnel", "-o", path]);
            assert_eq!(ztunnels.lines().count(), nodes.len(), "a ztunnel a node: {ztunnels}");
            ztunnels
                .lines()
                .map(|ztunnel| {
                    let pod = format!("POD_NAME={ztunnel}");
                    let pid = process("ztunnel", "environ", &[&pod])
                        .unwrap_or_else(|| panic!("the node's ztunnel {ztunnel}"));
                    let netns = Netns::of_process(pid).expect("ztunnel's network namespace");
                    Box::new(move || netns.enter(|| admin_get("127.0.0.1:15000", "/config_dump")))
                        as Reader
                })
                .collect()
        }
    }
}

impl Withdrawals {
    fn follow(cp: &ControlPlane, nodes: &[Node], side: &Side) -> Withdrawals {
        let stop = Arc::new(AtomicBool::new(false));
        let mut readers = data_path_readers(cp, nodes, side);
        let ns = side.ns.clone();
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                // For each reader (a node's data path): each address it listed, and when it
                // left (`None`: listed at its last good reading).
                let mut listed = vec![BTreeMap::<String, Option<Instant>>::new(); readers.len()];
                // Bounded in time: longer than any operation's own bound.
                let until = Instant::now() + Duration::from_secs(900);
                while !stop.load(Ordering::SeqCst) && Instant::now() < until {
                    for (read, listed) in readers.iter_mut().zip(&mut listed) {
                        // A reading that lists none of the app's pods (an error, a cut answer)
                        // tells nothing: it is not taken for every pod leaving.
                        let now = read().map(|text| endpoint_ips(&text, &ns)).unwrap_or_default();
                        if now.is_empty() {
                            continue;
                        }
                        for ip in &now {
                            listed.insert(ip.clone(), None);
                        }
                        for (ip, left) in listed.iter_mut() {
                            if left.is_none() && !now.contains(ip) {
                                *left = Some(Instant::now());
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                slowest(&listed)
            })
        };
        Withdrawals { stop: Stop(stop), thread }
    }

    /// Each address that was listed and then left, with when (on the slowest node).
    fn stop(self) -> BTreeMap<String, Instant> {
        let Withdrawals { stop, thread } = self;
        drop(stop);
        thread.join().unwrap_or_default()
    }
}

/// Each address every node's data path dropped, with when the slowest one did: none where a
/// node still listed it at its last good reading, and none at all where a node never read.
fn slowest(listed: &[BTreeMap<String, Option<Instant>>]) -> BTreeMap<String, Instant> {
    let mut left = BTreeMap::new();
    if listed.iter().any(BTreeMap::is_empty) {
        return left;
    }
    let ips: std::collections::BTreeSet<&String> = listed.iter().flat_map(|l| l.keys()).collect();
    for ip in ips {
        let on_each: Option<Vec<Instant>> =
            listed.iter().filter_map(|l| l.get(ip)).copied().collect();
        if let Some(last) = on_each.and_then(|times| times.into_iter().max()) {
            left.insert(ip.clone(), last);
        }
    }
    left
}

/// What names each app pod of namespace `ns` in the client's data path: its address in Envoy's
/// /clusters (`outbound|80||app.shop-0.svc.cluster.local::10.244.0.3:8080::health_flags::healthy`)
/// or kube-proxy's rules (`--comment "shop-0/app:http" ... -j DNAT --to-destination
/// 10.244.0.3:8080`); its name among the Service's endpoints that ztunnel's /config_dump holds as
/// healthy (`"Kubernetes//Pod/shop-0/app-...": {"port": ..., "status": "Healthy", ...}`; istiod
/// marks a terminating pod's otherwise).
pub fn endpoint_ips(text: &str, ns: &str) -> Vec<String> {
    let cluster = format!("outbound|80||app.{ns}.svc.cluster.local::");
    let rule = format!("--comment \"{ns}/app:http\"");
    let mut ips: Vec<String> = text
        .lines()
        .filter_map(|l| {
            if let Some(rest) = l.strip_prefix(&cluster) {
                return rest.contains("::health_flags::").then(|| rest.split(':').next())?;
            }
            let (_, to) = l.split_once("--to-destination ").filter(|_| l.contains(&rule))?;
            to.strip_suffix(":8080")
        })
        .map(String::from)
        .collect();
    let key = format!("\"Kubernetes//Pod/{ns}/");
    let mut rest = text;
    while let Some(at) = rest.find(&key) {
        rest = &rest[at + key.len()..];
        let Some((name, after)) = rest.split_once('"') else { break };
        // A key of the endpoints (a workload's uid as a value is not followed by an object).
        if !after.starts_with(": {") {
            continue;
        }
        let status = after.split_once("\"status\": \"").map(|(_, s)| s.split('"').next());
        if status == Some(Some("Healthy")) {
            ips.push(name.to_string());
        }
    }
    ips.sort();
    ips.dedup();
    ips
}

/// One GET to an admin API: the answer, if it is a 200.
fn admin_get(addr: &str, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.starts_with("HTTP/1.1 200").then_some(text)
}

/// The process `program` (its comm) whose `file` in /proc (`cmdline`, `environ`) holds each of
/// `entries`: a pod's program by the POD_NAME and POD_NAMESPACE that Istio's injection and
/// ztunnel's chart set, hey by its URL.
fn process(program: &str, file: &str, entries: &[&str]) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        let held = std::fs::read(e.path().join(file)).ok()?;
        let ours = comm.trim() == program
            && entries.iter().all(|w| held.split(|b| *b == 0).any(|v| v == w.as_bytes()));
        ours.then_some(pid)
    })
}

/// In ambient mode, every pod of the namespace captured: istio-cni marks a pod it has handed to
/// ztunnel (`ambient.istio.io/redirection: enabled`); without it the client's requests would go
/// by kube-proxy alone and the row would be no mesh's.
fn assert_captured(cp: &ControlPlane, side: &Side) {
    if !side.case.mesh.ambient() {
        return;
    }
    let marks = cp.ok(&[
        "get",
        "pods",
        "-n",
        &side.ns,
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}|{.metadata.deletionTimestamp}|\
         {.metadata.annotations.ambient\\.istio\\.io/redirection}{\"\\n\"}{end}",
    ]);
    // The pods that serve now (the app's, the client); those being deleted may be released. A
    // waypoint is a proxy of its own, never captured (istiod's template labels it so).
    let serving: Vec<&str> = marks
        .lines()
        .filter(|l| l.split('|').nth(1) == Some("") && !l.starts_with("waypoint-"))
        .collect();
    let replicas = match side.case.operation {
        Operation::Scale(n) => n,
        _ => side.case.replicas,
    };
    assert!(
        serving.len() > replicas as usize && serving.iter().all(|l| l.ends_with("|enabled")),
        "every pod that serves in {} captured by istio-cni: {marks}",
        side.ns
    );
}

/// When the test saw each restarted pod marked for deletion (a watch of the API server), and its
/// address.
struct Deletions {
    child: std::process::Child,
    thread: Option<std::thread::JoinHandle<BTreeMap<String, (Instant, String)>>>,
}

impl Deletions {
    fn follow(cp: &ControlPlane, ns: &str, label: &str) -> Deletions {
        let mut child = cp
            .kubectl_command(&[
                "get",
                "pods",
                "-n",
                ns,
                "-l",
                label,
                "--watch",
                "-o",
                "jsonpath={.metadata.name} {.status.podIP} {.metadata.deletionTimestamp}{\"\\n\"}",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl get --watch");
        let out = child.stdout.take().expect("its output");
        let thread = std::thread::spawn(move || {
            let mut deleted = BTreeMap::new();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut parts = line.split_whitespace();
                if let (Some(pod), Some(ip), Some(_)) = (parts.next(), parts.next(), parts.next()) {
                    deleted.entry(pod.to_string()).or_insert((Instant::now(), ip.to_string()));
                }
            }
            deleted
        });
        Deletions { child, thread: Some(thread) }
    }

    fn stop(mut self) -> BTreeMap<String, (Instant, String)> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

/// A failed row's watch ends with it.
impl Drop for Deletions {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What hey printed: requests answered 200, and each other status or error with its count
/// (`[200]\t5334 responses` under "Status code distribution", `[42]\tGet "...": <error>` under
/// "Error distribution"), the same error from different addresses counted as one.
pub fn tally(out: &str) -> (u64, Vec<(String, u64)>) {
    let mut ok = 0;
    let mut failed = Vec::new();
    let mut errors = false;
    for line in out.lines().map(str::trim) {
        errors |= line.starts_with("Error distribution:");
        let Some(rest) = line.strip_prefix('[') else { continue };
        let Some((inside, what)) = rest.split_once(']') else { continue };
        let what = what.trim();
        if errors {
            // The error's last part, without the URL and the addresses that make each one
            // unique: `Get "http://...": read tcp 10.244.0.14:42486->...: read: connection reset
            // by peer` is one more `connection reset by peer`.
            let error = what.rsplit_once(": ").map_or(what, |(_, e)| e);
            let n = inside.parse().unwrap_or(0);
            match failed.iter_mut().find(|(e, _)| e == error) {
                Some((_, count)) => *count += n,
                None => failed.push((error.to_string(), n)),
            }
        } else {
            let count = what.split_whitespace().next().and_then(|c| c.parse().ok()).unwrap_or(0);
            if inside == "200" {
                ok += count;
            } else {
                failed.push((format!("status {inside}"), count));
            }
        }
    }
    (ok, failed)
}

/// When the hold ended after the last request the pod received, in seconds, its summary, and its
/// record: from the CRI log lines (`<RFC 3339 time> stdout F <line>`), the hold's a JSON object.
fn hold_end(log: &str) -> (Option<f64>, String, Option<String>) {
    let mut last_request = None;
    let mut done = None;
    for line in log.lines() {
        let mut parts = line.splitn(4, ' ');
        let (Some(time), Some(_), Some(_), Some(text)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if text.starts_with("received /local") && !text.contains("probe") {
            last_request = seconds_of_day(time);
        }
        // The hold's last line (src/text.rs `summary` as its `msg`), however it ended.
        if text.starts_with('{') && text.contains("\"event\":\"summary\"") {
            let msg = text.split_once("\"msg\":\"").map_or("", |(_, m)| m);
            let msg = msg.split_once("\",\"event\"").map_or(msg, |(m, _)| m);
            done = Some((seconds_of_day(time), msg.to_string(), text.to_string()));
        }
    }
    match done {
        // Negative where requests still came after it (kept-alive clients); a day's wrap undone.
        Some((Some(end), summary, record)) => (
            last_request.map(|r| (end - r + 43200.0).rem_euclid(86400.0) - 43200.0),
            summary,
            Some(record),
        ),
        // Without a hook, a proxy's end as pilot-agent tells it (pkg/envoy/agent.go).
        _ => {
            let agent = log.lines().rev().find(|l| {
                l.contains("active connections") || l.contains("Graceful termination period")
            });
            let said = agent.and_then(|l| l.split('\t').next_back());
            (None, said.map_or("no hold".to_string(), |l| format!("pilot-agent: {l}")), None)
        }
    }
}

/// `2026-11-29T04:03:51.123456789Z` as seconds since midnight.
fn seconds_of_day(time: &str) -> Option<f64> {
    let clock = time.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = clock.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// The pods' log files on every node, read every 100 ms while the kubelets write them (each
/// removes them with the pod): each pod's directory and container (`app`, `istio-proxy`), and
/// what it wrote.
struct Logs {
    stop: Stop,
    read: Arc<Mutex<BTreeMap<String, String>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Logs {
    fn follow(dirs: Vec<PathBuf>) -> Logs {
        let stop = Arc::new(AtomicBool::new(false));
        let read: Arc<Mutex<BTreeMap<String, String>>> = Arc::new(Mutex::new(BTreeMap::new()));
        let thread = {
            let (stop, read) = (Arc::clone(&stop), Arc::clone(&read));
            std::thread::spawn(move || {
                // Bounded in time: longer than any operation's own bound.
                let until = Instant::now() + Duration::from_secs(900);
                while Instant::now() < until {
                    let last = stop.load(Ordering::SeqCst);
                    let pods = dirs.iter().flat_map(|d| std::fs::read_dir(d).into_iter().flatten());
                    for pod in pods.flatten() {
                        for container in ["app", "istio-proxy"] {
                            let file = pod.path().join(container).join("0.log");
                            let Ok(text) = std::fs::read_to_string(&file) else { continue };
                            let name = pod.file_name().to_string_lossy().into_owned();
                            let mut read = read.lock().expect("the logs");
                            let kept = read.entry(format!("{name}/{container}")).or_default();
                            if text.len() > kept.len() {
                                *kept = text;
                            }
                        }
                    }
                    if last {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Logs { stop: Stop(stop), read, thread }
    }

    fn stop(self) -> BTreeMap<String, String> {
        let Logs { stop, read, thread } = self;
        drop(stop);
        let _ = thread.join();
        std::mem::take(&mut *read.lock().expect("the logs"))
    }
}
