"""What a Kubernetes API server (or Kyverno) makes of a new pod under an admission policy of
examples/, for tests/inject/policy.rs. For each pod prints `=== ` and its file; `changed: true`
or `false`; `qos: ` and its QoS class; `ignored: ` and the policy's error that failurePolicy
Ignore swallowed, if any; a `refused: ` line for each reason validating admission refuses the
pod; then `---` and the pod as stored, as JSON on one line, its keys sorted.

  admit.py POLICY_FILE NAMESPACE_FILE CONFIGMAP_FILE|- POD_FILE...

NAMESPACE_FILE holds the Namespace and any ResourceQuota of it; CONFIGMAP_FILE the ConfigMap
envoy-drain/envoy-drain (`-`: there is none). No API server runs here (none reaches these machines),
so this does what its code does, step by step, against Kubernetes 1.36's own schema
(kubernetes-validate's v1.36.0-local/_definitions.json, with the x-kubernetes-* extensions):

- Matching (k8s.io/apiserver pkg/admission/plugin/policy/generic/policy_dispatcher.go): the
  policy's matchConstraints and a binding's matchResources (resource rules, namespace and object
  label selectors); params per binding by `CollectParams`: none found and parameterNotFoundAction
  Allow leaves the binding out. Kyverno's MutatingPolicy has one matchConstraints and no params.
- CEL (mutating/compilation.go): every expression is type-checked by Google's CEL (PyPI
  cel-expr-python, the C++ implementation) with `object`, `params` and `namespaceObject` typed by
  the schema, stricter than the API server, whose `object` is dynamic; then evaluated with them
  dynamic, as the API server does, object initializers (`Object.spec.containers{...}`) typed by
  the schema. Kubernetes' `indexOf` (k8s.io/apiserver pkg/cel/library/lists.go) and Kyverno's
  `resource.List` (kyverno/sdk cel/libs/resource) are given. A type name with dots is renamed to
  one identifier (`Object_spec_containers`): proto message names cannot nest a type beside a field
  of the same name; the expression is otherwise unchanged.
- JSON patches (mutating/patch/json_patch.go): RFC 6902 over the pod's JSON, by the jsonpatch
  library (PyPI); a failed `test` leaves the pod unchanged.
- Apply configurations (mutating/patch/smd.go): refused when they set anything the schema marks
  atomic (`validatePatch`/`findAtomics`), else merged as structured-merge-diff's typed Merge does
  (sigs.k8s.io/structured-merge-diff typed/merge.go, `visitListItems` for the order of list items).
- Errors with failurePolicy Ignore: the pod as it was (policy_dispatcher.go).
- Then validating admission as far as these pods need it: the pod's own validation for what the
  policies could break (unique names and mount paths, one source per volume, mounts of existing
  volumes: pkg/apis/core/validation/validation.go), Pod Security's restricted level where the
  namespace enforces it (k8s.io/pod-security-admission policy/check_*.go), and ResourceQuota's
  "must specify" (pkg/quota/v1/evaluator/core/pods.go, `enforcePodContainerConstraints`).
"""

import json
import re
import sys
from pathlib import Path

import jsonpatch
import yaml
from cel_expr_python import cel
from cel_expr_python.ext import ext_strings
from google.protobuf import (
    any_pb2, descriptor_pb2, descriptor_pool, json_format, message_factory, struct_pb2,
)

SCHEMA = "kubernetes_validate/kubernetes-json-schema/v1.36.0-local/_definitions.json"
F = descriptor_pb2.FieldDescriptorProto


def definitions():
    for path in sys.path:
        candidate = Path(path) / SCHEMA
        if candidate.exists():
            return json.loads(candidate.read_text())["$defs"]
    raise SystemExit(f"no {SCHEMA} on the path: install kubernetes-validate")


DEFS = definitions()


def deref(s):
    """A schema with its $ref resolved (the definition, with the referring schema's own keys)."""
    while "$ref" in s:
        s = {**DEFS[s["$ref"].split("/")[-1]], **{k: v for k, v in s.items() if k != "$ref"}}
    return s


def kind(s):
    t = s.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    return t


# --- Types: the schema as proto messages named by their path, as Kubernetes names its object
# initializers (Object, Object.spec, Object.spec.containers, ...).


