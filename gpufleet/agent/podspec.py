"""From a pod's spec to what a runtime is asked for: the effective securityContext of each
container, the pod's sandbox, the registry credentials of its imagePullSecrets, and what a
runtime could not honour. Pure functions: the agent does the I/O.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.agent.runtime.base import HostAlias, RegistryAuth, SecuritySpec

# Where programs in a pod reach the API server (the API server's certificate carries it).
API_SERVICE_HOSTNAMES = ("kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
                         "kubernetes.default", "kubernetes")


def security_spec(pod: Mapping[str, Any], container: Mapping[str, Any]) -> SecuritySpec:
    """The container's securityContext over the pod's, as the kubelet merges them."""
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    csc = container.get("securityContext") or {}

    def pick(key: str) -> Any:
        value = csc.get(key)
        return psc.get(key) if value is None else value

    caps = csc.get("capabilities") or {}
    seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {})
    seccomp_type = seccomp.get("type") or "RuntimeDefault"
    if seccomp_type == "Localhost":
        seccomp_type = f"Localhost/{seccomp.get('localhostProfile') or ''}"
    ape = csc.get("allowPrivilegeEscalation")
    return SecuritySpec(
        run_as_user=_int(pick("runAsUser")),
        run_as_group=_int(pick("runAsGroup")),
        supplemental_groups=tuple(int(g) for g in psc.get("supplementalGroups") or [] if _int(g) is not None),
        fs_group=_int(psc.get("fsGroup")),
        run_as_non_root=bool(pick("runAsNonRoot")),
        privileged=bool(csc.get("privileged")),
        read_only_root_filesystem=bool(csc.get("readOnlyRootFilesystem")),
        no_new_privileges=ape is False,
        capabilities_add=tuple(str(c) for c in caps.get("add") or []),
        capabilities_drop=tuple(str(c) for c in caps.get("drop") or []),
        seccomp=seccomp_type,
        unmasked_proc=csc.get("procMount") == "Unmasked",
    )


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def host_aliases(pod: Mapping[str, Any], api_ip: str | None) -> list[HostAlias]:
    out = [HostAlias(str(a.get("ip")), tuple(str(h) for h in a.get("hostnames") or []))
           for a in (pod.get("spec") or {}).get("hostAliases") or [] if a.get("ip")]
    if api_ip:
        out.append(HostAlias(api_ip, API_SERVICE_HOSTNAMES))
    return out


def pod_hostname(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec") or {}
    name = str(spec.get("hostname") or (pod.get("metadata") or {}).get("name") or "")
    return name[:63]


def sysctls(pod: Mapping[str, Any]) -> dict[str, str]:
    psc = (pod.get("spec") or {}).get("securityContext") or {}
    return {str(s.get("name")): str(s.get("value", "")) for s in psc.get("sysctls") or [] if s.get("name")}


def registry_auth(secrets: Sequence[Mapping[str, Any]]) -> list[RegistryAuth]:
    """Credentials from kubernetes.io/dockerconfigjson and kubernetes.io/dockercfg Secrets."""
    out: list[RegistryAuth] = []
    for secret in secrets:
        data = secret.get("data") or {}
        raw = data.get(".dockerconfigjson") or data.get(".dockercfg")
        if not raw:
            continue
        try:
            config = json.loads(base64.b64decode(raw))
        except ValueError:
            continue
        auths = config.get("auths", config) if isinstance(config, dict) else {}
        if not isinstance(auths, dict):
            continue
        for server, entry in auths.items():
            if not isinstance(entry, dict):
                continue
            out.append(RegistryAuth(server=str(server), username=str(entry.get("username") or ""),
                                    password=str(entry.get("password") or ""), auth=str(entry.get("auth") or ""),
                                    identity_token=str(entry.get("identitytoken") or ""),
                                    registry_token=str(entry.get("registrytoken") or "")))
    return out


CHECKPOINT_ANNOTATION = "gpufleet.io/checkpoint-dir"


def checkpoint_dir(pod: Mapping[str, Any], roots: Sequence[str]) -> tuple[str | None, str]:
    """The training checkpoint directory to mount into the pod (the PyTorchJob controller
    names it in the pod's gpufleet.io/checkpoint-dir), and why not when it may not be:
    only a directory inside ``<root>/<the pod's namespace>/`` of one of the node's
    checkpoint roots, so a pod never reaches another namespace's checkpoints or the host."""
    import os.path

    meta = pod.get("metadata") or {}
    wanted = ((meta.get("annotations") or {}).get(CHECKPOINT_ANNOTATION) or "").strip()
    if not wanted:
        return None, ""
    if not os.path.isabs(wanted):
        return None, f"{CHECKPOINT_ANNOTATION} {wanted!r} is not an absolute path"
    path = os.path.normpath(wanted)
    namespace = str(meta.get("namespace") or "default")
    for root in roots:
        base = os.path.join(os.path.normpath(root), namespace)
        if path.startswith(base + os.sep):
            return path, ""
    where = ", ".join(f"{os.path.join(r, namespace)}/" for r in roots) or "(none)"
    return None, (f"checkpoint directory {wanted} not mounted: it must be inside {where} on this node "
                  "(the agent's --checkpoint-root); the container writes its checkpoints to its own filesystem")


def pull_policy(container: Mapping[str, Any]) -> str:
    """imagePullPolicy with Kubernetes' default: Always for :latest or no tag, else IfNotPresent."""
    policy = container.get("imagePullPolicy")
    if policy:
        return str(policy)
    image = str(container.get("image") or "")
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    return "Always" if ":" not in last or last.endswith(":latest") else "IfNotPresent"


def unhonoured(pod: Mapping[str, Any], capabilities: frozenset[str], host_image: bool) -> list[str]:
    """What the pod asks for that a runtime with these capabilities cannot give it, in words
    for an Event and a condition."""
    spec = pod.get("spec") or {}
    out: list[str] = []
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    if "images" not in capabilities and not host_image:
        images = sorted({str(c.get("image") or "") for c in containers if c.get("image")})
        if images:
            out.append(f"image {', '.join(images)} not used: this node's runtime runs the host's own programs")
    if "pod-network" not in capabilities and not spec.get("hostNetwork"):
        out.append("the pod shares the node's network (no network namespace of its own)")
    if "run-as-user" not in capabilities:
        for c in containers:
            sec = security_spec(pod, c)
            if sec.run_as_user is not None or sec.run_as_group is not None or sec.supplemental_groups:
                out.append(f"container {c.get('name')}: runAsUser/runAsGroup cannot be applied by this node's "
                           "runtime: it runs as the agent's user")
                break
    if "mounts" not in capabilities and spec.get("volumes"):
        out.append("volumes are not mounted by this node's runtime")
    return out
