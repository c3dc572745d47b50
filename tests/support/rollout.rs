//! One `kubectl rollout restart` under load on a real node (node.rs), without a mesh: a
//! Deployment of three replicas of the app (tests/pod/app.py, which on SIGTERM closes its
//! listener and finishes the requests in flight, as nginx does), ready by an HTTP probe, behind a
//! Service whose rules kube-proxy writes; hey sends 100 requests a second to the Service's
//! cluster IP from the node, from before the restart until after it. The app's shutdown is none,
//! `preStop: sleep`, or the hook examples/hold-policy.yaml adds (with the image its ConfigMap
//! names). The pods' logs (the app's events and, through /proc/1/fd/1, the hold's) are read as the
//! kubelet writes them, before it removes them with the pod.

use super::cluster::{ControlPlane, Nodes};
use super::node::{Image, Node};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/hold-policy.yaml");
const APP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pod/app.py");
/// scripts/build-release's static binary, as the FROM scratch image holds it.
const RELEASE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/dist/amd64/envoy-drain");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// The pod as written: SIGTERM at deletion.
    None,
    /// Kubernetes' own `preStop: sleep` of that many seconds.
    Sleep(u32),
    /// `envoy-drain hold`, as examples/hold-policy.yaml installs it.
    Hold,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clients {
    /// A connection per request (`hey -disable-keepalive`).
    NewConn,
    /// Ten connections kept alive.
    KeepAlive,
}

pub struct Row {
    pub shutdown: Shutdown,
    pub clients: Clients,
    /// Requests answered 200.
    pub ok: u64,
    /// Every other answer and every error, as hey names them.
    pub failed: Vec<(String, u64)>,
    /// From `kubectl rollout restart` to the last old pod gone.
    pub took: Duration,
    /// For each replaced pod: when its hold ended after the last request it received (seconds;
    /// none without a hold), and the hold's summary.
    pub holds: Vec<(Option<f64>, String)>,
    /// What the node said that explains a failure: the kubelet's probe failures and kube-proxy's
    /// last lines.
    pub diagnosis: String,
}

impl Row {
    pub fn failed_total(&self) -> u64 {
        self.failed.iter().map(|(_, n)| n).sum()
    }
}

/// The namespace asks for the hold only where the row has it.
fn workload(shutdown: Shutdown) -> (String, String) {
    let label = if shutdown == Shutdown::Hold { "enabled" } else { "disabled" };
    let namespace = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n  labels: \
         {{envoy-drain.io/hold: {label}}}\n"
    );
    let pre_stop = match shutdown {
        Shutdown::Sleep(s) => {
            format!("\n        lifecycle:\n          preStop:\n            sleep: {{seconds: {s}}}")
        }
        _ => String::new(),
    };
    let deployment = format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: app, namespace: shop}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: app}}}}
  template:
    metadata: {{labels: {{app: app}}}}
    spec:
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
metadata: {{name: app, namespace: shop}}
spec:
  selector: {{app: app}}
  ports: [{{port: 80, targetPort: 8080}}]
"
    );
    (namespace, deployment)
}