class Types:
    def __init__(self):
        self.file = descriptor_pb2.FileDescriptorProto(
            name="k8s.proto", syntax="proto2", dependency=["google/protobuf/struct.proto"]
        )
        self.made = set()
        self.message("Object", DEFS["io.k8s.api.core.v1.Pod"])
        self.message("Params", DEFS["io.k8s.api.core.v1.ConfigMap"])
        self.message("NamespaceObject", DEFS["io.k8s.api.core.v1.Namespace"])
        patch = self.file.message_type.add(name="JSONPatch")
        for number, name in enumerate(["op", "path", "from"], start=1):
            patch.field.add(name=name, number=number, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        patch.field.add(
            name="value", number=4, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
            type_name=".google.protobuf.Value",
        )
        self.pool = descriptor_pool.DescriptorPool()
        self.variables = {}
        struct = descriptor_pb2.FileDescriptorProto()
        struct_pb2.DESCRIPTOR.CopyToProto(struct)
        self.pool.Add(struct)
        self.pool.Add(self.file)

    def message(self, name, schema):
        if name in self.made:
            return
        self.made.add(name)
        m = self.file.message_type.add(name=name)
        for number, (field, s) in enumerate(sorted((schema.get("properties") or {}).items()), 1):
            self.field(m, f"{name}_{field}", field, number, deref(s))

    def field(self, m, name, field, number, s):
        label = F.LABEL_OPTIONAL
        if kind(s) == "array":
            label, s = F.LABEL_REPEATED, deref(s.get("items") or {})
        if kind(s) == "object" and not s.get("properties") and isinstance(s.get("additionalProperties"), dict):
            entry = m.nested_type.add(name=field[0].upper() + field[1:] + "Entry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
            t, type_name = self.scalar(name, deref(s["additionalProperties"]))
            value = entry.field.add(name="value", number=2, type=t, label=F.LABEL_OPTIONAL)
            if type_name:
                value.type_name = type_name
            m.field.add(
                name=field, json_name=field, number=number, type=F.TYPE_MESSAGE,
                label=F.LABEL_REPEATED, type_name=f".{m.name}.{entry.name}",
            )
            return
        t, type_name = self.scalar(name, s)
        f = m.field.add(name=field, json_name=field, number=number, type=t, label=label)
        if type_name:
            f.type_name = type_name

    def scalar(self, name, s):
        """A proto type for a schema that is not a map: int-or-string and quantities (oneOf) are
        JSON values, as dynamic as they are to Kubernetes' CEL."""
        simple = {"string": F.TYPE_STRING, "integer": F.TYPE_INT64, "number": F.TYPE_DOUBLE,
                  "boolean": F.TYPE_BOOL}
        if kind(s) in simple:
            return simple[kind(s)], None
        if kind(s) == "object" and s.get("properties"):
            self.message(name, s)
            return F.TYPE_MESSAGE, f".{name}"
        if kind(s) == "object":
            return F.TYPE_MESSAGE, ".google.protobuf.Struct"
        return F.TYPE_MESSAGE, ".google.protobuf.Value"


TYPES = Types()


# --- CEL


def index_of(items, item):
    """Kubernetes' `<list>.indexOf(<T>)`: the first index, or -1."""
    items = list(items)
    return items.index(item) if item in items else -1


def kyverno_resource(cluster):
    """Kyverno's `resource.List(apiVersion, resource, namespace)` and `resource.Get(apiVersion,
    resource, namespace, name)` (kyverno/sdk cel/libs/resource), over the objects given; Get
    fails on a missing one as Kyverno's does."""

    def of(api_version, resource):
        assert api_version == "v1" and resource in cluster, (api_version, resource)
        return cluster[resource]

    def listed(_context, api_version, resource, namespace):
        items = [o for o in of(api_version, resource)
                 if o["metadata"].get("namespace", "") == namespace]
        return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}

    def got(_context, api_version, resource, namespace, name):
        for o in of(api_version, resource):
            if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) == (namespace, name):
                return o
        raise ValueError(f"failed to get resource: {resource} \"{name}\" not found")

    return listed, got


