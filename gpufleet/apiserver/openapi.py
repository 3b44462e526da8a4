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

The names and query parameters shared by both documents are in openapi_common, the v3
paths in openapi_paths and the v2 protobuf in openapi_v2; this module builds the schemas
and the cached v3 documents.
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
from gpufleet.apiserver.openapi_common import (
    _CORE_TYPES,
    _META_PACKAGE,
    _META_TYPES,
    _PATCH_META,
    _PORTS_MERGE_KEY,
    OPENAPI_V2_CONTENT_TYPE,
    _gvk,
    gv_path,
    schema_package,
)
from gpufleet.apiserver.openapi_paths import _paths_for
from gpufleet.apiserver.openapi_v2 import _varint, gvk_yaml, v2_document

__all__ = [
    "OPENAPI_V2_CONTENT_TYPE",
    "_varint",
    "gv_path",
    "gvk_yaml",
    "openapi_v2_protobuf",
    "openapi_v3_document",
    "openapi_v3_document_bytes",
    "openapi_v3_hash",
    "openapi_v3_index",
    "schema_package",
]

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


def openapi_v2_protobuf(registry: Registry, *, info_version: str = GIT_VERSION) -> bytes:
    """GET /openapi/v2 (and /swagger-2.0.0.pb-v1) for kubectl 1.27 and 1.28: a protobuf
    openapi_v2.Document with, per kind, the item path's PATCH declaring `fieldValidation`.

    Serve it as OPENAPI_V2_CONTENT_TYPE.
    """
    types, built = _built(registry, info_version)
    if built.v2 is None:
        built.v2 = v2_document(types, info_version)
    return built.v2
