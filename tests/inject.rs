//! The Istio injection templates of examples/istio-template*-values.yaml, rendered from their own
//! text by Go's text/template as istiod renders them (tests/inject/render.go), and merged over
//! injected pods the way istiod applies a template: a strategic merge patch, here Kubernetes' own
//! code through `kubectl patch --local --type strategic`. The pods (tests/inject/pods/) are
//! reduced from the shapes of Istio's injected goldens, each file naming the one it follows; the
//! last test runs the same checks on Istio's goldens themselves (../shared/istio-goldens, or a
//! directory given in ENVOY_DRAIN_ISTIO_GOLDENS), split into pods by tests/inject/goldens.py.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Runs a command that must succeed; a missing tool fails the test naming it.
fn output(mut cmd: Command, what: &str) -> String {
    let shown = format!("{cmd:?}");
    let out = cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| {
        panic!(
            "NOT RUN: {what} ({shown}): {e}; `bash scripts/test-tools` installs Go and the \
             validation tools, kubectl comes with the machine"
        )
    });
    assert!(
        out.status.success(),
        "{what} failed: {shown}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("text")
}

/// A directory of the test process's own, removed at exit of each test through `Scratch`.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!(
            "envoy-drain-inject-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The renderer, built once.
fn renderer() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = repo("target/inject-render");
        let mut go = Command::new("go");
        go.arg("build")
            .arg("-o")
            .arg(&bin)
            .arg(repo("tests/inject/render.go"));
        output(go, "building the template renderer with Go");
        bin
    })
}

/// The text of the `envoy-drain` template in a Helm values file: the block under
/// `envoy-drain: |`, unindented.
fn template(values: &str) -> String {
    let text = std::fs::read_to_string(repo(values)).unwrap();
    let mut lines = text.lines().skip_while(|l| l.trim() != "envoy-drain: |");
    let key = lines.next().expect("an envoy-drain template");
    let key_indent = key.len() - key.trim_start().len();
    let body: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > key_indent)
        .collect();
    let indent = body
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    body.iter()
        .map(|l| format!("{}\n", l.get(indent..).unwrap_or_default()))
        .collect()
}

/// What istiod gives a template: the pod's annotations, the mesh's native-sidecar flag, values.
fn render(template: &str, native_flag: bool, annotations: &[(String, String)]) -> String {
    let scratch = Scratch::new("render");
    let file = scratch.write("template", template);
    let json = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let annotations: Vec<String> = annotations
        .iter()
        .map(|(k, v)| format!("{}:{}", json(k), json(v)))
        .collect();
    let context = format!(
        r#"{{"ObjectMeta":{{"Annotations":{{{}}}}},"NativeSidecars":{native_flag},"Values":{{"global":{{"proxy":{{"statusPort":15020}}}}}}}}"#,
        annotations.join(",")
    );
    let mut cmd = Command::new(renderer());
    cmd.arg(&file).arg(context);
    output(cmd, "rendering the template")
}

fn kubectl() -> Command {
    let mut c = Command::new("kubectl");
    // Offline: no kubeconfig, no server is asked anything.
    c.env("KUBECONFIG", "/dev/null");
    c
}

/// Applies `patch` to `pod` (YAML) as a strategic merge patch; the merged pod as YAML.
fn merge(pod: &str, patch: &str) -> String {
    let scratch = Scratch::new("merge");
    let pod = scratch.write("pod.yaml", pod);
    let patch = scratch.write("patch.yaml", patch);
    let mut cmd = kubectl();
    cmd.args([
        "patch",
        "--local",
        "--type",
        "strategic",
        "-o",
        "yaml",
        "-f",
    ])
    .arg(&pod)
    .arg("--patch-file")
    .arg(&patch);
    output(cmd, "kubectl patch --local --type strategic")
}

/// A JSONPath query on a pod (YAML), with kubectl's own evaluator.
fn query(pod: &str, path: &str) -> String {
    let scratch = Scratch::new("query");
    let pod = scratch.write("pod.yaml", pod);
    let mut cmd = kubectl();
    cmd.args(["patch", "--local", "--type", "merge", "-p", "{}", "-f"])
        .arg(&pod)
        .arg("-o")
        .arg(format!("jsonpath={path}"));
    output(cmd, "kubectl's jsonpath")
}

/// Validates a pod strictly against Kubernetes 1.33's schemas.
fn validate(pod: &str) {
    let python = repo("target/tools-venv/bin/python");
    let scratch = Scratch::new("validate");
    let file = scratch.write("pod.yaml", pod);
    let mut cmd = Command::new(python);
    cmd.arg("-c")
        .arg(
            "import sys, yaml, kubernetes_validate\n\
             kubernetes_validate.validate(yaml.safe_load(open(sys.argv[1])), '1.33.0', strict=True)",
        )
        .arg(&file);
    output(cmd, "kubernetes-validate on the merged pod");
}