def environment(typed, cluster, names, variables="DYN"):
    """A CEL environment as the API server's or Kyverno's, declaring `names`: the pod, params and
    namespace typed by the schema (`typed`) or dynamic as the API server has them, `variables`
    as declared; and Kyverno's resource library over `cluster`."""
    dyn, string = cel.Type.DYN, cel.Type.STRING
    listed, got = kyverno_resource(cluster)
    k8s = cel.CelExtension("k8s", [
        cel.FunctionDecl("indexOf", [cel.Overload(
            "list_indexOf", return_type=cel.Type.INT, parameters=[cel.Type.List(dyn), dyn],
            is_member=True, impl=index_of)]),
        cel.FunctionDecl("List", [cel.Overload(
            "resource_list", return_type=dyn, parameters=[dyn, string, string, string],
            is_member=True, impl=listed)]),
        cel.FunctionDecl("Get", [cel.Overload(
            "resource_get", return_type=dyn, parameters=[dyn, string, string, string, string],
            is_member=True, impl=got)]),
    ])
    schema = {"object": "Object", "oldObject": "Object", "params": "Params",
              "namespaceObject": "NamespaceObject"}
    declared = {n: cel.Type(schema[n]) if typed and n in schema else dyn for n in names}
    declared["variables"] = dyn if variables == "DYN" else cel.Type(variables)
    return cel.NewEnv(
        descriptor_pool=TYPES.pool, variables=declared,
        extensions=[ext_strings.ExtStrings(), k8s],
    )


# The variables' types, as the API server declares each from its expression's (composition.go,
# `AddField`): as proto fields, the way CEL reads them back.
FIELDS = {
    "STRING": (F.TYPE_STRING, F.LABEL_OPTIONAL), "INT": (F.TYPE_INT64, F.LABEL_OPTIONAL),
    "BOOL": (F.TYPE_BOOL, F.LABEL_OPTIONAL), "DOUBLE": (F.TYPE_DOUBLE, F.LABEL_OPTIONAL),
    "LIST<STRING>": (F.TYPE_STRING, F.LABEL_REPEATED), "LIST<INT>": (F.TYPE_INT64, F.LABEL_REPEATED),
}


def variables_type(declared):
    """A message whose fields are the variables declared so far, each of its type (dynamic
    where no proto field says it); its name."""
    key = tuple(declared.items())
    if key in TYPES.variables:
        return TYPES.variables[key]
    name = f"Variables{len(TYPES.variables)}"
    f = descriptor_pb2.FileDescriptorProto(
        name=f"{name}.proto", syntax="proto3", dependency=["google/protobuf/struct.proto"])
    m = f.message_type.add(name=name)
    for number, (variable, returns) in enumerate(declared.items(), start=1):
        t, label = FIELDS.get(returns, (F.TYPE_MESSAGE, F.LABEL_OPTIONAL))
        field = m.field.add(name=variable, number=number, type=t, label=label)
        if t == F.TYPE_MESSAGE:
            field.type_name = ".google.protobuf.Value"
    TYPES.pool.Add(f)
    TYPES.variables[key] = name
    return name


def checked_expressions():
    """cel.expr.CheckedExpr (cel-spec proto/cel/expr/checked.proto, syntax.proto), as far as the
    aggregate literal check reads it: the expression tree and each node's type."""
    f = descriptor_pb2.FileDescriptorProto(name="cel_checked.proto", package="cel.expr", syntax="proto3")
    f.message_type.add(name="Type")
    expr = f.message_type.add(name="Expr")
    E = ".cel.expr.Expr"

    def add(m, name, number, type_name=None, repeated=False, kind=F.TYPE_MESSAGE):
        field = m.field.add(name=name, number=number, type=kind,
                            label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if type_name:
            field.type_name = type_name

    add(expr, "id", 2, kind=F.TYPE_INT64)
    select = expr.nested_type.add(name="Select")
    add(select, "operand", 1, E)
    call = expr.nested_type.add(name="Call")
    add(call, "target", 1, E)
    add(call, "function", 2, kind=F.TYPE_STRING)
    add(call, "args", 3, E, repeated=True)
    create_list = expr.nested_type.add(name="CreateList")
    add(create_list, "elements", 1, E, repeated=True)
    add(create_list, "optional_indices", 2, repeated=True, kind=F.TYPE_INT32)
    create_struct = expr.nested_type.add(name="CreateStruct")
    add(create_struct, "message_name", 1, kind=F.TYPE_STRING)
    entry = create_struct.nested_type.add(name="Entry")
    add(entry, "map_key", 3, E)
    add(entry, "value", 4, E)
    add(create_struct, "entries", 2, ".cel.expr.Expr.CreateStruct.Entry", repeated=True)
    comprehension = expr.nested_type.add(name="Comprehension")
    for name, number in [("iter_range", 2), ("accu_init", 4), ("loop_condition", 5),
                         ("loop_step", 6), ("result", 7)]:
        add(comprehension, name, number, E)
    for name, number, kind in [("select_expr", 5, "Select"), ("call_expr", 6, "Call"),
                               ("list_expr", 7, "CreateList"), ("struct_expr", 8, "CreateStruct"),
                               ("comprehension_expr", 9, "Comprehension")]:
        add(expr, name, number, f".cel.expr.Expr.{kind}")
    checked = f.message_type.add(name="CheckedExpr")
    entry = checked.nested_type.add(name="TypeMapEntry")
    entry.options.map_entry = True
    add(entry, "key", 1, kind=F.TYPE_INT64)
    add(entry, "value", 2, ".cel.expr.Type")
    add(checked, "type_map", 3, ".cel.expr.CheckedExpr.TypeMapEntry", repeated=True)
    add(checked, "expr", 4, E)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("cel.expr.CheckedExpr"))


