"""The resource types a CustomResourceDefinition declares, and the unstructured model of their objects.

A built-in kind has a pydantic model; a custom one has ``CustomObject``, a subclass made per
served version that holds the JSON as it is and does what the generic registry asks of a
model: ``decode_custom`` prunes and defaults by the version's schema (decoding.decode hands
it the object), ``to_dict`` gives it back, ``model_json_schema`` publishes the schema for
OpenAPI (kubectl explain). ``resource_types(crd)`` builds a ``CustomResourceType`` per served
version: the storage version, and the others served from it as versions.py serves a version
from another's storage (conversion None: only apiVersion changes, as Kubernetes does).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from pydantic import ValidationError

from gpufleet.api import apiextensions as crds
from gpufleet.api import k8s, structural
from gpufleet.api.conversion import Conversion
from gpufleet.api.registry import ResourceType
from gpufleet.apiserver.decoding import field_path
from gpufleet.apiserver.errors import bad_request


@dataclass(frozen=True)
class CustomResourceType(ResourceType):
    """A ResourceType whose model, names and conversion come from its CRD (``extra``)."""

    @property
    def model(self) -> Any:  # type: ignore[override]
        return self.extra["model"]

    @property
    def conversion(self) -> Any:  # type: ignore[override]
        return self.extra.get("conversion")

    @property
    def singular(self) -> str:
        return self.extra.get("singular") or self.kind.lower()

    @property
    def list_kind(self) -> str:
        return self.extra.get("list_kind") or f"{self.kind}List"

    @property
    def crd_name(self) -> str:
        return self.extra["crd"]

    @property
    def schema(self) -> dict[str, Any] | None:
        return self.extra.get("schema")

    @property
    def printer_columns(self) -> list[dict[str, Any]]:
        return self.extra.get("columns") or []


def is_custom(rt: ResourceType) -> bool:
    return isinstance(rt, CustomResourceType)


@cache
def _object_meta_defs() -> dict[str, Any]:
    schema = k8s.ObjectMeta.model_json_schema(by_alias=True)
    defs = dict(schema.pop("$defs", {}))
    defs["ObjectMeta"] = schema
    return defs


class CustomObject:
    """An object of a custom kind: its JSON, as the pydantic model is a built-in kind's."""

    rt: ClassVar[CustomResourceType]

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    @classmethod
    def model_validate(cls, data: Any) -> CustomObject:
        """A stored object, taken as it is."""
        return cls(data if isinstance(data, dict) else {})

    def to_dict(self) -> dict[str, Any]:
        return self.data

    @property
    def metadata(self) -> k8s.ObjectMeta:
        return k8s.ObjectMeta.model_validate(self.data.get("metadata") or {})

    @classmethod
    def decode_custom(cls, obj: dict[str, Any], name: str, mode: str) -> tuple[CustomObject, list[str]]:
        """The object pruned of what the schema does not specify (a warning each, or under
        Strict a refusal) and defaulted; metadata checked as ObjectMeta."""
        rt = cls.rt
        unknown = _check_metadata(rt, obj, mode)
        unknown += structural.prune(obj, rt.schema)
        if unknown and mode == "Strict":
            names = ", ".join(f'unknown field "{u}"' for u in unknown)
            raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                              f"strict decoding error: {names}",
                              [{"reason": "FieldValueInvalid", "message": f'unknown field "{u}"', "field": u}
                               for u in unknown])
        warnings = [f'unknown field "{u}"' for u in unknown] if mode == "Warn" else []
        structural.apply_defaults(obj, rt.schema)
        return cls(obj), warnings

    @classmethod
    def model_json_schema(cls, by_alias: bool = True, **_: Any) -> dict[str, Any]:
        """The version's schema as a kind's OpenAPI definition: apiVersion, kind and an
        ObjectMeta metadata beside what the CRD specifies."""
        rt = cls.rt
        schema = dict(rt.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
        props = dict(schema.get("properties") or {})
        props.pop("metadata", None)
        head = {
            "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this "
                           "representation of an object."},
            "kind": {"type": "string", "description": "Kind is a string value representing the REST resource "
                     "this object represents."},
            "metadata": {"$ref": "#/$defs/ObjectMeta", "description": "Standard object's metadata."},
        }
        out = {**schema, "title": f"{_package(rt)}.{rt.kind}", "type": "object", "properties": {**head, **props}}
        out["$defs"] = _object_meta_defs()
        return out


