"""CustomResourceDefinition validation (apiextensions-apiserver's pkg/apis/apiextensions/validation).

What kube-apiserver checks before it serves a CRD: the name is ``<plural>.<group>``, the
group a domain with a dot (and, under k8s.io or kubernetes.io, approved), the names DNS
labels, exactly one storage version, every version with a schema, printer columns and scale
paths that make sense, and the schema structural (``_structural``: a type on every node, no
$ref, metadata restricted to name and generateName). Wording as Kubernetes'.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api.validation.core import Errs, validate_object_meta
from gpufleet.api.validation.dispatch import register_validator
from gpufleet.api.validation.errors import FieldError, forbidden, invalid, not_supported, required
from gpufleet.api.validation.names import is_dns1035_label, is_dns1123_subdomain, name_is_dns_subdomain

_SCOPES = ("Cluster", "Namespaced")
_TYPES = ("array", "boolean", "integer", "number", "object", "string")
_COLUMN_TYPES = ("boolean", "date", "integer", "number", "string")
_COLUMN_FORMATS = ("byte", "date", "date-time", "double", "float", "int32", "int64", "password")
_UNSUPPORTED = {
    "id": "id is not supported", "additionalItems": "additionalItems is not supported",
    "patternProperties": "patternProperties is not supported", "definitions": "definitions is not supported",
    "dependencies": "dependencies is not supported", "$ref": "$ref is not supported",
}
APPROVAL_ANNOTATION = "api-approved.kubernetes.io"


def is_protected_group(group: str) -> bool:
    """Groups only Kubernetes itself may define CRDs in, without the approval annotation."""
    return group in ("k8s.io", "kubernetes.io") or group.endswith((".k8s.io", ".kubernetes.io"))


def _crd_name_fn(plural: str, group: str):
    def check(name: str, prefix: bool) -> list[str]:
        out = name_is_dns_subdomain(name, prefix)
        if name != f"{plural}.{group}":
            out.append('must be spec.names.plural+"."+spec.group')
        return out
    return check


def _validate_crd(crd: Any, errs: Errs) -> None:
    spec = crd.spec
    names = spec.names if spec is not None else None
    plural = (names.plural if names is not None else None) or ""
    group = (spec.group if spec is not None else None) or ""
    validate_object_meta(crd.metadata, errs, name_fn=_crd_name_fn(plural, group), namespaced=False)
    if spec is None:
        errs.append(required("spec"))
        return
    if not group:
        errs.append(required("spec.group"))
    elif is_dns1123_subdomain(group):
        errs.append(invalid("spec.group", group, ",".join(is_dns1123_subdomain(group))))
    elif len(group.split(".")) < 2:
        errs.append(invalid("spec.group", group, "should be a domain with at least one dot"))
    elif is_protected_group(group):
        annotations = (crd.metadata.annotations if crd.metadata is not None else None) or {}
        if APPROVAL_ANNOTATION not in annotations:
            errs.append(required(f"metadata.annotations[{APPROVAL_ANNOTATION}]",
                                 f'protected groups must have approval annotation "{APPROVAL_ANNOTATION}", '
                                 "see https://github.com/kubernetes/enhancements/pull/1111"))
    if not spec.scope:
        errs.append(required("spec.scope"))
    elif spec.scope not in _SCOPES:
        errs.append(not_supported("spec.scope", spec.scope, _SCOPES))
    _validate_names(names, errs)
    _validate_versions(spec, errs)
    if spec.preserve_unknown_fields:
        errs.append(invalid("spec.preserveUnknownFields", True, "must be false"))
    strategy = (spec.conversion or {}).get("strategy")
    if strategy not in (None, "None", "Webhook"):
        errs.append(not_supported("spec.conversion.strategy", strategy, ("None", "Webhook")))


def _validate_names(names: Any, errs: Errs) -> None:
    p = "spec.names"
    if names is None:
        for key in ("plural", "singular", "kind", "listKind"):
            errs.append(required(f"{p}.{key}"))
        return
    for key, value in (("plural", names.plural), ("singular", names.singular)):
        if not value:
            errs.append(required(f"{p}.{key}"))
        elif is_dns1035_label(value):
            errs.append(invalid(f"{p}.{key}", value, ",".join(is_dns1035_label(value))))
    for key, value in (("kind", names.kind), ("listKind", names.list_kind)):
        if not value:
            errs.append(required(f"{p}.{key}"))
        elif is_dns1035_label(value.lower()):
            errs.append(invalid(f"{p}.{key}", value, "may have mixed case, but should otherwise match: "
                                + ",".join(is_dns1035_label(value.lower()))))
    if names.kind and names.kind == names.list_kind:
        errs.append(invalid(f"{p}.listKind", names.list_kind, "kind and listKind may not be the same"))
    for key, values in (("shortNames", names.short_names), ("categories", names.categories)):
        for i, value in enumerate(values or []):
            if is_dns1035_label(value):
                errs.append(invalid(f"{p}.{key}[{i}]", value, ",".join(is_dns1035_label(value))))


def _validate_versions(spec: Any, errs: Errs) -> None:
    versions = spec.versions or []
    if not versions:
        errs.append(required("spec.versions", "must have exactly one version marked as storage version"))
        return
    seen: set[str] = set()
    storage = 0
    for i, version in enumerate(versions):
        path = f"spec.versions[{i}]"
        if not version.name:
            errs.append(required(f"{path}.name"))
        elif is_dns1035_label(version.name):
            errs.append(invalid(f"{path}.name", version.name, ",".join(is_dns1035_label(version.name))))
        if version.name in seen:
            errs.append(invalid("spec.versions", version.name, "must contain unique version names"))
        seen.add(version.name or "")
        storage += 1 if version.storage else 0
        schema = version.schema_.open_apiv3_schema if version.schema_ is not None else None
        if schema is None:
            errs.append(required(f"{path}.schema.openAPIV3Schema"))
        else:
            errs.extend(structural_errors(schema, f"{path}.schema.openAPIV3Schema"))
        for j, col in enumerate(version.additional_printer_columns or []):
            _validate_column(col, f"{path}.additionalPrinterColumns[{j}]", errs)
        subs = version.subresources
        if subs is not None and subs.scale is not None:
            _validate_scale(subs.scale, f"{path}.subresources", errs)
    if storage != 1:
        errs.append(invalid("spec.versions", [v.name for v in versions],
                            "must have exactly one version marked as storage version"))


def _simple_path(value: str | None, path: str, errs: Errs) -> bool:
    if not value:
        errs.append(invalid(path, value or "", "must not be empty"))
        return False
    if not value.startswith("."):
        errs.append(invalid(path, value, "must be a simple json path starting with ."))
        return False
    return True


def _validate_column(col: Any, path: str, errs: Errs) -> None:
    if not col.name:
        errs.append(required(f"{path}.name"))
    if not col.type:
        errs.append(required(f"{path}.type", f"must be one of {','.join(_COLUMN_TYPES)}"))
    elif col.type not in _COLUMN_TYPES:
        errs.append(invalid(f"{path}.type", col.type, f"must be one of {','.join(_COLUMN_TYPES)}"))
    if col.format and col.format not in _COLUMN_FORMATS:
        errs.append(invalid(f"{path}.format", col.format, f"must be one of {','.join(_COLUMN_FORMATS)}"))
    if not col.json_path:
        errs.append(required(f"{path}.JSONPath"))
    else:
        _simple_path(col.json_path, f"{path}.JSONPath", errs)


def _validate_scale(scale: Any, path: str, errs: Errs) -> None:
    for key, value, prefixes, where in (
        ("specReplicasPath", scale.spec_replicas_path, (".spec.",), ".spec"),
        ("statusReplicasPath", scale.status_replicas_path, (".status.",), ".status"),
        ("labelSelectorPath", scale.label_selector_path, (".spec.", ".status."), "either .spec or .status"),
    ):
        field = f"{path}.scale.{key}"
        if not value:
            if key != "labelSelectorPath":
                errs.append(required(field))
            continue
        if _simple_path(value, field, errs) and not value.startswith(prefixes):
            errs.append(invalid(field, value, f"should be a json path under {where}"))


def structural_errors(schema: Any, path: str) -> list[FieldError]:
    """Where ``schema`` is not structural, in Kubernetes' words (the cheap checks: a type on
    every specified node, items on arrays, the unsupported keywords, metadata at the root)."""
    errs: list[FieldError] = []
    if not isinstance(schema, dict):
        errs.append(invalid(path, "", "must be an object"))
        return errs
    if schema.get("type") != "object":
        if not schema.get("type"):
            errs.append(required(f"{path}.type", "must not be empty at the root"))
        else:
            errs.append(invalid(f"{path}.type", schema.get("type"), "must be object at the root"))
    if schema.get("nullable"):
        errs.append(forbidden(f"{path}.nullable", "nullable cannot be true at the root"))
    if "additionalProperties" in schema and schema.get("additionalProperties") not in (None, False):
        errs.append(forbidden(f"{path}.additionalProperties", "must not be used at the root"))
    props = schema.get("properties")
    if isinstance(props, dict):
        meta = props.get("metadata")
        if isinstance(meta, dict):
            if meta.get("type") not in (None, "object"):
                errs.append(invalid(f"{path}.properties[metadata].type", meta.get("type"), "must be object"))
            extra = set(meta) - {"type", "description"}
            meta_props = meta.get("properties")
            if extra - {"properties"} or (isinstance(meta_props, dict) and set(meta_props) - {"name", "generateName"}):
                errs.append(forbidden(f"{path}.properties[metadata]", "must not specify anything other than name "
                                      "and generateName, but metadata is implicitly specified"))
        for key in ("kind", "apiVersion"):
            sub = props.get(key)
            if isinstance(sub, dict) and sub.get("type") not in (None, "string"):
                errs.append(invalid(f"{path}.properties[{key}].type", sub.get("type"), "must be string"))
    _node(schema, path, errs, "root")
    return errs


def _node(schema: dict[str, Any], path: str, errs: list[FieldError], level: str) -> None:
    for key, detail in _UNSUPPORTED.items():
        if key in schema:
            errs.append(forbidden(f"{path}.{key}", detail))
    t = schema.get("type")
    if t == "null":
        errs.append(forbidden(f"{path}.type", "type cannot be set to null, use nullable as an alternative"))
    elif t is not None and t not in _TYPES:
        errs.append(not_supported(f"{path}.type", t, _TYPES))
    special = schema.get("x-kubernetes-int-or-string") or schema.get("x-kubernetes-preserve-unknown-fields")
    if level != "root" and not t and not special:
        what = "specified array items" if level == "items" else "specified object fields"
        errs.append(required(f"{path}.type", f"must not be empty for {what}"))
    if schema.get("x-kubernetes-preserve-unknown-fields") is False:
        errs.append(invalid(f"{path}.x-kubernetes-preserve-unknown-fields", False, "must be true or undefined"))
    if schema.get("x-kubernetes-int-or-string") and schema.get("x-kubernetes-preserve-unknown-fields"):
        errs.append(invalid(f"{path}.x-kubernetes-preserve-unknown-fields", True,
                            "must be false if x-kubernetes-int-or-string is true"))
    props = schema.get("properties")
    additional = schema.get("additionalProperties")
    if isinstance(props, dict) and props and isinstance(additional, dict | bool) and additional is not False:
        errs.append(forbidden(f"{path}.additionalProperties", "additionalProperties and properties are mutual "
                                                              "exclusive"))
    if t == "array":
        items = schema.get("items")
        if items is None:
            errs.append(required(f"{path}.items", "must be specified"))
        elif isinstance(items, list):
            errs.append(forbidden(f"{path}.items", "items must be a schema object and not an array"))
        elif isinstance(items, dict):
            _node(items, f"{path}.items", errs, "items")
    if isinstance(props, dict):
        for name, sub in props.items():
            if isinstance(sub, dict):
                _node(sub, f"{path}.properties[{name}]", errs, "field")
    if isinstance(additional, dict):
        _node(additional, f"{path}.additionalProperties", errs, "field")


def _validate_crd_update(crd: Any, old: Any, errs: Errs) -> None:
    new_spec, old_spec = crd.spec, old.spec
    if new_spec is None or old_spec is None:
        return
    if new_spec.group != old_spec.group:
        errs.append(invalid("spec.group", new_spec.group, "field is immutable"))
    if new_spec.scope != old_spec.scope:
        errs.append(invalid("spec.scope", new_spec.scope, "field is immutable"))
    new_names, old_names = new_spec.names, old_spec.names
    if new_names is not None and old_names is not None:
        if new_names.plural != old_names.plural:
            errs.append(invalid("spec.names.plural", new_names.plural, "field is immutable"))
        if new_names.kind != old_names.kind:
            errs.append(invalid("spec.names.kind", new_names.kind, "field is immutable"))


def _register() -> None:
    from gpufleet.api.apiextensions import CustomResourceDefinition

    register_validator(CustomResourceDefinition, _validate_crd, _validate_crd_update)


_register()
