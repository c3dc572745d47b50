//! A real Kubernetes control plane for one test: etcd, kube-apiserver, kube-controller-manager
//! and kube-scheduler, built from their sources by scripts/components (ENVOY_DRAIN_COMPONENTS
//! names the directory it prints), and on request Kyverno's admission controller and istiod,
//! which the API server calls as webhooks. Everything runs in a network namespace of the test's
//! own: every port is free whatever else runs, and each process is killed when the test's thread
//! ends (netns.rs), also when it fails; Drop stops them and removes their files.
//!
//! Without a kubelet (`Nodes::Objects`), two Node objects (one Linux, one Windows) are made Ready
//! once, so the scheduler binds pods to them, and the node lifecycle controller is given ten
//! minutes before it would mark them unreachable for the heartbeats no kubelet sends. With one
//! (`Nodes::Kubelet`, node.rs), the kubelet registers its node itself.

use super::netns::Netns;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The directory scripts/components prints: bin/ (the binaries), kyverno-crds/, istio-inject/
/// (the pods of Istio's injection tests) and `versions`.
pub fn components() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let what = "the control plane is built from source there";
    BUILT
        .get_or_init(|| {
            super::built::built_by("ENVOY_DRAIN_COMPONENTS", "scripts/components", what)
        })
        .clone()
}

/// The last `lines` lines of a log file (none if it cannot be read).
pub fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The service account volume is named kube-api-access-<5 random characters>.
pub fn without_token_suffix(spec: &str) -> String {
    let mut out = String::new();
    let mut rest = spec;
    while let Some(at) = rest.find("kube-api-access-") {
        let end = at + "kube-api-access-".len();
        out.push_str(&rest[..end]);
        rest = rest.get(end + 5..).unwrap_or_default();
    }
    out + rest
}

/// Runs `cmd` with `input` on its stdin, written from another thread: kubectl prints while it
/// reads, and a full pipe each way would stop both.
fn output_with(mut cmd: Command, input: Option<&str>) -> std::process::Output {
    cmd.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("NOT RUN: {cmd:?}: {e}"));
    std::thread::scope(|s| {
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            s.spawn(move || stdin.write_all(text.as_bytes()));
        }
        child.wait_with_output().expect("the command's output")
    })
}

