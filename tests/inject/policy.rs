//! The namespace-wide install of `hold` for pods without a sidecar: examples/hold-policy.yaml (a
//! MutatingAdmissionPolicy) and examples/hold-kyverno.yaml (the same as a Kyverno MutatingPolicy),
//! evaluated by tests/inject/policy/apply.py over the pods of tests/inject/policy/pods/ in each
//! namespace of tests/inject/policy/namespaces/, their patches merged by kubectl as above.

use super::{fields, json_string, merge, output, repo, validate};
use std::process::Command;

const NAMESPACES: [&str; 5] = ["ambient", "no-mesh", "ambient-opted-out", "sidecar", "plain"];
const PODS: [&str; 8] = [
    "web",
    "two-containers",
    "short-grace",
    "opted-out",
    "asks-sidecar",
    "has-sidecar",
    "disabled",
    "installed",
];

#[derive(Clone, Copy, Debug)]
enum Form {
    /// examples/hold-policy.yaml
    AdmissionPolicy,
    /// examples/hold-kyverno.yaml
    Kyverno,
}

/// The patches a policy makes of `pod` (a file of tests/inject/policy/pods/) created in
/// `namespace`, in the order they apply.
fn patches(form: Form, namespace: &str, pod: &str) -> Vec<String> {
    let file = match form {
        Form::AdmissionPolicy => "examples/hold-policy.yaml",
        Form::Kyverno => "examples/hold-kyverno.yaml",
    };
    let mut cmd = Command::new(repo("target/tools-venv/bin/python"));
    cmd.arg(repo("tests/inject/policy/apply.py"))
        .arg(repo(file))
        .arg(repo(&format!("tests/inject/policy/namespaces/{namespace}.yaml")))
        .arg(repo(&format!("tests/inject/policy/pods/{pod}.yaml")));
    let what = format!("evaluating {file} for {pod} in {namespace}");
    output(cmd, &what).lines().map(str::to_string).collect()
}

/// The pod as the API server stores it after the policy (YAML), or None when it is left alone.
fn admitted(form: Form, namespace: &str, pod: &str) -> Option<String> {
    let patches = patches(form, namespace, pod);
    if patches.is_empty() {
        return None;
    }
    let text = std::fs::read_to_string(repo(&format!("tests/inject/policy/pods/{pod}.yaml")))
        .expect("the pod");
    Some(patches.iter().fold(text, |pod, patch| merge(&pod, patch)))
}

/// The preStop command a container gets, as kubectl's jsonpath prints it.
fn hold(preset: &str, deadline: u64) -> String {
    let args = [
        "/envoy-drain/envoy-drain",
        "hold",
        "--preset",
        preset,
        "--deadline",
        &format!("{deadline}s"),
        "--log-file",
        "/proc/1/fd/1",
    ];
    format!("[{}]", args.map(json_string).join(","))
}

/// Names as kubectl's jsonpath lists them, sorted: where a merge puts a new one among them is
/// the merge's to choose (strategic merge and server-side apply differ), and nothing depends on it.
fn names(listed: &str) -> Vec<&str> {
    let mut names: Vec<&str> = listed.split_whitespace().collect();
    names.sort_unstable();
    names
}

#[test]
#[ignore = "needs kubectl and cel-python (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn both_forms_of_the_policy_make_the_same_pod_of_every_pod_in_every_namespace() {
    let cases: Vec<(&str, &str)> =
        NAMESPACES.iter().flat_map(|n| PODS.iter().map(move |p| (*n, *p))).collect();
    // Two workers: each case runs Python twice and kubectl a few times.
    std::thread::scope(|s| {
        for half in cases.chunks(cases.len().div_ceil(2)) {
            s.spawn(move || {
                for (namespace, pod) in half {
                    let map = admitted(Form::AdmissionPolicy, namespace, pod);
                    let kyverno = admitted(Form::Kyverno, namespace, pod);
                    assert_eq!(map, kyverno, "{pod} in {namespace}");
                }
            });
        }
    });
}