/// The pod's annotations that decide the template's outcome.
fn deciding_annotations(pod: &str) -> Vec<(String, String)> {
    [
        "sidecar.istio.io/nativeSidecar",
        "status.sidecar.istio.io/port",
    ]
    .iter()
    .filter_map(|k| {
        let v = query(
            pod,
            &format!("{{.metadata.annotations['{}']}}", k.replace('.', "\\.")),
        );
        (!v.is_empty()).then(|| (k.to_string(), v))
    })
    .collect()
}

/// Where istio-proxy is, and what each of its hooks is, as JSON text.
struct Proxy {
    in_init: bool,
    pre_stop: String,
    post_start: String,
    mounts: String,
}

fn proxy(pod: &str) -> Proxy {
    let names = |list: &str| query(pod, &format!("{{.spec.{list}[*].name}}"));
    let count = |list: &str| {
        names(list)
            .split_whitespace()
            .filter(|n| *n == "istio-proxy")
            .count()
    };
    let (inits, containers) = (count("initContainers"), count("containers"));
    assert_eq!(
        inits + containers,
        1,
        "exactly one istio-proxy: init containers {:?}, containers {:?}",
        names("initContainers"),
        names("containers")
    );
    let list = if inits == 1 {
        "initContainers"
    } else {
        "containers"
    };
    let of = |field: &str| {
        query(
            pod,
            &format!("{{.spec.{list}[?(@.name==\"istio-proxy\")].{field}}}"),
        )
    };
    Proxy {
        in_init: inits == 1,
        pre_stop: of("lifecycle.preStop.exec.command"),
        post_start: of("lifecycle.postStart"),
        mounts: of("volumeMounts"),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    /// An emptyDir filled by the install init container.
    Install,
    /// The envoy-drain image mounted as a volume.
    Image,
}

impl Variant {
    fn values(self) -> &'static str {
        match self {
            Variant::Install => "examples/istio-template-values.yaml",
            Variant::Image => "examples/istio-template-image-values.yaml",
        }
    }
}

