//! `kubectl rollout restart` under load on a real node (tests/support/node.rs): the kubelet runs
//! the pods and their preStop hooks and counts their grace period, the Deployment controller
//! replaces them one after the other, the EndpointSlice controller marks them terminating and
//! kube-proxy takes them out of the Service's rules. The hook is what examples/hold-policy.yaml
//! adds, with the image the ConfigMap names.

mod support;

use std::process::Stdio;
use std::time::Duration;
use support::cluster::{ControlPlane, Nodes};
use support::node::{Image, Node};

const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/hold-policy.yaml");
const APP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pod/app.py");
/// scripts/build-release's static binary, as the FROM scratch image holds it.
const RELEASE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/dist/amd64/envoy-drain");

/// A Service of three replicas of the app (tests/pod/app.py, which on SIGTERM closes its
/// listener and finishes the requests in flight, as nginx does), ready by an HTTP probe, in a
/// namespace without a mesh that asks for the hold.
const NAMESPACE: &str = "\
apiVersion: v1
kind: Namespace
metadata:
  name: shop
  labels: {envoy-drain.io/hold: enabled}
";
const WORKLOAD: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: app, namespace: shop}
spec:
  replicas: 3
  selector: {matchLabels: {app: app}}
  template:
    metadata: {labels: {app: app}}
    spec:
      containers:
      - name: app
        image: localhost/app:test
        args: [close]
        ports: [{containerPort: 8080}]
        readinessProbe:
          httpGet: {path: '/local/0?probe', port: 8080}
          periodSeconds: 2
---
apiVersion: v1
kind: Service
metadata: {name: app, namespace: shop}
spec:
  selector: {app: app}
  ports: [{port: 80, targetPort: 8080}]
";

fn images() -> (String, String) {
    assert!(
        std::path::Path::new(RELEASE).exists(),
        "NOT RUN: {RELEASE} is missing: `bash scripts/build-release` makes it"
    );
    (APP.to_string(), RELEASE.to_string())
}

/// What hey printed: (requests answered 200, every other answer or error, the summary).
fn tally(out: &str) -> (u64, u64, String) {
    let mut ok = 0;
    let mut other = 0;
    let mut in_errors = false;
    for line in out.lines() {
        let line = line.trim();
        if line.starts_with("Error distribution:") {
            in_errors = true;
        }
        let Some(rest) = line.strip_prefix('[') else { continue };
        let Some((code, count)) = rest.split_once(']') else { continue };
        let count: u64 = count.split_whitespace().next().and_then(|c| c.parse().ok()).unwrap_or(0);
        if code == "200" && !in_errors {
            ok += count;
        } else {
            other += count;
        }
    }
    (ok, other, out.to_string())
}

#[test]
#[ignore = "needs root, the control plane and the node built from source (`bash scripts/test`)"]
fn a_rollout_without_a_mesh_loses_nothing_with_the_policys_hold() {
    let (app, release) = images();
    let cp = ControlPlane::start_with("rollout", "kube-apiserver", &[], Nodes::Kubelet);
    let node = Node::start(
        &cp,
        &[
            Image {
                name: "localhost/app:test",
                entrypoint: &["/usr/bin/python3.11", "/app.py"],
                files: &["/usr/bin/python3.11", "/usr/lib/python3.11"],
                extra: &[(std::path::Path::new(&app), "/app.py")],
            },
            Image {
                name: "localhost/envoy-drain:test",
                entrypoint: &["/envoy-drain"],
                files: &[],
                extra: &[(std::path::Path::new(&release), "/envoy-drain")],
            },
        ],
    );
    cp.ok(&["apply", "-f", POLICY]);
    cp.ok(&[
        "create",
        "configmap",
        "envoy-drain",
        "-n",
        "envoy-drain",
        "--from-literal=image=localhost/envoy-drain:test",
    ]);
    cp.namespace(NAMESPACE, "shop");
    // The API server serves a policy once its informers have the ConfigMap: the Deployment
    // comes after a dry run shows the hook.
    let probe = "apiVersion: v1\nkind: Pod\nmetadata: {name: probe, namespace: shop}\nspec:\n  \
                 containers: [{name: app, image: localhost/app:test}]\n";
    cp.wait_for("the policy to serve shop", || {
        let pod = cp.ok_with(&["create", "--dry-run=server", "-o", "json", "-f", "-"], Some(probe));
        pod.contains("preStop").then_some(())
    });
    cp.ok_with(&["apply", "-f", "-"], Some(WORKLOAD));
    let status = ["rollout", "status", "-n", "shop", "deployment/app", "--timeout=90s"];
    let rolled = cp.kubectl(&status);
    assert!(rolled.ok, "the first rollout: {}\n{}", rolled.stderr, node.log_tail("kubelet", 4));
    let hooks = cp.ok(&[
        "get",
        "pods",
        "-n",
        "shop",
        "-o",
        "jsonpath={range .items[*]}{.spec.containers[0].lifecycle.preStop.exec.command}{\"\\n\"}{end}",
    ]);
    assert_eq!(hooks.lines().count(), 3, "{hooks}");
    assert!(hooks.lines().all(|h| h.contains("\"hold\"")), "the policy's hook on each: {hooks}");
    let ip = cp.ok(&["get", "service", "-n", "shop", "app", "-o", "jsonpath={.spec.clusterIP}"]);
    // 100 requests a second for 60 s, each on a connection of its own, from the node.
    let hey = cp
        .command("hey")
        .args(["-z", "60s", "-q", "10", "-c", "10", "-t", "10", "-disable-keepalive"])
        .arg(format!("http://{ip}/local/0.05"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("NOT RUN: hey (scripts/test-tools installs it)");
    // The load runs a while before the rollout, as it does before a user's.
    std::thread::sleep(Duration::from_secs(5));
    let restarted = std::time::Instant::now();
    cp.ok(&["rollout", "restart", "-n", "shop", "deployment/app"]);
    let rolled =
        cp.kubectl(&["rollout", "status", "-n", "shop", "deployment/app", "--timeout=50s"]);
    assert!(rolled.ok, "the restart: {}\n{}", rolled.stderr, node.log_tail("kubelet", 4));
    let took = restarted.elapsed();
    let out = hey.wait_with_output().expect("hey's output");
    let (ok, other, summary) = tally(&String::from_utf8_lossy(&out.stdout));
    eprintln!("rollout restart: {took:.1?}; requests answered 200: {ok}, otherwise: {other}");
    assert!(ok > 3000, "hey's requests were answered: {summary}");
    assert_eq!(other, 0, "a request failed during the rollout: {summary}");
}
