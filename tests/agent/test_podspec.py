"""From a pod's spec to what a runtime is asked for: pure rules, no node needed."""

from __future__ import annotations

import base64
import json

from gpufleet.agent import podspec
from gpufleet.agent.runtime.base import RegistryAuth


def pod(ns: str = "team-a", annotations: dict | None = None, **spec) -> dict:
    return {"metadata": {"name": "p", "namespace": ns, "annotations": annotations or {}}, "spec": spec}


def test_container_security_context_overrides_the_pods():
    p = pod(securityContext={"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000, "supplementalGroups": [5],
                             "runAsNonRoot": True, "seccompProfile": {"type": "Unconfined"}})
    c = {"securityContext": {"runAsUser": 1001, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                             "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}
    sec = podspec.security_spec(p, c)
    assert (sec.run_as_user, sec.run_as_group, sec.fs_group, sec.supplemental_groups) == (1001, 1000, 2000, (5,))
    assert sec.run_as_non_root and sec.no_new_privileges and sec.read_only_root_filesystem
    assert sec.capabilities_drop == ("ALL",) and sec.capabilities_add == ("NET_BIND_SERVICE",)
    assert sec.seccomp == "Unconfined" and not sec.privileged
    # Nothing said: the runtime decides (the image's user, or an unprivileged default).
    assert podspec.security_spec(pod(), {}).run_as_user is None
    # allowPrivilegeEscalation unset is not false.
    assert not podspec.security_spec(pod(), {}).no_new_privileges


def test_pull_policy_defaults_as_kubernetes():
    assert podspec.pull_policy({"image": "nginx"}) == "Always"
    assert podspec.pull_policy({"image": "nginx:latest"}) == "Always"
    assert podspec.pull_policy({"image": "nginx:1.27"}) == "IfNotPresent"
    assert podspec.pull_policy({"image": "localhost:5000/a/b"}) == "Always"
    assert podspec.pull_policy({"image": "localhost:5000/a/b:2"}) == "IfNotPresent"
    assert podspec.pull_policy({"image": "nginx@sha256:" + "0" * 64}) == "IfNotPresent"
    assert podspec.pull_policy({"image": "nginx", "imagePullPolicy": "Never"}) == "Never"


def test_registry_auth_from_dockerconfigjson_and_dockercfg():
    cfg = {"auths": {"127.0.0.1:5000": {"username": "u", "password": "p", "auth": base64.b64encode(b"u:p").decode()}}}
    s1 = {"type": "kubernetes.io/dockerconfigjson",
          "data": {".dockerconfigjson": base64.b64encode(json.dumps(cfg).encode()).decode()}}
    s2 = {"type": "kubernetes.io/dockercfg",
          "data": {".dockercfg": base64.b64encode(json.dumps({"r.example": {"auth": "eDp5"}}).encode()).decode()}}
    got = podspec.registry_auth([s1, s2, {"data": {}}])
    assert got == [RegistryAuth("127.0.0.1:5000", "u", "p", base64.b64encode(b"u:p").decode()),
                   RegistryAuth("r.example", auth="eDp5")]


def test_checkpoint_dir_only_inside_the_pods_namespace_under_a_root():
    roots = ["/var/tmp/ck"]
    ok = pod(annotations={"gpufleet.io/checkpoint-dir": "/var/tmp/ck/team-a/job-1"})
    assert podspec.checkpoint_dir(ok, roots) == ("/var/tmp/ck/team-a/job-1", "")
    assert podspec.checkpoint_dir(pod(), roots) == (None, "")
    for bad in ("/var/tmp/ck/team-b/job-1", "/var/tmp/ck/team-a/../team-b/x", "/etc", "/var/tmp/ck/team-a",
                "relative/dir"):
        path, why = podspec.checkpoint_dir(pod(annotations={"gpufleet.io/checkpoint-dir": bad}), roots)
        assert path is None and why, bad


def test_what_a_runtime_cannot_honour_is_said():
    p = pod(containers=[{"name": "c", "image": "nvcr.io/nvidia/pytorch:24.01", "securityContext": {"runAsUser": 7}}],
            volumes=[{"name": "v", "emptyDir": {}}])
    said = podspec.unhonoured(p, frozenset(), host_image=False)
    assert any("nvcr.io/nvidia/pytorch:24.01 not used" in s for s in said)
    assert any("network" in s for s in said) and any("runAsUser" in s for s in said)
    assert any("volumes" in s for s in said)
    full = frozenset({"images", "pod-network", "run-as-user", "mounts"})
    assert podspec.unhonoured(p, full, host_image=False) == []
