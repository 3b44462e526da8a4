"""The Node object and the Lease an agent publishes: what it found on its server (cpu,
memory, GPUs, OS), how to reach it, and that it is alive."""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api.gpu import GPU_RESOURCE, GPUS_ANNOTATION
from gpufleet.utils.clock import rfc3339

KUBELET_VERSION = "v1.32.4-gpufleet"
LEASE_NAMESPACE = "kube-node-lease"
MAX_PODS = 110

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
         "s390x": "s390x"}
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass
class NodeSettings:
    name: str
    address: str
    port: int
    cpus: float
    memory_bytes: int
    runtime_version: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    max_pods: int = MAX_PODS
    # What the machine is (nodeInfo) and its disk, read once: neither changes while it runs.
    info: dict[str, str] = field(default_factory=dict)
    ephemeral_storage_bytes: int | None = None

    def __post_init__(self) -> None:
        if not self.info:
            self.info = system_info(self.runtime_version)
        if self.ephemeral_storage_bytes is None:
            try:
                st = os.statvfs("/")
                self.ephemeral_storage_bytes = st.f_blocks * st.f_frsize
            except OSError:
                self.ephemeral_storage_bytes = 0


def parse_labels(text: str | None) -> dict[str, str]:
    """"a=b,c=d" -> {"a": "b", "c": "d"}; raises ValueError naming a bad entry."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"label {part!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def parse_taints(text: str | None) -> list[dict[str, str]]:
    """"k=v:NoSchedule,k2:NoExecute" -> taints; raises ValueError naming a bad entry."""
    out: list[dict[str, str]] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        body, colon, effect = part.rpartition(":")
        if not colon or effect not in _EFFECTS:
            raise ValueError(f"taint {part!r} must be key[=value]:effect with effect one of {', '.join(_EFFECTS)}")
        key, _, value = body.partition("=")
        if not key:
            raise ValueError(f"taint {part!r} has no key")
        taint = {"key": key, "effect": effect}
        if value:
            taint["value"] = value
        out.append(taint)
    return out


def system_info(runtime_version: str) -> dict[str, str]:
    os_image = "Linux"
    try:
        release = platform.freedesktop_os_release()
        os_image = release.get("PRETTY_NAME") or release.get("NAME") or os_image
    except OSError:
        pass
    machine_id = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as f:
                machine_id = f.read().strip()
            break
        except OSError:
            continue
    boot_id = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:
        pass
    return {
        "architecture": _ARCH.get(platform.machine().lower(), platform.machine().lower()),
        "bootID": boot_id,
        "containerRuntimeVersion": runtime_version,
        "kernelVersion": platform.release(),
        "kubeProxyVersion": "",
        "kubeletVersion": KUBELET_VERSION,
        "machineID": machine_id,
        "operatingSystem": platform.system().lower() or "linux",
        "osImage": os_image,
        "systemUUID": machine_id,
    }


def resources(settings: NodeSettings, gpus: Sequence[Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable): every GPU counts in capacity, only healthy ones can be given out."""
    memory = f"{settings.memory_bytes // 1024}Ki"
    cpus = settings.cpus
    cpu = str(int(cpus)) if float(cpus).is_integer() else f"{int(round(cpus * 1000))}m"
    capacity = {"cpu": cpu, "memory": memory, "pods": str(settings.max_pods)}
    allocatable = dict(capacity)
    capacity[GPU_RESOURCE] = str(len(gpus))
    allocatable[GPU_RESOURCE] = str(sum(1 for g in gpus if getattr(g, "health", "Healthy") == "Healthy"))
    if settings.ephemeral_storage_bytes:
        capacity["ephemeral-storage"] = allocatable["ephemeral-storage"] = \
            f"{settings.ephemeral_storage_bytes // 1024}Ki"
    return capacity, allocatable


_CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)


def conditions(existing: Sequence[Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """The agent's node conditions, heartbeat stamped now; a condition whose status did not
    change keeps its lastTransitionTime."""
    by_type = {c.get("type"): c for c in existing}
    stamp = rfc3339(now)
    out = []
    for ctype, status, reason, message in _CONDITIONS:
        old = by_type.get(ctype)
        transition = old.get("lastTransitionTime") if old and old.get("status") == status else None
        out.append({"type": ctype, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": stamp, "lastTransitionTime": transition or stamp})
    return out


def node_status(settings: NodeSettings, gpus: Sequence[Any], existing: Mapping[str, Any] | None,
                now: float) -> dict[str, Any]:
    capacity, allocatable = resources(settings, gpus)
    status = dict(existing or {})
    status.update({
        "capacity": capacity,
        "allocatable": allocatable,
        "conditions": conditions((existing or {}).get("conditions") or [], now),
        "addresses": [{"type": "InternalIP", "address": settings.address},
                      {"type": "Hostname", "address": settings.name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": settings.port}},
        "nodeInfo": dict(settings.info),
    })
    return status


def node_labels(settings: NodeSettings, gpu_labels: Mapping[str, str]) -> dict[str, str]:
    info = settings.info
    labels = {
        "kubernetes.io/hostname": settings.name,
        "kubernetes.io/os": info["operatingSystem"],
        "kubernetes.io/arch": info["architecture"],
        "beta.kubernetes.io/os": info["operatingSystem"],
        "beta.kubernetes.io/arch": info["architecture"],
    }
    labels.update(gpu_labels)
    labels.update(settings.labels)
    return labels


def new_node(settings: NodeSettings, gpus: Sequence[Any], gpu_labels: Mapping[str, str], gpu_annotation: str,
             now: float) -> dict[str, Any]:
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": settings.name,
            "labels": node_labels(settings, gpu_labels),
            "annotations": {GPUS_ANNOTATION: gpu_annotation},
        },
        "spec": {},
        "status": node_status(settings, gpus, None, now),
    }
    if settings.taints:
        node["spec"]["taints"] = [dict(t) for t in settings.taints]
    return node


def comparable(status: Mapping[str, Any]) -> dict[str, Any]:
    """A node status without its heartbeat times: what counts as a change worth writing."""
    out = {k: v for k, v in status.items() if k != "conditions"}
    out["conditions"] = sorted((c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or [])
    return out


def new_lease(node_name: str, node_uid: str | None, duration: int, now: float) -> dict[str, Any]:
    lease: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node_name, "namespace": LEASE_NAMESPACE},
        "spec": {"holderIdentity": node_name, "leaseDurationSeconds": duration,
                 "renewTime": rfc3339(now, micro=True)},
    }
    if node_uid:
        # Deleting the Node takes its Lease with it, through the garbage collector.
        lease["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name,
                                                 "uid": node_uid}]
    return lease


def default_address() -> str:
    return "127.0.0.1"


def hostname() -> str:
    return socket.gethostname().split(".")[0].lower()
