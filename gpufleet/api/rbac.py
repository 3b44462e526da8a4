"""rbac.authorization.k8s.io/v1: Role, ClusterRole, RoleBinding, ClusterRoleBinding.

The models are the generated ones in k8s.py; this module adds Kubernetes' validation for
them (pkg/apis/rbac/validation): names are path segments (``system:node`` is fine), rules
name verbs and either resources with API groups or non-resource URLs, and a binding's
roleRef names a role of this group and never changes.
"""

from __future__ import annotations

from typing import Any

from gpufleet.api import validation as v
from gpufleet.api.k8s import ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding

GROUP = "rbac.authorization.k8s.io"
SUBJECT_KINDS = ("ServiceAccount", "User", "Group")

__all__ = ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "GROUP"]


def _path_segment(name: str, prefix: bool) -> list[str]:
    return v.is_valid_path_segment_name(name)


def _rules(rules: list[PolicyRule] | None, namespaced: bool, errs: list[v.FieldError]) -> None:
    for i, rule in enumerate(rules or []):
        path = f"rules[{i}]"
        if not rule.verbs:
            errs.append(v.required(f"{path}.verbs", "verbs must contain at least one value"))
        if rule.non_resource_urls:
            if namespaced:
                errs.append(v.invalid(f"{path}.nonResourceURLs", rule.non_resource_urls,
                                      "namespaced rules cannot apply to non-resource URLs"))
            if rule.api_groups or rule.resources or rule.resource_names:
                errs.append(v.invalid(f"{path}.nonResourceURLs", rule.non_resource_urls,
                                      "rules cannot apply to both regular resources and non-resource URLs"))
            continue
        if not rule.api_groups:
            errs.append(v.required(f"{path}.apiGroups", "resource rules must supply at least one api group"))
        if not rule.resources:
            errs.append(v.required(f"{path}.resources", "resource rules must supply at least one resource"))


def _validate_role(role: Any, errs: list[v.FieldError]) -> None:
    namespaced = isinstance(role, Role)
    v.validate_object_meta(role.metadata, errs, name_fn=_path_segment, namespaced=namespaced)
    _rules(role.rules, namespaced, errs)


def _validate_binding(binding: Any, errs: list[v.FieldError]) -> None:
    namespaced = isinstance(binding, RoleBinding)
    v.validate_object_meta(binding.metadata, errs, name_fn=_path_segment, namespaced=namespaced)
    ref = binding.role_ref
    if ref.api_group != GROUP:
        errs.append(v.not_supported("roleRef.apiGroup", ref.api_group or "", [GROUP]))
    kinds = ["Role", "ClusterRole"] if namespaced else ["ClusterRole"]
    if ref.kind not in kinds:
        errs.append(v.not_supported("roleRef.kind", ref.kind, kinds))
    if not ref.name:
        errs.append(v.required("roleRef.name"))
    else:
        for msg in v.is_valid_path_segment_name(ref.name):
            errs.append(v.invalid("roleRef.name", ref.name, msg))
    for i, s in enumerate(binding.subjects or []):
        path = f"subjects[{i}]"
        if s.kind not in SUBJECT_KINDS:
            errs.append(v.not_supported(f"{path}.kind", s.kind, SUBJECT_KINDS))
            continue
        if not s.name:
            errs.append(v.required(f"{path}.name"))
        if s.kind == "ServiceAccount":
            if s.api_group:
                errs.append(v.not_supported(f"{path}.apiGroup", s.api_group, [""]))
            if not namespaced and not s.namespace:
                errs.append(v.required(f"{path}.namespace"))
        elif s.api_group not in (GROUP, None, ""):
            errs.append(v.not_supported(f"{path}.apiGroup", s.api_group, [GROUP]))


def _validate_binding_update(new: Any, old: Any, errs: list[v.FieldError]) -> None:
    if new.role_ref != old.role_ref:
        errs.append(v.invalid("roleRef", new.role_ref.to_dict(), "cannot change roleRef"))


for _model in (Role, ClusterRole):
    v.register_validator(_model, _validate_role)
for _model in (RoleBinding, ClusterRoleBinding):
    v.register_validator(_model, _validate_binding, _validate_binding_update)
