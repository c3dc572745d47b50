# What istiod passes an injection template for a pod (istio/istio pkg/kube/inject/inject.go,
# SidecarTemplateData), for tests/inject.rs: the pod's metadata and spec, the mesh's native-sidecar
# flag, and a proxy config whose terminationDrainDuration is the mesh's (its default 5s, or what
# the test gives). Reads the pod (YAML) from a file.
# Prints the context as JSON on the first line, then the pod's grace period ("grace\t<seconds>",
# empty when the pod leaves it to Kubernetes' default), then "annotation\t<name>\t<value>" for the
# annotations the templates decide on.
import json, sys, yaml

pod_file, native_flag, drain_seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open(pod_file) as f:
    pod = yaml.safe_load(f)
meta = pod.get("metadata") or {}
annotations = meta.get("annotations") or {}
spec = pod.get("spec") or {}
seconds = int(drain_seconds)
context = {
    "ObjectMeta": {"Annotations": annotations},
    "Spec": spec,
    "ProxyConfig": {"TerminationDrainDuration": {"Seconds": seconds, "Nanos": round((drain_seconds - seconds) * 1e9)}},
    "NativeSidecars": native_flag == "true",
    "Values": {"global": {"proxy": {"statusPort": 15020}}},
}
print(json.dumps(context))
grace = spec.get("terminationGracePeriodSeconds")
print("grace\t" + ("" if grace is None else str(grace)))
deciding = {"sidecar.istio.io/nativeSidecar", "status.sidecar.istio.io/port", "inject.istio.io/templates"}
for name in sorted(annotations):
    if name in deciding or name.startswith("envoy-drain.io/"):
        value = str(annotations[name])
        assert "\t" not in value and "\n" not in value, (name, value)
        print("annotation\t" + name + "\t" + value)