CHECKED = checked_expressions()


DYN = b"\n\x00"  # cel.expr.Type{dyn: {}}, as the checker writes it


def go_types(checked):
    """Each node's type as cel-go's checker gives it where it differs from the C++ one, which
    binds a dynamic value to the type beside it: an index into something dynamic is dynamic,
    and a conditional is of its branches' most general type (cel-go `checker/types.go`,
    `mostGeneral`), so `c ? object.a["b"] : ""` is dyn, where the C++ checker says string."""
    types = {k: v.SerializeToString() for k, v in checked.type_map.items()}

    def of(e):
        call = e.call_expr if e.HasField("call_expr") else None
        if call and call.function == "_?_:_":
            branches = {of(call.args[1]), of(call.args[2])}
            return branches.pop() if len(branches) == 1 else DYN
        if call and call.function == "_[_]" and of(call.args[0]) == DYN:
            return DYN
        return types.get(e.id)

    return of


def literals(compiled):
    """The expression as checked, and a node's type as cel-go has it."""
    wrapper = any_pb2.Any.FromString(compiled.serialize())
    checked = CHECKED.FromString(wrapper.value)
    return checked, go_types(checked)


def mixed_literals(compiled):
    """cel-go's homogeneous aggregate literal check, which the API server's environment turns on
    (k8s.io/apiserver pkg/cel/environment/base.go, `HomogeneousAggregateLiterals`; cel-go
    `cel/validator.go`): a list or map literal whose elements are not all of one type."""
    checked, of = literals(compiled)
    found = []

    def walk(e):
        if e.HasField("list_expr"):
            if len({of(x) for x in e.list_expr.elements}) > 1:
                found.append(f"list literal {e.id}")
            for x in e.list_expr.elements:
                walk(x)
        if e.HasField("struct_expr"):
            entries = e.struct_expr.entries
            if not e.struct_expr.message_name:
                for part in ("map_key", "value"):
                    if len({of(getattr(x, part)) for x in entries}) > 1:
                        found.append(f"map literal {e.id}")
            for x in entries:
                walk(x.map_key)
                walk(x.value)
        for child in ("select_expr", "call_expr", "comprehension_expr"):
            if e.HasField(child):
                part = getattr(e, child)
                for name in ("operand", "target", "iter_range", "accu_init", "loop_condition",
                             "loop_step", "result"):
                    if name in part.DESCRIPTOR.fields_by_name and part.HasField(name):
                        walk(getattr(part, name))
                for x in getattr(part, "args", []):
                    walk(x)

    walk(checked.expr)
    return found


