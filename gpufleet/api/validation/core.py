"""Shared pieces of the kind validators: small checks, object metadata, label selectors, resources."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from pydantic import BaseModel

from gpufleet.api import k8s
from gpufleet.api.quantity import parse_quantity
from gpufleet.api.validation.errors import (
    FieldError,
    Unquoted,
    forbidden,
    invalid,
    not_supported,
    required,
    too_long,
    type_invalid,
)
from gpufleet.api.validation.names import (
    QUANTITY_FMT,
    TOTAL_ANNOTATION_SIZE_LIMIT,
    NameFn,
    is_dns1123_label,
    is_label_value,
    is_qualified_name,
    name_is_dns_subdomain,
)

# --- small helpers ----------------------------------------------------------------------

Errs = list[FieldError]


def _nonneg(value: int | None, path: str, errs: Errs) -> None:
    if value is not None and value < 0:
        errs.append(invalid(path, value, "must be greater than or equal to 0"))


def _enum(value: str | None, path: str, valid: list[str], errs: Errs) -> None:
    """Unset means "will be defaulted"; an explicitly empty string is missing."""
    if value is None:
        return
    if value == "":
        errs.append(required(path))
    elif value not in valid:
        errs.append(not_supported(path, value, valid))


def _names(value: str, path: str, fn: Callable[[str], list[str]], errs: Errs) -> None:
    errs.extend(invalid(path, value, msg) for msg in fn(value))


def _int_or_string(value: Any, path: str, errs: Errs) -> int | str | None:
    """Int-or-string fields arrive untyped; anything else is a decoding error in Kubernetes."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str):
        return value
    errs.append(type_invalid(path, value, "must be an integer or a string"))
    return None


def _quantity(raw: Any, path: str, errs: Errs) -> Fraction | None:
    try:
        return parse_quantity(raw)
    except ValueError:
        errs.append(invalid(path, raw, f"quantities must match the regular expression '{QUANTITY_FMT}'"))
        return None


