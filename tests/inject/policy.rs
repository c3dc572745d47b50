//! The namespace-wide install of `hold` for pods without a sidecar: examples/hold-policy.yaml (a
//! MutatingAdmissionPolicy) and examples/hold-kyverno.yaml (the same as a Kyverno MutatingPolicy),
//! carried out as the API server and Kyverno do by tests/inject/policy/admit.py (its docstring
//! says how, and docs/install.md what still differs) over the pods of tests/inject/policy/pods/
//! in each namespace of tests/inject/policy/namespaces/, with each ConfigMap of
//! tests/inject/policy/configmaps/ or none.

use super::{fields, json_string, output, repo, validate};
use std::process::Command;

const NAMESPACES: [&str; 10] = [
    "ambient",
    "no-mesh",
    "ambient-injection-off",
    "ambient-opted-out",
    "ambient-trial",
    "restricted",
    "quota",
    "revision",
    "sidecar",
    "plain",
];
const PODS: [&str; 17] = [
    "web",
    "two-containers",
    "short-grace",
    "guaranteed",
    "root",
    "probes",
    "bad-annotation",
    "opted-out",
    "asks-sidecar",
    "has-sidecar",
    "disabled",
    "installed",
    "host-network",
    "windows",
    "windows-selector",
    "image-volume",
    "revision",
];
/// The pods the policy leaves alone wherever it runs: those after the first seven.
const LEFT_ALONE: &[&str] = PODS.split_at(7).1;

#[derive(Clone, Copy, Debug)]
enum Form {
    /// examples/hold-policy.yaml
    AdmissionPolicy,
    /// examples/hold-kyverno.yaml
    Kyverno,
}

impl Form {
    fn file(self) -> &'static str {
        match self {
            Form::AdmissionPolicy => "examples/hold-policy.yaml",
            Form::Kyverno => "examples/hold-kyverno.yaml",
        }
    }
}

/// A pod as admission left it.
#[derive(Debug, PartialEq)]
struct Admitted {
    changed: bool,
    /// Its QoS class.
    qos: String,
    /// The policy's error, which its failurePolicy Ignore swallowed.
    ignored: Option<String>,
    /// Why validating admission refuses the pod.
    refused: Vec<String>,
    /// The pod as stored, JSON.
    pod: String,
}

/// What `policy` (a file of the repo) makes of each of `pods` (files of
/// tests/inject/policy/pods/) created in `namespace`, with the ConfigMap `configmap` of
/// tests/inject/policy/configmaps/ or none.
fn admit_all(
    policy: &str,
    namespace: &str,
    configmap: Option<&str>,
    pods: &[&str],
) -> Vec<Admitted> {
    let dir = "tests/inject/policy";
    let mut cmd = Command::new(repo("target/tools-venv/bin/python"));
    cmd.arg(repo(&format!("{dir}/admit.py")))
        .arg(repo(policy))
        .arg(repo(&format!("{dir}/namespaces/{namespace}.yaml")))
        .arg(configmap.map_or("-".into(), |c| repo(&format!("{dir}/configmaps/{c}.yaml"))))
        .args(pods.iter().map(|p| repo(&format!("{dir}/pods/{p}.yaml"))));
    let what = format!("carrying out {policy} in {namespace} with {configmap:?}");
    let text = output(cmd, &what);
    let admitted: Vec<Admitted> = text.split("=== ").skip(1).map(parse).collect();
    assert_eq!(admitted.len(), pods.len(), "{what}: {text}");
    admitted
}

fn parse(block: &str) -> Admitted {
    let (head, pod) = block.split_once("\n---\n").expect("a header, then the pod");
    let mut said = head.lines().skip(1).peekable();
    let changed = said.next() == Some("changed: true");
    let qos = said.next().and_then(|l| l.strip_prefix("qos: ")).expect("the QoS class").to_string();
    let mut ignored = None;
    let mut refused = Vec::new();
    for line in said {
        if let Some(why) = line.strip_prefix("refused: ") {
            refused.push(why.to_string());
        } else if let Some(error) = line.strip_prefix("ignored: ") {
            ignored = Some(error.to_string());
        } else if let Some(error) = &mut ignored {
            // An error's later lines (CEL's caret lines).
            error.push('\n');
            error.push_str(line);
        }
    }
    Admitted { changed, qos, ignored, refused, pod: pod.trim().to_string() }
}

fn admit(form: Form, namespace: &str, configmap: Option<&str>, pod: &str) -> Admitted {
    admit_all(form.file(), namespace, configmap, &[pod]).remove(0)
}