def kyverno_any(compiled):
    """What cel-go refuses of Kyverno's resource library, whose List and Get give
    `map(string, google.protobuf.Any)` (kyverno/sdk cel/libs/resource/lib.go): a field of the
    result is an Any, which can be neither selected from nor iterated (cel-go
    `checker/checker.go`, comprehension ranges) unless made `dyn()` first."""
    checked, _ = literals(compiled)
    found = []

    def kind(e):
        call = e.call_expr if e.HasField("call_expr") else None
        if call and call.function in ("List", "Get") and call.HasField("target"):
            return "map"
        operand = None
        if e.HasField("select_expr"):
            operand = e.select_expr.operand
        elif call and call.function == "_[_]":
            operand = call.args[0]
        if operand is not None:
            inner = kind(operand)
            if inner == "any":
                found.append(f"a field of google.protobuf.Any at {e.id}")
            return "any" if inner == "map" else None
        return None

    def walk(e):
        kind(e)
        if e.HasField("comprehension_expr") and kind(e.comprehension_expr.iter_range) == "any":
            found.append(f"google.protobuf.Any as a comprehension's range at {e.id}")
        for child in ("select_expr", "call_expr", "comprehension_expr", "list_expr", "struct_expr"):
            if not e.HasField(child):
                continue
            part = getattr(e, child)
            for name in ("operand", "target", "iter_range", "accu_init", "loop_condition",
                         "loop_step", "result"):
                if name in part.DESCRIPTOR.fields_by_name and part.HasField(name):
                    walk(getattr(part, name))
            for x in list(getattr(part, "args", [])) + list(getattr(part, "elements", [])):
                walk(x)
            for x in getattr(part, "entries", []):
                walk(x.value)

    walk(checked.expr)
    return sorted(set(found))


# What each kind of policy's expressions see (k8s.io/apiserver pkg/admission/plugin/cel
# compile.go; Kyverno pkg/cel/policies/mpol/compiler, whose 1.17 gives variables neither the
# namespace nor the request).
SEEN = {
    ("MutatingAdmissionPolicy", "variable"): ["object", "oldObject", "params", "namespaceObject",
                                              "request", "authorizer"],
    ("MutatingPolicy", "variable"): ["object", "oldObject", "resource"],
    ("MutatingPolicy", "other"): ["object", "oldObject", "namespaceObject", "request",
                                  "resource"],
}


class Policy:
    """A policy's expressions, each type-checked when compiled and then evaluated."""

    def __init__(self, kind, cluster):
        self.kind, self.cluster = kind, cluster
        # The variables so far and their types, as the API server checks them.
        self.declared = {}
        self.environments = {}

    def environment(self, typed, scope, variables="DYN"):
        names = SEEN.get((self.kind, scope)) or SEEN[(self.kind, "variable")]
        key = (typed, scope, variables)
        if key not in self.environments:
            self.environments[key] = environment(typed, self.cluster, names, variables)
        return self.environments[key]

    def compile(self, expression, scope, returns=None):
        """Type-checked with the pod typed (a misspelt field fails), then as the API server has
        it (the pod dynamic, each variable of its type) with its aggregate literal check; the
        program evaluates with the variables as data."""
        source = re.sub(
            r"\b(Object(?:\.[A-Za-z]+)*)\s*\{", lambda m: m.group(1).replace(".", "_") + "{",
            expression,
        )
        checked = self.environment(True, scope).compile(source).return_type().name()
        if returns and checked != returns:
            raise ValueError(f"{expression!r} gives {checked}, not {returns}")
        declared = variables_type(self.declared) if self.declared else "DYN"
        server = self.environment(False, scope, declared).compile(source)
        mixed = mixed_literals(server)
        if mixed:
            raise ValueError(f"{expression!r}: elements of more than one type in {', '.join(mixed)}")
        misused = kyverno_any(server)
        if misused:
            raise ValueError(f"{expression!r}: {', '.join(misused)}")
        checked, of = literals(server)
        returns = "DYN" if of(checked.expr) == DYN else server.return_type().name()
        return self.environment(False, scope).compile(source), returns

    def evaluate(self, expression, activation, returns=None):
        program, _ = self.compile(expression, "other", returns)
        return result(expression, program.eval(data=activation))

    def variable(self, name, expression, activation):
        """A variable's value; from then on it is declared of its type."""
        program, returns = self.compile(expression, "variable")
        self.declared[name] = returns
        return result(expression, program.eval(data=activation))


def result(expression, value):
    """A CEL result as JSON, or the evaluation's error raised: cel-expr-python gives an error as a
    value of type ERROR, whose plain value is its message, where cel-go returns an error."""
    if value.type() in (cel.Type.ERROR, cel.Type.UNKNOWN):
        raise ValueError(f"{expression!r}: {value.plain_value()}")
    return plain(value.plain_value())


def plain(value):
    """A CEL result as JSON: messages (JSONPatch, object initializers) by their JSON mapping, whole
    numbers as integers, as Go's encoding/json writes a structpb number that is one."""
    if hasattr(value, "DESCRIPTOR"):
        value = json_format.MessageToDict(value, preserving_proto_field_name=True)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# --- Matching