/// Runs one rollout and reads what it did.
pub fn run(shutdown: Shutdown, clients: Clients) -> Row {
    assert!(
        Path::new(RELEASE).exists(),
        "NOT RUN: {RELEASE} is missing: `bash scripts/build-release` makes it"
    );
    let cp = ControlPlane::start_with("rollout", "kube-apiserver", &[], Nodes::Kubelet);
    let node = Node::start(
        &cp,
        &[
            Image {
                name: "localhost/app:test",
                entrypoint: &["/usr/bin/python3.11", "/app.py"],
                files: &["/usr/bin/python3.11", "/usr/lib/python3.11"],
                extra: &[(Path::new(APP), "/app.py")],
            },
            Image {
                name: "localhost/envoy-drain:test",
                entrypoint: &["/envoy-drain"],
                files: &[],
                extra: &[(Path::new(RELEASE), "/envoy-drain")],
            },
        ],
    );
    cp.ok(&["apply", "-f", POLICY]);
    cp.hold_settings(&["image=localhost/envoy-drain:test"]);
    let (namespace, deployment) = workload(shutdown);
    cp.namespace(&namespace, "shop");
    if shutdown == Shutdown::Hold {
        // The API server serves a policy once its informers have the ConfigMap: the Deployment
        // comes after a dry run shows the hook.
        let probe = "apiVersion: v1\nkind: Pod\nmetadata: {name: probe, namespace: shop}\nspec:\n  \
                     containers: [{name: app, image: localhost/app:test}]\n";
        cp.wait_for("the policy to serve shop", || {
            let pod =
                cp.ok_with(&["create", "--dry-run=server", "-o", "json", "-f", "-"], Some(probe));
            pod.contains("preStop").then_some(())
        });
    }
    cp.ok_with(&["apply", "-f", "-"], Some(&deployment));
    let status = ["rollout", "status", "-n", "shop", "deployment/app", "--timeout=90s"];
    let rolled = cp.kubectl(&status);
    assert!(rolled.ok, "the first rollout: {}\n{}", rolled.stderr, node.log_tail("kubelet", 4));
    let hooks = cp.ok(&[
        "get",
        "pods",
        "-n",
        "shop",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.containers[0].lifecycle.preStop}{\"\\n\"}{end}",
    ]);
    let expected = match shutdown {
        Shutdown::None => "",
        Shutdown::Sleep(_) => "\"sleep\"",
        Shutdown::Hold => "\"hold\"",
    };
    assert_eq!(hooks.lines().count(), 3, "{hooks}");
    assert!(
        hooks.lines().all(|h| expected.is_empty() != h.contains('{') && h.contains(expected)),
        "each pod's preStop is the row's ({shutdown:?}): {hooks}"
    );
    let old: Vec<String> =
        hooks.lines().filter_map(|l| l.split_whitespace().next()).map(String::from).collect();
    let logs = Logs::follow(node.pod_logs());
    let ip = cp.ok(&["get", "service", "-n", "shop", "app", "-o", "jsonpath={.spec.clusterIP}"]);
    // kube-proxy writes the Service's rules a moment after the pods are ready (until then it
    // refuses connections to the cluster IP): the load starts once 30 requests in a row answer.
    cp.wait_for("the Service to answer from the node", || {
        let url = format!("http://{ip}/local/0");
        let probe = ["-n", "30", "-c", "1", "-disable-keepalive", "-t", "2", url.as_str()];
        let out = cp.command("hey").args(probe).output().ok()?;
        let (ok, failed) = tally(&String::from_utf8_lossy(&out.stdout));
        (ok == 30 && failed.is_empty()).then_some(())
    });
    let mut hey = cp.command("hey");
    hey.args(["-z", "60s", "-q", "10", "-c", "10", "-t", "10"]);
    if clients == Clients::NewConn {
        hey.arg("-disable-keepalive");
    }
    let hey = hey
        .arg(format!("http://{ip}/local/0.05"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("NOT RUN: hey (scripts/test-tools installs it)");
    // The load runs a while before the rollout, as it does before a user's.
    std::thread::sleep(Duration::from_secs(5));
    let restarted = Instant::now();
    cp.ok(&["rollout", "restart", "-n", "shop", "deployment/app"]);
    let rolled =
        cp.kubectl(&["rollout", "status", "-n", "shop", "deployment/app", "--timeout=50s"]);
    assert!(rolled.ok, "the restart: {}\n{}", rolled.stderr, node.log_tail("kubelet", 4));
    // The Deployment counts a terminating pod as gone: the rollout ends with the last old pod.
    let old_pods: Vec<String> = old.iter().map(|p| format!("pod/{p}")).collect();
    let mut wait = vec!["wait", "-n", "shop", "--for=delete", "--timeout=60s"];
    wait.extend(old_pods.iter().map(String::as_str));
    let gone = cp.kubectl(&wait);
    assert!(gone.ok, "the old pods to be gone: {}", gone.stderr);
    let took = restarted.elapsed();
    let out = hey.wait_with_output().expect("hey's output");
    let (ok, failed) = tally(&String::from_utf8_lossy(&out.stdout));
    let logs = logs.stop();
    let holds = old
        .iter()
        .map(|pod| {
            let lines = logs.iter().find(|(dir, _)| dir.contains(&format!("_{pod}_")));
            lines.map_or((None, "(no log read)".to_string()), |(_, text)| hold_end(text))
        })
        .collect();
    let kubelet = std::fs::read_to_string(node.log("kubelet"));
    let probes = kubelet.unwrap_or_default().lines().filter(|l| l.contains("Probe failed")).count();
    let diagnosis =
        format!("{probes} failed probes; kube-proxy:\n{}", node.log_tail("kube-proxy", 6));
    Row { shutdown, clients, ok, failed, took, holds, diagnosis }
}

/// What hey printed: requests answered 200, and each other status or error with its count
/// (`[200]\t5334 responses` under "Status code distribution", `[42]\tGet "...": <error>` under
/// "Error distribution").
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
            // The error without the URL: `Get "http://...": dial tcp ...: connection refused`.
            let error = what.rsplit_once("\": ").map_or(what, |(_, e)| e);
            failed.push((error.to_string(), inside.parse().unwrap_or(0)));
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

/// When the hold ended after the last request the pod received, in seconds, and its summary:
/// from the CRI log lines (`<RFC 3339 time> stdout F <line>`).
fn hold_end(log: &str) -> (Option<f64>, String) {
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
        // The hold's last line (src/text.rs `summary`), however it ended.
        let end =
            ["done after", "deadline of ", "interrupted by "].iter().find_map(|s| text.find(s));
        if let Some(at) = end.filter(|_| text.contains("\tenvoy-drain\t")) {
            done = Some((seconds_of_day(time), text[at..].to_string()));
        }
    }
    match done {
        // Negative where requests still came after it (kept-alive clients); a day's wrap undone.
        Some((Some(end), summary)) => {
            (last_request.map(|r| (end - r + 43200.0).rem_euclid(86400.0) - 43200.0), summary)
        }
        _ => (None, "no hold".to_string()),
    }
}

/// `2026-11-29T04:03:51.123456789Z` as seconds since midnight.
fn seconds_of_day(time: &str) -> Option<f64> {
    let clock = time.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = clock.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// The pods' log files, read every 100 ms while the kubelet writes them (it removes them with
/// the pod): each pod's directory and what its container wrote.
struct Logs {
    stop: Arc<AtomicBool>,
    read: Arc<Mutex<BTreeMap<String, String>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Logs {
    fn follow(dir: PathBuf) -> Logs {
        let stop = Arc::new(AtomicBool::new(false));
        let read: Arc<Mutex<BTreeMap<String, String>>> = Arc::new(Mutex::new(BTreeMap::new()));
        let thread = {
            let (stop, read) = (Arc::clone(&stop), Arc::clone(&read));
            std::thread::spawn(move || {
                // Bounded: the rollout's own bounds end it, and so does this count.
                for _ in 0..3000 {
                    let last = stop.load(Ordering::SeqCst);
                    for pod in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                        let file = pod.path().join("app/0.log");
                        if let Ok(text) = std::fs::read_to_string(&file) {
                            let name = pod.file_name().to_string_lossy().to_string();
                            let mut read = read.lock().expect("the logs");
                            let kept = read.entry(name).or_default();
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
        Logs { stop, read, thread }
    }

    fn stop(self) -> BTreeMap<String, String> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
        std::mem::take(&mut *self.read.lock().expect("the logs"))
    }
}