def _normalized(value: Any) -> Any:
    """JSON form for equality: unset, empty lists and empty maps are the same, as in Go."""
    if isinstance(value, BaseModel):
        value = value.model_dump(by_alias=True, exclude_none=True, mode="json")
    if isinstance(value, dict):
        out = {k: _normalized(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def _semantic_equal(a: Any, b: Any) -> bool:
    return (_normalized(a) or None) == (_normalized(b) or None)


def _immutable(new: Any, old: Any, path: str, errs: Errs) -> None:
    if not _semantic_equal(new, old):
        errs.append(invalid(path, new, "field is immutable"))


def _diff(old: Any, new: Any, path: str, out: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            _diff(old.get(key), new.get(key), f"{path}.{key}" if path else key, out)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            _diff(a, b, f"{path}[{i}]", out)
    elif old != new:
        out.append(f"{path}: {_short(old)} -> {_short(new)}")


def _short(value: Any) -> str:
    text = "<unset>" if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


# --- metadata ---------------------------------------------------------------------------

STANDARD_FINALIZERS = {"kubernetes", "orphan", "foregroundDeletion"}


def validate_labels(labels: Mapping[str, str] | None, path: str, errs: Errs) -> None:
    for key, value in (labels or {}).items():
        _names(key, path, is_qualified_name, errs)
        _names(value, path, is_label_value, errs)


def validate_annotations(annotations: Mapping[str, str] | None, path: str, errs: Errs) -> None:
    total = 0
    for key, value in (annotations or {}).items():
        # Annotation keys are qualified names where case does not matter.
        errs.extend(invalid(path, key, msg) for msg in is_qualified_name(key.lower()))
        total += len(key.encode()) + len(value.encode())
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        errs.append(too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT))


def _validate_finalizers(finalizers: list[str] | None, path: str, errs: Errs) -> None:
    for i, name in enumerate(finalizers or []):
        _names(name, path, is_qualified_name, errs)
        if "/" not in name and name not in STANDARD_FINALIZERS:
            errs.append(
                invalid(
                    f"{path}[{i}]",
                    name,
                    "name is neither a standard finalizer name nor is it fully qualified",
                )
            )
    names = set(finalizers or [])
    if {"orphan", "foregroundDeletion"} <= names:
        errs.append(invalid(path, finalizers, "finalizer orphan and foregroundDeletion cannot be both set"))


def _validate_owner_references(refs: list[k8s.OwnerReference] | None, path: str, errs: Errs) -> None:
    controller = ""
    for ref in refs or []:
        if not ref.api_version or not ref.api_version.rpartition("/")[2]:
            errs.append(invalid(f"{path}.apiVersion", ref.api_version, "version must not be empty"))
        if not ref.kind:
            errs.append(invalid(f"{path}.kind", ref.kind, "kind must not be empty"))
        if not ref.name:
            errs.append(invalid(f"{path}.name", ref.name, "name must not be empty"))
        if not ref.uid:
            errs.append(invalid(f"{path}.uid", ref.uid, "uid must not be empty"))
        if ref.controller:
            current = f"{ref.kind}/{ref.name}"
            if controller:
                errs.append(
                    invalid(
                        path,
                        [f"{r.kind}/{r.name}" for r in refs or []],
                        "Only one reference can have Controller set to true. "
                        f'Found "true" in references for {controller} and {current}',
                    )
                )
            else:
                controller = current


def validate_object_meta(
    meta: k8s.ObjectMeta | None,
    errs: Errs,
    *,
    name_fn: NameFn = name_is_dns_subdomain,
    namespaced: bool = True,
    path: str = "metadata",
) -> None:
    """Kubernetes' ValidateObjectMeta, except that a missing namespace is accepted.

    The API server puts the namespace from the URL into the object (and rejects a mismatch)
    before validating, so "namespace consistency" is its job, not this function's.
    """
    if meta is None:
        errs.append(required(f"{path}.name", "name or generateName is required"))
        return
    if meta.generate_name:
        for msg in name_fn(meta.generate_name, True):
            errs.append(invalid(f"{path}.generateName", meta.generate_name, msg))
    if not meta.name:
        if not meta.generate_name:
            errs.append(required(f"{path}.name", "name or generateName is required"))
    else:
        for msg in name_fn(meta.name, False):
            errs.append(invalid(f"{path}.name", meta.name, msg))
    if meta.namespace:
        if not namespaced:
            errs.append(forbidden(f"{path}.namespace", "not allowed on this type"))
        else:
            _names(meta.namespace, f"{path}.namespace", is_dns1123_label, errs)
    _nonneg(meta.generation, f"{path}.generation", errs)
    validate_labels(meta.labels, f"{path}.labels", errs)
    validate_annotations(meta.annotations, f"{path}.annotations", errs)
    _validate_owner_references(meta.owner_references, f"{path}.ownerReferences", errs)
    _validate_finalizers(meta.finalizers, f"{path}.finalizers", errs)


def validate_object_meta_update(new: k8s.ObjectMeta | None, old: k8s.ObjectMeta | None, errs: Errs) -> None:
    """Identity fields may not change; a field left unset in the new object is filled in by the
    server from the stored one (as Kubernetes' update path does), so only a different value is an error.
    """
    new = new or k8s.ObjectMeta()
    old = old or k8s.ObjectMeta()
    for attr, alias in (
        ("name", "name"),
        ("namespace", "namespace"),
        ("uid", "uid"),
        ("creation_timestamp", "creationTimestamp"),
    ):
        value = getattr(new, attr)
        if value not in (None, "") and value != getattr(old, attr):
            errs.append(invalid(f"metadata.{alias}", value, "field is immutable"))


# --- label selectors --------------------------------------------------------------------


def validate_label_selector(selector: k8s.LabelSelector | None, path: str, errs: Errs) -> bool:
    """Returns whether the selector is usable for matching."""
    if selector is None:
        return True
    usable = True
    validate_labels(selector.match_labels, f"{path}.matchLabels", errs)
    for i, req in enumerate(selector.match_expressions or []):
        p = f"{path}.matchExpressions[{i}]"
        if req.operator in ("In", "NotIn"):
            if not req.values:
                errs.append(required(f"{p}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
        elif req.operator in ("Exists", "DoesNotExist"):
            if req.values:
                errs.append(
                    forbidden(
                        f"{p}.values", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                    )
                )
        else:
            errs.append(invalid(f"{p}.operator", req.operator, "not a valid selector operator"))
            usable = False
        _names(req.key, f"{p}.key", is_qualified_name, errs)
        for j, value in enumerate(req.values or []):
            _names(value, f"{p}.values[{j}]", is_label_value, errs)
    return usable


def selector_is_empty(selector: k8s.LabelSelector | None) -> bool:
    return selector is None or (not selector.match_labels and not selector.match_expressions)


def selector_matches(selector: k8s.LabelSelector | None, labels: Mapping[str, str] | None) -> bool:
    """Kubernetes' LabelSelectorAsSelector(...).Matches; an empty selector matches everything."""
    labels = labels or {}
    if selector is None:
        return True
    for key, value in (selector.match_labels or {}).items():
        if labels.get(key) != value:
            return False
    for req in selector.match_expressions or []:
        present = req.key in labels
        if req.operator == "In" and not (present and labels[req.key] in (req.values or [])):
            return False
        if req.operator == "NotIn" and present and labels[req.key] in (req.values or []):
            return False
        if req.operator == "Exists" and not present:
            return False
        if req.operator == "DoesNotExist" and present:
            return False
    return True


# --- resources --------------------------------------------------------------------------

STANDARD_CONTAINER_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
INTEGER_RESOURCES = {
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "services.nodeports",
    "services.loadbalancers",
}
STANDARD_QUOTA_RESOURCES = INTEGER_RESOURCES | {
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.storage",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
}


def is_native_resource(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def is_hugepages_resource(name: str) -> bool:
    return name.startswith("hugepages-")


def is_extended_resource(name: str) -> bool:
    """Vendor resources such as ``nvidia.com/gpu``: whole units, never overcommitted."""
    if is_native_resource(name) or name.startswith("requests."):
        return False
    return not is_qualified_name("requests." + name)


def overcommit_allowed(name: str) -> bool:
    return is_native_resource(name) and not is_hugepages_resource(name)


def _validate_resource_name(name: str, path: str, errs: Errs) -> bool:
    before = len(errs)
    _names(name, path, is_qualified_name, errs)
    return len(errs) == before


def _validate_container_resource_name(name: str, path: str, errs: Errs) -> None:
    if not _validate_resource_name(name, path, errs):
        return
    if "/" not in name:
        if name not in STANDARD_CONTAINER_RESOURCES and not is_hugepages_resource(name):
            errs.append(invalid(path, name, "must be a standard resource for containers"))
    elif not is_native_resource(name) and not is_extended_resource(name):
        errs.append(invalid(path, name, "doesn't follow extended resource name standard"))


def _validate_quantity_value(name: str, raw: Any, path: str, errs: Errs) -> Fraction | None:
    value = _quantity(raw, path, errs)
    if value is None:
        return None
    if value < 0:
        errs.append(invalid(path, str(raw), "must be greater than or equal to 0"))
    if (name in INTEGER_RESOURCES or is_extended_resource(name)) and value.denominator != 1:
        errs.append(invalid(path, Unquoted(str(raw)), "must be an integer"))
    return value


def validate_resource_requirements(res: k8s.ResourceRequirements | None, path: str, errs: Errs) -> None:
    if res is None:
        return
    lim_path, req_path = f"{path}.limits", f"{path}.requests"
    limits: dict[str, Fraction | None] = {}
    for name, raw in (res.limits or {}).items():
        p = f"{lim_path}[{name}]"
        _validate_container_resource_name(name, p, errs)
        limits[name] = _validate_quantity_value(name, raw, p, errs)
    for name, raw in (res.requests or {}).items():
        p = f"{req_path}[{name}]"
        _validate_container_resource_name(name, p, errs)
        request = _validate_quantity_value(name, raw, p, errs)
        if name in limits:
            limit = limits[name]
            if request is None or limit is None:
                continue
            limit_raw = str((res.limits or {})[name])
            # Extended resources such as GPUs cannot be overcommitted: the request is the limit.
            if request != limit and not overcommit_allowed(name):
                errs.append(invalid(req_path, str(raw), f"must be equal to {name} limit of {limit_raw}"))
            elif request > limit:
                errs.append(
                    invalid(req_path, str(raw), f"must be less than or equal to {name} limit of {limit_raw}")
                )
        elif not overcommit_allowed(name):
            errs.append(required(lim_path, "Limit must be set for non overcommitable resources"))