/// The preStop command a container gets, as kubectl's jsonpath prints it.
fn hold(preset: &str, deadline: u64, probes: &str, ignore: Option<&str>) -> String {
    let deadline = format!("{deadline}s");
    let mut args = vec!["/envoy-drain/envoy-drain", "hold", "--preset", preset];
    args.extend(["--deadline", &deadline, "--probe-periods", probes]);
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

fn of(container: &str, field: &str) -> String {
    format!("{{.spec.containers[?(@.name==\"{container}\")].{field}}}")
}

#[test]
#[ignore = "needs kubectl, cel-expr-python and jsonpatch (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn both_forms_make_the_same_pod_of_every_pod_in_every_namespace_and_never_fail() {
    let configmaps = [Some("image"), Some("labelled"), Some("no-image"), None];
    let cases: Vec<(&str, Option<&str>)> =
        NAMESPACES.iter().flat_map(|n| configmaps.iter().map(move |c| (*n, *c))).collect();
    // Two workers: each case runs Python twice.
    std::thread::scope(|s| {
        for half in cases.chunks(cases.len().div_ceil(2)) {
            s.spawn(move || {
                for &(namespace, configmap) in half {
                    let of = |form: Form| admit_all(form.file(), namespace, configmap, &PODS);
                    let (map, kyverno) = (of(Form::AdmissionPolicy), of(Form::Kyverno));
                    for ((pod, map), kyverno) in PODS.iter().zip(&map).zip(&kyverno) {
                        let what = format!("{pod} in {namespace} with {configmap:?}");
                        assert_eq!(map, kyverno, "{what}");
                        assert_eq!(map.ignored, None, "{what}: the policy failed");
                    }
                }
            });
        }
    });
}