def selected(selector, labels):
    """A label selector (k8s.io/apimachinery pkg/apis/meta/v1 LabelSelectorAsSelector)."""
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


def matches(match, namespace, pod):
    rules = match.get("resourceRules")
    if rules is not None and not any(
        "" in r["apiGroups"] and "v1" in r["apiVersions"] and "pods" in r["resources"]
        and ("CREATE" in r["operations"] or "*" in r["operations"])
        for r in rules
    ):
        return False
    return selected(match.get("namespaceSelector"), namespace["metadata"].get("labels")) and \
        selected(match.get("objectSelector"), pod["metadata"].get("labels"))


def invocations(documents, namespace, pod, configmaps):
    """The params each matching binding runs the policy with (`CollectParams`)."""
    policy = next(d for d in documents if d["kind"] in ("MutatingAdmissionPolicy", "MutatingPolicy"))
    if not matches(policy["spec"].get("matchConstraints") or {}, namespace, pod):
        return policy, []
    if policy["kind"] == "MutatingPolicy":
        return policy, [None]
    runs = []
    for binding in documents:
        if binding["kind"] != "MutatingAdmissionPolicyBinding" or not matches(
            binding["spec"].get("matchResources") or {}, namespace, pod
        ):
            continue
        ref = binding["spec"].get("paramRef")
        if policy["spec"].get("paramKind") is None or ref is None:
            runs.append(None)
            continue
        found = [c for c in configmaps if c["metadata"]["name"] == ref["name"]
                 and c["metadata"].get("namespace") == ref.get("namespace", pod["metadata"].get("namespace"))]
        if not found and ref["parameterNotFoundAction"] == "Deny":
            raise ValueError("no params found for policy binding with `Deny` parameterNotFoundAction")
        runs.extend(found)
    return policy, runs


# --- Apply configurations: structured-merge-diff over the schema


def relationship(s):
    """How structured-merge-diff treats a schema: ("list", atomic?, keys), ("map", atomic?) for a
    map or a struct, ("scalar",)."""
    s = deref(s)
    if kind(s) == "array":
        list_type = s.get("x-kubernetes-list-type", "atomic")
        keys = s.get("x-kubernetes-list-map-keys") or []
        return ("list", list_type == "atomic", keys)
    if kind(s) == "object":
        return ("map", s.get("x-kubernetes-map-type") == "atomic")
    return ("scalar",)


def field_schema(s, key):
    s = deref(s)
    if key in (s.get("properties") or {}):
        return s["properties"][key]
    extra = s.get("additionalProperties")
    return extra if isinstance(extra, dict) else {}


def atomics(s, value, path=""):
    """`findAtomics`: every atomic list, map or struct the apply configuration sets."""
    found = []
    r = relationship(s)
    if isinstance(value, dict) and r[0] == "map":
        if r[1]:
            found.append(path)
        for key, v in value.items():
            found += atomics(field_schema(s, key), v, f"{path}.{key}")
    if isinstance(value, list) and r[0] == "list":
        if r[1]:
            found.append(path)
        item = deref(s).get("items") or {}
        for i, v in enumerate(value):
            found += atomics(item, v, f"{path}[{i}]")
    return found


def merge(s, lhs, rhs):
    """structured-merge-diff's typed Merge of rhs (the apply configuration) into lhs."""
    if rhs is None:
        return lhs
    if lhs is None:
        return rhs
    r = relationship(s)
    if r[0] == "map" and not r[1] and isinstance(lhs, dict) and isinstance(rhs, dict) and (lhs or rhs):
        out = {k: merge(field_schema(s, k), v, rhs.get(k)) for k, v in lhs.items()}
        out.update({k: v for k, v in rhs.items() if k not in lhs})
        return out
    if r[0] == "list" and not r[1] and (lhs or rhs):
        return merge_list(deref(s).get("items") or {}, r[2], lhs, rhs)
    return rhs


