"""Generate gpufleet/api/k8s.py: pydantic v2 models for the Kubernetes kinds gpufleet serves.

The shapes come from the official `kubernetes` Python client, whose model classes carry the
OpenAPI metadata we need (`openapi_types`, `attribute_map`). We read that metadata instead
of importing the client at runtime: the client is a test-only dependency, its models are slow
to import and carry client-side behaviour we do not want inside the API server.

It also writes gpufleet/api/k8s_descriptions.json.gz: the client's description of every
generated class ("ClassName") and field ("ClassName.jsonName"), which the API server merges
into its OpenAPI schemas for `kubectl explain`. They live outside k8s.py because that module is
imported by everything, and a thousand docstrings would slow every import for the one request
that needs them.

Usage:  python tools/gen_k8s_models.py [--check] [--output PATH] [--descriptions-output PATH]

`--check` exits non-zero when a checked-in file differs from what would be generated,
so CI can catch a hand edit or a client upgrade that was not regenerated.
"""

from __future__ import annotations

import argparse
import gzip
import inspect
import json
import keyword
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO / "gpufleet" / "api" / "k8s.py"
DEFAULT_DESCRIPTIONS = REPO / "gpufleet" / "api" / "k8s_descriptions.json.gz"

# Root client type -> (apiVersion, kind). The client does not expose group/version per model
# in a usable form, so the table is written out; it must agree with gpufleet/api/registry.py.
ROOTS: dict[str, tuple[str, str]] = {
    "V1Namespace": ("v1", "Namespace"),
    "V1Node": ("v1", "Node"),
    "V1Pod": ("v1", "Pod"),
    "V1Service": ("v1", "Service"),
    "V1Endpoints": ("v1", "Endpoints"),
    "CoreV1Event": ("v1", "Event"),
    "V1ResourceQuota": ("v1", "ResourceQuota"),
    "V1LimitRange": ("v1", "LimitRange"),
    "V1ConfigMap": ("v1", "ConfigMap"),
    "V1Secret": ("v1", "Secret"),
    "V1ServiceAccount": ("v1", "ServiceAccount"),
    "V1Deployment": ("apps/v1", "Deployment"),
    "V1ReplicaSet": ("apps/v1", "ReplicaSet"),
    "V1Job": ("batch/v1", "Job"),
    "V2HorizontalPodAutoscaler": ("autoscaling/v2", "HorizontalPodAutoscaler"),
    "V1PriorityClass": ("scheduling.k8s.io/v1", "PriorityClass"),
    "V1Lease": ("coordination.k8s.io/v1", "Lease"),
    "V1PodDisruptionBudget": ("policy/v1", "PodDisruptionBudget"),
    "V1Binding": ("v1", "Binding"),
    "V1Eviction": ("policy/v1", "Eviction"),
    # Status and DeleteOptions are registered in every group-version; the core spelling is
    # what the API server answers with and what kubectl sends.
    "V1Status": ("v1", "Status"),
    "V1DeleteOptions": ("v1", "DeleteOptions"),
    "V1Role": ("rbac.authorization.k8s.io/v1", "Role"),
    "V1ClusterRole": ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    "V1RoleBinding": ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    "V1ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    # The client's V1Scale is autoscaling/v1 Scale, the /scale subresource's body.
    "V1Scale": ("autoscaling/v1", "Scale"),
    # Storage: claims, volumes and their classes.
    "V1PersistentVolume": ("v1", "PersistentVolume"),
    "V1PersistentVolumeClaim": ("v1", "PersistentVolumeClaim"),
    "V1StorageClass": ("storage.k8s.io/v1", "StorageClass"),
    # serviceaccounts/token's body.
    "AuthenticationV1TokenRequest": ("authentication.k8s.io/v1", "TokenRequest"),
    # The kinds real manifests and charts use beyond the above.
    "V1StatefulSet": ("apps/v1", "StatefulSet"),
    "V1DaemonSet": ("apps/v1", "DaemonSet"),
    "V1ControllerRevision": ("apps/v1", "ControllerRevision"),
    "V1CronJob": ("batch/v1", "CronJob"),
    "V1Ingress": ("networking.k8s.io/v1", "Ingress"),
    "V1IngressClass": ("networking.k8s.io/v1", "IngressClass"),
    "V1NetworkPolicy": ("networking.k8s.io/v1", "NetworkPolicy"),
    "V1EndpointSlice": ("discovery.k8s.io/v1", "EndpointSlice"),
}

# Kinds that are sent or answered without a collection of their own.
NO_LIST = {"V1Binding", "V1Eviction", "V1Status", "V1DeleteOptions", "V1Scale", "AuthenticationV1TokenRequest"}

