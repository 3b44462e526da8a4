"""OpenAPI documents for kubectl: v3 per group-version (1.29+) and a protobuf v2 (1.27, 1.28).

kubectl downloads OpenAPI before `create`, `apply` and `edit` only to learn whether the server
validates fields itself: it looks for a PATCH operation tagged with the kind's
`x-kubernetes-group-version-kind` that declares the `fieldValidation` query parameter. When
it finds one it sends `fieldValidation=Strict` and leaves validation to the server; when it
finds none it validates on the client against the schemas, which we do not want to depend
on. So the operations are what matters; the schemas under components are a bonus for
`kubectl explain` and are left out when the typed models cannot be loaded. Their descriptions
come from gpufleet/api/k8s_descriptions.json.gz (written with the models by
tools/gen_k8s_models.py), read the first time a document is built.

PATCH operations deliberately declare no request body. kubectl 1.27+ computes an apply patch
from the v3 schemas as soon as a PATCH lists `application/strategic-merge-patch+json`, and
then needs every list's patch strategy and merge key right; without that it falls back to
the Go types compiled into it, which are exactly Kubernetes' (and, for custom kinds, to a
JSON merge patch, as on a real cluster).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from gpufleet.api.registry import Registry, ResourceType
from gpufleet.apiserver.discovery import GIT_VERSION

OPENAPI_V2_CONTENT_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
"""What to answer /openapi/v2 with. kubectl asks for `…spec.v2@v1.0+protobuf`, but Go's MIME
parser rejects the '@', so echoing the Accept header breaks it."""

_META_PACKAGE = "io.k8s.apimachinery.pkg.apis.meta.v1"
_META_TYPES = frozenset(
    {
        "ObjectMeta",
        "ListMeta",
        "OwnerReference",
        "ManagedFieldsEntry",
        "LabelSelector",
        "LabelSelectorRequirement",
        "Condition",
        "Time",
        "MicroTime",
        "Status",
        "StatusDetails",
        "StatusCause",
        "Preconditions",
        "DeleteOptions",
        "FieldsV1",
        "ShardInfo",
    }
)
# Shared types that Kubernetes files under core/v1 but that no core kind served here embeds.
_CORE_TYPES = frozenset({"PodTemplateSpec", "TopologySelectorTerm", "TopologySelectorLabelRequirement"})

# Patch strategy and merge key of well-known lists, by property name (Kubernetes' Go tags).
_PATCH_META: dict[str, tuple[str, str | None]] = {
    "containers": ("merge", "name"),
    "initContainers": ("merge", "name"),
    "ephemeralContainers": ("merge", "name"),
    "volumes": ("merge,retainKeys", "name"),
    "env": ("merge", "name"),
    "imagePullSecrets": ("merge", "name"),
    "volumeMounts": ("merge", "mountPath"),
    "volumeDevices": ("merge", "devicePath"),
    "hostAliases": ("merge", "ip"),
    "conditions": ("merge", "type"),
    "ownerReferences": ("merge", "uid"),
    "finalizers": ("merge", None),
}
# `ports` means different things in a container and in a service.
_PORTS_MERGE_KEY = {"ContainerPort": "containerPort", "ServicePort": "port"}

_QUERY_DESCRIPTIONS = {
    "dryRun": "When present, indicates that modifications should not be persisted. Valid value: All.",
    "fieldManager": "A name associated with the actor or entity that is making these changes.",
    "fieldValidation": "How the server treats unknown or duplicate fields: Ignore, Warn or Strict.",
    "force": 'Force is going to "force" Apply requests, re-acquiring conflicting fields.',
    "gracePeriodSeconds": "The duration in seconds before the object should be deleted.",
    "propagationPolicy": "Whether and how garbage collection will be performed: Orphan, Background, Foreground.",
    "labelSelector": "A selector to restrict the list of returned objects by their labels.",
    "fieldSelector": "A selector to restrict the list of returned objects by their fields.",
    "limit": "The maximum number of responses to return for a list call.",
    "continue": "The continue token of the previous page of a list call.",
    "resourceVersion": "Which resource versions the request may be served from.",
    "resourceVersionMatch": "How resourceVersion is applied to list calls.",
    "timeoutSeconds": "Timeout for the list/watch call.",
    "watch": "Watch for changes to the described resources and return them as a stream of events.",
    "allowWatchBookmarks": "Requests watch events with type BOOKMARK.",
}
_QUERY_TYPES = {
    "force": "boolean",
    "watch": "boolean",
    "allowWatchBookmarks": "boolean",
    "gracePeriodSeconds": "integer",
    "limit": "integer",
    "timeoutSeconds": "integer",
}
_WRITE_PARAMS = ("dryRun", "fieldManager", "fieldValidation")
_LIST_PARAMS = (
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "timeoutSeconds",
    "watch",
)
_DELETE_PARAMS = ("dryRun", "gracePeriodSeconds", "propagationPolicy")


def gv_path(group: str, version: str) -> str:
    """The key of a group-version in the v3 index: 'api/v1', 'apis/apps/v1'."""
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def schema_package(group: str, version: str) -> str:
    """The prefix Kubernetes gives a group-version's schema names.

    Built-in groups: io.k8s.api.<first label>.<version> (core for ''); other groups take the
    reversed domain, as CRD schemas do (kubeflow.org/v1 -> org.kubeflow.v1).
    """
    if not group:
        return f"io.k8s.api.core.{version}"
    labels = group.split(".")
    if len(labels) == 1 or group.endswith(".k8s.io"):
        return f"io.k8s.api.{labels[0]}.{version}"
    return ".".join([*reversed(labels), version])


def _camel(text: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in text.replace("-", ".").split(".") if p)


def _operation_prefix(rt: ResourceType) -> str:
    if not rt.group:
        group = "Core"
    elif "." not in rt.group or rt.group.endswith(".k8s.io"):
        group = _camel(rt.group.split(".")[0])
    else:
        group = _camel(rt.group)
    return group + _camel(rt.version)


def _gvk(rt: ResourceType) -> dict[str, str]:
    return {"group": rt.group, "kind": rt.kind, "version": rt.version}


# --- schemas -------------------------------------------------------------------------------


def _model_schema(rt: ResourceType) -> dict[str, Any] | None:
    # The models are generated separately and may be missing or broken at any given moment;
    # without them the document still does its one job (see the module docstring).
    try:
        return rt.model.model_json_schema(by_alias=True)
    except Exception:
        return None


@dataclass
class _Schemas:
    # short name (as pydantic names it) -> schema (pydantic's, unconverted), per kind
    per_kind: dict[ResourceType, dict[str, dict[str, Any]]]
    names: dict[str, str]  # short name -> Kubernetes-style qualified name
    # Per kind, short names that mean another type than `names` says: kueue's ResourceQuota
    # is not core's, Kubeflow's JobStatus is not batch's. They are filed under the kind's own
    # package instead.
    own_names: dict[ResourceType, dict[str, str]] = field(default_factory=dict)

    def names_for(self, rt: ResourceType) -> dict[str, str]:
        own = self.own_names.get(rt)
        return {**self.names, **own} if own else self.names


def _collect_schemas(types: tuple[ResourceType, ...]) -> _Schemas:
    per_kind: dict[ResourceType, dict[str, dict[str, Any]]] = {}
    names: dict[str, str] = {}
    first: dict[str, dict[str, Any]] = {}  # short name -> the schema that claimed it
    own_names: dict[ResourceType, dict[str, str]] = {}
    for rt in types:
        schema = _model_schema(rt)
        if schema is None:
            continue
        defs = dict(schema.pop("$defs", {}))
        short = schema.get("title") or rt.kind
        defs[short] = schema
        per_kind[rt] = {"__root__": {"$ref": f"#/$defs/{short}"}, **defs}
        names[short] = f"{schema_package(rt.group, rt.version)}.{rt.kind}"
        first.setdefault(short, schema)
    # Each shared type is filed under the first kind (in registration order, core first) that
    # uses it, which puts PodSpec under core/v1 as in Kubernetes.
    for rt, defs in per_kind.items():
        package = schema_package(rt.group, rt.version)
        for short, schema in defs.items():
            if short == "__root__":
                continue
            if short in names:
                if first.get(short, schema) != schema:
                    # Same class name, different type (another group's model).
                    own_names.setdefault(rt, {})[short] = f"{package}.{short}"
                continue
            first[short] = schema
            if short in _META_TYPES:
                names[short] = f"{_META_PACKAGE}.{short}"
            elif short in _CORE_TYPES:
                names[short] = f"{schema_package('', 'v1')}.{short}"
            else:
                names[short] = f"{package}.{short}"
    return _Schemas(per_kind, names, own_names)


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


class _Converter:
    """pydantic's JSON Schema (2020-12) -> the OpenAPI 3.0 dialect Kubernetes publishes."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def ref(self, ref: str) -> str:
        short = _ref_name(ref)
        return "#/components/schemas/" + self.names.get(short, short)

    def convert(self, schema: Any) -> Any:
        if isinstance(schema, list):
            return [self.convert(s) for s in schema]
        if not isinstance(schema, dict):
            return schema
        any_of = schema.get("anyOf")
        if isinstance(any_of, list):
            non_null = [s for s in any_of if s != {"type": "null"}]
            if len(non_null) == 1 and len(non_null) < len(any_of):
                # Optional[X]: absence already means null in Kubernetes' schemas.
                rest = {k: v for k, v in schema.items() if k != "anyOf"}
                inner = self.convert(non_null[0])
                extras = self.convert(rest)
                if "$ref" in inner:
                    return {"allOf": [inner], **extras} if extras else inner
                return {**inner, **extras}
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key == "title" or (key == "default" and value is None):
                continue
            if key == "additionalProperties" and value is False:
                continue  # unknown fields are judged by the server's fieldValidation, not here
            if key == "$ref":
                out["$ref"] = self.ref(value)
            elif key == "const":
                out["enum"] = [value]
            elif key == "properties":
                out["properties"] = {
                    name: self._with_patch_meta(name, self.convert(prop)) for name, prop in value.items()
                }
            elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
                out[key] = self.convert(value)
            elif key in ("allOf", "anyOf", "oneOf", "prefixItems"):
                out[key] = self.convert(value)
            else:
                out[key] = value
        return out

    def _with_patch_meta(self, name: str, prop: dict[str, Any]) -> dict[str, Any]:
        if prop.get("type") != "array":
            return prop
        item_ref = (prop.get("items") or {}).get("$ref", "")
        if name == "ports":
            key = _PORTS_MERGE_KEY.get(_ref_name(item_ref).rsplit(".", 1)[-1])
            meta: tuple[str, str | None] | None = ("merge", key) if key else None
        else:
            meta = _PATCH_META.get(name)
        if meta is None:
            return prop
        strategy, merge_key = meta
        prop = {**prop, "x-kubernetes-patch-strategy": strategy}
        if merge_key:
            prop["x-kubernetes-patch-merge-key"] = merge_key
        return prop


