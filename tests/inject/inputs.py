# The workloads of Istio's injection tests as pods, for tests/inject.rs: for each injected golden
# (../shared/istio-goldens/X.injected), the workload Istio's test injected to make it
# (pkg/kube/inject/testdata/inject/X of the same module, which scripts/components copies, or the
# `in:` its inject_test.go pairs with that `want:`). One line
# per pod whose golden has an istio-proxy: "<golden>\t<native|classic>\t<the pod as JSON>", native
# where Istio's test made the proxy an init container. A file may hold several documents, a List,
# or a workload whose pod is its template (a CronJob's: its job's). The pod keeps its template's
# metadata but for the namespace (the test's own) and its name (the test names it).
# Usage: inputs.py GOLDENS_DIR INPUTS_DIR
import json, os, re, sys, yaml

def pods(doc):
    if not isinstance(doc, dict):
        return
    kind = doc.get("kind")
    if kind == "List":
        for item in doc.get("items") or []:
            yield from pods(item)
        return
    if kind == "Pod":
        yield doc
        return
    spec = doc.get("spec") or {}
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    template = spec.get("template")
    if isinstance(template, dict):
        yield {"apiVersion": "v1", "kind": "Pod", **template}

def proxy_in_init(pod):
    spec = pod.get("spec") or {}
    names = lambda key: [c.get("name") for c in spec.get(key) or []]
    if "istio-proxy" in names("initContainers"):
        return True
    if "istio-proxy" in names("containers"):
        return False
    return None

def load(path):
    with open(path) as f:
        return [p for doc in yaml.safe_load_all(f) for p in pods(doc)]

goldens, inputs = sys.argv[1], sys.argv[2]
with open(os.path.join(inputs, "inject_test.go")) as f:
    paired = {want: source for source, want in re.findall(r'in:\s*"([^"]+)",\s*want:\s*"([^"]+)"', f.read())}
for golden in sorted(os.listdir(goldens)):
    if not golden.endswith(".injected"):
        continue
    source = os.path.join(inputs, paired.get(golden, golden[: -len(".injected")]))
    if not os.path.exists(source):
        print(f"{golden}\tmissing\t")
        continue
    for made, pod in zip(load(os.path.join(goldens, golden)), load(source)):
        native = proxy_in_init(made)
        if native is None:
            continue
        meta = {k: v for k, v in (pod.get("metadata") or {}).items() if k not in ("namespace", "name", "creationTimestamp")}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "case", **meta}, "spec": pod.get("spec") or {}}
        print(f"{golden}\t{'native' if native else 'classic'}\t{json.dumps(pod)}")
