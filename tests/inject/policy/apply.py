"""What an admission policy of examples/ asks of a new pod (tests/inject/policy.rs), as JSON on
stdout: strategic-merge patches, one per line, applied in order by the test with `kubectl patch
--local`.

  apply.py POLICY_FILE NAMESPACE_FILE POD_FILE

The policy is a MutatingAdmissionPolicy and its bindings, or Kyverno's MutatingPolicy (the same
fields, its selectors in matchConstraints). Its CEL (matchConditions, variables, the
ApplyConfiguration expression) is evaluated by cel-python (PyPI cel-python), a CEL implementation,
with the variables the API server gives (object, namespaceObject, request, variables). The
selectors and the apply configuration's merge are the API server's: here the selectors are
matched as Kubernetes defines label selectors, and the merge is left to kubectl's strategic merge,
which merges containers, volumes and mounts by the same keys as server-side apply (where it puts
a new item in a list may differ). cel-python does not resolve a qualified type name
(Object.spec.containers) inside a macro, so each is renamed to one identifier before compiling: a
renaming of type names, not of anything the expression computes.
"""

import json
import re
import sys

import celpy
import yaml
from celpy import celtypes


def selected(selector, labels):
    """Kubernetes' label selector: matchLabels and matchExpressions."""
    if selector is None:
        return True
    labels = labels or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def plain(value):
    """A CEL value as JSON."""
    if isinstance(value, (celtypes.MapType, dict)):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (celtypes.ListType, list)):
        return [plain(v) for v in value]
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.IntType):
        return int(value)
    if isinstance(value, str):
        return str(value)
    raise TypeError(f"not JSON: {value!r}")


def cel(expression, activation):
    types = {}

    def rename(match):
        name = "T_" + match.group(1).replace(".", "_")
        types[name] = type(name, (celtypes.MapType,), {})
        return name + "{"

    source = re.sub(r"\b(Object(?:\.[A-Za-z]+)*)\s*\{", rename, expression)
    env = celpy.Environment()
    program = env.program(env.compile(source))
    result = program.evaluate({**activation, **types})
    if isinstance(result, celpy.CELEvalError):
        raise result
    return result


def admission_policy(documents, namespace, pod):
    kinds = ("MutatingAdmissionPolicy", "MutatingPolicy")
    policy = next(d for d in documents if d["kind"] in kinds)
    # A MutatingAdmissionPolicy is selected by its bindings, Kyverno's by its own constraints.
    matches = [d["spec"]["matchResources"] for d in documents if d["kind"] == "MutatingAdmissionPolicyBinding"]
    if policy["kind"] == "MutatingPolicy":
        matches = [policy["spec"]["matchConstraints"]]
    labels = pod["metadata"].get("labels")
    if not any(
        selected(m.get("namespaceSelector"), namespace["metadata"].get("labels"))
        and selected(m.get("objectSelector"), labels)
        for m in matches
    ):
        return []
    activation = {
        "object": celpy.json_to_cel(pod),
        "namespaceObject": celpy.json_to_cel(namespace),
        "request": celpy.json_to_cel({"operation": "CREATE", "namespace": namespace["metadata"]["name"]}),
    }
    # Match conditions see the request and the object only.
    for condition in policy["spec"].get("matchConditions") or []:
        if not bool(cel(condition["expression"], {k: activation[k] for k in ("object", "request")})):
            return []
    variables = {}
    for v in policy["spec"].get("variables") or []:
        variables[v["name"]] = plain(cel(v["expression"], {**activation, "variables": celpy.json_to_cel(variables)}))
    activation["variables"] = celpy.json_to_cel(variables)
    patches = []
    for mutation in policy["spec"]["mutations"]:
        assert mutation["patchType"] == "ApplyConfiguration"
        patch = plain(cel(mutation["applyConfiguration"]["expression"], activation))
        # An empty apply configuration (`Object{}`) changes nothing.
        if patch:
            patches.append(patch)
    return patches


def main():
    policy_file, namespace_file, pod_file = sys.argv[1:4]
    documents = list(yaml.safe_load_all(open(policy_file)))
    namespace = yaml.safe_load(open(namespace_file))
    pod = yaml.safe_load(open(pod_file))
    patches = admission_policy(documents, namespace, pod)
    for patch in patches:
        print(json.dumps(patch))


if __name__ == "__main__":
    main()