@cache
def _descriptions() -> dict[str, str]:
    """Descriptions by "Class" and "Class.jsonName". Kept out of the models so that importing
    them stays cheap; a missing or unreadable file only costs `kubectl explain` its text."""
    try:
        data = (resources.files("gpufleet.api") / "k8s_descriptions.json.gz").read_bytes()
        texts = json.loads(gzip.decompress(data))
    except (OSError, EOFError, ValueError):
        return {}
    return texts if isinstance(texts, dict) else {}


def _describe(short: str, schema: dict[str, Any], qualified: str | None = None) -> dict[str, Any]:
    texts = _descriptions()
    # The texts are Kubernetes' own; the other groups' types keep their models' descriptions.
    if not texts or (qualified is not None and not qualified.startswith("io.k8s.")):
        return schema
    out = dict(schema)
    # Replaces what pydantic took from the class docstring: k8s.py keeps only its first sentence.
    if short in texts:
        out["description"] = texts[short]
    properties = out.get("properties")
    if isinstance(properties, dict):
        described: dict[str, Any] = {}
        for name, prop in properties.items():
            text = texts.get(f"{short}.{name}")
            if text and isinstance(prop, dict):
                if "$ref" in prop:
                    # OpenAPI 3.0 ignores the siblings of a $ref; Kubernetes wraps it the same way.
                    rest = {k: v for k, v in prop.items() if k != "$ref"}
                    prop = {"allOf": [{"$ref": prop["$ref"]}], **rest}
                prop = {**prop, "description": text}
            described[name] = prop
        out["properties"] = described
    return out


