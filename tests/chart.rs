//! The chart (charts/envoy-drain) as operators use it: Helm itself (helm.sh/helm/v4, built by
//! scripts/components) against real API servers, each picking the policy's form from what it
//! serves: kube-apiserver 1.36 and 1.37 (MutatingAdmissionPolicy v1), 1.34 with its feature gate
//! (v1beta1), 1.34 without it, first alone (the install fails and says why), then with Kyverno's
//! admission controller (its MutatingPolicy). On each: install, a value changed by upgrade, the
//! rollback, the uninstall, each seen through a server-side dry run of a pod (all of admission,
//! nothing stored) in a namespace the policy serves. `helm lint` and the rendered manifests are
//! scripts/check-release's.

mod support;

use std::process::Command;
use support::cluster::{ControlPlane, Kubectl, Nodes, components};
use support::node::{Image, Node};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/envoy-drain");
const IMAGE: &str = "registry.example.com/envoy-drain";

/// A namespace without a mesh that asks for the hold.
const BATCH: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: batch\n  labels:\n    \
                     envoy-drain.io/hold: enabled\n";

/// The namespace `batch` and its service account, which pods need: the controllers' where they
/// run, else made here.
fn batch(cp: &ControlPlane) {
    cp.ok_with(&["apply", "-f", "-"], Some(BATCH));
    let _ = cp.kubectl(&["create", "serviceaccount", "default", "-n", "batch"]);
    cp.namespace(BATCH, "batch");
}

/// Helm against `cp`, its caches in the control plane's directory.
fn helm(cp: &ControlPlane, args: &[&str]) -> Kubectl {
    let helm = components().join("bin/helm");
    let mut cmd = cp.command(helm.to_str().expect("UTF-8"));
    for dir in ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"] {
        cmd.env(dir, cp.path(&format!("helm/{dir}")));
    }
    cmd.arg("--kubeconfig").arg(cp.path("kubeconfig")).args(args);
    Kubectl::run(cmd, None)
}

/// `helm <args>` that must succeed: its stdout.
fn helm_ok(cp: &ControlPlane, args: &[&str]) -> String {
    let out = helm(cp, args);
    assert!(out.ok, "helm {}: {}{}", args.join(" "), out.stdout, out.stderr);
    out.stdout
}

/// The preStop a pod created now in `batch` would get ("" for none).
fn hook(cp: &ControlPlane) -> String {
    cp.ok(&[
        "run",
        "check",
        "-n",
        "batch",
        "--image=app",
        "--restart=Never",
        "--dry-run=server",
        "-o",
        "jsonpath={.spec.containers[0].lifecycle.preStop.exec.command}",
    ])
}

/// Waits until the hook a pod would get satisfies `f` (a policy serves a change within seconds:
/// its informer's, or Kyverno's, watch).
fn hook_until(cp: &ControlPlane, what: &str, f: impl Fn(&str) -> bool) -> String {
    cp.wait_for(what, || Some(hook(cp)).filter(|h| f(h)))
}

/// The policy as the API server stores it: its kind's resource and its resourceVersion.
fn policy_version(cp: &ControlPlane, resource: &str) -> String {
    cp.ok(&["get", resource, "envoy-drain-hold", "-o", "jsonpath={.metadata.resourceVersion}"])
}

