"""The Pod Security Standards as Kubernetes' pod-security-admission checks them.

Pure functions of a pod's metadata and spec, as the JSON dicts the API stores: no I/O, no
server. The admission plugin (apiserver/admission/podsecurity.py) reads the namespace
labels and the configuration and decides what to do with the results.

Levels: ``privileged`` (no checks), ``baseline`` and ``restricted`` (baseline plus the
restricted checks, some of which replace a baseline check with a stricter one). Each check
has versions: a policy version ``v1.N`` runs, for every check, the newest revision of it
whose minimum version is at most 1.N; ``latest`` (and any version newer than the newest
revision known here) runs the newest revision of every check. The table follows
pod-security-admission as of Kubernetes' development branch for v1.37, so ``latest`` means
the 1.37 policy. Reasons and details are Kubernetes' words, and a pod that fails several
checks is described in Kubernetes' order (baseline checks, then restricted ones, each by
check id), e.g. ``host namespaces (hostPID=true), privileged (container "c" must not set
securityContext.privileged=true)``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

PRIVILEGED, BASELINE, RESTRICTED = "privileged", "baseline", "restricted"
LEVELS = (PRIVILEGED, BASELINE, RESTRICTED)

LABEL_PREFIX = "pod-security.kubernetes.io/"
ENFORCE_LABEL = LABEL_PREFIX + "enforce"
ENFORCE_VERSION_LABEL = LABEL_PREFIX + "enforce-version"
AUDIT_LABEL = LABEL_PREFIX + "audit"
AUDIT_VERSION_LABEL = LABEL_PREFIX + "audit-version"
WARN_LABEL = LABEL_PREFIX + "warn"
WARN_VERSION_LABEL = LABEL_PREFIX + "warn-version"

# Audit annotation keys (under LABEL_PREFIX), as kube-apiserver records them.
AUDIT_VIOLATIONS = "audit-violations"
ENFORCE_POLICY = "enforce-policy"
EXEMPT = "exempt"

_LEVEL_MESSAGE = "must be one of " + ", ".join(LEVELS)
_VERSION_MESSAGE = 'must be "latest" or "v1.x"'
_VERSION = re.compile(r"^v1\.([0-9]|[1-9][0-9]*)$")


class PolicyValueError(ValueError):
    """A level or version that is not one; the message is Kubernetes' (``must be one of ...``)."""


@dataclass(frozen=True, order=True)
class Version:
    """A policy version: ``v1.<minor>``, or ``latest`` (minor None), newer than any other."""

    minor: int | None = None

    @property
    def latest(self) -> bool:
        return self.minor is None

    def __str__(self) -> str:
        return "latest" if self.minor is None else f"v1.{self.minor}"

    def older(self, other: Version) -> bool:
        if self.minor is None:
            return False
        return other.minor is None or self.minor < other.minor


LATEST = Version()


def parse_level(value: str) -> str:
    if value not in LEVELS:
        raise PolicyValueError(_LEVEL_MESSAGE)
    return value


def parse_version(value: str) -> Version:
    if value == "latest":
        return LATEST
    m = _VERSION.match(value) if isinstance(value, str) else None
    if m is None:
        raise PolicyValueError(_VERSION_MESSAGE)
    return Version(int(m.group(1)))


@dataclass(frozen=True)
class LevelVersion:
    level: str
    version: Version = LATEST

    def __str__(self) -> str:
        return f"{self.level}:{self.version}"

    @classmethod
    def parse(cls, text: str) -> LevelVersion:
        """``baseline`` or ``baseline:v1.30`` (the form this module prints)."""
        level, _, version = text.partition(":")
        return cls(parse_level(level), parse_version(version) if version else LATEST)


