//! The install of `hold` for pods without a sidecar, carried out by the real components: a
//! kube-apiserver 1.36 (and again 1.37) with its controllers runs examples/hold-policy.yaml (a
//! MutatingAdmissionPolicy), and another with Kyverno's own admission controller as its webhook
//! runs examples/hold-kyverno.yaml (tests/support/cluster.rs). On each, the test does what an
//! operator does, in the README's order: applies the file, creates the ConfigMap as the README
//! says (a trial on labelled namespaces first, then all), later removes the image and the
//! ConfigMap again; at each step it creates every pod of tests/inject/policy/pods/ in every
//! namespace of tests/inject/policy/namespaces/ (a server-side dry run: all of admission, nothing
//! stored) and Deployments of them whose ReplicaSets create the pods for real, and records what
//! the API server made of each. The tests below read those records.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::OnceLock;
use support::cluster::{ControlPlane, Nodes, fields, json_string, without_token_suffix};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/inject/policy");

/// Each namespace fixture and the namespace it makes.
const NAMESPACES: [(&str, &str); 12] = [
    ("ambient", "shop"),
    ("no-mesh", "batch"),
    ("ambient-injection-off", "catalog"),
    ("ambient-opted-out", "cart"),
    ("ambient-opted-out-typo", "returns"),
    ("ambient-trial", "staging"),
    ("restricted", "payments"),
    ("quota", "reports"),
    ("guarded", "vault"),
    ("revision", "search"),
    ("sidecar", "legacy"),
    ("plain", "default"),
];
const PODS: [&str; 19] = [
    "web",
    "two-containers",
    "short-grace",
    "guaranteed",
    "root",
    "probes",
    "bad-annotation",
    "hardened",
    "opted-out",
    "asks-sidecar",
    "has-sidecar",
    "disabled",
    "installed",
    "host-network",
    "windows",
    "windows-selector",
    "windows-affinity",
    "image-volume",
    "revision",
];
/// The pods the policy leaves alone wherever it runs: those after the first eight.
const LEFT_ALONE: &[&str] = PODS.split_at(8).1;
/// Namespaces whose pods Deployments also make for real.
const DEPLOYED_IN: [&str; 4] = ["shop", "batch", "vault", "payments"];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// examples/hold-policy.yaml
    AdmissionPolicy,
    /// examples/hold-kyverno.yaml
    Kyverno,
}

/// A form of the policy on an API server: `api_server` is a kube-apiserver of components/bin.
#[derive(Clone, Copy, PartialEq)]
struct Form {
    kind: Kind,
    api_server: &'static str,
}

impl std::fmt::Debug for Form {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} on {}", self.kind, self.api_server)
    }
}

impl Form {
    fn file(self) -> &'static str {
        match self.kind {
            Kind::AdmissionPolicy => "examples/hold-policy.yaml",
            Kind::Kyverno => "examples/hold-kyverno.yaml",
        }
    }
}

/// A pod as admission made it, or why it was refused.
#[derive(Clone, Debug, PartialEq)]
enum Admitted {
    /// Its QoS class and spec (JSON, the service account volume's random suffix cut off).
    Pod {
        qos: String,
        spec: String,
    },
    Refused(String),
}

impl Admitted {
    fn spec(&self) -> &str {
        match self {
            Admitted::Pod { spec, .. } => spec,
            Admitted::Refused(why) => panic!("refused: {why}"),
        }
    }
}

/// What admission made of every pod in every namespace: (namespace, pod fixture) -> pod.
type Everywhere = BTreeMap<(&'static str, &'static str), Admitted>;