def merge_list(item, keys, lhs, rhs):
    """`visitListItems`: items matched by their keys (or by value in a set), in the order that
    keeps the left's and the right's both where they can."""
    key = (lambda v: tuple(json.dumps(v.get(k)) for k in keys)) if keys else json.dumps
    lkeys, rkeys = [key(v) for v in lhs], [key(v) for v in rhs]
    left, right = dict(zip(lkeys, lhs)), dict(zip(rkeys, rhs))
    shared = [k for k in rkeys if k in left]
    next_shared = shared.pop(0) if shared else None
    out, done, li, ri = [], set(), 0, 0
    while li < len(lkeys) or ri < len(rkeys):
        if li < len(lkeys) and ri < len(rkeys):
            k = lkeys[li]
            if k == rkeys[ri]:
                done.add(k)
                out.append(merge(item, left[k], right[k]))
                li, ri = li + 1, ri + 1
                next_shared = shared.pop(0) if shared else None
                continue
            if k in right and next_shared is not None and next_shared != k:
                li += 1
                continue
        if li < len(lkeys):
            k = lkeys[li]
            if k not in right:
                out.append(lhs[li])
                li += 1
                continue
            if k in done:
                li += 1
        if ri < len(rkeys):
            k = rkeys[ri]
            done.add(k)
            out.append(merge(item, left.get(k), right[k]))
            ri += 1
            if next_shared is not None and next_shared == k:
                next_shared = shared.pop(0) if shared else None
    return out


# --- The policy


def admission(documents, namespace, pod, configmaps):
    """The pod after the policy, and the error failurePolicy Ignore swallowed."""
    policy, runs = invocations(documents, namespace, pod, configmaps)
    cel_policy = Policy(policy["kind"], {"configmaps": configmaps, "namespaces": [namespace]})
    spec = policy["spec"]
    written = pod
    for params in runs:
        activation = {
            "object": pod, "oldObject": None, "params": params, "namespaceObject": namespace,
            "request": {"operation": "CREATE", "namespace": pod["metadata"].get("namespace")},
            "resource": {},
        }
        try:
            # Match conditions see the request and the objects, not variables, and the namespace
            # as null: the API server's matcher gives them none (k8s.io/apiserver v0.36.3
            # pkg/admission/plugin/webhook/matchconditions/matcher.go, Match: ForInput(..., nil,
            # ...)), also Kyverno's up to 1.18, which hands them to the API server in its webhook
            # configuration (kyverno/kyverno#17069).
            conditions = {**activation, "namespaceObject": None}
            if not all(cel_policy.evaluate(c["expression"], conditions, "BOOL")
                       for c in spec.get("matchConditions") or []):
                continue
            variables = {}
            for v in spec.get("variables") or []:
                variables[v["name"]] = cel_policy.variable(
                    v["name"], v["expression"], {**activation, "variables": variables})
            activation["variables"] = variables
            for mutation in spec["mutations"]:
                activation["object"] = pod = mutate(cel_policy, mutation, activation)
        except Exception as e:  # noqa: BLE001 - any failure is the policy's, and Ignore swallows it
            if spec.get("failurePolicy", "Fail") == "Ignore":
                return written, str(e)
            raise
    return pod, None


def mutate(cel_policy, mutation, activation):
    pod = activation["object"]
    if mutation["patchType"] == "JSONPatch":
        ops = cel_policy.evaluate(mutation["jsonPatch"]["expression"], activation, "LIST<JSONPatch>")
        try:
            return jsonpatch.apply_patch(pod, ops)
        except jsonpatch.JsonPatchTestFailed:
            return pod
    patch = cel_policy.evaluate(mutation["applyConfiguration"]["expression"], activation, "Object")
    pod_schema = DEFS["io.k8s.api.core.v1.Pod"]
    found = atomics(pod_schema, patch)
    if found:
        raise ValueError(
            "invalid ApplyConfiguration: may not mutate atomic arrays, maps or structs: "
            + ", ".join(found))
    return merge(pod_schema, pod, patch)


# --- Validating admission


def containers(pod):
    spec = pod["spec"]
    return (spec.get("initContainers") or []) + spec["containers"]


def invalid(pod):
    """What the pod's own validation refuses that a policy could cause."""
    why = []
    spec = pod["spec"]
    volumes = spec.get("volumes") or []
    names = [v["name"] for v in volumes]
    if len(set(names)) != len(names):
        why.append(f"spec.volumes: Duplicate value: {names}")
    for v in volumes:
        sources = [k for k in v if k != "name"]
        if len(sources) != 1:
            why.append(f"spec.volumes[{v['name']}]: may not specify more than 1 volume type: {sources}")
    cnames = [c["name"] for c in containers(pod)]
    if len(set(cnames)) != len(cnames):
        why.append(f"spec.containers: Duplicate value: {cnames}")
    for c in containers(pod):
        mounts = c.get("volumeMounts") or []
        paths = [m["mountPath"] for m in mounts]
        if len(set(paths)) != len(paths):
            why.append(f"{c['name']}.volumeMounts: mountPath must be unique: {paths}")
        why += [f"{c['name']}.volumeMounts[{m['name']}]: Not found" for m in mounts if m["name"] not in names]
    return why


