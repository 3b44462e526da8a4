"""Which revision of which check runs for a level and version, and evaluating a pod."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from gpufleet.api.podsecurity.checks import (
    _SELINUX_TYPES_1_0,
    _SELINUX_TYPES_1_31,
    _SYSCTLS_1_0,
    _SYSCTLS_1_27,
    _SYSCTLS_1_29,
    _SYSCTLS_1_32,
    _SYSCTLS_1_37,
    CheckFn,
    CheckResult,
    Obj,
    _app_armor_profile,
    _capabilities_baseline,
    _d,
    _host_namespaces,
    _host_path_volumes,
    _host_ports,
    _host_probes_and_lifecycle,
    _privileged,
    _proc_mount_1_0,
    _proc_mount_1_35,
    _se_linux_options,
    _seccomp_baseline_1_0,
    _seccomp_baseline_1_19,
    _sysctls,
    _windows_host_process,
)
from gpufleet.api.podsecurity.levels import BASELINE, PRIVILEGED, RESTRICTED, LevelVersion, Version
from gpufleet.api.podsecurity.restricted import (
    _allow_privilege_escalation_1_8,
    _allow_privilege_escalation_1_25,
    _capabilities_restricted_1_22,
    _capabilities_restricted_1_25,
    _restricted_volumes,
    _run_as_non_root_1_0,
    _run_as_non_root_1_35,
    _run_as_user_1_23,
    _run_as_user_1_35,
    _seccomp_restricted_1_19,
    _seccomp_restricted_1_25,
)


@dataclass(frozen=True)
class _Revision:
    minimum: int  # the first policy version (v1.<minimum>) this revision applies to
    check: CheckFn
    overrides: tuple[str, ...] = ()  # baseline checks a restricted revision replaces


@dataclass(frozen=True)
class Check:
    id: str
    level: str
    revisions: tuple[_Revision, ...]


def _check(id: str, level: str, *revisions: tuple[Any, ...]) -> Check:
    return Check(id, level, tuple(_Revision(*r) for r in revisions))


CHECKS: tuple[Check, ...] = (
    _check("appArmorProfile", BASELINE, (0, _app_armor_profile)),
    _check("capabilities_baseline", BASELINE, (0, _capabilities_baseline)),
    _check("hostNamespaces", BASELINE, (0, _host_namespaces)),
    _check("hostPathVolumes", BASELINE, (0, _host_path_volumes)),
    _check("hostPorts", BASELINE, (0, _host_ports)),
    _check("hostProbesAndHostLifecycle", BASELINE, (34, _host_probes_and_lifecycle)),
    _check("privileged", BASELINE, (0, _privileged)),
    _check("procMount", BASELINE, (0, _proc_mount_1_0), (35, _proc_mount_1_35)),
    _check("seLinuxOptions", BASELINE, (0, _se_linux_options(_SELINUX_TYPES_1_0)),
           (31, _se_linux_options(_SELINUX_TYPES_1_31))),
    _check("seccompProfile_baseline", BASELINE, (0, _seccomp_baseline_1_0), (19, _seccomp_baseline_1_19)),
    _check("sysctls", BASELINE, (0, _sysctls(_SYSCTLS_1_0)), (27, _sysctls(_SYSCTLS_1_27)),
           (29, _sysctls(_SYSCTLS_1_29)), (32, _sysctls(_SYSCTLS_1_32)), (37, _sysctls(_SYSCTLS_1_37))),
    _check("windowsHostProcess", BASELINE, (0, _windows_host_process)),
    _check("allowPrivilegeEscalation", RESTRICTED, (8, _allow_privilege_escalation_1_8),
           (25, _allow_privilege_escalation_1_25)),
    _check("capabilities_restricted", RESTRICTED, (22, _capabilities_restricted_1_22, ("capabilities_baseline",)),
           (25, _capabilities_restricted_1_25, ("capabilities_baseline",))),
    _check("procMount_restricted", RESTRICTED, (35, _proc_mount_1_0, ("procMount",))),
    _check("restrictedVolumes", RESTRICTED, (0, _restricted_volumes, ("hostPathVolumes",))),
    _check("runAsNonRoot", RESTRICTED, (0, _run_as_non_root_1_0), (35, _run_as_non_root_1_35)),
    _check("runAsUser", RESTRICTED, (23, _run_as_user_1_23), (35, _run_as_user_1_35)),
    _check("seccompProfile_restricted", RESTRICTED, (19, _seccomp_restricted_1_19, ("seccompProfile_baseline",)),
           (25, _seccomp_restricted_1_25, ("seccompProfile_baseline",))),
)

# The newest policy version any check knows: ``latest`` and newer versions evaluate as it.
MAX_VERSION = Version(max(c.revisions[-1].minimum for c in CHECKS))


def _effective(version: Version) -> int:
    assert MAX_VERSION.minor is not None
    return MAX_VERSION.minor if version.minor is None or version.minor > MAX_VERSION.minor else version.minor


@functools.lru_cache(maxsize=256)
def checks_for(level: str, version: Version) -> tuple[tuple[str, CheckFn], ...]:
    """(check id, function) pairs a level runs at a version, in Kubernetes' order: baseline
    checks by id, then restricted checks by id."""
    if level == PRIVILEGED:
        return ()
    minor = _effective(version)
    active: dict[str, tuple[Check, _Revision]] = {}
    for c in CHECKS:
        if c.level == RESTRICTED and level != RESTRICTED:
            continue
        revision = None
        for r in c.revisions:
            if r.minimum <= minor:
                revision = r
        if revision is not None:
            active[c.id] = (c, revision)
    if level == RESTRICTED:
        for _, r in list(active.values()):
            for overridden in r.overrides:
                active.pop(overridden, None)
    order = sorted(i for i, (c, _) in active.items() if c.level == BASELINE)
    order += sorted(i for i, (c, _) in active.items() if c.level == RESTRICTED)
    return tuple((i, active[i][1].check) for i in order)


def evaluate_pod(lv: LevelVersion, metadata: Obj | None, spec: Obj | None) -> list[CheckResult]:
    """What ``lv`` forbids in a pod (or pod template) with this metadata and spec; empty: allowed."""
    meta, pod_spec = _d(metadata), _d(spec)
    out: list[CheckResult] = []
    for _, check in checks_for(lv.level, lv.version):
        result = check(meta, pod_spec)
        if result is not None:
            out.append(result)
    return out