def _package(rt: ResourceType) -> str:
    return ".".join([*reversed(rt.group.split(".")), rt.version])


def _check_metadata(rt: ResourceType, obj: dict[str, Any], mode: str) -> list[str]:
    """metadata's unknown fields (dropped, unless Strict refuses them later); a wrong type is a 400."""
    meta = obj.get("metadata")
    if meta is None:
        return []
    unknown: list[str] = []
    for _ in range(3):
        try:
            obj["metadata"] = k8s.ObjectMeta.model_validate(meta).to_dict()
            return unknown
        except ValidationError as e:
            errors = e.errors(include_url=False)
        extra = [err for err in errors if err["type"] == "extra_forbidden"]
        other = [err for err in errors if err["type"] != "extra_forbidden"]
        if other:
            listed = "; ".join(f"metadata.{field_path(err['loc'])}: Invalid value: {err['msg']}" for err in other)
            raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {listed}')
        for err in sorted(extra, key=lambda x: len(x["loc"]), reverse=True):
            unknown.append(f"metadata.{field_path(err['loc'])}")
            cur: Any = meta
            for part in err["loc"][:-1]:
                cur = cur[part]
            cur.pop(err["loc"][-1], None)
    return unknown


def _renaming(storage_api_version: str, api_version: str) -> Conversion:
    def to_storage(obj: dict[str, Any]) -> dict[str, Any]:
        return {**obj, "apiVersion": storage_api_version}

    def from_storage(obj: dict[str, Any]) -> dict[str, Any]:
        return {**obj, "apiVersion": api_version}

    return Conversion(to_storage, from_storage, lambda path, _obj: path)


def resource_types(crd: dict[str, Any], strategy: type) -> list[CustomResourceType]:
    """The served versions of ``crd``, the storage version first (always present, as the
    other versions are stored through it)."""
    spec, names = crds.spec_of(crd), crds.names_of(crd)
    group, plural, kind = spec.get("group") or "", names.get("plural") or "", names.get("kind") or ""
    storage = crds.storage_version(crd)
    if not (group and plural and kind and storage):
        return []
    meta = crd.get("metadata") or {}
    identity = f"crd:{meta.get('uid', '')}:{meta.get('resourceVersion', '')}"
    terminating = bool(meta.get("deletionTimestamp"))
    out: list[CustomResourceType] = []
    for version in sorted(crds.versions_of(crd), key=lambda v: not v.get("storage")):
        name = version.get("name") or ""
        if not name or (not version.get("served") and name != storage):
            continue
        subs = crds.version_subresources(version)
        subresources = tuple(s for s in ("status", "scale") if isinstance(subs.get(s), dict))
        extra: dict[str, Any] = {
            "crd": meta.get("name", ""),
            "schema": crds.version_schema(version),
            "columns": crds.printer_columns(version),
            "singular": names.get("singular") or kind.lower(),
            "list_kind": names.get("listKind") or f"{kind}List",
            "strategy": strategy,
            "terminating": terminating,
        }
        scale = subs.get("scale")
        if isinstance(scale, dict):
            extra["scale"] = {k: str(scale[k]).lstrip(".") for k in
                              ("specReplicasPath", "statusReplicasPath", "labelSelectorPath") if scale.get(k)}
        is_storage = name == storage
        if not is_storage:
            storage_av, av = f"{group}/{storage}", f"{group}/{name}"
            extra["conversion"] = _renaming(storage_av, av)
        rt = CustomResourceType(
            group, name, kind, plural, spec.get("scope") == "Namespaced", f"{identity}:{name}",
            short_names=tuple(names.get("shortNames") or ()), categories=tuple(names.get("categories") or ()),
            subresources=subresources, field_labels=crds.selectable_fields(version), extra=extra,
            storage_version="" if is_storage else storage,
        )
        rt.extra["model"] = type(kind, (CustomObject,), {"rt": rt, "__module__": __name__})
        out.append(rt)
    return out