def restricted(pod):
    """Pod Security's restricted level (k8s.io/pod-security-admission policy), as far as a
    container's security context and the pod's host namespaces go."""
    why = []
    spec = pod["spec"]
    pod_sc = spec.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            why.append(f"host namespaces ({flag}=true)")
    for c in containers(pod) + (spec.get("ephemeralContainers") or []):
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            why.append(f"allowPrivilegeEscalation != false (container {name!r})")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            why.append(f"unrestricted capabilities (container {name!r} must drop ALL)")
        if any(a != "NET_BIND_SERVICE" for a in caps.get("add") or []):
            why.append(f"unrestricted capabilities (container {name!r} adds {caps['add']})")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot", False)):
            why.append(f"runAsNonRoot != true (container {name!r})")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            why.append(f"runAsUser=0 (container {name!r})")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            why.append(f"seccompProfile (container {name!r} must set type RuntimeDefault or Localhost)")
        if sc.get("privileged"):
            why.append(f"privileged (container {name!r})")
    allowed = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
               "persistentVolumeClaim", "projected", "secret"}
    for v in spec.get("volumes") or []:
        bad = [k for k in v if k != "name" and k not in allowed]
        if bad:
            why.append(f"restricted volume types (volume {v['name']!r} uses {bad})")
    return why


def over_quota(pod, quotas):
    """ResourceQuota: each quota'd compute resource must be set on every container."""
    why = []
    for quota in quotas:
        for resource in (quota["spec"].get("hard") or {}):
            kind_, _, name = resource.rpartition(".")
            if name not in ("cpu", "memory"):
                continue
            where = "limits" if kind_ == "limits" else "requests"
            for c in containers(pod):
                if name not in ((c.get("resources") or {}).get(where) or {}):
                    why.append(f"must specify {where}.{name} for: {c['name']}")
    return why


def qos(pod):
    """The pod's QoS class (pkg/apis/core/v1/helper/qos/qos.go, `GetPodQOS`): Guaranteed when
    every container, init containers included, limits cpu and memory and requests no other
    amount; BestEffort when none asks for either."""
    guaranteed, any_set = True, False
    for c in containers(pod):
        r = c.get("resources") or {}
        requests, limits = r.get("requests") or {}, r.get("limits") or {}
        any_set |= any(k in requests or k in limits for k in ("cpu", "memory"))
        for k in ("cpu", "memory"):
            guaranteed &= k in limits and requests.get(k, limits[k]) == limits[k]
    return "Guaranteed" if guaranteed else ("Burstable" if any_set else "BestEffort")


def main():
    policy_file, namespace_file, configmap_file = sys.argv[1:4]
    configmaps = [] if configmap_file == "-" else list(yaml.safe_load_all(open(configmap_file)))
    documents = [d for d in yaml.safe_load_all(open(policy_file)) if d]
    in_namespace = [d for d in yaml.safe_load_all(open(namespace_file)) if d]
    namespace = next(d for d in in_namespace if d["kind"] == "Namespace")
    quotas = [d for d in in_namespace if d["kind"] == "ResourceQuota"]
    enforce = (namespace["metadata"].get("labels") or {}).get("pod-security.kubernetes.io/enforce")
    for pod_file in sys.argv[4:]:
        pod = yaml.safe_load(open(pod_file))
        pod["metadata"]["namespace"] = namespace["metadata"]["name"]
        admitted, ignored = admission(documents, namespace, pod, configmaps)
        refused = invalid(admitted) + over_quota(admitted, quotas)
        if enforce == "restricted":
            refused += restricted(admitted)
        print(f"=== {pod_file}")
        print(f"changed: {str(admitted != pod).lower()}")
        print(f"qos: {qos(admitted)}")
        if ignored:
            print(f"ignored: {ignored}")
        for why in refused:
            print(f"refused: {why}")
        print("---")
        print(json.dumps(admitted, sort_keys=True))


if __name__ == "__main__":
    main()