def _components(kinds: list[ResourceType], schemas: _Schemas) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for rt in kinds:
        defs = schemas.per_kind.get(rt)
        if not defs:
            continue
        names = schemas.names_for(rt)
        conv = _Converter(names)
        for short, schema in defs.items():
            if short == "__root__":
                continue
            name = names.get(short, short)
            if name in out:
                continue
            out[name] = _describe(short, conv.convert(schema), name)
        root = names.get(_ref_name(defs["__root__"]["$ref"]))
        if root in out:
            out[root] = {**out[root], "x-kubernetes-group-version-kind": [_gvk(rt)]}
    return dict(sorted(out.items()))


def _schema_ref(rt: ResourceType, schemas: _Schemas) -> dict[str, Any] | None:
    defs = schemas.per_kind.get(rt)
    if not defs:
        return None
    short = _ref_name(defs["__root__"]["$ref"])
    return {"$ref": "#/components/schemas/" + schemas.names_for(rt).get(short, short)}


# --- v3 paths ------------------------------------------------------------------------------


def _query(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "description": _QUERY_DESCRIPTIONS.get(name, ""),
        "schema": {"type": _QUERY_TYPES.get(name, "string")},
    }


def _path_param(name: str) -> dict[str, Any]:
    what = (
        "name of the object"
        if name == "name"
        else "object name and auth scope, such as for teams and projects"
    )
    return {"name": name, "in": "path", "description": what, "required": True, "schema": {"type": "string"}}


