"""Kubernetes validation for the built-in kinds, reporting every problem at once.

``validate_create(obj)`` and ``validate_update(obj, old)`` return a list of
:class:`FieldError` (empty when the object is valid) and never stop at the first problem, so
a user fixing a manifest sees everything wrong with it in one round trip. Errors carry the
JSON path of the field (``spec.template.spec.containers[0].image``) and render with
:meth:`FieldError.message` exactly as Kubernetes' ``field.Error`` does, so messages, tests and
tooling written against a real cluster read the same here.

The rules follow ``pkg/apis/*/validation`` and apimachinery's name and label rules. The API
server applies defaults (:mod:`gpufleet.api.defaults`) before validating; values that
defaulting would fill in (``None`` here) are accepted, so the functions can also check a
manifest on the client side before it is sent. Where gpufleet deliberately differs from
Kubernetes the code says so.

The names below are loaded from their submodules when first used (PEP 562), so a process
that needs one rule (a label check, say) does not load every kind's validation and the typed
models behind it.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the submodule that defines it
_EXPORTS: dict[str, str] = {
    "MAX_PERIOD_SECONDS": "autoscaling",
    "MAX_STABILIZATION_WINDOW_SECONDS": "autoscaling",
    "METRIC_SOURCE_TYPES": "autoscaling",
    "METRIC_TARGET_TYPES": "autoscaling",
    "SCALING_POLICY_TYPES": "autoscaling",
    "SELECT_POLICIES": "autoscaling",
    "endpoints_addresses": "cluster",
    "validate_non_special_ip": "cluster",
    "DNS_POLICIES": "containers",
    "HOST_PATH_TYPES": "containers",
    "HTTP_SCHEMES": "containers",
    "PORT_PROTOCOLS": "containers",
    "PREEMPTION_POLICIES": "containers",
    "PULL_POLICIES": "containers",
    "RESTART_POLICIES": "containers",
    "TAINT_EFFECTS": "containers",
    "TERMINATION_MESSAGE_POLICIES": "containers",
    "TOLERATION_OPERATORS": "containers",
    "UNSATISFIABLE_CONSTRAINT_ACTIONS": "containers",
    "Errs": "core",
    "INTEGER_RESOURCES": "core",
    "STANDARD_CONTAINER_RESOURCES": "core",
    "STANDARD_FINALIZERS": "core",
    "STANDARD_QUOTA_RESOURCES": "core",
    "is_extended_resource": "core",
    "is_hugepages_resource": "core",
    "is_native_resource": "core",
    "overcommit_allowed": "core",
    "selector_is_empty": "core",
    "selector_matches": "core",
    "validate_annotations": "core",
    "validate_label_selector": "core",
    "validate_labels": "core",
    "validate_object_meta": "core",
    "validate_object_meta_update": "core",
    "validate_resource_requirements": "core",
    "CreateFn": "dispatch",
    "UpdateFn": "dispatch",
    "register_validator": "dispatch",
    "validate": "dispatch",
    "validate_create": "dispatch",
    "validate_update": "dispatch",
    "DUPLICATE": "errors",
    "FORBIDDEN": "errors",
    "FieldError": "errors",
    "INVALID": "errors",
    "NOT_FOUND": "errors",
    "NOT_SUPPORTED": "errors",
    "REQUIRED": "errors",
    "TOO_LONG": "errors",
    "TYPE_INVALID": "errors",
    "Unquoted": "errors",
    "aggregate_message": "errors",
    "duplicate": "errors",
    "forbidden": "errors",
    "go_quote": "errors",
    "go_value": "errors",
    "invalid": "errors",
    "not_found": "errors",
    "not_supported": "errors",
    "required": "errors",
    "too_long": "errors",
    "type_invalid": "errors",
    "CONFIG_MAP_KEY_FMT": "names",
    "DNS1035_LABEL_FMT": "names",
    "DNS1123_LABEL_FMT": "names",
    "DNS1123_LABEL_MAX": "names",
    "DNS1123_SUBDOMAIN_FMT": "names",
    "DNS1123_SUBDOMAIN_MAX": "names",
    "ENV_VAR_NAME_FMT": "names",
    "HIGHEST_USER_PRIORITY": "names",
    "HTTP_HEADER_NAME_FMT": "names",
    "LABEL_VALUE_FMT": "names",
    "LABEL_VALUE_MAX": "names",
    "MAX_INT32": "names",
    "MAX_SECRET_SIZE": "names",
    "NODE_PORT_RANGE": "names",
    "NameFn": "names",
    "PERCENT_FMT": "names",
    "QUALIFIED_NAME_FMT": "names",
    "QUALIFIED_NAME_MAX": "names",
    "QUANTITY_FMT": "names",
    "SYSTEM_PRIORITY_CLASSES": "names",
    "TOTAL_ANNOTATION_SIZE_LIMIT": "names",
    "inclusive_range_error": "names",
    "is_config_map_key": "names",
    "is_dns1035_label": "names",
    "is_dns1123_label": "names",
    "is_dns1123_subdomain": "names",
    "is_env_var_name": "names",
    "is_label_value": "names",
    "is_qualified_name": "names",
    "is_valid_path_segment_name": "names",
    "is_valid_percent": "names",
    "is_valid_port_name": "names",
    "is_valid_port_num": "names",
    "max_len_error": "names",
    "name_is_dns1035_label": "names",
    "name_is_dns_label": "names",
    "name_is_dns_subdomain": "names",
    "regex_error": "names",
    "UPDATABLE_POD_SPEC_FIELDS": "pods",
    "validate_pod_spec": "pods",
    "validate_pod_template": "pods",
    "validate_tolerations": "pods",
    "LIMIT_TYPES": "quota",
    "QUOTA_SCOPES": "quota",
    "SERVICE_TYPES": "services",
    "SESSION_AFFINITIES": "services",
    "ACCESS_MODES": "storage",
    "CLASS_RECLAIM_POLICIES": "storage",
    "MAX_PROVISIONER_PARAMETERS": "storage",
    "MAX_PROVISIONER_PARAMETER_BYTES": "storage",
    "PVC_IMMUTABLE_DETAIL": "storage",
    "PV_RECLAIM_POLICIES": "storage",
    "VOLUME_BINDING_MODES": "storage",
    "VOLUME_MODES": "storage",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    sub = _EXPORTS.get(name)
    if sub is None:
        try:  # a submodule: gpufleet.api.validation.errors
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{sub}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
