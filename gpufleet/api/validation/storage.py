"""PersistentVolume, PersistentVolumeClaim and StorageClass."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from gpufleet.api import k8s
from gpufleet.api.quantity import parse_quantity
from gpufleet.api.validation.containers import _alias, _no_backsteps, _validate_host_path
from gpufleet.api.validation.core import (
    Errs,
    _diff,
    _immutable,
    _names,
    _normalized,
    _quantity,
    validate_label_selector,
    validate_object_meta,
)
from gpufleet.api.validation.errors import duplicate, forbidden, invalid, not_supported, required, too_long
from gpufleet.api.validation.names import is_label_value, is_qualified_name, name_is_dns_subdomain
from gpufleet.api.validation.pods import _validate_node_selector_requirement

ACCESS_MODES = ["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"]
VOLUME_MODES = ["Block", "Filesystem"]
PV_RECLAIM_POLICIES = ["Delete", "Recycle", "Retain"]
CLASS_RECLAIM_POLICIES = ["Delete", "Retain"]
VOLUME_BINDING_MODES = ["Immediate", "WaitForFirstConsumer"]
MAX_PROVISIONER_PARAMETERS = 512
MAX_PROVISIONER_PARAMETER_BYTES = 256 * 1024
_BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"
# PersistentVolumeSpec's volume sources (everything that is not a property of the volume).
_PV_NOT_SOURCES = {
    "access_modes", "capacity", "claim_ref", "mount_options", "node_affinity",
    "persistent_volume_reclaim_policy", "storage_class_name", "volume_attributes_class_name", "volume_mode",
}
_PV_SOURCES = [f for f in k8s.PersistentVolumeSpec.model_fields if f not in _PV_NOT_SOURCES]
PVC_IMMUTABLE_DETAIL = (
    "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"
)


def _validate_access_modes(modes: list[str] | None, path: str, errs: Errs, required_detail: str = "") -> None:
    if not modes:
        errs.append(required(path, required_detail))
    once_pod = other = False
    for mode in modes or []:
        if mode not in ACCESS_MODES:
            errs.append(not_supported(path, mode, ACCESS_MODES))
        elif mode == "ReadWriteOncePod":
            once_pod = True
        else:
            other = True
    if once_pod and other:
        errs.append(forbidden(path, "may not use ReadWriteOncePod with other access modes"))


def _positive_quantity(raw: Any, path: str, errs: Errs) -> Fraction | None:
    q = _quantity(raw, path, errs)
    if q is not None and q <= 0:
        errs.append(invalid(path, str(raw), "must be greater than zero"))
        return None
    return q


def _validate_node_selector(selector: k8s.NodeSelector, path: str, errs: Errs) -> None:
    tp = f"{path}.nodeSelectorTerms"
    if not selector.node_selector_terms:
        errs.append(required(tp, "must have at least one node selector term"))
    for i, term in enumerate(selector.node_selector_terms or []):
        for j, r in enumerate(term.match_expressions or []):
            _validate_node_selector_requirement(r, f"{tp}[{i}].matchExpressions[{j}]", errs)
        for j, r in enumerate(term.match_fields or []):
            fp = f"{tp}[{i}].matchFields[{j}]"
            if r.key != "metadata.name":
                errs.append(not_supported(f"{fp}.key", r.key, ["metadata.name"]))
            if r.operator in ("In", "NotIn"):
                if len(r.values or []) != 1:
                    errs.append(required(f"{fp}.values", "must be only one value when `operator` is 'In' or "
                                                          "'NotIn' for node field selector"))
            elif r.operator in ("Exists", "DoesNotExist", "Gt", "Lt"):
                errs.append(not_supported(f"{fp}.operator", r.operator, ["In", "NotIn"]))
            else:
                errs.append(invalid(f"{fp}.operator", r.operator, "not a valid selector operator"))


def _validate_storage_class_name(name: str | None, path: str, errs: Errs) -> None:
    if name:
        errs.extend(invalid(path, name, msg) for msg in name_is_dns_subdomain(name, False))


def _validate_pv(pv: k8s.PersistentVolume, errs: Errs) -> None:
    validate_object_meta(pv.metadata, errs, namespaced=False)
    spec = pv.spec or k8s.PersistentVolumeSpec()
    _validate_access_modes(spec.access_modes, "spec.accessModes", errs)
    capacity = spec.capacity or {}
    if not capacity:
        errs.append(required("spec.capacity"))
    if "storage" not in capacity or len(capacity) > 1:
        errs.append(not_supported("spec.capacity", capacity, ["storage"]))
    for name, raw in capacity.items():
        _positive_quantity(raw, f"spec.capacity[{name}]", errs)
    _validate_storage_class_name(spec.storage_class_name, "spec.storageClassName", errs)
    if spec.volume_mode is not None and spec.volume_mode not in VOLUME_MODES:
        errs.append(not_supported("spec.volumeMode", spec.volume_mode, VOLUME_MODES))
    policy = spec.persistent_volume_reclaim_policy
    if policy and policy not in PV_RECLAIM_POLICIES:
        errs.append(not_supported("spec.persistentVolumeReclaimPolicy", policy, PV_RECLAIM_POLICIES))
    has_affinity = spec.node_affinity is not None
    if spec.node_affinity is not None:
        if spec.node_affinity.required is None:
            errs.append(required("spec.nodeAffinity.required", "must specify required node constraints"))
        else:
            _validate_node_selector(spec.node_affinity.required, "spec.nodeAffinity.required", errs)
    sources = [attr for attr in _PV_SOURCES if getattr(spec, attr) is not None]
    if not sources:
        errs.append(required("spec", "must specify a volume type"))
    for attr in sources[1:]:
        errs.append(forbidden(f"spec.{_alias(k8s.PersistentVolumeSpec, attr)}", "may not specify more than 1 volume type"))
    if spec.host_path is not None:
        _validate_host_path(spec.host_path, "spec.hostPath", errs)
        if spec.host_path.path and spec.host_path.path.rstrip("/") == "" and policy == "Recycle":
            errs.append(forbidden("spec.persistentVolumeReclaimPolicy", "may not be 'recycle' for a hostPath mount of '/'"))
    if spec.local is not None:
        if not spec.local.path:
            errs.append(required("spec.local.path"))
        else:
            if not spec.local.path.startswith("/"):
                errs.append(invalid("spec.local.path", spec.local.path, "must be an absolute path"))
            _no_backsteps(spec.local.path, "spec.local.path", errs)
        if not has_affinity:
            errs.append(required("spec.nodeAffinity", "Local volume requires node affinity"))


def _pv_sources(spec: k8s.PersistentVolumeSpec | None) -> dict[str, Any]:
    spec = spec or k8s.PersistentVolumeSpec()
    return {_alias(k8s.PersistentVolumeSpec, a): _normalized(getattr(spec, a)) for a in _PV_SOURCES
            if getattr(spec, a) is not None}


def _validate_pv_update(new: k8s.PersistentVolume, old: k8s.PersistentVolume, errs: Errs) -> None:
    before, after = _pv_sources(old.spec), _pv_sources(new.spec)
    if before != after:
        changes: list[str] = []
        _diff(before, after, "spec", changes)
        errs.append(forbidden("spec.persistentvolumesource", "spec.persistentvolumesource is immutable after "
                              "creation\n" + "\n".join("  " + c for c in changes)))
    new_spec, old_spec = new.spec or k8s.PersistentVolumeSpec(), old.spec or k8s.PersistentVolumeSpec()
    _immutable(new_spec.volume_mode, old_spec.volume_mode, "spec.volumeMode", errs)
    if old_spec.node_affinity is not None:
        _immutable(new_spec.node_affinity, old_spec.node_affinity, "spec.nodeAffinity", errs)


def _validate_pvc_spec(spec: k8s.PersistentVolumeClaimSpec, path: str, errs: Errs) -> None:
    _validate_access_modes(spec.access_modes, f"{path}.accessModes", errs, "at least 1 access mode is required")
    if spec.selector is not None:
        validate_label_selector(spec.selector, f"{path}.selector", errs)
    requests = (spec.resources.requests if spec.resources is not None else None) or {}
    storage_path = f"{path}.resources[storage]"
    if "storage" not in requests:
        errs.append(required(storage_path))
    else:
        _positive_quantity(requests["storage"], storage_path, errs)
    _validate_storage_class_name(spec.storage_class_name, f"{path}.storageClassName", errs)
    if spec.volume_mode is not None and spec.volume_mode not in VOLUME_MODES:
        errs.append(not_supported(f"{path}.volumeMode", spec.volume_mode, VOLUME_MODES))
    for attr, alias in (("data_source", "dataSource"), ("data_source_ref", "dataSourceRef")):
        ref = getattr(spec, attr)
        if ref is None:
            continue
        if not ref.kind:
            errs.append(required(f"{path}.{alias}.kind"))
        if not ref.name:
            errs.append(required(f"{path}.{alias}.name"))


def _validate_pvc(pvc: k8s.PersistentVolumeClaim, errs: Errs) -> None:
    validate_object_meta(pvc.metadata, errs)
    _validate_pvc_spec(pvc.spec or k8s.PersistentVolumeClaimSpec(), "spec", errs)


def _storage_request(spec: k8s.PersistentVolumeClaimSpec) -> Fraction | None:
    raw = ((spec.resources.requests if spec.resources is not None else None) or {}).get("storage")
    try:
        return parse_quantity(raw) if raw is not None else None
    except ValueError:
        return None


def _validate_pvc_update(new: k8s.PersistentVolumeClaim, old: k8s.PersistentVolumeClaim, errs: Errs) -> None:
    new_spec = new.spec or k8s.PersistentVolumeClaimSpec()
    old_spec = old.spec or k8s.PersistentVolumeClaimSpec()
    new_ann = (new.metadata.annotations if new.metadata else None) or {}
    old_ann = (old.metadata.annotations if old.metadata else None) or {}
    if new_ann.get(_BETA_STORAGE_CLASS) != old_ann.get(_BETA_STORAGE_CLASS):
        errs.append(invalid(f"metadata.annotations.{_BETA_STORAGE_CLASS}", new_ann.get(_BETA_STORAGE_CLASS, ""),
                            "field is immutable"))
    after, before = _normalized(new_spec), _normalized(old_spec)
    # The PV controller binds a claim by naming its volume, once.
    if not before.get("volumeName"):
        before.pop("volumeName", None)
        after.pop("volumeName", None)
    # A claim created without any class may be given one later (the default class, set
    # retroactively once one exists), as Kubernetes allows since 1.28.
    if old_spec.storage_class_name is None and _BETA_STORAGE_CLASS not in old_ann:
        after.pop("storageClassName", None)
    # A bound claim grows by asking for more (the PersistentVolumeClaimResize admission
    # decides whether its class allows it).
    bound = new.status is not None and new.status.phase == "Bound"
    if bound:
        for spec in (before, after):
            requests = (spec.get("resources") or {}).get("requests") or {}
            requests.pop("storage", None)
        before, after = _normalized(before), _normalized(after)
    if before != after:
        changes: list[str] = []
        _diff(before, after, "spec", changes)
        errs.append(forbidden("spec", PVC_IMMUTABLE_DETAIL + "\n" + "\n".join("  " + c for c in changes)))
    old_size, new_size = _storage_request(old_spec), _storage_request(new_spec)
    if old_size is not None and new_size is not None and new_size < old_size:
        errs.append(forbidden("spec.resources.requests.storage", "field can not be less than previous value"))


def _validate_storage_class(sc: k8s.StorageClass, errs: Errs) -> None:
    validate_object_meta(sc.metadata, errs, namespaced=False)
    if not sc.provisioner:
        errs.append(required("provisioner"))
    else:
        _names(sc.provisioner.lower(), "provisioner", is_qualified_name, errs)
    params = sc.parameters or {}
    if len(params) > MAX_PROVISIONER_PARAMETERS:
        errs.append(too_long("parameters", MAX_PROVISIONER_PARAMETERS))
    else:
        total = 0
        for key, value in params.items():
            if not key:
                errs.append(invalid("parameters", key, "field can not be empty."))
            total += len(key) + len(value)
        if total > MAX_PROVISIONER_PARAMETER_BYTES:
            errs.append(too_long("parameters", MAX_PROVISIONER_PARAMETER_BYTES))
    if sc.reclaim_policy and sc.reclaim_policy not in CLASS_RECLAIM_POLICIES:
        errs.append(not_supported("reclaimPolicy", sc.reclaim_policy, CLASS_RECLAIM_POLICIES))
    if sc.volume_binding_mode is None:
        pass  # defaulted to Immediate before validation
    elif sc.volume_binding_mode not in VOLUME_BINDING_MODES:
        errs.append(not_supported("volumeBindingMode", sc.volume_binding_mode, VOLUME_BINDING_MODES))
    for i, term in enumerate(sc.allowed_topologies or []):
        tp = f"allowedTopologies[{i}].matchLabelExpressions"
        if not term.match_label_expressions:
            errs.append(required(tp, "must have at least one label expression"))
        keys: set[str] = set()
        for j, expr in enumerate(term.match_label_expressions or []):
            ep = f"{tp}[{j}]"
            _names(expr.key, f"{ep}.key", is_qualified_name, errs)
            if expr.key in keys:
                errs.append(duplicate(f"{ep}.key", expr.key))
            keys.add(expr.key)
            if not expr.values:
                errs.append(required(f"{ep}.values", "must specify as least one value"))
            for k, value in enumerate(expr.values or []):
                _names(value, f"{ep}.values[{k}]", is_label_value, errs)


def _validate_storage_class_update(new: k8s.StorageClass, old: k8s.StorageClass, errs: Errs) -> None:
    if (new.parameters or {}) != (old.parameters or {}):
        errs.append(forbidden("parameters", "updates to parameters are forbidden."))
    if new.provisioner != old.provisioner:
        errs.append(forbidden("provisioner", "updates to provisioner are forbidden."))
    if (new.reclaim_policy or "Delete") != (old.reclaim_policy or "Delete"):
        errs.append(forbidden("reclaimPolicy", "updates to reclaimPolicy are forbidden."))
    _immutable(new.volume_binding_mode, old.volume_binding_mode, "volumeBindingMode", errs)
