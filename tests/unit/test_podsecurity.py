"""The Pod Security Standards checks (gpufleet/api/podsecurity.py): each check on a pod that
passes and on pods that violate it, with Kubernetes' reasons and details word for word (as
pod-security-admission's own tests state them), the versions, the order of a combined
message, and the namespace label rules."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpufleet.api import podsecurity as ps

BASELINE = ps.LevelVersion(ps.BASELINE)
RESTRICTED = ps.LevelVersion(ps.RESTRICTED)
PRIVILEGED = ps.LevelVersion(ps.PRIVILEGED)

# What passes restricted: the shape a hardened workload has.
RESTRICTED_SC = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
COMPLIANT_RESTRICTED: dict[str, Any] = {
    "metadata": {"name": "ok"},
    "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [{"name": "init", "image": "busybox", "securityContext": dict(RESTRICTED_SC)}],
        "containers": [{"name": "c", "image": "busybox", "securityContext": dict(RESTRICTED_SC),
                        "ports": [{"containerPort": 8080}]}],
        "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}, {"name": "tmp", "emptyDir": {}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "tok", "projected": {"sources": []}}, {"name": "s", "secret": {"secretName": "s"}},
                    {"name": "d", "downwardAPI": {"items": []}}, {"name": "csi", "csi": {"driver": "x"}},
                    {"name": "eph", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}],
    },
}
# A plain pod: baseline allows it, restricted does not.
PLAIN: dict[str, Any] = {"metadata": {"name": "plain"},
                         "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def pod(base: dict[str, Any] = PLAIN, **spec: Any) -> dict[str, Any]:
    p = copy.deepcopy(base)
    p["spec"].update(spec)
    return p


def containers(*specs: dict[str, Any], key: str = "containers") -> dict[str, Any]:
    return {key: [{"image": "busybox", **s} for s in specs]}


def check(lv: ps.LevelVersion, p: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r.reason, r.detail) for r in ps.evaluate_pod(lv, p.get("metadata"), p.get("spec"))]


def only(lv: ps.LevelVersion, p: dict[str, Any]) -> tuple[str, str]:
    (found,) = check(lv, p)
    return found


def test_compliant_pods_pass_their_levels() -> None:
    assert check(RESTRICTED, COMPLIANT_RESTRICTED) == []
    assert check(BASELINE, COMPLIANT_RESTRICTED) == []
    assert check(BASELINE, PLAIN) == []
    assert check(PRIVILEGED, pod(hostPID=True, **containers({"name": "c", "securityContext": {"privileged": True}})))\
        == []


# -- baseline, one check at a time -----------------------------------------------------------------------


BASELINE_CASES = [
    ("host namespaces", pod(hostNetwork=True, hostPID=True, hostIPC=True),
     ("host namespaces", "hostNetwork=true, hostPID=true, hostIPC=true")),
    ("host namespaces", pod(hostPID=True), ("host namespaces", "hostPID=true")),
    ("privileged", pod(**containers({"name": "a"}, {"name": "d", "securityContext": {"privileged": True}},
                                    {"name": "e", "securityContext": {"privileged": True}})),
     ("privileged", 'containers "d", "e" must not set securityContext.privileged=true')),
    ("privileged init container", pod(**containers({"name": "c"}), initContainers=[
        {"name": "i", "image": "x", "securityContext": {"privileged": True}}]),
     ("privileged", 'container "i" must not set securityContext.privileged=true')),
    ("capabilities", pod(**containers(
        {"name": "a", "securityContext": {"capabilities": {"add": ["FOO", "BAR", "CHOWN"]}}},
        {"name": "b", "securityContext": {"capabilities": {"add": ["BAZ"]}}},
        {"name": "c", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE", "KILL"]}}})),
     ("non-default capabilities",
      'containers "a", "b" must not include "BAR", "BAZ", "FOO" in securityContext.capabilities.add')),
    ("hostPath", pod(volumes=[{"name": "a", "hostPath": {"path": "/"}}, {"name": "e", "emptyDir": {}},
                              {"name": "b", "hostPath": {"path": "/etc"}}]),
     ("hostPath volumes", 'volumes "a", "b"')),
    ("hostPort", pod(**containers({"name": "a", "ports": [{"containerPort": 80}]},
                                  {"name": "b", "ports": [{"containerPort": 80, "hostPort": 20}]})),
     ("hostPort", 'container "b" uses hostPort 20')),
    ("hostPorts", pod(**containers({"name": "a"},
                                   {"name": "b", "ports": [{"containerPort": 1, "hostPort": 10},
                                                           {"containerPort": 2, "hostPort": 20}]},
                                   {"name": "c", "ports": [{"containerPort": 3, "hostPort": 30}]})),
     ("hostPort", 'containers "b", "c" use hostPorts 10, 20, 30')),
    ("AppArmor field", pod(**containers({"name": "foo", "securityContext": {
        "appArmorProfile": {"type": "Unconfined"}}})),
     ("forbidden AppArmor profile", 'container "foo" must not set AppArmor profile type to "Unconfined"')),
    ("AppArmor pod", pod(securityContext={"appArmorProfile": {"type": "Unconfined"}}),
     ("forbidden AppArmor profile", 'pod must not set AppArmor profile type to "Unconfined"')),
    ("AppArmor annotation", {
        "metadata": {"name": "x", "annotations": {
            "container.apparmor.security.beta.kubernetes.io/b": "unconfined",
            "container.apparmor.security.beta.kubernetes.io/a": "bogus",
            "container.apparmor.security.beta.kubernetes.io/ok": "runtime/default",
            "container.apparmor.security.beta.kubernetes.io/ok2": "localhost/mine"}},
        "spec": PLAIN["spec"]},
     # Kubernetes quotes the values inside the quoted list without escaping them.
     ("forbidden AppArmor profiles", 'annotations must not set AppArmor profile type to '
                                     '"container.apparmor.security.beta.kubernetes.io/a="bogus"", '
                                     '"container.apparmor.security.beta.kubernetes.io/b="unconfined""')),
    ("SELinux", pod(securityContext={"seLinuxOptions": {"type": "foo", "user": "u", "role": "r"}},
                    **containers({"name": "e", "securityContext": {"seLinuxOptions": {"type": "bar"}}},
                                 {"name": "f", "securityContext": {"seLinuxOptions": {"type": "container_t",
                                                                                      "user": "x"}}},
                                 {"name": "ok", "securityContext": {"seLinuxOptions": {"type": "container_init_t",
                                                                                       "level": "s0"}}})),
     ("seLinuxOptions", 'pod and containers "e", "f" set forbidden securityContext.seLinuxOptions: '
                        'types "bar", "foo"; user may not be set; role may not be set')),
    ("SELinux type only", pod(securityContext={"seLinuxOptions": {"type": "bad"}}),
     ("seLinuxOptions", 'pod set forbidden securityContext.seLinuxOptions: type "bad"')),
    ("SELinux user only", pod(securityContext={"seLinuxOptions": {"user": "x"}}),
     ("seLinuxOptions", "pod set forbidden securityContext.seLinuxOptions: user may not be set")),
    ("/proc mount", pod(**containers({"name": "a", "securityContext": {"procMount": "Default"}},
                                     {"name": "d", "securityContext": {"procMount": "Unmasked"}},
                                     {"name": "e", "securityContext": {"procMount": "other"}})),
     ("procMount", 'containers "d", "e" must not set securityContext.procMount to "Unmasked", "other"')),
    ("seccomp Unconfined", pod(securityContext={"seccompProfile": {"type": "Unconfined"}},
                               **containers({"name": "a"},
                                            {"name": "c", "securityContext": {"seccompProfile": {
                                                "type": "Unconfined"}}},
                                            {"name": "d", "securityContext": {"seccompProfile": {
                                                "type": "Unconfined"}}})),
     ("seccompProfile", 'pod and containers "c", "d" must not set securityContext.seccompProfile.type to '
                        '"Unconfined"')),
    ("sysctls", pod(securityContext={"sysctls": [{"name": "a", "value": "1"},
                                                 {"name": "net.ipv4.tcp_syncookies", "value": "1"},
                                                 {"name": "b", "value": "1"}]}),
     ("forbidden sysctls", "a, b")),
    ("hostProcess", pod(securityContext={"windowsOptions": {"hostProcess": True}}, **containers(
        {"name": "a"}, {"name": "e", "securityContext": {"windowsOptions": {"hostProcess": True}}},
        {"name": "f", "securityContext": {"windowsOptions": {"hostProcess": True}}})),
     ("hostProcess", 'pod and containers "e", "f" must not set securityContext.windowsOptions.hostProcess=true')),
    ("probe host", pod(**containers(
        {"name": "a", "livenessProbe": {"httpGet": {"port": 80, "host": "localhost"}},
         "readinessProbe": {"tcpSocket": {"port": 80, "host": "127.0.0.1"}},
         "lifecycle": {"preStop": {"httpGet": {"port": 80, "host": "::1"}}}})),
     ("probe or lifecycle host", 'container "a" uses probe or lifecycle hosts "127.0.0.1", "::1", "localhost"')),
]


@pytest.mark.parametrize(("what", "p", "want"), BASELINE_CASES, ids=[c[0] for c in BASELINE_CASES])
def test_baseline_checks_in_kubernetes_words(what: str, p: dict[str, Any], want: tuple[str, str]) -> None:
    assert only(BASELINE, p) == want
    assert check(PRIVILEGED, p) == []


def test_baseline_allows_what_it_allows() -> None:
    allowed = pod(
        hostNetwork=False, hostPID=False,
        securityContext={"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
                         "seLinuxOptions": {"type": "container_engine_t", "level": "s0:c1"},
                         "sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1 2"},
                                     {"name": "net.ipv4.tcp_rmem", "value": "1 2 3"}],
                         "appArmorProfile": {"type": "RuntimeDefault"}},
        volumes=[{"name": "e", "emptyDir": {}}, {"name": "n", "nfs": {"server": "s", "path": "/"}}],
        **containers({"name": "a", "securityContext": {
            "privileged": False, "procMount": "Default", "capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN"]},
            "windowsOptions": {"hostProcess": False}, "seccompProfile": {"type": "RuntimeDefault"}},
            "ports": [{"containerPort": 80, "hostPort": 0}],
            "livenessProbe": {"httpGet": {"port": 80}}}))
    assert check(BASELINE, allowed) == []


def test_ephemeral_containers_are_checked_too() -> None:
    p = pod(ephemeralContainers=[{"name": "debug", "image": "x", "securityContext": {"privileged": True}}])
    assert only(BASELINE, p) == ("privileged", 'container "debug" must not set securityContext.privileged=true')


# -- restricted ----------------------------------------------------------------------------------------


def restricted_pod(**changes: Any) -> dict[str, Any]:
    p = copy.deepcopy(COMPLIANT_RESTRICTED)
    p["spec"].update(changes)
    return p


RESTRICTED_CASES = [
    ("volume types", restricted_pod(volumes=[{"name": "a", "hostPath": {"path": "/"}},
                                             {"name": "b", "nfs": {"server": "s", "path": "/"}},
                                             {"name": "c", "emptyDir": {}}, {"name": "d", "gitRepo": {}}]),
     ("restricted volume types", 'volumes "a", "b", "d" use restricted volume types "gitRepo", "hostPath", "nfs"')),
    ("one volume", restricted_pod(volumes=[{"name": "a", "hostPath": {"path": "/"}}]),
     ("restricted volume types", 'volume "a" uses restricted volume type "hostPath"')),
    ("allowPrivilegeEscalation", restricted_pod(containers=[
        {"name": "a", "image": "x", "securityContext": {"capabilities": {"drop": ["ALL"]}}},
        {"name": "b", "image": "x", "securityContext": {"allowPrivilegeEscalation": True,
                                                        "capabilities": {"drop": ["ALL"]}}}]),
     ("allowPrivilegeEscalation != false",
      'containers "a", "b" must set securityContext.allowPrivilegeEscalation=false')),
    ("runAsNonRoot unset", restricted_pod(securityContext={"seccompProfile": {"type": "RuntimeDefault"}}),
     ("runAsNonRoot != true", 'pod or containers "init", "c" must set securityContext.runAsNonRoot=true')),
    ("runAsNonRoot false", restricted_pod(securityContext={"runAsNonRoot": False,
                                                           "seccompProfile": {"type": "RuntimeDefault"}}),
     ("runAsNonRoot != true", "pod must not set securityContext.runAsNonRoot=false")),
    ("runAsUser 0", restricted_pod(securityContext={"runAsNonRoot": True, "runAsUser": 0,
                                                    "seccompProfile": {"type": "RuntimeDefault"}}),
     ("runAsUser=0", "pod must not set runAsUser=0")),
    ("seccomp unset", restricted_pod(securityContext={"runAsNonRoot": True}),
     ("seccompProfile", 'pod or containers "init", "c" must set securityContext.seccompProfile.type to '
                        '"RuntimeDefault" or "Localhost"')),
    ("capabilities", restricted_pod(containers=[
        {"name": "a", "image": "x", "securityContext": {"allowPrivilegeEscalation": False}},
        {"name": "b", "image": "x", "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {
            "drop": ["ALL"], "add": ["NET_BIND_SERVICE", "CHOWN"]}}}]),
     ("unrestricted capabilities", 'container "a" must set securityContext.capabilities.drop=["ALL"]; '
                                   'container "b" must not include "CHOWN" in securityContext.capabilities.add')),
    ("unmasked /proc in a user namespace", restricted_pod(hostUsers=False, containers=[
        {"name": "a", "image": "x", "securityContext": {**RESTRICTED_SC, "procMount": "Unmasked"}}]),
     ("procMount", 'container "a" must not set securityContext.procMount to "Unmasked"')),
]


@pytest.mark.parametrize(("what", "p", "want"), RESTRICTED_CASES, ids=[c[0] for c in RESTRICTED_CASES])
def test_restricted_checks_in_kubernetes_words(what: str, p: dict[str, Any], want: tuple[str, str]) -> None:
    assert only(RESTRICTED, p) == want


def test_restricted_replaces_the_baseline_checks_it_tightens() -> None:
    # hostPath: one message, from the restricted volume check, not twice.
    p = restricted_pod(volumes=[{"name": "h", "hostPath": {"path": "/"}}])
    assert [r for r, _ in check(RESTRICTED, p)] == ["restricted volume types"]
    assert check(BASELINE, p) == [("hostPath volumes", 'volume "h"')]
    # A non-default capability: restricted's wording.
    p = restricted_pod(containers=[{"name": "a", "image": "x", "securityContext": {
        **RESTRICTED_SC, "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}}])
    assert check(RESTRICTED, p) == [("unrestricted capabilities",
                                     'container "a" must not include "SYS_ADMIN" in securityContext.capabilities.add')]


def test_a_plain_pod_fails_restricted_on_four_counts_in_kubernetes_order() -> None:
    assert ps.forbidden_detail(ps.evaluate_pod(RESTRICTED, PLAIN["metadata"], PLAIN["spec"])) == (
        'allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false), '
        'unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]), '
        'runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true), '
        'seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" '
        'or "Localhost")')


def test_windows_pods_are_spared_the_linux_only_restricted_checks() -> None:
    p = restricted_pod(os={"name": "windows"}, securityContext={"runAsNonRoot": True},
                       containers=[{"name": "c", "image": "x"}], initContainers=[])
    assert check(RESTRICTED, p) == []


def test_combined_message_order_is_kubernetes() -> None:
    p = pod(hostPID=True, volumes=[{"name": "h", "hostPath": {"path": "/"}}],
            **containers({"name": "c", "securityContext": {"privileged": True}}))
    results = ps.evaluate_pod(BASELINE, p["metadata"], p["spec"])
    assert ps.forbidden_detail(results) == (
        'host namespaces (hostPID=true), hostPath volumes (volume "h"), '
        'privileged (container "c" must not set securityContext.privileged=true)')
    assert ps.forbidden_reason(results) == "host namespaces, hostPath volumes, privileged"


# -- versions ------------------------------------------------------------------------------------------


def v(level: str, minor: int | None) -> ps.LevelVersion:
    return ps.LevelVersion(level, ps.Version(minor))


def test_versions_apply_the_revision_of_their_time() -> None:
    newer_sysctl = pod(securityContext={"sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "1"}]})
    assert check(v(ps.BASELINE, 28), newer_sysctl) == [("forbidden sysctls", "net.ipv4.tcp_keepalive_time")]
    assert check(v(ps.BASELINE, 29), newer_sysctl) == []
    assert check(BASELINE, newer_sysctl) == []
    engine = pod(securityContext={"seLinuxOptions": {"type": "container_engine_t"}})
    assert check(v(ps.BASELINE, 30), engine) != [] and check(v(ps.BASELINE, 31), engine) == []
    probe_host = pod(**containers({"name": "a", "startupProbe": {"tcpSocket": {"port": 1, "host": "h"}}}))
    assert check(v(ps.BASELINE, 33), probe_host) == []
    assert check(BASELINE, probe_host) == [("probe or lifecycle host", 'container "a" uses probe or lifecycle host "h"')]
    # runAsUser=0 joined restricted in 1.23; before, only runAsNonRoot spoke.
    root = restricted_pod(securityContext={"runAsNonRoot": True, "runAsUser": 0,
                                           "seccompProfile": {"type": "RuntimeDefault"}})
    assert check(v(ps.RESTRICTED, 22), root) == []
    assert check(v(ps.RESTRICTED, 23), root) == [("runAsUser=0", "pod must not set runAsUser=0")]
    # Before 1.19 seccomp was annotations.
    annotated = {"metadata": {"name": "x", "annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}},
                 "spec": PLAIN["spec"]}
    assert check(v(ps.BASELINE, 18), annotated) == [
        ("seccompProfile", 'forbidden annotation seccomp.security.alpha.kubernetes.io/pod="unconfined"')]
    assert check(BASELINE, annotated) == []


def test_latest_and_future_versions_evaluate_as_the_newest_policy() -> None:
    assert ps.MAX_VERSION == ps.Version(37)
    p = pod(hostIPC=True)
    assert check(v(ps.BASELINE, 99), p) == check(BASELINE, p) == check(v(ps.BASELINE, 37), p)


def test_user_namespaces_relax_what_they_make_safe_from_1_35() -> None:
    root_in_userns = restricted_pod(hostUsers=False, securityContext={"runAsUser": 0, "seccompProfile": {
        "type": "RuntimeDefault"}})
    assert check(RESTRICTED, root_in_userns) == []
    assert [r for r, _ in check(v(ps.RESTRICTED, 34), root_in_userns)] == ["runAsNonRoot != true", "runAsUser=0"]
    unmasked = pod(hostUsers=False, **containers({"name": "a", "securityContext": {"procMount": "Unmasked"}}))
    assert check(BASELINE, unmasked) == []
    assert check(v(ps.BASELINE, 34), unmasked) != []


def test_levels_and_versions_parse_as_kubernetes_does() -> None:
    assert ps.LevelVersion.parse("baseline") == BASELINE
    assert str(ps.LevelVersion.parse("restricted:v1.30")) == "restricted:v1.30"
    assert str(BASELINE) == "baseline:latest"
    for bad in ("v1", "1.30", "v2.0", "v1.01", "latest ", ""):
        with pytest.raises(ps.PolicyValueError, match='^must be "latest" or "v1.x"$'):
            ps.parse_version(bad)
    with pytest.raises(ps.PolicyValueError, match="^must be one of privileged, baseline, restricted$"):
        ps.parse_level("Baseline")


# -- namespace labels ------------------------------------------------------------------------------------


DEFAULTS = ps.Policy(enforce=BASELINE)


def test_labels_override_defaults_and_warn_follows_a_stricter_enforce() -> None:
    policy, errors = ps.policy_to_evaluate({ps.ENFORCE_LABEL: "restricted", ps.ENFORCE_VERSION_LABEL: "v1.30"},
                                           DEFAULTS)
    assert errors == []
    assert (str(policy.enforce), str(policy.audit), str(policy.warn)) == (
        "restricted:v1.30", "privileged:latest", "restricted:v1.30")
    policy, _ = ps.policy_to_evaluate({ps.ENFORCE_LABEL: "restricted", ps.WARN_LABEL: "baseline"}, DEFAULTS)
    assert str(policy.warn) == "baseline:latest"
    assert ps.policy_to_evaluate({}, DEFAULTS) == (DEFAULTS, [])


def test_bad_labels_fail_closed_for_enforce_and_open_for_audit_and_warn() -> None:
    policy, errors = ps.policy_to_evaluate({ps.ENFORCE_LABEL: "bogus", ps.WARN_LABEL: "nope",
                                            ps.AUDIT_VERSION_LABEL: "v9"}, DEFAULTS)
    assert policy.enforce.level == ps.RESTRICTED
    assert policy.warn.level == ps.PRIVILEGED
    assert [str(e) for e in errors] == [
        'metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "bogus": must be one of privileged, '
        "baseline, restricted",
        'metadata.labels[pod-security.kubernetes.io/audit-version]: Invalid value: "v9": must be "latest" or "v1.x"',
        'metadata.labels[pod-security.kubernetes.io/warn]: Invalid value: "nope": must be one of privileged, '
        "baseline, restricted",
    ]