/// What one form did over the operator's run.
struct Run {
    form: Form,
    /// `kubectl apply -f` of the form's file: its stderr; and what applying it again printed.
    applied: String,
    applied_again: String,
    /// Before the file was applied.
    written: Everywhere,
    /// Applied, no ConfigMap yet.
    before_configmap: Everywhere,
    /// The README's ConfigMap: the image, ambientNamespaces=labelled.
    labelled: Everywhere,
    /// What docs/install.md's dry run printed then, in the trial namespace.
    dry_run: String,
    /// The image, every ambient namespace.
    served: Everywhere,
    /// The ConfigMap without an image, then none at all.
    no_image: Everywhere,
    deleted: Everywhere,
    /// The file deleted and applied again, the ConfigMap (the image, every ambient namespace)
    /// created again.
    reinstalled: Everywhere,
    /// The pods the Deployments' ReplicaSets made while the image was set: (namespace, pod
    /// fixture) -> (node, spec).
    deployed: BTreeMap<(&'static str, &'static str), (String, String)>,
    /// The pod of a Deployment made before the install, then after `kubectl rollout restart`.
    early: (String, String),
    /// The image the init container gets from an image that ends in a newline.
    newline: String,
    /// Whether web is served in these namespaces with ambientNamespaces' value misspelt, and
    /// with its key misspelt.
    typo: [(&'static str, bool); 3],
    key_typo: [(&'static str, bool); 3],
    /// The hook's command with the ConfigMap's logFormat: json.
    json_command: String,
    /// The image web gets in shop while the ConfigMap's is no image reference.
    malformed: String,
    /// Warnings any create printed.
    warnings: Vec<String>,
    /// MutatingAdmissionPolicy only: the API server's count of the policy's evaluations by
    /// error type, and Consul's policy (examples/consul.yaml) over its injected pod and a plain
    /// one.
    checks: Vec<(String, String, String, u64)>,
    consul: Vec<Admitted>,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn pod_file(pod: &str) -> String {
    format!("{FIXTURES}/pods/{pod}.yaml")
}

/// The first `name:` under `metadata:` of a YAML document.
fn metadata_name(yaml: &str) -> String {
    yaml.lines()
        .skip_while(|l| l.trim_end() != "metadata:")
        .find_map(|l| l.strip_prefix("  name: "))
        .unwrap_or_else(|| panic!("a metadata.name in {yaml}"))
        .trim()
        .to_string()
}

/// Creates `pods` in `namespace` as a server-side dry run: one kubectl for all of them.
fn admit(
    cp: &ControlPlane,
    namespace: &str,
    pods: &[&'static str],
    warnings: &mut Vec<String>,
) -> Vec<(&'static str, Admitted)> {
    let files: Vec<String> = pods.iter().map(|p| pod_file(p)).collect();
    let mut args = vec![
        "create",
        "-n",
        namespace,
        "--dry-run=server",
        "-o",
        "jsonpath={.metadata.name}{\"\\t\"}{.status.qosClass}{\"\\t\"}{.spec}{\"\\n\"}",
    ];
    for f in &files {
        args.extend(["-f", f]);
    }
    let out = cp.kubectl(&args);
    let mut made: BTreeMap<String, Admitted> = BTreeMap::new();
    for line in out.stdout.lines() {
        let mut f = line.splitn(3, '\t');
        let (Some(name), Some(qos), Some(spec)) = (f.next(), f.next(), f.next()) else {
            panic!("kubectl create printed {line:?}")
        };
        let pod = Admitted::Pod { qos: qos.to_string(), spec: without_token_suffix(spec) };
        made.insert(name.to_string(), pod);
    }
    for line in out.stderr.lines() {
        if let Some(why) = line.strip_prefix("Warning: ") {
            warnings.push(format!("{namespace}: {why}"));
            continue;
        }
        // Error from server (Forbidden): error when creating "<file>": <why>
        let refused =
            line.split_once("error when creating \"").and_then(|(_, r)| r.split_once("\": "));
        let Some((file, why)) = refused else { panic!("kubectl create in {namespace}: {line}") };
        made.insert(metadata_name(&read(file)), Admitted::Refused(why.to_string()));
    }
    pods.iter()
        .zip(&files)
        .map(|(pod, file)| {
            let name = metadata_name(&read(file));
            let got = made.remove(&name).unwrap_or_else(|| {
                panic!("{pod} in {namespace}: neither made nor refused:\n{}", out.stderr)
            });
            (*pod, got)
        })
        .collect()
}

fn admit_everywhere(cp: &ControlPlane, warnings: &mut Vec<String>) -> Everywhere {
    let mut all = Everywhere::new();
    for (_, namespace) in NAMESPACES {
        for (pod, got) in admit(cp, namespace, &PODS, warnings) {
            all.insert((namespace, pod), got);
        }
    }
    all
}

/// Waits until the web pod in `namespace` is (or is no longer) changed from `written`: the
/// policy or its ConfigMap has reached the API server's (or Kyverno's) view.
fn wait_until(cp: &ControlPlane, written: &Everywhere, namespace: &'static str, changed: bool) {
    let what =
        format!("web in {namespace} to be {}", if changed { "changed" } else { "as written" });
    cp.wait_for(&what, || {
        let got = admit(cp, namespace, &["web"], &mut Vec::new()).remove(0).1;
        ((got != written[&(namespace, "web")]) == changed).then_some(())
    });
}

/// A Deployment of one replica whose pod template is the pod fixture's metadata and spec.
fn deployment(cp: &ControlPlane, name: &str, pod: &str) -> String {
    let of = |path: &str| {
        let field = cp.ok(&[
            "create",
            "--dry-run=client",
            "-f",
            &pod_file(pod),
            "-o",
            &format!("jsonpath={{{path}}}"),
        ]);
        if field.trim().is_empty() { "{}".to_string() } else { field }
    };
    let labels = of(".metadata.labels");
    let labels =
        format!("{{\"envoy-drain.test/deployment\":\"{name}\",{}", &labels[1..]).replace(",}", "}");
    format!(
        r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"{name}"}},"spec":{{"replicas":1,"selector":{{"matchLabels":{{"envoy-drain.test/deployment":"{name}"}}}},"template":{{"metadata":{{"labels":{labels},"annotations":{}}},"spec":{}}}}}}}"#,
        of(".metadata.annotations"),
        of(".spec")
    )
}

/// The Deployment's pods, once its ReplicaSet has made them and the scheduler bound them:
/// (pod name, node, spec).
fn deployed_pods(cp: &ControlPlane, namespace: &str, name: &str) -> Vec<(String, String, String)> {
    cp.wait_for(&format!("deployment {name}'s pod in {namespace}, bound to a node"), || {
        let out = cp.ok(&[
            "get",
            "pods",
            "-n",
            namespace,
            "-l",
            &format!("envoy-drain.test/deployment={name}"),
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}{\"\\t\"}{.spec.nodeName}{\"\\t\"}{.spec}{\"\\n\"}{end}",
        ]);
        let pods: Vec<(String, String, String)> = out
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, '\t');
                Some((f.next()?.into(), f.next()?.into(), without_token_suffix(f.next()?)))
            })
            .collect();
        (!pods.is_empty() && pods.iter().all(|(_, node, _)| !node.is_empty())).then_some(pods)
    })
}

