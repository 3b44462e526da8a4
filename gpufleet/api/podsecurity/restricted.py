"""The restricted checks."""

from __future__ import annotations

from collections.abc import Mapping

from gpufleet.api.podsecurity.checks import (
    CheckResult,
    Obj,
    _containers,
    _containers_phrase,
    _d,
    _is_zero,
    _join_quote,
    _list,
    _name,
    _plural,
    _relax_for_user_namespace,
    _sc,
    _seccomp,
    _windows,
)


def _allow_privilege_escalation_1_8(meta: Obj, spec: Obj) -> CheckResult | None:
    bad = [_name(c) for c in _containers(spec) if _d(_sc(c)).get("allowPrivilegeEscalation") is not False]
    if not bad:
        return None
    return CheckResult("allowPrivilegeEscalation != false",
                       f"{_containers_phrase(bad)} must set securityContext.allowPrivilegeEscalation=false")


def _allow_privilege_escalation_1_25(meta: Obj, spec: Obj) -> CheckResult | None:
    return None if _windows(spec) else _allow_privilege_escalation_1_8(meta, spec)


def _capabilities_restricted_1_22(meta: Obj, spec: Obj) -> CheckResult | None:
    missing_drop: list[str] = []
    adding: list[str] = []
    caps: set[str] = set()
    for c in _containers(spec):
        capabilities = _d(_sc(c)).get("capabilities")
        if not isinstance(capabilities, Mapping):
            missing_drop.append(_name(c))
            continue
        if "ALL" not in _list(capabilities.get("drop")):
            missing_drop.append(_name(c))
        extra = {str(a) for a in _list(capabilities.get("add")) if a != "NET_BIND_SERVICE"}
        if extra:
            caps |= extra
            adding.append(_name(c))
    details: list[str] = []
    if missing_drop:
        details.append(f'{_containers_phrase(missing_drop)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(f"{_containers_phrase(adding)} must not include {_join_quote(sorted(caps))} in "
                       "securityContext.capabilities.add")
    return CheckResult("unrestricted capabilities", "; ".join(details)) if details else None


def _capabilities_restricted_1_25(meta: Obj, spec: Obj) -> CheckResult | None:
    return None if _windows(spec) else _capabilities_restricted_1_22(meta, spec)


_ALLOWED_VOLUME_SOURCES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                           "persistentVolumeClaim", "projected", "secret")
# In Kubernetes' order: a volume is named by the first of these it sets.
_RESTRICTED_VOLUME_SOURCES = ("hostPath", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "nfs", "iscsi",
                              "glusterfs", "rbd", "flexVolume", "cinder", "cephfs", "flocker", "fc", "azureFile",
                              "vsphereVolume", "quobyte", "azureDisk", "photonPersistentDisk", "portworxVolume",
                              "scaleIO", "storageos")


def _restricted_volumes(meta: Obj, spec: Obj) -> CheckResult | None:
    bad: list[str] = []
    types: set[str] = set()
    for v in _list(spec.get("volumes")):
        v = _d(v)
        if any(v.get(k) is not None for k in _ALLOWED_VOLUME_SOURCES):
            continue
        bad.append(str(v.get("name") or ""))
        types.add(next((k for k in _RESTRICTED_VOLUME_SOURCES if v.get(k) is not None), "unknown"))
    if not bad:
        return None
    return CheckResult("restricted volume types",
                       f"{_plural('volume', 'volumes', len(bad))} {_join_quote(bad)} {_plural('uses', 'use', len(bad))} "
                       f"{_plural('restricted volume type', 'restricted volume types', len(types))} "
                       f"{_join_quote(sorted(types))}")


def _run_as_non_root_1_0(meta: Obj, spec: Obj) -> CheckResult | None:
    setters: list[str] = []
    pod_non_root = False
    pod_value = _d(_sc(spec)).get("runAsNonRoot")
    if pod_value is not None:
        if pod_value is False:
            setters.append("pod")
        else:
            pod_non_root = True
    explicit: list[str] = []
    implicit: list[str] = []
    for c in _containers(spec):
        value = _d(_sc(c)).get("runAsNonRoot")
        if value is not None:
            if value is False:
                explicit.append(_name(c))
        elif not pod_non_root:
            implicit.append(_name(c))
    if explicit:
        setters.append(_containers_phrase(explicit))
    if setters:
        return CheckResult("runAsNonRoot != true",
                           f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false")
    if implicit:
        return CheckResult("runAsNonRoot != true",
                           f"pod or {_containers_phrase(implicit)} must set securityContext.runAsNonRoot=true")
    return None


def _run_as_non_root_1_35(meta: Obj, spec: Obj) -> CheckResult | None:
    return None if _relax_for_user_namespace(spec) else _run_as_non_root_1_0(meta, spec)


def _run_as_user_1_23(meta: Obj, spec: Obj) -> CheckResult | None:
    setters = ["pod"] if _is_zero(_d(_sc(spec)).get("runAsUser")) else []
    bad = [_name(c) for c in _containers(spec) if _is_zero(_d(_sc(c)).get("runAsUser"))]
    if bad:
        setters.append(_containers_phrase(bad))
    return CheckResult("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0") if setters else None


def _run_as_user_1_35(meta: Obj, spec: Obj) -> CheckResult | None:
    return None if _relax_for_user_namespace(spec) else _run_as_user_1_23(meta, spec)


def _seccomp_restricted_1_19(meta: Obj, spec: Obj) -> CheckResult | None:
    return _seccomp(meta, spec, required=True)


def _seccomp_restricted_1_25(meta: Obj, spec: Obj) -> CheckResult | None:
    return None if _windows(spec) else _seccomp_restricted_1_19(meta, spec)