def _operation(
    rt: ResourceType,
    action: str,
    op_id: str,
    params: tuple[str, ...],
    ref: dict[str, Any] | None,
    *,
    with_body: bool = False,
    status_codes: tuple[str, ...] = ("200",),
) -> dict[str, Any]:
    response: dict[str, Any] = {"description": "OK"}
    if ref is not None and action not in ("list", "deletecollection"):
        response["content"] = {"application/json": {"schema": ref}}
    prefix = _operation_prefix(rt)
    op: dict[str, Any] = {
        "tags": [prefix[:1].lower() + prefix[1:]],
        "operationId": op_id,
        "parameters": [_query(p) for p in params],
        "responses": {code: response for code in status_codes},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(rt),
    }
    if with_body and ref is not None:
        op["requestBody"] = {"content": {"*/*": {"schema": ref}}, "required": True}
    return op


def _paths_for(rt: ResourceType, ref: dict[str, Any] | None) -> dict[str, Any]:
    prefix = _operation_prefix(rt)
    scoped = "Namespaced" if rt.namespaced else ""
    verbs = set(rt.verbs)
    collection_path = rt.path(namespace="{namespace}")
    item_path = rt.path(namespace="{namespace}", name="{name}")
    scope_params = [_path_param("namespace")] if rt.namespaced else []

    collection: dict[str, Any] = {"parameters": scope_params} if scope_params else {}
    if "list" in verbs:
        collection["get"] = _operation(rt, "list", f"list{prefix}{scoped}{rt.kind}", _LIST_PARAMS, ref)
    if "create" in verbs:
        collection["post"] = _operation(
            rt,
            "post",
            f"create{prefix}{scoped}{rt.kind}",
            _WRITE_PARAMS,
            ref,
            with_body=True,
            status_codes=("200", "201", "202"),
        )
    if "deletecollection" in verbs:
        collection["delete"] = _operation(
            rt,
            "deletecollection",
            f"deletecollection{prefix}{scoped}{rt.kind}",
            _DELETE_PARAMS + _LIST_PARAMS,
            ref,
        )

    item: dict[str, Any] = {"parameters": [_path_param("name"), *scope_params]}
    if "get" in verbs:
        item["get"] = _operation(rt, "get", f"read{prefix}{scoped}{rt.kind}", (), ref)
    if "update" in verbs:
        item["put"] = _operation(
            rt,
            "put",
            f"replace{prefix}{scoped}{rt.kind}",
            _WRITE_PARAMS,
            ref,
            with_body=True,
            status_codes=("200", "201"),
        )
    if "patch" in verbs:
        item["patch"] = _operation(
            rt,
            "patch",
            f"patch{prefix}{scoped}{rt.kind}",
            (*_WRITE_PARAMS, "force"),
            ref,
            status_codes=("200", "201"),
        )
    if "delete" in verbs:
        item["delete"] = _operation(
            rt, "delete", f"delete{prefix}{scoped}{rt.kind}", _DELETE_PARAMS, ref, status_codes=("200", "202")
        )

    paths: dict[str, Any] = {}
    if len(collection) > (1 if scope_params else 0):
        paths[collection_path] = collection
    if len(item) > 1:
        paths[item_path] = item
    if rt.namespaced and "list" in verbs:
        paths[rt.path()] = {
            "get": _operation(rt, "list", f"list{prefix}{rt.kind}ForAllNamespaces", _LIST_PARAMS, ref)
        }
    return paths