/// The components' kubectl run offline (no server is asked anything) on `object`: `output` (a
/// `-o` of kubectl's: `jsonpath=...`, `go-template=...`, `json`) of it, with `patch` applied (a
/// JSON merge patch).
pub fn printed(object: &str, patch: &str, output: &str) -> String {
    let mut cmd = Command::new(components().join("bin/kubectl"));
    cmd.env("KUBECONFIG", "/dev/null").args(["patch", "--local", "--type", "merge", "-p", patch]);
    cmd.args(["-f", "-", "-o", output]);
    let out = output_with(cmd, Some(object));
    assert!(out.status.success(), "kubectl -o {output}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("text")
}

/// Several JSONPath queries on an object (JSON or YAML) at once, with kubectl's own evaluator.
pub fn fields(object: &str, paths: &[String]) -> Vec<String> {
    const SEPARATOR: &str = "\n<<envoy-drain>>\n";
    let joined = paths.join(&format!("{{\"{}\"}}", SEPARATOR.escape_default()));
    let printed = printed(object, "{}", &format!("jsonpath={joined}"));
    let got: Vec<String> = printed.split(SEPARATOR).map(str::to_string).collect();
    assert_eq!(got.len(), paths.len(), "{paths:?}: {got:?}");
    got
}

/// A JSON string, as kubectl's jsonpath prints one.
pub fn json_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// What a kubectl run (or another client's: Helm) printed.
pub struct Kubectl {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Kubectl {
    /// `cmd` run to its end with `input` on its stdin.
    pub fn run(cmd: Command, input: Option<&str>) -> Kubectl {
        let out = output_with(cmd, input);
        Kubectl {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

struct Component {
    /// The program, and the revision of an istiod.
    name: String,
    child: Child,
    log: PathBuf,
    /// How it was started: the program, its directory, arguments and environment.
    started: (String, PathBuf, Vec<String>, Vec<(String, String)>),
}

pub struct ControlPlane {
    pub dir: PathBuf,
    netns: Netns,
    bin: PathBuf,
    processes: Mutex<Vec<Component>>,
}

/// A Kyverno policy that changes nothing, for a dry run through Kyverno's policy webhook.
const PROBE: &str = "apiVersion: policies.kyverno.io/v1\nkind: MutatingPolicy\nmetadata:\n  name: \
                     probe\nspec:\n  matchConstraints:\n    resourceRules:\n    - apiGroups: [\"\"]\n      \
                     apiVersions: [v1]\n      operations: [CREATE]\n      resources: [configmaps]\n  \
                     mutations:\n  - patchType: ApplyConfiguration\n    applyConfiguration:\n      \
                     expression: Object{}\n";

/// Every wait for the control plane is bounded by this.
const START: Duration = Duration::from_secs(90);

/// What the controllers and the scheduler have to bind pods to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nodes {
    /// No controllers, no scheduler, no nodes: the API server alone.
    None,
    /// Two Node objects made Ready by the test, no kubelet.
    Objects,
    /// The node a kubelet registers (node.rs).
    Kubelet,
}

/// The bearer tokens of the nodes' components, as the API server knows them: each kubelet as its
/// node, `node-<n>` (the Node authorizer and NodeRestriction judge it: `KUBELET_TOKEN-<n>`, node-1's
/// without the suffix), kube-proxy as the user system:node-proxier is bound to by default.
pub const KUBELET_TOKEN: &str = "envoy-drain-kubelet";
/// The most nodes a control plane has tokens for.
pub const MAX_NODES: u8 = 3;
pub const KUBE_PROXY_TOKEN: &str = "envoy-drain-kube-proxy";

impl ControlPlane {
    /// etcd, the API server (ready), the controllers, the scheduler and two Ready nodes.
    pub fn start(name: &str) -> ControlPlane {
        ControlPlane::start_with(name, "kube-apiserver", &[], Nodes::Objects)
    }

    /// etcd and `program` (an API server of components/bin) given `flags` besides its own, with
    /// the controllers, the scheduler and `nodes`.
    pub fn start_with(name: &str, program: &str, flags: &[&str], nodes: Nodes) -> ControlPlane {
        let dir = std::env::temp_dir()
            .join(format!("envoy-drain-control-plane-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let cp = ControlPlane {
            dir,
            netns: Netns::new(),
            bin: components().join("bin"),
            processes: Mutex::new(Vec::new()),
        };
        cp.credentials();
        cp.spawn_etcd();
        cp.spawn_api_server(program, flags, nodes);
        cp.wait_for("the API server's /readyz", || {
            cp.kubectl(&["get", "--raw", "/readyz"]).ok.then_some(())
        });
        if nodes == Nodes::None {
            return cp;
        }
        cp.spawn_controllers();
        if nodes == Nodes::Objects {
            cp.nodes();
        }
        cp
    }

    /// etcd on loopback, its data the test's alone.
    fn spawn_etcd(&self) {
        let etcd = [
            format!("--data-dir={}", self.path("etcd")),
            "--listen-client-urls=http://127.0.0.1:2379".into(),
            "--advertise-client-urls=http://127.0.0.1:2379".into(),
            "--listen-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-cluster=default=http://127.0.0.1:2380".into(),
            // A test's data: nothing to keep across a crash.
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ];
        self.spawn("etcd", &etcd.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    }

    /// The API server (`program`: kube-apiserver of a Kubernetes version) with its flags as
    /// kubeadm sets them, and `flags`.
    fn spawn_api_server(&self, program: &str, flags: &[&str], nodes: Nodes) {
        let mut own = vec![
            "--etcd-servers=http://127.0.0.1:2379".to_string(),
            "--secure-port=6443".into(),
            format!("--cert-dir={}", self.path("pki")),
            format!("--service-account-key-file={}", self.path("sa.pub")),
            format!("--service-account-signing-key-file={}", self.path("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            "--authorization-mode=Node,RBAC".into(),
            format!("--token-auth-file={}", self.path("tokens.csv")),
            // On top of the defaults (NamespaceLifecycle, LimitRanger, ServiceAccount, PodSecurity,
            // MutatingAdmissionPolicy, the webhooks, ResourceQuota ...): what kubeadm adds.
            "--enable-admission-plugins=NodeRestriction".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            // `kubectl logs` and `exec` reach the kubelet at its node's address: no DNS here.
            "--kubelet-preferred-address-types=InternalIP".into(),
        ];
        // With a kubelet, pods reach the API server as in a cluster: the `kubernetes` Service, at
        // the node's address (node.rs). Bound to every address of the test's own namespace, its
        // self-signed certificate names localhost, which the kubeconfigs use.
        own.push("--bind-address=0.0.0.0".into());
        if nodes == Nodes::Kubelet {
            own.push(format!("--advertise-address={}", super::node::NODE_IP));
        } else {
            // No pod to reach it: no `kubernetes` endpoint to publish, which kube-apiserver 1.37
            // refuses to make of a loopback address (pkg/controlplane/instance.go, ValidateIP).
            own.push("--advertise-address=127.0.0.1".into());
            own.push("--endpoint-reconciler-type=none".into());
        }
        own.extend(flags.iter().map(|f| f.to_string()));
        let own: Vec<&str> = own.iter().map(String::as_str).collect();
        self.spawn_in(program, program, &self.dir, &own, &[]);
    }

    /// The controller manager and the scheduler.
    fn spawn_controllers(&self) {
        let kubeconfig = format!("--kubeconfig={}", self.path("kubeconfig"));
        let controllers = [
            kubeconfig.clone(),
            "--bind-address=127.0.0.1".into(),
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
            format!("--service-account-private-key-file={}", self.path("sa.key")),
            format!("--root-ca-file={}", self.path("pki/apiserver.crt")),
            "--node-monitor-grace-period=10m".into(),
        ];
        let controllers: Vec<&str> = controllers.iter().map(String::as_str).collect();
        self.spawn("kube-controller-manager", &controllers, &[]);
        let scheduler =
            [&kubeconfig, "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false"];
        self.spawn("kube-scheduler", &scheduler, &[]);
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().expect("a UTF-8 temporary path").to_string()
    }

    /// The service account key pair, one admin token (system:masters) for kubectl, the
    /// controllers, istiod and Kyverno, and a kubeconfig with it.
    fn credentials(&self) {
        let key = self.path("sa.key");
        let made = Command::new("openssl")
            .args(["genrsa", "-out", &key, "2048"])
            .stderr(Stdio::null())
            .status()
            .expect("openssl (scripts/test-tools installs it)");
        assert!(made.success(), "openssl genrsa");
        let public = Command::new("openssl")
            .args(["rsa", "-in", &key, "-pubout", "-out", &self.path("sa.pub")])
            .stderr(Stdio::null())
            .status()
            .expect("openssl");
        assert!(public.success(), "openssl rsa -pubout");
        std::fs::write(
            self.dir.join("tokens.csv"),
            format!(
                "envoy-drain-test,admin,admin,\"system:masters\"\n\
                 {KUBELET_TOKEN},system:node:node-1,node-1,\"system:nodes\"\n\
                 {KUBE_PROXY_TOKEN},system:kube-proxy,kube-proxy\n{}",
                (2..=MAX_NODES)
                    .map(|n| format!(
                        "{KUBELET_TOKEN}-{n},system:node:node-{n},node-{n},\"system:nodes\"\n"
                    ))
                    .collect::<String>()
            ),
        )
        .expect("the token file");
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: \
             https://localhost:6443\n    certificate-authority: {}\nusers:\n- name: admin\n  \
             user:\n    token: envoy-drain-test\ncontexts:\n- name: test\n  context:\n    cluster: \
             test\n    user: admin\ncurrent-context: test\n",
            self.path("pki/apiserver.crt")
        );
        std::fs::write(self.dir.join("kubeconfig"), kubeconfig).expect("the kubeconfig");
    }

    /// `program` (a path, or a name on PATH) to run in the control plane's network namespace.
    pub fn command(&self, program: &str) -> Command {
        self.netns.command(program)
    }

    /// A component of components/bin.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }

    /// Starts a component in the namespace, its output in `<dir>/<name>.log`.
    fn spawn(&self, name: &str, args: &[&str], env: &[(&str, &str)]) {
        self.spawn_in(name, name, &self.dir, args, env);
    }

    /// The same, run in `dir` (its log there too), known as `label`.
    fn spawn_in(
        &self,
        program: &str,
        label: &str,
        dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) {
        let log = dir.join(format!("{program}.log"));
        let file = std::fs::File::create(&log).expect("a log file");
        let mut cmd = self.netns.command(self.bin.join(program).to_str().expect("UTF-8"));
        cmd.args(args)
            .envs(env.iter().copied())
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("the log file"))
            .stderr(file);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("NOT RUN: {program}: {e}"));
        let started = (
            program.to_string(),
            dir.to_path_buf(),
            args.iter().map(|a| a.to_string()).collect(),
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        );
        let process = Component { name: label.to_string(), child, log, started };
        self.processes.lock().expect("the processes").push(process);
    }

    /// Stops the component known as `label` and starts it again as it was started, as a node
    /// restarts a static pod; returns once the API server is ready.
    pub fn restart(&self, label: &str) {
        let mut p = {
            let mut processes = self.processes.lock().expect("the processes");
            let at = processes.iter().position(|p| p.name == label).expect("a started component");
            processes.remove(at)
        };
        let _ = p.child.kill();
        let _ = p.child.wait();
        let (program, dir, args, env) = p.started;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.spawn_in(&program, label, &dir, &args, &env);
        self.wait_for("the API server's /readyz", || {
            self.kubectl(&["get", "--raw", "/readyz"]).ok.then_some(())
        });
    }

    /// The last lines of a component's log.
    fn log_tail(&self, name: &str, lines: usize) -> String {
        let processes = self.processes.lock().expect("the processes");
        let Some(p) = processes.iter().find(|p| p.name == name) else {
            return format!("({name} was never started)");
        };
        tail(&p.log, lines)
    }

    /// Fails the test, with its log, if a component has exited.
    fn all_running(&self) {
        let mut dead = None;
        for p in self.processes.lock().expect("the processes").iter_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                dead = Some((p.name.clone(), status));
                break;
            }
        }
        if let Some((name, status)) = dead {
            panic!("{name} exited ({status}):\n{}", self.log_tail(&name, 40));
        }
    }

    /// Polls `f` (every 100 ms, at most `START`) until it gives a value; fails naming `what`
    /// if a component exits first or time runs out.
    pub fn wait_for<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(v) = f() {
                return v;
            }
            self.all_running();
            if start.elapsed() > START {
                let names: Vec<String> = self
                    .processes
                    .lock()
                    .expect("the processes")
                    .iter()
                    .map(|p| p.name.clone())
                    .collect();
                let mut logs = String::new();
                for name in names {
                    let _ = write!(logs, "\n--- {name}:\n{}", self.log_tail(&name, 15));
                }
                panic!("waited {START:?} for {what}{logs}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// kubectl (the one built with the API server) against this control plane.
    pub fn kubectl(&self, args: &[&str]) -> Kubectl {
        self.kubectl_with(args, None)
    }

    /// kubectl to spawn (`exec` of a long load, a watch).
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut cmd = self.netns.command(self.bin.join("kubectl").to_str().expect("UTF-8"));
        cmd.env("KUBECONFIG", self.dir.join("kubeconfig")).args(args);
        cmd
    }

    /// kubectl with `input` on its stdin (`-f -`).
    pub fn kubectl_with(&self, args: &[&str], input: Option<&str>) -> Kubectl {
        Kubectl::run(self.kubectl_command(args), input)
    }

    /// kubectl that must succeed: its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_with(args, None)
    }

    pub fn ok_with(&self, args: &[&str], input: Option<&str>) -> String {
        let out = self.kubectl_with(args, input);
        assert!(out.ok, "kubectl {}: {}", args.join(" "), out.stderr);
        out.stdout
    }

    /// The hold policies' settings as the README creates them: `kubectl create configmap
    /// envoy-drain -n envoy-drain --from-literal=<each of literals>`.
    pub fn hold_settings(&self, literals: &[&str]) {
        let mut args = vec!["create", "configmap", "envoy-drain", "-n", "envoy-drain"];
        let literals: Vec<String> =
            literals.iter().map(|l| format!("--from-literal={l}")).collect();
        args.extend(literals.iter().map(String::as_str));
        self.ok(&args);
    }

    /// A namespace from YAML text, once its default service account, which pods need, exists
    /// (the controllers make it; without them, the text must).
    pub fn namespace(&self, yaml: &str, name: &str) {
        self.ok_with(&["apply", "-f", "-"], Some(yaml));
        self.wait_for(&format!("the service account of namespace {name}"), || {
            self.kubectl(&["get", "serviceaccount", "default", "-n", name]).ok.then_some(())
        });
    }

    /// A Linux and a Windows node, Ready, with room for many pods.
    fn nodes(&self) {
        let now = Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]).output().expect("date");
        let now = String::from_utf8_lossy(&now.stdout).trim().to_string();
        for (name, os, ip) in
            [("node-linux", "linux", "10.0.0.1"), ("node-windows", "windows", "10.0.0.2")]
        {
            self.ok_with(
                &["apply", "-f", "-"],
                Some(&format!(
                    "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    \
                     kubernetes.io/os: {os}\n    kubernetes.io/arch: amd64\n    \
                     kubernetes.io/hostname: {name}\n"
                )),
            );
            let room = r#"{"cpu":"16","memory":"64Gi","pods":"250"}"#;
            let status = format!(
                r#"{{"status":{{"conditions":[{{"type":"Ready","status":"True","reason":"KubeletReady","message":"no kubelet: set once by the test","lastHeartbeatTime":"{now}","lastTransitionTime":"{now}"}}],"capacity":{room},"allocatable":{room},"addresses":[{{"type":"InternalIP","address":"{ip}"}}],"nodeInfo":{{"kubeletVersion":"v1.36.3","operatingSystem":"{os}","architecture":"amd64","machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeProxyVersion":""}}}}}}"#
            );
            self.ok(&[
                "patch",
                "node",
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                &status,
            ]);
        }
        // The node lifecycle controller takes the not-ready taint (TaintNodesByCondition) away
        // once it sees them Ready.
        self.wait_for("the nodes to be schedulable", || {
            let taints = self.ok(&["get", "nodes", "-o", "jsonpath={.items[*].spec.taints}"]);
            taints.trim().is_empty().then_some(())
        });
    }

    /// The MutatingAdmissionPolicy metrics: (policy, binding, error type, count) for each row
    /// of apiserver_mutating_admission_policy_check_total.
    pub fn policy_checks(&self) -> Vec<(String, String, String, u64)> {
        let metrics = self.ok(&["get", "--raw", "/metrics"]);
        metrics
            .lines()
            .filter_map(|l| l.strip_prefix("apiserver_mutating_admission_policy_check_total{"))
            .filter_map(|l| {
                let (labels, count) = l.split_once("} ")?;
                let label = |name: &str| {
                    let at = labels.find(&format!("{name}=\""))? + name.len() + 2;
                    Some(labels[at..].split('"').next()?.to_string())
                };
                Some((
                    label("policy")?,
                    label("policy_binding")?,
                    label("error_type")?,
                    count.trim().parse().ok()?,
                ))
            })
            .collect()
    }

    /// Kyverno's admission controller, run out of the cluster as Kyverno's own development setup
    /// does (kyverno/kyverno .vscode/launch.json, "Launch Kyverno"): its CRDs, its namespace and
    /// ConfigMaps, and the controller registering its webhooks at 127.0.0.1:9443 with a CA of its
    /// own. Returns once its webhook configurations exist.
    pub fn start_kyverno(&self) {
        let crds = components().join("kyverno-crds");
        self.ok(&["apply", "--server-side", "-f", crds.to_str().expect("UTF-8")]);
        self.ok_with(
            &["apply", "-f", "-"],
            Some(
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kyverno\n---\napiVersion: v1\n\
                 kind: ConfigMap\nmetadata:\n  name: kyverno\n  namespace: kyverno\n---\n\
                 apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kyverno-metrics\n  \
                 namespace: kyverno\n",
            ),
        );
        let kubeconfig = self.path("kubeconfig");
        self.spawn(
            "kyverno",
            &[
                "--kubeconfig", &kubeconfig,
                "--serverIP=127.0.0.1:9443",
                "--caSecretName=kyverno-svc.kyverno.svc.kyverno-tls-ca",
                "--tlsSecretName=kyverno-svc.kyverno.svc.kyverno-tls-pair",
                "--backgroundServiceAccountName=system:serviceaccount:kyverno:kyverno-background-controller",
                "--reportsServiceAccountName=system:serviceaccount:kyverno:kyverno-reports-controller",
            ],
            &[
                ("KYVERNO_NAMESPACE", "kyverno"),
                ("KYVERNO_SERVICEACCOUNT_NAME", "kyverno-admission-controller"),
                ("KYVERNO_DEPLOYMENT", "kyverno-admission-controller"),
                ("KYVERNO_POD_NAME", "kyverno-admission-controller-0"),
                ("INIT_CONFIG", "kyverno"),
                ("METRICS_CONFIG", "kyverno-metrics"),
            ],
        );
        self.wait_for("Kyverno's webhooks", || {
            let hooks = self.ok(&["get", "mutatingwebhookconfigurations", "-o", "name"]);
            hooks.contains("kyverno-resource-mutating-webhook-cfg").then_some(())
        });
        // Registered before its server has its certificate: until then a policy's create fails
        // with `remote error: tls: internal error`.
        self.wait_for("Kyverno's policy webhook to answer", || {
            let probe = self.kubectl_with(&["create", "--dry-run=server", "-f", "-"], Some(PROBE));
            (!probe.stderr.contains("failed calling webhook")).then_some(())
        });
    }

    /// Waits until Kyverno serves the MutatingPolicy `name`: ready, and its webhook registered.
    pub fn wait_for_kyverno_policy(&self, name: &str) {
        self.wait_for(&format!("Kyverno's webhook for MutatingPolicy {name}"), || {
            let urls = self.ok(&[
                "get",
                "mutatingwebhookconfiguration",
                "kyverno-resource-mutating-webhook-cfg",
                "-o",
                "jsonpath={.webhooks[*].clientConfig.url}",
            ]);
            urls.contains(&format!("/mpol/{name}")).then_some(())
        });
    }
}

impl ControlPlane {
    /// One control plane for all the tests of a test binary, started and set up by `setup` once,
    /// on a thread that lives as long as the process: its components end with the process (each
    /// is killed when the thread that started it ends), and an exit handler stops them and
    /// removes their files when the tests are done. A failed start fails every test that asks.
    pub fn shared(name: &'static str, setup: fn(&ControlPlane)) -> &'static ControlPlane {
        static SHARED: OnceLock<Result<&'static ControlPlane, String>> = OnceLock::new();
        static LEFT: OnceLock<&'static ControlPlane> = OnceLock::new();
        let made = SHARED.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let started = std::panic::catch_unwind(|| {
                    let cp = ControlPlane::start(name);
                    setup(&cp);
                    cp
                });
                let Ok(cp) = started.map_err(|e| {
                    let message = e.downcast_ref::<String>().cloned();
                    let _ = tx.send(Err(message.unwrap_or_else(|| "a panic".to_string())));
                }) else {
                    return;
                };
                let cp: &'static ControlPlane = Box::leak(Box::new(cp));
                let _ = LEFT.set(cp);
                extern "C" fn stop_at_exit() {
                    if let Some(cp) = LEFT.get() {
                        cp.stop();
                    }
                }
                // SAFETY: registers a plain function without arguments to run at exit.
                unsafe { libc::atexit(stop_at_exit) };
                let _ = tx.send(Ok(cp));
                loop {
                    std::thread::park();
                }
            });
            rx.recv().unwrap_or_else(|_| Err("the control plane's thread ended".to_string()))
        });
        made.as_ref().map(|cp| *cp).unwrap_or_else(|e| panic!("the shared control plane: {e}"))
    }

    /// Kills every component and removes the files.
    fn stop(&self) {
        if let Ok(mut processes) = self.processes.lock() {
            for p in processes.iter_mut().rev() {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// An Istio control plane revision, as `helm install` of Istio's istiod chart with `values`
    /// (the text of a values file) and `--set revision=<revision>` makes it: istioctl renders
    /// Istio's own charts (the ones it embeds) into CRDs, RBAC, the mesh and injection ConfigMaps
    /// and the injection webhook's configuration, which are applied; in place of the chart's
    /// Deployment and Service, pilot-discovery runs here as that Deployment runs it (its
    /// arguments and environment, `env` on top), its webhook at https://localhost:<port>/inject
    /// (ISTIOD_CUSTOM_HOST puts localhost in the certificate istiod makes itself). Its validation
    /// webhook is left out. `overlays` are IstioOperator files laid over the values, as
    /// `istioctl install -f` lays them; `index` spaces its ports from other revisions'. Returns
    /// once the webhook's certificate is in place, with the DaemonSets the profile renders (ambient's
    /// ztunnel and istio-cni), which are not applied: their host paths are the caller's to set.
    pub fn start_istiod(
        &self,
        revision: &str,
        values: &str,
        overlays: &[&Path],
        index: u16,
        env: &[(&str, &str)],
    ) -> String {
        let dir = self.dir.join(format!("istiod-{revision}"));
        std::fs::create_dir_all(&dir).expect("istiod's directory");
        let rendered = self.render_istio(&dir, revision, values, overlays);
        fn kind_of(doc: &str) -> &str {
            doc.lines().find_map(|l| l.strip_prefix("kind: ")).unwrap_or_default().trim()
        }
        let skipped = [
            "Deployment",
            "Service",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget",
            "ValidatingWebhookConfiguration",
            "DaemonSet",
        ];
        let kept: Vec<&str> =
            rendered.split("\n---\n").filter(|doc| !skipped.contains(&kind_of(doc))).collect();
        let daemonsets: Vec<&str> =
            rendered.split("\n---\n").filter(|doc| kind_of(doc) == "DaemonSet").collect();
        self.ok_with(
            &["apply", "-f", "-"],
            Some("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: istio-system\n"),
        );
        self.ok_with(&["apply", "--server-side", "-f", "-"], Some(&kept.join("\n---\n")));
        let webhook = format!("istio-sidecar-injector-{revision}");
        let port = |k: u16| 20000 + 100 * index + k;
        let hooks = self.webhooks_to(&webhook, port(17));
        self.spawn_istiod(&dir, revision, &webhook, port, env);
        self.wait_for(&format!("istiod {revision}'s webhook certificate"), || {
            let ca = self.ok(&[
                "get",
                "mutatingwebhookconfiguration",
                &webhook,
                "-o",
                "jsonpath={.webhooks[*].clientConfig.caBundle}",
            ]);
            let all = ca.split_whitespace().count() == hooks;
            all.then_some(())
        });
        daemonsets.join("\n---\n")
    }

    /// Istio's manifests for `revision` (the minimal profile, `values` and `overlays`), as
    /// `istioctl manifest generate` renders them.
    fn render_istio(&self, dir: &Path, revision: &str, values: &str, overlays: &[&Path]) -> String {
        let mut iop = String::from(
            "apiVersion: install.istio.io/v1alpha1\nkind: IstioOperator\nspec:\n  values:\n",
        );
        for line in values.lines() {
            let _ = writeln!(iop, "    {line}");
        }
        let iop_file = dir.join("iop.yaml");
        std::fs::write(&iop_file, iop).expect("the IstioOperator file");
        let rendered = Command::new(self.bin.join("istioctl"))
            .args(["manifest", "generate", "--set", "profile=minimal", "--set"])
            .arg(format!("revision={revision}"))
            .arg("-f")
            .arg(&iop_file)
            .args(overlays.iter().flat_map(|o| [Path::new("-f"), o]))
            .output()
            .expect("istioctl");
        assert!(
            rendered.status.success(),
            "istioctl manifest generate: {}",
            String::from_utf8_lossy(&rendered.stderr)
        );
        String::from_utf8_lossy(&rendered.stdout).into_owned()
    }

    /// Points each webhook of `webhook` at istiod on localhost's `port`: how many there are.
    fn webhooks_to(&self, webhook: &str, port: u16) -> usize {
        let hooks = self.ok(&[
            "get",
            "mutatingwebhookconfiguration",
            webhook,
            "-o",
            "jsonpath={range .webhooks[*]}{.clientConfig.service.path}{\"\\n\"}{end}",
        ]);
        for (i, path) in hooks.lines().enumerate() {
            let url = format!("https://localhost:{port}{path}");
            let patch = format!(
                r#"[{{"op":"replace","path":"/webhooks/{i}/clientConfig","value":{{"url":"{url}"}}}}]"#
            );
            self.ok(&[
                "patch",
                "mutatingwebhookconfiguration",
                webhook,
                "--type",
                "json",
                "-p",
                &patch,
            ]);
        }
        hooks.lines().count()
    }

    /// pilot-discovery for `revision`, its ports from `port`, with `env` beside what it needs
    /// outside a cluster.
    fn spawn_istiod(
        &self,
        dir: &Path,
        revision: &str,
        webhook: &str,
        port: impl Fn(u16) -> u16,
        env: &[(&str, &str)],
    ) {
        let kubeconfig = self.path("kubeconfig");
        let addr = |k: u16| format!(":{}", port(k));
        let mut all_env = vec![
            ("REVISION", revision),
            ("PILOT_CERT_PROVIDER", "istiod"),
            ("POD_NAME", "istiod-0"),
            ("POD_NAMESPACE", "istio-system"),
            ("SERVICE_ACCOUNT", "istiod"),
            ("KUBECONFIG", &kubeconfig),
            ("CA_TRUSTED_NODE_ACCOUNTS", "istio-system/ztunnel"),
            ("PILOT_TRACE_SAMPLING", "1"),
            ("PILOT_ENABLE_ANALYSIS", "false"),
            ("CLUSTER_ID", "Kubernetes"),
            ("GOMAXPROCS", "2"),
            ("PLATFORM", ""),
            ("ISTIOD_CUSTOM_HOST", "localhost"),
            ("INJECTION_WEBHOOK_CONFIG_NAME", webhook),
        ];
        all_env.extend_from_slice(env);
        let (grpc, secure, https, http, monitoring) =
            (addr(10), addr(12), addr(17), addr(80), addr(14));
        self.spawn_in(
            "pilot-discovery",
            &format!("istiod {revision}"),
            dir,
            &[
                "discovery",
                "--monitoringAddr",
                &monitoring,
                "--grpcAddr",
                &grpc,
                "--secureGRPCAddr",
                &secure,
                "--httpsAddr",
                &https,
                "--httpAddr",
                &http,
                "--log_output_level=default:info",
                "--domain",
                "cluster.local",
                "--keepaliveMaxServerConnectionAge",
                "30m",
            ],
            &all_env,
        );
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}