# ResourceList fields (map of resource name -> Quantity). The client types them as
# dict(str, str), which would reject `cpu: 1` straight from YAML.
QUANTITY_MAP_FIELDS = {
    "allocatable",
    "allocated_resources",
    "capacity",
    "default",
    "default_request",
    "hard",
    "limits",
    "max",
    "max_limit_request_ratio",
    "min",
    "requests",
    "used",
}

# Single Quantity values the client types as str (or as object for IntOrString-like ones).
QUANTITY_FIELDS = {
    ("V1EmptyDirVolumeSource", "size_limit"),
    ("V1ResourceFieldSelector", "divisor"),
    ("V2HPAScalingRules", "tolerance"),
    ("V2MetricTarget", "average_value"),
    ("V2MetricTarget", "value"),
    ("V2MetricValueStatus", "average_value"),
    ("V2MetricValueStatus", "value"),
}

# Optional on every object kind and list, whatever the client says: a manifest may omit them and
# the server fills them in. Elsewhere (OwnerReference, RoleRef, Subject) the client's word stands.
NEVER_REQUIRED_ON_OBJECTS = {"api_version", "kind", "metadata"}

# Names used in the generated module's namespace: a class or field by one of these names
# would shadow the type its annotations refer to.
MODULE_NAMES = {
    "Annotated",
    "Any",
    "BaseModel",
    "BeforeValidator",
    "ClassVar",
    "ConfigDict",
    "Field",
    "K8sModel",
    "PlainSerializer",
    "Quantity",
    "Self",
    "Time",
    "UTC",
    "datetime",
}
BUILTIN_TYPE_NAMES = {"Any", "bool", "dict", "float", "int", "list", "str"}
# Members K8sModel adds on top of BaseModel.
K8S_MODEL_MEMBERS = {"API_VERSION", "KIND", "from_dict", "to_dict"}

_PREFIX = re.compile(r"^(?:[A-Z][a-z]+)?V\d+(?:(?:alpha|beta)\d+)?(?=[A-Z])")


@dataclass
class FieldSpec:
    attr: str  # the client's attribute name
    py_name: str
    json_name: str
    annotation: str
    required: bool
    description: str = ""


@dataclass
class ClassSpec:
    client_name: str
    name: str
    doc: str
    fields: list[FieldSpec]
    deps: set[str]  # client names of referenced model types
    api_version: str | None = None
    kind: str | None = None
    description: str = ""  # the whole description, where `doc` keeps its first sentence


def short_name(client_name: str) -> str:
    return _PREFIX.sub("", client_name)


def split_type(t: str) -> tuple[str, str | None]:
    """('list', inner) / ('dict', value) / ('scalar', t). Accepts both client spellings:
    the legacy 'list[X]' / 'dict(str, X)' and the newer 'List[X]' / 'Dict[str, X]'."""
    t = t.strip()
    m = re.fullmatch(r"(?:list|List)\[(.*)\]", t)
    if m:
        return "list", m.group(1)
    m = re.fullmatch(r"(?:dict\(str,\s*(.*)\)|Dict\[str,\s*(.*)\])", t)
    if m:
        return "dict", m.group(1) or m.group(2)
    return "scalar", t


SCALARS = {
    "str": "str",
    "int": "int",
    "float": "float",
    "bool": "bool",
    "object": "Any",
    "datetime": "Time",
    "date": "Time",
    # Base64 text on the wire (Secret.data, ConfigMap.binaryData); decoding is the reader's job.
    "bytes": "str",
}


def referenced_models(t: str) -> set[str]:
    kind, inner = split_type(t)
    if kind != "scalar":
        return referenced_models(inner)
    return set() if t in SCALARS else {t}


def is_required(cls: type, attr: str) -> bool:
    # Pydantic-based clients record it on the field; python-legacy generated ones only in the setter.
    fields = getattr(cls, "model_fields", None)
    if isinstance(fields, dict) and attr in fields:
        return fields[attr].is_required()
    prop = inspect.getattr_static(cls, attr, None)
    if isinstance(prop, property) and prop.fset is not None:
        return "must not be `None`" in inspect.getsource(prop.fset)
    return False


def safe_py_name(attr: str, reserved: set[str]) -> str:
    # The client mangles JSON names that are Python keywords with a leading underscore
    # (`_continue`, `_not`, `_from`); pydantic treats leading underscores as private attributes.
    name = attr.lstrip("_") or attr
    if keyword.iskeyword(name) or keyword.issoftkeyword(name) or name in reserved:
        name += "_"
    return name