# --- cache ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _V3Doc:
    document: dict[str, Any]
    body: bytes
    hash: str


@dataclass
class _Built:
    schemas: _Schemas | None = None
    v3: dict[tuple[str, str], _V3Doc | None] | None = None
    v2: bytes | None = None


_CACHE_SIZE = 4
_lock = threading.Lock()
_cache: dict[tuple[tuple[ResourceType, ...], str], _Built] = {}


def _built(registry: Registry, version: str) -> tuple[tuple[ResourceType, ...], _Built]:
    types = tuple(registry.served())
    key = (types, version)
    with _lock:
        built = _cache.get(key)
        if built is None:
            # Registering a kind changes every document: a new key, and the oldest one goes.
            while len(_cache) >= _CACHE_SIZE:
                _cache.pop(next(iter(_cache)))
            built = _cache[key] = _Built(v3={})
        return types, built


def _schemas_for(types: tuple[ResourceType, ...], built: _Built) -> _Schemas:
    if built.schemas is None:
        built.schemas = _collect_schemas(types)
    return built.schemas


def _build_v3(
    types: tuple[ResourceType, ...], built: _Built, group: str, version: str, info_version: str
) -> _V3Doc | None:
    kinds = [t for t in types if t.group == group and t.version == version]
    if not kinds:
        return None
    schemas = _schemas_for(types, built)
    paths: dict[str, Any] = {}
    for rt in kinds:
        paths.update(_paths_for(rt, _schema_ref(rt, schemas)))
    document = {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": info_version},
        "paths": paths,
        "components": {"schemas": _components(kinds, schemas)},
    }
    body = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    return _V3Doc(document, body, hashlib.sha512(body).hexdigest().upper())


def _v3(registry: Registry, group: str, version: str, info_version: str) -> _V3Doc | None:
    types, built = _built(registry, info_version)
    assert built.v3 is not None
    gv = (group, version)
    if gv not in built.v3:
        doc = _build_v3(types, built, group, version, info_version)
        with _lock:
            built.v3.setdefault(gv, doc)
    return built.v3[gv]


# --- public --------------------------------------------------------------------------------


def openapi_v3_document(
    registry: Registry, group: str, version: str, *, info_version: str = GIT_VERSION
) -> dict[str, Any] | None:
    """The OpenAPI 3.0 document of one group-version (GET /openapi/v3/apis/<g>/<v>), None if unknown.

    The dict is cached and shared between callers: serialize it, do not change it.
    """
    doc = _v3(registry, group, version, info_version)
    return None if doc is None else doc.document


def openapi_v3_document_bytes(
    registry: Registry, group: str, version: str, *, info_version: str = GIT_VERSION
) -> tuple[bytes, str] | None:
    """The same document as compact JSON, with the hash the index advertises for it."""
    doc = _v3(registry, group, version, info_version)
    return None if doc is None else (doc.body, doc.hash)


def openapi_v3_hash(
    registry: Registry, group: str, version: str, *, info_version: str = GIT_VERSION
) -> str | None:
    doc = _v3(registry, group, version, info_version)
    return None if doc is None else doc.hash


def openapi_v3_index(registry: Registry, *, info_version: str = GIT_VERSION) -> dict[str, Any]:
    """GET /openapi/v3: where each group-version's document lives.

    The hash in each URL is the SHA-512 of that document, so it changes with the document and
    kubectl's on-disk cache, which is keyed by the URL, never serves a stale one.
    """
    paths: dict[str, Any] = {}
    for group, versions in registry.groups().items():
        for version in versions:
            doc_hash = openapi_v3_hash(registry, group, version, info_version=info_version)
            if doc_hash is None:
                continue
            key = gv_path(group, version)
            paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={doc_hash}"}
    return {"paths": paths}