/// The operator's run of one form, on a control plane of its own.
fn operate(form: Form) -> Run {
    let name = format!("{:?}-{}", form.kind, form.api_server);
    let cp = ControlPlane::start_with(&name, form.api_server, &[], Nodes::Objects);
    if form.kind == Kind::Kyverno {
        cp.start_kyverno();
    }
    for (file, name) in NAMESPACES {
        cp.namespace(&read(&format!("{FIXTURES}/namespaces/{file}.yaml")), name);
    }
    let mut warnings = Vec::new();
    let written = admit_everywhere(&cp, &mut warnings);
    // A workload that runs before the install.
    cp.ok_with(&["apply", "-n", "shop", "-f", "-"], Some(&deployment(&cp, "early", "web")));
    let early_before = deployed_pods(&cp, "shop", "early").remove(0);
    let Installed { applied, applied_again, before_configmap, labelled, dry_run, served } =
        install(&cp, form, &written, &mut warnings);
    let deployed = deploy_each(&cp, form, &written);
    // Pods made before the install get the hook at their next rollout.
    cp.ok(&["rollout", "restart", "deployment/early", "-n", "shop"]);
    let early_after = cp.wait_for("the early deployment's new pod", || {
        let pods = deployed_pods(&cp, "shop", "early");
        pods.into_iter().find(|(name, _, _)| *name != early_before.0)
    });
    let Typed { newline, typo, key_typo, json_command, malformed } = as_typed(&cp, &written);
    let (no_image, deleted) = take_back(&cp, &written, &mut warnings);
    // The API server's own count of the policy's evaluations, before a restart resets it.
    let checks = if form.kind == Kind::AdmissionPolicy { cp.policy_checks() } else { Vec::new() };
    let reinstalled = reinstall(&cp, form, &written, &mut warnings);
    let consul = consul(&cp, form, &mut warnings);
    Run {
        form,
        applied,
        applied_again,
        written,
        before_configmap,
        labelled,
        dry_run,
        served,
        no_image,
        deleted,
        reinstalled,
        deployed,
        early: (early_before.2, early_after.2),
        newline,
        typo,
        key_typo,
        json_command,
        malformed,
        warnings,
        checks,
        consul,
    }
}

/// The form's file as a path kubectl takes.
fn form_file(form: Form) -> String {
    format!("{}/{}", env!("CARGO_MANIFEST_DIR"), form.file())
}

/// What the install does, step by step (`Run`'s fields of the same names).
struct Installed {
    applied: String,
    applied_again: String,
    before_configmap: Everywhere,
    labelled: Everywhere,
    dry_run: String,
    served: Everywhere,
}

/// The form's file applied (and again), then the README's ConfigMap for labelled namespaces, the
/// dry run docs/install.md gives, and every ambient namespace.
fn install(
    cp: &ControlPlane,
    form: Form,
    written: &Everywhere,
    warn: &mut Vec<String>,
) -> Installed {
    let applied = cp.kubectl(&["apply", "-f", &form_file(form)]);
    assert!(applied.ok, "kubectl apply -f {}: {}", form.file(), applied.stderr);
    if form.kind == Kind::Kyverno {
        cp.wait_for_kyverno_policy("envoy-drain-hold");
    }
    let applied_again = cp.ok(&["apply", "-f", &form_file(form)]);
    let before_configmap = admit_everywhere(cp, warn);
    // The README's ConfigMap: a trial on labelled namespaces.
    cp.hold_settings(&[
        "image=registry.example.com/envoy-drain:0.1.0",
        "ambientNamespaces=labelled",
    ]);
    wait_until(cp, written, "staging", true);
    let labelled = admit_everywhere(cp, warn);
    // The dry run docs/install.md gives, and what it says it prints.
    let dry_run = cp.ok(&[
        "run",
        "hold-check",
        "-n",
        "staging",
        "--image=nginx",
        "--dry-run=server",
        "-o",
        "jsonpath={.spec.initContainers[*].name}{\"\\n\"}{.spec.containers[*].lifecycle.preStop.exec.command}{\"\\n\"}",
    ]);
    // Then every ambient namespace, as docs/install.md says.
    let all = r#"{"data":{"ambientNamespaces":"all"}}"#;
    cp.ok(&["patch", "configmap", "envoy-drain", "-n", "envoy-drain", "-p", all]);
    wait_until(cp, written, "shop", true);
    let served = admit_everywhere(cp, warn);
    Installed {
        applied: applied.stderr,
        applied_again,
        before_configmap,
        labelled,
        dry_run,
        served,
    }
}

/// A Deployment of each pod every namespace of `DEPLOYED_IN` admits, and the pods their
/// ReplicaSets made: (namespace, pod fixture) -> (node, spec).
fn deploy_each(
    cp: &ControlPlane,
    form: Form,
    written: &Everywhere,
) -> BTreeMap<(&'static str, &'static str), (String, String)> {
    for namespace in DEPLOYED_IN {
        for (pod, got) in admit(cp, namespace, &PODS, &mut Vec::new()) {
            // What the namespace refuses whatever the policy does (a quota, the restricted
            // level) has no pod to compare.
            if matches!(written[&(namespace, pod)], Admitted::Refused(_)) {
                continue;
            }
            assert!(matches!(got, Admitted::Pod { .. }), "{form:?}: {pod} in {namespace}: {got:?}");
            cp.ok_with(&["apply", "-n", namespace, "-f", "-"], Some(&deployment(cp, pod, pod)));
        }
    }
    let mut deployed = BTreeMap::new();
    for namespace in DEPLOYED_IN {
        for pod in PODS {
            if matches!(written[&(namespace, pod)], Admitted::Pod { .. }) {
                let (_, node, spec) = deployed_pods(cp, namespace, pod).remove(0);
                deployed.insert((namespace, pod), (node, spec));
            }
        }
    }
    deployed
}

/// The ConfigMap's data patched (a JSON patch).
fn patch_settings(cp: &ControlPlane, patch: &str) {
    cp.ok(&[
        "patch",
        "configmap",
        "envoy-drain",
        "-n",
        "envoy-drain",
        "--type",
        "json",
        "-p",
        patch,
    ]);
}