@dataclass(frozen=True)
class Policy:
    enforce: LevelVersion = LevelVersion(PRIVILEGED)
    audit: LevelVersion = LevelVersion(PRIVILEGED)
    warn: LevelVersion = LevelVersion(PRIVILEGED)

    def fully_privileged(self) -> bool:
        return PRIVILEGED == self.enforce.level == self.audit.level == self.warn.level

    def equivalent(self, other: Policy) -> bool:
        def same(a: LevelVersion, b: LevelVersion) -> bool:
            return (a.level == PRIVILEGED and b.level == PRIVILEGED) or a == b

        return same(self.enforce, other.enforce) and same(self.audit, other.audit) and same(self.warn, other.warn)


@dataclass(frozen=True)
class LabelError:
    """A namespace label that does not parse: ``metadata.labels[<label>]: Invalid value: ...``."""

    label: str
    value: str
    message: str

    @property
    def field(self) -> str:
        return f"metadata.labels[{self.label}]"

    def __str__(self) -> str:
        return f'{self.field}: Invalid value: "{self.value}": {self.message}'


def compare_levels(a: str, b: str) -> int:
    return LEVELS.index(a) - LEVELS.index(b) if a != b else 0


def policy_to_evaluate(labels: Mapping[str, str] | None, defaults: Policy) -> tuple[Policy, list[LabelError]]:
    """The policy a namespace's labels ask for, over ``defaults``, and the labels that are
    wrong. As Kubernetes: a bad enforce level enforces ``restricted`` (fails closed), bad
    audit and warn levels are ``privileged`` (fail open), a bad version is ``latest``; a warn
    level left unset follows a stricter enforce level (and its version, unless warn-version
    is set)."""
    errors: list[LabelError] = []
    if not labels:
        return defaults, errors
    enforce, audit, warn = defaults.enforce, defaults.audit, defaults.warn

    def level(label: str, on_error: str) -> str | None:
        if label not in labels:
            return None
        try:
            return parse_level(labels[label])
        except PolicyValueError as e:
            errors.append(LabelError(label, labels[label], str(e)))
            return on_error

    def version(label: str) -> Version | None:
        if label not in labels:
            return None
        try:
            return parse_version(labels[label])
        except PolicyValueError as e:
            errors.append(LabelError(label, labels[label], str(e)))
            return LATEST

    enforce_level = level(ENFORCE_LABEL, RESTRICTED)
    has_enforce_level = enforce_level is not None and labels[ENFORCE_LABEL] in LEVELS
    if enforce_level is not None:
        enforce = LevelVersion(enforce_level, enforce.version)
    if (v := version(ENFORCE_VERSION_LABEL)) is not None:
        enforce = LevelVersion(enforce.level, v)
    if (lvl := level(AUDIT_LABEL, PRIVILEGED)) is not None:
        audit = LevelVersion(lvl, audit.version)
    if (v := version(AUDIT_VERSION_LABEL)) is not None:
        audit = LevelVersion(audit.level, v)
    has_warn_level = WARN_LABEL in labels
    if (lvl := level(WARN_LABEL, PRIVILEGED)) is not None:
        warn = LevelVersion(lvl, warn.version)
    has_warn_version = WARN_VERSION_LABEL in labels
    if (v := version(WARN_VERSION_LABEL)) is not None:
        warn = LevelVersion(warn.level, v)
    if not has_warn_level and has_enforce_level and compare_levels(enforce.level, warn.level) > 0:
        warn = LevelVersion(enforce.level, warn.version if has_warn_version else enforce.version)
    return Policy(enforce, audit, warn), errors


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


_GO_ESCAPES = {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t", "\v": r"\v",
               "\\": "\\\\", '"': '\\"'}


def _go_quote(s: str) -> str:
    """Go's %q of a string (how Kubernetes prints annotation values in these messages)."""
    out = []
    for ch in s:
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


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
        f"{k}={_go_quote(str(v))}" for k, v in _d(meta.get("annotations")).items()
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
            bad.add(f"{key}={_go_quote(str(annotations[key]))}")
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


# ---------------------------------------------------------------------------- restricted checks


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


# ---------------------------------------------------------------------------- the registry


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