#[test]
#[ignore = "needs kubectl, cel-expr-python, jsonpatch and kubernetes-validate (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn each_container_without_a_prestop_gets_the_hold_of_its_namespace_and_a_deadline_from_its_grace() {
    for (namespace, preset, ignore) in [
        ("ambient", "ambient", Some("15001,15053")),
        ("ambient-injection-off", "ambient", Some("15001,15053")),
        ("no-mesh", "none", None),
    ] {
        // (pod, container, the deadline: 10 s less than the grace period, or half of a short
        // one, the readiness probes' periods)
        for (pod, container, deadline, probes) in [
            ("web", "productpage", 20, "5s"),
            ("two-containers", "orders", 50, "none"),
            ("short-grace", "ratings", 7, "none"),
        ] {
            let what = format!("{pod} in {namespace}");
            let got = admit(Form::AdmissionPolicy, namespace, Some("image"), pod);
            assert!(got.changed && got.refused.is_empty(), "{what}: {got:?}");
            validate(&got.pod);
            let f = fields(
                &got.pod,
                &[
                    of(container, "lifecycle.preStop.exec.command"),
                    of(container, "volumeMounts[?(@.name==\"envoy-drain\")].readOnly"),
                    "{.spec.initContainers[?(@.name==\"envoy-drain-install\")].image}".to_string(),
                    "{.spec.volumes[?(@.name==\"envoy-drain\")].emptyDir.sizeLimit}".to_string(),
                    of(
                        container,
                        "env[?(@.name==\"ENVOY_DRAIN_NODE_IPS\")].valueFrom.fieldRef.fieldPath",
                    ),
                ],
            );
            assert_eq!(f[0], hold(preset, deadline, probes, ignore), "{what}");
            assert_eq!(f[1], "true", "{what}: the binary, read-only");
            assert_eq!(
                f[2], "registry.example.com/envoy-drain:0.1.0",
                "{what}: the ConfigMap's image"
            );
            assert_eq!(f[3], "4Mi", "{what}");
            // Without a mesh the kubelet probes from the node, whose addresses the downward API
            // gives; in ambient mode istio-cni sends them from 169.254.7.127, which hold knows.
            let node = if preset == "none" { "status.hostIPs" } else { "" };
            assert_eq!(f[4], node, "{what}");
        }
        // What the pod had stays: the shipper's own preStop, the app's postStart, the first
        // init container, the web app's volume and probes.
        let two = admit(Form::AdmissionPolicy, namespace, Some("image"), "two-containers").pod;
        let f = fields(
            &two,
            &[
                of("shipper", "lifecycle.preStop.exec.command"),
                of("shipper", "volumeMounts"),
                of("orders", "lifecycle.postStart.exec.command"),
                "{.spec.initContainers[*].name}".into(),
            ],
        );
        assert_eq!(f[0], r#"["/fluent-bit/bin/flush"]"#, "{namespace}");
        assert_eq!(f[1], "", "{namespace}: the shipper gets nothing");
        assert_eq!(f[2], r#"["/bin/warm-cache"]"#, "{namespace}");
        assert_eq!(f[3], "migrate envoy-drain-install", "{namespace}: ours after the pod's own");
        let web = admit(Form::AdmissionPolicy, namespace, Some("image"), "web").pod;
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
#[ignore = "needs kubectl, cel-expr-python and jsonpatch (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn the_readiness_probes_the_kubelet_keeps_sending_and_the_ports_the_pod_names_reach_the_command() {
    // Readiness probes of the containers and of the native sidecar (1 s, the default 10 s, 3 s)
    // and the sidecar's liveness probe (2 s); not the containers' liveness probes (the kubelet
    // stops those before the preStop). The port named for metrics and the annotation's port are
    // left out, after ztunnel's own in ambient mode.
    for (namespace, preset, ignore) in
        [("ambient", "ambient", "15001,15053,9091,9090"), ("no-mesh", "none", "9091,9090")]
    {
        let got = admit(Form::AdmissionPolicy, namespace, Some("image"), "probes");
        let f = fields(&got.pod, &[of("catalog", "lifecycle.preStop.exec.command")]);
        assert_eq!(f[0], hold(preset, 20, "1s,10s,3s,2s", Some(ignore)), "{namespace}");
        // An annotation that is not a list of ports is left out, never passed to exit 2.
        let got = admit(Form::AdmissionPolicy, namespace, Some("image"), "bad-annotation");
        let f = fields(&got.pod, &[of("cart", "lifecycle.preStop.exec.command")]);
        let ignore = (preset == "ambient").then_some("15001,15053");
        assert_eq!(f[0], hold(preset, 20, "none", ignore), "{namespace}");
    }
}

#[test]
#[ignore = "needs kubectl, cel-expr-python and jsonpatch (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn nothing_changes_until_the_configmap_names_the_image_and_a_trial_reaches_labelled_namespaces_only()
 {
    for form in [Form::AdmissionPolicy, Form::Kyverno] {
        for namespace in ["ambient", "no-mesh", "ambient-trial"] {
            for configmap in [None, Some("no-image")] {
                let got = admit(form, namespace, configmap, "web");
                assert!(
                    !got.changed && got.ignored.is_none(),
                    "{form:?} {namespace} {configmap:?}"
                );
            }
        }
        // ambientNamespaces: labelled: an ambient namespace only when it asks; without a mesh
        // as ever.
        for (namespace, changed) in [("ambient", false), ("ambient-trial", true), ("no-mesh", true)]
        {
            let got = admit(form, namespace, Some("labelled"), "web");
            assert_eq!(got.changed, changed, "{form:?} {namespace}");
        }
    }
}

#[test]
#[ignore = "needs kubectl, cel-expr-python and jsonpatch (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn pods_that_opt_out_or_that_it_cannot_serve_and_other_namespaces_are_left_alone() {
    for namespace in ["ambient", "no-mesh"] {
        for got in admit_all(Form::AdmissionPolicy.file(), namespace, Some("image"), LEFT_ALONE) {
            assert!(!got.changed && got.ignored.is_none(), "{namespace}: {got:?}");
        }
    }
    // Namespaces that did not ask or opted out, one with sidecars (the sidecar's template holds
    // there), one whose revision label may give its pods sidecars.
    for namespace in ["ambient-opted-out", "plain", "sidecar", "revision"] {
        for (pod, got) in PODS.iter().zip(admit_all(
            Form::AdmissionPolicy.file(),
            namespace,
            Some("image"),
            &PODS,
        )) {
            assert!(!got.changed, "{pod} in {namespace}");
        }
    }
}

#[test]
#[ignore = "needs kubectl, cel-expr-python and jsonpatch (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn the_pods_it_makes_pass_the_restricted_level_and_a_quota_and_stay_guaranteed() {
    // A pod written for the restricted level, in a namespace that enforces it, and one with a
    // ResourceQuota on cpu and memory: admitted before, admitted after.
    for namespace in ["restricted", "quota"] {
        let before = admit_all("examples/hold-policy.yaml", namespace, None, &["guaranteed"]);
        let after = admit(Form::AdmissionPolicy, namespace, Some("image"), "guaranteed");
        assert!(before[0].refused.is_empty(), "{namespace}: the fixture {:?}", before[0].refused);
        assert!(after.changed && after.refused.is_empty(), "{namespace}: {after:?}");
        assert_eq!((&*before[0].qos, &*after.qos), ("Guaranteed", "Guaranteed"), "{namespace}");
    }
    // In the restricted namespace whatever the pod's own state, our init container is never a
    // reason to refuse it; a pod that runs as root keeps ours as 65532, which then starts.
    for (pod, got) in
        PODS.iter().zip(admit_all(Form::AdmissionPolicy.file(), "restricted", Some("image"), &PODS))
    {
        let ours = got.changed && got.refused.iter().any(|w| w.contains("envoy-drain"));
        assert!(!ours, "{pod}: {:?}", got.refused);
    }
    let root = admit(Form::AdmissionPolicy, "ambient", Some("image"), "root");
    let f = fields(
        &root.pod,
        &["{.spec.initContainers[0].securityContext.runAsUser} {.spec.initContainers[0].securityContext.runAsGroup} {.spec.initContainers[0].securityContext.runAsNonRoot}".into()],
    );
    assert_eq!(f[0], "65532 65532 true");
}