/// Renders the template for `pod` (an injected pod, YAML) as istiod would with the mesh's
/// `native_flag`, merges it, and checks what a user relies on; returns the merged pod.
fn check(pod: &str, native_flag: bool, variant: Variant) -> String {
    let before = proxy(pod);
    let patch = render(
        &template(variant.values()),
        native_flag,
        &deciding_annotations(pod),
    );
    let merged = merge(pod, &patch);
    let after = proxy(&merged);
    assert_eq!(
        after.in_init, before.in_init,
        "istio-proxy stays where Istio put it\n{merged}"
    );
    let mut want = vec!["/envoy-drain/envoy-drain", "run"];
    // Native: the agent drains, and stops the proxy at once on the SIGTERM that follows the
    // app's exit. Classic: the hook asks the agent to stop the proxy once the app has exited.
    // Neither where the pod turns the agent's status server off (port 0).
    let port = deciding_annotations(pod)
        .into_iter()
        .find(|(k, _)| k == "status.sidecar.istio.io/port")
        .map_or("15020".to_string(), |(_, v)| v);
    let agent = format!("--agent=127.0.0.1:{port}");
    if port != "0" {
        want.push(if after.in_init {
            "--drain=agent"
        } else {
            "--then-quit"
        });
        want.push(&agent);
    }
    want.push("--log-file=/proc/1/fd/1");
    // The binary takes the hook's arguments as written: with `--help` after them it prints its
    // help, and refuses an argument it does not know (as it once did `--drain=agent`).
    let parsed = Command::new(env!("CARGO_BIN_EXE_envoy-drain"))
        .args(&want[1..])
        .arg("--help")
        .output()
        .expect("the binary runs");
    assert!(
        parsed.status.success(),
        "envoy-drain takes {want:?}: {}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    let want = format!(
        "[{}]",
        want.iter()
            .map(|w| format!("\"{w}\""))
            .collect::<Vec<_>>()
            .join(",")
    );
    assert_eq!(after.pre_stop, want, "our preStop\n{merged}");
    assert_eq!(
        after.post_start, before.post_start,
        "Istio's postStart is kept\n{merged}"
    );
    assert!(
        after
            .mounts
            .contains(r#"{"mountPath":"/envoy-drain","name":"envoy-drain","readOnly":true}"#),
        "istio-proxy mounts the binary read-only: {}\n{merged}",
        after.mounts
    );
    let volume = query(&merged, "{.spec.volumes[?(@.name==\"envoy-drain\")]}");
    let install = query(
        &merged,
        "{.spec.initContainers[?(@.name==\"envoy-drain-install\")]}",
    );
    match variant {
        Variant::Install => {
            assert!(volume.contains("emptyDir"), "{volume}\n{merged}");
            assert!(
                install.contains(r#""image":"envoy-drain:0.1.0""#)
                    && install.contains(r#""mountPath":"/envoy-drain""#),
                "the install init container fills the volume: {install}\n{merged}"
            );
        }
        Variant::Image => {
            assert!(
                volume.contains(r#""reference":"envoy-drain:0.1.0""#),
                "{volume}\n{merged}"
            );
            assert!(install.is_empty(), "no init container: {install}\n{merged}");
        }
    }
    no_stub(&merged);
    assert_eq!(
        merge(&merged, &patch),
        merged,
        "applying it twice changes nothing"
    );
    validate(&merged);
    merged
}

/// Every container has an image: a patch aimed at the wrong list leaves an istio-proxy without
/// one (istio/istio #56455).
fn no_stub(pod: &str) {
    for list in ["initContainers", "containers"] {
        let rows = query(
            pod,
            &format!("{{range .spec.{list}[*]}}{{.name}}={{.image}}{{\"\\n\"}}{{end}}"),
        );
        for row in rows.lines() {
            assert!(
                !row.ends_with('='),
                "{list} holds a container without an image: {row}\n{pod}"
            );
        }
    }
}

/// A fixture and the mesh's native-sidecar flag when Istio injected it (its first line).
fn fixture(name: &str) -> (String, bool) {
    let text = std::fs::read_to_string(repo(&format!("tests/inject/pods/{name}"))).unwrap();
    let native = match text.lines().next() {
        Some("# NativeSidecars: true") => true,
        Some("# NativeSidecars: false") => false,
        other => panic!("{name} must start with '# NativeSidecars: <bool>', not {other:?}"),
    };
    (text, native)
}

#[test]
#[ignore = "needs Go, kubectl and kubernetes-validate (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn both_templates_merge_into_every_injected_pod_without_losing_istios_hooks() {
    for (name, placed_in_init) in [
        ("classic.yaml", false),
        ("classic-hold.yaml", false),
        ("native.yaml", true),
        ("native-hold.yaml", true),
        ("opt-out.yaml", false),
    ] {
        let (pod, flag) = fixture(name);
        for variant in [Variant::Install, Variant::Image] {
            let merged = check(&pod, flag, variant);
            assert_eq!(proxy(&merged).in_init, placed_in_init, "{name} {variant:?}");
        }
    }
}

#[test]
#[ignore = "needs Go, kubectl and kubernetes-validate (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn the_native_sidecars_own_prestop_is_replaced_and_the_holds_poststart_kept() {
    let (native, flag) = fixture("native-hold.yaml");
    let before = proxy(&native);
    assert!(
        before.pre_stop.contains("pilot-agent"),
        "{}",
        before.pre_stop
    );
    let merged = check(&native, flag, Variant::Install);
    let after = proxy(&merged);
    assert!(
        !after.pre_stop.contains("pilot-agent"),
        "{}",
        after.pre_stop
    );
    assert!(
        after.post_start.contains(r#"["pilot-agent","wait"]"#),
        "{}",
        after.post_start
    );
}

#[test]
#[ignore = "needs Go, kubectl and kubernetes-validate (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn the_one_decision_follows_istios_flag_unless_the_pods_annotation_says_otherwise() {
    for variant in [Variant::Install, Variant::Image] {
        let text = template(variant.values());
        // Where the rendered patch puts istio-proxy, and whether it drains through the agent.
        let outcome = |flag: bool, annotation: Option<&str>| {
            let annotations: Vec<(String, String)> = annotation
                .map(|v| ("sidecar.istio.io/nativeSidecar".to_string(), v.to_string()))
                .into_iter()
                .collect();
            let patch = render(&text, flag, &annotations);
            let as_pod = format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: patch\n{patch}");
            let inits = query(&as_pod, "{.spec.initContainers[*].name}");
            let containers = query(&as_pod, "{.spec.containers[*].name}");
            let list = match (
                inits.contains("istio-proxy"),
                containers.contains("istio-proxy"),
            ) {
                (true, false) => "initContainers",
                (false, true) => "containers",
                _ => panic!("istio-proxy once: {inits:?} {containers:?}\n{patch}"),
            };
            (list, patch.contains("--drain=agent"))
        };
        assert_eq!(outcome(false, None), ("containers", false), "{variant:?}");
        assert_eq!(outcome(true, None), ("initContainers", true), "{variant:?}");
        assert_eq!(
            outcome(true, Some("false")),
            ("containers", false),
            "{variant:?}"
        );
        assert_eq!(
            outcome(false, Some("true")),
            ("initContainers", true),
            "{variant:?}"
        );
    }
}

#[test]
#[ignore = "needs Go, kubectl and kubernetes-validate (`bash scripts/test-tools`): `bash scripts/test` runs it"]
fn aiming_the_classic_patch_at_a_native_pod_leaves_a_stub_the_checks_catch() {
    // Why the decision exists: with native sidecars, a patch for containers[name=istio-proxy]
    // adds a second, image-less istio-proxy (istio/istio #56455).
    let (native, _) = fixture("native.yaml");
    let classic_patch = render(&template(Variant::Install.values()), false, &[]);
    let merged = merge(&native, &classic_patch);
    let caught = std::panic::catch_unwind(|| no_stub(&merged));
    assert!(
        caught.is_err(),
        "a stub istio-proxy must be caught:\n{merged}"
    );
}

/// Istio's injected goldens: ENVOY_DRAIN_ISTIO_GOLDENS, else `../shared/istio-goldens` beside the
/// repository (its README: every `*.yaml.injected` of istio/istio at a pinned commit).
fn goldens() -> PathBuf {
    let dir = std::env::var_os("ENVOY_DRAIN_ISTIO_GOLDENS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo("../shared/istio-goldens"));
    assert!(
        dir.is_dir(),
        "NOT RUN: Istio's injected goldens are not at {} (set ENVOY_DRAIN_ISTIO_GOLDENS to a \
         directory of istio/istio's pkg/kube/inject/testdata/inject/*.injected)",
        dir.display()
    );
    dir
}

#[test]
#[ignore = "needs Go, kubectl, kubernetes-validate (`bash scripts/test-tools`) and Istio's goldens in \
            ../shared/istio-goldens: `bash scripts/test` runs it"]
fn both_templates_merge_into_istios_own_injected_goldens() {
    let dir = goldens();
    let mut cmd = Command::new(repo("target/tools-venv/bin/python"));
    cmd.arg(repo("tests/inject/goldens.py")).arg(&dir);
    let listed = output(cmd, "splitting the goldens into pods");
    let pods: Vec<(&str, &str)> = listed
        .lines()
        .map(|l| l.split_once('\t').expect("golden, tab, pod"))
        .collect();
    // Istio's own output already holds an image-less istio-proxy beside the real one where a
    // custom template patched the wrong list (istio/istio #56455): there is nothing to check
    // "exactly one istio-proxy" against.
    let names = |pod: &str| {
        query(
            pod,
            "{.spec.initContainers[*].name} {.spec.containers[*].name}",
        )
    };
    let (stubbed, pods): (Vec<_>, Vec<_>) = pods.into_iter().partition(|(_, pod)| {
        names(pod)
            .split_whitespace()
            .filter(|n| *n == "istio-proxy")
            .count()
            > 1
    });
    let stubbed: Vec<&str> = stubbed.iter().map(|(g, _)| *g).collect();
    assert_eq!(
        stubbed,
        ["sidecar-spire.yaml.injected"],
        "Istio's own stubs"
    );
    // Two workers: each check runs kubectl and a validator a dozen times.
    let failed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for half in pods.chunks(pods.len().div_ceil(2)) {
            let failed = &failed;
            s.spawn(move || {
                for (golden, pod) in half {
                    let checked = std::panic::catch_unwind(|| {
                        // Istio's flag when it injected the golden: istio-proxy is an init
                        // container unless the pod opted out.
                        let flag = proxy(pod).in_init
                            || deciding_annotations(pod)
                                .iter()
                                .any(|(k, v)| k.ends_with("nativeSidecar") && v == "false");
                        for variant in [Variant::Install, Variant::Image] {
                            check(pod, flag, variant);
                        }
                    });
                    if checked.is_err() {
                        failed.lock().unwrap().push(*golden);
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap();
    assert!(
        failed.is_empty(),
        "goldens that failed their checks: {failed:?}"
    );
    let goldens: std::collections::BTreeSet<&str> = pods.iter().map(|(g, _)| *g).collect();
    eprintln!(
        "merged both templates into {} pods of {} goldens with an istio-proxy",
        pods.len(),
        goldens.len()
    );
    assert!(
        goldens.len() >= 100,
        "Istio's goldens hold over 100 injected workloads; {} found in {}",
        goldens.len(),
        dir.display()
    );
}