/// Installed again after the uninstall, with another setting: served once `restart` (an API
/// server's name) is restarted, where one is named. kube-apiserver stops its ConfigMap informer
/// with the last binding that names ConfigMaps (kubernetes/kubernetes#130887): 1.36 then keeps
/// what it saw last (the ConfigMap deleted: nothing served, 15 s seen, until a restart); 1.37
/// reads a parameter its informer lacks from the API (k8s.io/apiserver v0.37
/// policy_dispatcher.go, a cache miss's direct GET), and serves it within seconds.
fn install_again(cp: &ControlPlane, ns: &str, restart: Option<&str>) {
    let repository = format!("image.repository={IMAGE}");
    let set = ["--set", &repository, "--set", "logFormat=json"];
    helm_ok(cp, &[&["install", "envoy-drain", CHART, "-n", ns][..], &set].concat());
    if let Some(name) = restart {
        cp.restart(name);
    }
    hook_until(cp, "the new install's settings", |h| h.contains(r#""--log-format","json""#));
}

/// `helm test` on a node: kubectl in a pod (an image of the components' kubectl, as
/// registry.k8s.io/kubectl holds it) dry-runs a pod in the test's own namespace and prints its
/// preStop.
fn helm_test(cp: &ControlPlane, ns: &str) {
    let tested = helm_ok(cp, &["test", "envoy-drain", "-n", ns, "--logs", "--timeout=120s"]);
    let hook = r#"preStop of a pod in envoy-drain-dry-run: ["/envoy-drain/envoy-drain","hold""#;
    assert!(tested.contains(hook), "{tested}");
    assert!(tested.contains("Phase:          Succeeded"), "{tested}");
    // What it made is gone once it passed.
    cp.wait_for("the test's namespace to go", || {
        (!cp.kubectl(&["get", "namespace", "envoy-drain-dry-run"]).ok).then_some(())
    });
}

/// How NOTES name the form the chart should choose, and where the API server stores it.
type Form = (&'static str, &'static str);
const V1: Form = (
    "admissionregistration.k8s.io/v1)",
    "mutatingadmissionpolicies.v1.admissionregistration.k8s.io",
);
const V1BETA1: Form = (
    "admissionregistration.k8s.io/v1beta1, the only form Kubernetes v1.34",
    "mutatingadmissionpolicies.v1beta1.admissionregistration.k8s.io",
);
const KYVERNO: Form =
    ("Kyverno MutatingPolicy (policies.kyverno.io/v1)", "mutatingpolicies.v1.policies.kyverno.io");

/// The operator's whole round on `cp` in namespace `ns`: install (and `helm test` where `test`:
/// a node runs its pod), a value upgraded, rolled back, uninstalled, installed again (served
/// once the API server `restart` is restarted, where named).
fn round(cp: &ControlPlane, (form, resource): Form, ns: &str, test: bool, restart: Option<&str>) {
    batch(cp);
    let repository = format!("image.repository={IMAGE}");
    let install = ["install", "envoy-drain", CHART, "-n", ns, "--create-namespace", "--set"];
    let notes = helm_ok(
        cp,
        &[&install[..], &[&repository, "--set", "test.image=localhost/kubectl:test"]].concat(),
    );
    assert!(notes.contains(form), "NOTES name the form {form}: {notes}");
    assert!(notes.contains(&format!("image {IMAGE}:0.1.0")), "{notes}");
    let served = hook_until(cp, "the installed policy to serve batch", |h| !h.is_empty());
    assert!(served.contains(r#""hold","--preset","none""#), "{served}");
    assert!(!served.contains("--log-format"), "{served}");
    if test {
        helm_test(cp, ns);
    }
    let policy = policy_version(cp, resource);

    // A setting changed: new pods get it, the policy itself is not touched.
    let upgrade = ["upgrade", "envoy-drain", CHART, "-n", ns, "--reuse-values"];
    let settings = ["--set", "logFormat=json", "--set", "propagation=30s"];
    helm_ok(cp, &[&upgrade[..], &settings].concat());
    let json = hook_until(cp, "the upgrade's logFormat", |h| h.contains("--log-format"));
    assert!(json.contains(r#""--log-format","json""#), "{json}");
    assert!(json.contains(r#""--propagation","30s""#), "{json}");
    assert_eq!(policy_version(cp, resource), policy, "the upgrade left the policy as it was");

    helm_ok(cp, &["rollback", "envoy-drain", "1", "-n", ns, "--wait"]);
    let back = hook_until(cp, "the rollback's text log", |h| !h.contains("--log-format"));
    assert_eq!(back, served, "the rollback serves what the install did");

    helm_ok(cp, &["uninstall", "envoy-drain", "-n", ns, "--wait"]);
    assert!(!cp.kubectl(&["get", resource, "envoy-drain-hold"]).ok, "the policy is gone");
    assert!(!cp.kubectl(&["get", "configmap", "envoy-drain", "-n", ns]).ok);
    hook_until(cp, "pods to be left alone after the uninstall", str::is_empty);
    install_again(cp, ns, restart);
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn on_kubernetes_1_36_and_1_37_the_chart_installs_the_v1_policy_and_upgrades_rolls_back_and_reinstalls()
 {
    for program in ["kube-apiserver", "kube-apiserver-1.37"] {
        // 1.36 with a node (the components' kubelet and kube-proxy are 1.36's), for `helm test`.
        let nodes = if program == "kube-apiserver" { Nodes::Kubelet } else { Nodes::None };
        let cp = ControlPlane::start_with(&format!("chart-{program}"), program, &[], nodes);
        let kubectl = Image {
            name: "localhost/kubectl:test",
            entrypoint: vec!["/kubectl".into()],
            files: vec![],
            extra: vec![(cp.bin("kubectl"), "/kubectl".into())],
        };
        let node = (nodes == Nodes::Kubelet).then(|| Node::start(&cp, &[kubectl]));
        let version = cp.ok(&["get", "--raw", "/version"]);
        let minor = if program == "kube-apiserver" { "36" } else { "37" };
        assert!(version.contains(&format!("\"minor\": \"{minor}\"")), "{version}");
        // 1.37's in a namespace of the operator's choosing: the bindings' parameter follows it.
        let ns = if node.is_some() { "envoy-drain" } else { "platform" };
        if node.is_none() {
            batch(&cp);
            adopt_the_files_install(&cp);
        }
        let restart = (program == "kube-apiserver").then_some(program);
        round(&cp, V1, ns, node.is_some(), restart);
        if node.is_none() {
            kyverno_kept(&cp, ns);
        }
    }
}

/// A policy applied from the file, then adopted by a release as docs/install.md says (labels and
/// annotations, then `helm install`): no object deleted, and the release's settings served.
fn adopt_the_files_install(cp: &ControlPlane) {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/hold-policy.yaml");
    cp.ok(&["apply", "-f", file]);
    cp.hold_settings(&[&format!("image={IMAGE}:0.1.0"), "ambientNamespaces=labelled"]);
    hook_until(cp, "the file's policy to serve batch", |h| !h.is_empty());
    let uid = |o: &str| cp.ok(&["get", o, "envoy-drain-hold", "-o", "jsonpath={.metadata.uid}"]);
    let before = uid("mutatingadmissionpolicies");
    for object in [
        "mutatingadmissionpolicy/envoy-drain-hold",
        "mutatingadmissionpolicybinding/envoy-drain-hold-ambient",
        "mutatingadmissionpolicybinding/envoy-drain-hold-no-mesh",
        "configmap/envoy-drain",
    ] {
        let ns = ["-n", "envoy-drain"];
        cp.ok(&[&["label", object, "app.kubernetes.io/managed-by=Helm", "--overwrite"][..], &ns]
            .concat());
        let release =
            ["meta.helm.sh/release-name=envoy-drain", "meta.helm.sh/release-namespace=envoy-drain"];
        cp.ok(&[&["annotate", object][..], &release, &["--overwrite"], &ns].concat());
    }
    let repository = format!("image.repository={IMAGE}");
    let install = ["install", "envoy-drain", CHART, "-n", "envoy-drain", "--set", &repository];
    // Helm applies server-side: the fields kubectl's apply owns are taken over, not a conflict.
    let force = ["--set", "logFormat=json", "--force-conflicts"];
    helm_ok(cp, &[&install[..], &force].concat());
    hook_until(cp, "the release's settings", |h| h.contains(r#""--log-format","json""#));
    assert_eq!(uid("mutatingadmissionpolicies"), before, "the policy adopted, not made again");
    helm_ok(cp, &["uninstall", "envoy-drain", "-n", "envoy-drain", "--wait"]);
    hook_until(cp, "pods to be left alone after the uninstall", str::is_empty);
}

/// An install as Kyverno's on a cluster that now serves the API server's form too (Kyverno
/// first, Kubernetes upgraded later): `form=auto` keeps Kyverno's at the upgrade.
fn kyverno_kept(cp: &ControlPlane, ns: &str) {
    helm_ok(cp, &["uninstall", "envoy-drain", "-n", ns, "--wait"]);
    cp.start_kyverno();
    let repository = format!("image.repository={IMAGE}");
    let install = ["install", "envoy-drain", CHART, "-n", ns, "--set", &repository];
    let notes = helm_ok(cp, &[&install[..], &["--set", "form=kyverno"]].concat());
    assert!(notes.contains("Kyverno MutatingPolicy"), "{notes}");
    let upgrade = ["upgrade", "envoy-drain", CHART, "-n", ns, "--reuse-values"];
    let notes = helm_ok(cp, &[&upgrade[..], &["--set", "form=auto"]].concat());
    assert!(notes.contains("Kyverno MutatingPolicy"), "auto kept Kyverno's form: {notes}");
    let map = ["get", "mutatingadmissionpolicies.v1.admissionregistration.k8s.io"];
    assert!(cp.ok(&map).trim().is_empty(), "no MutatingAdmissionPolicy made");
}

#[test]
#[ignore = "needs root and the control plane built from source (`bash scripts/test`)"]
fn on_kubernetes_1_34_the_chart_takes_v1beta1_where_the_gate_is_on_and_else_kyverno_or_says_why() {
    let gate = [
        "--feature-gates=MutatingAdmissionPolicy=true",
        "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
    ];
    let cp = ControlPlane::start_with("chart-v1beta1", "kube-apiserver-1.34", &gate, Nodes::None);
    round(&cp, V1BETA1, "envoy-drain", false, Some("kube-apiserver-1.34"));
    drop(cp);

    let cp = ControlPlane::start_with("chart-kyverno", "kube-apiserver-1.34", &[], Nodes::None);
    let refused =
        helm(&cp, &["install", "envoy-drain", CHART, "-n", "envoy-drain", "--create-namespace"]);
    assert!(!refused.ok, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("Kubernetes v1.34.4 serves no MutatingAdmissionPolicy")
            && refused.stderr.contains("Kyverno's MutatingPolicy CRD (policies.kyverno.io/v1"),
        "one message names what is missing: {}",
        refused.stderr
    );
    assert!(
        !cp.kubectl(&["get", "configmap", "envoy-drain", "-n", "envoy-drain"]).ok,
        "nothing installed"
    );
    cp.start_kyverno();
    // In a namespace of the operator's choosing: the policy's resource.List follows it.
    // Kyverno reads the ConfigMap itself at each pod: installed again, served at once.
    round(&cp, KYVERNO, "platform", false, None);
}

/// `helm template` of the chart, offline, with `sets`.
fn template(sets: &[&str]) -> Kubectl {
    let mut cmd = Command::new(components().join("bin/helm"));
    cmd.args(["template", "envoy-drain", CHART, "-n", "envoy-drain", "--set", "form=v1"]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    Kubectl::run(cmd, None)
}

#[test]
#[ignore = "needs Helm built from source (`bash scripts/test`)"]
fn the_chart_names_the_image_by_digest_and_refuses_a_setting_it_does_not_know() {
    let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let pinned =
        template(&[&format!("image.repository={IMAGE}"), &format!("image.digest={digest}")]);
    assert!(pinned.stdout.contains(&format!("image: \"{IMAGE}@{digest}\"")), "{}", pinned.stderr);
    // No repository: the policy without an image in its settings, which serves no pod.
    let none = template(&[]);
    assert!(none.ok && none.stdout.contains("kind: MutatingAdmissionPolicy"), "{}", none.stderr);
    let settings = none.stdout.split("\n---\n").find(|d| d.contains("kind: ConfigMap"));
    assert!(settings.is_some_and(|cm| !cm.contains("image:")), "{}", none.stdout);
    for (set, said) in [
        ("ambientNamespaces=some", r#"ambientNamespaces: "some": expected all or labelled"#),
        ("logFormat=yaml", r#"logFormat: "yaml": expected text or json"#),
        ("form=v2", r#"form: "v2": expected auto, v1, v1beta1 or kyverno"#),
    ] {
        let refused = template(&[set]);
        assert!(!refused.ok && refused.stderr.contains(said), "{set}: {}", refused.stderr);
    }
}

#[test]
#[ignore = "needs Helm built from source (`bash scripts/test`)"]
fn the_waypoints_configmap_is_examples_own_with_the_charts_image_for_every_waypoint_or_one() {
    let image = format!("image.repository={IMAGE}");
    let waypoint = |sets: &[&str]| {
        let out = template(&[&["waypoint.enabled=true"][..], sets].concat());
        let doc = out.stdout.split("\n---\n").find(|d| d.contains("templates/waypoint.yaml"));
        (out.ok, doc.unwrap_or_default().to_string(), out.stderr)
    };
    let (ok, every, _) = waypoint(&[&image]);
    assert!(ok, "{every}");
    assert!(every.contains("namespace: istio-system"), "{every}");
    assert!(every.contains("gateway.istio.io/defaults-for-class: istio-waypoint"), "{every}");
    assert!(every.contains(&format!("image: {IMAGE}:0.1.0")), "{every}");
    // The patch itself is the example's, image aside.
    let example = std::fs::read_to_string(format!("{CHART}/files/waypoint.yaml")).unwrap();
    assert!(example.contains("- --preset=waypoint") && every.contains("- --preset=waypoint"));
    // One waypoint's: in its Gateway's namespace, unlabelled.
    let (_, one, _) =
        waypoint(&[&image, "waypoint.namespace=shop", "waypoint.defaultsForClass=false"]);
    assert!(one.contains("namespace: shop") && !one.contains("defaults-for-class"), "{one}");
    let (ok, _, refused) = waypoint(&[]);
    assert!(!ok && refused.contains("waypoint.enabled: needs image.repository"), "{refused}");
}