def class_description(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    # The client appends boilerplate about openapi_types/attribute_map; keep the description.
    doc = doc.split("Attributes:")[0].split("NOTE: This class is auto generated")[0].strip()
    if doc.startswith("NOTE:") or "Do not edit the class manually" in doc:
        return ""
    return doc


def field_description(cls: type, attr: str) -> str:
    # Pydantic-based clients keep it on the field; python-legacy ones in the getter's docstring,
    # between the "Gets the ..." line and ":return:".
    fields = getattr(cls, "model_fields", None)
    if isinstance(fields, dict) and attr in fields:
        return (fields[attr].description or "").strip()
    prop = inspect.getattr_static(cls, attr, None)
    if not isinstance(prop, property) or prop.fget is None:
        return ""
    doc = inspect.getdoc(prop.fget) or ""
    body = doc.split(":return:")[0].split("\n\n", 1)
    if len(body) < 2:
        return ""
    return body[1].replace("# noqa: E501", "").strip()


def class_doc(cls: type) -> str:
    doc = class_description(cls)
    # A sentence ends at a period followed by a capital, and not at "e.g." or "i.e.".
    first = re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<=\.)\s+(?=[A-Z])", " ".join(doc.split()), maxsplit=1)[0]
    return first


def collect(models) -> dict[str, type]:
    roots = list(ROOTS)
    for r in list(ROOTS):
        if r not in NO_LIST:
            list_name = r + "List"
            if not hasattr(models, list_name):
                raise SystemExit(f"client has no {list_name}")
            roots.append(list_name)
    seen: dict[str, type] = {}
    stack = sorted(roots)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        cls = getattr(models, name, None)
        if cls is None or not hasattr(cls, "openapi_types"):
            raise SystemExit(f"client has no model {name}")
        seen[name] = cls
        for t in cls.openapi_types.values():
            stack.extend(sorted(referenced_models(t) - seen.keys()))
    return seen


def assign_names(client_names: list[str]) -> tuple[dict[str, str], list[str]]:
    by_short: dict[str, list[str]] = {}
    for n in sorted(client_names):
        by_short.setdefault(short_name(n), []).append(n)
    names: dict[str, str] = {}
    notes: list[str] = []
    for short, group in sorted(by_short.items()):
        if len(group) == 1:
            names[group[0]] = short
            continue
        # The plain core/v1 spelling wins; CoreV1* next; everything else keeps its full name.
        group.sort(key=lambda n: (not re.match(r"V1[A-Z]", n), not re.match(r"CoreV1[A-Z]", n), n))
        names[group[0]] = short
        for loser in group[1:]:
            names[loser] = loser
        notes.append(f"name collision on {short!r}: {group[0]} -> {short}; kept {', '.join(group[1:])}")
    for client, name in names.items():
        if name in MODULE_NAMES or name in BUILTIN_TYPE_NAMES:
            raise SystemExit(f"{client} would be named {name}, which the module itself uses")
    if len(set(names.values())) != len(names):
        raise SystemExit("class names are not unique after collision handling")
    return names, notes


def annotation_for(t: str, names: dict[str, str], quantity: bool) -> str:
    kind, inner = split_type(t)
    if kind == "list":
        return f"list[{annotation_for(inner, names, False)}]"
    if kind == "dict":
        return f"dict[str, {annotation_for(inner, names, quantity)}]"
    if quantity and t in ("str", "object"):
        return "Quantity"
    if t in SCALARS:
        return SCALARS[t]
    return names[t]


def build_specs(models, notes: list[str]) -> list[ClassSpec]:
    from pydantic import BaseModel

    found = collect(models)
    names, name_notes = assign_names(list(found))
    notes.extend(name_notes)
    reserved = (
        set(dir(BaseModel)) | K8S_MODEL_MEMBERS | MODULE_NAMES | BUILTIN_TYPE_NAMES | set(names.values())
    )
    specs = []
    for client_name in sorted(found):
        cls = found[client_name]
        is_object = "metadata" in cls.openapi_types
        fields = []
        for attr in sorted(cls.openapi_types):
            t = cls.openapi_types[attr]
            kind, inner = split_type(t)
            quantity = (kind == "dict" and inner == "str" and attr in QUANTITY_MAP_FIELDS) or (
                (client_name, attr) in QUANTITY_FIELDS
            )
            py_name = safe_py_name(attr, reserved)
            if py_name != attr:
                notes.append(f"{names[client_name]}.{attr} -> python name {py_name!r}")
            fields.append(
                FieldSpec(
                    attr=attr,
                    py_name=py_name,
                    json_name=cls.attribute_map[attr],
                    annotation=annotation_for(t, names, quantity),
                    required=not (is_object and attr in NEVER_REQUIRED_ON_OBJECTS) and is_required(cls, attr),
                    description=field_description(cls, attr),
                )
            )
        for qcls, qattr in QUANTITY_FIELDS:
            if qcls == client_name and qattr not in cls.openapi_types:
                raise SystemExit(f"{client_name} has no field {qattr}; update QUANTITY_FIELDS")
        deps = set()
        for t in cls.openapi_types.values():
            deps |= referenced_models(t)
        spec = ClassSpec(
            client_name, names[client_name], class_doc(cls), fields, deps, description=class_description(cls)
        )
        base = client_name[: -len("List")] if client_name.endswith("List") else None
        if client_name in ROOTS:
            spec.api_version, spec.kind = ROOTS[client_name]
        elif base in ROOTS:
            spec.api_version, spec.kind = ROOTS[base][0], ROOTS[base][1] + "List"
        specs.append(spec)
    return specs