/// One key of the ConfigMap set.
fn set_setting(cp: &ControlPlane, key: &str, value: &str) {
    patch_settings(cp, &format!(r#"[{{"op":"add","path":"/data/{key}","value":{value:?}}}]"#));
}

/// The image web's init container gets in `namespace`; none where web is not served.
fn image_in(cp: &ControlPlane, namespace: &'static str) -> String {
    let got = admit(cp, namespace, &["web"], &mut Vec::new()).remove(0).1;
    let Admitted::Pod { spec, .. } = got else { return String::new() };
    let image = "{.spec.initContainers[?(@.name==\"envoy-drain-install\")].image}";
    spec_fields(&spec, &[image.into()]).remove(0)
}

/// What `as_typed` saw (`Run`'s fields of the same names).
struct Typed {
    newline: String,
    typo: [(&'static str, bool); 3],
    key_typo: [(&'static str, bool); 3],
    json_command: String,
    malformed: String,
}

/// What a person types: an image that ends in a newline (--from-file, a YAML block), a
/// misspelt ambientNamespaces value and key, JSON logs, an image that is no reference.
fn as_typed(cp: &ControlPlane, written: &Everywhere) -> Typed {
    set_setting(cp, "image", "registry.example.com/envoy-drain:0.1.1\n");
    let newline = cp.wait_for("the image from a value with a newline", || {
        let image = image_in(cp, "shop");
        image.ends_with("0.1.1").then_some(image)
    });
    set_setting(cp, "ambientNamespaces", "labeld");
    wait_until(cp, written, "shop", false);
    let typo = ["shop", "staging", "batch"].map(|n| (n, !image_in(cp, n).is_empty()));
    // The key misspelt, with the value that would widen it.
    set_setting(cp, "ambientNamespaces", "all");
    wait_until(cp, written, "shop", true);
    patch_settings(cp, r#"[{"op":"remove","path":"/data/ambientNamespaces"}]"#);
    set_setting(cp, "ambientNamespace", "all");
    wait_until(cp, written, "shop", false);
    let key_typo = ["shop", "staging", "batch"].map(|n| (n, !image_in(cp, n).is_empty()));
    set_setting(cp, "ambientNamespaces", "all");
    // JSON logs for every hook, from the ConfigMap.
    set_setting(cp, "logFormat", "json");
    let json_command = cp.wait_for("the hooks' JSON log", || {
        let Admitted::Pod { spec, .. } = admit(cp, "shop", &["web"], &mut Vec::new()).remove(0).1
        else {
            return None;
        };
        let command = spec_fields(&spec, &[of("productpage", "lifecycle.preStop.exec.command")]);
        command[0].contains("--log-format").then(|| command[0].clone())
    });
    patch_settings(cp, r#"[{"op":"remove","path":"/data/logFormat"}]"#);
    // An image that is no reference (its repository in capitals: the kubelet would leave every
    // served pod in InvalidImageName): nothing served, as without an image; bounded by wait_for.
    set_setting(cp, "image", "registry.example.com/Envoy-Drain:0.1.0");
    wait_until(cp, written, "shop", false);
    let malformed = image_in(cp, "shop");
    set_setting(cp, "image", "registry.example.com/envoy-drain:0.1.0");
    cp.wait_for("the image back", || image_in(cp, "shop").ends_with("0.1.0").then_some(()));
    Typed { newline, typo, key_typo, json_command, malformed }
}

/// Taking it back, as docs/install.md's rollback: the image removed (what is admitted then), and
/// after it is set again, the ConfigMap deleted (what is admitted then).
fn take_back(
    cp: &ControlPlane,
    written: &Everywhere,
    warnings: &mut Vec<String>,
) -> (Everywhere, Everywhere) {
    patch_settings(cp, r#"[{"op":"remove","path":"/data/image"}]"#);
    wait_until(cp, written, "shop", false);
    let no_image = admit_everywhere(cp, warnings);
    set_setting(cp, "image", "registry.example.com/envoy-drain:0.1.0");
    wait_until(cp, written, "shop", true);
    cp.ok(&["delete", "configmap", "envoy-drain", "-n", "envoy-drain"]);
    wait_until(cp, written, "shop", false);
    (no_image, admit_everywhere(cp, warnings))
}

/// The whole rollback, then the install again, as docs/install.md says: the ConfigMap deleted
/// (`take_back`), then the file (its namespace with it); the file applied again, the ConfigMap
/// created again, and, for the API server's form, the API server restarted: kube-apiserver stops
/// its ConfigMap informer with the last binding that names that kind and never starts it again
/// (kubernetes/kubernetes#130887), so it keeps what it last saw until it restarts. The pods are
/// served as before.
fn reinstall(
    cp: &ControlPlane,
    form: Form,
    written: &Everywhere,
    w: &mut Vec<String>,
) -> Everywhere {
    cp.ok(&["delete", "-f", &form_file(form), "--wait=true", "--timeout=60s"]);
    cp.ok(&["apply", "-f", &form_file(form)]);
    if form.kind == Kind::Kyverno {
        cp.wait_for_kyverno_policy("envoy-drain-hold");
    }
    cp.hold_settings(&["image=registry.example.com/envoy-drain:0.1.0", "ambientNamespaces=all"]);
    if form.kind == Kind::AdmissionPolicy {
        cp.restart(form.api_server);
    }
    wait_until(cp, written, "shop", true);
    admit_everywhere(cp, w)
}

/// The API server's form only: Consul's policy (examples/consul.yaml) over its injected pod and
/// a plain one.
fn consul(cp: &ControlPlane, form: Form, warnings: &mut Vec<String>) -> Vec<Admitted> {
    if form.kind != Kind::AdmissionPolicy {
        return Vec::new();
    }
    // The pod as written, read before the policy exists: read after it, it may be served
    // already, and no change would ever come.
    let consul_written = admit(cp, "default", &["consul-injected"], &mut Vec::new()).remove(0).1;
    let file = format!("{}/examples/consul.yaml", env!("CARGO_MANIFEST_DIR"));
    cp.ok(&["apply", "-f", &file]);
    cp.wait_for("Consul's policy to reach its pod", || {
        let got = admit(cp, "default", &["consul-injected", "web"], warnings);
        (got[0].1 != consul_written).then(|| got.into_iter().map(|(_, a)| a).collect())
    })
}

/// Both forms' runs, made once (in parallel) for all the tests below; a failed run fails every
/// test with its message.
fn runs() -> &'static [Run; 4] {
    static RUNS: OnceLock<Result<[Run; 4], String>> = OnceLock::new();
    let made = RUNS.get_or_init(|| {
        std::thread::scope(|s| {
            // Each form on 1.36 and on 1.37, as pairs.
            let (policy, kyverno) = (Kind::AdmissionPolicy, Kind::Kyverno);
            let (v36, v37) = ("kube-apiserver", "kube-apiserver-1.37");
            let forms = [(policy, v36), (kyverno, v36), (policy, v37), (kyverno, v37)];
            let runs =
                forms.map(|(kind, api_server)| s.spawn(move || operate(Form { kind, api_server })));
            let [a, k, a37, k37] = runs.map(|t| {
                t.join().map_err(|e| {
                    e.downcast_ref::<String>().cloned().unwrap_or_else(|| "a panic".to_string())
                })
            });
            Ok([a?, k?, a37?, k37?])
        })
    });
    made.as_ref().unwrap_or_else(|e| panic!("the operator's run failed: {e}"))
}

/// Several JSONPath queries on a pod spec (JSON), with kubectl's own evaluator.
fn spec_fields(spec: &str, paths: &[String]) -> Vec<String> {
    fields(
        &format!(r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p"}},"spec":{spec}}}"#),
        paths,
    )
}

fn of(container: &str, field: &str) -> String {
    format!("{{.spec.containers[?(@.name==\"{container}\")].{field}}}")
}

/// The preStop command a container gets, as kubectl's jsonpath prints it: the periods of the
/// probes that go on while the pod terminates, and of the containers' liveness probes.
fn hold(
    preset: &str,
    deadline: u64,
    (probes, liveness): (&str, &str),
    ignore: Option<&str>,
) -> String {
    let deadline = format!("{deadline}s");
    let mut args = vec!["/envoy-drain/envoy-drain", "hold", "--preset", preset];
    args.extend(["--deadline", &deadline, "--probe-periods", probes]);
    args.extend(["--liveness-periods", liveness]);
    args.extend(ignore.into_iter().flat_map(|i| ["--ignore-ports", i]));
    args.extend(["--log-file", "/proc/1/fd/1"]);
    format!("[{}]", args.into_iter().map(json_string).collect::<Vec<_>>().join(","))
}

/// Names as kubectl's jsonpath lists them, sorted.
fn names(listed: &str) -> Vec<&str> {
    let mut names: Vec<&str> = listed.split_whitespace().collect();
    names.sort_unstable();
    names
}

fn changed(run: &Run, state: &Everywhere, namespace: &'static str, pod: &'static str) -> bool {
    state[&(namespace, pod)] != run.written[&(namespace, pod)]
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn the_install_applies_without_a_warning_and_changes_nothing_until_its_configmap_names_the_image() {
    for run in runs() {
        let form = run.form;
        assert_eq!(run.applied, "", "{form:?}: kubectl apply warned");
        // Applied again unchanged, it says so of every object (an operator's GitOps diff).
        let lines: Vec<&str> = run.applied_again.lines().collect();
        assert!(
            lines.len() >= 2 && lines.iter().all(|l| l.ends_with(" unchanged")),
            "{form:?}: {}",
            run.applied_again
        );
        assert!(run.warnings.is_empty(), "{form:?}: {:?}", run.warnings);
        for (state, what) in [
            (&run.before_configmap, "before the ConfigMap"),
            (&run.no_image, "with a ConfigMap without the image"),
            (&run.deleted, "once the ConfigMap is deleted"),
        ] {
            for (key, got) in state {
                assert_eq!(*got, run.written[key], "{form:?} {what}: {key:?}");
            }
        }
        // Deleted and installed again, it serves every pod as it did.
        for (key, got) in &run.reinstalled {
            assert_eq!(*got, run.served[key], "{form:?} installed again: {key:?}");
        }
        // The Deployment made before: its pod as written, the one of its next rollout served.
        let f =
            |spec: &str| spec_fields(spec, &[of("productpage", "lifecycle.preStop.exec.command")]);
        assert_eq!(f(&run.early.0), [""], "{form:?}");
        assert_eq!(
            f(&run.early.1),
            [hold("ambient", 20, ("5s", "10s"), Some("15001,15053"))],
            "{form:?}"
        );
    }
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn the_trial_reaches_labelled_ambient_namespaces_only_and_the_dry_run_prints_what_the_docs_say() {
    for run in runs() {
        let form = run.form;
        for (namespace, served) in [
            ("shop", false),
            ("catalog", false),
            ("staging", true),
            ("batch", true),
            ("vault", false),
        ] {
            assert_eq!(
                changed(run, &run.labelled, namespace, "web"),
                served,
                "{form:?} {namespace}"
            );
        }
        let docs = read(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/install.md"));
        assert!(docs.contains(&format!("```\n{}```", run.dry_run)), "{form:?}: {}", run.dry_run);
    }
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn an_image_ending_in_a_newline_is_trimmed_a_malformed_one_serves_nothing_and_a_misspelt_scope_never_widens()
 {
    for run in runs() {
        assert_eq!(run.newline, "registry.example.com/envoy-drain:0.1.1", "{:?}", run.form);
        assert_eq!(run.malformed, "", "{:?}: no pod gets an image it cannot pull", run.form);
        // "labeld" is taken as labelled: the trial namespace and the one without a mesh only;
        // so is `ambientNamespace: all`, a key the policy does not know.
        let labelled = [("shop", false), ("staging", true), ("batch", true)];
        assert_eq!(run.typo, labelled, "{:?}", run.form);
        assert_eq!(run.key_typo, labelled, "{:?}", run.form);
        assert!(
            run.json_command.ends_with(r#""--log-file","/proc/1/fd/1","--log-format","json"]"#),
            "{:?}: {}",
            run.form,
            run.json_command
        );
    }
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn each_container_without_a_prestop_gets_the_hold_of_its_namespace_and_a_deadline_from_its_grace() {
    for run in runs() {
        for (namespace, preset, ignore) in [
            ("shop", "ambient", Some("15001,15053")),
            ("catalog", "ambient", Some("15001,15053")),
            ("batch", "none", None),
        ] {
            // (pod, container, the deadline: 10 s less than the grace period, or half of a short
            // one, the readiness probes' periods and the liveness probes')
            for (pod, container, deadline, probes) in [
                ("web", "productpage", 20, ("5s", "10s")),
                ("two-containers", "orders", 50, ("none", "none")),
                ("short-grace", "ratings", 7, ("none", "none")),
            ] {
                let f = spec_fields(
                    run.served[&(namespace, pod)].spec(),
                    &[
                        of(container, "lifecycle.preStop.exec.command"),
                        of(container, "volumeMounts[?(@.name==\"envoy-drain\")].readOnly"),
                        "{.spec.initContainers[?(@.name==\"envoy-drain-install\")].image}"
                            .to_string(),
                        "{.spec.volumes[?(@.name==\"envoy-drain\")].emptyDir.sizeLimit}"
                            .to_string(),
                        of(
                            container,
                            "env[?(@.name==\"ENVOY_DRAIN_NODE_IPS\")].valueFrom.fieldRef.fieldPath",
                        ),
                    ],
                );
                let what = format!("{:?}: {pod} in {namespace}", run.form);
                assert_eq!(f[0], hold(preset, deadline, probes, ignore), "{what}");
                assert_eq!(f[1], "true", "{what}: the binary, read-only");
                assert_eq!(f[2], "registry.example.com/envoy-drain:0.1.0", "{what}");
                assert_eq!(f[3], "4Mi", "{what}");
                // Without a mesh the kubelet probes from the node, whose addresses the downward
                // API gives; in ambient mode istio-cni sends them from 169.254.7.127.
                let node =
                    if preset == "none" && pod != "two-containers" { "status.hostIPs" } else { "" };
                assert_eq!(f[4], node, "{what}");
            }
            what_the_pods_had_stays(run, namespace);
        }
    }
}

/// What the pods had stays: the shipper's own preStop, the app's postStart, the first init
/// container, the web app's volume and probes.
fn what_the_pods_had_stays(run: &Run, namespace: &'static str) {
    let form = run.form;
    let f = spec_fields(
        run.served[&(namespace, "two-containers")].spec(),
        &[
            of("shipper", "lifecycle.preStop.exec.command"),
            of("shipper", "volumeMounts[*].name"),
            of("orders", "lifecycle.postStart.exec.command"),
            "{.spec.initContainers[*].name}".into(),
            of("orders", "env[*].name"),
            of("orders", "env[*].value"),
        ],
    );
    assert_eq!(f[4], "ENVOY_DRAIN_NODE_IPS", "{form:?} {namespace}: the app's own, once");
    assert_eq!(f[5], "10.1.2.3", "{form:?} {namespace}: the app's own value");
    assert_eq!(f[0], r#"["/fluent-bit/bin/flush"]"#, "{form:?} {namespace}");
    assert_eq!(f[1], "kube-api-access-", "{form:?} {namespace}: the shipper gets nothing");
    assert_eq!(f[2], r#"["/bin/warm-cache"]"#, "{form:?} {namespace}");
    assert_eq!(f[3], "migrate envoy-drain-install", "{form:?} {namespace}: ours last");
    let f = spec_fields(
        run.served[&(namespace, "web")].spec(),
        &[
            "{.spec.containers[0].volumeMounts[*].name}".into(),
            "{.spec.volumes[*].name}".into(),
            "{.spec.containers[0].readinessProbe.httpGet.path}".into(),
        ],
    );
    let volumes = ["envoy-drain", "kube-api-access-", "tmp"];
    assert_eq!(names(&f[0]), volumes, "{form:?} {namespace}");
    assert_eq!(names(&f[1]), volumes, "{form:?} {namespace}");
    assert_eq!(f[2], "/health", "{form:?} {namespace}: the probe");
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn the_readiness_probes_the_kubelet_keeps_sending_and_the_ports_the_pod_names_reach_the_command() {
    // Readiness probes of the containers and of the native sidecar (1 s, the default 10 s, 3 s)
    // and the sidecar's liveness probe (2 s); the containers' liveness probes (the default 10 s),
    // which the kubelet stops before the preStop, apart. The port named for metrics and the
    // annotation's port are left out, after ztunnel's own in ambient mode.
    for run in runs() {
        for (namespace, preset, ignore) in
            [("shop", "ambient", "15001,15053,9091,9090"), ("batch", "none", "9091,9090")]
        {
            let f = spec_fields(
                run.served[&(namespace, "probes")].spec(),
                &[of("catalog", "lifecycle.preStop.exec.command")],
            );
            assert_eq!(
                f[0],
                hold(preset, 20, ("1s,10s,3s,2s", "10s"), Some(ignore)),
                "{:?} {namespace}",
                run.form
            );
            // An annotation that is not a list of ports is left out, never passed to exit 2.
            let f = spec_fields(
                run.served[&(namespace, "bad-annotation")].spec(),
                &[of("cart", "lifecycle.preStop.exec.command")],
            );
            let ignore = (preset == "ambient").then_some("15001,15053");
            assert_eq!(
                f[0],
                hold(preset, 20, ("none", "none"), ignore),
                "{:?} {namespace}",
                run.form
            );
        }
    }
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn pods_that_opt_out_or_that_it_cannot_serve_and_other_namespaces_are_left_alone() {
    for run in runs() {
        for namespace in ["shop", "batch"] {
            for pod in LEFT_ALONE {
                assert!(
                    !changed(run, &run.served, namespace, pod),
                    "{:?}: {pod} in {namespace}",
                    run.form
                );
            }
        }
        // Namespaces that did not ask or opted out (one with a typo in its label: a value other
        // than enabled leaves it alone), one with sidecars (the sidecar's template holds there),
        // one whose revision label may give its pods sidecars.
        for namespace in ["cart", "returns", "default", "legacy", "search"] {
            for pod in PODS {
                assert!(
                    !changed(run, &run.served, namespace, pod),
                    "{:?}: {pod} in {namespace}",
                    run.form
                );
            }
        }
    }
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn no_pod_is_refused_for_what_the_policy_adds_under_the_restricted_level_a_quota_or_limit_ranges() {
    for run in runs() {
        let form = run.form;
        for ((namespace, pod), written) in &run.written {
            let served = &run.served[&(*namespace, *pod)];
            match (written, served) {
                (Admitted::Pod { .. }, Admitted::Refused(why)) => {
                    panic!("{form:?}: {pod} in {namespace} refused once served: {why}")
                }
                // Refused as written (no resources under a quota, root under the restricted
                // level): refused for the same reason.
                (Admitted::Refused(before), Admitted::Refused(after)) => {
                    assert_eq!(before, after, "{form:?}: {pod} in {namespace}")
                }
                _ => {}
            }
        }
        // A pod written for the restricted level with requests equal to limits: admitted and
        // Guaranteed before and after, in each namespace that enforces the level or a quota.
        for namespace in ["payments", "reports", "vault"] {
            let key = (namespace, "guaranteed");
            let qos = |a: &Admitted| match a {
                Admitted::Pod { qos, .. } => qos.clone(),
                Admitted::Refused(why) => panic!("{form:?} {namespace}: {why}"),
            };
            assert!(
                changed(run, &run.served, namespace, "guaranteed") || namespace == "reports",
                "{form:?} {namespace}: served"
            );
            assert_eq!(
                (qos(&run.written[&key]), qos(&run.served[&key])),
                ("Guaranteed".into(), "Guaranteed".into())
            );
        }
        // A pod without resources of its own, under a quota, admitted with the LimitRange's; our
        // init container keeps its own.
        let f = spec_fields(
            run.served[&("vault", "hardened")].spec(),
            &[
                "{.spec.containers[0].resources}".into(),
                "{.spec.initContainers[?(@.name==\"envoy-drain-install\")].resources}".into(),
            ],
        );
        assert_eq!(
            f,
            [
                r#"{"limits":{"cpu":"500m","memory":"256Mi"},"requests":{"cpu":"100m","memory":"128Mi"}}"#,
                r#"{"limits":{"cpu":"10m","memory":"16Mi"},"requests":{"cpu":"10m","memory":"16Mi"}}"#
            ],
            "{form:?}"
        );
        // A pod that runs as root keeps ours as 65532, which then starts.
        let f = spec_fields(
            run.served[&("shop", "root")].spec(),
            &["{.spec.initContainers[0].securityContext.runAsUser} {.spec.initContainers[0].securityContext.runAsGroup} {.spec.initContainers[0].securityContext.runAsNonRoot}".into()],
        );
        assert_eq!(f[0], "65532 65532 true", "{form:?}");
    }
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn the_pods_deployments_make_get_what_a_pod_created_alone_gets_and_are_bound_to_linux_or_windows() {
    for run in runs() {
        for ((namespace, pod), (node, spec)) in &run.deployed {
            let alone = run.served[&(*namespace, *pod)].spec();
            let hooks = |spec: &str| {
                spec_fields(
                    spec,
                    &[
                        "{.spec.containers[*].lifecycle.preStop.exec.command}".into(),
                        "{.spec.initContainers[*].name}".into(),
                        "{.spec.volumes[*].name}".into(),
                    ],
                )
            };
            assert_eq!(hooks(spec), hooks(alone), "{:?}: {pod} in {namespace}", run.form);
            // Bound (deployed_pods waited for it): a Windows pod that asks for Windows nodes
            // by its selector, on the one there is.
            if pod.starts_with("windows-") {
                assert_eq!(node, "node-windows", "{:?}: {pod} in {namespace}", run.form);
            }
        }
        assert!(run.deployed.len() >= 40, "{:?}: {} Deployments", run.form, run.deployed.len());
    }
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn both_forms_make_the_same_pod_of_every_pod_in_every_namespace_and_never_fail() {
    for [policy, kyverno] in runs().as_chunks::<2>().0 {
        same_pods_and_never_failed(policy, kyverno);
    }
}

/// Each pod the same under both forms on one API server; none of the policy's checks failed.
fn same_pods_and_never_failed(policy: &Run, kyverno: &Run) {
    for (a, k, what) in [
        (&policy.labelled, &kyverno.labelled, "on trial"),
        (&policy.served, &kyverno.served, "served"),
    ] {
        for (key, got) in a {
            assert_eq!(*got, k[key], "{what} on {}: {key:?}", policy.form.api_server);
        }
    }
    // The API server counts each evaluation of the policy by its outcome: none failed.
    let failed: Vec<_> = policy
        .checks
        .iter()
        .filter(|(p, _, error, _)| p == "envoy-drain-hold" && error != "no_error")
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert!(
        policy
            .checks
            .iter()
            .any(|(p, _, e, n)| p == "envoy-drain-hold" && e == "no_error" && *n > 100),
        "{:?}",
        policy.checks
    );
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn consuls_policy_gives_the_injected_dataplane_its_prestop_and_leaves_other_pods_alone() {
    for policy in runs().iter().filter(|r| r.form.kind == Kind::AdmissionPolicy) {
        consuls_hook(policy);
    }
}

/// Consul's injected dataplane got its hook, a plain pod nothing.
fn consuls_hook(policy: &Run) {
    let f = spec_fields(
        policy.consul[0].spec(),
        &[of("consul-dataplane", "lifecycle.preStop.exec.command"), of("reviews", "lifecycle")],
    );
    let command = ["/envoy-drain/envoy-drain", "run", "--preset=consul", "--deadline=30s"];
    let command = format!(
        "[{},{}]",
        command.map(json_string).join(","),
        json_string("--log-file=/proc/1/fd/1")
    );
    assert_eq!(f, [command, String::new()]);
    assert_eq!(policy.consul[1], policy.written[&("default", "web")]);
}

/// A JSON array of strings, as kubectl's jsonpath prints a command (nothing: a container without).
fn json_strings(array: &str) -> Vec<String> {
    if array.trim().is_empty() {
        return Vec::new();
    }
    serde_json::from_str(array).unwrap_or_else(|e| panic!("{e}: a JSON array of strings: {array}"))
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn every_command_the_policies_write_runs_without_a_usage_error() {
    let mut commands = std::collections::BTreeSet::new();
    for run in runs() {
        for got in run.served.values().chain(&run.consul) {
            if let Admitted::Pod { spec, .. } = got {
                let listed = spec_fields(
                    spec,
                    &["{range .spec.containers[*]}{.lifecycle.preStop.exec.command}{\"\\n\"}{end}"
                        .into()],
                );
                commands.extend(
                    listed[0]
                        .lines()
                        .map(json_strings)
                        .filter(|c| c.first().is_some_and(|p| p == "/envoy-drain/envoy-drain")),
                );
            }
        }
    }
    assert!(commands.len() > 10, "{commands:?}");
    // Each as written but for the log file (the container's stdout, not here) and a deadline of
    // 1s, in a network namespace of its own where nothing answers: whatever it then says, a
    // usage error (exit 2) would leave the app its SIGTERM at once.
    for command in commands {
        let mut args: Vec<&str> = Vec::new();
        let mut rest = command[1..].iter().map(String::as_str);
        while let Some(arg) = rest.next() {
            match arg.split_once('=').map_or(arg, |(flag, _)| flag) {
                "--log-file" | "--deadline" if !arg.contains('=') => {
                    rest.next();
                }
                "--log-file" | "--deadline" => {}
                _ => args.push(arg),
            }
        }
        args.extend(["--deadline", "1s"]);
        let args: Vec<String> = args.into_iter().map(str::to_string).collect();
        let out = support::netns::in_private_netns(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            support::run(support::command(&args))
        });
        assert_ne!(out.code, Some(2), "{command:?} is a usage error: {out}");
    }
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn on_kubernetes_1_34_the_policy_is_refused_as_v1_and_serves_as_v1beta1_where_the_gate_is_on() {
    // kube-apiserver 1.34.4 with what a self-managed cluster sets to serve the beta API (its
    // controllers would be 1.34's too: the test makes the service account they would).
    let cp = ControlPlane::start_with(
        "v1beta1",
        "kube-apiserver-1.34",
        &[
            "--feature-gates=MutatingAdmissionPolicy=true",
            "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
        ],
        Nodes::None,
    );
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/hold-policy.yaml");
    let v1 = cp.kubectl(&["apply", "-f", file]);
    assert!(!v1.ok, "1.34 serves no v1 MutatingAdmissionPolicy: {}", v1.stdout);
    // What an operator sees: the namespace made, each v1 object not found (kubectl 1.36).
    assert!(v1.stdout.contains("namespace/envoy-drain created"), "{}", v1.stdout);
    assert_eq!(
        v1.stderr.matches("the server could not find the requested resource").count(),
        3,
        "{}",
        v1.stderr
    );
    // docs/install.md's command for 1.34 and 1.35.
    let beta = read(file).replace(
        "apiVersion: admissionregistration.k8s.io/v1\n",
        "apiVersion: admissionregistration.k8s.io/v1beta1\n",
    );
    let sed = Command::new("sed")
        .args(["s#admissionregistration.k8s.io/v1$#admissionregistration.k8s.io/v1beta1#", file])
        .output()
        .expect("sed");
    assert_eq!(String::from_utf8_lossy(&sed.stdout), beta, "the docs' sed");
    let applied = cp.kubectl_with(&["apply", "-f", "-"], Some(&beta));
    assert!(applied.ok && applied.stderr.is_empty(), "{}", applied.stderr);
    let account = "\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n  \
                   namespace: shop\n";
    let namespace = read(&format!("{FIXTURES}/namespaces/ambient.yaml")) + account;
    cp.namespace(&namespace, "shop");
    cp.ok(&["apply", "-f", &format!("{FIXTURES}/configmaps/image.yaml")]);
    let command = cp.wait_for("the v1beta1 policy to serve shop", || {
        let Admitted::Pod { spec, .. } = admit(&cp, "shop", &["web"], &mut Vec::new()).remove(0).1
        else {
            return None;
        };
        let f = spec_fields(&spec, &[of("productpage", "lifecycle.preStop.exec.command")]);
        (!f[0].is_empty()).then(|| f[0].clone())
    });
    assert_eq!(command, hold("ambient", 20, ("5s", "10s"), Some("15001,15053")));
}