#[test]
#[ignore = "needs kubectl, cel-expr-python and jsonpatch (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn the_stand_in_refuses_what_the_api_server_refuses_and_merges_by_key_what_it_merges() {
    // The way the policies wrote the hook before: an apply configuration that sets atomic
    // lists. The API server refuses it; failurePolicy Ignore leaves the pod without the hook.
    let dir = "tests/inject/policy/policies";
    let got = admit_all(&format!("{dir}/atomic.yaml"), "plain", None, &["web"]).remove(0);
    assert!(!got.changed, "{got:?}");
    assert_eq!(
        got.ignored.as_deref(),
        Some(
            "invalid ApplyConfiguration: may not mutate atomic arrays, maps or structs: \
             .spec.containers[0].lifecycle.preStop.exec.command, .spec.initContainers[0].args"
        )
    );
    // Nothing atomic: merged by key, the pod's own items first, in their order.
    let got = admit_all(&format!("{dir}/granular.yaml"), "plain", None, &["web"]).remove(0);
    assert!(got.changed && got.ignored.is_none(), "{got:?}");
    let f = fields(
        &got.pod,
        &[
            "{.spec.volumes[*].name}".into(),
            "{.spec.containers[0].volumeMounts[*].mountPath}".into(),
        ],
    );
    assert_eq!(f, ["tmp cache", "/tmp /cache"]);
    // A field the schema does not have: the type check says so.
    let got = admit_all(&format!("{dir}/typo.yaml"), "plain", None, &["web"]).remove(0);
    let error = got.ignored.unwrap_or_default();
    assert!(error.contains("undefined field 'emptyDirr'"), "{error}");
}

#[test]
#[ignore = "needs kubectl, cel-expr-python and jsonpatch (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn consuls_policy_gives_the_injected_dataplane_its_prestop_and_leaves_other_pods_alone() {
    let consul = "examples/consul.yaml";
    let got = admit_all(consul, "plain", None, &["consul-injected", "web"]);
    assert!(got[0].changed && got[0].ignored.is_none(), "{:?}", got[0]);
    let f = fields(
        &got[0].pod,
        &[of("consul-dataplane", "lifecycle.preStop.exec.command"), of("reviews", "lifecycle")],
    );
    let command = ["/envoy-drain/envoy-drain", "run", "--preset=consul", "--deadline=30s"];
    let command = format!(
        "[{},{}]",
        command.map(json_string).join(","),
        json_string("--log-file=/proc/1/fd/1")
    );
    assert_eq!(f, [command, String::new()]);
    assert!(!got[1].changed && got[1].ignored.is_none(), "{:?}", got[1]);
}

#[test]
#[ignore = "needs kubectl, cel-expr-python and jsonpatch (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn the_stand_in_refuses_the_cel_the_api_server_and_kyverno_refuse() {
    // A list literal mixing a string and a value of the (dynamic) pod; Kyverno's resource
    // library's Any-typed results iterated; namespaceObject in a Kyverno 1.17 variable.
    let dir = "tests/inject/policy/policies";
    for (policy, error) in [
        ("mixed", "elements of more than one type in list literal"),
        ("kyverno-any", "google.protobuf.Any as a comprehension's range"),
        ("kyverno-namespace", "undeclared reference to 'namespaceObject"),
    ] {
        let got = admit_all(&format!("{dir}/{policy}.yaml"), "plain", None, &["web"]).remove(0);
        assert!(!got.changed, "{policy}: {got:?}");
        let said = got.ignored.unwrap_or_default();
        assert!(said.contains(error), "{policy}: {said}");
    }
}