def topo_order(specs: list[ClassSpec]) -> tuple[list[ClassSpec], bool]:
    """Dependencies first, ties broken by class name, so the output is stable and pydantic can
    resolve each class's annotations when the class is created. Returns whether a cycle was
    found (then forward references remain and the module must model_rebuild())."""
    by_client = {s.client_name: s for s in specs}
    order: list[ClassSpec] = []
    state: dict[str, int] = {}
    cyclic = False

    def visit(name: str) -> None:
        nonlocal cyclic
        st = state.get(name)
        if st == 2:
            return
        if st == 1:
            cyclic = True
            return
        state[name] = 1
        for dep in sorted(by_client[name].deps, key=lambda d: by_client[d].name):
            visit(dep)
        state[name] = 2
        order.append(by_client[name])

    for s in sorted(specs, key=lambda s: s.name):
        visit(s.client_name)
    return order, cyclic


HEADER = '''\
"""Kubernetes object models (pydantic v2) for the kinds gpufleet serves.

GENERATED by tools/gen_k8s_models.py from the official kubernetes Python client {client_version}.
Do not edit by hand: change the generator and run `python tools/gen_k8s_models.py`.

Python field names are the client's snake_case names; the wire (JSON/YAML) names are the
aliases, and both are accepted on input. `to_dict()` always writes the wire names.
"""

{future}import math
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer


def _format_time(value: datetime) -> str:
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    # Four-digit years always (strftime writes year 704 as "704", which no parser reads back).
    text = (f"{{value.year:04d}}-{{value.month:02d}}-{{value.day:02d}}T"
            f"{{value.hour:02d}}:{{value.minute:02d}}:{{value.second:02d}}")
    # metav1.Time has whole seconds; metav1.MicroTime (Event.eventTime, Lease.renewTime)
    # carries microseconds, so they are written only when present.
    if value.microsecond:
        text += f".{{value.microsecond:06d}}"
    return text + "Z"


def _coerce_quantity(value: Any) -> Any:
    # YAML turns `cpu: 1` and `cpu: 0.5` into numbers; Kubernetes quantities are strings.
    if isinstance(value, bool):
        return value  # rejected by the str validator: `cpu: true` is a mistake, not 1
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("a quantity must be a finite number")
        return str(int(value)) if value.is_integer() else repr(value)
    return value


Time = Annotated[datetime, PlainSerializer(_format_time, return_type=str, when_used="json")]
Quantity = Annotated[str, BeforeValidator(_coerce_quantity)]


class K8sModel(BaseModel):
    # extra="forbid" backs the API server's strict field validation: unknown fields are
    # reported; with fieldValidation=Ignore the server strips them before validating.
    model_config = ConfigDict(
        populate_by_name=True,
        extra="forbid",
        validate_assignment=False,
        ser_json_timedelta="float",
    )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    @classmethod
    def from_dict(cls, d: Any) -> Self:
        return cls.model_validate(d)
'''


def render_field(f: FieldSpec) -> str:
    alias = f.json_name != f.py_name
    if f.required:
        if alias:
            return f"    {f.py_name}: {f.annotation} = Field(alias={f.json_name!r})"
        return f"    {f.py_name}: {f.annotation}"
    if alias:
        return f"    {f.py_name}: {f.annotation} | None = Field(default=None, alias={f.json_name!r})"
    return f"    {f.py_name}: {f.annotation} | None = None"