# --- v2 protobuf ---------------------------------------------------------------------------
#
# A hand-written encoder for the few messages of gnostic's openapi_v2.Document that kubectl
# reads (github.com/google/gnostic, openapiv2/OpenAPIv2.proto). Field numbers:
#   Document: swagger 1, info 2, paths 8          Info: title 1, version 2
#   Paths: path 2 (NamedPathItem: name 1, value 2) PathItem: patch 8, parameters 9
#   Operation: operation_id 5, parameters 8, responses 9, vendor_extension 13
#   ParametersItem: parameter 1   Parameter: non_body_parameter 2
#   NonBodyParameter: query_parameter_sub_schema 3, path_parameter_sub_schema 4
#   QueryParameterSubSchema: required 1, in 2, description 3, name 4, type 6
#   PathParameterSubSchema: required 1, in 2, description 3, name 4, type 5
#   Responses: response_code 1 (NamedResponseValue: name 1, value 2)
#   ResponseValue: response 1      Response: description 1
#   NamedAny: name 1, value 2      Any: yaml 2

_VARINT = 0
_LEN = 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_bytes(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | _LEN) + _varint(len(data)) + data


def _field_str(number: int, text: str) -> bytes:
    # proto3 leaves empty strings off the wire
    return _field_bytes(number, text.encode()) if text else b""


def _field_bool(number: int, value: bool) -> bytes:
    return _varint(number << 3 | _VARINT) + _varint(1) if value else b""


def _field_msg(number: int, *parts: bytes) -> bytes:
    return _field_bytes(number, b"".join(parts))


def _yaml_scalar(text: str) -> str:
    plain = text and all(c.isalnum() or c in ".-_/" for c in text) and text[0].isalpha()
    return text if plain else json.dumps(text)


def gvk_yaml(group: str, version: str, kind: str) -> str:
    """The GVK extension as gnostic carries it: YAML with sorted keys, `group: ""` for core."""
    return f"group: {_yaml_scalar(group)}\nkind: {_yaml_scalar(kind)}\nversion: {_yaml_scalar(version)}\n"


def _v2_query_param(name: str) -> bytes:
    sub = _field_str(2, "query") + _field_str(3, _QUERY_DESCRIPTIONS.get(name, "")) + _field_str(4, name)
    sub += _field_str(6, _QUERY_TYPES.get(name, "string"))
    return _field_msg(1, _field_msg(2, _field_msg(3, sub)))


def _v2_path_param(name: str) -> bytes:
    sub = _field_bool(1, True) + _field_str(2, "path") + _field_str(4, name) + _field_str(5, "string")
    return _field_msg(1, _field_msg(2, _field_msg(4, sub)))


def _v2_named_any(name: str, yaml_text: str) -> bytes:
    return _field_str(1, name) + _field_msg(2, _field_str(2, yaml_text))


def _v2_path(rt: ResourceType) -> bytes:
    operation = _field_str(5, f"patch{_operation_prefix(rt)}{'Namespaced' if rt.namespaced else ''}{rt.kind}")
    for name in (*_WRITE_PARAMS, "force"):
        operation += _field_msg(8, _v2_query_param(name))
    ok = _field_str(1, "200") + _field_msg(2, _field_msg(1, _field_str(1, "OK")))
    operation += _field_msg(9, _field_msg(1, ok))
    # The GVK goes first: kubectl's check gives up at the first GVK extension that differs.
    operation += _field_msg(13, _v2_named_any("x-kubernetes-group-version-kind", gvk_yaml(*rt.gvk)))
    operation += _field_msg(13, _v2_named_any("x-kubernetes-action", "patch\n"))
    path_item = _field_msg(8, operation)
    path_item += _field_msg(9, _v2_path_param("name"))
    if rt.namespaced:
        path_item += _field_msg(9, _v2_path_param("namespace"))
    named = _field_str(1, rt.path(namespace="{namespace}", name="{name}")) + _field_msg(2, path_item)
    return _field_msg(2, named)


def openapi_v2_protobuf(registry: Registry, *, info_version: str = GIT_VERSION) -> bytes:
    """GET /openapi/v2 (and /swagger-2.0.0.pb-v1) for kubectl 1.27 and 1.28: a protobuf
    openapi_v2.Document with, per kind, the item path's PATCH declaring `fieldValidation`.

    Serve it as OPENAPI_V2_CONTENT_TYPE.
    """
    types, built = _built(registry, info_version)
    if built.v2 is None:
        info = _field_str(1, "Kubernetes") + _field_str(2, info_version)
        paths = b"".join(_v2_path(rt) for rt in types if "patch" in rt.verbs)
        built.v2 = _field_str(1, "2.0") + _field_msg(2, info) + _field_msg(8, paths)
    return built.v2