#[test]
#[ignore = "needs kubectl, cel-python and kubernetes-validate (`bash scripts/test-tools`): \
            `bash scripts/test` runs it"]
fn each_container_without_a_prestop_gets_the_hold_of_its_namespace_and_a_deadline_from_its_grace() {
    for (namespace, preset) in [("ambient", "ambient"), ("no-mesh", "none")] {
        // (pod, container, the deadline: 10 s less than the grace period, or half of a short one)
        for (pod, container, deadline) in [
            ("web", "productpage", 20),
            ("two-containers", "orders", 50),
            ("short-grace", "ratings", 7),
        ] {
            let what = format!("{pod} in {namespace}");
            let got = admitted(Form::AdmissionPolicy, namespace, pod)
                .unwrap_or_else(|| panic!("{what}: left alone"));
            validate(&got);
            let of =
                |field: &str| format!("{{.spec.containers[?(@.name==\"{container}\")].{field}}}");
            let f = fields(
                &got,
                &[
                    of("lifecycle.preStop.exec.command"),
                    of("volumeMounts[?(@.name==\"envoy-drain\")].readOnly"),
                    "{.spec.initContainers[*].name}".to_string(),
                    "{.spec.volumes[*].name}".to_string(),
                ],
            );
            assert_eq!(f[0], hold(preset, deadline), "{what}");
            assert_eq!(f[1], "true", "{what}: the binary, read-only");
            assert!(names(&f[2]).contains(&"envoy-drain-install"), "{what}: {}", f[2]);
            assert!(names(&f[3]).contains(&"envoy-drain"), "{what}: {}", f[3]);
        }
        // What the pod had stays: the shipper's own preStop, the app's postStart, the first
        // init container, the web app's volume and probes.
        let two = admitted(Form::AdmissionPolicy, namespace, "two-containers").expect("changed");
        let f = fields(
            &two,
            &[
                "{.spec.containers[?(@.name==\"shipper\")].lifecycle.preStop.exec.command}".into(),
                "{.spec.containers[?(@.name==\"shipper\")].volumeMounts}".into(),
                "{.spec.containers[?(@.name==\"orders\")].lifecycle.postStart.exec.command}".into(),
                "{.spec.initContainers[*].name}".into(),
            ],
        );
        assert_eq!(f[0], r#"["/fluent-bit/bin/flush"]"#, "{namespace}");
        assert_eq!(f[1], "", "{namespace}: the shipper gets nothing");
        assert_eq!(f[2], r#"["/bin/warm-cache"]"#, "{namespace}");
        assert_eq!(names(&f[3]), ["envoy-drain-install", "migrate"], "{namespace}");
        let web = admitted(Form::AdmissionPolicy, namespace, "web").expect("changed");
        let f = fields(
            &web,
            &[
                "{.spec.containers[0].volumeMounts[*].name}".into(),
                "{.spec.volumes[*].name}".into(),
                "{.spec.containers[0].readinessProbe.httpGet.path}".into(),
            ],
        );
        assert_eq!(names(&f[0]), ["envoy-drain", "tmp"], "{namespace}: mounts");
        assert_eq!(names(&f[1]), ["envoy-drain", "tmp"], "{namespace}: volumes");
        assert_eq!(f[2], "/health", "{namespace}: the probe");
    }
}

#[test]
#[ignore = "needs kubectl and cel-python (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn pods_that_opt_out_or_install_it_themselves_and_other_namespaces_are_left_alone() {
    for namespace in ["ambient", "no-mesh"] {
        for pod in ["opted-out", "asks-sidecar", "has-sidecar", "disabled", "installed"] {
            assert_eq!(
                patches(Form::AdmissionPolicy, namespace, pod),
                Vec::<String>::new(),
                "{pod} in {namespace}"
            );
        }
    }
    // Namespaces that did not ask, and one with sidecars (the sidecar's template holds there).
    for namespace in ["ambient-opted-out", "plain", "sidecar"] {
        for pod in PODS {
            assert_eq!(
                patches(Form::AdmissionPolicy, namespace, pod),
                Vec::<String>::new(),
                "{pod} in {namespace}"
            );
        }
    }
}