def render_class(s: ClassSpec) -> str:
    lines = [f"class {s.name}(K8sModel):"]
    if s.doc:
        doc = s.doc.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        wrapped = textwrap.wrap(doc, width=100)
        if len(wrapped) == 1 and len(wrapped[0]) <= 100:
            lines.append(f'    """{wrapped[0]}"""')
        else:
            lines.append(f'    """{wrapped[0]}')
            lines.extend(f"    {w}" for w in wrapped[1:])
            lines.append('    """')
        lines.append("")
    if s.api_version is not None:
        lines.append(f"    API_VERSION: ClassVar[str] = {s.api_version!r}")
        lines.append(f"    KIND: ClassVar[str] = {s.kind!r}")
        lines.append("")
    lines.extend(render_field(f) for f in s.fields)
    if not s.fields:
        lines.append("    pass")
    while lines[-1] == "":
        lines.pop()
    return "\n".join(lines)


def descriptions_of(specs: list[ClassSpec]) -> dict[str, str]:
    """Maps "Class" and "Class.jsonName" to the client's description, for those that have one."""
    out: dict[str, str] = {}
    for s in specs:
        if s.description:
            out[s.name] = s.description
        for f in s.fields:
            if f.description:
                out[f"{s.name}.{f.json_name}"] = f.description
    return out


def render_descriptions(descriptions: dict[str, str]) -> str:
    # One entry per line, sorted: stable across runs, and readable with `zcat`.
    return json.dumps(descriptions, indent=0, sort_keys=True, ensure_ascii=False) + "\n"


def write_descriptions(path: Path, text: str) -> None:
    # mtime=0 and no file name in the header keep the bytes the same from run to run.
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(text.encode())


def read_descriptions(path: Path) -> str:
    try:
        return gzip.decompress(path.read_bytes()).decode()
    except (OSError, EOFError, UnicodeDecodeError):
        return ""


def generate(notes: list[str], descriptions: dict[str, str] | None = None) -> tuple[str, int]:
    import kubernetes
    import kubernetes.client.models as models

    specs = build_specs(models, notes)
    if descriptions is not None:
        descriptions.update(descriptions_of(specs))
    order, cyclic = topo_order(specs)
    # Without a cycle every annotation names a class defined above it, so annotations are
    # evaluated eagerly: string annotations would cost a compile() each at import time.
    future = "from __future__ import annotations\n\n" if cyclic else ""
    parts = [HEADER.format(client_version=kubernetes.__version__, future=future)]
    for s in order:
        parts.append(render_class(s))
    if cyclic:
        notes.append("reference cycle in the closure: forward references resolved by model_rebuild()")
        parts.append(
            "for _model in (\n"
            + "".join(f"    {s.name},\n" for s in order)
            + "):\n    _model.model_rebuild()\ndel _model"
        )
    return "\n\n\n".join(parts) + "\n", len(order)


def ruff_format(source: str) -> str:
    ruff = Path(sys.executable).with_name("ruff")
    cmd = [str(ruff) if ruff.exists() else "ruff", "format", "--stdin-filename", "k8s.py", "-"]
    try:
        return subprocess.run(cmd, input=source, capture_output=True, text=True, check=True, cwd=REPO).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"note: ruff format unavailable ({e}); writing unformatted output", file=sys.stderr)
        return source


_CLIENT_VERSION = re.compile(r"(official kubernetes Python client )\S+?(\.?\n)")


def _unversioned(text: str) -> str:
    return _CLIENT_VERSION.sub(r"\1VERSION\2", text, count=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    p.add_argument("--descriptions-output", type=Path, default=DEFAULT_DESCRIPTIONS)
    p.add_argument("--check", action="store_true", help="fail if an output file is out of date")
    args = p.parse_args(argv)
    notes: list[str] = []
    descriptions: dict[str, str] = {}
    source, count = generate(notes, descriptions)
    source = ruff_format(source)
    described = render_descriptions(descriptions)
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    if args.check:
        stale = []
        current = args.output.read_text() if args.output.exists() else ""
        # A client release that generates the same models (a patch) is not a change.
        if _unversioned(current) != _unversioned(source):
            stale.append(args.output)
        # Compared decompressed: another zlib may compress the same text to other bytes.
        if read_descriptions(args.descriptions_output) != described:
            stale.append(args.descriptions_output)
        for path in stale:
            print(f"{path} is out of date; run tools/gen_k8s_models.py", file=sys.stderr)
        if stale:
            return 1
        print(f"{args.output} is up to date ({count} classes, {len(descriptions)} descriptions)")
        return 0
    args.output.write_text(source)
    write_descriptions(args.descriptions_output, described)
    print(
        f"wrote {args.output} ({count} classes) and {args.descriptions_output} ({len(descriptions)} descriptions)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
