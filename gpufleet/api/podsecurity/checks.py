"""The check results, the helpers the checks share, and the baseline checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.api.validation.errors import go_quote

# ---------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CheckResult:
    """A check's refusal: the short reason (always shown) and the detail (shown for one object)."""

    reason: str
    detail: str = ""


def forbidden_reason(results: list[CheckResult]) -> str:
    """``host namespaces, privileged``: what a namespace-wide summary shows per pod."""
    return ", ".join(r.reason for r in results)


def forbidden_detail(results: list[CheckResult]) -> str:
    """``host namespaces (hostPID=true), privileged (container "c" must not ...)``."""
    return ", ".join(f"{r.reason} ({r.detail})" if r.detail else r.reason for r in results)


# ---------------------------------------------------------------------------- helpers

Obj = Mapping[str, Any]
CheckFn = Callable[[Obj, Obj], "CheckResult | None"]


def _d(value: Any) -> Obj:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _containers(spec: Obj) -> Iterator[Obj]:
    """Init containers, containers, then ephemeral containers, as Kubernetes visits them."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in _list(spec.get(key)):
            if isinstance(c, Mapping):
                yield c


def _sc(container_or_spec: Obj) -> Obj | None:
    sc = container_or_spec.get("securityContext")
    return sc if isinstance(sc, Mapping) else None


def _name(c: Obj) -> str:
    return str(c.get("name") or "")


def _join_quote(items: list[str]) -> str:
    return '"' + '", "'.join(items) + '"' if items else ""


def _plural(singular: str, plural: str, count: int) -> str:
    return singular if count == 1 else plural


def _containers_phrase(names: list[str]) -> str:
    return f"{_plural('container', 'containers', len(names))} {_join_quote(names)}"


def _is_true(value: Any) -> bool:
    return value is True


def _is_zero(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value == 0


def _relax_for_user_namespace(spec: Obj) -> bool:
    """hostUsers: false puts the pod in a user namespace, which relaxes some checks (1.35+)."""
    return spec.get("hostUsers") is False


def _windows(spec: Obj) -> bool:
    return _d(spec.get("os")).get("name") == "windows"


# ---------------------------------------------------------------------------- baseline checks


def _host_namespaces(meta: Obj, spec: Obj) -> CheckResult | None:
    used = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if _is_true(spec.get(k))]
    return CheckResult("host namespaces", ", ".join(used)) if used else None


def _privileged(meta: Obj, spec: Obj) -> CheckResult | None:
    bad = [_name(c) for c in _containers(spec) if _is_true(_d(_sc(c)).get("privileged"))]
    if not bad:
        return None
    return CheckResult("privileged", f"{_containers_phrase(bad)} must not set securityContext.privileged=true")


_BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})


def _capabilities_baseline(meta: Obj, spec: Obj) -> CheckResult | None:
    bad: list[str] = []
    caps: set[str] = set()
    for c in _containers(spec):
        capabilities = _d(_sc(c)).get("capabilities")
        if not isinstance(capabilities, Mapping):
            continue
        extra = {str(a) for a in _list(capabilities.get("add")) if a not in _BASELINE_CAPABILITIES}
        if extra:
            caps |= extra
            bad.append(_name(c))
    if not bad:
        return None
    return CheckResult("non-default capabilities", f"{_containers_phrase(bad)} must not include "
                                                   f"{_join_quote(sorted(caps))} in securityContext.capabilities.add")


def _host_path_volumes(meta: Obj, spec: Obj) -> CheckResult | None:
    bad = [str(v.get("name") or "") for v in _list(spec.get("volumes"))
           if isinstance(v, Mapping) and v.get("hostPath") is not None]
    if not bad:
        return None
    return CheckResult("hostPath volumes", f"{_plural('volume', 'volumes', len(bad))} {_join_quote(bad)}")


def _host_ports(meta: Obj, spec: Obj) -> CheckResult | None:
    bad: list[str] = []
    ports: set[str] = set()
    for c in _containers(spec):
        used = {str(p.get("hostPort")) for p in _list(c.get("ports"))
                if isinstance(p, Mapping) and p.get("hostPort") not in (None, 0)}
        if used:
            ports |= used
            bad.append(_name(c))
    if not bad:
        return None
    return CheckResult("hostPort", f"{_containers_phrase(bad)} {_plural('uses', 'use', len(bad))} "
                                   f"{_plural('hostPort', 'hostPorts', len(ports))} {', '.join(sorted(ports))}")


def _handler_hosts(handler: Any) -> list[str]:
    h = _d(handler)
    return [str(_d(h.get(k)).get("host")) for k in ("httpGet", "tcpSocket") if _d(h.get(k)).get("host")]


def _host_probes_and_lifecycle(meta: Obj, spec: Obj) -> CheckResult | None:
    bad: set[str] = set()
    hosts: set[str] = set()
    for c in _containers(spec):
        lifecycle = _d(c.get("lifecycle"))
        handlers = [c.get("livenessProbe"), c.get("readinessProbe"), c.get("startupProbe"),
                    lifecycle.get("postStart"), lifecycle.get("preStop")]
        for handler in handlers:
            found = _handler_hosts(handler)
            if found:
                bad.add(_name(c))
                hosts.update(found)
    if not bad:
        return None
    names = sorted(bad)
    return CheckResult("probe or lifecycle host",
                       f"{_containers_phrase(names)} {_plural('uses', 'use', len(names))} "
                       f"{_plural('probe or lifecycle host', 'probe or lifecycle hosts', len(hosts))} "
                       f"{_join_quote(sorted(hosts))}")


_APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"


def _app_armor_profile(meta: Obj, spec: Obj) -> CheckResult | None:
    setters: list[str] = []
    values: set[str] = set()

    def bad_type(sc: Obj | None) -> str | None:
        profile = _d(sc).get("appArmorProfile")
        if not isinstance(profile, Mapping):
            return None
        t = str(profile.get("type") or "")
        return None if t in ("RuntimeDefault", "Localhost") else t

    if (t := bad_type(_sc(spec))) is not None:
        setters.append("pod")
        values.add(t)
    bad: list[str] = []
    for c in _containers(spec):
        if (t := bad_type(_sc(c))) is not None:
            bad.append(_name(c))
            values.add(t)
    if bad:
        setters.append(_containers_phrase(bad))
    annotations = sorted(
        f"{k}={go_quote(str(v))}" for k, v in _d(meta.get("annotations")).items()
        if str(k).startswith(_APPARMOR_ANNOTATION_PREFIX)
        and not (not v or v == "runtime/default" or str(v).startswith("localhost/")))
    listed = sorted(values) + annotations
    if annotations:
        setters.append(_plural("annotation", "annotations", len(annotations)))
    if not setters:
        return None
    return CheckResult(_plural("forbidden AppArmor profile", "forbidden AppArmor profiles", len(listed)),
                       f"{' and '.join(setters)} must not set AppArmor profile type to {_join_quote(listed)}")


_SELINUX_TYPES_1_0 = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
_SELINUX_TYPES_1_31 = _SELINUX_TYPES_1_0 | {"container_engine_t"}


def _se_linux_options(allowed: frozenset[str]) -> CheckFn:
    def check(meta: Obj, spec: Obj) -> CheckResult | None:
        setters: list[str] = []
        bad_types: set[str] = set()
        set_user = set_role = False

        def valid(sc: Obj | None) -> bool:
            nonlocal set_user, set_role
            opts = _d(sc).get("seLinuxOptions")
            if not isinstance(opts, Mapping):
                return True
            ok = True
            t = str(opts.get("type") or "")
            if t not in allowed:
                ok = False
                bad_types.add(t)
            if opts.get("user"):
                ok, set_user = False, True
            if opts.get("role"):
                ok, set_role = False, True
            return ok

        if not valid(_sc(spec)):
            setters.append("pod")
        bad = [_name(c) for c in _containers(spec) if not valid(_sc(c))]
        if bad:
            setters.append(_containers_phrase(bad))
        if not setters:
            return None
        data: list[str] = []
        if bad_types:
            data.append(f"{_plural('type', 'types', len(bad_types))} {_join_quote(sorted(bad_types))}")
        if set_user:
            data.append("user may not be set")
        if set_role:
            data.append("role may not be set")
        return CheckResult("seLinuxOptions", f"{' and '.join(setters)} set forbidden securityContext.seLinuxOptions: "
                                             f"{'; '.join(data)}")

    return check


def _proc_mount_1_0(meta: Obj, spec: Obj) -> CheckResult | None:
    bad: list[str] = []
    types: set[str] = set()
    for c in _containers(spec):
        mount = _d(_sc(c)).get("procMount")
        if mount is not None and mount != "Default":
            bad.append(_name(c))
            types.add(str(mount))
    if not bad:
        return None
    return CheckResult("procMount", f"{_containers_phrase(bad)} must not set securityContext.procMount to "
                                    f"{_join_quote(sorted(types))}")


def _proc_mount_1_35(meta: Obj, spec: Obj) -> CheckResult | None:
    return None if _relax_for_user_namespace(spec) else _proc_mount_1_0(meta, spec)


_SECCOMP_POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
_SECCOMP_CONTAINER_ANNOTATION_PREFIX = "container.seccomp.security.alpha.kubernetes.io/"


def _seccomp_annotation_ok(value: Any) -> bool:
    v = str(value)
    return v in ("runtime/default", "docker/default") or v.startswith("localhost/")


def _seccomp_baseline_1_0(meta: Obj, spec: Obj) -> CheckResult | None:
    annotations = _d(meta.get("annotations"))
    bad: set[str] = set()
    keys = [_SECCOMP_POD_ANNOTATION] + [_SECCOMP_CONTAINER_ANNOTATION_PREFIX + _name(c) for c in _containers(spec)]
    for key in keys:
        if key in annotations and not _seccomp_annotation_ok(annotations[key]):
            bad.add(f"{key}={go_quote(str(annotations[key]))}")
    if not bad:
        return None
    return CheckResult("seccompProfile", f"forbidden {_plural('annotation', 'annotations', len(bad))} "
                                         f"{', '.join(sorted(bad))}")


def _seccomp_type(sc: Obj | None) -> str | None:
    """The seccompProfile.type set (possibly ""), or None when no profile is set."""
    profile = _d(sc).get("seccompProfile")
    if not isinstance(profile, Mapping):
        return None
    return str(profile.get("type") or "")


def _seccomp_ok(t: str) -> bool:
    return t in ("RuntimeDefault", "Localhost")


def _seccomp(meta: Obj, spec: Obj, *, required: bool) -> CheckResult | None:
    setters: list[str] = []
    values: set[str] = set()
    pod_set = False
    pod_type = _seccomp_type(_sc(spec))
    if pod_type is not None:
        if _seccomp_ok(pod_type):
            pod_set = True
        else:
            setters.append("pod")
            values.add(pod_type)
    explicit: list[str] = []
    implicit: list[str] = []
    for c in _containers(spec):
        t = _seccomp_type(_sc(c))
        if t is not None:
            if not _seccomp_ok(t):
                explicit.append(_name(c))
                values.add(t)
        elif not pod_set:
            implicit.append(_name(c))
    if explicit:
        setters.append(_containers_phrase(explicit))
    if setters:
        return CheckResult("seccompProfile", f"{' and '.join(setters)} must not set "
                                             f"securityContext.seccompProfile.type to {_join_quote(sorted(values))}")
    if required and implicit:
        return CheckResult("seccompProfile", f"pod or {_containers_phrase(implicit)} must set "
                                             'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"')
    return None


def _seccomp_baseline_1_19(meta: Obj, spec: Obj) -> CheckResult | None:
    return _seccomp(meta, spec, required=False)


_SYSCTLS_1_0 = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                          "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start"})
_SYSCTLS_1_27 = _SYSCTLS_1_0 | {"net.ipv4.ip_local_reserved_ports"}
_SYSCTLS_1_29 = _SYSCTLS_1_27 | {"net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                                 "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
_SYSCTLS_1_32 = _SYSCTLS_1_29 | {"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}
_SYSCTLS_1_37 = _SYSCTLS_1_32 | {"net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"}


def _sysctls(allowed: frozenset[str]) -> CheckFn:
    def check(meta: Obj, spec: Obj) -> CheckResult | None:
        bad = [str(_d(s).get("name") or "") for s in _list(_d(_sc(spec)).get("sysctls"))
               if _d(s).get("name") not in allowed]
        return CheckResult("forbidden sysctls", ", ".join(bad)) if bad else None

    return check


def _windows_host_process(meta: Obj, spec: Obj) -> CheckResult | None:
    def host_process(sc: Obj | None) -> bool:
        return _is_true(_d(_d(sc).get("windowsOptions")).get("hostProcess"))

    bad = [_name(c) for c in _containers(spec) if host_process(_sc(c))]
    setters = ["pod"] if host_process(_sc(spec)) else []
    if bad:
        setters.append(_containers_phrase(bad))
    if not setters:
        return None
    return CheckResult("hostProcess", f"{' and '.join(setters)} must not set "
                                      "securityContext.windowsOptions.hostProcess=true")
