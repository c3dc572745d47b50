# Istio's injected goldens as pods, for tests/inject.rs: one line per pod that has an istio-proxy,
# "<golden file>\t<the pod as JSON>". A golden may hold several documents, a List, or a workload
# whose pod is its template (a CronJob's: its job's).
import json, os, sys, yaml

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

def has_proxy(pod):
    spec = pod.get("spec") or {}
    return any(c.get("name") == "istio-proxy" for c in (spec.get("containers") or []) + (spec.get("initContainers") or []))

directory = sys.argv[1]
for name in sorted(os.listdir(directory)):
    if not name.endswith(".injected"):
        continue
    with open(os.path.join(directory, name)) as f:
        for doc in yaml.safe_load_all(f):
            for pod in pods(doc):
                if has_proxy(pod):
                    print(name + "\t" + json.dumps(pod))
