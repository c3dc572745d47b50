//! Three real nodes (tests/support/node.rs `start_nodes`), each with its kubelet, containerd and
//! kube-proxy in a network of its own: a Service's traffic from a pod on one node reaches pods on
//! the two others, and `kubectl drain` evicts through a PodDisruptionBudget, which refuses the
//! eviction that would break it (the Eviction API's 429). The ground the cluster rows of
//! issue 68 (node drains, scale-in, deletes across nodes) stand on.

mod support;

use support::cluster::{ControlPlane, Nodes};
use support::node::Node;
use support::rollout::{base_images, endpoint_ips, tally};

/// Two replicas of the app, one a node, never on node-1; a budget that keeps one; the client
/// on node-1.
const WORKLOAD: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: app, namespace: shop}
spec:
  replicas: 2
  selector: {matchLabels: {app: app}}
  template:
    metadata: {labels: {app: app}}
    spec:
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{key: kubernetes.io/hostname, operator: NotIn, values: [node-1]}]
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {labelSelector: {matchLabels: {app: app}}, topologyKey: kubernetes.io/hostname}
      containers:
      - name: app
        image: localhost/app:test
        args: [serve]
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: '/local/0?probe', port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: app, namespace: shop}
spec:
  selector: {app: app}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: app, namespace: shop}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: app}}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: shop}
spec:
  nodeName: node-1
  containers: [{name: client, image: localhost/client:test}]
";

#[test]
#[ignore = "needs root, the control plane and the nodes built from source (`bash scripts/test`)"]
fn a_service_reaches_pods_on_other_nodes_and_a_drain_evicts_through_the_budget() {
    let cp = ControlPlane::start_with("nodes", "kube-apiserver", &[], Nodes::Kubelet);
    let nodes = Node::start_nodes(&cp, 3, &base_images(&cp));
    let names: Vec<String> = nodes.iter().map(Node::name).collect();
    assert_eq!(names, ["node-1", "node-2", "node-3"]);
    cp.namespace("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n", "shop");
    cp.ok_with(&["apply", "-f", "-"], Some(WORKLOAD));
    let rolled =
        cp.kubectl(&["rollout", "status", "-n", "shop", "deployment/app", "--timeout=90s"]);
    assert!(rolled.ok, "{}\n{}", rolled.stderr, nodes[1].log_tail("kubelet", 6));
    cp.ok(&["wait", "-n", "shop", "pod/client", "--for=condition=Ready", "--timeout=60s"]);
    let placed = app_pods(&cp);
    let on: Vec<&str> = placed.iter().map(|(_, node, _)| node.as_str()).collect();
    assert_eq!(on, ["node-2", "node-3"], "one replica on each node but the client's: {placed:?}");

    // From node-1, through its kube-proxy's rules, to both pods on the other nodes, once its
    // rules have them (before, the Service's rule rejects: `connection refused`).
    cp.wait_for("node-1's kube-proxy to send to both replicas", || {
        let rules = nodes[0].command("iptables-save").output().expect("iptables-save");
        (endpoint_ips(&String::from_utf8_lossy(&rules.stdout), "shop").len() == 2).then_some(())
    });
    let ip = cp.ok(&["get", "svc", "-n", "shop", "app", "-o", "jsonpath={.spec.clusterIP}"]);
    let url = format!("http://{ip}/local/0?across");
    let answered = hey(&cp, &url);
    assert_eq!(answered, (60, vec![]), "every request through the Service answered");
    for (pod, node, _) in &placed {
        let log = cp.ok(&["logs", "-n", "shop", pod]);
        let n = log.matches("received /local/0?across").count();
        assert!(n > 0, "{pod} on {node} answered none of 60 requests from node-1: {log}");
    }

    // The budget lets one replica go: node-2 drains, its pod evicted; the replacement has no
    // node to go to (node-2 cordoned, node-3 holding a replica, node-1 excluded).
    let drained = cp.kubectl(&["drain", "node-2", "--ignore-daemonsets", "--timeout=90s"]);
    assert!(drained.ok, "drain node-2: {}", drained.stderr);
    let after = app_pods(&cp);
    let running: Vec<&(String, String, String)> =
        after.iter().filter(|(_, _, phase)| phase == "Running").collect();
    assert_eq!(running.len(), 1, "one replica left running: {after:?}");
    assert_eq!(running[0].1, "node-3", "{after:?}");
    // Not the last one: the Eviction API refuses it (429) for as long as the drain tries.
    let refused = cp.kubectl(&["drain", "node-3", "--ignore-daemonsets", "--timeout=15s"]);
    assert!(!refused.ok, "node-3's drain broke the budget: {}", refused.stdout);
    assert!(
        refused.stderr.contains("disruption budget"),
        "the budget named as what refused: {}",
        refused.stderr
    );
    assert_eq!(hey(&cp, &url), (60, vec![]), "the replica left answers every request");
}

/// The app's pods: name, node and phase, by node.
fn app_pods(cp: &ControlPlane) -> Vec<(String, String, String)> {
    let path =
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase}{\"\\n\"}{end}";
    let out = cp.ok(&["get", "pods", "-n", "shop", "-l", "app=app", "-o", path]);
    let mut pods: Vec<(String, String, String)> = out
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            Some((f.next()?.into(), f.next().unwrap_or_default().into(), f.next()?.into()))
        })
        .collect();
    pods.sort_by(|a, b| (&a.1, &a.0).cmp(&(&b.1, &b.0)));
    pods
}

/// 60 requests to `url` from the client pod, a connection each: how many were answered 200,
/// and what failed.
fn hey(cp: &ControlPlane, url: &str) -> (u64, Vec<(String, u64)>) {
    let out = cp.kubectl(&[
        "exec",
        "-n",
        "shop",
        "client",
        "--",
        "hey",
        "-n",
        "60",
        "-c",
        "2",
        "-disable-keepalive",
        url,
    ]);
    assert!(out.ok, "hey: {}", out.stderr);
    tally(&out.stdout)
}
